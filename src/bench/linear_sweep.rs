//! Every one-token linear variant (`launch::linear::OneToken`) on every one-token matrix shape of
//! the decode program, each timed alone: which variant a shape should take, from measurement.
//!
//! A shape's launches run back to back (queued behind a spinning kernel, with programmatic
//! launch as in a step) over enough copies of the matrix that none is still in L2 when it comes
//! round again, into one reused output buffer.

use std::collections::BTreeSet;

use serde::Serialize;

use super::fraction;
use crate::error::Result;
use crate::exec::cuda::launch::linear::{linear_hc_write_with, linear_one_token, OneToken};
use crate::exec::cuda::launch::{self, DeviceMatrix};
use crate::exec::cuda::{CudaError, Gpu};
use crate::ir::{Op, Program};

#[derive(Debug, Serialize)]
pub struct SweepRow {
    /// `linear` or `linear_hc_write`, and the shape `k->n`.
    pub kernel: String,
    pub k: usize,
    pub n: usize,
    pub variant: String,
    pub us_per_launch: f64,
    pub fraction_of_copy_bandwidth: f64,
    /// The variant the launcher picks for this shape today.
    pub chosen: bool,
}

/// Bytes of matrix copies cycled per shape: several times the H200's 50 MB L2.
const ROTATION_BYTES: usize = 512 << 20;
const LAUNCHES: usize = 48;
const STREAMS: usize = 4;

/// The (fused with the residual write?, k, n) of each one-token linear node of `program`.
fn shapes(program: &Program) -> BTreeSet<(bool, usize, usize)> {
    let width = |name: &str| program.value(name).map_or(0, |v| v.width);
    let mut out = BTreeSet::new();
    for node in &program.nodes {
        match &node.op {
            Op::Linear => {
                out.insert((false, width(&node.inputs[0]), width(&node.outputs[0])));
            }
            Op::LinearHcWrite { streams } => {
                let n = width(&node.outputs[0]) / (*streams).max(1);
                out.insert((true, width(&node.inputs[2]), n));
            }
            _ => {}
        }
    }
    out
}

fn elapsed_us(
    a: &cudarc::driver::CudaEvent,
    b: &cudarc::driver::CudaEvent,
) -> std::result::Result<f64, CudaError> {
    a.elapsed_ms(b)
        .map(|ms| f64::from(ms) * 1e3)
        .map_err(|e| CudaError::driver("reading a timing event", None, e))
}

fn event(gpu: &Gpu) -> std::result::Result<cudarc::driver::CudaEvent, CudaError> {
    gpu.stream
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| CudaError::driver("recording a timing event", None, e))
}

pub fn run(gpu: &Gpu, program: &Program, bandwidth: f64) -> Result<Vec<SweepRow>> {
    let mut rows = Vec::new();
    gpu.set_programmatic_launch(true);
    for (fused, k, n) in shapes(program) {
        if k == 0 || n == 0 {
            continue;
        }
        let bytes = n * k * 2;
        let copies = ROTATION_BYTES.div_ceil(bytes).clamp(2, 64);
        let mut mats = Vec::with_capacity(copies);
        for c in 0..copies {
            let mut m = DeviceMatrix::Bf16(gpu.zeros::<u16>(n * k, "a sweep matrix")?);
            launch::fill_uniform(gpu, &mut m, c as u64, -0.05, 0.05)?;
            mats.push(m);
        }
        let x = gpu.zeros::<f32>(k, "a sweep input")?;
        let h = gpu.zeros::<f32>(STREAMS * n, "a sweep residual")?;
        let inj = gpu.zeros::<f32>(STREAMS, "a sweep gain")?;
        // One output buffer for every launch (a fresh allocation would be a stream operation
        // between the kernels).
        let out = gpu.zeros::<u8>(STREAMS * n * 4 + 256, "the sweep output")?;
        let out_ptr = {
            use cudarc::driver::DevicePtr as _;
            out.device_ptr(&gpu.stream).0
        };
        gpu.set_scratch_pool(Some((out_ptr, out.len())));
        let chosen = OneToken::for_shape(n, k);
        for v in OneToken::ALL {
            let once = |m: &DeviceMatrix| -> std::result::Result<(), CudaError> {
                gpu.next_node_scratch();
                if fused {
                    linear_hc_write_with(gpu, &h, &inj, &x, m, 1, STREAMS, Some(v)).map(drop)
                } else {
                    linear_one_token(gpu, &x, m, k, n, v).map(drop)
                }
            };
            once(&mats[0])?;
            gpu.sync("a sweep warm-up")?;
            launch::hold_gpu(gpu, 20_000_000)?;
            let start = event(gpu)?;
            for i in 0..LAUNCHES.max(copies) {
                once(&mats[i % copies])?;
            }
            let end = event(gpu)?;
            gpu.sync("a sweep")?;
            let us = elapsed_us(&start, &end)? / LAUNCHES.max(copies) as f64;
            rows.push(SweepRow {
                kernel: if fused { "linear_hc_write" } else { "linear" }.to_string(),
                k,
                n,
                variant: v.name(),
                us_per_launch: us,
                fraction_of_copy_bandwidth: fraction(bytes as u64, us / 1e3, bandwidth),
                chosen: v == chosen,
            });
        }
        gpu.set_scratch_pool(None);
    }
    Ok(rows)
}
