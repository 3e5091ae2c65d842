//! The row gathers (`kernels/embed.cu`; the references `ops::embed`, and `ops::ple::ngram_ids`
//! for the n-gram ids): the token embedding, alone or stored into the hyper-connection streams,
//! and the PLE n-gram lookup with its ids hashed in the same launch.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{arg_matrix, grid_for, launched, shape, DeviceMatrix};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;

const FILE: &str = "embed.cu";

/// Gathers rows of `table [rows, d]` for each id.
pub fn embed(
    cx: &Launch,
    ids: &CudaSlice<i64>,
    table: &DeviceMatrix,
    d: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = table.kernel("embed_reference");
    let kernel = kernel_name.as_str();
    shape(kernel, d > 0 && table.len().is_multiple_of(d), || {
        format!("table of {} values is not rows of {d}", table.len())
    })?;
    let f = cx.function(FILE, kernel)?;
    let count = ids.len();
    let mut y = cx.output::<f32>(count * d, kernel)?;
    let (c64, d64) = (count as i64, d as i64);
    let cfg = grid_for(count * d, 256);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(ids);
    arg_matrix(&mut b, table);
    b.arg(&c64).arg(&d64);
    // SAFETY: ids are in range (checked by callers: tokens by the session, n-gram ids by
    // construction); y holds count*d floats.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// [`embed`] then `layout::repeat_streams` in one launch (`Op::EmbedStreams`): for each of the
/// `rows` rows of `ids [rows, n]`, its `n` rows of `table [.., d]` copied into each of `streams`
/// streams → `[rows, streams*n*d]`.
pub fn embed_streams(
    cx: &Launch,
    ids: &CudaSlice<i64>,
    rows: usize,
    table: &DeviceMatrix,
    d: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = table.kernel("embed_streams_reference");
    let kernel = kernel_name.as_str();
    shape(
        kernel,
        d > 0
            && table.len().is_multiple_of(d)
            && rows > 0
            && !ids.is_empty()
            && ids.len().is_multiple_of(rows)
            && streams > 0,
        || {
            format!(
                "table of {} values in rows of {d}; {} ids for {rows} rows; {streams} streams",
                table.len(),
                ids.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let count = ids.len();
    let mut y = cx.output::<f32>(count * d * streams, kernel)?;
    let (r64, n64, d64, s64) = (rows as i64, (count / rows) as i64, d as i64, streams as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(ids);
    arg_matrix(&mut b, table);
    b.arg(&r64).arg(&n64).arg(&d64).arg(&s64);
    // SAFETY: ids are in range (tokens checked by the session); a thread per gathered value
    // (count*d of them) writes its `streams` copies inside y's count*d*streams floats.
    launched(kernel, unsafe { b.launch(grid_for(count * d, 256)) })?;
    Ok(y)
}

/// A PLE layer's n-gram hashing (`ops::ple::ngram_ids`): eos, the n-gram order, heads per order
/// and the hash table on the device (multipliers `[ngram]`, sizes and offsets
/// `[(ngram-1)·heads_per_ngram]`; sizes non-zero, the loader's primes).
pub struct NgramHash<'a> {
    pub eos: i64,
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub multipliers: &'a CudaSlice<i64>,
    pub sizes: &'a CudaSlice<i64>,
    pub offsets: &'a CudaSlice<i64>,
}

/// The largest n-gram order the kernels take (`NGRAM_MAX_CTX` + 1 history tokens in
/// kernels/ngram.cuh, which they hold in shared memory).
const NGRAM_MAX: usize = 64;

impl NgramHash<'_> {
    /// Checks `tokens [rows]`, `history [ngram-1]` and the hash table's lengths for `kernel`;
    /// returns the ids a token hashes, `(ngram-1)·heads_per_ngram`.
    pub(crate) fn check(
        &self,
        kernel: &str,
        tokens: &CudaSlice<i64>,
        history: &CudaSlice<i64>,
    ) -> Result<usize, CudaError> {
        let (rows, ngram, hpn) = (tokens.len(), self.ngram, self.heads_per_ngram);
        shape(
            kernel,
            rows > 0 && (2..=NGRAM_MAX).contains(&ngram) && hpn > 0,
            || format!("{rows} tokens, ngram {ngram} (2..={NGRAM_MAX}), {hpn} heads per n-gram"),
        )?;
        let ctx = ngram - 1;
        let heads = ctx * hpn;
        shape(
            kernel,
            history.len() == ctx
                && self.multipliers.len() == ngram
                && self.sizes.len() == heads
                && self.offsets.len() == heads,
            || {
                format!(
                    "history {} (want {ctx}), multipliers {} (want {ngram}), sizes {} and offsets \
                     {} (want {heads})",
                    history.len(),
                    self.multipliers.len(),
                    self.sizes.len(),
                    self.offsets.len()
                )
            },
        )?;
        Ok(heads)
    }
}

/// Threads of a `ple_embed` block (`PLE_EMBED_THREADS`: its shared ids are sized by it).
const PLE_EMBED_THREADS: u32 = 256;

/// The PLE n-gram ids of `tokens [rows]` and their rows of `table [.., d]` in one launch
/// (`Op::PleEmbed`): `ops::ple::ngram_ids` (with `history [ngram-1]` replaced in place by the
/// last ngram-1 tokens of history ++ tokens) then [`embed`], the ids never stored →
/// `[rows, (ngram-1)·heads_per_ngram·d]`. Every block hashes the ids of its own values; the last
/// block to arrive at an arrival counter ([`Gpu::counters`]), once every block has copied the
/// old history, writes the new one (kernels/embed.cu says why that is race-free). With the
/// tokens ready before the node ahead has finished ([`Launch::take_ready_inputs`]) the blocks hash
/// and gather before their wait.
pub fn ple_embed(
    cx: &Launch,
    tokens: &CudaSlice<i64>,
    history: &mut CudaSlice<i64>,
    hash: &NgramHash<'_>,
    table: &DeviceMatrix,
    d: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = table.kernel("ple_embed");
    let kernel = kernel_name.as_str();
    let heads = hash.check(kernel, tokens, history)?;
    shape(kernel, d > 0 && table.len().is_multiple_of(d), || {
        format!("a table of {} values in rows of {d}", table.len())
    })?;
    let rows = tokens.len();
    let ready = cx.take_ready_inputs().all(&[0]) as i32;
    let f = cx.function(FILE, kernel)?;
    let n = rows * heads * d;
    let mut y = cx.output::<f32>(n, kernel)?;
    // A word of its own among the device's arrival counters (at 0 between launches).
    let arrivals = cx.counters() + 4 * (cx.counter_count() as u64 - 1);
    let (r64, d64) = (rows as i64, d as i64);
    let (n32, h32) = (hash.ngram as i32, hash.heads_per_ngram as i32);
    let cfg = LaunchConfig {
        block_dim: (PLE_EMBED_THREADS, 1, 1),
        ..grid_for(n, PLE_EMBED_THREADS)
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(history).arg(&arrivals).arg(tokens);
    arg_matrix(&mut b, table);
    b.arg(&r64)
        .arg(&d64)
        .arg(&hash.eos)
        .arg(&n32)
        .arg(&h32)
        .arg(hash.multipliers)
        .arg(hash.sizes)
        .arg(hash.offsets)
        .arg(&ready);
    // SAFETY: every length was checked above against rows, ngram, heads_per_ngram and d; the
    // ids are in the table by construction (each head's offset + a remainder of its size, as the
    // unfused gather trusts); y holds rows*heads*d floats, written a value a thread; the history
    // is written by one block, after every block has read it (kernels/embed.cu).
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}
