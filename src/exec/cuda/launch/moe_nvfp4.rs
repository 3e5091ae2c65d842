//! Routed experts over NVFP4 banks kept packed on the device (`kernels/moe_nvfp4.cu`):
//! token-major for a few tokens, expert-major on the tensor cores for many. The grouping and the
//! slot-order combine of the expert-major form are `moe`'s. `quant::nvfp4` and `ops::moe` are
//! the reference.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::moe::{combine_slots, group_slots, EM_MMA_OUTPUTS, EM_MMA_THREADS, SHARED_LIMIT};
use super::{launched, shape};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::{Buf, Gpu};
use crate::exec::cuda::error::CudaError;
use crate::exec::cuda::launcher::KernelLaunch;
use crate::quant::nvfp4::GROUP;
use crate::registry::cuda::moe::{
    nvfp4_down_lanes, nvfp4_down_shared, NVFP4_DOWN_ROWS, NVFP4_WARPS,
};
use crate::weights::Nvfp4Bank;

/// An NVFP4 bank on the device, as stored (`weights::Nvfp4Bank`): `[experts, out, in]`.
pub struct DeviceNvfp4 {
    pub codes: CudaSlice<u8>,
    pub scales: CudaSlice<u8>,
    pub globals: CudaSlice<f32>,
    /// Rows per global scale, as the kernels take it (`long`).
    pub rows_per_global: i64,
    pub shape: [usize; 3],
}

/// The bank's four kernel arguments, in the order every NVFP4 kernel takes them: codes, scales,
/// globals, rows per global.
pub(super) fn arg_bank<'a>(b: &mut KernelLaunch<'a>, bank: &'a DeviceNvfp4) {
    b.arg(&bank.codes)
        .arg(&bank.scales)
        .arg(&bank.globals)
        .arg(&bank.rows_per_global);
}

impl DeviceNvfp4 {
    /// Copies `bank` (weight `name`) to the device.
    pub fn upload(gpu: &Gpu, bank: &Nvfp4Bank, name: &str) -> Result<DeviceNvfp4, CudaError> {
        let [e, out, inputs] = bank.shape[..] else {
            return Err(CudaError::Driver {
                doing: format!("uploading NVFP4 bank `{name}`"),
                msg: format!("shape {:?} is not [experts, out, in]", bank.shape),
            });
        };
        Ok(DeviceNvfp4 {
            codes: gpu.upload(&bank.codes, name)?,
            scales: gpu.upload(&bank.scales, name)?,
            globals: gpu.upload(&bank.globals, name)?,
            rows_per_global: bank.rows_per_global as i64,
            shape: [e, out, inputs],
        })
    }

    /// A random bank of `shape` (benchmarks): codes uniform over all 16 values, scales over
    /// E4M3 0.5-0.9375, each row's global set so that the weights' variance is 1/in (as the
    /// float benchmark weights'); one global per `rows_per_global` rows.
    pub fn random(
        cx: &Launch,
        shape: [usize; 3],
        rows_per_global: usize,
        seed: u64,
        name: &str,
    ) -> Result<DeviceNvfp4, CudaError> {
        let [e, out, inputs] = shape;
        let rows = e * out;
        let mut codes = cx.zeros::<u8>(rows * inputs / 2, name)?;
        let mut scales = cx.zeros::<u8>(rows * inputs / GROUP, name)?;
        super::fill_bytes(cx, &mut codes, seed, 0, 255)?;
        super::fill_bytes(cx, &mut scales, seed ^ 0x5CA1E, 0x30, 0x37)?;
        // E[e2m1²] = 8.5625 over the 16 codes; E[scale²] ≈ 0.5 over 0x30..0x37.
        let global = 1.0 / (8.5625f32 * 0.5 * inputs as f32).sqrt();
        let globals = vec![global; rows / rows_per_global.max(1)];
        Ok(DeviceNvfp4 {
            codes,
            scales,
            globals: cx.upload(&globals, name)?,
            rows_per_global: rows_per_global as i64,
            shape,
        })
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len() + 4 * self.globals.len()
    }

