//! The CUDA executor: runs the same lowered programs as `exec::cpu`, every op as a kernel on one
//! stream. Weights are uploaded once ([`DeviceWeights`]); a sequence ([`CudaExecutor`]) keeps its
//! state on the device (`Append` states preallocated to a capacity); the step's start position is
//! a device value that kernels read. Values live in one arena laid out by `memplan`; each segment
//! is captured once as a CUDA graph and replayed. Each node launches the kernels its program
//! names, and only those ([`Launch::for_node`]).

use std::collections::HashMap;

use cudarc::driver::{sys, CudaGraph, CudaSlice, DevicePtr};

use crate::ir::{LogitsMode, Phase, Program, Segment, StateKind, WeightClass};
use crate::weights::Weights;

use super::context::{Launch, Slot};
use super::device::{Buf, Gpu, ReadyInputs};
use super::error::CudaError;
use super::launch::{self, moe_nvfp4::DeviceNvfp4, DeviceMatrix};

mod host_steps;
mod instrument;
mod load;
mod memory;
mod nodes;
mod record;
mod single;
mod upload;
mod weights;

pub use instrument::{HostTimes, Instrumentation, TraceLog};
pub use load::{peak_rss_bytes, planned_bytes, planned_random_bytes, LoadReport};
pub use memory::{session_bytes, step_bytes};
use record::*;
pub use single::run_node;
pub use weights::DeviceWeights;

enum DevState {
    F32(CudaSlice<f32>),
    I64(CudaSlice<i64>),
    /// A token history kept on the host, for a node whose step starts there
    /// (`registry::cuda::runs_on_host`).
    HostTokens(Vec<i64>),
}

/// Step shapes whose arenas and graphs a sequence keeps before it forgets its prefill shapes.
const MAX_STEP_SHAPES: usize = 16;

/// Which step a captured graph computes: its phase, rows and logits, and whether it takes
/// imports or returns exports (a speculative trunk step's arena differs from a plain one's).
type GraphKey = (Phase, usize, LogitsMode, bool);

