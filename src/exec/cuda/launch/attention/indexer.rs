//! The QSA indexer's block selection on the device (`kernels/attention.cu`, as
//! `ops::indexer::select`): the step's keys pooled into blocks, every complete block scored, the
//! top `budget / block` kept per row.

use super::*;
use crate::ops::indexer::IndexerShape;

/// As the `IDX_*` constants in the kernel source: the work buffer's per-row stride of zeroed
/// counters, the candidates kept per row, the pooled keys per score tile, the threads of the
/// top-k kernel and the scores per top-k thread block.
const IDX_ZSTRIDE: usize = 4096 + 4;
const IDX_LIST: usize = 4096;
const IDX_TILE: usize = 32;
const IDX_CHAIN: usize = 4;
const IDX_THREADS: u32 = 256;
const IDX_CHUNK: usize = 4096;
/// Threads of the prep kernel; its thread blocks past the pooling slots each zero or append
/// about `PREP_THREADS * 8` words.
const PREP_THREADS: u32 = 128;
/// Rows per score thread block (grid y), and the most score thread blocks per row group (grid
/// x; each strides over the tiles): 1024 (all resident at once on an H200: 26.5 KiB of shared
/// memory each at the real shape) put 16 MiB of pooled keys in flight, enough to stream 64k
/// keys at full bandwidth; those past the filled blocks return at once.
const SCORE_ROWS: usize = 16;
const SCORE_BLOCKS: usize = 1024;

/// u32 words of the indexer's work buffer for `rows` rows and `nb` pooled blocks (as `idx_work`
/// in the kernel source): counters, order keys, candidates, two bitmaps.
pub(crate) fn indexer_work_len(rows: usize, nb: usize) -> usize {
    let keys = rows * nb;
    rows * IDX_ZSTRIDE + keys + keys % 2 + rows * IDX_LIST * 2 + 2 * rows * nb.div_ceil(32)
}

/// `IndexerSelect` (as `exec::cpu`): appends the step's raw keys `k_raw [rows, head_dim]` to
/// rows `[start, start+rows)` of `raw_keys [capacity, head_dim]`; pools every block completed by
/// this step into `pooled [capacity/block, head_dim]` (`ops::indexer::pool_blocks` with the
/// weight `k_norm [head_dim]`; a longer buffer, such as an `Append` state of `capacity` rows, is
/// accepted and its rows from capacity/block on are left alone); selects for each row of the
/// normalised, roped queries `q [rows, heads*head_dim]` (`ops::indexer::select`).
///
/// Returns the selection `i32 [rows, 2 + budget/block]` (docs/pipeline.md): `visible`, then
/// `-1` and `-1`s for a dense row, or `budget/block` and that many block ids ascending.
///
/// Three launches (kernels/attention.cu, "Indexer"), none with a grid that depends on the
/// position, each spread over the GPU at one row: (1) append + pool + zero the counters, one
/// thread block per completed block; (2) scores, tiles of 32 pooled keys over up to 1024 thread
/// blocks per 16 rows (each key read once per 16 rows), with a histogram of the scores' top 12
/// bits per row; (3) top-k, one thread block per (2048 scores, row): each finds the histogram
/// bin of the k-th score, marks its scores above that bin and gathers those in it; the row's
/// last block to finish settles those (two 10-bit radix passes over at most 4096 candidates in
/// shared memory, else over the row's scores) and writes the ids ascending. Every pass over all
/// of a row's scores is split over its chunks; one thread block settles the candidates only.
/// One u32 scratch of `indexer_work_len` words: 4 bytes per row and pooled block (256 KiB a row
/// at 256k tokens with block 4) and 48 KiB per row (counters and candidates).
#[allow(clippy::too_many_arguments)]
pub fn indexer_select(
    cx: &Launch,
    q: &CudaSlice<f32>,
    k_raw: &CudaSlice<f32>,
    k_norm: &CudaSlice<f32>,
    raw_keys: &mut CudaSlice<f32>,
    pooled: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    shape_: &IndexerShape,
    capacity: usize,
    eps: f32,
    rotary: impl Into<Rotary>,
) -> Result<Buf<i32>, CudaError> {
    let IndexerShape {
        heads, head_dim, ..
    } = *shape_;
    shape(
        "indexer_select",
        q.len() == rows * heads * head_dim && k_raw.len() == rows * head_dim,
        || {
            format!(
                "q {} values, k {} values for {rows} rows of {heads}x{head_dim}",
                q.len(),
                k_raw.len()
            )
        },
    )?;
    select_launches(
        cx,
        IndexerQuery::Ready { q, k_raw },
        k_norm,
        raw_keys,
        pooled,
        rows,
        step,
        shape_,
        capacity,
        eps,
        rotary.into(),
    )
}