    /// Whether the buffers hold the bank of its shape.
    fn holds(&self) -> bool {
        let [e, out, inputs] = self.shape;
        let rows = e * out;
        inputs.is_multiple_of(GROUP)
            && self.codes.len() == rows * inputs / 2
            && self.scales.len() == rows * inputs / GROUP
            && self.rows_per_global > 0
            && self.globals.len() * self.rows_per_global as usize == rows
    }
}

/// The checks both forms share (errors name `kernels[0]` for the inputs and gate/up,
/// `kernels[1]` for down); `dims`: rows, top k, hidden, intermediate. Returns the experts.
pub(super) fn nvfp4_shapes(
    kernels: [&str; 2],
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceNvfp4,
    down: &DeviceNvfp4,
    dims: [usize; 4],
) -> Result<usize, CudaError> {
    let [rows, top_k, hidden, inter] = dims;
    shape(
        kernels[0],
        rows > 0
            && top_k > 0
            && x.len() == rows * hidden
            && ids.len() == rows * top_k
            && w.len() == rows * top_k,
        || {
            format!(
                "x {} values for {rows}x{hidden}, ids {} and weights {} for {rows}x{top_k}",
                x.len(),
                ids.len(),
                w.len()
            )
        },
    )?;
    let experts = gate_up.shape[0];
    shape(
        kernels[0],
        gate_up.holds()
            && gate_up.shape[1..] == [2 * inter, hidden]
            && hidden.is_multiple_of(GROUP),
        || {
            format!(
                "gate_up bank {:?} (codes {}, scales {}, {} globals) for [experts, 2x{inter}, {hidden}]",
                gate_up.shape,
                gate_up.codes.len(),
                gate_up.scales.len(),
                gate_up.globals.len()
            )
        },
    )?;
    shape(
        kernels[1],
        down.holds() && down.shape == [experts, hidden, inter] && inter.is_multiple_of(GROUP),
        || {
            format!(
                "down bank {:?} (codes {}, scales {}, {} globals) for [{experts}, {hidden}, {inter}]",
                down.shape,
                down.codes.len(),
                down.scales.len(),
                down.globals.len()
            )
        },
    )?;
    Ok(experts)
}