/// Step shapes of at most this many rows are kept whatever prefill comes (a speculative
/// session's verify steps of 2 to 17 rows, whose arenas are small).
const FEW_ROWS: usize = 17;

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
    /// One key a logits row, and the row keys side by side for one download
    /// (`Executor::step_with_greedy`); made at its first use.
    row_keys: Option<(Vec<CudaSlice<u64>>, CudaSlice<u64>)>,
    /// Every value of the step at its `memplan` offset, allocated once per step shape, so that
    /// the kernels of a replayed graph find their values at the captured addresses. Held, not
    /// read: the slots below point into it.
    _arena: CudaSlice<u8>,
    /// The arena slots of the program input and of each node's outputs.
    input_slot: Slot,
    node_slots: Vec<Vec<Slot>>,
    /// The planned shapes of each node's inputs, in its input order.
    node_inputs: Vec<Vec<ValueShape>>,
    /// The kernels' temporaries (one node's at a time), sized by the most any node asked for in
    /// the step's first run; until then temporaries are allocated on the stream.
    scratch: Option<CudaSlice<u8>>,
    /// By node index, the buffer a node that starts on the host fills before the step and its
    /// kernels copy from (`host_steps`).
    host_rows: HashMap<usize, CudaSlice<f32>>,
    /// The program's imports, in its order: the buffer the host writes each into before the
    /// step (the first segment copies it into its arena slot, as it does the tokens), the slot.
    imports: Vec<(CudaSlice<f32>, Slot)>,
    /// The program's exports, in its order: the buffer the last segment copies each into.
    exports: Vec<CudaSlice<f32>>,
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
        let info = |name: &str| {
            infos.get(name).copied().ok_or_else(|| CudaError::Shape {
                kernel: "arena".into(),
                msg: format!("value `{name}` is not declared"),
            })
        };
        let slot = |name: &str| -> Result<Slot, CudaError> {
            let v = info(name)?;
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
        let node_inputs = program
            .nodes
            .iter()
            .map(|n| {
                n.inputs
                    .iter()
                    .map(|i| info(i).map(ValueShape::of))
                    .collect()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let imports = program
            .imports
            .iter()
            .map(|i| Ok((gpu.zeros(rows_in * i.width, &i.name)?, slot(&i.name)?)))
            .collect::<Result<Vec<_>, CudaError>>()?;
        let exports = program
            .exports
            .iter()
            .map(|e| {
                let v = info(&e.value)?;
                gpu.zeros(v.rows * v.width, &e.name)
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        let mut host_rows = HashMap::new();
        for (i, n) in program.nodes.iter().enumerate() {
            if crate::registry::cuda::runs_on_host(&n.kernels) {
                let out = info(&n.outputs[0])?;
                host_rows.insert(i, gpu.zeros(out.rows * out.width, &n.name)?);
            }
        }
        Ok(StepIo {
            host_rows,
            imports,
            exports,
            step: gpu.zeros(1, "the step position")?,
            tokens: gpu.zeros(rows_in, "the step's tokens")?,
            logits: gpu.zeros(logits_rows * vocab, "the step's logits")?,
            logits_rows,
            greedy_key: gpu.zeros(1, "the greedy step's key")?,
            row_keys: None,
            _arena: arena,
            input_slot,
            node_slots,
            node_inputs,
            scratch: None,
        })
    }
}

/// One sequence's state on the device.
struct DeviceState {
    bufs: HashMap<String, DevState>,
    position: usize,
    /// Rows every `Append` state can hold (the longest context of this session).
    capacity: usize,
    io: HashMap<GraphKey, StepIo>,
    /// Captured steps, replayed from their second use on (the first runs eagerly: it compiles
    /// and loads kernels and creates the state, none of which may happen during capture).
    graphs: HashMap<GraphKey, Vec<CudaGraph>>,
    /// How many steps ran as graph replays (for tests and reports).
    replays: usize,
    /// Seconds the last step spent in host steps (`host_steps`).
    host_step_s: f64,
    /// The prefill shape used last.
    last_prefill: Option<GraphKey>,
    /// The `Append` states: their rows past the position are stale, never read, so a rewind
    /// leaves them be.
    appended: std::collections::HashSet<String>,
    /// The other states and the position at the last `Executor::checkpoint`.
    checkpoint: Option<(usize, HashMap<String, DevState>)>,
}

impl DeviceState {
    fn new(capacity: usize) -> DeviceState {
        DeviceState {
            bufs: HashMap::new(),
            position: 0,
            capacity,
            io: HashMap::new(),
            graphs: HashMap::new(),
            replays: 0,
            host_step_s: 0.0,
            last_prefill: None,
            appended: Default::default(),
            checkpoint: None,
        }
    }

    fn ensure(&mut self, gpu: &Gpu, program: &Program) -> Result<(), CudaError> {
        if program
            .states
            .iter()
            .all(|s| self.bufs.contains_key(&s.name))
        {
            return Ok(());
        }
        let eos = program.consts.ple_eos.unwrap_or(0);
        let on_host: std::collections::HashSet<&str> = program
            .nodes
            .iter()
            .filter(|n| crate::registry::cuda::runs_on_host(&n.kernels))
            .flat_map(|n| n.states.iter().map(String::as_str))
            .collect();
        for s in &program.states {
            if self.bufs.contains_key(&s.name) {
                continue;
            }
            let buf = match &s.kind {
                StateKind::Tokens { len } if on_host.contains(s.name.as_str()) => {
                    DevState::HostTokens(vec![eos; *len])
                }
                StateKind::Window { rows, width } => {
                    DevState::F32(gpu.zeros(rows * width, &s.name)?)
                }
                StateKind::Zeros { len } => DevState::F32(gpu.zeros(*len, &s.name)?),
                StateKind::Append { width } => {
                    self.appended.insert(s.name.clone());
                    DevState::F32(gpu.zeros(self.capacity * width, &s.name)?)
                }
                StateKind::Tokens { len } => DevState::I64(gpu.upload(&vec![eos; *len], &s.name)?),
            };
            self.bufs.insert(s.name.clone(), buf);
        }
        Ok(())
    }
}

/// A value of a step on the device (its shape is the program's: [`ValueShape`]).
enum DVal {
    F32(Buf<f32>),
    I64(Buf<i64>),
    /// A selection, `i32 [rows, 2 + kept blocks]`.
    Sel(Buf<i32>),
}

impl DVal {
    fn address(&self, stream: &cudarc::driver::CudaStream) -> sys::CUdeviceptr {
        match self {
            DVal::F32(buf) => buf.address(stream),
            DVal::I64(buf) => buf.address(stream),
            DVal::Sel(buf) => buf.address(stream),
        }
    }
}

/// A value's planned shape (`memplan`): what launchers size their grids by, so that no launch
/// derives a width from a buffer's length.
#[derive(Debug, Clone, Copy)]
struct ValueShape {
    rows: usize,
    width: usize,
    bytes: usize,
}

impl ValueShape {
    fn of(v: &crate::ir::ValueInfo) -> ValueShape {
        ValueShape {
            rows: v.rows,
            width: v.width,
            bytes: v.bytes,
        }
    }
}

/// One sequence on a CUDA device: the device and the model's weights on it (shared by every
/// sequence), the sequence's state, and how its steps launch. With `graphs`, a step shape seen
/// before is captured as CUDA graphs once and replayed after; without, every step launches its
/// kernels eagerly. Both launch the same kernels on the same buffers, so they give the same bits.
pub struct CudaExecutor<'d> {
    gpu: &'d Gpu,
    weights: &'d DeviceWeights,
    state: DeviceState,
    /// Capture and replay CUDA graphs (off: `--no-graphs`); takes effect at the next step.
    pub graphs: bool,
    /// Debugging and measurement settings, and what they measured.
    pub instrumentation: Instrumentation,
    /// The `launch_twice` and `programmatic_launch` the state's graphs were captured with: a
    /// graph holds its launches, so it is captured again when they change.
    captured_with: (Vec<String>, bool),
}

impl<'d> CudaExecutor<'d> {
    /// A new sequence whose `Append` states hold `capacity` rows.
    pub fn new(
        gpu: &'d Gpu,
        weights: &'d DeviceWeights,
        capacity: usize,
        graphs: bool,
        instrumentation: Instrumentation,
    ) -> Self {
        let captured_with = (
            instrumentation.launch_twice.clone(),
            instrumentation.programmatic_launch,
        );
        CudaExecutor {
            gpu,
            weights,
            state: DeviceState::new(capacity),
            graphs,
            instrumentation,
            captured_with,
        }
    }

    /// Starts tracing replayed steps (the device must have the timeline on: `Gpu::enable_trace`).
    pub fn start_trace(&mut self) -> Result<(), CudaError> {
        if !self.gpu.tracing() {
            return Err(CudaError::Driver {
                doing: "tracing replayed steps".into(),
                msg: "the device's timeline is off (Gpu::enable_trace)".into(),
            });
        }
        self.gpu.trace_reset()?;
        self.instrumentation.trace.traced = Some((None, 0));
        Ok(())
    }

    /// Stops tracing and returns the timeline of the replayed steps since [`start_trace`]
    /// (`exec::cuda::trace::timeline`), averaged over them.
    ///
    /// [`start_trace`]: CudaExecutor::start_trace
    pub fn finish_trace(&mut self) -> Result<super::trace::Timeline, CudaError> {
        let trace = &mut self.instrumentation.trace;
        let (key, replays) = trace.traced.take().unwrap_or((None, 0));
        let records = self.gpu.trace_records()?;
        let labels = key
            .and_then(|k| trace.labels.get(&k))
            .cloned()
            .unwrap_or_default();
        super::trace::timeline(&records, &labels, replays).map_err(|msg| CudaError::Driver {
            doing: "reading the step timeline".into(),
            msg,
        })
    }

    /// Forgets the captured graphs if the launch settings they hold changed since.
    fn forget_stale_graphs(&mut self) {
        let i = &self.instrumentation;
        if i.launch_twice != self.captured_with.0 || i.programmatic_launch != self.captured_with.1 {
            self.captured_with = (i.launch_twice.clone(), i.programmatic_launch);
            self.state.graphs.clear();
        }
    }

    /// Launches one step of `program` over `tokens` (replaying its captured graphs when it has
    /// them) and advances the position; returns the step's key and whether it was a replay. The
    /// result is in the step's logits buffer once the stream reaches it.
    fn launch_step(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: crate::exec::Imports,
    ) -> Result<(GraphKey, bool), CudaError> {
        self.forget_stale_graphs();
        let (gpu, weights) = (self.gpu, self.weights);
        let state = &mut self.state;
        let opts = &mut self.instrumentation;
        let rows_in = tokens.len();
        let start = state.position;
        // Every import given at its size, and nothing else, before anything runs.
        let mut given = Vec::with_capacity(program.imports.len());
        for import in &program.imports {
            let data = imports
                .iter()
                .find(|(n, _)| *n == import.name)
                .map(|(_, d)| *d)
                .ok_or_else(|| CudaError::Shape {
                    kernel: "session".into(),
                    msg: format!("import `{}`: not given", import.name),
                })?;
            if data.len() != rows_in * import.width {
                return Err(CudaError::Shape {
                    kernel: "session".into(),
                    msg: format!(
                        "import `{}`: {} values given, {} expected ({rows_in} rows of {})",
                        import.name,
                        data.len(),
                        rows_in * import.width,
                        import.width
                    ),
                });
            }
            given.push(data);
        }
        if let Some((name, _)) = imports
            .iter()
            .find(|(n, _)| !program.imports.iter().any(|i| i.name == *n))
        {
            return Err(CudaError::Shape {
                kernel: "session".into(),
                msg: format!("import `{name}`: the program takes no such import"),
            });
        }
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
        let io_values = !program.imports.is_empty() || !program.exports.is_empty();
        let key: GraphKey = (program.phase, program.tokens, program.logits, io_values);
        let first_use = !state.io.contains_key(&key);
        if first_use {
            // Prompts of many lengths would each keep an arena and a graph: a new prefill shape
            // keeps only the last one used beside it (a prompt's full chunks and its last one;
            // the memory plan counts two), and too many shapes forget every prefill one.
            let last = state.last_prefill;
            let keep = |k: &GraphKey| {
                k.0 != Phase::Prefill
                    || k.1 <= FEW_ROWS
                    || (key.0 == Phase::Prefill && Some(*k) == last)
            };
            if key.0 == Phase::Prefill || state.io.len() >= MAX_STEP_SHAPES {
                state.io.retain(|k, _| keep(k));
                state.graphs.retain(|k, _| keep(k));
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
            for (data, (buf, _)) in given.iter().zip(io.imports.iter_mut()) {
                gpu.stream
                    .memcpy_htod(*data, buf)
                    .map_err(|e| CudaError::driver("writing the step's imports", None, e))?;
            }
            let started = std::time::Instant::now();
            host_steps::run(gpu, program, weights, &mut state.bufs, io, tokens)?;
            state.host_step_s = started.elapsed().as_secs_f64();
        }
        let graphs = self.graphs && !opts.eager_only();
        let mut replayed = false;
        if graphs && state.graphs.contains_key(&key) {
            // A traced run holds replays of one step shape (refused before anything is
            // launched, so the session is as it was).
            if let Some((Some(traced), _)) = opts.trace.traced {
                if traced != key {
                    return Err(CudaError::Driver {
                        doing: "tracing replayed steps".into(),
                        msg: "the traced steps are of more than one shape".into(),
                    });
                }
            }
            // One graph per segment; host work between segments would go between these
            // launches (no op needs any today: `passes::segment`).
            let timing = opts.segment_ms.is_some();
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
                let times = opts.segment_ms.as_mut().expect("timing");
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
            if let Some((traced_key, count)) = opts.trace.traced.as_mut() {
                *traced_key = Some(key);
                *count += 1;
            }
        } else if graphs && !first_use {
            // Captured segment by segment (see `record_nodes`), then launched in order.
            gpu.trace_log(true);
            let captured = record(gpu, program, weights, state, opts, key, true);
            let labels = gpu.trace_log(false);
            let captured = captured?;
            if gpu.tracing() {
                opts.trace.labels.insert(key, labels);
            }
            for graph in &captured {
                graph
                    .launch()
                    .map_err(|e| CudaError::driver("launching a captured CUDA graph", None, e))?;
            }
            state.graphs.insert(key, captured);
            state.replays += 1;
        } else {
            record(gpu, program, weights, state, opts, key, false)?;
        }
        state.position += rows_in;
        if key.0 == Phase::Prefill && key.1 > FEW_ROWS {
            state.last_prefill = Some(key);
        }
        Ok((key, replayed))
    }
}

impl crate::exec::Executor for CudaExecutor<'_> {
    fn position(&self) -> usize {
        self.state.position
    }

    fn capacity(&self) -> Option<usize> {
        Some(self.state.capacity)
    }

    fn step(
        &mut self,
        program: &Program,
        tokens: &[i64],
    ) -> crate::error::Result<(Vec<f32>, usize)> {
        let entered = std::time::Instant::now();
        let gpu = self.gpu;
        let _step = gpu.lock_step();
        let (key, replayed) = self.launch_step(program, tokens, &[])?;
        let io = &self.state.io[&key];
        let host_times = &mut self.instrumentation.host_times;
        let host_step_s = self.state.host_step_s;
        let data = read_out(gpu, host_times, replayed, entered, host_step_s, |gpu| {
            gpu.download(&io.logits, "logits")
        })?;
        Ok((data, io.logits_rows))
    }

    fn step_with(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: crate::exec::Imports,
    ) -> crate::error::Result<crate::exec::StepOutput> {
        let entered = std::time::Instant::now();
        let gpu = self.gpu;
        let _step = gpu.lock_step();
        let (key, replayed) = self.launch_step(program, tokens, imports)?;
        let io = &self.state.io[&key];
        let host_times = &mut self.instrumentation.host_times;
        let host_step_s = self.state.host_step_s;
        let logits = read_out(gpu, host_times, replayed, entered, host_step_s, |gpu| {
            gpu.download(&io.logits, "logits")
        })?;
        let exports = download_exports(gpu, program, io)?;
        Ok(crate::exec::StepOutput {
            logits,
            rows: io.logits_rows,
            exports,
        })
    }

    /// The index of the largest logit of the step's last row (`runtime::sampling::argmax`'s
    /// choice), or the first NaN of the row, found on the device: a greedy step downloads 8
    /// bytes instead of its row of logits.
    fn step_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
    ) -> crate::error::Result<Result<u32, crate::runtime::sampling::BadLogit>> {
        let entered = std::time::Instant::now();
        let gpu = self.gpu;
        let _step = gpu.lock_step();
        let (key, replayed) = self.launch_step(program, tokens, &[])?;
        let io = self
            .state
            .io
            .get_mut(&key)
            .expect("launch_step prepared the step buffers");
        let vocab = io.logits.len() / io.logits_rows.max(1);
        let last = io.logits.slice((io.logits_rows - 1) * vocab..);
        // A plain launch: what comes before it in the stream is a graph or the step's last node.
        launch::sampling::argmax_row(&Launch::new(gpu), &mut io.greedy_key, &last)?;
        let io = &self.state.io[&key];
        let host_times = &mut self.instrumentation.host_times;
        let host_step_s = self.state.host_step_s;
        let key = read_out(gpu, host_times, replayed, entered, host_step_s, |gpu| {
            gpu.download(&io.greedy_key, "the greedy step's key")
        })?;
        Ok(launch::sampling::argmax_of(key[0]))
    }

    /// Each row's argmax on the device: the host reads 8 bytes a row, not the row's logits.
    fn step_with_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: crate::exec::Imports,
    ) -> crate::error::Result<crate::exec::GreedyRows> {
        let gpu = self.gpu;
        let _step = gpu.lock_step();
        let (key, _) = self.launch_step(program, tokens, imports)?;
        let io = self
            .state
            .io
            .get_mut(&key)
            .expect("launch_step prepared the step buffers");
        let rows = io.logits_rows.max(1);
        let vocab = io.logits.len() / rows;
        if io.row_keys.is_none() {
            let keys = (0..rows)
                .map(|_| gpu.zeros::<u64>(1, "a row's greedy key"))
                .collect::<Result<Vec<_>, _>>()?;
            io.row_keys = Some((keys, gpu.zeros::<u64>(rows, "the rows' greedy keys")?));
        }
        let (keys, all) = io.row_keys.as_mut().expect("made above");
        for (r, k) in keys.iter_mut().enumerate() {
            let row = io.logits.slice(r * vocab..(r + 1) * vocab);
            launch::sampling::argmax_row(&Launch::new(gpu), k, &row)?;
            gpu.stream
                .memcpy_dtod(&*k, &mut all.slice_mut(r..r + 1))
                .map_err(|e| CudaError::driver("gathering the rows' greedy keys", None, e))?;
        }
        let got = gpu.download(all, "the rows' greedy keys")?;
        let exports = download_exports(gpu, program, io)?;
        gpu.sync("the step")?;
        Ok(crate::exec::GreedyRows {
            chosen: got.into_iter().map(launch::sampling::argmax_of).collect(),
            exports,
        })
    }

    fn graph_replays(&self) -> usize {
        self.state.replays
    }

    /// Copies every state but the `Append` ones on the device (the GDN recurrent states, the
    /// conv and PLE windows, the n-gram history), into the buffers of the last checkpoint
    /// where it has them.
    fn checkpoint(&mut self) -> crate::error::Result<()> {
        let gpu = self.gpu;
        let _step = gpu.lock_step();
        let state = &mut self.state;
        let mut kept = state.checkpoint.take().map(|c| c.1).unwrap_or_default();
        for (name, buf) in &state.bufs {
            if state.appended.contains(name) {
                continue;
            }
            let copy = match (buf, kept.remove(name)) {
                (DevState::HostTokens(t), _) => DevState::HostTokens(t.clone()),
                (DevState::F32(b), Some(DevState::F32(c))) => {
                    DevState::F32(copy_into(gpu, b, Some(c), name)?)
                }
                (DevState::F32(b), _) => DevState::F32(copy_into(gpu, b, None, name)?),
                (DevState::I64(b), Some(DevState::I64(c))) => {
                    DevState::I64(copy_into(gpu, b, Some(c), name)?)
                }
                (DevState::I64(b), _) => DevState::I64(copy_into(gpu, b, None, name)?),
            };
            kept.insert(name.clone(), copy);
        }
        state.checkpoint = Some((state.position, kept));
        Ok(())
    }

    /// Restores the checkpoint's states (the `Append` ones need nothing: the position bounds
    /// what is read) and returns its position: the caller reruns the rows after it.
    fn rewind(&mut self, position: usize) -> crate::error::Result<usize> {
        let gpu = self.gpu;
        let _step = gpu.lock_step();
        let state = &mut self.state;
        let mark = state.checkpoint.as_ref().map(|c| c.0);
        let Some(at) = mark.filter(|&m| (m..=state.position).contains(&position)) else {
            return Err(crate::error::Error::Input(format!(
                "rewind to position {position}: the checkpoint is at {}, the sequence at {}",
                mark.map_or("none".to_string(), |m| m.to_string()),
                state.position
            )));
        };
        if position == state.position {
            return Ok(position);
        }
        let (_, kept) = state.checkpoint.as_mut().expect("checked above");
        for (name, copy) in kept.iter() {
            match (state.bufs.get_mut(name), copy) {
                (Some(DevState::F32(b)), DevState::F32(c)) => copy_state(gpu, c, b)?,
                (Some(DevState::I64(b)), DevState::I64(c)) => copy_state(gpu, c, b)?,
                (Some(DevState::HostTokens(b)), DevState::HostTokens(c)) => b.clone_from(c),
                _ => unreachable!("a checkpoint copies the states it finds"),
            }
        }
        state.position = at;
        Ok(at)
    }
}