/// `IndexerSelectQk` (as `exec::cpu`): [`indexer_select`] over the indexer's projection `qk
/// [rows, (heads + 1) * head_dim]` (the query heads, then the key), the queries normalised with
/// `1 + q_norm` and rotated by the first launch's extra thread blocks (as `norm_rope`) into a
/// scratch for the scores, the keys read from the projection in place: the same three launches
/// as [`indexer_select`], where the unfused chain has three more (two slices and `norm_rope`).
#[allow(clippy::too_many_arguments)]
pub fn indexer_select_qk(
    cx: &Launch,
    qk: &CudaSlice<f32>,
    q_norm: &CudaSlice<f32>,
    k_norm: &CudaSlice<f32>,
    raw_keys: &mut CudaSlice<f32>,
    pooled: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    shape_: &IndexerShape,
    capacity: usize,
    eps: f32,
    rotary: impl Into<Rotary>,
) -> Result<Buf<i32>, CudaError> {
    let kernel = "indexer_select_qk";
    let IndexerShape {
        heads, head_dim, ..
    } = *shape_;
    shape(
        kernel,
        rows > 0 && qk.len() == rows * (heads + 1) * head_dim && q_norm.len() == head_dim,
        || {
            format!(
                "qk {} values, q_norm {} for {rows} rows of {heads} query heads and a key of {head_dim}",
                qk.len(),
                q_norm.len()
            )
        },
    )?;
    shape(kernel, head_dim <= NORM_ROPE_MAX_DIM, || {
        format!("head_dim {head_dim} is more than {NORM_ROPE_MAX_DIM}")
    })?;
    select_launches(
        cx,
        IndexerQuery::Projection { qk, q_norm },
        k_norm,
        raw_keys,
        pooled,
        rows,
        step,
        shape_,
        capacity,
        eps,
        rotary.into(),
    )
}

/// Where the indexer's queries and keys come from.
enum IndexerQuery<'a> {
    /// Normalised, roped queries `[rows, heads*head_dim]` and raw keys `[rows, head_dim]`.
    Ready {
        q: &'a CudaSlice<f32>,
        k_raw: &'a CudaSlice<f32>,
    },
    /// The projection `[rows, (heads + 1) * head_dim]` and the query norm's weight.
    Projection {
        qk: &'a CudaSlice<f32>,
        q_norm: &'a CudaSlice<f32>,
    },
}