/// The token-major routed experts over NVFP4 banks (`dims`: rows, top k, hidden, intermediate):
/// `moe_experts_gate_up_nvfp4` (a warp per slot and channel, the token's x staged), then
/// `moe_experts_down_nvfp4` (a warp per output row of a token, its act rows staged; the
/// reference's slot-order sum).
pub fn moe_experts_nvfp4_token_major(
    cx: &Launch,
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceNvfp4,
    down: &DeviceNvfp4,
    dims: [usize; 4],
) -> Result<Buf<f32>, CudaError> {
    let [rows, top_k, hidden, inter] = dims;
    let (gu_kernel, down_kernel) = ("moe_experts_gate_up_nvfp4", "moe_experts_down_nvfp4");
    let experts = nvfp4_shapes([gu_kernel, down_kernel], x, ids, w, gate_up, down, dims)?;
    let x_shared = hidden * 4;
    let down_shared = nvfp4_down_shared(top_k, inter);
    shape(gu_kernel, x_shared <= SHARED_LIMIT, || {
        format!("hidden {hidden}: a token's x row ({x_shared} bytes) must fit shared memory")
    })?;
    shape(down_kernel, down_shared <= SHARED_LIMIT, || {
        format!(
            "top {top_k} x intermediate {inter}: a token's act rows ({down_shared} bytes) must fit shared memory"
        )
    })?;
    let slots = rows * top_k;
    let (k32, h64, i64_, e64) = (top_k as i32, hidden as i64, inter as i64, experts as i64);
    let threads = (NVFP4_WARPS * 32) as u32;

    let mut act = cx.scratch::<f32>(slots * inter, "expert activations")?;
    let f = cx.function("moe_nvfp4.cu", gu_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act).arg(x).arg(ids);
    arg_bank(&mut b, gate_up);
    b.arg(&k32).arg(&h64).arg(&i64_).arg(&e64);
    let cfg = LaunchConfig {
        grid_dim: (inter.div_ceil(NVFP4_WARPS) as u32, slots as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: x_shared as u32,
    };
    // SAFETY: the banks hold [experts, 2*inter, hidden] and [experts, hidden, inter] packed
    // (checked above, hidden and inter multiples of 16: 8-byte aligned code groups); ids outside
    // [0, experts) are not dereferenced; act holds slots*inter floats; x's row fits the shared
    // memory given.
    launched(gu_kernel, unsafe { b.launch(cfg) })?;

    let mut y = cx.output::<f32>(rows * hidden, down_kernel)?;
    let f = cx.function("moe_nvfp4.cu", down_kernel)?;
    let lanes = nvfp4_down_lanes(inter) as i32;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(&*act).arg(ids).arg(w);
    arg_bank(&mut b, down);
    b.arg(&k32).arg(&h64).arg(&i64_).arg(&e64).arg(&lanes);
    let cfg = LaunchConfig {
        grid_dim: (hidden.div_ceil(NVFP4_DOWN_ROWS) as u32, rows as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: down_shared as u32,
    };
    // SAFETY: as above; the act rows of every slot were written by the previous launch; y holds
    // rows*hidden floats; the staged rows, ids and weights fit the shared memory given.
    launched(down_kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// The expert-major routed experts over NVFP4 banks, on the tensor cores (`dims`: rows, top k,
/// hidden, intermediate): the slots grouped by expert, each expert's packed rows read once per
/// tile of 64 of its slots and widened to bf16 as they are staged, then the slot-order combine.
pub fn moe_experts_nvfp4_expert_major(
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
        "moe_experts_expert_major_gate_up_mma_nvfp4",
        "moe_experts_expert_major_down_mma_nvfp4",
    );
    let experts = nvfp4_shapes([gu_kernel, down_kernel], x, ids, w, gate_up, down, dims)?;
    shape(
        gu_kernel,
        (2 * inter).div_ceil(EM_MMA_OUTPUTS) <= 65_535 && hidden.div_ceil(EM_MMA_OUTPUTS) <= 65_535,
        || format!("{inter} or {hidden} outputs: too many tiles of {EM_MMA_OUTPUTS}"),
    )?;
    let slots = rows * top_k;
    let groups = group_slots(cx, ids, slots, experts)?;
    let (k32, h64, i64_) = (top_k as i32, hidden as i64, inter as i64);
    let grid = |outputs: usize| LaunchConfig {
        grid_dim: (
            groups.max_tiles as u32,
            outputs.div_ceil(EM_MMA_OUTPUTS) as u32,
            1,
        ),
        block_dim: (EM_MMA_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };

    let mut act = cx.scratch::<f32>(slots * inter, "expert activations")?;
    let f = cx.function("moe_nvfp4.cu", gu_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act)
        .arg(x)
        .arg(&*groups.order)
        .arg(&*groups.tiles);
    arg_bank(&mut b, gate_up);
    b.arg(&k32).arg(&h64).arg(&i64_);
    // SAFETY: the tile table (written by the grouping launch on this stream) names valid experts
    // and rows of `order`, which holds slot indices below `slots`; the banks' shapes were checked
    // (hidden and inter multiples of 16: every 8-value chunk of codes is 4-byte aligned); act
    // holds slots*inter floats (the rows of valid slots are written).
    launched(gu_kernel, unsafe { b.launch(grid(2 * inter)) })?;

    let mut out = cx.scratch::<f32>(slots * hidden, "expert outputs per slot")?;
    let f = cx.function("moe_nvfp4.cu", down_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out)
        .arg(&*act)
        .arg(&*groups.order)
        .arg(&*groups.tiles);
    arg_bank(&mut b, down);
    b.arg(&h64).arg(&i64_);
    // SAFETY: as above; out holds slots*hidden floats.
    launched(down_kernel, unsafe { b.launch(grid(hidden)) })?;

    combine_slots(cx, &out, ids, w, [rows, top_k, hidden, experts])
}
