//! Executors run lowered programs. `cpu` is the reference: plain f32 math from `crate::ops`,
//! parallel across cores where it pays. The CUDA executor (next) runs the same programs.

pub mod cpu;
pub mod state;

pub use state::SessionState;
