//! RoPE, the QSA indexer's block selection and attention over the KV cache on the device
//! (`kernels/attention.cu`), matching `ops::rope`, `ops::indexer` and `ops::attention`.
//!
//! The step's start position is the device `i64[1]` `step`; every launch's geometry depends only
//! on `rows` and the fixed capacities, so a captured graph replays at any position. The caller
//! checks `start + rows <= capacity` on the host (the kernels never touch a row past the
//! capacity, but a step that overflows is not attended correctly).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{grid_for, launched, shape};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;

mod indexer;

pub(crate) use indexer::indexer_work_len;
pub use indexer::{indexer_select, indexer_select_qk};

const FILE: &str = "attention.cu";
/// Static shared memory a kernel may take without opting in to more.
const SHARED_LIMIT: usize = 48 * 1024;
/// As `ATTN_CHUNK` in the kernel source.
const ATTN_CHUNK: u32 = 256;

fn one_step(kernel: &str, step: &CudaSlice<i64>) -> Result<(), CudaError> {
    shape(kernel, !step.is_empty(), || {
        "the step position buffer is empty".to_string()
    })
}

fn rope_dims(kernel: &str, head_dim: usize, rotary_dim: usize) -> Result<(), CudaError> {
    shape(
        kernel,
        head_dim > 0 && rotary_dim.is_multiple_of(2) && rotary_dim <= head_dim,
        || format!("rotary_dim {rotary_dim} must be even and at most head_dim {head_dim}"),
    )
}

/// Copies `k` and `v [rows, width]` to rows `[start, start+rows)` of `k_cache` and `v_cache
/// [capacity, width]`, in one launch.
#[allow(clippy::too_many_arguments)]
fn append_kv_rows(
    cx: &Launch,
    k_cache: &mut CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    v: &CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    width: usize,
    capacity: usize,
) -> Result<(), CudaError> {
    let kernel = "append_rows2_f32";
    let f = cx.function(FILE, kernel)?;
    let (r64, w64, c64) = (rows as i64, width as i64, capacity as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(k_cache)
        .arg(k)
        .arg(v_cache)
        .arg(v)
        .arg(step)
        .arg(&r64)
        .arg(&w64)
        .arg(&c64);
    // SAFETY: k and v hold rows*width floats and the caches capacity*width (checked by the
    // callers); the kernel skips rows at or past the capacity.
    launched(kernel, unsafe { b.launch(grid_for(2 * rows * width, 256)) })
}

/// The rotary embedding of a step: its base, and how far past its cache row each row is
/// rotated (`Consts::rope_offset`: one for the MTP draft, whose row r is rotated at r + 1). A
/// bare `theta` is an offset of 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotary {
    pub theta: f64,
    pub offset: i64,
}

impl From<f64> for Rotary {
    fn from(theta: f64) -> Rotary {
        Rotary { theta, offset: 0 }
    }
}

