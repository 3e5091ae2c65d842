//! One CUDA device: its context, the stream graphrun launches on (a non-default stream with
//! event tracking off, which CUDA-graph capture needs), and the kernel modules loaded so far.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Held for a whole step ([`Gpu::lock_step`]): steps share the stream, and a step being
    /// captured into a CUDA graph would capture another thread's launches too.
    step: Mutex<()>,
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
}

/// How many arrival counters a device has ([`Gpu::counters`]).
use crate::registry::facts::ARRIVAL_COUNTERS;

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
            step: Mutex::new(()),
            multiprocessors,
            tracer: Mutex::new(None),
            tracing: AtomicBool::new(false),
            names: Mutex::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            counters,
        })
    }

    /// What the rules and kernels see of this device (`registry::DeviceFacts`).
    pub fn facts(&self) -> crate::registry::DeviceFacts {
        let (major, minor) = self.info.compute_capability;
        crate::registry::DeviceFacts::cuda((major * 10 + minor).max(0) as u32, self.multiprocessors)
    }

    /// Kernel `name` of `kernels/<file>`, compiling and loading the file on first use. Launchers
    /// ask through their [`Launch`](super::context::Launch), which checks the node names it.
    pub fn function(&self, file: &str, name: &str) -> Result<CudaFunction, CudaError> {
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
        *self.tracer.lock().expect("tracer lock") = Some(Tracer { buffer, log: None });
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

    /// Called by every launch (of `node`'s kernels): its label, while the log runs.
    pub fn trace_launch(&self, func: &CudaFunction, node: &str) {
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
            let label = format!("{node} {name}");
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