/// The step's exports, from the buffers its last segment copied them into.
fn download_exports(
    gpu: &Gpu,
    program: &Program,
    io: &StepIo,
) -> Result<Vec<(String, Vec<f32>)>, CudaError> {
    program
        .exports
        .iter()
        .zip(&io.exports)
        .map(|(e, buf)| Ok((e.name.clone(), gpu.download(buf, &e.name)?)))
        .collect()
}

/// A copy of `from` on the device, into `reuse` where it has the length (else a new buffer).
fn copy_into<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    gpu: &Gpu,
    from: &CudaSlice<T>,
    reuse: Option<CudaSlice<T>>,
    name: &str,
) -> Result<CudaSlice<T>, CudaError> {
    let mut to = match reuse {
        Some(c) if c.len() == from.len() => c,
        _ => gpu.zeros(from.len(), name)?,
    };
    copy_state(gpu, from, &mut to)?;
    Ok(to)
}

/// A device copy of one state's buffer (stream-ordered: the next step sees it).
fn copy_state<T: cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    from: &CudaSlice<T>,
    to: &mut CudaSlice<T>,
) -> Result<(), CudaError> {
    gpu.stream
        .memcpy_dtod(from, to)
        .map_err(|e| CudaError::driver("copying a state for a rewind", None, e))
}

/// Waits for the step, then copies its result to the host with `download`; in replayed steps
/// with host timing on, adds the host's times to `host_times` (`host_step_s`: the step's host
/// steps).
fn read_out<T>(
    gpu: &Gpu,
    host_times: &mut Option<HostTimes>,
    replayed: bool,
    entered: std::time::Instant,
    host_step_s: f64,
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
        t.host_steps += host_step_s;
        t.wait += waited - launched;
        t.download += entered.elapsed().as_secs_f64() - waited;
    }
    Ok(data)
}
