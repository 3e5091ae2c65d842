//! Linear layers: `y = x · Wᵀ` with f32 activations over f32 or bf16 weights, by step size —
//! one token (decode: a warp per row, or a block per few rows), a few tokens (a warp per row,
//! up to 8 tokens a pass), many (shared-memory tiles; tensor-core tiles for bf16) — and the
//! decode projection fused with its residual write (`linear_hc_write`).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{grid_for, launched, shape, warp_grid};
use crate::exec::cuda::device::{Buf, Gpu};
use crate::exec::cuda::error::CudaError;
use crate::exec::cuda::launcher::KernelLaunch;

/// Weights of a linear layer on the device.
pub enum DeviceMatrix {
    F32(CudaSlice<f32>),
    /// bf16 bits.
    Bf16(CudaSlice<u16>),
}

impl DeviceMatrix {
    pub fn len(&self) -> usize {
        match self {
            DeviceMatrix::F32(s) => s.len(),
            DeviceMatrix::Bf16(s) => s.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether both matrices have one element type (a kernel takes one).
    pub fn same_dtype(&self, other: &DeviceMatrix) -> bool {
        matches!(
            (self, other),
            (DeviceMatrix::F32(_), DeviceMatrix::F32(_))
                | (DeviceMatrix::Bf16(_), DeviceMatrix::Bf16(_))
        )
    }

    /// Weights in a 16-byte chunk (the kernels' vector loads, `WeightVec<W>::N`): 4 f32 or 8
    /// bf16.
    pub fn chunk_len(&self) -> usize {
        match self {
            DeviceMatrix::F32(_) => 4,
            DeviceMatrix::Bf16(_) => 8,
        }
    }

    /// Bytes the matrix takes on the device.
    pub fn bytes(&self) -> usize {
        match self {
            DeviceMatrix::F32(s) => s.len() * 4,
            DeviceMatrix::Bf16(s) => s.len() * 2,
        }
    }

    /// The matrix's device address (alignment checks of the launchers that pick a kernel by it).
    pub fn device_address(&self, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> u64 {
        use cudarc::driver::DevicePtr as _;
        match self {
            DeviceMatrix::F32(s) => s.device_ptr(stream).0,
            DeviceMatrix::Bf16(s) => s.device_ptr(stream).0,
        }
    }

    /// The name of `base`'s kernel for this element type: `<base>_f32` or `<base>_bf16`.
    pub fn kernel(&self, base: &str) -> String {
        match self {
            DeviceMatrix::F32(_) => format!("{base}_f32"),
            DeviceMatrix::Bf16(_) => format!("{base}_bf16"),
        }
    }
}

/// Pushes a weight matrix as the next kernel argument, whatever its element type.
pub(crate) fn arg_matrix(b: &mut KernelLaunch<'_>, m: &DeviceMatrix) {
    match m {
        DeviceMatrix::F32(s) => b.arg(s),
        DeviceMatrix::Bf16(s) => b.arg(s),
    };
}

/// The shared shape check of the linear launchers: `x [tokens, k]`, `W [n, k]`, and `more`.
fn check_xw(
    kernel: &str,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
    more: bool,
) -> Result<(), CudaError> {
    shape(
        kernel,
        x.len() == tokens * k && w.len() == n * k && more,
        || {
            format!(
                "x {} values for {tokens}x{k}, weight {} values for {n}x{k}",
                x.len(),
                w.len()
            )
        },
    )
}

/// How a one-token (decode) linear layer spreads its matrix over the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneToken {
    /// A warp per output row (`linear_rows1`, `linear_hc_write1`): few, long warps.
    WarpPerRow,
    /// A block per `rows` consecutive rows, every thread along k with `loads` chunks of each row
    /// in flight (`linear_group1_g{rows}u{loads}`, `linear_hc_write_group1_g{rows}u{loads}`):
    /// many short blocks, so the last wave is not a partial one.
    Group { rows: usize, loads: usize },
    /// A warp per output row by a persistent grid of two blocks a multiprocessor, each warp
    /// holding its row's chunks (up to [`WHOLE_ROW_CHUNKS`] a lane) and loading its next row
    /// before the products of the one it holds (`linear_rows1_stream`). Plain linears only
    /// ([`OneToken::LINEAR_ONLY`]).
    Streamed,
}

/// The most 16-byte chunks of a row a lane holds in the streamed kernels (WHOLE_ROW_CHUNKS in
/// kernels/linear.cu).
pub const WHOLE_ROW_CHUNKS: usize = 10;

/// Resident blocks a multiprocessor `linear_rows1_stream` is built for (its launch bounds).
const STREAM_BLOCKS_PER_SM: usize = 2;

/// The (rows, loads) pairs compiled in kernels/linear.cu (`GROUP_KERNELS`).
const GROUPS: [(usize, usize); 3] = [(1, 4), (2, 2), (4, 1)];

const fn group(rows: usize, loads: usize) -> OneToken {
    OneToken::Group { rows, loads }
}

impl OneToken {
    /// Every variant, for the benchmark's sweep and the GPU tests.
    pub const ALL: [OneToken; 4] = [OneToken::WarpPerRow, group(1, 4), group(2, 2), group(4, 1)];

    /// The variants only plain linears have (no `linear_hc_write` form).
    pub const LINEAR_ONLY: [OneToken; 1] = [OneToken::Streamed];

    /// Whether the variant takes rows of `k` weights of `chunk_len` to a 16-byte chunk (the
    /// streamed kernels hold a lane's chunks of a row in registers).
    pub fn fits(self, k: usize, chunk_len: usize) -> bool {
        match self {
            OneToken::Streamed => {
                chunk_len > 0
                    && k.is_multiple_of(chunk_len)
                    && k / chunk_len <= 32 * WHOLE_ROW_CHUNKS
            }
            _ => true,
        }
    }

    /// Whether the variant takes x [k] and w: [`OneToken::fits`], and for the streamed kernels,
    /// which load both in chunks with no scalar path, both 16-byte aligned.
    pub fn takes(self, gpu: &Gpu, x: &CudaSlice<f32>, w: &DeviceMatrix) -> bool {
        use cudarc::driver::DevicePtr as _;
        let aligned = || {
            x.device_ptr(&gpu.stream).0.is_multiple_of(16)
                && w.device_address(&gpu.stream).is_multiple_of(16)
        };
        self.fits(x.len(), w.chunk_len()) && (self != OneToken::Streamed || aligned())
    }

    pub fn name(self) -> String {
        match self {
            OneToken::WarpPerRow => "warp_per_row".into(),
            OneToken::Streamed => "streamed".into(),
            OneToken::Group { rows, loads } => format!("group{rows}x{loads}"),
        }
    }

    /// The variant a shape gets, from the sweep on the H200 (`graphrun bench --sweep-linear`,
    /// results/2026-11-30-bench-sweep-linear.log; µs per launch, back to back):
    /// - k < 1024 (the shared expert's 640->2560): a warp per row (2.9 µs; groups 3.9-6.1), a
    ///   row is too short to share over a block;
    /// - k ≥ 4096 (the output projections 6144->2560): 4 rows a block (12.8 µs; a warp per row
    ///   15.5: 2560 warps fill a third of the GPU);
    /// - up to 512 rows (GDN's b and a, the router): a block per row (1.7, 2.5 µs; a warp per row
    ///   3.7, 4.3);
    /// - up to 4096 rows (2560->640, 2560->2560): 2 rows a block (3.0, 6.5 µs; a warp per row
    ///   4.4, 7.9);
    /// - up to 8192 rows (GDN's z, 2560->6144): a warp per row (12.1 µs; 2 rows a block 12.3):
    ///   its 768 blocks of 8 warps are one wave;
    /// - up to 65536 rows (GDN's qkv 2560->10240, QSA's q+gate 2560->12288): 2 rows a block
    ///   (18.9, 22.2 µs; a warp per row 20.6, 23.6, whose 1280 and 1536 blocks leave a partial
    ///   second wave);
    /// - more (the lm head, 2560->248320): the streamed grid where a lane holds its share of a
    ///   row (297.5 µs, 1.00 of the copy bandwidth, against a pure read of its bytes 281; a warp
    ///   per row 319, a warp per row with its whole row in flight 315 (not kept), 4 rows a block 316:
    ///   results/2026-12-01-session14-lm-head-sweep.log; its weights since loaded past L1, 288.7:
    ///   results/2026-12-01-session14-stream-trials.log), else a warp per row.
    pub fn for_shape(n: usize, k: usize, chunk_len: usize) -> OneToken {
        match (n, k) {
            (n, k) if n > 65_536 && OneToken::Streamed.fits(k, chunk_len) => OneToken::Streamed,
            (_, k) if k < 1024 => OneToken::WarpPerRow,
            (_, k) if k >= 4096 => group(4, 1),
            (n, _) if n <= 512 => group(1, 4),
            (n, _) if n <= 4096 => group(2, 2),
            (n, _) if n <= 8192 => OneToken::WarpPerRow,
            (n, _) if n <= 65_536 => group(2, 2),
            _ => OneToken::WarpPerRow,
        }
    }

    /// The kernel: `<warp>_<dtype>` for a warp per row, `<group>_g<G>_<dtype>` for a group.
    fn kernel(self, warp: &str, group: &str, w: &DeviceMatrix) -> String {
        match self {
            OneToken::WarpPerRow => w.kernel(warp),
            OneToken::Group { rows, loads } => w.kernel(&format!("{group}_g{rows}u{loads}")),
            OneToken::Streamed => w.kernel(&format!("{warp}_stream")),
        }
    }

    /// A block of 256 threads: a warp per row, or G rows per block; the streamed grid as many
    /// blocks as are resident at once (fewer for short matrices).
    fn grid(self, n: usize, multiprocessors: usize) -> LaunchConfig {
        match self {
            OneToken::WarpPerRow => warp_grid(n),
            OneToken::Streamed => {
                let mut cfg = warp_grid(n);
                cfg.grid_dim.0 = cfg
                    .grid_dim
                    .0
                    .min((multiprocessors * STREAM_BLOCKS_PER_SM) as u32);
                cfg
            }
            OneToken::Group { rows, .. } => LaunchConfig {
                grid_dim: (n.div_ceil(rows).clamp(1, 65_535 * 8) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
        }
    }

    fn check(self, kernel: &str) -> Result<(), CudaError> {
        shape(
            kernel,
            match self {
                OneToken::WarpPerRow | OneToken::Streamed => true,
                OneToken::Group { rows, loads } => GROUPS.contains(&(rows, loads)),
            },
            || format!("no one-token variant {self:?}"),
        )
    }
}

/// `y = x · Wᵀ` for `tokens` rows of `x [tokens, k]`, `W [n, k]`: one warp per output row, all
/// tokens in the same warp (up to 8 a pass); one token takes [`OneToken::for_shape`].
pub fn linear_rows(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
) -> Result<Buf<f32>, CudaError> {
    if tokens == 1 {
        return linear_one_token(gpu, x, w, k, n, OneToken::for_shape(n, k, w.chunk_len()));
    }
    let kernel_name = w.kernel("linear_rows");
    let kernel = kernel_name.as_str();
    check_xw(kernel, x, w, tokens, k, n, tokens > 0)?;
    let f = gpu.function("linear.cu", kernel)?;
    let mut y = gpu.output::<f32>(tokens * n, kernel)?;
    let (t32, k64, n64) = (tokens as i32, k as i64, n as i64);
    let mut b = gpu.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    b.arg(&t32).arg(&k64).arg(&n64);
    // SAFETY: the shapes were checked above; 16-byte loads are used only when k allows and
    // cudarc's allocations are 256-byte aligned.
    launched(kernel, unsafe {
        b.launch(OneToken::WarpPerRow.grid(n, gpu.multiprocessors))
    })?;
    Ok(y)
}

/// `y = x · Wᵀ` for one token, `x [k]`, `W [n, k]`, with the given variant.
pub fn linear_one_token(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    k: usize,
    n: usize,
    variant: OneToken,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = variant.kernel("linear_rows1", "linear_group1", w);
    let kernel = kernel_name.as_str();
    variant.check(kernel)?;
    shape(
        kernel,
        x.len() == k && w.len() == n * k && n > 0 && variant.takes(gpu, x, w),
        || {
            format!(
                "x {} values for one token of {k}, weight {} values for {n}x{k} (streamed: rows of at most {} 16-byte chunks a lane, 16-byte aligned)",
                x.len(),
                w.len(),
                WHOLE_ROW_CHUNKS
            )
        },
    )?;
    let f = gpu.function("linear.cu", kernel)?;
    let mut y = gpu.output::<f32>(n, kernel)?;
    let (t32, k64, n64) = (1i32, k as i64, n as i64);
    let mut b = gpu.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    if variant == OneToken::WarpPerRow {
        b.arg(&t32);
    }
    b.arg(&k64).arg(&n64);
    // SAFETY: the shapes were checked above; 16-byte loads only where k and the addresses allow
    // (the streamed kernel: k a multiple of the chunk and both addresses, checked by `takes`).
    launched(kernel, unsafe {
        b.launch(variant.grid(n, gpu.multiprocessors))
    })?;
    Ok(y)
}

/// `h + inj ⊗ (x·Wᵀ)` (`ops::linear::linear_hc_write`): `x [tokens, k]`, `W [n, k]`,
/// `h [tokens, streams*n]`, `inj [tokens, streams]`; a warp per output row, whose epilogue
/// writes the `streams` residual values. Up to 8 tokens a pass (a decode-sized fusion); one
/// token takes [`OneToken::for_shape`].
pub fn linear_hc_write(
    gpu: &Gpu,
    h: &CudaSlice<f32>,
    inj: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let k = x.len().checked_div(tokens).unwrap_or(0);
    let n = w.len().checked_div(k).unwrap_or(0);
    // The streamed kernel has no residual-write form: a warp per row in its place.
    let variant = (tokens == 1).then(|| match OneToken::for_shape(n, k, w.chunk_len()) {
        v if OneToken::LINEAR_ONLY.contains(&v) => OneToken::WarpPerRow,
        v => v,
    });
    linear_hc_write_with(gpu, h, inj, x, w, tokens, streams, variant)
}

/// As [`linear_hc_write`], one token with the given variant (`None`: the multi-token kernel).
#[allow(clippy::too_many_arguments)]
pub fn linear_hc_write_with(
    gpu: &Gpu,
    h: &CudaSlice<f32>,
    inj: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    streams: usize,
    one_token: Option<OneToken>,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = match one_token {
        Some(v) => v.kernel("linear_hc_write1", "linear_hc_write_group1", w),
        None => w.kernel("linear_hc_write_reference"),
    };
    let kernel = kernel_name.as_str();
    if let Some(v) = one_token {
        v.check(kernel)?;
        shape(kernel, !OneToken::LINEAR_ONLY.contains(&v), || {
            format!("no residual-write form of the one-token variant {v:?}")
        })?;
    }
    let k = x.len().checked_div(tokens).unwrap_or(0);
    let n = w.len().checked_div(k).unwrap_or(0);
    shape(
        kernel,
        tokens > 0
            && (one_token.is_none() || tokens == 1)
            && streams > 0
            && k > 0
            && n > 0
            && x.len() == tokens * k
            && w.len() == n * k
            && h.len() == tokens * streams * n
            && inj.len() == tokens * streams
            && streams <= i32::MAX as usize,
        || {
            format!(
                "h {} values, inj {}, x {} for {tokens} tokens of {streams} streams, weight {} values",
                h.len(),
                inj.len(),
                x.len(),
                w.len()
            )
        },
    )?;
    let f = gpu.function("linear.cu", kernel)?;
    let mut y = gpu.output::<f32>(h.len(), kernel)?;
    let (t32, k64, n64, s32) = (tokens as i32, k as i64, n as i64, streams as i32);
    let mut b = gpu.launch_builder(&f);
    b.arg(&mut *y).arg(h).arg(inj).arg(x);
    arg_matrix(&mut b, w);
    if !matches!(one_token, Some(OneToken::Group { .. })) {
        b.arg(&t32);
    }
    b.arg(&k64).arg(&n64).arg(&s32);
    // SAFETY: every size was checked above; the kernel writes each of the tokens*streams*n
    // outputs once and uses 16-byte loads only when k and the addresses allow.
    launched(kernel, unsafe {
        b.launch(
            one_token
                .unwrap_or(OneToken::WarpPerRow)
                .grid(n, gpu.multiprocessors),
        )
    })?;
    Ok(y)
}

/// `y = x · Wᵀ` for many tokens: shared-memory tiles of 64 tokens x 64 outputs.
pub fn linear_tiled(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = w.kernel("linear_tiled");
    let kernel = kernel_name.as_str();
    check_xw(kernel, x, w, tokens, k, n, tokens > 0 && n > 0)?;
    shape(
        kernel,
        n.div_ceil(64) < 1 << 31 && tokens.div_ceil(64) < 65_536,
        || format!("{tokens}x{n} is too large a grid"),
    )?;
    let f = gpu.function("linear.cu", kernel)?;
    let mut y = gpu.output::<f32>(tokens * n, kernel)?;
    let (t64, k64, n64) = (tokens as i64, k as i64, n as i64);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(64) as u32, tokens.div_ceil(64) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    b.arg(&t64).arg(&k64).arg(&n64);
    // SAFETY: shapes checked above; every load and store is bounds-checked in the kernel.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// The tensor-core tile of [`linear_mma_with`]: tokens x outputs a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaTile {
    /// 64 x 64, 4 warps (`linear_mma64_bf16`; the `mma` variant).
    T64,
    /// 64 x 128, 8 warps (`linear_mma_wide_bf16`; the `mma_wide` variant): each staged
    /// activation tile serves twice the outputs.
    Wide,
}

impl MmaTile {
    pub const ALL: [MmaTile; 2] = [MmaTile::T64, MmaTile::Wide];

    /// Kernel, tokens and outputs a block, threads, blocks a multiprocessor holds at once (the
    /// registers decide: ptxas gives both kernels ~128 a thread).
    fn geometry(self) -> (&'static str, usize, usize, u32, usize) {
        match self {
            MmaTile::T64 => ("linear_mma64_bf16", 64, 64, 128, 4),
            MmaTile::Wide => ("linear_mma_wide_bf16", 64, 128, 256, 2),
        }
    }
}

/// Most runs of k one tensor-core product is split into.
const MAX_K_SPLITS: usize = 8;
/// k a tensor-core tile takes a stage (`MMA_BK` in kernels/mma.cuh): split k runs are whole
/// stages, so each starts 16-byte aligned.
const MMA_BK: usize = 32;
/// Fewest stages of k a split keeps (shorter runs spend more on the tile's start and
/// its stores than they save).
const MIN_SPLIT_STAGES: usize = 8;

/// How many runs of k [`linear_mma_with`] splits `tokens x n` (k deep) into: where the tiles
/// alone fill less than one round of the device's resident blocks (a narrow product over a long
/// k: the hyper-connection mix's 10240 -> 320, GDN's 2560 -> 48 gates, the router), enough
/// runs that the tiles times the runs still fit in one round, each at least
/// [`MIN_SPLIT_STAGES`] deep; 1 otherwise.
pub fn mma_k_splits(
    multiprocessors: usize,
    tile: MmaTile,
    tokens: usize,
    k: usize,
    n: usize,
) -> usize {
    let (_, bm, bn, _, per_sm) = tile.geometry();
    let tiles = tokens.div_ceil(bm) * n.div_ceil(bn);
    let stages = k.div_ceil(MMA_BK);
    let wanted = (multiprocessors * per_sm) / tiles.max(1);
    let splits = wanted
        .min(MAX_K_SPLITS)
        .min(stages / MIN_SPLIT_STAGES)
        .max(1);
    // Runs of ceil(stages / splits) stages: as many as that takes, so none is empty.
    stages.div_ceil(stages.div_ceil(splits))
}

/// `y = x · Wᵀ` for many tokens on the tensor cores (bf16 `mma.sync`, x split into bf16 hi + lo
/// so that the result keeps f32 accuracy), in tiles of 64 tokens x 64 outputs. f32 weights, `k`
/// not a multiple of 8 or unaligned buffers: [`linear_tiled`].
pub fn linear_mma(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
) -> Result<Buf<f32>, CudaError> {
    linear_mma_with(gpu, x, w, tokens, k, n, MmaTile::T64)
}

/// [`linear_mma`] in the given tile.
pub fn linear_mma_with(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
    tile: MmaTile,
) -> Result<Buf<f32>, CudaError> {
    use cudarc::driver::DevicePtr as _;
    let DeviceMatrix::Bf16(bits) = w else {
        return linear_tiled(gpu, x, w, tokens, k, n);
    };
    let aligned = x.device_ptr(&gpu.stream).0 % 16 == 0 && bits.device_ptr(&gpu.stream).0 % 16 == 0;
    if !k.is_multiple_of(8) || !aligned {
        return linear_tiled(gpu, x, w, tokens, k, n);
    }
    let (kernel, bm, bn, threads, _) = tile.geometry();
    check_xw(kernel, x, w, tokens, k, n, tokens > 0 && n > 0 && k > 0)?;
    shape(
        kernel,
        tokens.div_ceil(bm) < 1 << 31 && n.div_ceil(bn) < 65_536,
        || format!("{tokens}x{n} is too large a grid"),
    )?;
    let splits = mma_k_splits(gpu.multiprocessors, tile, tokens, k, n);
    let f = gpu.function("linear.cu", kernel)?;
    let mut y = gpu.output::<f32>(tokens * n, kernel)?;
    let mut parts = if splits > 1 {
        Some(gpu.scratch::<f32>(splits * tokens * n, "split-k partial products")?)
    } else {
        None
    };
    let (t64, k64, n64) = (tokens as i64, k as i64, n as i64);
    let cfg = LaunchConfig {
        grid_dim: (
            tokens.div_ceil(bm) as u32,
            n.div_ceil(bn) as u32,
            splits as u32,
        ),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = gpu.launch_builder(&f);
    match parts.as_mut() {
        Some(p) => b.arg(&mut **p),
        None => b.arg(&mut *y),
    };
    b.arg(x).arg(bits);
    b.arg(&t64).arg(&k64).arg(&n64);
    // SAFETY: shapes checked above; k % 8 == 0 and both inputs 16-byte aligned (the kernel's
    // 16-byte loads; each split starts at a multiple of 32 of k); every load and store past T,
    // n or k is masked in the kernel; with splits, block z writes the z-th T*n of `parts`, and
    // mma_k_splits leaves no split without k.
    launched(kernel, unsafe { b.launch(cfg) })?;
    if let Some(parts) = parts {
        let sum = "linear_split_sum_f32";
        let f = gpu.function("linear.cu", sum)?;
        let (count, s32) = ((tokens * n) as i64, splits as i32);
        let mut b = gpu.launch_builder(&f);
        b.arg(&mut *y).arg(&*parts).arg(&count).arg(&s32);
        // SAFETY: parts holds splits x T*n values, all written by the launch above; y T*n.
        launched(sum, unsafe { b.launch(grid_for(tokens * n, 256)) })?;
    }
    Ok(y)
}

/// Most matrices one `linear_parts1` launch takes (`GROUP_PARTS` in kernels/linear.cu).
pub const MAX_PARTS: usize = 4;

/// Sibling linear layers over one input (`Op::LinearGroup`): `x [tokens, k]`, `W_p [n_p, k]`
/// → `x·W_pᵀ`, in part order. One token: one launch for all parts (`linear_parts1`, 2 rows a
/// block); more tokens: each part as [`linear_rows`].
pub fn linear_group(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    ws: &[&DeviceMatrix],
    tokens: usize,
) -> Result<Vec<Buf<f32>>, CudaError> {
    linear_group_with(gpu, x, ws, tokens, GroupKernel::for_group(gpu, x, ws))
}

/// How a one-token group spreads its rows (`linear_group_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKernel {
    /// A block per 2 rows of a part (`linear_parts1`).
    Blocks,
    /// The parts' rows end to end, streamed by a persistent grid as [`OneToken::Streamed`]
    /// streams one matrix (`linear_parts1_stream`): rows of at most [`WHOLE_ROW_CHUNKS`]
    /// chunks a lane.
    Streamed,
}

impl GroupKernel {
    /// Whether the kernel takes x and every part: by blocks any; streamed where
    /// [`OneToken::Streamed`] takes each part.
    pub fn takes(self, gpu: &Gpu, x: &CudaSlice<f32>, ws: &[&DeviceMatrix]) -> bool {
        self == GroupKernel::Blocks || ws.iter().all(|w| OneToken::Streamed.takes(gpu, x, w))
    }

    /// Streamed wherever a lane holds its share of a row (rows of up to 2560 bf16 weights, 16-byte
    /// aligned), else by blocks. From the sweep on the H200 (`graphrun bench --sweep-linear`,
    /// results/2026-12-01-session14-streamed-groups.log; µs per launch, back to back): GDN's
    /// 2560 -> 10240+6144+48+48 22.8 against 24.0, QSA's 2560 -> 12288+512+512+640 19.7 against
    /// 20.7, 2560 -> 10240+2560 18.8 against 19.0; segments 1.165 / 1.166 against 1.168 / 1.175 ms
    /// at 8 layers, 8k, in the same call.
    pub fn for_group(gpu: &Gpu, x: &CudaSlice<f32>, ws: &[&DeviceMatrix]) -> GroupKernel {
        if !ws.is_empty() && GroupKernel::Streamed.takes(gpu, x, ws) {
            GroupKernel::Streamed
        } else {
            GroupKernel::Blocks
        }
    }
}

/// As [`linear_group`], one token with the given kernel.
pub fn linear_group_with(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    ws: &[&DeviceMatrix],
    tokens: usize,
    how: GroupKernel,
) -> Result<Vec<Buf<f32>>, CudaError> {
    let k = x.len().checked_div(tokens).unwrap_or(0);
    let ns: Vec<usize> = ws
        .iter()
        .map(|w| w.len().checked_div(k).unwrap_or(0))
        .collect();
    if tokens != 1 {
        return ws
            .iter()
            .zip(&ns)
            .map(|(w, &n)| linear_rows(gpu, x, w, tokens, k, n))
            .collect();
    }
    let first = ws.first().copied();
    let base = match how {
        GroupKernel::Blocks => "linear_parts1",
        GroupKernel::Streamed => "linear_parts1_stream",
    };
    let kernel_name = first.map_or(base.into(), |w| w.kernel(base));
    let kernel = kernel_name.as_str();
    let same_dtype = ws.iter().all(|w| first.is_some_and(|f| f.same_dtype(w)));
    shape(
        kernel,
        (1..=MAX_PARTS).contains(&ws.len())
            && how.takes(gpu, x, ws)
            && same_dtype
            && k > 0
            && x.len() == k
            && ws.iter().zip(&ns).all(|(w, &n)| n > 0 && w.len() == n * k),
        || {
            format!(
                "x {} values, {} weights of {:?} values (want 1 to {MAX_PARTS} matrices [n, {k}] of one type; streamed: rows of at most {WHOLE_ROW_CHUNKS} 16-byte chunks a lane, 16-byte aligned)",
                x.len(),
                ws.len(),
                ws.iter().map(|w| w.len()).collect::<Vec<_>>()
            )
        },
    )?;
    let blocks: usize = ns.iter().map(|n| n.div_ceil(2)).sum();
    shape(kernel, blocks <= 65_535 * 8, || {
        format!("{blocks} blocks is too large a grid")
    })?;
    let f = gpu.function("linear.cu", kernel)?;
    let mut ys = Vec::with_capacity(ws.len());
    for &n in &ns {
        ys.push(gpu.output::<f32>(n, kernel)?);
    }
    let mut b = gpu.launch_builder(&f);
    // Absent parts repeat part 0's pointers with no rows (never read or written).
    let last = ys.len() - 1;
    for p in 0..MAX_PARTS {
        b.arg(&*ys[p.min(last)]);
    }
    b.arg(x);
    for p in 0..MAX_PARTS {
        arg_matrix(&mut b, ws[p.min(ws.len() - 1)]);
    }
    let n64: Vec<i64> = (0..MAX_PARTS)
        .map(|p| ns.get(p).map_or(0, |&n| n as i64))
        .collect();
    for n in &n64 {
        b.arg(n);
    }
    let (parts32, k64) = (ws.len() as i32, k as i64);
    b.arg(&parts32).arg(&k64);
    let cfg = match how {
        GroupKernel::Blocks => LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
        GroupKernel::Streamed => OneToken::Streamed.grid(ns.iter().sum(), gpu.multiprocessors),
    };
    // SAFETY: every part's shape was checked above; the kernel gives part p ceil(n_p / 2)
    // blocks (or streams the parts' rows end to end, each once) and writes its n_p outputs;
    // parts past `parts` have no rows.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(ys)
}

/// The MoE block's end (`ops::linear::moe_shared_write`): `h + inj ⊗ (a + sigmoid(x·wgᵀ) *
/// (s·Wdᵀ))` with `h [T, C*H]`, `inj [T, C]`, `x, a [T, H]`, `s [T, I]`, `Wd [H, I]`,
/// `wg [H]`; a warp per output row of Wd, a grid row per token.
#[allow(clippy::too_many_arguments)]
pub fn moe_shared_write(
    gpu: &Gpu,
    h: &CudaSlice<f32>,
    inj: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    s: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    wd: &DeviceMatrix,
    wg: &CudaSlice<f32>,
    tokens: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = wd.kernel("moe_shared_write_reference");
    let kernel = kernel_name.as_str();
    let hid = wg.len();
    let inter = s.len().checked_div(tokens).unwrap_or(0);
    shape(
        kernel,
        tokens > 0
            && tokens < 65_536
            && streams > 0
            && streams <= i32::MAX as usize
            && hid > 0
            && inter > 0
            && x.len() == tokens * hid
            && a.len() == tokens * hid
            && s.len() == tokens * inter
            && wd.len() == hid * inter
            && h.len() == tokens * streams * hid
            && inj.len() == tokens * streams,
        || {
            format!(
                "h {}, inj {}, x {}, s {}, a {} values for {tokens} tokens of {streams} streams; \
                 down weight {} values, gate weight {hid}",
                h.len(),
                inj.len(),
                x.len(),
                s.len(),
                a.len(),
                wd.len()
            )
        },
    )?;
    let f = gpu.function("linear.cu", kernel)?;
    let mut y = gpu.output::<f32>(h.len(), kernel)?;
    let (h64, i64_, s32) = (hid as i64, inter as i64, streams as i32);
    // The kernel runs ahead of the node before it (the routed experts, whose output `a` it
    // reads after its wait) when x and s (the node's inputs 2 and 3) are ready.
    let ready = gpu.take_ready_inputs().all(&[2, 3]) as i32;
    let mut b = gpu.launch_builder(&f);
    b.arg(&mut *y).arg(h).arg(inj).arg(x).arg(s).arg(a);
    arg_matrix(&mut b, wd);
    b.arg(wg).arg(&h64).arg(&i64_).arg(&s32).arg(&ready);
    let cfg = LaunchConfig {
        grid_dim: (
            hid.div_ceil(8).clamp(1, 65_535 * 8) as u32,
            tokens as u32,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: every size was checked above; block (r, t) writes the C stream values of its rows
    // of token t; 16-byte loads only where I and the addresses allow.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lm_head_streams_where_a_lane_holds_its_share_of_a_row() {
        // bf16 (8 a chunk): rows of 2560 are 10 chunks a lane, the most the kernels hold.
        assert_eq!(OneToken::for_shape(248_320, 2560, 8), OneToken::Streamed);
        // f32 rows of 2560 (20 chunks a lane) and bf16 rows of 2568 do not fit: a warp per row.
        assert_eq!(OneToken::for_shape(248_320, 2560, 4), OneToken::WarpPerRow);
        assert!(!OneToken::Streamed.fits(2568, 8));
        assert!(!OneToken::Streamed.fits(2564, 4));
        assert!(!OneToken::Streamed.fits(2560, 0));
        assert!(OneToken::Streamed.fits(1280, 4));
        // Smaller matrices keep their variants.
        assert_eq!(OneToken::for_shape(10_240, 2560, 8), group(2, 2));
        assert_eq!(OneToken::for_shape(65_536, 2560, 8), group(2, 2));
        // Rows of no whole number of chunks: not streamed.
        assert!(!OneToken::Streamed.fits(37, 8));
        assert_eq!(OneToken::for_shape(248_320, 37, 8), OneToken::WarpPerRow);
    }
}
