//! Mixture of experts on the device (`kernels/moe.cu`): the router (softmax, top k) and the routed
//! SwiGLU experts, token-major (few tokens) or expert-major (many), whose expert ids stay on the
//! device; and PLE's hashed n-gram ids, whose history is a device buffer updated in place.
//! `src/ops/moe.rs` and `src/ops/ple.rs` are the reference.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::arg_matrix;
use super::embed::NgramHash;
use super::{grid_for, launched, shape, DeviceMatrix};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;

pub use crate::registry::cuda::moe::ROUTER_MAX_TOPK;
use crate::registry::cuda::moe::{
    down_rows_fits, down_rows_shared, DOWN_ROWS, ROUTER_PER_LANE, ROUTER_THREADS,
};
/// Dynamic shared memory a kernel may use without opting in.
pub(super) const SHARED_LIMIT: usize = 48 * 1024;
/// Warps per block of the expert kernels (small blocks: even work over the SMs).
const EXPERT_WARPS: usize = 4;
/// Slot passes a warp of the down kernel runs at once (`DOWN_PASSES` in kernels/moe.cu).
const DOWN_PASSES: usize = 2;
/// 16-byte chunks per slot a lane loads at once in the down kernel (`DOWN_BATCH`).
const DOWN_BATCH: usize = 10;

/// Which router kernel serves a row of experts (both give the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterKernel {
    /// `moe_router_narrow_f32`: an expert a thread, up to `ROUTER_THREADS` (1024) experts; a
    /// quarter of the wide kernel's code (docs/decisions/0011-code-size-in-once-a-layer-kernels.md).
    Narrow,
    /// `moe_router_reference_f32`: up to `ROUTER_PER_LANE` experts a thread (4096).
    Wide,
}

impl RouterKernel {
    /// The kernel a rule names (`narrow`, `reference`).
    pub fn from_variant(name: &str) -> Option<RouterKernel> {
        match name {
            "narrow" => Some(RouterKernel::Narrow),
            "reference" => Some(RouterKernel::Wide),
            _ => None,
        }
    }

    /// The most experts a row may have: a block of `ROUTER_THREADS` holding the kernel's PER
    /// experts a thread (1 narrow, `ROUTER_PER_LANE` wide).
    pub fn max_experts(self) -> usize {
        ROUTER_THREADS
            * match self {
                RouterKernel::Narrow => 1,
                RouterKernel::Wide => ROUTER_PER_LANE,
            }
    }

    pub fn name(self) -> &'static str {
        match self {
            RouterKernel::Narrow => "moe_router_narrow_f32",
            RouterKernel::Wide => "moe_router_reference_f32",
        }
    }
}

/// [`moe_router`] by the kernel `form` (the tests run both; the narrow one refuses more than
/// `ROUTER_THREADS` experts).
pub fn moe_router(
    cx: &Launch,
    logits: &CudaSlice<f32>,
    rows: usize,
    experts: usize,
    top_k: usize,
    normalize: bool,
    form: RouterKernel,
) -> Result<(Buf<i64>, Buf<f32>), CudaError> {
    let kernel = form.name();
    shape(
        kernel,
        rows > 0 && experts > 0 && logits.len() == rows * experts,
        || {
            format!(
                "logits of {} values for {rows} rows of {experts}",
                logits.len()
            )
        },
    )?;
    shape(kernel, experts <= form.max_experts(), || {
        format!(
            "{experts} experts, more than the {} a block holds",
            form.max_experts()
        )
    })?;
    shape(
        kernel,
        top_k > 0 && top_k <= experts && top_k <= ROUTER_MAX_TOPK,
        || format!("top {top_k} of {experts} experts (at most {ROUTER_MAX_TOPK})"),
    )?;
    let f = cx.function("moe.cu", kernel)?;
    let mut ids = cx.output::<i64>(rows * top_k, "router ids")?;
    let mut weights = cx.output::<f32>(rows * top_k, "router weights")?;
    let (r64, e32, k32, n32) = (rows as i64, experts as i32, top_k as i32, normalize as i32);
    let cfg = LaunchConfig {
        grid_dim: (rows.min(65_535 * 8) as u32, 1, 1),
        block_dim: (
            experts.next_multiple_of(32).min(ROUTER_THREADS) as u32,
            1,
            1,
        ),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *ids)
        .arg(&mut *weights)
        .arg(logits)
        .arg(&r64)
        .arg(&e32)
        .arg(&k32)
        .arg(&n32);
    // SAFETY: logits holds rows*experts floats, ids and weights rows*top_k values each;
    // top_k <= ROUTER_MAX_TOPK and the block's warps <= 32 (the kernel's static lists); the
    // block is a multiple of 32 threads, at most ROUTER_THREADS (its launch bounds), holding
    // every expert at the kernel's PER a thread at most (form.max_experts, checked above).
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok((ids, weights))
}

