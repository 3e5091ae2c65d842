//! Routed experts over NVFP4 banks, the union of a step's experts by a grid sized to the GPU
//! (`kernels/moe_nvfp4_persistent.cu`): each warp streams a run of the union's tiles, for steps of
//! a few tokens. `ops::moe` and `quant::nvfp4` are the reference.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::moe::combine_slots;
use super::moe_nvfp4::{arg_bank, nvfp4_shapes, DeviceNvfp4};
use super::{grid_for, launched};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;
use crate::registry::cuda::moe::{
    persistent_fits, persistent_shared, PERSISTENT_BLOCKS_PER_SM, PERSISTENT_WARPS,
};

const FILE: &str = "moe_nvfp4_persistent.cu";

/// The routed experts over NVFP4 banks by the union of the step's experts (`dims`: rows, top k,
/// hidden, intermediate): x split once, gate/up and down each a grid of the GPU's
/// multiprocessors times the blocks an SM holds, whose warps walk the union's tiles; then the
/// slot-order combine.
pub fn moe_experts_nvfp4_persistent(
    cx: &Launch,
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceNvfp4,
    down: &DeviceNvfp4,
    dims: [usize; 4],
) -> Result<Buf<f32>, CudaError> {
    let [rows, top_k, hidden, inter] = dims;
    let (split_kernel, gu_kernel, down_kernel) = (
        "moe_experts_union_split_rows",
        "moe_experts_persistent_gate_up_nvfp4",
        "moe_experts_persistent_down_nvfp4",
    );
    let experts = nvfp4_shapes([gu_kernel, down_kernel], x, ids, w, gate_up, down, dims)?;
    let slots = rows * top_k;
    persistent_fits(slots, experts, hidden, inter).map_err(|msg| CudaError::Shape {
        kernel: gu_kernel.to_string(),
        msg,
    })?;
    let (r64, k32, s64, h64, i64_, e64) = (
        rows as i64,
        top_k as i32,
        slots as i64,
        hidden as i64,
        inter as i64,
        experts as i64,
    );
    let walk = |shared: usize| LaunchConfig {
        grid_dim: ((cx.multiprocessors * PERSISTENT_BLOCKS_PER_SM) as u32, 1, 1),
        block_dim: ((32 * PERSISTENT_WARPS) as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let shared = persistent_shared(slots, experts);

    let mut x_split = cx.scratch::<u32>(rows * 2 * hidden / 2, "split expert inputs")?;
    let f = cx.function(FILE, split_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *x_split).arg(x).arg(&r64).arg(&h64);
    // SAFETY: x holds rows*hidden floats (checked), hidden a multiple of 16; x_split holds rows x
    // 2 x hidden bf16, every word written.
    launched(split_kernel, unsafe {
        b.launch(grid_for(rows * hidden / 8, 256))
    })?;

    let mut act = cx.scratch::<u32>(slots * inter, "split expert activations")?;
    let f = cx.function(FILE, gu_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act).arg(&*x_split).arg(ids);
    arg_bank(&mut b, gate_up);
    b.arg(&k32).arg(&s64).arg(&h64).arg(&i64_).arg(&e64);
    // SAFETY: the banks hold [experts, 2*inter, hidden] and [experts, hidden, inter] packed
    // (checked, hidden and inter multiples of 16); ids outside [0, experts) are in no pass and
    // not dereferenced; the union's lists fit the shared memory given (checked); act holds slots
    // x 2 x inter bf16, each valid slot's written by the units of its expert's passes.
    launched(gu_kernel, unsafe { b.launch(walk(shared)) })?;

    let mut out = cx.scratch::<f32>(slots * hidden, "expert outputs per slot")?;
    let f = cx.function(FILE, down_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out).arg(&*act).arg(ids);
    arg_bank(&mut b, down);
    b.arg(&s64).arg(&h64).arg(&i64_).arg(&e64);
    // SAFETY: as above; act's rows of valid slots were written by the previous launch; out holds
    // slots*hidden floats, the rows of valid slots written (the combine reads no other).
    launched(down_kernel, unsafe { b.launch(walk(shared)) })?;

    combine_slots(cx, &out, ids, w, [rows, top_k, hidden, experts])
}
