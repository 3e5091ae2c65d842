//! One CUDA device: its context, the stream graphrun launches on (a non-default stream with
//! event tracking off, which CUDA-graph capture needs), and the kernel modules loaded so far.

use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::compile;
use super::error::CudaError;
use super::probe::{probe, DeviceInfo};
use super::trace::{self, Tracer};

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: DeviceInfo,
    cache_dir: Option<PathBuf>,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// Kernels looked up so far, by (file, name): an eager step looks up hundreds.
    functions: Mutex<HashMap<(String, String), CudaFunction>>,
    /// How many kernel files were compiled (not found in the cache), for reports.
    pub compiled: Mutex<Vec<String>>,
    /// Arena slots (address, bytes) for the outputs of the node being launched, in output
    /// order: [`Gpu::output`] hands them out (see `exec::cuda::executor`).
    slots: Mutex<VecDeque<(sys::CUdeviceptr, usize)>>,
    /// Where [`Gpu::scratch`] takes kernel temporaries from while a step runs.
    scratch: Mutex<Scratch>,
    /// Held for a whole step ([`Gpu::lock_step`]): the arena slots and the scratch buffer above
    /// belong to the step being launched, so two sessions on one device take turns (their
    /// kernels share one stream anyway).
    step: Mutex<()>,
    /// Whether launches carry the programmatic-dependent-launch attribute (see
    /// `exec::cuda::launcher`); set per step by the executor, only ever true on sm_90 and later.
    programmatic: AtomicBool,
    /// Which inputs of the node being launched are complete before the node ahead of it has
    /// finished (see [`Gpu::take_ready_inputs`]); set by the executor before each node.
    ready_inputs: AtomicU64,
    /// Streaming multiprocessors (sizes the split of decode attention).
    pub multiprocessors: usize,
    /// The step timeline, when on ([`Gpu::enable_trace`]): kernels loaded after it record
    /// their launches (`exec::cuda::trace`).
    tracer: Mutex<Option<Tracer>>,
    tracing: AtomicBool,
    /// Kernel names by function handle, for the timeline's labels (those looked up while it is
    /// on: [`Gpu::enable_trace`] empties the function cache, so every later launch's is here).
    names: Mutex<HashMap<usize, String>>,
    /// Modules taken out of the cache by [`Gpu::enable_trace`], kept loaded for the graphs
    /// captured with them.
    retired: Mutex<Vec<Arc<CudaModule>>>,
    /// Arrival counters for kernels whose blocks meet within a launch ([`Gpu::counters`]):
    /// zeroed when the device is opened (never inside a capture), left at zero by each launch.
    counters: CudaSlice<u32>,
    /// The kernels the node being launched names, while the executor launches one
    /// ([`Gpu::expect_kernels`]): [`Gpu::function`] refuses any other, so a launcher launches
    /// what the program names and nothing else.
    expected: Mutex<Option<ExpectedKernels>>,
}

/// How many arrival counters a device has ([`Gpu::counters`]).
use crate::registry::facts::ARRIVAL_COUNTERS;

/// A node's kernels (`Node::kernels`) and which of them its launcher has asked for.
struct ExpectedKernels {
    node: String,
    named: Vec<String>,
    used: Vec<bool>,
}

/// The inputs of a node (by their place in the node's input list, up to 64) that are complete
/// before the node launched just ahead of it has finished: a kernel may read them and compute
/// before its wait, so that its work overlaps that node's ("running ahead", kernels/common.cuh).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadyInputs(pub u64);

impl ReadyInputs {
    pub const NONE: ReadyInputs = ReadyInputs(0);
    pub const ALL: ReadyInputs = ReadyInputs(u64::MAX);

    /// Whether every input at these places is ready.
    pub fn all(self, places: &[usize]) -> bool {
        places.iter().all(|&i| i < 64 && self.0 & (1 << i) != 0)
    }
}

/// Kernel temporaries of the node being launched: bump-allocated from a step's scratch buffer
/// when one is set (it is reset before every node: a temporary never outlives its launch
/// function, and the stream orders the next node's use after this one's kernels), else
/// allocated on the stream. `asked`/`peak` measure what a node needs, so that the executor can
/// size the buffer after a step's first (eager) run.
#[derive(Default)]
struct Scratch {
    pool: Option<(sys::CUdeviceptr, usize)>,
    used: usize,
    asked: usize,
    peak: usize,
}

/// A kernel's output buffer: its own allocation, or a slot of a step's arena (laid out by
/// `passes::memplan`), which it must not free.
pub struct Buf<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    owned: bool,
}

