//! Executors run lowered programs. `cpu` is the reference: plain f32 math from `crate::ops`,
//! parallel across cores where it pays. `cuda` runs the same programs on NVIDIA GPUs.

pub mod cpu;
pub mod cuda;
pub mod state;

pub use state::SessionState;
