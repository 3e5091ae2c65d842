//! The CUDA executor: runs the same lowered programs as `exec::cpu`, every op as a kernel on one
//! stream. Weights are uploaded once ([`DeviceWeights`]); a sequence's state lives on the device
//! ([`DeviceState`], `Append` states preallocated to a capacity); the step's start position is a
//! device value that kernels read. Values live in one arena laid out by `memplan`; each segment
//! is captured once as a CUDA graph and replayed. Each node launches the kernels its program
//! names, and only those ([`Gpu::expect_kernels`]).

use std::collections::HashMap;

use cudarc::driver::{sys, CudaGraph, CudaSlice, DevicePtr};

use crate::ir::{GateActivation, LogitsMode, Op, Phase, Program, Segment, StateKind, WeightClass};
use crate::ops::gdn::GdnShape;
use crate::ops::indexer::IndexerShape;
use crate::weights::Weights;

use super::device::{Buf, Gpu, ReadyInputs};
use super::error::CudaError;
use super::launch::linear::{MmaTile, OneToken};
use super::launch::{self, attention, gdn, layout, moe, ple, DeviceMatrix};

/// A model's weights on the device.
pub struct DeviceWeights {
    matrices: HashMap<String, DeviceMatrix>,
    vectors: HashMap<String, CudaSlice<f32>>,
    /// PLE hash tables per table index: multipliers, sizes, offsets.
    ple: Vec<[CudaSlice<i64>; 3]>,
    pub bytes: usize,
}

impl DeviceWeights {
    /// Uploads every weight `program` uses; matrices as bf16 when `bf16` (exact when the
    /// checkpoint was bf16: the host copies are its values widened).
    pub fn upload(
        gpu: &Gpu,
        program: &Program,
        weights: &Weights,
        bf16: bool,
    ) -> Result<DeviceWeights, CudaError> {
        let mut dw = DeviceWeights {
            matrices: HashMap::new(),
            vectors: HashMap::new(),
            ple: Vec::new(),
            bytes: 0,
        };
        let matrix_names = matrix_weights(program);
        for info in program
            .weights
            .iter()
            .filter(|w| w.class == WeightClass::Float)
        {
            let Some(t) = weights.get(&info.name) else {
                continue;
            };
            if matrix_names.contains(&info.name) {
                let m = if bf16 {
                    let bits: Vec<u16> = t
                        .data
                        .iter()
                        .map(|&v| half::bf16::from_f32(v).to_bits())
                        .collect();
                    dw.bytes += bits.len() * 2;
                    DeviceMatrix::Bf16(gpu.upload(&bits, &info.name)?)
                } else {
                    dw.bytes += t.data.len() * 4;
                    DeviceMatrix::F32(gpu.upload(&t.data, &info.name)?)
                };
                dw.matrices.insert(info.name.clone(), m);
            } else {
                dw.bytes += t.data.len() * 4;
                dw.vectors
                    .insert(info.name.clone(), gpu.upload(&t.data, &info.name)?);
            }
        }
        dw.upload_ple_tables(gpu, program)?;
        Ok(dw)
    }

    /// Random weights generated on the device (benchmarks at the real geometry, no files):
    /// matrices uniform with the variance of N(0, 1/fan_in), (1+w) norms near 0, plain norms and
    /// dt_bias near 1, A_log in [0, ln 16], embeddings uniform in [-1, 1).
    pub fn random(
        gpu: &Gpu,
        program: &Program,
        bf16: bool,
        seed: u64,
    ) -> Result<DeviceWeights, CudaError> {
        let mut dw = DeviceWeights {
            matrices: HashMap::new(),
            vectors: HashMap::new(),
            ple: Vec::new(),
            bytes: 0,
        };
        let matrix_names = matrix_weights(program);
        for (i, info) in program
            .weights
            .iter()
            .filter(|w| w.class == WeightClass::Float)
            .enumerate()
        {
            let n: usize = info.shape.iter().product();
            let name = info.name.as_str();
            let fan_in = *info.shape.last().unwrap_or(&1) as f32;
            let (lo, hi) = if name.ends_with("A_log") {
                (0.0, 16f32.ln())
            } else if name.ends_with("dt_bias") || name.ends_with("linear_attn.norm.weight") {
                (0.9, 1.1)
            } else if info.shape.len() == 1 {
                (-0.1, 0.1)
            } else if name.ends_with("embed_tokens.weight")
                || name.ends_with("ngram_embedding.weight")
            {
                (-1.0, 1.0)
            } else {
                let a = (3.0 / fan_in).sqrt();
                (-a, a)
            };
            let seed_i = seed ^ ((i as u64 + 1) << 32);
            if matrix_names.contains(&info.name) && bf16 {
                let mut m = DeviceMatrix::Bf16(gpu.zeros::<u16>(n, name)?);
                launch::fill_uniform(gpu, &mut m, seed_i, lo, hi)?;
                dw.bytes += n * 2;
                dw.matrices.insert(info.name.clone(), m);
            } else {
                let mut m = DeviceMatrix::F32(gpu.zeros::<f32>(n, name)?);
                launch::fill_uniform(gpu, &mut m, seed_i, lo, hi)?;
                dw.bytes += n * 4;
                match m {
                    DeviceMatrix::F32(v) if !matrix_names.contains(&info.name) => {
                        dw.vectors.insert(info.name.clone(), v);
                    }
                    other => {
                        dw.matrices.insert(info.name.clone(), other);
                    }
                }
            }
        }
        dw.upload_ple_tables(gpu, program)?;
        gpu.sync("generating random weights")?;
        Ok(dw)
    }

    fn upload_ple_tables(&mut self, gpu: &Gpu, program: &Program) -> Result<(), CudaError> {
        for t in &program.consts.ple_tables {
            self.ple.push([
                gpu.upload(&t.multipliers, "PLE multipliers")?,
                gpu.upload(&t.head_sizes, "PLE head sizes")?,
                gpu.upload(&t.head_offsets, "PLE head offsets")?,
            ]);
        }
        Ok(())
    }

    fn matrix(&self, name: &str) -> Result<&DeviceMatrix, CudaError> {
        self.matrices.get(name).ok_or_else(|| missing(name))
    }

    fn vector(&self, name: &str) -> Result<&CudaSlice<f32>, CudaError> {
        self.vectors.get(name).ok_or_else(|| missing(name))
    }
}

