//! Choosing the next token on the device (kernels/sampling.cu): a greedy step downloads one id
//! instead of its row of logits.

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig};

use super::{launched, shape};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::error::CudaError;
use crate::runtime::sampling::BadLogit;

/// Values a thread of `argmax_row_f32` looks at (its grid covers the row in one pass).
const PER_THREAD: usize = 8;
const THREADS: u32 = 256;

/// Writes into `best` the key of the first index of the largest value of `x` (the choice of
/// `runtime::sampling::argmax`), or of its first NaN; [`argmax_of`] reads the choice from it.
/// `best` is zeroed first, on the stream.
pub fn argmax_row(
    cx: &Launch,
    best: &mut CudaSlice<u64>,
    x: &CudaView<'_, f32>,
) -> Result<(), CudaError> {
    const NAME: &str = "argmax_row_f32";
    let n = x.len();
    shape(
        NAME,
        n > 0 && n < u32::MAX as usize && best.len() == 1,
        || {
            format!(
                "a row of {n} values (want 1 .. 2^32 - 1) into {} keys (want 1)",
                best.len()
            )
        },
    )?;
    cx.stream
        .memset_zeros(best)
        .map_err(|e| CudaError::driver("zeroing the argmax key", None, e))?;
    let f = cx.function("sampling.cu", NAME)?;
    let blocks = n.div_ceil(THREADS as usize * PER_THREAD).min(65_535) as u32;
    let n64 = n as i64;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *best).arg(x).arg(&n64);
    // SAFETY: the kernel reads n floats of x and updates the one key of `best`.
    launched(NAME, unsafe {
        b.launch(LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    })
}

/// The index `argmax_row` chose, from its key (the low 32 bits hold 0xffffffff - index).
pub fn argmax_index(key: u64) -> u32 {
    u32::MAX - (key & 0xffff_ffff) as u32
}

/// The choice `argmax_row` made: the index of the largest value, or (`Err`) the first NaN's
/// (a NaN's key has all its high 32 bits set, above every number's).
pub fn argmax_of(key: u64) -> Result<u32, BadLogit> {
    if key >> 32 == 0xffff_ffff {
        Err(BadLogit {
            token: argmax_index(key) as usize,
            value: f32::NAN,
        })
    } else {
        Ok(argmax_index(key))
    }
}
