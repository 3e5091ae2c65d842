//! The runtime: a loaded [`Model`], per-sequence [`Session`]s, sampling and generation.

pub mod backend;
pub mod checked;
pub mod memory;
pub mod model;
pub mod sampling;
pub mod session;
pub mod speculative;

pub use backend::{Backend, CudaBackend};
pub use checked::{CheckedDir, CheckpointSummary};
pub use memory::MemoryPlan;
pub use model::{DeviceChoice, Model, ModelOptions};
pub use sampling::{Sampler, Sampling};
pub use session::{GenerateOptions, Logits, LogitsError, Session};
pub use speculative::{SpecOptions, SpecReport};