/// Weights read by the matrix kernels (`Op::weight_is_matrix`).
fn matrix_weights(program: &Program) -> std::collections::HashSet<String> {
    program
        .nodes
        .iter()
        .flat_map(|n| {
            n.weights
                .iter()
                .enumerate()
                .filter(|&(i, _)| n.op.weight_is_matrix(i))
                .map(|(_, w)| w.clone())
        })
        .collect()
}

fn missing(name: &str) -> CudaError {
    CudaError::Driver {
        doing: format!("finding weight `{name}` on the device"),
        msg: "not uploaded".into(),
    }
}

enum DevState {
    F32(CudaSlice<f32>),
    I64(CudaSlice<i64>),
}

/// Step shapes whose arenas and graphs a sequence keeps before it forgets its prefill shapes.
const MAX_STEP_SHAPES: usize = 16;

/// Which step a captured graph computes.
type GraphKey = (Phase, usize, LogitsMode);

/// The buffers a step reads and writes outside its kernels, at fixed addresses so that a
/// captured graph replays with whatever the host wrote into them.
struct StepIo {
    /// The step's start position (the "dynamic value" kernels read).
    step: CudaSlice<i64>,
    tokens: CudaSlice<i64>,
    logits: CudaSlice<f32>,
    logits_rows: usize,
    /// The key `launch::sampling::argmax_row` leaves for a greedy step's readout.
    greedy_key: CudaSlice<u64>,
    /// Every value of the step at its `memplan` offset, allocated once per step shape, so that
    /// the kernels of a replayed graph find their values at the captured addresses. Held, not
    /// read: the slots below point into it.
    _arena: CudaSlice<u8>,
    /// The arena slots (address, bytes) of the program input and of each node's outputs.
    input_slot: (sys::CUdeviceptr, usize),
    node_slots: Vec<Vec<(sys::CUdeviceptr, usize)>>,
    /// The kernels' temporaries (one node's at a time), sized by the most any node asked for in
    /// the step's first run; until then temporaries are allocated on the stream.
    scratch: Option<CudaSlice<u8>>,
}

impl StepIo {
    fn new(gpu: &Gpu, program: &Program, rows_in: usize) -> Result<StepIo, CudaError> {
        let vocab = program.value(&program.output).map(|v| v.width).unwrap_or(0);
        let logits_rows = if program.logits == LogitsMode::Last {
            1
        } else {
            rows_in
        };
        let arena = gpu.zeros::<u8>(program.arena_bytes.max(1), "the step's arena")?;
        let base = arena.device_ptr(&gpu.stream).0;
        let infos: HashMap<&str, &crate::ir::ValueInfo> = program
            .values
            .iter()
            .map(|v| (v.name.as_str(), v))
            .collect();
        let slot = |name: &str| -> Result<(sys::CUdeviceptr, usize), CudaError> {
            let v = infos.get(name).ok_or_else(|| CudaError::Shape {
                kernel: "arena".into(),
                msg: format!("value `{name}` is not declared"),
            })?;
            if v.offset + v.bytes > program.arena_bytes {
                return Err(CudaError::Shape {
                    kernel: "arena".into(),
                    msg: format!(
                        "value `{name}` at {}+{} lies outside the arena of {} bytes",
                        v.offset, v.bytes, program.arena_bytes
                    ),
                });
            }
            Ok((base + v.offset as u64, v.bytes))
        };
        let input_slot = slot(&program.input)?;
        let node_slots = program
            .nodes
            .iter()
            .map(|n| n.outputs.iter().map(|o| slot(o)).collect())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(StepIo {
            step: gpu.zeros(1, "the step position")?,
            tokens: gpu.zeros(rows_in, "the step's tokens")?,
            logits: gpu.zeros(logits_rows * vocab, "the step's logits")?,
            logits_rows,
            greedy_key: gpu.zeros(1, "the greedy step's key")?,
            _arena: arena,
            input_slot,
            node_slots,
            scratch: None,
        })
    }
}

/// One sequence's state on the device.
pub struct DeviceState {
    bufs: HashMap<String, DevState>,
    pub position: usize,
    /// Rows every `Append` state can hold (the longest context of this session).
    pub capacity: usize,
    io: HashMap<GraphKey, StepIo>,
    /// Captured steps, replayed from their second use on (the first runs eagerly: it compiles
    /// and loads kernels and creates the state, none of which may happen during capture).
    graphs: HashMap<GraphKey, Vec<CudaGraph>>,
    /// How many steps ran as graph replays (for tests and reports).
    pub replays: usize,
    /// When set, replayed steps time each segment's graph with device events: per segment
    /// index, (replays timed, milliseconds in all).
    pub segment_ms: Option<Vec<(usize, f64)>>,
    /// When set, replayed steps time their host side here ([`HostTimes`]).
    pub host_times: Option<HostTimes>,
    /// When set, eager steps time every node with device events and add its time here, by node
    /// name: (steps timed, seconds). The step is queued behind a spinning kernel, so the events
    /// time the kernels back to back (as in a graph replay), not the host's launch rate.
    pub profile: Option<std::collections::BTreeMap<String, (usize, f64)>>,
    /// Synchronise after every node of an eager step, so that a kernel fault is reported with the
    /// node and kernel that caused it (slow; for debugging).
    pub sync_each_node: bool,
    /// Op kinds whose nodes are launched twice, the second time into the same outputs and
    /// states: a step's time then grows by those nodes' marginal cost inside a replayed graph
    /// (`graphrun bench --launch-twice`). For measurement only: where the arena gives a node's
    /// output the slot of one of its dead inputs, the second launch reads its own output, and a
    /// stateful node advances its state twice (a recurrence steps twice, a cache row is written
    /// again), so results may be wrong. Set it with [`DeviceState::set_launch_twice`].
    launch_twice: Vec<String>,
    /// Launch kernels with programmatic dependent launch (`exec::cuda::launcher`) on devices
    /// that have it; off for profiled and node-by-node synchronised steps, whose per-node events
    /// and waits separate the kernels anyway. Change it with [`DeviceState::set_programmatic_launch`].
    programmatic_launch: bool,
    /// With the step timeline on (`Gpu::enable_trace`): the labels of each captured graph's
    /// launches, in order, and the replays traced since [`DeviceState::start_trace`] (all of
    /// one step shape).
    trace_labels: HashMap<GraphKey, Vec<String>>,
    traced: Option<(Option<GraphKey>, usize)>,
}