impl<T> Buf<T> {
    pub fn owned(slice: CudaSlice<T>) -> Buf<T> {
        Buf {
            slice: ManuallyDrop::new(slice),
            owned: true,
        }
    }

    /// `len` elements at `ptr`, inside an allocation that outlives the buffer.
    ///
    /// # Safety
    /// `ptr` must point at `len * size_of::<T>()` bytes of device memory on `stream`'s context
    /// that stay allocated while the buffer lives.
    pub unsafe fn aliased(stream: &Arc<CudaStream>, ptr: sys::CUdeviceptr, len: usize) -> Buf<T> {
        Buf {
            slice: ManuallyDrop::new(stream.upgrade_device_ptr(ptr, len)),
            owned: false,
        }
    }

    /// The device address (to check a buffer against the arena plan).
    pub fn address(&self, stream: &CudaStream) -> sys::CUdeviceptr {
        self.slice.device_ptr(stream).0
    }
}

impl<T> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buf({} elements, {})",
            self.slice.len(),
            if self.owned { "owned" } else { "arena" }
        )
    }
}

impl<T> Deref for Buf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for Buf<T> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken exactly once, here.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        if self.owned {
            drop(slice);
        } else {
            // An arena slot: forget the address without freeing it.
            slice.leak();
        }
    }
}

