//! The PLE block's tail on the device (`kernels/ple.cu`): `Op::PleMix`, the reference
//! `ops::ple::mix`, in one launch.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{launched, shape};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;

const FILE: &str = "ple.cu";

/// Channels a thread takes (`hid / 10` threads, 256 for 2560, at most `MAX_THREADS`). The kernel
/// holds up to 10 a thread in registers (`PLE_MIX_SLOTS`) and reads a wider stream's others again
/// in each pass.
const CHANNELS_PER_THREAD: usize = 10;

/// The shape of one PLE mix: `key_proj, h [rows, streams*hid]`, `value [rows, hid]`, the norm
/// weights `[streams*hid]` or `[hid]` each, `conv_w [streams*hid, kernel]`, `window
/// [(kernel-1)*dilation, streams*hid]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PleMixShape {
    pub rows: usize,
    pub streams: usize,
    pub kernel: usize,
    pub dilation: usize,
}

/// The most threads a block has (`__launch_bounds__` in kernels/ple.cu): small blocks, so that
/// they find room on the multiprocessors while the projection ahead drains (blocks of 640
/// threads started only after it had finished).
const MAX_THREADS: usize = 256;

/// Threads of the fused kernel's block for a stream of `hid` channels.
fn threads(hid: usize) -> usize {
    hid.div_ceil(CHANNELS_PER_THREAD)
        .next_multiple_of(32)
        .clamp(32, MAX_THREADS)
}

/// The buffers' shapes against `s`; the stream width `hid`.
#[allow(clippy::too_many_arguments)]
fn checked_hid(
    kernel_name: &str,
    key_proj: &CudaSlice<f32>,
    h: &CudaSlice<f32>,
    value: &CudaSlice<f32>,
    norms: [&CudaSlice<f32>; 3],
    conv_w: &CudaSlice<f32>,
    window: &CudaSlice<f32>,
    s: PleMixShape,
) -> Result<usize, CudaError> {
    let PleMixShape {
        rows,
        streams,
        kernel,
        dilation,
    } = s;
    let whole = rows > 0
        && streams > 0
        && kernel > 0
        && dilation > 0
        && !h.is_empty()
        && h.len().is_multiple_of(rows * streams);
    shape(kernel_name, whole, || {
        format!(
            "h {} values, rows {rows}, streams {streams}, kernel {kernel}, dilation {dilation}",
            h.len()
        )
    })?;
    let hid = h.len() / rows / streams;
    let width = streams * hid;
    let past = (kernel - 1) * dilation;
    shape(
        kernel_name,
        key_proj.len() == h.len() && value.len() == rows * hid,
        || {
            format!(
                "key_proj {} values, value {}, for h {} ({rows} rows of {streams} x {hid})",
                key_proj.len(),
                value.len(),
                h.len()
            )
        },
    )?;
    shape(
        kernel_name,
        norms.iter().all(|w| w.len() == width || w.len() == hid),
        || {
            format!(
                "norm weights of {}, {}, {} values: want each {width} or {hid}",
                norms[0].len(),
                norms[1].len(),
                norms[2].len()
            )
        },
    )?;
    shape(
        kernel_name,
        conv_w.len() == width * kernel && window.len() == past * width,
        || {
            format!(
                "conv weight {} values for {width} x {kernel} taps, window {} for {past} rows",
                conv_w.len(),
                window.len()
            )
        },
    )?;
    Ok(hid)
}

/// `ops::ple::mix` in one launch: returns `h + (gv + silu(conv(rms_norm(gv))))` `[rows,
/// streams*hid]` and updates `window` as the unfused conv does. A block per (stream, slice of
/// channels) over the rows in order (the conv of a row reads the rows before it).
#[allow(clippy::too_many_arguments)]
pub fn ple_mix(
    cx: &Launch,
    key_proj: &CudaSlice<f32>,
    h: &CudaSlice<f32>,
    value: &CudaSlice<f32>,
    norm_key: &CudaSlice<f32>,
    norm_query: &CudaSlice<f32>,
    norm_conv: &CudaSlice<f32>,
    conv_w: &CudaSlice<f32>,
    window: &mut CudaSlice<f32>,
    s: PleMixShape,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let name = "ple_mix_f32";
    let norms = [norm_key, norm_query, norm_conv];
    let hid = checked_hid(name, key_proj, h, value, norms, conv_w, window, s)?;
    let f = cx.function(FILE, name)?;
    let mut y = cx.output::<f32>(h.len(), name)?;
    let (r64, s64, h64) = (s.rows as i64, s.streams as i64, hid as i64);
    let [nk64, nq64, nc64] = norms.map(|w| w.len() as i64);
    let (k32, d32) = (s.kernel as i32, s.dilation as i32);
    // A block per (stream, `threads` channels): each forms its stream's sums, then convolves its
    // own channels (kernels/ple.cu).
    let threads = threads(hid);
    let cfg = LaunchConfig {
        grid_dim: ((s.streams * hid.div_ceil(threads)).min(65_535) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(&mut *window)
        .arg(key_proj)
        .arg(h)
        .arg(value)
        .arg(norm_key)
        .arg(norm_query)
        .arg(norm_conv)
        .arg(conv_w)
        .arg(&r64)
        .arg(&s64)
        .arg(&h64)
        .arg(&nk64)
        .arg(&nq64)
        .arg(&nc64)
        .arg(&k32)
        .arg(&d32)
        .arg(&eps);
    // SAFETY: the shapes checked above: y, key_proj and h hold rows*streams*hid floats, value
    // rows*hid, each norm weight streams*hid or hid (its length passed), conv_w streams*hid*kernel, the
    // window past*streams*hid; a thread's channels stay below hid, and each thread reads and
    // rewrites only its own channels' window columns.
    launched(name, unsafe { b.launch(cfg) })?;
    Ok(y)
}