/// Where the host's time goes in replayed steps (seconds in all over `steps`): from entering
/// [`run`] until the step's graphs are launched (the step's small uploads and the launch calls),
/// then waiting for the device, then downloading the logits. What a caller measures beyond
/// their sum is outside the executor (the session, the caller's own work).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostTimes {
    pub steps: usize,
    pub submit: f64,
    pub wait: f64,
    pub download: f64,
}

impl DeviceState {
    pub fn new(capacity: usize) -> DeviceState {
        DeviceState {
            bufs: HashMap::new(),
            position: 0,
            capacity,
            io: HashMap::new(),
            graphs: HashMap::new(),
            replays: 0,
            segment_ms: None,
            host_times: None,
            profile: None,
            sync_each_node: false,
            launch_twice: Vec::new(),
            programmatic_launch: true,
            trace_labels: HashMap::new(),
            traced: None,
        }
    }

    /// Starts tracing replayed steps (the device must have the timeline on: `Gpu::enable_trace`).
    pub fn start_trace(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        if !gpu.tracing() {
            return Err(CudaError::Driver {
                doing: "tracing replayed steps".into(),
                msg: "the device's timeline is off (Gpu::enable_trace)".into(),
            });
        }
        gpu.trace_reset()?;
        self.traced = Some((None, 0));
        Ok(())
    }

    /// Stops tracing and returns the timeline of the replayed steps since [`start_trace`]
    /// (`exec::cuda::trace::timeline`), averaged over them.
    ///
    /// [`start_trace`]: DeviceState::start_trace
    pub fn finish_trace(&mut self, gpu: &Gpu) -> Result<super::trace::Timeline, CudaError> {
        let (key, replays) = self.traced.take().unwrap_or((None, 0));
        let records = gpu.trace_records()?;
        let labels = key
            .and_then(|k| self.trace_labels.get(&k))
            .cloned()
            .unwrap_or_default();
        super::trace::timeline(&records, &labels, replays).map_err(|msg| CudaError::Driver {
            doing: "reading the step timeline".into(),
            msg,
        })
    }

    /// Launches the nodes of these op kinds twice from the next step on (see the
    /// field); captured graphs are captured again.
    pub fn set_launch_twice(&mut self, kinds: Vec<String>) {
        if kinds != self.launch_twice {
            self.launch_twice = kinds;
            self.graphs.clear();
        }
    }

    /// Turns programmatic dependent launch on or off for the next steps; captured graphs hold
    /// their launches' attributes, so they are captured again.
    pub fn set_programmatic_launch(&mut self, on: bool) {
        if on != self.programmatic_launch {
            self.programmatic_launch = on;
            self.graphs.clear();
        }
    }

    fn ensure(&mut self, gpu: &Gpu, program: &Program) -> Result<(), CudaError> {
        let eos = program.consts.ple_eos.unwrap_or(0);
        for s in &program.states {
            if self.bufs.contains_key(&s.name) {
                continue;
            }
            let buf = match &s.kind {
                StateKind::Window { rows, width } => {
                    DevState::F32(gpu.zeros(rows * width, &s.name)?)
                }
                StateKind::Zeros { len } => DevState::F32(gpu.zeros(*len, &s.name)?),
                StateKind::Append { width } => {
                    DevState::F32(gpu.zeros(self.capacity * width, &s.name)?)
                }
                StateKind::Tokens { len } => DevState::I64(gpu.upload(&vec![eos; *len], &s.name)?),
            };
            self.bufs.insert(s.name.clone(), buf);
        }
        Ok(())
    }
}

enum DVal {
    F32 { rows: usize, buf: Buf<f32> },
    I64 { rows: usize, buf: Buf<i64> },
    Sel { buf: Buf<i32> },
}

impl DVal {
    fn address(&self, stream: &cudarc::driver::CudaStream) -> sys::CUdeviceptr {
        match self {
            DVal::F32 { buf, .. } => buf.address(stream),
            DVal::I64 { buf, .. } => buf.address(stream),
            DVal::Sel { buf } => buf.address(stream),
        }
    }
    fn f32(&self) -> (&CudaSlice<f32>, usize) {
        match self {
            DVal::F32 { rows, buf } => (buf, *rows),
            _ => unreachable!("validated programs feed f32 where f32 is expected"),
        }
    }
    fn i64(&self) -> (&CudaSlice<i64>, usize) {
        match self {
            DVal::I64 { rows, buf } => (buf, *rows),
            _ => unreachable!("validated programs feed i64 where i64 is expected"),
        }
    }
}

/// Runs one step of `program` for `tokens` (range-checked by the caller); returns the logits
/// `[rows, vocab]` and their row count. With `graphs`, a step shape seen before is captured as a
/// CUDA graph once and replayed after; without, every step launches its kernels eagerly. Both
/// launch the same kernels on the same buffers, so they give the same bits.
pub fn run(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    tokens: &[i64],
    graphs: bool,
) -> Result<(Vec<f32>, usize), CudaError> {
    let entered = std::time::Instant::now();
    let _step = gpu.lock_step();
    let (key, replayed) = launch_step(gpu, program, weights, state, tokens, graphs)?;
    let io = &state.io[&key];
    let data = read_out(gpu, &mut state.host_times, replayed, entered, |gpu| {
        gpu.download(&io.logits, "logits")
    })?;
    Ok((data, io.logits_rows))
}

/// As [`run`], but only the index of the largest logit of the step's last row comes back
/// (`runtime::sampling::argmax`'s choice, found on the device): a greedy step downloads 8 bytes
/// instead of its row of logits.
pub fn run_greedy(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    tokens: &[i64],
    graphs: bool,
) -> Result<u32, CudaError> {
    let entered = std::time::Instant::now();
    let _step = gpu.lock_step();
    let (key, replayed) = launch_step(gpu, program, weights, state, tokens, graphs)?;
    let io = state
        .io
        .get_mut(&key)
        .expect("launch_step prepared the step buffers");
    let vocab = io.logits.len() / io.logits_rows.max(1);
    let last = io.logits.slice((io.logits_rows - 1) * vocab..);
    // A plain launch: what comes before it in the stream is a graph or the step's last node.
    gpu.set_programmatic_launch(false);
    launch::sampling::argmax_row(gpu, &mut io.greedy_key, &last)?;
    let io = &state.io[&key];
    let key = read_out(gpu, &mut state.host_times, replayed, entered, |gpu| {
        gpu.download(&io.greedy_key, "the greedy step's key")
    })?;
    Ok(launch::sampling::argmax_index(key[0]))
}