/// Lanes per slot in the down kernel: the fewest (a power of 2) that leave each lane at most
/// `DOWN_BATCH` 16-byte chunks of a row (or elements, when the row does not split into chunks),
/// so that several slots' rows are read at once.
fn down_lanes(intermediate: usize, chunk: usize) -> u32 {
    let n = if intermediate.is_multiple_of(chunk) {
        intermediate / chunk
    } else {
        intermediate
    };
    let mut lanes = 1;
    while lanes < 32 && n.div_ceil(lanes) > DOWN_BATCH {
        lanes *= 2;
    }
    lanes as u32
}

/// The shape checks of both expert variants (errors name `kernels[0]` for the inputs and
/// gate/up, `kernels[1]` for down); returns the number of experts.
#[allow(clippy::too_many_arguments)]
fn expert_shapes(
    kernels: [&str; 2],
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    rows: usize,
    top_k: usize,
    hidden: usize,
    intermediate: usize,
) -> Result<usize, CudaError> {
    let [gu_kernel, down_kernel] = kernels;
    let per_expert = 2 * intermediate * hidden;
    shape(
        gu_kernel,
        rows > 0
            && top_k > 0
            && hidden > 0
            && intermediate > 0
            && x.len() == rows * hidden
            && ids.len() == rows * top_k
            && w.len() == rows * top_k,
        || {
            format!(
                "x {} values for {rows}x{hidden}, ids {} and weights {} for {rows}x{top_k}, \
                 intermediate {intermediate}",
                x.len(),
                ids.len(),
                w.len()
            )
        },
    )?;
    shape(
        gu_kernel,
        !gate_up.is_empty() && gate_up.len().is_multiple_of(per_expert),
        || {
            format!(
                "gate_up of {} values is not experts of [2x{intermediate}, {hidden}]",
                gate_up.len()
            )
        },
    )?;
    let experts = gate_up.len() / per_expert;
    shape(
        down_kernel,
        down.len() == experts * hidden * intermediate,
        || {
            format!(
                "down of {} values for {experts} experts of [{hidden}, {intermediate}]",
                down.len()
            )
        },
    )?;
    Ok(experts)
}

