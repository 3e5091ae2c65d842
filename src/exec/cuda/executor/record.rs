//! Launching a program segment by segment, eagerly or captured into one CUDA graph each, and
//! the timing marks of profiled steps.

use super::*;

/// Launches every node of `program` on the step buffers of `key`; the logits end in
/// `state.io[key].logits`. Launches only (no host copies, no synchronisation), so it can be
/// captured.
pub(super) fn record(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    opts: &mut Instrumentation,
    key: GraphKey,
    capture: bool,
) -> Result<Vec<CudaGraph>, CudaError> {
    let mut io = state
        .io
        .remove(&key)
        .expect("run() prepared the step buffers");
    let pool = io
        .scratch
        .as_ref()
        .map(|b| (b.device_ptr(&gpu.stream).0, b.len()));
    gpu.set_scratch_pool(pool);
    let result = record_nodes(gpu, program, weights, state, opts, &mut io, capture);
    let peak = gpu.set_scratch_pool(None);
    // After the first run, a scratch buffer for the next ones (before any capture: a captured
    // graph keeps the addresses it saw).
    let sized = io.scratch.as_ref().map_or(0, |b| b.len());
    if result.is_ok() && !capture && peak > sized && !state.graphs.contains_key(&key) {
        match gpu.zeros::<u8>(peak, "the step's kernel scratch") {
            Ok(buf) => io.scratch = Some(buf),
            Err(e) => {
                state.io.insert(key, io);
                return Err(e);
            }
        }
    }
    state.io.insert(key, io);
    result
}

/// Launches the program segment by segment (`passes::segment`); with `capture`, each segment is
/// recorded into its own CUDA graph (returned in order) instead of running. Nothing between a
/// capture's begin and end may synchronise, copy from the host or load modules: the segments
/// only launch kernels (loaded by the eager first use), device copies and stream-ordered
/// allocations.
pub(super) fn record_nodes<'p>(
    gpu: &Gpu,
    program: &'p Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    opts: &mut Instrumentation,
    io: &mut StepIo,
    capture: bool,
) -> Result<Vec<CudaGraph>, CudaError> {
    let whole = [Segment {
        start: 0,
        end: program.nodes.len(),
    }];
    let segments: &[Segment] = if program.segments.is_empty() {
        &whole
    } else {
        &program.segments
    };
    let mut values: HashMap<&'p str, DVal> = HashMap::new();
    let mut marks = Vec::new();
    let mut graphs = Vec::new();
    for (i, &seg) in segments.iter().enumerate() {
        if capture {
            gpu.stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .map_err(|e| CudaError::driver("starting a CUDA graph capture", None, e))?;
        }
        let first = i == 0;
        let last = i + 1 == segments.len();
        let result = record_segment(
            gpu,
            program,
            weights,
            state,
            opts,
            io,
            &mut values,
            &mut marks,
            seg,
            first,
            last,
        );
        if capture {
            // The capture always ends, so that a failed launch leaves the stream usable.
            let graph = gpu
                .stream
                .end_capture(sys::CUgraphInstantiate_flags(0))
                .map_err(|e| CudaError::driver("ending a CUDA graph capture", None, e));
            result?;
            graphs.push(graph?.ok_or_else(|| CudaError::Driver {
                doing: format!("capturing segment {i} of a step"),
                msg: "the capture produced no graph".into(),
            })?);
        } else {
            result?;
        }
    }
    if let Some(profile) = opts.profile.as_mut() {
        gpu.sync("a profiled step")?;
        for (node, ms) in program.nodes.iter().zip(intervals_ms(&marks)?) {
            let entry = profile.entry(node.name.clone()).or_insert((0, 0.0));
            entry.0 += 1;
            entry.1 += ms / 1e3;
        }
    }
    Ok(graphs)
}

