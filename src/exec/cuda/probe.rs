//! Which CUDA devices this machine has, without ever failing hard: no driver, no device or a
//! driver error is a value that says what is missing.

use cudarc::driver::CudaContext;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for an H200.
    pub compute_capability: (i32, i32),
    pub memory_bytes: usize,
}

#[derive(Debug, Error)]
pub enum CudaUnavailable {
    #[error("no CUDA driver library (libcuda) could be loaded on this machine")]
    NoDriver,
    #[error("the CUDA driver reports no device")]
    NoDevice,
    #[error("CUDA driver error while {doing}: {msg}")]
    Driver { doing: String, msg: String },
}

/// Lists the CUDA devices.
pub fn probe() -> Result<Vec<DeviceInfo>, CudaUnavailable> {
    // SAFETY: only checks whether the shared library can be opened; calls nothing in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoDriver);
    }
    let driver = |doing: &str| {
        let doing = doing.to_string();
        move |e: cudarc::driver::DriverError| CudaUnavailable::Driver {
            doing: doing.clone(),
            msg: e.to_string(),
        }
    };
    let count = CudaContext::device_count().map_err(driver("counting devices"))?;
    if count <= 0 {
        return Err(CudaUnavailable::NoDevice);
    }
    (0..count as usize)
        .map(|ordinal| {
            let ctx =
                CudaContext::new(ordinal).map_err(driver(&format!("opening device {ordinal}")))?;
            Ok(DeviceInfo {
                ordinal,
                name: ctx.name().map_err(driver("reading the device name"))?,
                compute_capability: ctx
                    .compute_capability()
                    .map_err(driver("reading the compute capability"))?,
                memory_bytes: ctx.total_mem().map_err(driver("reading the memory size"))?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// On any machine the probe answers (a list or a reason); it never panics.
    #[test]
    fn probe_answers_without_panicking() {
        match super::probe() {
            Ok(devices) => assert!(!devices.is_empty()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
