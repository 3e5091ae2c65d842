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
    let result = record_nodes(gpu, program, weights, state, opts, &mut io, capture);
    let peak = *result.as_ref().map(|(_, peak)| peak).unwrap_or(&0);
    let result = result.map(|(graphs, _)| graphs);
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
/// allocations. Also returns the most scratch one node held, in bytes.
pub(super) fn record_nodes<'p>(
    gpu: &Gpu,
    program: &'p Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    opts: &mut Instrumentation,
    io: &mut StepIo,
    capture: bool,
) -> Result<(Vec<CudaGraph>, usize), CudaError> {
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
    let mut peak = 0;
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
        )
        .map(|p| peak = peak.max(p));
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
    Ok((graphs, peak))
}

/// Launches the nodes of one segment; the first segment also copies the step's tokens into the
/// program input's slot, the last copies the logits out. Returns the most scratch one node held.
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
) -> Result<usize, CudaError> {
    let rows_in = io.tokens.len();
    let profiling = opts.profile.is_some();
    let programmatic = opts.programmatic_launch && !opts.eager_only();
    let pool = io
        .scratch
        .as_ref()
        .map(|b| (b.device_ptr(&gpu.stream).0, b.len()));
    if first {
        // The program's input is a copy of the step's tokens in its arena slot, like every value.
        let cx = Launch::new(gpu).with_slots(&[io.input_slot]);
        let mut tokens = cx.output::<i64>(rows_in, "tokens")?;
        gpu.stream
            .memcpy_dtod(&io.tokens, &mut *tokens)
            .map_err(|e| CudaError::driver("copying the tokens", None, e))?;
        values.insert(program.input.as_str(), DVal::I64(tokens));
        // The imports likewise, from the buffers the host wrote.
        for (import, (given, slot)) in program.imports.iter().zip(&io.imports) {
            let cx = Launch::new(gpu).with_slots(&[*slot]);
            let mut buf = cx.output::<f32>(given.len(), &import.name)?;
            gpu.stream
                .memcpy_dtod(given, &mut *buf)
                .map_err(|e| CudaError::driver("copying the imports", None, e))?;
            values.insert(import.name.as_str(), DVal::F32(buf));
        }
        // Events after each node of a profiled step, the first one before node 0.
        if profiling {
            launch::hold_gpu(&Launch::new(gpu), PROFILE_HOLD_NS)?;
            marks.push(timing_event(gpu)?);
        }
    }
    let mut peak = 0;
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
        let slots = &io.node_slots[index];
        let ready = if index > seg.start && programmatic {
            nodes::ready_after(node, &program.nodes[index - 1])
        } else {
            ReadyInputs::NONE
        };
        let args = nodes::NodeArgs {
            program,
            weights,
            node,
            inputs: node.inputs.iter().map(|i| &values[i.as_str()]).collect(),
            shapes: &io.node_inputs[index],
            step: &io.step,
            cap: state.capacity,
            host_rows: io.host_rows.get(&index),
        };
        let launch = |ready| {
            Launch::for_node(gpu, &node.name, &node.kernels)
                .with_slots(slots)
                .with_scratch_pool(pool)
                .with_ready_inputs(ready)
                .with_programmatic_launch(programmatic)
        };
        let cx = launch(ready);
        let mut result = nodes::launch(&cx, &args, &mut bufs);
        let mut untaken = 0;
        match cx.finish() {
            Ok(done) => {
                untaken += done.untaken_slots;
                peak = peak.max(done.scratch_peak);
            }
            Err(e) => result = result.and(Err(e)),
        }
        if result.is_ok() && opts.launch_twice.iter().any(|k| k == node.op.kind()) {
            // Measurement only (`Instrumentation::launch_twice`): the node again, into the same slots.
            let cx = launch(ReadyInputs::NONE);
            match nodes::launch(&cx, &args, &mut bufs) {
                // The second launch's outputs are in the first's slots; the first's are kept.
                Ok(_again) => match cx.finish() {
                    Ok(done) => untaken += done.untaken_slots,
                    Err(e) => result = Err(e),
                },
                Err(e) => result = Err(e),
            }
        }
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
        let cx = Launch::labelled(gpu, "end").with_programmatic_launch(programmatic);
        launch::trace_end(&cx)?;
    }
    if last {
        let logits = match values.remove(program.output.as_str()) {
            Some(DVal::F32(buf)) => buf,
            _ => unreachable!("validated programs output f32 logits"),
        };
        gpu.stream
            .memcpy_dtod(&*logits, &mut io.logits)
            .map_err(|e| CudaError::driver("copying the logits out", None, e))?;
        for (export, out) in program.exports.iter().zip(io.exports.iter_mut()) {
            let Some(DVal::F32(buf)) = values.get(export.value.as_str()) else {
                unreachable!("validated programs export f32 values")
            };
            gpu.stream
                .memcpy_dtod(&**buf, out)
                .map_err(|e| CudaError::driver("copying the exports out", None, e))?;
        }
    }
    Ok(peak)
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