/// Launches the nodes of one segment; the first segment also copies the step's tokens into the
/// program input's slot, the last copies the logits out.
#[allow(clippy::too_many_arguments)]
pub(super) fn record_segment<'p>(
    gpu: &Gpu,
    program: &'p Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    opts: &Instrumentation,
    io: &mut StepIo,
    values: &mut HashMap<&'p str, DVal>,
    marks: &mut Vec<cudarc::driver::CudaEvent>,
    seg: Segment,
    first: bool,
    last: bool,
) -> Result<(), CudaError> {
    let rows_in = io.tokens.len();
    let profiling = opts.profile.is_some();
    if first {
        // The program's input is a copy of the step's tokens in its arena slot, like every value.
        gpu.set_slots(&[io.input_slot]);
        let mut tokens = gpu.output::<i64>(rows_in, "tokens");
        gpu.set_slots(&[]);
        if let Ok(t) = tokens.as_mut() {
            gpu.stream
                .memcpy_dtod(&io.tokens, &mut **t)
                .map_err(|e| CudaError::driver("copying the tokens", None, e))?;
        }
        values.insert(
            program.input.as_str(),
            DVal::I64 {
                rows: rows_in,
                buf: tokens?,
            },
        );
        // Events after each node of a profiled step, the first one before node 0.
        if profiling {
            launch::hold_gpu(gpu, PROFILE_HOLD_NS)?;
            marks.push(timing_event(gpu)?);
        }
    }
    let step = &io.step;
    let cap = state.capacity;
    for index in seg.start..seg.end {
        let node = &program.nodes[index];
        // A node's states are taken out of the session for the launch and always put back, so a
        // failed launch leaves the state in place.
        let mut bufs: Vec<DevState> = node
            .states
            .iter()
            .map(|s| {
                state
                    .bufs
                    .remove(s)
                    .expect("ensure() created every declared state")
            })
            .collect();
        let arg = |i: usize| &values[node.inputs[i].as_str()];
        let slots = &io.node_slots[index];
        gpu.set_slots(slots);
        gpu.next_node_scratch();
        gpu.set_trace_node(&node.name);
        gpu.set_ready_inputs(if index > seg.start && gpu.programmatic_launch() {
            ready_after(node, &program.nodes[index - 1])
        } else {
            ReadyInputs::NONE
        });
        gpu.expect_kernels(&node.name, &node.kernels);
        let mut result = launch_node(gpu, program, weights, node, &arg, &mut bufs, step, cap);
        let named = gpu.launched_expected();
        if result.is_ok() {
            if let Err(e) = named {
                result = Err(e);
            }
        }
        let mut untaken = 0;
        if result.is_ok() && opts.launch_twice.iter().any(|k| k == node.op.kind()) {
            // Measurement only (`Instrumentation::launch_twice`): the node again, into its slots.
            untaken += gpu.set_slots(slots);
            gpu.next_node_scratch();
            gpu.set_ready_inputs(ReadyInputs::NONE);
            if let Err(e) = launch_node(gpu, program, weights, node, &arg, &mut bufs, step, cap) {
                result = Err(e);
            }
        }
        untaken += gpu.set_slots(&[]);
        for (name, buf) in node.states.iter().zip(bufs) {
            state.bufs.insert(name.clone(), buf);
        }
        let out = result?;
        // The kernels must have written each output into its own planned slot: a launcher that
        // made its outputs in another order would put a value where another one is planned.
        let placed = untaken == 0
            && out.len() == slots.len()
            && out
                .iter()
                .zip(slots)
                .all(|(v, &(ptr, _))| v.address(&gpu.stream) == ptr);
        if !placed {
            return Err(CudaError::Shape {
                kernel: node.op.kind().to_string(),
                msg: format!(
                    "node `{}` did not write its outputs into their arena slots",
                    node.name
                ),
            });
        }
        for (name, v) in node.outputs.iter().zip(out) {
            values.insert(name.as_str(), v);
        }
        if opts.sync_each_node {
            gpu.sync(&format!(
                "node `{}` ({} kernels, variant {})",
                node.name,
                node.op.kind(),
                node.variant
            ))?;
        }
        if profiling {
            marks.push(timing_event(gpu)?);
        }
        for dead in &node.last_use {
            values.remove(dead.as_str());
        }
    }
    if gpu.tracing() {
        // The timeline's end mark (`exec::cuda::trace`): its release is the segment's last
        // node's end, so that node's time is measured too.
        gpu.set_trace_node("end");
        launch::trace_end(gpu)?;
    }
    if last {
        let logits = match values.remove(program.output.as_str()) {
            Some(DVal::F32 { buf, .. }) => buf,
            _ => unreachable!("validated programs output f32 logits"),
        };
        gpu.stream
            .memcpy_dtod(&*logits, &mut io.logits)
            .map_err(|e| CudaError::driver("copying the logits out", None, e))?;
    }
    Ok(())
}

/// How long a profiled step's launches are held back on the device (far longer than the host
/// takes to queue a step's few hundred launches).
pub(super) const PROFILE_HOLD_NS: i64 = 30_000_000;

/// Milliseconds between consecutive recorded events (after the work they follow completed).
pub(super) fn intervals_ms(marks: &[cudarc::driver::CudaEvent]) -> Result<Vec<f64>, CudaError> {
    marks
        .windows(2)
        .map(|pair| {
            pair[0]
                .elapsed_ms(&pair[1])
                .map(f64::from)
                .map_err(|e| CudaError::driver("reading a timing event", None, e))
        })
        .collect()
}

pub(super) fn timing_event(gpu: &Gpu) -> Result<cudarc::driver::CudaEvent, CudaError> {
    gpu.stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| CudaError::driver("recording a timing event", None, e))
}
