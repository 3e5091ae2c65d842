//! The CUDA executor: runs the same lowered programs as `exec::cpu`, every op as a kernel on one
//! stream. Weights are uploaded once ([`DeviceWeights`]); a sequence's state lives on the device
//! ([`DeviceState`], `Append` states preallocated to a capacity); the step's start position is a
//! device value that kernels read. Values live in one arena laid out by `memplan`; each segment
//! is captured once as a CUDA graph and replayed. Each node launches the kernels its program
//! names, and only those ([`Launch::for_node`]).

use std::collections::HashMap;

use cudarc::driver::{sys, CudaGraph, CudaSlice, DevicePtr};

use crate::ir::{LogitsMode, Phase, Program, Segment, StateKind, WeightClass};
use crate::weights::Weights;

use super::context::{Launch, Slot};
use super::device::{Buf, Gpu, ReadyInputs};
use super::error::CudaError;
use super::launch::{self, DeviceMatrix};

mod nodes;
mod record;
mod single;
mod weights;

use record::*;
pub use single::run_node;
pub use weights::DeviceWeights;

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
    /// The arena slots of the program input and of each node's outputs.
    input_slot: Slot,
    node_slots: Vec<Vec<Slot>>,
    /// The planned shapes of each node's inputs, in its input order.
    node_inputs: Vec<Vec<ValueShape>>,
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
        Ok(StepIo {
            step: gpu.zeros(1, "the step position")?,
            tokens: gpu.zeros(rows_in, "the step's tokens")?,
            logits: gpu.zeros(logits_rows * vocab, "the step's logits")?,
            logits_rows,
            greedy_key: gpu.zeros(1, "the greedy step's key")?,
            _arena: arena,
            input_slot,
            node_slots,
            node_inputs,
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
/// (`runtime::sampling::argmax`'s choice, found on the device), or the first NaN of the row:
/// a greedy step downloads 8 bytes instead of its row of logits.
pub fn run_greedy(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    state: &mut DeviceState,
    tokens: &[i64],
    graphs: bool,
) -> Result<Result<u32, crate::runtime::sampling::BadLogit>, CudaError> {
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
    launch::sampling::argmax_row(&Launch::new(gpu), &mut io.greedy_key, &last)?;
    let io = &state.io[&key];
    let key = read_out(gpu, &mut state.host_times, replayed, entered, |gpu| {
        gpu.download(&io.greedy_key, "the greedy step's key")
    })?;
    Ok(launch::sampling::argmax_of(key[0]))
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
