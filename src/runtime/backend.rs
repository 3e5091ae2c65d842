//! Where a model runs: what it keeps on its device, and the executor each new sequence gets.

use crate::exec::cuda::executor::{CudaExecutor, DeviceWeights, Instrumentation};
use crate::exec::cuda::Gpu;
use crate::exec::{CpuExecutor, Executor};
use crate::ir::Device;
use crate::weights::Weights;

/// The executor a model runs on, with what it keeps there.
#[allow(clippy::large_enum_variant)] // one per model
pub enum Backend {
    Cpu,
    Cuda(CudaBackend),
}

/// A model on a CUDA device.
pub struct CudaBackend {
    pub gpu: Gpu,
    pub weights: DeviceWeights,
    /// Rows every sequence's `Append` states hold (its longest context).
    pub capacity: usize,
    /// Capture each step shape as CUDA graphs and replay them (off: `--no-graphs`).
    pub graphs: bool,
    /// The instrumentation each new sequence starts with (`ModelOptions`'s debugging settings).
    pub instrumentation: Instrumentation,
}

impl Backend {
    /// The device programs are lowered for.
    pub fn device(&self) -> Device {
        match self {
            Backend::Cpu => Device::Cpu,
            Backend::Cuda(_) => Device::Cuda,
        }
    }

    /// The model on a CUDA device, if it is on one.
    pub fn cuda(&self) -> Option<&CudaBackend> {
        match self {
            Backend::Cpu => None,
            Backend::Cuda(c) => Some(c),
        }
    }

    /// The executor of a new sequence; `weights` are the model's host weights, which the CPU
    /// reads.
    pub fn executor<'m>(&'m self, weights: &'m Weights) -> Box<dyn Executor + 'm> {
        match self {
            Backend::Cpu => Box::new(CpuExecutor::new(weights)),
            Backend::Cuda(c) => Box::new(c.executor()),
        }
    }
}

impl CudaBackend {
    /// The executor of a new sequence on the device, with the model's instrumentation.
    pub fn executor(&self) -> CudaExecutor<'_> {
        CudaExecutor::new(
            &self.gpu,
            &self.weights,
            self.capacity,
            self.graphs,
            self.instrumentation.clone(),
        )
    }
}
