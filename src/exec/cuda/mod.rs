//! The CUDA side. For now only the device probe: the CUDA executor (kernels from `kernels/`,
//! NVRTC, per-segment CUDA graphs) is the next piece of work. The driver is loaded at run time
//! (cudarc's dynamic loading), so graphrun builds and runs on machines without CUDA.

pub mod probe;

pub use probe::{probe, CudaUnavailable, DeviceInfo};