/// Waits for the step, then copies its result to the host with `download`; in replayed steps
/// with host timing on, adds the host's times to `host_times`.
fn read_out<T>(
    gpu: &Gpu,
    host_times: &mut Option<HostTimes>,
    replayed: bool,
    entered: std::time::Instant,
    download: impl FnOnce(&Gpu) -> Result<Vec<T>, CudaError>,
) -> Result<Vec<T>, CudaError> {
    let timing = replayed && host_times.is_some();
    let launched = entered.elapsed().as_secs_f64();
    if timing {
        gpu.sync("a timed step")?;
    }
    let waited = entered.elapsed().as_secs_f64();
    let data = download(gpu)?;
    gpu.sync("the step")?;
    if let (true, Some(t)) = (timing, host_times.as_mut()) {
        t.steps += 1;
        t.submit += launched;
        t.wait += waited - launched;
        t.download += entered.elapsed().as_secs_f64() - waited;
    }
    Ok(data)
}

/// Launches one step of `program` over `tokens` (replaying its captured graphs when it has
/// them) and advances the position; returns the step's key and whether it was a replay. The
/// result is in the step's logits buffer once the stream reaches it.
fn launch_step(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    tokens: &[i64],
    graphs: bool,
) -> Result<(GraphKey, bool), CudaError> {
    let rows_in = tokens.len();
    let start = state.position;
    if start + rows_in > state.capacity {
        return Err(CudaError::Shape {
            kernel: "session".into(),
            msg: format!(
                "context of {} tokens exceeds the device state's capacity of {}",
                start + rows_in,
                state.capacity
            ),
        });
    }
    state.ensure(gpu, program)?;
    let key: GraphKey = (program.phase, program.tokens, program.logits);
    let first_use = !state.io.contains_key(&key);
    if first_use {
        if state.io.len() >= MAX_STEP_SHAPES {
            // Prompts of many lengths would each keep an arena and a graph: forget the prefill
            // shapes (decode shapes are few and hot).
            state.io.retain(|k, _| k.0 != Phase::Prefill);
            state.graphs.retain(|k, _| k.0 != Phase::Prefill);
        }
        let io = StepIo::new(gpu, program, rows_in)?;
        state.io.insert(key, io);
    }
    {
        let io = state.io.get_mut(&key).expect("inserted above");
        gpu.stream
            .memcpy_htod(&[start as i64], &mut io.step)
            .map_err(|e| CudaError::driver("writing the step position", None, e))?;
        gpu.stream
            .memcpy_htod(tokens, &mut io.tokens)
            .map_err(|e| CudaError::driver("writing the step's tokens", None, e))?;
    }
    let graphs = graphs && !state.sync_each_node && state.profile.is_none();
    gpu.set_programmatic_launch(
        state.programmatic_launch && !state.sync_each_node && state.profile.is_none(),
    );
    let mut replayed = false;
    if graphs && state.graphs.contains_key(&key) {
        // A traced run holds replays of one step shape (refused before anything is launched,
        // so the session is as it was).
        if let Some((Some(traced), _)) = state.traced {
            if traced != key {
                return Err(CudaError::Driver {
                    doing: "tracing replayed steps".into(),
                    msg: "the traced steps are of more than one shape".into(),
                });
            }
        }
        // One graph per segment; host work between segments would go between these launches
        // (no op needs any today: `passes::segment`).
        let timing = state.segment_ms.is_some();
        let mut marks = Vec::new();
        for graph in &state.graphs[&key] {
            if timing {
                marks.push(timing_event(gpu)?);
            }
            graph
                .launch()
                .map_err(|e| CudaError::driver("replaying a CUDA graph", None, e))?;
        }
        if timing {
            marks.push(timing_event(gpu)?);
            gpu.sync("a timed step")?;
            let times = state.segment_ms.as_mut().expect("timing");
            for (i, ms) in intervals_ms(&marks)?.into_iter().enumerate() {
                if times.len() <= i {
                    times.push((0, 0.0));
                }
                times[i].0 += 1;
                times[i].1 += ms;
            }
        }
        state.replays += 1;
        replayed = true;
        if let Some((traced_key, count)) = state.traced.as_mut() {
            *traced_key = Some(key);
            *count += 1;
        }
    } else if graphs && !first_use {
        // Captured segment by segment (see `record_nodes`), then launched in order.
        gpu.trace_log(true);
        let captured = record(gpu, program, weights, state, key, true);
        let labels = gpu.trace_log(false);
        let captured = captured?;
        if gpu.tracing() {
            state.trace_labels.insert(key, labels);
        }
        for graph in &captured {
            graph
                .launch()
                .map_err(|e| CudaError::driver("launching a captured CUDA graph", None, e))?;
        }
        state.graphs.insert(key, captured);
        state.replays += 1;
    } else {
        record(gpu, program, weights, state, key, false)?;
    }
    state.position += rows_in;
    Ok((key, replayed))
}