impl Gpu {
    /// Opens device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Gpu, CudaError> {
        let devices = probe()?;
        let info = devices
            .into_iter()
            .find(|d| d.ordinal == ordinal)
            .ok_or_else(|| CudaError::Driver {
                doing: format!("opening device {ordinal}"),
                msg: "no such device".into(),
            })?;
        if info.compute_capability.0 < 8 {
            return Err(CudaError::TooOld {
                ordinal,
                major: info.compute_capability.0,
                minor: info.compute_capability.1,
            });
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudaError::driver(format!("opening device {ordinal}"), None, e))?;
        // SAFETY: graphrun orders its work on one stream itself; cudarc's per-buffer events
        // would break stream capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("creating a stream", None, e))?;
        // On where supported (sessions set it per step).
        let programmatic = info.compute_capability.0 >= 9;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| CudaError::driver("reading the multiprocessor count", None, e))?
            .max(1) as usize;
        let counters = stream.alloc_zeros::<u32>(ARRIVAL_COUNTERS).map_err(|e| {
            CudaError::driver(
                "allocating the arrival counters",
                Some(ARRIVAL_COUNTERS * 4),
                e,
            )
        })?;
        stream
            .synchronize()
            .map_err(|e| CudaError::driver("zeroing the arrival counters", None, e))?;
        Ok(Gpu {
            ctx,
            stream,
            info,
            cache_dir: compile::default_cache_dir(),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            compiled: Mutex::new(Vec::new()),
            slots: Mutex::new(VecDeque::new()),
            scratch: Mutex::new(Scratch::default()),
            step: Mutex::new(()),
            programmatic: AtomicBool::new(programmatic),
            ready_inputs: AtomicU64::new(0),
            multiprocessors,
            tracer: Mutex::new(None),
            tracing: AtomicBool::new(false),
            names: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            counters,
            expected: Mutex::new(None),
        })
    }

    /// From now until [`Gpu::launched_expected`], kernels are looked up for `node`, which names
    /// `kernels`.
    pub fn expect_kernels(&self, node: &str, kernels: &[String]) {
        *self.expected.lock().expect("expected kernels lock") = Some(ExpectedKernels {
            node: node.to_string(),
            named: kernels.to_vec(),
            used: vec![false; kernels.len()],
        });
    }

    /// Marks `kernel` as launched for the node being launched, refusing a kernel it does not
    /// name (nothing is checked outside a node's launch).
    pub fn note_kernel(&self, kernel: &str) -> Result<(), CudaError> {
        let mut guard = self.expected.lock().expect("expected kernels lock");
        let Some(e) = guard.as_mut() else {
            return Ok(());
        };
        match e.named.iter().position(|k| k == kernel) {
            Some(i) => {
                e.used[i] = true;
                Ok(())
            }
            None => Err(CudaError::Unnamed {
                node: e.node.clone(),
                kernel: kernel.to_string(),
                named: e.named.join(", "),
            }),
        }
    }

    /// Ends a node's launch: an error if it named a kernel its launcher did not launch.
    pub fn launched_expected(&self) -> Result<(), CudaError> {
        let Some(e) = self.expected.lock().expect("expected kernels lock").take() else {
            return Ok(());
        };
        match e.used.iter().position(|u| !u) {
            Some(i) => Err(CudaError::Unlaunched {
                node: e.node,
                kernel: e.named[i].clone(),
            }),
            None => Ok(()),
        }
    }

    /// Kernel `name` of `kernels/<file>`, compiling and loading the file on first use.
    pub fn function(&self, file: &str, name: &str) -> Result<CudaFunction, CudaError> {
        self.note_kernel(name)?;
        let key = (file.to_string(), name.to_string());
        if let Some(f) = self
            .functions
            .lock()
            .expect("function cache lock")
            .get(&key)
        {
            return Ok(f.clone());
        }
        let module = {
            let mut modules = self.modules.lock().expect("module cache lock");
            match modules.get(file) {
                Some(m) => m.clone(),
                None => {
                    let compiled = compile::compile(
                        file,
                        self.info.compute_capability,
                        self.cache_dir.as_deref(),
                        self.tracing(),
                    )?;
                    if !compiled.from_cache {
                        self.compiled
                            .lock()
                            .expect("compiled list lock")
                            .push(file.to_string());
                    }
                    let m = self
                        .ctx
                        .load_module(Ptx::from_src(compiled.ptx))
                        .map_err(|e| {
                            CudaError::driver(format!("loading kernels/{file}"), None, e)
                        })?;
                    self.point_at_trace(file, &m)?;
                    modules.insert(file.to_string(), m.clone());
                    m
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|_| CudaError::NoKernel {
                file: file.to_string(),
                kernel: name.to_string(),
            })?;
        self.functions
            .lock()
            .expect("function cache lock")
            .insert(key, f.clone());
        if self.tracing() {
            self.names
                .lock()
                .expect("kernel names lock")
                .insert(f.cu_function() as usize, name.to_string());
        }
        Ok(f)
    }

    /// Turns the step timeline on (`exec::cuda::trace`): a buffer for `capacity` records, and
    /// the kernels loaded from now on built to record into it (those loaded before leave the
    /// cache, so every later launch records; graphs captured before keep theirs, still loaded).
    pub fn enable_trace(&self, capacity: usize) -> Result<(), CudaError> {
        let mut header = vec![0u64; trace::HEADER_WORDS + trace::RECORD_WORDS * capacity];
        header[1] = capacity as u64;
        let buffer = self.upload(&header, "the trace buffer")?;
        *self.tracer.lock().expect("tracer lock") = Some(Tracer {
            buffer,
            log: None,
            node: String::new(),
        });
        // The modules loaded so far stay loaded (graphs captured before hold their kernels),
        // out of the cache, so that later launches load the traced build.
        let old: Vec<Arc<CudaModule>> = self
            .modules
            .lock()
            .expect("module cache lock")
            .drain()
            .map(|(_, m)| m)
            .collect();
        self.retired
            .lock()
            .expect("retired modules lock")
            .extend(old);
        self.functions.lock().expect("function cache lock").clear();
        self.tracing.store(true, Ordering::Relaxed);
        Ok(())
    }

    pub fn tracing(&self) -> bool {
        self.tracing.load(Ordering::Relaxed)
    }

    /// Points a traced module's `graphrun_trace` at the trace buffer.
    fn point_at_trace(&self, file: &str, module: &Arc<CudaModule>) -> Result<(), CudaError> {
        let tracer = self.tracer.lock().expect("tracer lock");
        let Some(t) = tracer.as_ref() else {
            return Ok(());
        };
        let address = t.buffer.device_ptr(&self.stream).0;
        let doing = || format!("pointing kernels/{file} at the trace buffer");
        let mut global = module
            .get_global("graphrun_trace", &self.stream)
            .map_err(|e| CudaError::driver(doing(), None, e))?;
        // SAFETY: the global is one 8-byte pointer (kernels/common.cuh).
        let mut word =
            unsafe { global.transmute_mut::<u64>(1) }.ok_or_else(|| CudaError::Driver {
                doing: doing(),
                msg: "graphrun_trace is not one pointer".into(),
            })?;
        self.stream
            .memcpy_htod(&[address], &mut word)
            .map_err(|e| CudaError::driver(doing(), None, e))
    }

    /// The node whose launches follow (for the timeline's labels).
    pub fn set_trace_node(&self, node: &str) {
        if self.tracing() {
            if let Some(t) = self.tracer.lock().expect("tracer lock").as_mut() {
                t.node.clear();
                t.node.push_str(node);
            }
        }
    }

    /// Starts (or, with `false`, stops and returns) the labels of the launches in between.
    pub fn trace_log(&self, on: bool) -> Vec<String> {
        let mut tracer = self.tracer.lock().expect("tracer lock");
        let Some(t) = tracer.as_mut() else {
            return Vec::new();
        };
        let taken = t.log.take().unwrap_or_default();
        if on {
            t.log = Some(Vec::new());
        }
        taken
    }

    /// Called by every launch: its label, while the log runs.
    pub fn trace_launch(&self, func: &CudaFunction) {
        if !self.tracing() {
            return;
        }
        let name = self
            .names
            .lock()
            .expect("kernel names lock")
            .get(&(func.cu_function() as usize))
            .cloned()
            .unwrap_or_else(|| "?".into());
        if let Some(t) = self.tracer.lock().expect("tracer lock").as_mut() {
            let label = format!("{} {name}", t.node);
            if let Some(log) = t.log.as_mut() {
                log.push(label);
            }
        }
    }

    /// Empties the trace buffer (on the stream: after what was launched before).
    pub fn trace_reset(&self) -> Result<(), CudaError> {
        let mut tracer = self.tracer.lock().expect("tracer lock");
        let Some(t) = tracer.as_mut() else {
            return Ok(());
        };
        let mut first = t.buffer.slice_mut(0..1);
        self.stream
            .memcpy_htod(&[0u64], &mut first)
            .map_err(|e| CudaError::driver("emptying the trace buffer", None, e))
    }

    /// The records written since the last reset (waits for the stream).
    pub fn trace_records(&self) -> Result<Vec<trace::Record>, CudaError> {
        let tracer = self.tracer.lock().expect("tracer lock");
        let Some(t) = tracer.as_ref() else {
            return Ok(Vec::new());
        };
        let words = self
            .stream
            .clone_dtoh(&t.buffer)
            .map_err(|e| CudaError::driver("downloading the trace buffer", None, e))?;
        Ok(trace::parse(&words))
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T], what: &str) -> Result<CudaSlice<T>, CudaError> {
        self.stream.clone_htod(data).map_err(|e| {
            CudaError::driver(
                format!("uploading {what}"),
                Some(std::mem::size_of_val(data)),
                e,
            )
        })
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &str,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.stream.alloc_zeros(len).map_err(|e| {
            CudaError::driver(
                format!("allocating {what}"),
                Some(len * std::mem::size_of::<T>()),
                e,
            )
        })
    }

    /// A kernel's output of `len` elements: the next arena slot set by [`Gpu::set_slots`] when
    /// the executor launches a planned node (its size must be the planned one), else a fresh
    /// allocation. Not zeroed: every kernel writes all of its output.
    pub fn output<T: DeviceRepr>(&self, len: usize, what: &str) -> Result<Buf<T>, CudaError> {
        let slot = self.slots.lock().expect("arena slot lock").pop_front();
        let bytes = len * std::mem::size_of::<T>();
        match slot {
            Some((ptr, planned)) if planned == bytes => {
                // SAFETY: the executor's arena holds `planned` bytes at `ptr` for the whole step.
                Ok(unsafe { Buf::aliased(&self.stream, ptr, len) })
            }
            Some((_, planned)) => Err(CudaError::Shape {
                kernel: what.to_string(),
                msg: format!(
                    "the arena plan has {planned} bytes for this output, the kernel writes {bytes}"
                ),
            }),
            None => self.scratch(len, what),
        }
    }

    /// A temporary of `len` elements for the launch being made: from the step's scratch buffer
    /// when one is set and has room ([`Gpu::set_scratch_pool`]), else allocated on the stream
    /// (inside a captured graph, a graph allocation). Not zeroed.
    pub fn scratch<T: DeviceRepr>(&self, len: usize, what: &str) -> Result<Buf<T>, CudaError> {
        let bytes = (len.max(1) * std::mem::size_of::<T>()).next_multiple_of(256);
        {
            let mut sc = self.scratch.lock().expect("scratch lock");
            sc.asked += bytes;
            sc.peak = sc.peak.max(sc.asked);
            if let Some((base, size)) = sc.pool {
                if sc.used + bytes <= size {
                    let ptr = base + sc.used as u64;
                    sc.used += bytes;
                    // SAFETY: the executor keeps the pool allocated while its step's graphs
                    // exist, and nothing else uses these bytes until the next node.
                    return Ok(unsafe { Buf::aliased(&self.stream, ptr, len) });
                }
            }
        }
        // SAFETY: the memory is uninitialised; every caller's kernel writes what it later reads.
        unsafe { self.stream.alloc::<T>(len.max(1)) }
            .map(|s| Buf::owned(s))
            .map_err(|e| {
                CudaError::driver(
                    format!("allocating {what}"),
                    Some(len * std::mem::size_of::<T>()),
                    e,
                )
            })
    }

    /// Whether kernels may start before the kernel ahead of them in the stream has finished
    /// (programmatic dependent launch; `exec::cuda::launcher`). Needs sm_90: asked on an older
    /// device, it stays off.
    pub fn set_programmatic_launch(&self, on: bool) {
        let supported = self.info.compute_capability.0 >= 9;
        self.programmatic.store(on && supported, Ordering::Relaxed);
    }

    /// Sets which of the next node's inputs are complete before the node launched just ahead of
    /// it finishes (those that are not its outputs; the executor decides, and only under
    /// programmatic launch). See [`Gpu::take_ready_inputs`].
    pub fn set_ready_inputs(&self, ready: ReadyInputs) {
        self.ready_inputs.store(ready.0, Ordering::Relaxed);
    }

    /// For the first kernel a node launches: which of the node's inputs it may read before its
    /// wait (`wait_for_producers_unless` in kernels/common.cuh). Taking it clears it, so a node's
    /// later kernels (which read the first one's results) always wait first.
    pub fn take_ready_inputs(&self) -> ReadyInputs {
        ReadyInputs(self.ready_inputs.swap(0, Ordering::Relaxed))
    }

    pub fn programmatic_launch(&self) -> bool {
        self.programmatic.load(Ordering::Relaxed)
    }

    /// The device address of the arrival counters (`counters` field): words that kernels count
    /// their blocks' arrivals in and leave at zero when they finish (as
    /// `gdn_conv_normed_recurrence_f32` does, one word a key head, and `ple_embed_*` the last
    /// word). A kernel touches them only after its wait, when the kernels before it are done.
    pub fn counters(&self) -> u64 {
        self.counters.device_ptr(&self.stream).0
    }

    /// How many arrival counters there are ([`Gpu::counters`]).
    pub fn counter_count(&self) -> usize {
        self.counters.len()
    }

    /// Serialises steps on this device (see the `step` field); held until the guard drops.
    pub fn lock_step(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic in another step leaves nothing half-set that the next step relies on: it
        // sets its own slots and scratch.
        self.step
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets (or clears) the step's scratch buffer and starts a new measure of the most scratch
    /// a node asks for; returns the previous measure's peak in bytes.
    pub fn set_scratch_pool(&self, pool: Option<(sys::CUdeviceptr, usize)>) -> usize {
        let mut sc = self.scratch.lock().expect("scratch lock");
        let peak = sc.peak;
        *sc = Scratch {
            pool,
            ..Scratch::default()
        };
        peak
    }

    /// Called before each node: its temporaries start at the beginning of the scratch buffer.
    pub fn next_node_scratch(&self) {
        let mut sc = self.scratch.lock().expect("scratch lock");
        sc.used = 0;
        sc.asked = 0;
    }

    /// Runs `f`, the launches of a node's intermediate value (a fallback that makes the node's
    /// output in several launches), with the node's arena slots held back: what `f` makes comes
    /// from scratch ([`Gpu::output`] with no slot), and the slots go to the launches after it,
    /// which make the node's outputs. Without it the first launch would take the slot planned
    /// for the node's output.
    pub fn intermediate<R>(&self, f: impl FnOnce() -> R) -> R {
        let held = std::mem::take(&mut *self.slots.lock().expect("arena slot lock"));
        let result = f();
        *self.slots.lock().expect("arena slot lock") = held;
        result
    }

    /// Sets the arena slots for the outputs of the next launch (see [`Gpu::output`]); returns
    /// how many were left untaken by the previous one (0 when every planned output was made).
    pub fn set_slots(&self, slots: &[(sys::CUdeviceptr, usize)]) -> usize {
        let mut q = self.slots.lock().expect("arena slot lock");
        let left = q.len();
        q.clear();
        q.extend(slots.iter().copied());
        left
    }

    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        data: &CudaSlice<T>,
        what: &str,
    ) -> Result<Vec<T>, CudaError> {
        self.stream
            .clone_dtoh(data)
            .map_err(|e| CudaError::driver(format!("downloading {what}"), None, e))
    }

    /// Waits for all launched work; a kernel fault surfaces here, naming `after`.
    pub fn sync(&self, after: &str) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver(format!("running {after}"), None, e))
    }
}
