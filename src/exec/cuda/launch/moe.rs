//! Mixture of experts on the device (`kernels/moe.cu`): the router (softmax, top k) and the routed
//! SwiGLU experts, whose expert ids stay on the device; and PLE's hashed n-gram ids, whose history
//! is a device buffer updated in place. `src/ops/moe.rs` and `src/ops/ple.rs` are the reference.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::arg_matrix;
use super::{launched, shape, DeviceMatrix};
use crate::exec::cuda::device::{Buf, Gpu};
use crate::exec::cuda::error::CudaError;

/// The largest `top_k` the router kernel keeps (`ROUTER_MAX_TOPK` in `kernels/moe.cu`).
pub const ROUTER_MAX_TOPK: usize = 64;
/// Dynamic shared memory a kernel may use without opting in.
const SHARED_LIMIT: usize = 48 * 1024;
/// Warps per block of the expert kernels.
const EXPERT_WARPS: usize = 8;

/// `ops::moe::route` for `logits [rows, experts]`: per row a softmax, then the `top_k` largest
/// probabilities (ties: lower expert id first) in selection order, renormalised by their sum when
/// `normalize`. Returns ids and weights `[rows, top_k]`, both on the device.
pub fn moe_router(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    experts: usize,
    top_k: usize,
    normalize: bool,
) -> Result<(Buf<i64>, Buf<f32>), CudaError> {
    let kernel = "moe_router_reference_f32";
    let shared = experts * (std::mem::size_of::<f32>() + 1);
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
    shape(
        kernel,
        top_k > 0 && top_k <= experts && top_k <= ROUTER_MAX_TOPK,
        || format!("top {top_k} of {experts} experts (at most {ROUTER_MAX_TOPK})"),
    )?;
    shape(kernel, shared <= SHARED_LIMIT, || {
        format!("{experts} experts need {shared} bytes of shared memory, more than {SHARED_LIMIT}")
    })?;
    let f = gpu.function("moe.cu", kernel)?;
    let mut ids = gpu.output::<i64>(rows * top_k, "router ids")?;
    let mut weights = gpu.output::<f32>(rows * top_k, "router weights")?;
    let (r64, e32, k32, n32) = (rows as i64, experts as i32, top_k as i32, normalize as i32);
    let cfg = LaunchConfig {
        grid_dim: (rows.min(65_535 * 8) as u32, 1, 1),
        block_dim: (experts.next_multiple_of(32).min(256) as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut *ids)
        .arg(&mut *weights)
        .arg(logits)
        .arg(&r64)
        .arg(&e32)
        .arg(&k32)
        .arg(&n32);
    // SAFETY: logits holds rows*experts floats, ids and weights rows*top_k values each;
    // top_k <= ROUTER_MAX_TOPK (the kernel's static arrays) and the dynamic shared memory holds
    // `experts` floats and `experts` flags.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok((ids, weights))
}

/// The routed experts, token-major (`ops::moe::token_major`):
/// `y[t] = Σ_j w[t,j] · down_e(silu(G) * U)` with `[G; U] = gate_up_e · x_t` and
/// `e = ids[t,j]`, read on the device. `x [rows, hidden]`, `ids`, `w [rows, top_k]`,
/// `gate_up [E, 2·intermediate, hidden]` (per expert the gate rows, then the up rows),
/// `down [E, hidden, intermediate]`; f32 or bf16 weights (each matrix picks its own kernel).
/// An id outside `[0, E)` makes its token's row NaN (never a read out of bounds).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    ids: &CudaSlice<i64>,
    w: &CudaSlice<f32>,
    gate_up: &DeviceMatrix,
    down: &DeviceMatrix,
    rows: usize,
    top_k: usize,
    hidden: usize,
    intermediate: usize,
) -> Result<Buf<f32>, CudaError> {
    let (gu_name, down_name) = (
        gate_up.kernel("moe_experts_gate_up"),
        down.kernel("moe_experts_down"),
    );
    let (gu_kernel, down_kernel) = (gu_name.as_str(), down_name.as_str());
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
    let slots = rows * top_k;
    let (s64, t64, k32, h64, int64, e64) = (
        slots as i64,
        rows as i64,
        top_k as i32,
        hidden as i64,
        intermediate as i64,
        experts as i64,
    );
    let block_dim = ((EXPERT_WARPS * 32) as u32, 1, 1);

    let f = gpu.function("moe.cu", gu_kernel)?;
    let mut act = gpu.scratch::<f32>(slots * intermediate, "expert activations")?;
    let cfg = LaunchConfig {
        grid_dim: (
            intermediate.div_ceil(EXPERT_WARPS).min(65_535 * 8) as u32,
            slots.min(65_535) as u32,
            1,
        ),
        block_dim,
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut *act).arg(x).arg(ids);
    arg_matrix(&mut b, gate_up);
    b.arg(&s64).arg(&k32).arg(&h64).arg(&int64).arg(&e64);
    // SAFETY: the shapes were checked above; ids outside [0, experts) are not dereferenced; act
    // holds slots*intermediate floats; 16-byte loads are used only when hidden allows, and
    // cudarc's allocations are 256-byte aligned.
    launched(gu_kernel, unsafe { b.launch(cfg) })?;

    let f = gpu.function("moe.cu", down_kernel)?;
    let mut y = gpu.output::<f32>(rows * hidden, down_kernel)?;
    let cfg = LaunchConfig {
        grid_dim: (
            hidden.div_ceil(EXPERT_WARPS).min(65_535 * 8) as u32,
            rows.min(65_535) as u32,
            1,
        ),
        block_dim,
        shared_mem_bytes: 0,
    };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut *y).arg(&*act).arg(ids).arg(w);
    arg_matrix(&mut b, down);
    b.arg(&t64).arg(&k32).arg(&h64).arg(&int64).arg(&e64);
    // SAFETY: as above; act was written by the previous launch on the same stream, and y holds
    // rows*hidden floats.
    launched(down_kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// `ops::ple::ngram_ids` for `tokens [rows]`: ids `[rows, (ngram-1)·heads_per_ngram]`, with
/// `history [ngram-1]` (the previous ids; eos at the start of a sequence) replaced in place by
/// the last `ngram-1` ids of history ++ tokens. `multipliers [ngram]`, `sizes` and
/// `offsets [(ngram-1)·heads_per_ngram]`. Sizes must be non-zero (the loader's primes).
#[allow(clippy::too_many_arguments)]
pub fn ple_ngram_ids(
    gpu: &Gpu,
    tokens: &CudaSlice<i64>,
    history: &mut CudaSlice<i64>,
    rows: usize,
    eos: i64,
    ngram: usize,
    heads_per_ngram: usize,
    multipliers: &CudaSlice<i64>,
    sizes: &CudaSlice<i64>,
    offsets: &CudaSlice<i64>,
) -> Result<Buf<i64>, CudaError> {
    let kernel = "ple_ngram_ids_reference_i64";
    shape(
        kernel,
        rows > 0 && tokens.len() == rows && (2..=64).contains(&ngram) && heads_per_ngram > 0,
        || {
            format!(
                "{} tokens for {rows} rows, ngram {ngram} (2..=64), {heads_per_ngram} heads per n-gram",
                tokens.len()
            )
        },
    )?;
    let ctx = ngram - 1;
    let heads = ctx * heads_per_ngram;
    shape(
        kernel,
        history.len() == ctx
            && multipliers.len() == ngram
            && sizes.len() == heads
            && offsets.len() == heads,
        || {
            format!(
                "history {} (want {ctx}), multipliers {} (want {ngram}), sizes {} and offsets {} \
                 (want {heads})",
                history.len(),
                multipliers.len(),
                sizes.len(),
                offsets.len()
            )
        },
    )?;
    let f = gpu.function("moe.cu", kernel)?;
    let mut ids = gpu.output::<i64>(rows * heads, "n-gram ids")?;
    let (r64, n32, h32) = (rows as i64, ngram as i32, heads_per_ngram as i32);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (rows.next_multiple_of(32).min(256) as u32, 1, 1),
        shared_mem_bytes: (ctx * std::mem::size_of::<i64>()) as u32,
    };
    let mut b = gpu.stream.launch_builder(&f);
    b.arg(&mut *ids)
        .arg(history)
        .arg(tokens)
        .arg(&r64)
        .arg(&eos)
        .arg(&n32)
        .arg(&h32)
        .arg(multipliers)
        .arg(sizes)
        .arg(offsets);
    // SAFETY: one block (history is read into shared memory before it is written, and no other
    // block exists to race with); every buffer's length was checked against rows, ngram and
    // heads_per_ngram above.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(ids)
}
