//! Layout ops and the small fused ops around the trunk (`kernels/layout.cu`): stream repeats,
//! slices, means and writes, the last row, the q/gate split, the hyper-connection read chain and
//! injection gains, the fused SwiGLU projection, the gated RMS norm and the PLE gate. The
//! references are `ops::{elementwise, hyper, linear::swiglu, norm::gated_rms_norm, ple::gate,
//! attention::split_q_gate}`; activations are row-major f32 `[rows, width]`.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::arg_matrix;
use super::{grid_for, launched, shape, warp_grid, DeviceMatrix};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;
use crate::exec::cuda::launcher::KernelLaunch;

mod hyper;

pub use hyper::{hc_inject, hc_mix, hc_read, HcReadAct};

const FILE: &str = "layout.cu";

/// The most blocks a grid-strided launch asks for (as `grid_for`).
const MAX_BLOCKS: usize = 65_535 * 8;

/// Threads for a block that reduces over `n` values with `block_sum`: a multiple of 32, at most
/// `cap` (≤ 1024).
fn reduce_threads(n: usize, cap: usize) -> u32 {
    n.next_multiple_of(32).clamp(32, cap) as u32
}

/// `[rows, H]` → `[rows, streams*H]` (`ops::elementwise::repeat_streams`).
pub fn repeat_streams(
    cx: &Launch,
    x: &CudaSlice<f32>,
    rows: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "repeat_streams_reference_f32";
    shape(
        kernel,
        rows > 0 && streams > 0 && !x.is_empty() && x.len().is_multiple_of(rows),
        || format!("x {} values, rows {rows}, streams {streams}", x.len()),
    )?;
    let f = cx.function(FILE, kernel)?;
    let h = x.len() / rows;
    let n = x.len() * streams;
    let mut y = cx.output::<f32>(n, kernel)?;
    let (h64, s64, n64) = (h as i64, streams as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x).arg(&h64).arg(&s64).arg(&n64);
    // SAFETY: y holds n = rows*streams*h floats; x is read at t*h + c < rows*h.
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

/// Columns `[start, start+len)` of `x [rows, width]` (`ops::elementwise::slice_cols`).
pub fn slice_cols(
    cx: &Launch,
    x: &CudaSlice<f32>,
    rows: usize,
    start: usize,
    len: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "slice_reference_f32";
    shape(
        kernel,
        rows > 0 && len > 0 && x.len().is_multiple_of(rows) && start + len <= x.len() / rows,
        || {
            format!(
                "x {} values in {rows} rows, columns {start}..{}",
                x.len(),
                start + len
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let width = x.len() / rows;
    let n = rows * len;
    let mut y = cx.output::<f32>(n, kernel)?;
    let (w64, s64, l64, n64) = (width as i64, start as i64, len as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(x)
        .arg(&w64)
        .arg(&s64)
        .arg(&l64)
        .arg(&n64);
    // SAFETY: y holds rows*len floats; x is read at t*width + start + c with start + c < width.
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

/// `[rows, streams*H]` → `[rows, H]`: the sum over streams divided by their count
/// (`ops::elementwise::stream_mean`).
pub fn gated_stream_mean(
    cx: &Launch,
    up: &CudaSlice<f32>,
    hn: &CudaSlice<f32>,
    rows: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "gated_stream_mean_f32";
    shape(
        kernel,
        rows > 0
            && streams > 0
            && !up.is_empty()
            && up.len() == hn.len()
            && up.len().is_multiple_of(rows)
            && (up.len() / rows).is_multiple_of(streams),
        || {
            format!(
                "up {} and hn {} values, rows {rows}, streams {streams}",
                up.len(),
                hn.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let h = up.len() / rows / streams;
    let n = rows * h;
    let mut y = cx.output::<f32>(n, kernel)?;
    let (h64, s64, n64) = (h as i64, streams as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(up).arg(hn).arg(&h64).arg(&s64).arg(&n64);
    // SAFETY: y holds rows*h floats; up and hn are read below rows*streams*h == their length.
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

pub fn stream_mean(
    cx: &Launch,
    x: &CudaSlice<f32>,
    rows: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "stream_mean_reference_f32";
    shape(
        kernel,
        rows > 0
            && streams > 0
            && !x.is_empty()
            && x.len().is_multiple_of(rows)
            && (x.len() / rows).is_multiple_of(streams),
        || format!("x {} values, rows {rows}, streams {streams}", x.len()),
    )?;
    let f = cx.function(FILE, kernel)?;
    let h = x.len() / rows / streams;
    let n = rows * h;
    let mut y = cx.output::<f32>(n, kernel)?;
    let (h64, s64, n64) = (h as i64, streams as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x).arg(&h64).arg(&s64).arg(&n64);
    // SAFETY: y holds rows*h floats; x is read below rows*streams*h == x.len().
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

/// Hyper-connection write: `h [rows, streams*H]` with stream `s` of each row gaining
/// `inj[row, s] * y[row]`, `inj [rows, streams]`, `y [rows, H]` (`ops::elementwise::hc_write`).
pub fn hc_write(
    cx: &Launch,
    h: &CudaSlice<f32>,
    inj: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    rows: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "hc_write_reference_f32";
    let ok_h = rows > 0
        && streams > 0
        && !h.is_empty()
        && h.len().is_multiple_of(rows)
        && (h.len() / rows).is_multiple_of(streams);
    let hid = if ok_h { h.len() / rows / streams } else { 0 };
    shape(
        kernel,
        ok_h && inj.len() == rows * streams && y.len() == rows * hid && hid * streams < 1 << 31,
        || {
            format!(
                "h {} values, inj {}, y {}, rows {rows}, streams {streams} (a row under 2^31 values)",
                h.len(),
                inj.len(),
                y.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let n = h.len();
    let width = hid * streams;
    let mut out = cx.output::<f32>(n, kernel)?;
    let (h64, s64, r64) = (hid as i64, streams as i64, rows as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out)
        .arg(h)
        .arg(inj)
        .arg(y)
        .arg(&h64)
        .arg(&s64)
        .arg(&r64);
    // A row along the grid's y; its channels over the x blocks, 4 a thread where hid % 4 == 0.
    let per_thread = if hid.is_multiple_of(4) { 4 } else { 1 };
    let cfg = LaunchConfig {
        grid_dim: (
            width.div_ceil(per_thread * 256).clamp(1, 65_535) as u32,
            rows.min(65_535) as u32,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: out and h hold n = rows*streams*hid floats; inj is read below rows*streams and y
    // below rows*hid, both checked above; a row's width is under 2^31 (the kernel's int
    // channel index); both grid dimensions stride.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(out)
}

/// The last row of `x [rows, width]`, as `[1, width]` (a device-to-device copy; no kernel).
pub fn last_row(cx: &Launch, x: &CudaSlice<f32>, rows: usize) -> Result<Buf<f32>, CudaError> {
    let kernel = "last_row";
    shape(
        kernel,
        rows > 0 && !x.is_empty() && x.len().is_multiple_of(rows),
        || format!("x {} values in {rows} rows", x.len()),
    )?;
    let width = x.len() / rows;
    let mut y = cx.output::<f32>(width, kernel)?;
    cx.note_kernel("cuMemcpyDtoD")?;
    cx.stream
        .memcpy_dtod(&x.slice((rows - 1) * width..), &mut *y)
        .map_err(|e| CudaError::driver("copying last_row", None, e))?;
    Ok(y)
}

/// Splits the fused q projection `qg [rows, heads*2*head_dim]` (per head: `head_dim` query
/// channels, then `head_dim` gate channels) into `q` and `gate`, each `[rows, heads*head_dim]`
/// (`ops::attention::split_q_gate`).
pub fn split_q_gate(
    cx: &Launch,
    qg: &CudaSlice<f32>,
    rows: usize,
    heads: usize,
    head_dim: usize,
) -> Result<(Buf<f32>, Buf<f32>), CudaError> {
    let kernel = "split_q_gate_reference_f32";
    shape(
        kernel,
        rows > 0 && heads > 0 && head_dim > 0 && qg.len() == rows * heads * 2 * head_dim,
        || {
            format!(
                "qg {} values for {rows} rows of {heads} heads x 2 x {head_dim}",
                qg.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let n = rows * heads * head_dim;
    let mut q = cx.output::<f32>(n, kernel)?;
    let mut gate = cx.output::<f32>(n, kernel)?;
    let (hd64, n64) = (head_dim as i64, n as i64);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *q).arg(&mut *gate).arg(qg).arg(&hd64).arg(&n64);
    // SAFETY: q and gate hold n floats; qg is read below (n/hd)*2*hd == qg.len().
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok((q, gate))
}

/// A block of 256 threads per output (grid-strided past the grid limit).
fn block_grid(outputs: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (outputs.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Fused expert gate/up (`ops::linear::swiglu`): `silu(x·Wgᵀ) * (x·Wuᵀ)` for `x [rows, k]`,
/// `Wg, Wu [n, k]` (both f32 or both bf16). One warp per output row, every token in the warp,
/// both dot products in the same pass over x, as `linear_rows`; or (`block`, one token) a block
/// per output row (`swiglu_linear_block_*`).
#[allow(clippy::too_many_arguments)]
pub fn swiglu(
    cx: &Launch,
    x: &CudaSlice<f32>,
    wg: &DeviceMatrix,
    wu: &DeviceMatrix,
    rows: usize,
    k: usize,
    n: usize,
    block: bool,
) -> Result<Buf<f32>, CudaError> {
    shape("swiglu_linear_block", !block || rows == 1, || {
        format!("{rows} rows: the block form takes one token")
    })?;
    let one = block;
    let kernel_name = wg.kernel(if one {
        "swiglu_linear_block"
    } else {
        "swiglu_linear_reference"
    });
    let kernel = kernel_name.as_str();
    shape(kernel, wg.same_dtype(wu), || {
        "gate and up weights have different dtypes".to_string()
    })?;
    shape(
        kernel,
        rows > 0 && k > 0 && n > 0 && x.len() == rows * k && wg.len() == n * k && wu.len() == n * k,
        || {
            format!(
                "x {} values for {rows}x{k}, gate {} and up {} values for {n}x{k}",
                x.len(),
                wg.len(),
                wu.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let mut y = cx.output::<f32>(rows * n, kernel)?;
    let (t64, k64, n64) = (rows as i64, k as i64, n as i64);
    let cfg = if one { block_grid(n) } else { warp_grid(n) };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x);
    match (wg, wu) {
        (DeviceMatrix::F32(g), DeviceMatrix::F32(u)) => b.arg(g).arg(u),
        (DeviceMatrix::Bf16(g), DeviceMatrix::Bf16(u)) => b.arg(g).arg(u),
        _ => unreachable!("dtypes checked above"),
    };
    if !one {
        b.arg(&t64);
    }
    b.arg(&k64).arg(&n64);
    // One token runs ahead of the node before it when x (the node's input) is ready.
    let ready = cx.take_ready_inputs().all(&[0]) as i32;
    if one {
        b.arg(&ready);
    }
    // SAFETY: x is rows*k, wg and wu n*k, y rows*n, all checked above; 16-byte loads are used
    // only when k and the base addresses allow (checked in the kernel).
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// GDN output norm (`ops::norm::gated_rms_norm`): per head of `head_dim`,
/// `w * rms(x) * act(gate)` with plain `w` (not `1 + w`); `act` is sigmoid when `sigmoid`, else
/// silu. `w` has `head_dim` entries (shared by the heads) or one per channel.
pub fn gated_rms_norm(
    cx: &Launch,
    x: &CudaSlice<f32>,
    gate: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    head_dim: usize,
    sigmoid: bool,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "gated_rms_norm_reference_f32";
    shape(
        kernel,
        head_dim > 0
            && !x.is_empty()
            && x.len().is_multiple_of(head_dim)
            && gate.len() == x.len()
            && !w.is_empty()
            && (w.len() == head_dim || x.len().is_multiple_of(w.len())),
        || {
            format!(
                "x {} values, gate {}, head_dim {head_dim}, weight {}",
                x.len(),
                gate.len(),
                w.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let groups = x.len() / head_dim;
    let mut y = cx.output::<f32>(x.len(), kernel)?;
    let (g64, hd64, wl64, sig) = (
        groups as i64,
        head_dim as i64,
        w.len() as i64,
        sigmoid as i32,
    );
    // A warp per group (head), 8 a block, grid-strided.
    let cfg = LaunchConfig {
        grid_dim: (groups.div_ceil(8).clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(x)
        .arg(gate)
        .arg(w)
        .arg(&g64)
        .arg(&hd64)
        .arg(&wl64)
        .arg(&sig)
        .arg(&eps);
    // SAFETY: groups*head_dim == x.len() == gate.len() == y.len(); w is indexed below head_dim
    // when that is its length, else modulo its length.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// PLE gate (`ops::ple::gate`): for each row and stream `s`,
/// `sigmoid(ssqrt(<key_s, query_s> / sqrt(H))) * value`, with `key, query [rows, streams*H]`,
/// `value [rows, H]` and `ssqrt(g) = sign(g) * sqrt(max(|g|, 1e-6))`. One block per (row, stream).
pub fn ple_gate(
    cx: &Launch,
    key: &CudaSlice<f32>,
    query: &CudaSlice<f32>,
    value: &CudaSlice<f32>,
    rows: usize,
    streams: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "ple_gate_reference_f32";
    let ok_key = rows > 0
        && streams > 0
        && !key.is_empty()
        && key.len().is_multiple_of(rows)
        && (key.len() / rows).is_multiple_of(streams);
    let h = if ok_key {
        key.len() / rows / streams
    } else {
        0
    };
    shape(
        kernel,
        ok_key && query.len() == key.len() && value.len() == rows * h,
        || {
            format!(
                "key {} values, query {}, value {}, rows {rows}, streams {streams}",
                key.len(),
                query.len(),
                value.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let groups = rows * streams;
    let mut y = cx.output::<f32>(key.len(), kernel)?;
    let (r64, s64, h64) = (rows as i64, streams as i64, h as i64);
    let cfg = LaunchConfig {
        grid_dim: (groups.min(MAX_BLOCKS) as u32, 1, 1),
        block_dim: (reduce_threads(h, 256), 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(key)
        .arg(query)
        .arg(value)
        .arg(&r64)
        .arg(&s64)
        .arg(&h64);
    // SAFETY: key, query and y hold rows*streams*h floats, value rows*h, all checked above.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// `ops::linear::sigmoid_gated_add`: `a + sigmoid(x·wᵀ) * b` per row, `x [rows, h]`, `w [h]`,
/// `a, b [rows, d]`. One block per row.
pub fn sigmoid_gated_add(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    rows: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "sigmoid_gated_add_reference_f32";
    let h = w.len();
    let d = a.len().checked_div(rows).unwrap_or(0);
    shape(
        kernel,
        rows > 0 && h > 0 && x.len() == rows * h && d > 0 && a.len() == b.len(),
        || {
            format!(
                "x {} values, gate weight {h}, a {} and b {} values for {rows} rows",
                x.len(),
                a.len(),
                b.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let mut y = cx.output::<f32>(rows * d, kernel)?;
    let (r64, h64, d64) = (rows as i64, h as i64, d as i64);
    let mut bld = cx.launch_builder(&f);
    bld.arg(&mut *y)
        .arg(x)
        .arg(w)
        .arg(b)
        .arg(a)
        .arg(&r64)
        .arg(&h64)
        .arg(&d64);
    // SAFETY: x is rows*h, w h, a, b and y rows*d, all checked above.
    launched(kernel, unsafe { bld.launch(block_grid(rows)) })?;
    Ok(y)
}
