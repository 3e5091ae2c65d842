//! Routed experts over NVFP4 banks, the union of a step's experts on the tensor cores
//! (`kernels/moe_nvfp4_union.cu`): each selected expert's packed rows read once for all the
//! slots that chose it, for one token or a few. `ops::moe` and `quant::nvfp4` are the reference.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::launched;
use super::moe::combine_slots;
use super::moe_nvfp4::{arg_bank, nvfp4_shapes, DeviceNvfp4};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;
use crate::registry::cuda::moe::{
    union_fits, union_shared, union_warps, UNION_GATE_TILES, UNION_ROWS,
};

const FILE: &str = "moe_nvfp4_union.cu";

/// The routed experts over NVFP4 banks by the union of the step's experts (`dims`: rows, top k,
/// hidden, intermediate): gate/up a block per `UNION_GATE_TILES` x 8 channels of a leading slot's
/// expert (x split as it is staged), down a block per 16 output rows, then the slot-order
/// combine.
pub fn moe_experts_nvfp4_union(
    cx: &Launch,
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceNvfp4,
    down: &DeviceNvfp4,
    dims: [usize; 4],
) -> Result<Buf<f32>, CudaError> {
    let [rows, top_k, hidden, inter] = dims;
    let (gu_kernel, down_kernel) = (
        "moe_experts_union_gate_up_nvfp4",
        "moe_experts_union_down_nvfp4",
    );
    let experts = nvfp4_shapes([gu_kernel, down_kernel], x, ids, w, gate_up, down, dims)?;
    let slots = rows * top_k;
    let (gu_shared, down_shared) = union_shared(rows, top_k, hidden, inter);
    union_fits(rows, top_k, hidden, inter).map_err(|msg| CudaError::Shape {
        kernel: gu_kernel.to_string(),
        msg,
    })?;
    let (k32, s64, h64, i64_, e64) = (
        top_k as i32,
        slots as i64,
        hidden as i64,
        inter as i64,
        experts as i64,
    );
    let tiles = UNION_GATE_TILES as i32;

    let mut act = cx.scratch::<u32>(slots * inter, "split expert activations")?;
    let f = cx.function(FILE, gu_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act).arg(x).arg(ids);
    arg_bank(&mut b, gate_up);
    b.arg(&k32)
        .arg(&s64)
        .arg(&h64)
        .arg(&i64_)
        .arg(&e64)
        .arg(&tiles);
    let cfg = LaunchConfig {
        grid_dim: (
            inter.div_ceil(UNION_ROWS / 2 * UNION_GATE_TILES) as u32,
            slots as u32,
            1,
        ),
        block_dim: (32 * union_warps(hidden) as u32, 1, 1),
        shared_mem_bytes: gu_shared as u32,
    };
    // SAFETY: the banks hold [experts, 2*inter, hidden] and [experts, hidden, inter] packed
    // (checked, hidden and inter multiples of 16: 8-byte aligned code groups, 16-byte where the
    // kernel reads 16); ids outside [0, experts) lead no block and are not dereferenced; x holds
    // rows*hidden floats; the staged rows (at most min(4, rows) a pass) fit the shared memory
    // given; act holds slots x 2 x inter bf16, each valid slot's written by its expert's leading
    // blocks.
    launched(gu_kernel, unsafe { b.launch(cfg) })?;

    let mut out = cx.scratch::<f32>(slots * hidden, "expert outputs per slot")?;
    let f = cx.function(FILE, down_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out).arg(&*act).arg(ids);
    arg_bank(&mut b, down);
    b.arg(&s64).arg(&h64).arg(&i64_).arg(&e64);
    let cfg = LaunchConfig {
        grid_dim: (hidden.div_ceil(UNION_ROWS) as u32, slots as u32, 1),
        block_dim: (32 * union_warps(inter) as u32, 1, 1),
        shared_mem_bytes: down_shared as u32,
    };
    // SAFETY: as above (at most 4 act rows staged a pass); act's rows of valid slots were written by the previous launch; out holds
    // slots*hidden floats, the rows of valid slots written (the combine reads no other).
    launched(down_kernel, unsafe { b.launch(cfg) })?;

    combine_slots(cx, &out, ids, w, [rows, top_k, hidden, experts])
}