/// Launches every node of `program` on the step buffers of `key`; the logits end in
/// `state.io[key].logits`. Launches only (no host copies, no synchronisation), so it can be
/// captured.
fn record(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
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
    let result = record_nodes(gpu, program, weights, state, &mut io, capture);
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
fn record_nodes<'p>(
    gpu: &Gpu,
    program: &'p Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
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
    if let Some(profile) = state.profile.as_mut() {
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
fn record_segment<'p>(
    gpu: &Gpu,
    program: &'p Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    io: &mut StepIo,
    values: &mut HashMap<&'p str, DVal>,
    marks: &mut Vec<cudarc::driver::CudaEvent>,
    seg: Segment,
    first: bool,
    last: bool,
) -> Result<(), CudaError> {
    let rows_in = io.tokens.len();
    let profiling = state.profile.is_some();
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
        if result.is_ok() && state.launch_twice.iter().any(|k| k == node.op.kind()) {
            // Measurement only (`DeviceState::launch_twice`): the node again, into the same slots.
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
        if state.sync_each_node {
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
const PROFILE_HOLD_NS: i64 = 30_000_000;

/// Milliseconds between consecutive recorded events (after the work they follow completed).
fn intervals_ms(marks: &[cudarc::driver::CudaEvent]) -> Result<Vec<f64>, CudaError> {
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

fn timing_event(gpu: &Gpu) -> Result<cudarc::driver::CudaEvent, CudaError> {
    gpu.stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| CudaError::driver("recording a timing event", None, e))
}

/// Launches the kernels of one node; `bufs` are the node's states, in its declared order.
/// The inputs of `node` that its kernels may read before the node launched just before it
/// (`previous`) has finished: those that are not `previous`'s outputs, since under programmatic
/// launch every kernel that wrote them has finished by the time `node` starts
/// (`wait_for_producers_unless` in kernels/common.cuh). The graph files' node order decides how
/// often this holds (graphs/qwen4exp/moe.ron puts the shared expert between the router and the
/// routed experts so that both run ahead).
fn ready_after(node: &crate::ir::Node, previous: &crate::ir::Node) -> ReadyInputs {
    if releases_early(previous) {
        return ReadyInputs::NONE;
    }
    ReadyInputs(
        node.inputs
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, i)| !previous.outputs.contains(i))
            .fold(0, |m, (k, _)| m | 1 << k),
    )
}

/// Whether a kernel of `node` lets the next node launch before it has waited for its own
/// producers (`release_dependents_early`, kernels/common.cuh): the causal conv's decode kernel, so
/// that the GDN recurrence after it starts loading its state while the input projection drains.
/// The node after it may then start while the node two back still runs: nothing of its inputs is
/// ready before its wait.
fn releases_early(node: &crate::ir::Node) -> bool {
    matches!(node.op, Op::CausalConv { .. })
}

/// The n-gram hashing of a PLE ids node (`PleNgramIds`, `PleEmbed`): its order and heads, the
/// program's eos and the node's hash table on the device.
fn ngram_hash<'w>(
    program: &Program,
    weights: &'w DeviceWeights,
    node: &crate::ir::Node,
) -> Result<launch::NgramHash<'w>, CudaError> {
    let (Op::PleNgramIds {
        ngram,
        heads_per_ngram,
        table,
    }
    | Op::PleEmbed {
        ngram,
        heads_per_ngram,
        table,
    }) = node.op
    else {
        unreachable!("called for the n-gram ops")
    };
    let [multipliers, sizes, offsets] = weights.ple.get(table).ok_or_else(|| CudaError::Shape {
        kernel: node.op.kind().into(),
        msg: format!(
            "node `{}` names PLE hash table {table}, which the program lacks",
            node.name
        ),
    })?;
    Ok(launch::NgramHash {
        eos: program.consts.ple_eos.unwrap_or(0),
        ngram,
        heads_per_ngram,
        multipliers,
        sizes,
        offsets,
    })
}

/// The row width of a gathered table (its declared `[rows, d]`; 1 for a table the program
/// does not declare, which the launchers' shape checks then refuse unless it fits).
fn table_width(program: &Program, name: &str) -> usize {
    program
        .weights
        .iter()
        .find(|x| x.name == name)
        .map(|x| x.shape[1])
        .unwrap_or(1)
}

