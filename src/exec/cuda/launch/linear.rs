//! Linear layers: `y = x · Wᵀ` with f32 activations over f32 or bf16 weights, by step size —
//! one token (decode: a warp per row, or a block per few rows), a few tokens (a warp per row,
//! up to 8 tokens a pass), many (shared-memory tiles; tensor-core tiles for bf16) — and the
//! decode projection fused with its residual write (`linear_hc_write`).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{grid_for, launched, shape, warp_grid};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
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

pub use crate::registry::cuda::linear::{MmaTile, MAX_PARTS, WHOLE_ROW_CHUNKS};
use crate::registry::cuda::linear::{GROUPS, STREAM_BLOCKS_PER_SM};

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
    pub fn takes(self, cx: &Launch, x: &CudaSlice<f32>, w: &DeviceMatrix) -> bool {
        use cudarc::driver::DevicePtr as _;
        let aligned = || {
            x.device_ptr(&cx.stream).0.is_multiple_of(16)
                && w.device_address(&cx.stream).is_multiple_of(16)
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

    /// The one-token variant a rule names (`rows1`, `group1_g2u2`, `rows1_stream`), as
    /// `registry::cuda::linear` lists them.
    pub fn from_variant(name: &str) -> Option<OneToken> {
        match name {
            "rows1" => Some(OneToken::WarpPerRow),
            "rows1_stream" => Some(OneToken::Streamed),
            _ => GROUPS
                .into_iter()
                .find(|&(r, l)| name == format!("group1_g{r}u{l}"))
                .map(|(rows, loads)| group(rows, loads)),
        }
    }

    /// The name rules give the variant (inverse of [`OneToken::from_variant`]).
    pub fn variant(self) -> String {
        match self {
            OneToken::WarpPerRow => "rows1".into(),
            OneToken::Streamed => "rows1_stream".into(),
            OneToken::Group { rows, loads } => format!("group1_g{rows}u{loads}"),
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
/// tokens in the same warp (up to 8 a pass).
pub fn linear_rows(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = w.kernel("linear_rows");
    let kernel = kernel_name.as_str();
    check_xw(kernel, x, w, tokens, k, n, tokens > 0)?;
    let f = cx.function("linear.cu", kernel)?;
    let mut y = cx.output::<f32>(tokens * n, kernel)?;
    let (t32, k64, n64) = (tokens as i32, k as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    b.arg(&t32).arg(&k64).arg(&n64);
    // SAFETY: the shapes were checked above; 16-byte loads are used only when k allows and
    // cudarc's allocations are 256-byte aligned.
    launched(kernel, unsafe {
        b.launch(OneToken::WarpPerRow.grid(n, cx.multiprocessors))
    })?;
    Ok(y)
}

/// `y = x · Wᵀ` for one token, `x [k]`, `W [n, k]`, with the given variant.
pub fn linear_one_token(
    cx: &Launch,
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
        x.len() == k && w.len() == n * k && n > 0 && variant.takes(cx, x, w),
        || {
            format!(
                "x {} values for one token of {k}, weight {} values for {n}x{k} (streamed: rows of at most {} 16-byte chunks a lane, 16-byte aligned)",
                x.len(),
                w.len(),
                WHOLE_ROW_CHUNKS
            )
        },
    )?;
    let f = cx.function("linear.cu", kernel)?;
    let mut y = cx.output::<f32>(n, kernel)?;
    let (t32, k64, n64) = (1i32, k as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    if variant == OneToken::WarpPerRow {
        b.arg(&t32);
    }
    b.arg(&k64).arg(&n64);
    // SAFETY: the shapes were checked above; 16-byte loads only where k and the addresses allow
    // (the streamed kernel: k a multiple of the chunk and both addresses, checked by `takes`).
    launched(kernel, unsafe {
        b.launch(variant.grid(n, cx.multiprocessors))
    })?;
    Ok(y)
}

/// `h + inj ⊗ (x·Wᵀ)` (`ops::linear::linear_hc_write`): `x [tokens, k]`, `W [n, k]`,
/// `h [tokens, streams*n]`, `inj [tokens, streams]`; one token with the given variant, or
/// (`None`) a warp per output row, up to 8 tokens a pass, whose epilogue writes the `streams`
/// residual values.
#[allow(clippy::too_many_arguments)]
pub fn linear_hc_write(
    cx: &Launch,
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
    let f = cx.function("linear.cu", kernel)?;
    let mut y = cx.output::<f32>(h.len(), kernel)?;
    let (t32, k64, n64, s32) = (tokens as i32, k as i64, n as i64, streams as i32);
    let mut b = cx.launch_builder(&f);
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
                .grid(n, cx.multiprocessors),
        )
    })?;
    Ok(y)
}

/// `y = x · Wᵀ` for many tokens: shared-memory tiles of 64 tokens x 64 outputs.
pub fn linear_tiled(
    cx: &Launch,
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
    let f = cx.function("linear.cu", kernel)?;
    let mut y = cx.output::<f32>(tokens * n, kernel)?;
    let (t64, k64, n64) = (tokens as i64, k as i64, n as i64);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(64) as u32, tokens.div_ceil(64) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    b.arg(&t64).arg(&k64).arg(&n64);
    // SAFETY: shapes checked above; every load and store is bounds-checked in the kernel.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// How many runs of k [`linear_mma_with`] splits `tokens x n` (k deep) into
/// (`MmaTile::k_splits`).
pub fn mma_k_splits(
    multiprocessors: usize,
    tile: MmaTile,
    tokens: usize,
    k: usize,
    n: usize,
) -> usize {
    tile.k_splits(multiprocessors, tokens, k, n)
}

/// `y = x · Wᵀ` for many tokens on the tensor cores (bf16 `mma.sync`, x split into bf16 hi + lo
/// so that the result keeps f32 accuracy), in tiles of 64 tokens x 64 outputs: bf16 weights,
/// `k` a multiple of 8 and 16-byte aligned buffers (an error otherwise).
pub fn linear_mma(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
) -> Result<Buf<f32>, CudaError> {
    linear_mma_with(cx, x, w, tokens, k, n, MmaTile::T64)
}

/// [`linear_mma`] in the given tile.
pub fn linear_mma_with(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    n: usize,
    tile: MmaTile,
) -> Result<Buf<f32>, CudaError> {
    use cudarc::driver::DevicePtr as _;
    let (kernel, bm, bn, threads, _) = tile.geometry();
    let DeviceMatrix::Bf16(bits) = w else {
        return Err(CudaError::Shape {
            kernel: kernel.into(),
            msg: "f32 weights: the tensor-core tiles take bf16".into(),
        });
    };
    let aligned = x.device_ptr(&cx.stream).0 % 16 == 0 && bits.device_ptr(&cx.stream).0 % 16 == 0;
    shape(kernel, k.is_multiple_of(8) && aligned, || {
        format!("k {k} not a multiple of 8, or x or W not 16-byte aligned")
    })?;
    check_xw(kernel, x, w, tokens, k, n, tokens > 0 && n > 0 && k > 0)?;
    shape(
        kernel,
        tokens.div_ceil(bm) < 1 << 31 && n.div_ceil(bn) < 65_536,
        || format!("{tokens}x{n} is too large a grid"),
    )?;
    let splits = tile.k_splits(cx.multiprocessors, tokens, k, n);
    let f = cx.function("linear.cu", kernel)?;
    let mut y = cx.output::<f32>(tokens * n, kernel)?;
    let mut parts = if splits > 1 {
        Some(cx.scratch::<f32>(splits * tokens * n, "split-k partial products")?)
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
    let mut b = cx.launch_builder(&f);
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
        let sum = crate::registry::cuda::linear::SPLIT_SUM;
        let f = cx.function("linear.cu", sum)?;
        let (count, s32) = ((tokens * n) as i64, splits as i32);
        let mut b = cx.launch_builder(&f);
        b.arg(&mut *y).arg(&*parts).arg(&count).arg(&s32);
        // SAFETY: parts holds splits x T*n values, all written by the launch above; y T*n.
        launched(sum, unsafe { b.launch(grid_for(tokens * n, 256)) })?;
    }
    Ok(y)
}

/// How a one-token group spreads its rows (`linear_group_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKernel {
    /// Each part as [`linear_rows`] (the `rows` variant: any token count).
    EachRows,
    /// One token: a block per 2 rows of a part (`linear_parts1`).
    Blocks,
    /// The parts' rows end to end, streamed by a persistent grid as [`OneToken::Streamed`]
    /// streams one matrix (`linear_parts1_stream`): rows of at most [`WHOLE_ROW_CHUNKS`]
    /// chunks a lane.
    Streamed,
}

impl GroupKernel {
    /// Whether the kernel takes x and every part: by blocks any; streamed where
    /// [`OneToken::Streamed`] takes each part.
    pub fn takes(self, cx: &Launch, x: &CudaSlice<f32>, ws: &[&DeviceMatrix]) -> bool {
        self != GroupKernel::Streamed || ws.iter().all(|w| OneToken::Streamed.takes(cx, x, w))
    }

    /// The kernel a rule names (`rows`, `parts1`, `parts1_stream`).
    pub fn from_variant(name: &str) -> Option<GroupKernel> {
        match name {
            "rows" => Some(GroupKernel::EachRows),
            "parts1" => Some(GroupKernel::Blocks),
            "parts1_stream" => Some(GroupKernel::Streamed),
            _ => None,
        }
    }
}

/// Sibling linear layers over one input (`Op::LinearGroup`): `x [tokens, k]`, `W_p [n_p, k]`
/// → `x·W_pᵀ`, in part order, by `how`.
pub fn linear_group(
    cx: &Launch,
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
    if how == GroupKernel::EachRows {
        return ws
            .iter()
            .zip(&ns)
            .map(|(w, &n)| linear_rows(cx, x, w, tokens, k, n))
            .collect();
    }
    let first = ws.first().copied();
    let base = match how {
        GroupKernel::Streamed => "linear_parts1_stream",
        _ => "linear_parts1",
    };
    let kernel_name = first.map_or(base.into(), |w| w.kernel(base));
    let kernel = kernel_name.as_str();
    let same_dtype = ws.iter().all(|w| first.is_some_and(|f| f.same_dtype(w)));
    shape(
        kernel,
        tokens == 1
            && (1..=MAX_PARTS).contains(&ws.len())
            && how.takes(cx, x, ws)
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
    let f = cx.function("linear.cu", kernel)?;
    let mut ys = Vec::with_capacity(ws.len());
    for &n in &ns {
        ys.push(cx.output::<f32>(n, kernel)?);
    }
    let mut b = cx.launch_builder(&f);
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
        GroupKernel::Blocks | GroupKernel::EachRows => LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
        GroupKernel::Streamed => OneToken::Streamed.grid(ns.iter().sum(), cx.multiprocessors),
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
    cx: &Launch,
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
    let f = cx.function("linear.cu", kernel)?;
    let mut y = cx.output::<f32>(h.len(), kernel)?;
    let (h64, i64_, s32) = (hid as i64, inter as i64, streams as i32);
    // The kernel runs ahead of the node before it (the routed experts, whose output `a` it
    // reads after its wait) when x and s (the node's inputs 2 and 3) are ready.
    let ready = cx.take_ready_inputs().all(&[2, 3]) as i32;
    let mut b = cx.launch_builder(&f);
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
    fn one_token_variants_round_trip_through_their_rule_names() {
        for v in OneToken::ALL.into_iter().chain(OneToken::LINEAR_ONLY) {
            assert_eq!(OneToken::from_variant(&v.variant()), Some(v));
            assert!(
                crate::registry::find(crate::ir::Device::Cuda, "linear", &v.variant()).is_some(),
                "{v:?}"
            );
        }
        assert_eq!(OneToken::from_variant("group1_g3u3"), None);
        assert!(!OneToken::Streamed.fits(2568, 8));
        assert!(!OneToken::Streamed.fits(2564, 4));
        assert!(!OneToken::Streamed.fits(2560, 0));
        assert!(OneToken::Streamed.fits(1280, 4));
        assert!(OneToken::Streamed.fits(2560, 8));
    }
}
