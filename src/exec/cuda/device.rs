//! One CUDA device: its context, the stream graphrun launches on (a non-default stream with
//! event tracking off, which CUDA-graph capture needs), and the kernel modules loaded so far.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::compile;
use super::error::CudaError;
use super::probe::{probe, DeviceInfo};

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: DeviceInfo,
    cache_dir: Option<PathBuf>,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// How many kernel files were compiled (not found in the cache), for reports.
    pub compiled: Mutex<Vec<String>>,
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
        Ok(Gpu {
            ctx,
            stream,
            info,
            cache_dir: compile::default_cache_dir(),
            modules: Mutex::new(HashMap::new()),
            compiled: Mutex::new(Vec::new()),
        })
    }

    /// Kernel `name` of `kernels/<file>`, compiling and loading the file on first use.
    pub fn function(&self, file: &str, name: &str) -> Result<CudaFunction, CudaError> {
        let module = {
            let mut modules = self.modules.lock().expect("module cache lock");
            match modules.get(file) {
                Some(m) => m.clone(),
                None => {
                    let compiled = compile::compile(
                        file,
                        self.info.compute_capability,
                        self.cache_dir.as_deref(),
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
                    modules.insert(file.to_string(), m.clone());
                    m
                }
            }
        };
        module.load_function(name).map_err(|_| CudaError::NoKernel {
            file: file.to_string(),
            kernel: name.to_string(),
        })
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