/// `ops::rope::rope`: partial NeoX RoPE on every head of `x [rows, width]`, row `t` at position
/// `step[0] + t` (plus the rotary's offset).
pub fn rope(
    cx: &Launch,
    x: &CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    head_dim: usize,
    rotary_dim: usize,
    rotary: impl Into<Rotary>,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "rope_reference_f32";
    let Rotary { theta, offset } = rotary.into();
    one_step(kernel, step)?;
    rope_dims(kernel, head_dim, rotary_dim)?;
    shape(
        kernel,
        rows > 0 && x.len().is_multiple_of(rows) && (x.len() / rows).is_multiple_of(head_dim),
        || {
            format!(
                "{} values are not {rows} rows of heads of {head_dim}",
                x.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let width = x.len() / rows;
    let mut y = cx.output::<f32>(x.len(), kernel)?;
    let (r64, w64, hd, rot) = (
        rows as i64,
        width as i64,
        head_dim as i32,
        rotary_dim as i32,
    );
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(x)
        .arg(step)
        .arg(&r64)
        .arg(&w64)
        .arg(&hd)
        .arg(&rot)
        .arg(&theta)
        .arg(&offset);
    // SAFETY: x and y hold rows*width floats; each head's pair partner lies in the same head.
    launched(kernel, unsafe { b.launch(grid_for(x.len(), 256)) })?;
    Ok(y)
}

/// Threads of a block that forms a head in `norm_rope_head` (kernels/attention.cu): those of
/// [`norm_rope_launch`]'s kernels and of `indexer_select_qk`'s first launch, so that all sum the
/// same squares in the same order.
fn norm_rope_threads(head_dim: usize) -> u32 {
    head_dim.div_ceil(2).next_multiple_of(32).min(256) as u32
}

/// As `NORM_ROPE_MAX_DIM` in the kernel source (the staged head).
const NORM_ROPE_MAX_DIM: usize = 1024;

/// `ops::rope::norm_rope`: each head of `x [rows, width]` RMS-normalised with `1 + w` (`w`
/// `[head_dim]` or `[width]`) and then rotated as [`rope`], in one launch (a block per row and
/// head).
#[allow(clippy::too_many_arguments)]
pub fn norm_rope(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    head_dim: usize,
    rotary_dim: usize,
    eps: f32,
    rotary: impl Into<Rotary>,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "norm_rope_f32";
    let Rotary { theta, offset } = rotary.into();
    one_step(kernel, step)?;
    rope_dims(kernel, head_dim, rotary_dim)?;
    shape(
        kernel,
        rows > 0
            && head_dim <= NORM_ROPE_MAX_DIM
            && x.len().is_multiple_of(rows)
            && (x.len() / rows).is_multiple_of(head_dim)
            && (w.len() == head_dim || w.len() == x.len() / rows),
        || {
            format!(
                "{} values are not {rows} rows of heads of {head_dim} (at most {NORM_ROPE_MAX_DIM}) \
                 with a norm weight of {} (want {head_dim} or the row's width)",
                x.len(),
                w.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let width = x.len() / rows;
    let blocks = rows * (width / head_dim);
    let mut y = cx.output::<f32>(x.len(), kernel)?;
    let (r64, w64, hd, rot, wl) = (
        rows as i64,
        width as i64,
        head_dim as i32,
        rotary_dim as i32,
        w.len() as i64,
    );
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(x)
        .arg(w)
        .arg(step)
        .arg(&r64)
        .arg(&w64)
        .arg(&hd)
        .arg(&rot)
        .arg(&wl)
        .arg(&eps)
        .arg(&theta)
        .arg(&offset);
    let cfg = norm_rope_launch(blocks, head_dim);
    // SAFETY: x and y hold rows*width floats, w head_dim or width; a block stages one head of at
    // most NORM_ROPE_MAX_DIM channels, and each rotated channel's partner lies in the same head.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// The launch of a kernel that runs `norm_rope_head` (kernels/attention.cu) once per thread block
/// and task, over `tasks` heads of `head_dim`: `norm_rope_f32` and `gated_attention_prepare_f32`
/// alike, so that their heads' sums of squares are reduced in the same order (the same bits).
fn norm_rope_launch(tasks: usize, head_dim: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (tasks.min(65_535 * 8) as u32, 1, 1),
        block_dim: (norm_rope_threads(head_dim), 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The shape checks every attention variant makes, then the step's `k`, `v` appended to rows
/// `[start, start+rows)` of the caches (errors name `kernel`).
#[allow(clippy::too_many_arguments)]
fn append_kv(
    cx: &Launch,
    kernel: &str,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    sel: &CudaSlice<i32>,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keep: usize,
    block: usize,
) -> Result<(), CudaError> {
    one_step(kernel, step)?;
    shape(
        kernel,
        rows > 0 && head_dim > 0 && kv_heads > 0 && heads.is_multiple_of(kv_heads) && block > 0,
        || format!("rows {rows}, heads {heads}/{kv_heads}, head_dim {head_dim}, block {block}"),
    )?;
    let kw = kv_heads * head_dim;
    shape(
        kernel,
        q.len() == rows * heads * head_dim
            && k.len() == rows * kw
            && v.len() == rows * kw
            && sel.len() == rows * (2 + keep),
        || {
            format!(
                "q {} values, k {}, v {}, selection {} for {rows} rows of {heads}/{kv_heads} \
                 heads of {head_dim}, keep {keep}",
                q.len(),
                k.len(),
                v.len(),
                sel.len()
            )
        },
    )?;
    shape(
        kernel,
        k_cache.len() == capacity * kw && v_cache.len() == capacity * kw,
        || {
            format!(
                "caches {} and {} values, want {capacity}x{kw}",
                k_cache.len(),
                v_cache.len()
            )
        },
    )?;
    append_kv_rows(cx, k_cache, k, v_cache, v, rows, step, kw, capacity)
}

/// `Attention` (as `exec::cpu`): appends `k, v [rows, kv_heads*head_dim]` to rows
/// `[start, start+rows)` of `k_cache`, `v_cache [capacity, kv_heads*head_dim]`, then for each
/// row and head of `q [rows, heads*head_dim]` computes `softmax(q·K/sqrt(head_dim))·V` over the
/// row's selected positions (`sel i32 [rows, 2 + keep]` from [`indexer_select`], whose sparse
/// rows name blocks of `block` positions), query head h reading kv head h/(heads/kv_heads).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    cx: &Launch,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    sel: &CudaSlice<i32>,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keep: usize,
    block: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "attention_reference_f32";
    reference_fits(kernel, head_dim)?;
    append_kv(
        cx, kernel, q, k, v, sel, k_cache, v_cache, rows, step, heads, kv_heads, head_dim,
        capacity, keep, block,
    )?;
    let dims = AttendDims {
        rows,
        heads,
        kv_heads,
        head_dim,
        capacity,
        keep,
        block,
    };
    attend_reference(cx, kernel, q, None, sel, k_cache, v_cache, &dims)
}

/// The step's dimensions once the caches hold its rows (the attention kernels' shared arguments).
struct AttendDims {
    rows: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keep: usize,
    block: usize,
}

/// Whether `attention_reference_f32`'s shared memory (q and the accumulator) holds a head.
fn reference_fits(kernel: &str, head_dim: usize) -> Result<(), CudaError> {
    shape(kernel, 2 * head_dim * 4 <= SHARED_LIMIT, || {
        format!("head_dim {head_dim} is too wide")
    })
}

/// `attention_reference_f32` over caches that already hold the step's rows (shapes checked by
/// the caller); with `gate` (the fused q projection qg), `attention_reference_gated_f32`: each
/// output times sigmoid of its gate.
#[allow(clippy::too_many_arguments)]
fn attend_reference(
    cx: &Launch,
    kernel: &str,
    q: &CudaSlice<f32>,
    gate: Option<&CudaSlice<f32>>,
    sel: &CudaSlice<i32>,
    k_cache: &CudaSlice<f32>,
    v_cache: &CudaSlice<f32>,
    d: &AttendDims,
) -> Result<Buf<f32>, CudaError> {
    let f = cx.function(FILE, kernel)?;
    let mut y = cx.output::<f32>(q.len(), kernel)?;
    let cfg = LaunchConfig {
        grid_dim: ((d.rows * d.heads).min(i32::MAX as usize) as u32, 1, 1),
        block_dim: (ATTN_CHUNK, 1, 1),
        shared_mem_bytes: (2 * d.head_dim * 4) as u32,
    };
    let (r64, h32, kv32, hd32, block32, keep32, cap64) = (
        d.rows as i64,
        d.heads as i32,
        d.kv_heads as i32,
        d.head_dim as i32,
        d.block as i32,
        d.keep as i32,
        d.capacity as i64,
    );
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(q).arg(k_cache).arg(v_cache).arg(sel);
    if let Some(qg) = gate {
        b.arg(qg);
    }
    b.arg(&r64)
        .arg(&h32)
        .arg(&kv32)
        .arg(&hd32)
        .arg(&block32)
        .arg(&keep32)
        .arg(&cap64);
    // SAFETY: y and q hold rows*heads*head_dim floats, sel rows*(2+keep) ints, the caches
    // capacity rows of kv_heads*head_dim, a gate's qg rows*heads*2*head_dim floats (checked by
    // the callers); the kernel reads only cache rows below the capacity; the dynamic shared
    // memory is 2*head_dim floats.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// As `SPLIT_THREADS`, `SPLIT_CHUNK` and `SPLIT_MAX_QUADS` in the kernel source.
const SPLIT_THREADS: u32 = 256;
const SPLIT_CHUNK: usize = 32;
use crate::registry::cuda::attention::{split_kernel as split_kernel_for, SPLIT_MAX_HEAD_DIM};
/// At most this many splits per (row, kv head) (the combine kernel keeps a weight per split in
/// shared memory, and each thread holds its splits' (m, l): `SPLIT_MAX_SPLITS` in
/// kernels/attention.cu).
const SPLIT_MAX: usize = 1024;

/// How many position splits `attention_split` makes per (row, kv head): enough thread blocks
/// for two per multiprocessor, but no split shorter than a chunk of the longest selection
/// (`keep` blocks and a partial one: dense rows are shorter), so the count depends on the
/// launch only (rows, capacity, keep), never on the position.
pub fn split_count(
    multiprocessors: usize,
    rows: usize,
    kv_heads: usize,
    capacity: usize,
    keep: usize,
    block: usize,
) -> usize {
    let longest = ((keep + 1) * block).min(capacity).max(1);
    let by_positions = longest.div_ceil(SPLIT_CHUNK);
    let by_grid = (2 * multiprocessors).div_ceil((rows * kv_heads).max(1));
    by_positions.min(by_grid).clamp(1, SPLIT_MAX)
}

/// `Attention` as [`attention`] (the same arguments, the same K/V appends, the same result within
/// f32 rounding), split over positions for few rows (flash-decoding): one thread block per (row,
/// kv head, split) attends every query head of its kv head over a contiguous range of the row's
/// selected positions, so each K/V row is read once per step instead of once per query head,
/// and the splits keep the whole GPU busy at one row; a second kernel combines the splits'
/// partial softmax states (log-sum-exp rescaling). The split count is [`split_count`]; the
/// partial states go to scratch `[rows, heads, splits, head_dim + 2]` f32.
///
/// Takes head_dim a multiple of 4 up to 256 and up to 16 query heads per kv head (an error
/// otherwise: the schedule gives other shapes the reference variant).
#[allow(clippy::too_many_arguments)]
pub fn attention_split(
    cx: &Launch,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    sel: &CudaSlice<i32>,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    keep: usize,
    block: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = split_kernel(heads, kv_heads, head_dim, capacity)?;
    append_kv(
        cx, &kernel, q, k, v, sel, k_cache, v_cache, rows, step, heads, kv_heads, head_dim,
        capacity, keep, block,
    )?;
    let dims = AttendDims {
        rows,
        heads,
        kv_heads,
        head_dim,
        capacity,
        keep,
        block,
    };
    attend_split(cx, &kernel, q, None, sel, k_cache, v_cache, &dims)
}

/// The `attention_split_*` kernel that takes this shape (`registry::cuda::attention`), or the
/// error saying why none does.
fn split_kernel(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
) -> Result<String, CudaError> {
    let group = heads.checked_div(kv_heads).unwrap_or(0);
    split_kernel_for(group, head_dim)
        .filter(|_| capacity <= i32::MAX as usize && group * kv_heads == heads)
        .ok_or_else(|| CudaError::Shape {
            kernel: "attention_split".into(),
            msg: format!(
                "{heads} heads over {kv_heads} kv heads of {head_dim}, capacity {capacity}: no split kernel takes it"
            ),
        })
}

/// The split kernel `kernel` (from [`split_kernel`]) and the combine over caches that already
/// hold the step's rows (shapes checked by the caller); with `gate` (the fused q projection qg),
/// `attention_split_combine_gated_f32`: each output times sigmoid of its gate.
#[allow(clippy::too_many_arguments)]
fn attend_split(
    cx: &Launch,
    kernel: &str,
    q: &CudaSlice<f32>,
    gate: Option<&CudaSlice<f32>>,
    sel: &CudaSlice<i32>,
    k_cache: &CudaSlice<f32>,
    v_cache: &CudaSlice<f32>,
    d: &AttendDims,
) -> Result<Buf<f32>, CudaError> {
    let AttendDims {
        rows,
        heads,
        kv_heads,
        head_dim,
        capacity,
        keep,
        block,
    } = *d;
    let group = heads / kv_heads;
    let splits = split_count(cx.multiprocessors, rows, kv_heads, capacity, keep, block);
    let partials = rows * heads * splits;
    let mut part_acc = cx.scratch::<f32>(partials * head_dim, kernel)?;
    let mut part_ml = cx.scratch::<f32>(partials * 2, kernel)?;
    let (r64, h32, kv32, hd32, block32, keep32, cap64, splits32) = (
        rows as i64,
        heads as i32,
        kv_heads as i32,
        head_dim as i32,
        block as i32,
        keep as i32,
        capacity as i64,
        splits as i32,
    );

    let f = cx.function(FILE, kernel)?;
    let cfg = LaunchConfig {
        grid_dim: (
            (rows * kv_heads * splits).min(i32::MAX as usize) as u32,
            1,
            1,
        ),
        block_dim: (SPLIT_THREADS, 1, 1),
        shared_mem_bytes: (group * SPLIT_MAX_HEAD_DIM * 4) as u32,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *part_acc)
        .arg(&mut *part_ml)
        .arg(q)
        .arg(k_cache)
        .arg(v_cache)
        .arg(sel)
        .arg(&r64)
        .arg(&h32)
        .arg(&kv32)
        .arg(&hd32)
        .arg(&block32)
        .arg(&keep32)
        .arg(&cap64)
        .arg(&splits32);
    // SAFETY: q holds rows*heads*head_dim floats, sel rows*(2+keep) ints, the caches capacity
    // rows of kv_heads*head_dim (all checked by the callers), part_acc rows*heads*splits*head_dim
    // floats and part_ml rows*heads*splits pairs; the kernel reads only cache rows below the
    // capacity; head_dim is a multiple of 4 (16-byte accesses of whole allocations) up to
    // 4*SPLIT_MAX_QUADS, the group at most g (split_kernel); the dynamic shared memory is group
    // rows of SPLIT_MAX_QUADS float4 (16 KiB at most).
    launched(kernel, unsafe { b.launch(cfg) })?;

    let combine = if gate.is_some() {
        "attention_split_combine_gated_f32"
    } else {
        "attention_split_combine_f32"
    };
    let f = cx.function(FILE, combine)?;
    let mut y = cx.output::<f32>(q.len(), combine)?;
    let cfg = LaunchConfig {
        grid_dim: ((rows * heads).min(i32::MAX as usize) as u32, 1, 1),
        block_dim: (SPLIT_THREADS, 1, 1),
        shared_mem_bytes: (splits * 4) as u32,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(&*part_acc).arg(&*part_ml);
    if let Some(qg) = gate {
        b.arg(qg);
    }
    b.arg(&r64).arg(&h32).arg(&hd32).arg(&splits32);
    // SAFETY: y holds rows*heads*head_dim floats, part_acc and part_ml the partial states of
    // rows*heads*splits (written by the launch above, in stream order), a gate's qg
    // rows*heads*2*head_dim floats (checked by the callers); head_dim is a multiple of 4 up to
    // 4*SPLIT_MAX_QUADS (16-byte accesses); the dynamic shared memory is splits floats.
    launched(combine, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// `GatedAttention`'s dimensions (the op's).
#[derive(Clone, Copy, Debug)]
pub struct GatedAttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub block: usize,
}

/// `GatedAttention`'s inputs on the device: the fused q projection `qg [rows, heads*2*head_dim]`
/// (per head: q then gate), `k_raw`, `v [rows, kv_heads*head_dim]`, the selection `sel i32
/// [rows, 2 + keep]` (from [`indexer_select`]) and the norm weights `q_norm` (`[head_dim]` or
/// `[heads*head_dim]`) and `k_norm` (`[head_dim]` or `[kv_heads*head_dim]`).
pub struct GatedAttentionInputs<'a> {
    pub qg: &'a CudaSlice<f32>,
    pub k_raw: &'a CudaSlice<f32>,
    pub v: &'a CudaSlice<f32>,
    pub sel: &'a CudaSlice<i32>,
    pub q_norm: &'a CudaSlice<f32>,
    pub k_norm: &'a CudaSlice<f32>,
}

/// `GatedAttention` (as `exec::cpu`: `SplitQGate`, `NormRope` of q and of k, `Attention`,
/// `SigmoidMul` by the gate), in two launches: `gated_attention_prepare_f32` (q and k
/// normalised and rotated at positions `[start, start+rows)` as [`norm_rope`], k and v appended
/// to rows `[start, start+rows)` of `k_cache`, `v_cache [capacity, kv_heads*head_dim]`, q to
/// scratch), then `attention_reference_gated_f32` ([`attention`]'s kernel with the gate as its
/// epilogue, the gate read from qg). The same bits as the unfused ops' kernels.
#[allow(clippy::too_many_arguments)]
pub fn gated_attention(
    cx: &Launch,
    x: &GatedAttentionInputs,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    s: &GatedAttentionShape,
    capacity: usize,
    keep: usize,
    eps: f32,
    rotary: impl Into<Rotary>,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "attention_reference_gated_f32";
    let rotary = rotary.into();
    reference_fits(kernel, s.head_dim)?;
    let q = gated_prepare(
        cx, x, k_cache, v_cache, rows, step, s, capacity, keep, eps, rotary,
    )?;
    let dims = s.attend_dims(rows, capacity, keep);
    attend_reference(cx, kernel, &q, Some(x.qg), x.sel, k_cache, v_cache, &dims)
}

/// [`gated_attention`] with [`attention_split`]'s kernels (the same result within f32 rounding;
/// the same bits as the unfused ops with `attention_split`), in three launches:
/// `gated_attention_prepare_f32`, `attention_split_*` over the prepared q, and
/// `attention_split_combine_gated_f32` (the gate as the combine's epilogue); shapes the split
/// kernels do not take are an error.
#[allow(clippy::too_many_arguments)]
pub fn gated_attention_split(
    cx: &Launch,
    x: &GatedAttentionInputs,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    s: &GatedAttentionShape,
    capacity: usize,
    keep: usize,
    eps: f32,
    rotary: impl Into<Rotary>,
) -> Result<Buf<f32>, CudaError> {
    let kernel = split_kernel(s.heads, s.kv_heads, s.head_dim, capacity)?;
    let rotary = rotary.into();
    let q = gated_prepare(
        cx, x, k_cache, v_cache, rows, step, s, capacity, keep, eps, rotary,
    )?;
    let dims = s.attend_dims(rows, capacity, keep);
    attend_split(cx, &kernel, &q, Some(x.qg), x.sel, k_cache, v_cache, &dims)
}

impl GatedAttentionShape {
    fn attend_dims(&self, rows: usize, capacity: usize, keep: usize) -> AttendDims {
        AttendDims {
            rows,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            capacity,
            keep,
            block: self.block,
        }
    }
}

/// `gated_attention_prepare_f32` after the shape checks of every `GatedAttention` launch (errors
/// name that kernel): returns the normalised, rotated q `[rows, heads*head_dim]` (scratch), the
/// step's k (normalised, rotated) and v appended to the caches.
#[allow(clippy::too_many_arguments)]
fn gated_prepare(
    cx: &Launch,
    x: &GatedAttentionInputs,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    s: &GatedAttentionShape,
    capacity: usize,
    keep: usize,
    eps: f32,
    rotary: Rotary,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "gated_attention_prepare_f32";
    let Rotary { theta, offset } = rotary;
    let GatedAttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        rotary_dim,
        block,
    } = *s;
    one_step(kernel, step)?;
    rope_dims(kernel, hd, rotary_dim)?;
    shape(
        kernel,
        rows > 0
            && hd <= NORM_ROPE_MAX_DIM
            && kv_heads > 0
            && heads.is_multiple_of(kv_heads)
            && block > 0,
        || {
            format!(
                "rows {rows}, heads {heads}/{kv_heads}, head_dim {hd} (at most \
                 {NORM_ROPE_MAX_DIM}), block {block}"
            )
        },
    )?;
    let (qw, kw) = (heads * hd, kv_heads * hd);
    shape(
        kernel,
        x.qg.len() == rows * 2 * qw
            && x.k_raw.len() == rows * kw
            && x.v.len() == rows * kw
            && x.sel.len() == rows * (2 + keep),
        || {
            format!(
                "qg {} values, k {}, v {}, selection {} for {rows} rows of {heads}/{kv_heads} \
                 heads of {hd}, keep {keep}",
                x.qg.len(),
                x.k_raw.len(),
                x.v.len(),
                x.sel.len()
            )
        },
    )?;
    shape(
        kernel,
        (x.q_norm.len() == hd || x.q_norm.len() == qw)
            && (x.k_norm.len() == hd || x.k_norm.len() == kw),
        || {
            format!(
                "norm weights of {} (q) and {} (k) values, want {hd} or the row's width \
                 ({qw}, {kw})",
                x.q_norm.len(),
                x.k_norm.len()
            )
        },
    )?;
    shape(
        kernel,
        k_cache.len() == capacity * kw && v_cache.len() == capacity * kw,
        || {
            format!(
                "caches {} and {} values, want {capacity}x{kw}",
                k_cache.len(),
                v_cache.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let mut q = cx.scratch::<f32>(rows * qw, kernel)?;
    let (r64, h32, kv32, hd32, rot32, qwl, kwl, cap64) = (
        rows as i64,
        heads as i32,
        kv_heads as i32,
        hd as i32,
        rotary_dim as i32,
        x.q_norm.len() as i64,
        x.k_norm.len() as i64,
        capacity as i64,
    );
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *q)
        .arg(&mut *k_cache)
        .arg(&mut *v_cache)
        .arg(x.qg)
        .arg(x.k_raw)
        .arg(x.v)
        .arg(x.q_norm)
        .arg(x.k_norm)
        .arg(step)
        .arg(&r64)
        .arg(&h32)
        .arg(&kv32)
        .arg(&hd32)
        .arg(&rot32)
        .arg(&qwl)
        .arg(&kwl)
        .arg(&eps)
        .arg(&theta)
        .arg(&cap64)
        .arg(&offset);
    // SAFETY: q holds rows*heads*hd floats, qg rows*heads*2*hd, k_raw and v rows*kv_heads*hd,
    // the norm weights hd or the row's width (the kernel indexes them by that length), the
    // caches capacity rows of kv_heads*hd (all checked above); the kernel writes only cache rows
    // below the capacity; a block stages one head of at most NORM_ROPE_MAX_DIM channels, and
    // each rotated channel's partner lies in the same head.
    launched(kernel, unsafe {
        b.launch(norm_rope_launch(rows * (heads + kv_heads), hd))
    })?;
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::split_count;

    #[test]
    fn split_counts_follow_the_launch_only() {
        // Real geometry on an H200 (132 multiprocessors), 2051 positions at most: a decode row
        // gets 65 splits of up to 32 positions (130 blocks), at any capacity from 4k to 256k.
        assert_eq!(split_count(132, 1, 2, 4096, 512, 4), 65);
        assert_eq!(split_count(132, 1, 2, 262_144, 512, 4), 65);
        // More rows: about two blocks per multiprocessor.
        assert_eq!(split_count(132, 8, 2, 262_144, 512, 4), 17);
        assert_eq!(split_count(132, 64, 2, 262_144, 512, 4), 3);
        // A short cache or a small budget: one split.
        assert_eq!(split_count(132, 1, 2, 16, 0, 2), 1);
        assert_eq!(split_count(132, 1, 2, 48, 2, 2), 1);
        assert_eq!(split_count(132, 100_000, 2, 48, 2, 2), 1);
    }
}
