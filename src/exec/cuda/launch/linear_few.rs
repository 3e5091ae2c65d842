//! Linear layers over a few rows on the tensor cores (`kernels/linear_few.cu`): MTP's verify
//! steps and small batches, where a warp per weight row (`linear_rows`) loads each activation
//! chunk once a token per weight chunk. The plain product and the residual write
//! (`linear_hc_write`) share the kernel's body.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::linear::{arg_matrix, DeviceMatrix};
use super::{launched, shape};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;
use crate::registry::cuda::linear::{few_kernel, few_shape, FEW_MAX_ROWS, MAX_GRID};

/// A block of the few-token kernels: `rows` weight rows, `warps` warps splitting k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FewTile {
    pub rows: usize,
    pub warps: usize,
}

impl FewTile {
    /// The tile a `few_r{rows}s{warps}` variant names.
    pub fn from_variant(name: &str) -> Option<FewTile> {
        few_shape(name).map(|(rows, warps)| FewTile { rows, warps })
    }

    fn grid(self, n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n.div_ceil(self.rows) as u32, 1, 1),
            block_dim: ((32 * self.warps) as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The shared checks: bf16 weights, `x [tokens, k]`, `W [n, k]`, k a multiple of 32,
    /// 1 to [`FEW_MAX_ROWS`] tokens, a grid that fits.
    fn check(
        self,
        kernel: &str,
        x: &CudaSlice<f32>,
        w: &DeviceMatrix,
        tokens: usize,
        k: usize,
    ) -> Result<usize, CudaError> {
        let n = w.len().checked_div(k).unwrap_or(0);
        shape(
            kernel,
            matches!(w, DeviceMatrix::Bf16(_))
                && k > 0
                && k.is_multiple_of(32)
                && (1..=FEW_MAX_ROWS).contains(&tokens)
                && x.len() == tokens * k
                && n > 0
                && w.len() == n * k
                && n.div_ceil(self.rows) <= MAX_GRID,
            || {
                format!(
                    "x {} values for {tokens} rows of {k}, weight {} values: bf16 weights, k a multiple of 32, 1 to {FEW_MAX_ROWS} rows",
                    x.len(),
                    w.len()
                )
            },
        )?;
        Ok(n)
    }
}

/// `y = x · Wᵀ` for `x [tokens, k]` (tokens ≤ [`FEW_MAX_ROWS`]), bf16 `W [n, k]`.
pub fn linear_few(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    k: usize,
    tile: FewTile,
) -> Result<Buf<f32>, CudaError> {
    let kernel = few_kernel("linear_few", tile.rows, tile.warps, tokens);
    let n = tile.check(&kernel, x, w, tokens, k)?;
    let f = cx.function("linear_few.cu", &kernel)?;
    let mut y = cx.output::<f32>(tokens * n, &kernel)?;
    let (t32, k64, n64) = (tokens as i32, k as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    arg_matrix(&mut b, w);
    b.arg(&t32).arg(&k64).arg(&n64);
    // SAFETY: the shapes were checked above (k a multiple of 32, so every 16-byte load is
    // inside its row; cudarc's allocations are 256-byte aligned); rows past n and tokens past
    // `tokens` are neither read nor written.
    launched(&kernel, unsafe { b.launch(tile.grid(n)) })?;
    Ok(y)
}

/// `h + inj ⊗ (x·Wᵀ)` (`ops::linear::linear_hc_write`) for a few tokens: `x [tokens, k]`, bf16
/// `W [n, k]`, `h [tokens, streams*n]`, `inj [tokens, streams]`.
#[allow(clippy::too_many_arguments)]
pub fn linear_hc_write_few(
    cx: &Launch,
    h: &CudaSlice<f32>,
    inj: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    w: &DeviceMatrix,
    tokens: usize,
    streams: usize,
    tile: FewTile,
) -> Result<Buf<f32>, CudaError> {
    let kernel = few_kernel("linear_hc_write_few", tile.rows, tile.warps, tokens);
    let k = x.len().checked_div(tokens).unwrap_or(0);
    let n = tile.check(&kernel, x, w, tokens, k)?;
    shape(
        &kernel,
        streams > 0
            && streams <= i32::MAX as usize
            && h.len() == tokens * streams * n
            && inj.len() == tokens * streams,
        || {
            format!(
                "h {} values, inj {} for {tokens} tokens of {streams} streams of {n}",
                h.len(),
                inj.len()
            )
        },
    )?;
    let f = cx.function("linear_few.cu", &kernel)?;
    let mut y = cx.output::<f32>(h.len(), &kernel)?;
    let (t32, k64, n64, s32) = (tokens as i32, k as i64, n as i64, streams as i32);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(h).arg(inj).arg(x);
    arg_matrix(&mut b, w);
    b.arg(&t32).arg(&k64).arg(&n64).arg(&s32);
    // SAFETY: every size was checked above; each of the tokens*streams*n outputs is written
    // once, by the warp that holds its sum.
    launched(&kernel, unsafe { b.launch(tile.grid(n)) })?;
    Ok(y)
}
