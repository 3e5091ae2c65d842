//! The CUDA side of graphrun. The driver and NVRTC are loaded at run time (cudarc's dynamic
//! loading), so graphrun builds and runs on machines without CUDA; everything here answers with a
//! [`CudaError`] there, never a panic.
//!
//! - [`probe`]: which devices exist;
//! - [`kernels`]: the embedded `kernels/*.cu` sources, `#include "x.cuh"` expanded;
//! - [`compile`]: NVRTC for the device's architecture, PTX cached on disk by content hash;
//! - [`device`]: a device context with its stream, modules and kernels loaded on first use;
//! - [`context`]: one launch's context: its output slots, named kernels, ready inputs, scratch;
//! - [`launch`]: one launch function per kernel, the shapes checked before launching;
//! - [`launcher`]: the launch itself, with Hopper's programmatic dependent launch.
//! - [`trace`]: the timeline of replayed steps, kernel by kernel (`graphrun bench --trace`);
//! - [`executor`]: programs run over an arena, one CUDA graph per segment, each node launching
//!   the kernels its program names (`crate::registry`).

pub mod compile;
pub mod context;
pub mod device;
pub mod error;
pub mod executor;
pub mod kernels;
pub mod launch;
pub mod launcher;
pub mod probe;
pub mod trace;

pub use context::Launch;
pub use device::{Gpu, ReadyInputs};

pub use error::CudaError;
pub use probe::{probe, CudaUnavailable, DeviceInfo};
