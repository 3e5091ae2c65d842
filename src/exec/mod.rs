//! Executors run lowered programs. `cpu` is the reference: plain f32 math from `crate::ops`,
//! parallel across cores where it pays. The CUDA executor (next; `cuda` has its device probe)
//! will run the same programs.

pub mod cpu;
pub mod cuda;
pub mod state;

pub use state::SessionState;
