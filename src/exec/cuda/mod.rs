//! The CUDA side of graphrun. The driver and NVRTC are loaded at run time (cudarc's dynamic
//! loading), so graphrun builds and runs on machines without CUDA; everything here answers with a
//! [`CudaError`] there, never a panic.
//!
//! Built so far (the foundation of the CUDA executor):
//! - [`probe`]: which devices exist;
//! - [`kernels`]: the embedded `kernels/*.cu` sources, `#include "x.cuh"` expanded;
//! - [`compile`]: NVRTC for the device's architecture, PTX cached on disk by content hash;
//! - [`device`]: a device context with its stream, modules and kernels loaded on first use;
//! - [`launch`]: one launch function per kernel, the shapes checked before launching;
//! - [`launcher`]: the launch itself, with Hopper's programmatic dependent launch.
//! - [`trace`]: the timeline of replayed steps, kernel by kernel (`graphrun bench --trace`).
//!
//! Next (see `docs/cuda-plan.md`): every op's kernels, the executor over programs with an arena
//! from `memplan`, device-side routing and selection, per-segment CUDA graphs.

pub mod compile;
pub mod device;
pub mod error;
pub mod executor;
pub mod kernels;
pub mod launch;
pub mod launcher;
pub mod probe;
pub mod trace;

pub use device::{Gpu, ReadyInputs};

/// The CUDA kernel variants of an op kind (the first is the default), as rules name them.
pub fn variants(kind: &str) -> &'static [&'static str] {
    match kind {
        // One warp per output row, up to 8 tokens per pass (decode); shared-memory tiles (prefill);
        // tensor-core tiles of 64 or 128 tokens (prefill, bf16 weights; `tiled` otherwise).
        "linear" => &["rows", "tiled", "mma", "mma_wide"],
        // Token-major: each slot reads its expert (decode); expert-major: slots grouped by
        // expert on the device, each expert read once per tile of its slots (prefill).
        "moe_experts" => &["token_major", "expert_major"],
        // One block per (row, head) over the row's positions; the GQA group of a kv head in one
        // block over a split of the positions (every step; a prefill row takes one split).
        // The fused QSA chain (`gated_attention`): its q/k prepared in one kernel, then either
        // attention kernel with the output gate as its epilogue.
        "attention" | "gated_attention" => &["reference", "split"],
        other if !crate::ops::variants(other).is_empty() => &["reference"],
        _ => &[],
    }
}
pub use error::CudaError;
pub use probe::{probe, CudaUnavailable, DeviceInfo};