#[allow(clippy::too_many_arguments)]
fn launch_node<'v>(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    node: &crate::ir::Node,
    arg: &dyn Fn(usize) -> &'v DVal,
    bufs: &mut [DevState],
    step: &CudaSlice<i64>,
    cap: usize,
) -> Result<Vec<DVal>, CudaError> {
    let eps = program.consts.rms_norm_eps;
    let theta = program.consts.rope_theta;
    let w = |i: usize| node.weights[i].as_str();
    // The variant the schedule chose, as the launcher's typed choice (`registry` lists them).
    let unknown = || CudaError::Shape {
        kernel: node.kernels.join(", "),
        msg: format!(
            "node `{}`: the CUDA executor has no variant `{}` of {}",
            node.name,
            node.variant,
            node.op.kind()
        ),
    };
    let variant = node.variant.as_str();
    Ok(match &node.op {
        Op::Embed => {
            let (ids, rows) = arg(0).i64();
            let table = weights.matrix(w(0))?;
            let d = table_width(program, &node.weights[0]);
            let y = launch::embed(gpu, ids, table, d)?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::EmbedStreams { streams } => {
            let (ids, rows) = arg(0).i64();
            let table = weights.matrix(w(0))?;
            let d = table_width(program, &node.weights[0]);
            let y = launch::embed_streams(gpu, ids, rows, table, d, *streams)?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::RepeatStreams { streams } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::repeat_streams(gpu, x, rows, *streams)?,
            }]
        }
        Op::RmsNorm { group, unit_offset } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::rms_norm(gpu, x, weights.vector(w(0))?, *group, *unit_offset, eps)?,
            }]
        }
        Op::Linear => {
            let (x, rows) = arg(0).f32();
            let m = weights.matrix(w(0))?;
            let k = x.len() / rows;
            let n = m.len() / k;
            let y = match variant {
                "rows" => launch::linear_rows(gpu, x, m, rows, k, n)?,
                "tiled" => launch::linear_tiled(gpu, x, m, rows, k, n)?,
                "mma" => launch::linear::linear_mma_with(gpu, x, m, rows, k, n, MmaTile::T64)?,
                "mma_wide" => {
                    launch::linear::linear_mma_with(gpu, x, m, rows, k, n, MmaTile::Wide)?
                }
                one => {
                    let v = OneToken::from_variant(one).ok_or_else(unknown)?;
                    launch::linear::linear_one_token(gpu, x, m, k, n, v)?
                }
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::HcRead { streams, inject } => {
            let (h, rows) = arg(0).f32();
            let gains = if *inject {
                Some(weights.matrix(w(3))?)
            } else {
                None
            };
            let (x, inj) = layout::hc_read(
                gpu,
                h,
                weights.vector(w(0))?,
                weights.matrix(w(1))?,
                weights.matrix(w(2))?,
                gains,
                rows,
                *streams,
                eps,
                layout::HcReadAct::from_variant(variant).ok_or_else(unknown)?,
            )?;
            std::iter::once(x)
                .chain(inj)
                .map(|buf| DVal::F32 { rows, buf })
                .collect()
        }
        Op::MoeSharedWrite { streams } => {
            let (h, rows) = arg(0).f32();
            let (inj, x, sh, a) = (
                arg(1).f32().0,
                arg(2).f32().0,
                arg(3).f32().0,
                arg(4).f32().0,
            );
            vec![DVal::F32 {
                rows,
                buf: launch::linear::moe_shared_write(
                    gpu,
                    h,
                    inj,
                    x,
                    sh,
                    a,
                    weights.matrix(w(0))?,
                    weights.vector(w(1))?,
                    rows,
                    *streams,
                )?,
            }]
        }
        Op::LinearGroup { .. } => {
            let (x, rows) = arg(0).f32();
            let ms = (0..node.weights.len())
                .map(|i| weights.matrix(w(i)))
                .collect::<Result<Vec<_>, _>>()?;
            let how = launch::linear::GroupKernel::from_variant(variant).ok_or_else(unknown)?;
            launch::linear::linear_group(gpu, x, &ms, rows, how)?
                .into_iter()
                .map(|buf| DVal::F32 { rows, buf })
                .collect()
        }
        Op::DivBy { by } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::scalar(gpu, "div_by", x, *by as f32)?,
            }]
        }
        Op::MulBy { by } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::scalar(gpu, "mul_by", x, *by as f32)?,
            }]
        }
        Op::Silu | Op::Sigmoid => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: launch::unary(gpu, node.op.kind(), x)?,
            }]
        }
        Op::Mul => {
            let ((a, rows), (b, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: launch::mul(gpu, a, b, rows)?,
            }]
        }
        Op::Add => {
            let ((a, rows), (b, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: launch::add(gpu, a, b)?,
            }]
        }
        Op::Slice { start: s, len } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::slice_cols(gpu, x, rows, *s, *len)?,
            }]
        }
        Op::StreamMean { streams } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::stream_mean(gpu, x, rows, *streams)?,
            }]
        }
        Op::HcWrite { streams } => {
            let (h, rows) = arg(0).f32();
            let y = layout::hc_write(gpu, h, arg(1).f32().0, arg(2).f32().0, rows, *streams)?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::LastRow => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows: 1,
                buf: layout::last_row(gpu, x, rows)?,
            }]
        }
        Op::CausalConv {
            kernel,
            dilation,
            silu,
        } => {
            let (x, rows) = arg(0).f32();
            let window = f32_state(&mut bufs[0]);
            let how = gdn::ConvKernel::from_variant(variant).ok_or_else(unknown)?;
            let y = gdn::causal_conv(
                gpu,
                x,
                window,
                weights.vector(w(0))?,
                rows,
                *kernel,
                *dilation,
                *silu,
                how,
            );
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::GdnGates => {
            let (b, rows) = arg(0).f32();
            let heads = b.len() / rows;
            let (beta, g) = gdn::gdn_gates(
                gpu,
                b,
                arg(1).f32().0,
                weights.vector(w(0))?,
                weights.vector(w(1))?,
                rows,
                heads,
            )?;
            vec![DVal::F32 { rows, buf: beta }, DVal::F32 { rows, buf: g }]
        }
        Op::GdnRecurrence { .. } | Op::GdnGatedRecurrence { .. } => {
            let shape = GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = arg(0).f32();
            let (x1, x2) = (arg(1).f32().0, arg(2).f32().0);
            let gates = match node.op {
                Op::GdnRecurrence { .. } => gdn::GdnGates::Given { beta: x1, g: x2 },
                _ => gdn::GdnGates::Raw {
                    b: x1,
                    a: x2,
                    a_log: weights.vector(w(0))?,
                    dt_bias: weights.vector(w(1))?,
                },
            };
            let st = f32_state(&mut bufs[0]);
            let layout = gdn::GdnLayout::from_variant(variant).ok_or_else(unknown)?;
            let y = gdn::gdn_recurrence_with(gpu, qkv, gates, st, rows, &shape, layout);
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::GdnNormedRecurrence { value_dim, .. } => {
            let shape = GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = arg(0).f32();
            let (b, a, z) = (arg(1).f32().0, arg(2).f32().0, arg(3).f32().0);
            let (a_log, dt_bias) = (weights.vector(w(0))?, weights.vector(w(1))?);
            let norm_w = weights.vector(w(2))?;
            let sigmoid = program.consts.gate_activation == GateActivation::Sigmoid;
            let st = f32_state(&mut bufs[0]);
            let y = match variant {
                "fused" => gdn::gdn_normed_recurrence(
                    gpu, qkv, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape, sigmoid, eps,
                )?,
                "reference" => unfused_normed_recurrence(
                    gpu, qkv, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape, *value_dim,
                    sigmoid, eps,
                )?,
                _ => return Err(unknown()),
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::GdnConvNormedRecurrence {
            value_dim, kernel, ..
        } => {
            let shape = GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = arg(0).f32();
            let (b, a, z) = (arg(1).f32().0, arg(2).f32().0, arg(3).f32().0);
            let conv_w = weights.vector(w(0))?;
            let (a_log, dt_bias) = (weights.vector(w(1))?, weights.vector(w(2))?);
            let norm_w = weights.vector(w(3))?;
            let sigmoid = program.consts.gate_activation == GateActivation::Sigmoid;
            // The states in the fused node's order: the conv's window, then the recurrence's.
            let [window, st] = bufs else {
                unreachable!("the fused node carries the conv's and the recurrence's states")
            };
            let (window, st) = (f32_state(window), f32_state(st));
            let y = match variant {
                "fused" => gdn::gdn_conv_normed_recurrence(
                    gpu, qkv, conv_w, window, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape,
                    *kernel, sigmoid, eps,
                )?,
                "reference" => {
                    // The convolution (an intermediate: in scratch), then the unfused normed
                    // recurrence.
                    let x = gpu.intermediate(|| {
                        let how = gdn::ConvKernel::Reference;
                        gdn::causal_conv(gpu, qkv, window, conv_w, rows, *kernel, 1, true, how)
                    })?;
                    unfused_normed_recurrence(
                        gpu, &x, b, a, a_log, dt_bias, z, norm_w, st, rows, &shape, *value_dim,
                        sigmoid, eps,
                    )?
                }
                _ => return Err(unknown()),
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::GatedRmsNorm { head_dim } => {
            let (x, rows) = arg(0).f32();
            let sigmoid = program.consts.gate_activation == GateActivation::Sigmoid;
            let y = layout::gated_rms_norm(
                gpu,
                x,
                arg(1).f32().0,
                weights.vector(w(0))?,
                *head_dim,
                sigmoid,
                eps,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::SplitQGate { heads, head_dim } => {
            let (x, rows) = arg(0).f32();
            let (q, g) = layout::split_q_gate(gpu, x, rows, *heads, *head_dim)?;
            vec![DVal::F32 { rows, buf: q }, DVal::F32 { rows, buf: g }]
        }
        Op::Rope {
            head_dim,
            rotary_dim,
        } => {
            let (x, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: attention::rope(gpu, x, rows, step, *head_dim, *rotary_dim, theta)?,
            }]
        }
        Op::NormRope {
            head_dim,
            rotary_dim,
        } => {
            let (x, rows) = arg(0).f32();
            let w = weights.vector(w(0))?;
            vec![DVal::F32 {
                rows,
                buf: attention::norm_rope(
                    gpu,
                    x,
                    w,
                    rows,
                    step,
                    *head_dim,
                    *rotary_dim,
                    eps,
                    theta,
                )?,
            }]
        }
        Op::GatedStreamMean { streams } => {
            let ((up, rows), (hn, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: layout::gated_stream_mean(gpu, up, hn, rows, *streams)?,
            }]
        }
        Op::SigmoidMul => {
            let ((x, rows), (g, _)) = (arg(0).f32(), arg(1).f32());
            vec![DVal::F32 {
                rows,
                buf: launch::sigmoid_mul(gpu, x, g, rows)?,
            }]
        }
        Op::IndexerSelect { .. } | Op::IndexerSelectQk { .. } => {
            let shape = IndexerShape::of(&node.op).expect("an indexer op");
            let [raw, pooled] = &mut bufs[..] else {
                unreachable!("the template declares two states")
            };
            let (raw, pooled) = (f32_state(raw), f32_state(pooled));
            // The queries and keys ready, or the indexer's projection (IndexerSelectQk).
            let (x, rows) = arg(0).f32();
            let sel = if let Op::IndexerSelect { .. } = node.op {
                attention::indexer_select(
                    gpu,
                    x,
                    arg(1).f32().0,
                    weights.vector(w(0))?,
                    raw,
                    pooled,
                    rows,
                    step,
                    &shape,
                    cap,
                    eps,
                    theta,
                )
            } else {
                attention::indexer_select_qk(
                    gpu,
                    x,
                    weights.vector(w(0))?,
                    weights.vector(w(1))?,
                    raw,
                    pooled,
                    rows,
                    step,
                    &shape,
                    cap,
                    eps,
                    theta,
                )
            };
            vec![DVal::Sel { buf: sel? }]
        }
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            block,
        } => {
            let (q, rows) = arg(0).f32();
            let (sel, keep, kc, vc) = selection_and_caches(arg(3), rows, bufs);
            let attend = match variant {
                "split" => attention::attention_split,
                "reference" => attention::attention,
                _ => return Err(unknown()),
            };
            let y = attend(
                gpu,
                q,
                arg(1).f32().0,
                arg(2).f32().0,
                sel,
                kc,
                vc,
                rows,
                step,
                *heads,
                *kv_heads,
                *head_dim,
                cap,
                keep,
                *block,
            );
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::GatedAttention {
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block,
        } => {
            let (qg, rows) = arg(0).f32();
            let (sel, keep, kc, vc) = selection_and_caches(arg(3), rows, bufs);
            let x = attention::GatedAttentionInputs {
                qg,
                k_raw: arg(1).f32().0,
                v: arg(2).f32().0,
                sel,
                q_norm: weights.vector(w(0))?,
                k_norm: weights.vector(w(1))?,
            };
            let shape = attention::GatedAttentionShape {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
                rotary_dim: *rotary_dim,
                block: *block,
            };
            let attend = match variant {
                "split" => attention::gated_attention_split,
                "reference" => attention::gated_attention,
                _ => return Err(unknown()),
            };
            let y = attend(gpu, &x, kc, vc, rows, step, &shape, cap, keep, eps, theta);
            vec![DVal::F32 { rows, buf: y? }]
        }
        Op::MoeRouter { top_k } => {
            let (logits, rows) = arg(0).f32();
            let experts = logits.len() / rows;
            let form = moe::RouterKernel::from_variant(variant).ok_or_else(unknown)?;
            let (ids, ws) = moe::moe_router(
                gpu,
                logits,
                rows,
                experts,
                *top_k,
                program.consts.norm_topk_prob,
                form,
            )?;
            vec![DVal::I64 { rows, buf: ids }, DVal::F32 { rows, buf: ws }]
        }
        Op::MoeExperts { intermediate, .. } => {
            let (x, rows) = arg(0).f32();
            let (ids, _) = arg(1).i64();
            let k = ids.len() / rows;
            let hidden = x.len() / rows;
            let (ws, gate_up, down) =
                (arg(2).f32().0, weights.matrix(w(0))?, weights.matrix(w(1))?);
            let dims = [rows, k, hidden, *intermediate];
            let y = match variant {
                "token_major" | "token_major_rows" => moe::moe_experts_with_down(
                    gpu,
                    x,
                    ids,
                    ws,
                    gate_up,
                    down,
                    dims,
                    variant == "token_major_rows",
                )?,
                "expert_major" | "expert_major_mma" => moe::moe_experts_expert_major(
                    gpu,
                    x,
                    ids,
                    ws,
                    gate_up,
                    down,
                    rows,
                    k,
                    hidden,
                    *intermediate,
                    variant == "expert_major_mma",
                )?,
                _ => return Err(unknown()),
            };
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::PleNgramIds { .. } => {
            let (toks, rows) = arg(0).i64();
            let hash = ngram_hash(program, weights, node)?;
            let ids = moe::ple_ngram_ids(gpu, toks, i64_state(&mut bufs[0]), &hash);
            vec![DVal::I64 { rows, buf: ids? }]
        }
        Op::PleEmbed { .. } => {
            let (toks, rows) = arg(0).i64();
            let hash = ngram_hash(program, weights, node)?;
            let d = table_width(program, &node.weights[0]);
            let y = launch::ple_embed(
                gpu,
                toks,
                i64_state(&mut bufs[0]),
                &hash,
                weights.matrix(w(0))?,
                d,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::PleGate { streams } => {
            let (key, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::ple_gate(gpu, key, arg(1).f32().0, arg(2).f32().0, rows, *streams)?,
            }]
        }
        Op::PleMix {
            streams,
            kernel,
            dilation,
        } => {
            let (key_proj, rows) = arg(0).f32();
            let (h, value) = (arg(1).f32().0, arg(2).f32().0);
            let shape = ple::PleMixShape {
                rows,
                streams: *streams,
                kernel: *kernel,
                dilation: *dilation,
            };
            let (nk, nq, nc) = (
                weights.vector(w(0))?,
                weights.vector(w(1))?,
                weights.vector(w(2))?,
            );
            let conv_w = weights.vector(w(3))?;
            let window = f32_state(&mut bufs[0]);
            let y = ple::ple_mix(
                gpu, key_proj, h, value, nk, nq, nc, conv_w, window, shape, eps,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::SwigluLinear => {
            let (x, rows) = arg(0).f32();
            let (wg, wu) = (weights.matrix(w(0))?, weights.matrix(w(1))?);
            let k = x.len() / rows;
            let n = wg.len() / k;
            vec![DVal::F32 {
                rows,
                buf: layout::swiglu(gpu, x, wg, wu, rows, k, n, block_form(variant)?)?,
            }]
        }
        Op::HcMix { streams } => {
            let (hn, rows) = arg(0).f32();
            let y = layout::hc_mix(
                gpu,
                hn,
                weights.matrix(w(0))?,
                weights.matrix(w(1))?,
                rows,
                *streams,
                block_form(variant)?,
            )?;
            vec![DVal::F32 { rows, buf: y }]
        }
        Op::LinearHcWrite { streams } => {
            let (h, rows) = arg(0).f32();
            let (inj, x) = (arg(1).f32().0, arg(2).f32().0);
            vec![DVal::F32 {
                rows,
                buf: launch::linear_hc_write(
                    gpu,
                    h,
                    inj,
                    x,
                    weights.matrix(w(0))?,
                    rows,
                    *streams,
                    match variant {
                        "reference" => None,
                        one => Some(OneToken::from_variant(one).ok_or_else(unknown)?),
                    },
                )?,
            }]
        }
        Op::SigmoidGatedAdd => {
            let (x, rows) = arg(0).f32();
            let (b, a) = (arg(1).f32().0, arg(2).f32().0);
            vec![DVal::F32 {
                rows,
                buf: layout::sigmoid_gated_add(gpu, x, weights.vector(w(0))?, b, a, rows)?,
            }]
        }
        Op::HcInject { streams } => {
            let (hn, rows) = arg(0).f32();
            vec![DVal::F32 {
                rows,
                buf: layout::hc_inject(
                    gpu,
                    hn,
                    weights.matrix(w(0))?,
                    rows,
                    *streams,
                    block_form(variant)?,
                )?,
            }]
        }
    })
}

/// `Op::GdnNormedRecurrence`'s `reference` variant: the gated recurrence in its block layout
/// (an intermediate: in scratch), then the gated RMS norm.
#[allow(clippy::too_many_arguments)]
fn unfused_normed_recurrence(
    gpu: &Gpu,
    qkv: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    norm_w: &CudaSlice<f32>,
    st: &mut CudaSlice<f32>,
    rows: usize,
    shape: &GdnShape,
    value_dim: usize,
    sigmoid: bool,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let gates = gdn::GdnGates::Raw {
        b,
        a,
        a_log,
        dt_bias,
    };
    let block = gdn::GdnLayout::Block;
    let o =
        gpu.intermediate(|| gdn::gdn_recurrence_with(gpu, qkv, gates, st, rows, shape, block))?;
    layout::gated_rms_norm(gpu, &o, z, norm_w, value_dim, sigmoid, eps)
}

/// Whether a node's variant is the block form (`block`) or the reference one, for the ops that
/// have those two.
fn block_form(variant: &str) -> Result<bool, CudaError> {
    match variant {
        "block" => Ok(true),
        "reference" => Ok(false),
        other => Err(CudaError::Shape {
            kernel: other.into(),
            msg: "expected the variant `block` or `reference`".into(),
        }),
    }
}

/// An attention node's selection (its fourth input), the blocks each row keeps, and its K and V
/// caches (its two states: `Attention`'s, carried by the `gated_attention` fusion).
fn selection_and_caches<'a>(
    sel: &'a DVal,
    rows: usize,
    bufs: &'a mut [DevState],
) -> (
    &'a CudaSlice<i32>,
    usize,
    &'a mut CudaSlice<f32>,
    &'a mut CudaSlice<f32>,
) {
    let DVal::Sel { buf: sel } = sel else {
        unreachable!("validated programs feed a selection")
    };
    let [kc, vc] = bufs else {
        unreachable!("the template declares two states")
    };
    (sel, sel.len() / rows - 2, f32_state(kc), f32_state(vc))
}

fn f32_state(buf: &mut DevState) -> &mut CudaSlice<f32> {
    match buf {
        DevState::F32(b) => b,
        DevState::I64(_) => unreachable!("state kinds follow the templates"),
    }
}

fn i64_state(buf: &mut DevState) -> &mut CudaSlice<i64> {
    match buf {
        DevState::I64(b) => b,
        DevState::F32(_) => unreachable!("state kinds follow the templates"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Device;
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    /// graphs/qwen4exp/moe.ron orders the MoE block so that, in a CUDA decode step, the shared
    /// expert's gate/up runs ahead of the router, the routed experts ahead of the shared expert,
    /// and the block's end takes the shared expert's down rows ahead of the routed experts (whose
    /// output it reads after its wait). A reordering that loses this shows up here.
    #[test]
    fn the_moe_block_runs_ahead_in_a_decode_step() {
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/configs/qwen3.8-flash-next.json");
        let plan = ModelPlan::from_file(&config).unwrap();
        let opts = LowerOptions {
            device: Device::Cuda,
            ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
        };
        let program = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program;
        let nodes = &program.nodes;
        let mut checked = 0;
        for (i, node) in nodes.iter().enumerate().skip(1) {
            let ready = ready_after(node, &nodes[i - 1]);
            let ok = match node.op.kind() {
                "swiglu_linear" => ready.all(&[0]),
                "moe_experts" => ready.all(&[0, 1, 2]),
                "moe_shared_write" => ready.all(&[2, 3]) && !ready.all(&[4]),
                _ => continue,
            };
            assert!(
                ok,
                "{} ({}) after {}: {ready:?}",
                node.name,
                node.op.kind(),
                nodes[i - 1].name
            );
            checked += 1;
        }
        assert_eq!(checked, 3 * plan.layers.len(), "one of each a layer");
    }
}
