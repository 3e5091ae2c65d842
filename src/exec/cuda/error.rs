use thiserror::Error;

use super::probe::CudaUnavailable;

/// Everything the CUDA side can report; each message names what failed.
#[derive(Debug, Error)]
pub enum CudaError {
    #[error(transparent)]
    Unavailable(#[from] CudaUnavailable),
    #[error(
        "no NVRTC library (libnvrtc) could be loaded: kernels cannot be compiled on this machine"
    )]
    NoNvrtc,
    #[error("device {ordinal} has compute capability {major}.{minor}; graphrun's kernels need 8.0 or newer")]
    TooOld {
        ordinal: usize,
        major: i32,
        minor: i32,
    },
    #[error("kernels/{file}{}: {msg}\n{log}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Compile {
        file: String,
        line: Option<u32>,
        msg: String,
        log: String,
    },
    #[error("no kernel source kernels/{0}")]
    NoSource(String),
    #[error("kernels/{file} has no kernel `{kernel}`")]
    NoKernel { file: String, kernel: String },
    #[error("out of device memory: {bytes} bytes asked for {what}")]
    OutOfMemory { bytes: usize, what: String },
    #[error("CUDA error while {doing}: {msg}")]
    Driver { doing: String, msg: String },
    #[error("{kernel}: {msg}")]
    Shape { kernel: String, msg: String },
    /// A launcher asked for a kernel its node's program does not name.
    #[error("node `{node}` launches kernel `{kernel}`, which its program does not name (it names: {named})")]
    Unnamed {
        node: String,
        kernel: String,
        named: String,
    },
    /// A node's program names a kernel its launcher did not launch.
    #[error("node `{node}` names kernel `{kernel}`, which its launch did not run")]
    Unlaunched { node: String, kernel: String },
}

impl CudaError {
    /// Maps a driver error, telling out-of-memory apart.
    pub fn driver(
        doing: impl Into<String>,
        bytes: Option<usize>,
        e: cudarc::driver::DriverError,
    ) -> CudaError {
        let doing = doing.into();
        let msg = e.to_string();
        match bytes {
            Some(bytes) if msg.contains("OUT_OF_MEMORY") => {
                CudaError::OutOfMemory { bytes, what: doing }
            }
            _ => CudaError::Driver { doing, msg },
        }
    }
}