/// The three launches of [`indexer_select`] and [`indexer_select_qk`] (their shapes of `q`, `k`
/// checked by the callers).
#[allow(clippy::too_many_arguments)]
fn select_launches(
    cx: &Launch,
    query: IndexerQuery<'_>,
    k_norm: &CudaSlice<f32>,
    raw_keys: &mut CudaSlice<f32>,
    pooled: &mut CudaSlice<f32>,
    rows: usize,
    step: &CudaSlice<i64>,
    shape_: &IndexerShape,
    capacity: usize,
    eps: f32,
    rotary: Rotary,
) -> Result<Buf<i32>, CudaError> {
    let kernel = "indexer_select";
    let Rotary { theta, offset } = rotary;
    let IndexerShape {
        heads,
        head_dim: hd,
        rotary_dim,
        budget,
        block,
    } = *shape_;
    one_step(kernel, step)?;
    rope_dims(kernel, hd, rotary_dim)?;
    shape(
        kernel,
        rows > 0 && heads > 0 && block > 0 && capacity <= i32::MAX as usize,
        || format!("rows {rows}, heads {heads}, block {block}, capacity {capacity}"),
    )?;
    let blocks = capacity / block;
    shape(kernel, k_norm.len() == hd, || {
        format!("k_norm {} values for keys of {hd}", k_norm.len())
    })?;
    shape(
        kernel,
        raw_keys.len() == capacity * hd && pooled.len() >= blocks * hd,
        || {
            format!(
                "raw keys {} values, pooled {}: want {capacity}x{hd} and at least {blocks}x{hd}",
                raw_keys.len(),
                pooled.len()
            )
        },
    )?;
    let keep = budget / block;
    // The tile of pooled keys, the partial sums and the chain's queries.
    let score_shared = (IDX_TILE * (hd + 1) + IDX_CHAIN * heads * (IDX_TILE + hd)) * 4;
    shape(
        kernel,
        3 * hd * 4 <= SHARED_LIMIT && score_shared <= SHARED_LIMIT,
        || format!("{heads} heads of {hd} are too wide"),
    )?;
    let (r64, hd32, rot32, block32, keep32, blocks64, cap64) = (
        rows as i64,
        hd as i32,
        rotary_dim as i32,
        block as i32,
        keep as i32,
        blocks as i64,
        capacity as i64,
    );
    let mut work = cx.scratch::<u32>(indexer_work_len(rows, blocks), kernel)?;
    // The queries for launch 2: ready, or formed by launch 1 into a scratch.
    let mut q_formed = match query {
        IndexerQuery::Projection { .. } => Some(cx.scratch::<f32>(rows * heads * hd, kernel)?),
        IndexerQuery::Ready { .. } => None,
    };
    let (k_raw, k_stride) = match query {
        IndexerQuery::Ready { k_raw, .. } => (k_raw.slice(..), hd),
        IndexerQuery::Projection { qk, .. } => (qk.slice(heads * hd..), (heads + 1) * hd),
    };

    // 1. The raw keys, the blocks this step completes (at most ceil(rows/block), one thread
    //    block each), the zeroed counters.
    let prep = "indexer_select_prep_f32";
    let slots = rows.div_ceil(block);
    // A projection's query heads are formed by this launch's last thread blocks with
    // `norm_rope`'s block size, so that they equal `norm_rope`'s bit for bit.
    let threads = if q_formed.is_some() {
        norm_rope_threads(hd)
    } else {
        PREP_THREADS
    };
    let spread = (rows * (IDX_ZSTRIDE + hd))
        .div_ceil(threads as usize * 8)
        .clamp(1, 1024);
    let q_blocks = if q_formed.is_some() { rows * heads } else { 0 };
    let f = cx.function(FILE, prep)?;
    let cfg = LaunchConfig {
        grid_dim: ((slots + spread + q_blocks) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: (3 * hd * 4) as u32,
    };
    let (slots64, k_stride64, heads32) = (slots as i64, k_stride as i64, heads as i32);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *raw_keys)
        .arg(&mut *pooled)
        .arg(&mut *work)
        .arg(&k_raw)
        .arg(k_norm)
        .arg(step)
        .arg(&r64)
        .arg(&hd32)
        .arg(&rot32)
        .arg(&block32)
        .arg(&eps)
        .arg(&theta)
        .arg(&blocks64)
        .arg(&cap64)
        .arg(&slots64)
        .arg(&k_stride64);
    // The query blocks' inputs: with a projection, its query heads (rows as far apart as the
    // keys': the projection's row), else null pointers (no query blocks).
    let null = 0u64;
    let q_stride64 = k_stride64;
    match (&mut q_formed, &query) {
        (Some(q_out), IndexerQuery::Projection { qk, q_norm }) => {
            b.arg(&mut **q_out).arg(*qk).arg(*q_norm);
        }
        _ => {
            b.arg(&null).arg(&null).arg(&null);
        }
    }
    b.arg(&q_stride64).arg(&heads32).arg(&offset);
    // SAFETY: raw_keys holds capacity rows of hd, pooled at least `blocks` rows (checked above),
    // k_raw rows rows of hd floats k_stride apart (checked by the callers), work
    // indexer_work_len(rows, blocks) words of which the kernel zeroes the first rows*IDX_ZSTRIDE;
    // it pools only blocks below `blocks`, whose raw rows lie below the capacity, and appends only
    // rows below the capacity; the dynamic shared memory is 3*hd floats (at least the hd a
    // query block stages); slots + spread (at most 1024) thread blocks, then with a projection
    // rows*heads query blocks writing q_formed [rows, heads*hd] from qk's query heads (q_stride
    // apart) and q_norm [hd].
    launched(prep, unsafe { b.launch(cfg) })?;
    let q: &CudaSlice<f32> = match (&q_formed, &query) {
        (Some(q_formed), _) => q_formed,
        (None, IndexerQuery::Ready { q, .. }) => q,
        (None, IndexerQuery::Projection { .. }) => unreachable!("formed above"),
    };

    // 2. The order keys of the scores of every complete block for every sparse row, and the
    //    rows' histograms.
    let score = "indexer_select_score_f32";
    let groups = rows.div_ceil(SCORE_ROWS);
    let f = cx.function(FILE, score)?;
    let cfg = LaunchConfig {
        grid_dim: (
            blocks.div_ceil(IDX_TILE).clamp(1, SCORE_BLOCKS) as u32,
            groups.min(65_535) as u32,
            1,
        ),
        block_dim: (32 * heads.min(8) as u32, 1, 1),
        shared_mem_bytes: score_shared as u32,
    };
    let (heads32, group32) = (heads as i32, SCORE_ROWS as i32);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *work)
        .arg(q)
        .arg(&*pooled)
        .arg(step)
        .arg(&r64)
        .arg(&heads32)
        .arg(&hd32)
        .arg(&block32)
        .arg(&keep32)
        .arg(&blocks64)
        .arg(&group32);
    // SAFETY: work holds indexer_work_len(rows, blocks) words (its counters zeroed by launch 1,
    // in stream order), q rows*heads*hd floats, pooled `blocks` rows of hd (16-byte aligned rows
    // when hd is a multiple of 4: the float4 path); the kernel scores blocks below `blocks`
    // only; the dynamic shared memory is the tile, the partial sums and a chain's queries
    // (score_shared bytes).
    launched(score, unsafe { b.launch(cfg) })?;

    // 3. Top-k per row into the selection.
    let topk = "indexer_select_topk_f32";
    let mut sel = cx.output::<i32>(rows * (2 + keep), topk)?;
    let f = cx.function(FILE, topk)?;
    let cfg = LaunchConfig {
        grid_dim: (
            blocks.div_ceil(IDX_CHUNK).max(1) as u32,
            rows.min(65_535) as u32,
            1,
        ),
        block_dim: (IDX_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *sel)
        .arg(&mut *work)
        .arg(step)
        .arg(&r64)
        .arg(&block32)
        .arg(&keep32)
        .arg(&blocks64);
    // SAFETY: sel holds rows*(2+keep) ints, work indexer_work_len(rows, blocks) words written by
    // launches 1 and 2 (in stream order); each row reads its keys below min(complete, blocks),
    // written by launch 2 for every sparse row, and at most IDX_LIST candidates.
    launched(topk, unsafe { b.launch(cfg) })?;
    Ok(sel)
}