/// The token-major routed experts (`Op::MoeExperts`; `dims`: rows, top k, hidden, intermediate): gate/up a warp per (slot, row), then the down half by the kernel
/// chosen: `by_rows`, `moe_experts_down_rows_*` (`DOWN_ROWS` output rows a block, the token's
/// act rows staged once; an error where the shape does not allow it), else
/// `moe_experts_down_*` (a block per output row). Both give the same bits.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_with_down(
    cx: &Launch,
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    dims: [usize; 4],
    by_rows: bool,
) -> Result<Buf<f32>, CudaError> {
    let [rows, top_k, hidden, intermediate] = dims;
    let (gu_name, down_name) = (
        gate_up.kernel("moe_experts_gate_up"),
        down.kernel("moe_experts_down"),
    );
    let (gu_kernel, down_kernel) = (gu_name.as_str(), down_name.as_str());
    let experts = expert_shapes(
        [gu_kernel, down_kernel],
        x,
        ids,
        w,
        gate_up,
        down,
        rows,
        top_k,
        hidden,
        intermediate,
    )?;
    shape(down_kernel, top_k <= 4096, || {
        format!("top {top_k}: the down kernel keeps at most 4096 slot products a row")
    })?;
    if by_rows {
        shape(
            &down.kernel("moe_experts_down_rows"),
            down_rows_fits(top_k, hidden, intermediate),
            || {
                format!(
                    "{DOWN_ROWS} rows a block: hidden {hidden} must split into them and top \
                     {top_k} x intermediate {intermediate} act rows fit its shared memory"
                )
            },
        )?;
    }
    let slots = rows * top_k;
    let (s64, k32, h64, int64, e64) = (
        slots as i64,
        top_k as i32,
        hidden as i64,
        intermediate as i64,
        experts as i64,
    );
    let f = cx.function("moe.cu", gu_kernel)?;
    let mut act = cx.scratch::<f32>(slots * intermediate, "expert activations")?;
    let cfg = LaunchConfig {
        grid_dim: (
            (slots * intermediate)
                .div_ceil(EXPERT_WARPS)
                .min(65_535 * 8) as u32,
            1,
            1,
        ),
        block_dim: ((EXPERT_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // The kernel runs ahead of the node before it when x, the ids and their weights (the node's
    // inputs 0-2) are ready.
    let ready = cx.take_ready_inputs().all(&[0, 1, 2]) as i32;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act).arg(x).arg(ids);
    arg_matrix(&mut b, gate_up);
    b.arg(&s64)
        .arg(&k32)
        .arg(&h64)
        .arg(&int64)
        .arg(&e64)
        .arg(&ready);
    // SAFETY: the shapes were checked above; ids outside [0, experts) are not dereferenced; act
    // holds slots*intermediate floats; 16-byte loads are used only where the row length and the
    // addresses allow.
    launched(gu_kernel, unsafe { b.launch(cfg) })?;

    launch_down(
        cx,
        by_rows,
        &act,
        ids,
        w,
        down,
        [rows, top_k, hidden, intermediate],
    )
}

/// Threads of the down kernel's decode form.
const DOWN_ROWS_THREADS: u32 = 256;

/// The down half of [`moe_experts`] (`dims`: rows, top k, hidden, intermediate): with `by_rows`,
/// `moe_experts_down_rows_*` (`DOWN_ROWS` rows a block, which the caller has checked the shape
/// allows: [`down_rows_fits`]), else `moe_experts_down_*` (a block per output row); both give
/// the same bits.
fn launch_down(
    cx: &Launch,
    by_rows: bool,
    act: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    down: &DeviceMatrix,
    dims: [usize; 4],
) -> Result<Buf<f32>, CudaError> {
    let [rows, top_k, hidden, intermediate] = dims;
    let name = down.kernel(if by_rows {
        "moe_experts_down_rows"
    } else {
        "moe_experts_down"
    });
    let kernel = name.as_str();
    let experts = down.len() / (hidden * intermediate);
    let (t64, k32, h64, int64, e64) = (
        rows as i64,
        top_k as i32,
        hidden as i64,
        intermediate as i64,
        experts as i64,
    );
    let f = cx.function("moe.cu", kernel)?;
    let mut y = cx.output::<f32>(rows * hidden, kernel)?;
    let chunk = down.chunk_len();
    let lanes = down_lanes(intermediate, chunk) as i32;
    let cfg = if by_rows {
        LaunchConfig {
            grid_dim: ((rows * hidden / DOWN_ROWS) as u32, 1, 1),
            block_dim: (DOWN_ROWS_THREADS, 1, 1),
            shared_mem_bytes: down_rows_shared(top_k, intermediate) as u32,
        }
    } else {
        // A block per output row, a warp per round of slots (`experts_down` in kernels/moe.cu).
        let per_round = (32 / lanes as usize) * DOWN_PASSES;
        let warps = top_k.div_ceil(per_round).clamp(1, 8);
        LaunchConfig {
            grid_dim: ((rows * hidden).clamp(1, 65_535 * 8) as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            // top_k floats (the launcher rounds dynamic shared memory up to 16-byte words).
            shared_mem_bytes: (top_k * 4) as u32,
        }
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(act).arg(ids).arg(w);
    arg_matrix(&mut b, down);
    if by_rows {
        b.arg(&k32).arg(&h64).arg(&int64).arg(&e64).arg(&lanes);
    } else {
        b.arg(&t64)
            .arg(&k32)
            .arg(&h64)
            .arg(&int64)
            .arg(&e64)
            .arg(&lanes);
    }
    // SAFETY: as in moe_experts (the shapes checked there); act was written by the previous
    // launch on the same stream, y holds rows*hidden floats, lanes is a power of 2 up to 32 (the
    // kernels' lane groups); the rows form's grid covers whole blocks of DOWN_ROWS rows and its
    // shared memory the token's act rows, ids, weights and products (`down_rows_fits`).
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// Slots per tile of the expert-major kernels (`EM_TILE`): each expert's weights are read once
/// per tile of its slots.
const EM_TILE: usize = 64;
/// Outputs and threads of a block of the tensor-core expert-major kernels (`EM_MMA_BN`, 2 x 4
/// warps in kernels/moe.cu).
pub(super) const EM_MMA_OUTPUTS: usize = 128;
pub(super) const EM_MMA_THREADS: u32 = 256;
/// Threads of the expert-major grouping kernel (one block).
const EM_GROUP_THREADS: u32 = 1024;

/// The routed experts, expert-major (`ops::moe::expert_major`), for many tokens: the slots are
/// grouped by expert on the device, then each expert's rows are read once per tile of 64 of its
/// slots (64 slots x 64 outputs: on the tensor cores where [`expert_major_on_tensor_cores`],
/// else shared-memory SIMT tiles), instead of once per slot. The same
/// arguments and result as [`moe_experts`] (ids outside `[0, E)`: that token's row is NaN); the
/// same products and the reference's slot-order sum, so the result equals the token-major one
/// within f32 rounding (each slot's dot products are summed in a different order).
///
/// Four launches: grouping (one block), gate/up tiles, down tiles (into one row per slot), the
/// slot-order sum. Scratch: `rows·top_k·(intermediate + hidden)` floats (the SwiGLU
/// activations and the down products of every slot), plus the grouping's `rows·top_k + 3·(⌈rows·top_k/64⌉ + E)` ints. The grids depend only on
/// the shapes (a tile table sized for the worst case; blocks past the last tile return at once).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_expert_major(
    cx: &Launch,
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    rows: usize,
    top_k: usize,
    hidden: usize,
    intermediate: usize,
    tensor_cores: bool,
) -> Result<Buf<f32>, CudaError> {
    let (gu_name, down_name) = (
        gate_up.kernel("moe_experts_expert_major_gate_up"),
        down.kernel("moe_experts_expert_major_down"),
    );
    let (gu_kernel, down_kernel) = (gu_name.as_str(), down_name.as_str());
    let experts = expert_shapes(
        [gu_kernel, down_kernel],
        x,
        ids,
        w,
        gate_up,
        down,
        rows,
        top_k,
        hidden,
        intermediate,
    )?;
    let slots = rows * top_k;
    shape(
        gu_kernel,
        intermediate.div_ceil(EM_TILE) <= 65_535 && hidden.div_ceil(EM_TILE) <= 65_535,
        || format!("{intermediate} or {hidden} outputs: too many tiles of {EM_TILE}"),
    )?;
    let groups = group_slots(cx, ids, slots, experts)?;
    let max_tiles = groups.max_tiles;
    let mut out = cx.scratch::<f32>(slots * hidden, "expert outputs per slot")?;
    if tensor_cores {
        shape(
            "moe_experts_expert_major_gate_up_mma_bf16",
            expert_major_on_tensor_cores(cx, x, gate_up, down, hidden, intermediate),
            || {
                format!("hidden {hidden}, intermediate {intermediate}: the tensor-core tiles take bf16 experts, sizes multiples of 8 and 16-byte aligned rows")
            },
        )?;
    }
    let kernels = if tensor_cores {
        ExpertMajorKernels {
            gate_up: "moe_experts_expert_major_gate_up_mma_bf16",
            down: "moe_experts_expert_major_down_mma_bf16",
            channels: EM_MMA_OUTPUTS / 2,
            outputs: EM_MMA_OUTPUTS,
            threads: EM_MMA_THREADS,
        }
    } else {
        ExpertMajorKernels {
            gate_up: gu_kernel,
            down: down_kernel,
            channels: EM_TILE,
            outputs: EM_TILE,
            threads: 256,
        }
    };
    expert_major_products(
        cx,
        &mut out,
        x,
        &groups.order,
        &groups.tiles,
        gate_up,
        down,
        [max_tiles, slots, top_k, hidden, intermediate],
        kernels,
    )?;

    combine_slots(cx, &out, ids, w, [rows, top_k, hidden, experts])
}

/// The slots of an expert-major launch grouped by expert (`moe_experts_expert_major_group`).
pub(super) struct SlotGroups {
    /// The valid slots, by expert.
    pub order: Buf<i32>,
    /// Per tile (expert, first index in `order`, slots), -1 past the last.
    pub tiles: Buf<i32>,
    /// Tiles the table holds: the most the grouping can make, ceil(slots / 64) + experts (the
    /// grids are sized for it; blocks past the last tile return at once).
    pub max_tiles: usize,
}

/// Groups the `slots` of `ids` by expert on the device (one block).
pub(super) fn group_slots(
    cx: &Launch,
    ids: &CudaSlice<i64>,
    slots: usize,
    experts: usize,
) -> Result<SlotGroups, CudaError> {
    let group_kernel = "moe_experts_expert_major_group";
    let max_tiles = slots.div_ceil(EM_TILE) + experts;
    let group_shared = 3 * experts * std::mem::size_of::<i32>();
    shape(
        group_kernel,
        group_shared <= SHARED_LIMIT - 1024 && slots <= i32::MAX as usize,
        || format!("{experts} experts ({group_shared} bytes of shared memory), {slots} slots"),
    )?;
    let (s64, e32, mt64) = (slots as i64, experts as i32, max_tiles as i64);
    let mut order = cx.scratch::<i32>(slots, "expert-major slot order")?;
    let mut tiles = cx.scratch::<i32>(3 * max_tiles, "expert-major tiles")?;
    let f = cx.function("moe.cu", group_kernel)?;
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (EM_GROUP_THREADS, 1, 1),
        shared_mem_bytes: group_shared as u32,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *order)
        .arg(&mut *tiles)
        .arg(ids)
        .arg(&s64)
        .arg(&e32)
        .arg(&mt64);
    // SAFETY: one block; ids holds `slots` values (those outside [0, experts) are skipped);
    // order holds `slots` ints and tiles 3*max_tiles, max_tiles >= ceil(slots/64) + experts
    // (every tile the grouping makes, and the rest are marked -1); the dynamic shared memory
    // holds 3*experts ints.
    launched(group_kernel, unsafe { b.launch(cfg) })?;
    Ok(SlotGroups {
        order,
        tiles,
        max_tiles,
    })
}

/// y [rows, hidden] = Σ_j w[t, j] · out[t·top_k + j] in slot order
/// (`moe_experts_expert_major_combine_f32`); `dims`: rows, top k, hidden, experts.
pub(super) fn combine_slots(
    cx: &Launch,
    out: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    dims: [usize; 4],
) -> Result<Buf<f32>, CudaError> {
    let [rows, top_k, hidden, experts] = dims;
    let combine_kernel = "moe_experts_expert_major_combine_f32";
    let (t64, k32, h64, e64) = (rows as i64, top_k as i32, hidden as i64, experts as i64);
    let f = cx.function("moe.cu", combine_kernel)?;
    let mut y = cx.output::<f32>(rows * hidden, combine_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(out)
        .arg(ids)
        .arg(w)
        .arg(&t64)
        .arg(&k32)
        .arg(&h64)
        .arg(&e64);
    // SAFETY: y holds rows*hidden floats; out's rows are read only for slots with valid ids,
    // whose rows the previous launch wrote.
    launched(combine_kernel, unsafe {
        b.launch(grid_for(rows * hidden, 256))
    })?;
    Ok(y)
}

/// Whether the expert-major products run on the tensor cores (`..._mma_bf16` in
/// kernels/moe.cu): bf16 weights, hidden and intermediate sizes multiples of 8, 16-byte aligned
/// rows. Otherwise the SIMT tiles serve (f32 weights, odd sizes).
pub fn expert_major_on_tensor_cores(
    cx: &Launch,
    x: &CudaSlice<f32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    hidden: usize,
    intermediate: usize,
) -> bool {
    use cudarc::driver::DevicePtr as _;
    let (DeviceMatrix::Bf16(g), DeviceMatrix::Bf16(d)) = (gate_up, down) else {
        return false;
    };
    // Rows of a multiple of 8 values keep every row (of x, of an expert's matrices, of the
    // kernels' scratch) 16-byte aligned when the buffers start so.
    let aligned = [
        x.device_ptr(&cx.stream).0,
        g.device_ptr(&cx.stream).0,
        d.device_ptr(&cx.stream).0,
    ]
    .iter()
    .all(|p| p % 16 == 0);
    aligned && hidden.is_multiple_of(8) && intermediate.is_multiple_of(8)
}

/// The kernels of the expert-major products and their tiles: SIMT tiles or tensor-core tiles
/// (`..._mma_bf16`); either way `act` [slots, I] (the SwiGLU activations) between the two
/// launches, and both pairs take the same arguments in the same order.
struct ExpertMajorKernels<'a> {
    gate_up: &'a str,
    down: &'a str,
    /// Intermediate channels a gate/up block forms (the tensor-core tile's 128 outputs are 64
    /// channels' gate and up rows, interleaved).
    channels: usize,
    /// Outputs of a down block.
    outputs: usize,
    threads: u32,
}

/// The gate/up and down launches of the expert-major experts: `out [slots, hidden]` from the
/// slot order and tile table. `dims`: max tiles, slots, top-k, hidden, intermediate.
#[allow(clippy::too_many_arguments)]
fn expert_major_products(
    cx: &Launch,
    out: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    order: &CudaSlice<i32>,
    tiles: &CudaSlice<i32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    dims: [usize; 5],
    k: ExpertMajorKernels,
) -> Result<(), CudaError> {
    let [max_tiles, slots, top_k, hidden, intermediate] = dims;
    let (k32, h64, int64) = (top_k as i32, hidden as i64, intermediate as i64);
    let mut between = cx.scratch::<f32>(slots * intermediate, "expert activations")?;
    let grid = |blocks: usize| LaunchConfig {
        grid_dim: (max_tiles as u32, blocks as u32, 1),
        block_dim: (k.threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = cx.function("moe.cu", k.gate_up)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *between).arg(x).arg(order).arg(tiles);
    arg_matrix(&mut b, gate_up);
    b.arg(&k32).arg(&h64).arg(&int64);
    // SAFETY: the tile table (written by the grouping launch on this stream) names valid experts
    // and rows of `order`, which holds slot indices below `slots`; x rows are slot / top_k <
    // rows; `between` holds slots x intermediate; the block size is the kernel's; the tensor-core
    // kernels get sizes multiples of 8 and 16-byte aligned rows (expert_major_on_tensor_cores).
    launched(k.gate_up, unsafe {
        b.launch(grid(intermediate.div_ceil(k.channels)))
    })?;

    let f = cx.function("moe.cu", k.down)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out).arg(&*between).arg(order).arg(tiles);
    arg_matrix(&mut b, down);
    b.arg(&h64).arg(&int64);
    // SAFETY: as above; the rows of valid slots of `between` were written by the previous
    // launch; out holds slots*hidden floats (the rows of valid slots are written).
    launched(k.down, unsafe {
        b.launch(grid(hidden.div_ceil(k.outputs)))
    })
}

/// `ops::ple::ngram_ids` for `tokens [rows]` with `hash`: ids `[rows, (ngram-1)·heads_per_ngram]`,
/// with `history [ngram-1]` (the previous ids; eos at the start of a sequence) replaced in place
/// by the last `ngram-1` ids of history ++ tokens.
pub fn ple_ngram_ids(
    cx: &Launch,
    tokens: &CudaSlice<i64>,
    history: &mut CudaSlice<i64>,
    hash: &NgramHash<'_>,
) -> Result<Buf<i64>, CudaError> {
    let kernel = "ple_ngram_ids_reference_i64";
    let heads = hash.check(kernel, tokens, history)?;
    let rows = tokens.len();
    let f = cx.function("moe.cu", kernel)?;
    let mut ids = cx.output::<i64>(rows * heads, "n-gram ids")?;
    let (r64, n32, h32) = (rows as i64, hash.ngram as i32, hash.heads_per_ngram as i32);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        // A thread per (row, head), up to 256.
        block_dim: ((rows * heads).next_multiple_of(32).min(256) as u32, 1, 1),
        // The old history in static shared memory (NGRAM_MAX_CTX, kernels/ngram.cuh).
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *ids)
        .arg(history)
        .arg(tokens)
        .arg(&r64)
        .arg(&hash.eos)
        .arg(&n32)
        .arg(&h32)
        .arg(hash.multipliers)
        .arg(hash.sizes)
        .arg(hash.offsets);
    // SAFETY: one block (history is read into shared memory before it is written, and no other
    // block exists to race with); every buffer's length was checked against rows, ngram and
    // heads_per_ngram above.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(ids)
}
