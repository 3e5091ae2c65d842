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

use crate::registry::cuda::layout::{gate_early as gate_early_for, FEW_ROWS, HC_GATE_MAX_RANK};

/// A block of 256 threads per output (grid-strided past the grid limit).
fn block_grid(outputs: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (outputs.clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The fused hyper-connection read chain (`ops::hyper::hc_mix`): for each row of
/// `hn [rows, streams*H]`, `mean_s(sigmoid(silu(hn·downᵀ / C)·upᵀ) * hn)` with
/// `down [R, streams*H]`, `up [streams*H, R]` (both f32 or both bf16). One block per row; the
/// R activations are kept in shared memory. `block`: a block per activation (up to `FEW_ROWS`
/// rows, so that the rank x width matrix has enough loads in flight), else a warp per activation.
#[allow(clippy::too_many_arguments)]
pub fn hc_mix(
    cx: &Launch,
    hn: &CudaSlice<f32>,
    down: &DeviceMatrix,
    up: &DeviceMatrix,
    rows: usize,
    streams: usize,
    block: bool,
) -> Result<Buf<f32>, CudaError> {
    let act_name = down.kernel(if block {
        "hc_mix_act_block"
    } else {
        "hc_mix_act_warp"
    });
    let gate_name = down.kernel("hc_mix_gate");
    let (act_kernel, kernel) = (act_name.as_str(), gate_name.as_str());
    shape(kernel, down.same_dtype(up), || {
        "down and up have different dtypes".to_string()
    })?;
    let width = hn.len().checked_div(rows).unwrap_or(0);
    let rank = down.len().checked_div(width).unwrap_or(0);
    shape(
        kernel,
        rows > 0
            && streams > 0
            && width > 0
            && hn.len() == rows * width
            && width.is_multiple_of(streams)
            && rank > 0
            && down.len() == rank * width
            && up.len() == width * rank,
        || {
            format!(
                "hn {} values, rows {rows}, streams {streams}, down {} and up {} values \
                 (want [R, width] and [width, R])",
                hn.len(),
                down.len(),
                up.len()
            )
        },
    )?;
    let hid = width / streams;
    let mut act = cx.scratch::<f32>(rows * rank, act_kernel)?;
    let mut y = cx.output::<f32>(rows * hid, kernel)?;
    let (r64, s64, w64, h64, k64) = (
        rows as i64,
        streams as i64,
        width as i64,
        hid as i64,
        rank as i64,
    );
    let f = cx.function(FILE, act_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act).arg(hn);
    arg_matrix(&mut b, down);
    b.arg(&r64).arg(&s64).arg(&w64).arg(&k64);
    shape(act_kernel, !block || rows <= FEW_ROWS, || {
        format!("{rows} rows: the block form takes at most {FEW_ROWS}")
    })?;
    let act_grid = if block {
        block_grid(rows * rank)
    } else {
        warp_grid(rows * rank)
    };
    // SAFETY: hn is rows*width, down rank*width, act rows*rank, all checked above.
    launched(act_kernel, unsafe { b.launch(act_grid) })?;
    let f = cx.function(FILE, kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(hn).arg(&*act);
    arg_matrix(&mut b, up);
    b.arg(&r64).arg(&s64).arg(&h64).arg(&k64);
    // SAFETY: up is width*rank, act rows*rank, y rows*hid; same stream, so act is complete.
    launched(kernel, unsafe { b.launch(warp_grid(rows * hid)) })?;
    Ok(y)
}

/// How `hc_read`'s first kernel (`hc_read_act_r{R}`) shares the R + C dot products of a row
/// over blocks: `outputs_per_block` of them a block, every weight row's chunks a thread holds
/// loaded at once (more per block: more loads in flight a thread, the row of h read fewer times,
/// fewer blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcReadAct {
    pub outputs_per_block: usize,
    /// A block per stream's slice of the row (`hc_read_act_s{R}` + `hc_read_gate_s`: partial
    /// dot products per stream, combined by the gate kernel's blocks) instead of the whole row.
    pub by_stream: bool,
}

impl HcReadAct {
    /// Every variant compiled in kernels/layout.cu (`HC_READ_KERNELS`), for the sweep and tests.
    pub const ALL: [HcReadAct; 5] = [
        HcReadAct {
            outputs_per_block: 1,
            by_stream: false,
        },
        HcReadAct {
            outputs_per_block: 2,
            by_stream: false,
        },
        HcReadAct {
            outputs_per_block: 4,
            by_stream: false,
        },
        HcReadAct {
            outputs_per_block: 2,
            by_stream: true,
        },
        HcReadAct {
            outputs_per_block: 4,
            by_stream: true,
        },
    ];

    /// The variant a rule names (`r1`, `r2`, `r4`, `s2`, `s4`: `registry::cuda::layout`).
    pub fn from_variant(name: &str) -> Option<HcReadAct> {
        HcReadAct::ALL.into_iter().find(|v| v.name() == name)
    }

    pub fn name(self) -> String {
        if self.by_stream {
            format!("s{}", self.outputs_per_block)
        } else {
            format!("r{}", self.outputs_per_block)
        }
    }
}

/// Chunks of the row each thread of `hc_read_act`'s fixed path holds (`HC_ACT_CHUNKS`).
const HC_ACT_CHUNKS: usize = 4;

/// Pushes an optional weight matrix: null where there is none (the kernel then never reads it).
fn arg_matrix_or_null(b: &mut KernelLaunch<'_>, m: Option<&DeviceMatrix>) {
    match m {
        Some(m) => arg_matrix(b, m),
        None => {
            b.arg(&0u64);
        }
    }
}

/// Pushes an optional output buffer: null where there is none (the kernel then never writes it).
fn arg_out_or_null(b: &mut KernelLaunch<'_>, out: &mut Option<Buf<f32>>) {
    match out {
        Some(o) => {
            b.arg(&mut **o);
        }
        None => {
            b.arg(&0u64);
        }
    }
}

/// The fused hyper-connection read (`ops::hyper::hc_read`): for each row of `h [rows, C*H]`,
/// `x = hc_mix(hn)` and `inj = hc_inject(hn)` with `hn` the per-stream RMS norm of `h` (unit
/// offset, weight `norm [C*H or H]`), never stored: a kernel for the C inverse RMS, the R mix
/// activations and the C gains (`variant`: a few of them a block, for each row; the executor
/// passes [`HcReadAct::CHOSEN`], the sweep and the GPU tests each), and the mix's gate. Without
/// `inject` (the exit's mixer) the first kernel forms the R activations alone and only `x`
/// comes back.
#[allow(clippy::too_many_arguments)]
pub fn hc_read(
    cx: &Launch,
    h: &CudaSlice<f32>,
    norm: &CudaSlice<f32>,
    down: &DeviceMatrix,
    up: &DeviceMatrix,
    inject: Option<&DeviceMatrix>,
    rows: usize,
    streams: usize,
    eps: f32,
    variant: HcReadAct,
) -> Result<(Buf<f32>, Option<Buf<f32>>), CudaError> {
    let per_block = variant.outputs_per_block;
    shape("hc_read_act", HcReadAct::ALL.contains(&variant), || {
        format!(
            "{per_block} outputs a block{}: kernels/layout.cu has 1, 2 and 4 a row, 2 and 4 a stream",
            if variant.by_stream { " a stream" } else { "" }
        )
    })?;
    let act_name = down.kernel(&format!("hc_read_act_{}", variant.name()));
    let gate_name = down.kernel(if variant.by_stream {
        "hc_read_gate_s"
    } else {
        "hc_read_gate"
    });
    let (act_kernel, kernel) = (act_name.as_str(), gate_name.as_str());
    let width = h.len().checked_div(rows).unwrap_or(0);
    let rank = down.len().checked_div(width).unwrap_or(0);
    let hid = width.checked_div(streams).unwrap_or(0);
    // The injection's C gains are outputs R .. R + C of the first kernel, when there are any.
    let gains = if inject.is_some() { streams } else { 0 };
    shape(
        kernel,
        down.same_dtype(up)
            && inject.is_none_or(|i| down.same_dtype(i))
            && rows > 0
            && rows < 65_536
            && (1..=32).contains(&streams)
            && hid > 0
            && h.len() == rows * width
            && width == streams * hid
            && rank > 0
            && rank + gains <= MAX_BLOCKS
            && down.len() == rank * width
            && up.len() == width * rank
            && inject.is_none_or(|i| i.len() == streams * width)
            && (norm.len() == width || norm.len() == hid),
        || {
            format!(
                "h {} values for {rows} rows of {streams} streams; norm {}, down {}, up {}, inject {} \
                 values (want [C*H or H], [R, C*H], [C*H, R], [C, C*H] of one type)",
                h.len(),
                norm.len(),
                down.len(),
                up.len(),
                inject.map_or("no".to_string(), |i| i.len().to_string())
            )
        },
    )?;
    if variant.by_stream {
        return hc_read_by_stream(
            cx,
            h,
            norm,
            [down, up],
            inject,
            [rows, streams, width, rank],
            eps,
            [act_kernel, kernel],
            per_block,
        );
    }
    let mut act = cx.scratch::<f32>(rows * rank, act_kernel)?;
    let mut inv = cx.scratch::<f32>(rows * streams, act_kernel)?;
    let mut x = cx.output::<f32>(rows * hid, kernel)?;
    let mut inj = match inject {
        Some(_) => Some(cx.output::<f32>(rows * streams, act_kernel)?),
        None => None,
    };
    let (s64, w64, r64, g64, h64, rows64, wl64) = (
        streams as i64,
        width as i64,
        rank as i64,
        gains as i64,
        hid as i64,
        rows as i64,
        norm.len() as i64,
    );
    let f = cx.function(FILE, act_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *act);
    arg_out_or_null(&mut b, &mut inj);
    b.arg(&mut *inv).arg(h).arg(norm);
    arg_matrix(&mut b, down);
    arg_matrix_or_null(&mut b, inject);
    b.arg(&s64)
        .arg(&w64)
        .arg(&r64)
        .arg(&g64)
        .arg(&wl64)
        .arg(&eps);
    // Threads: enough that each holds HC_ACT_CHUNKS 16-byte chunks of the row (the fixed path),
    // at least a warp per output of the block (each finishes one), at most 512 (the kernel's
    // launch bounds; past that it takes its general path, which any block size serves).
    let threads = (width.div_ceil(down.chunk_len()).div_ceil(HC_ACT_CHUNKS))
        .next_multiple_of(32)
        .clamp(32 * per_block, 512);
    let cfg = LaunchConfig {
        grid_dim: ((rank + gains).div_ceil(per_block) as u32, rows as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: shapes checked above; block (b, t) writes act[t, o] or inj[t, o - R] for its
    // outputs o = b*per_block.. (< R + gains: inj and inject, null without the injection, are
    // never touched then), block (0, t) the C inverse RMS of row t; 16-byte loads only where the
    // widths and addresses allow.
    launched(act_kernel, unsafe { b.launch(cfg) })?;
    let f = cx.function(FILE, kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *x).arg(h).arg(&*inv).arg(norm).arg(&*act);
    arg_matrix(&mut b, up);
    b.arg(&rows64).arg(&s64).arg(&h64).arg(&r64).arg(&wl64);
    let cfg = warp_grid(rows * hid);
    // SAFETY: a warp per (row, channel) over rows*hid outputs; act holds rows*R, inv rows*C.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok((x, inj))
}

/// Whether the gate's early form (`hc_read_gate_se_*`) takes the shape, as `hc_gate_lane`'s
/// `early` in kernels/layout.cu decides it for the launch in `hc_read_by_stream` (8 warps a block,
/// a warp a channel, every channel covered): the lanes split evenly over the streams, `up` rows
/// of whole 16-byte chunks from a 16-byte aligned matrix, a row's chunks within a lane's
/// HC_GATE_CHUNKS. The kernel stops (trap) if it ever disagrees.
fn gate_early(cx: &Launch, up: &DeviceMatrix, streams: usize, rank: usize) -> bool {
    gate_early_for(streams, rank, up.chunk_len())
        && up.device_address(&cx.stream).is_multiple_of(16)
}

/// [`hc_read`] with blocks over one stream's slice of the row (`HcReadAct::by_stream`): the
/// first kernel writes per-stream partial dot products and sums of squares, the gate kernel's
/// blocks (one row each) combine them into the activations (in shared memory), the inverse RMS
/// and, in block 0, the gains (with `inject`). Shapes were checked by the caller.
#[allow(clippy::too_many_arguments)]
fn hc_read_by_stream(
    cx: &Launch,
    h: &CudaSlice<f32>,
    norm: &CudaSlice<f32>,
    [down, up]: [&DeviceMatrix; 2],
    inject: Option<&DeviceMatrix>,
    [rows, streams, width, rank]: [usize; 4],
    eps: f32,
    [act_kernel, kernel]: [&str; 2],
    per_block: usize,
) -> Result<(Buf<f32>, Option<Buf<f32>>), CudaError> {
    let hid = width / streams;
    shape(kernel, rank <= HC_GATE_MAX_RANK, || {
        format!("rank {rank}: the by-stream gate stages at most {HC_GATE_MAX_RANK} activations")
    })?;
    let gains = if inject.is_some() { streams } else { 0 };
    let outs = rank + gains;
    let mut part = cx.scratch::<f32>(rows * outs * streams, act_kernel)?;
    let mut ssq = cx.scratch::<f32>(rows * streams, act_kernel)?;
    let mut x = cx.output::<f32>(rows * hid, kernel)?;
    let mut inj = match inject {
        Some(_) => Some(cx.output::<f32>(rows * streams, act_kernel)?),
        None => None,
    };
    let (s64, w64, r64, g64, h64, wl64) = (
        streams as i64,
        width as i64,
        rank as i64,
        gains as i64,
        hid as i64,
        norm.len() as i64,
    );
    let f = cx.function(FILE, act_kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *part).arg(&mut *ssq).arg(h).arg(norm);
    arg_matrix(&mut b, down);
    arg_matrix_or_null(&mut b, inject);
    b.arg(&s64).arg(&w64).arg(&r64).arg(&g64).arg(&wl64);
    // Threads: a 16-byte chunk of the stream's slice each where the slice allows, at most 512.
    let threads = hid
        .div_ceil(down.chunk_len())
        .next_multiple_of(32)
        .clamp(32, 512);
    let cfg = LaunchConfig {
        grid_dim: (outs.div_ceil(per_block) as u32, streams as u32, rows as u32),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: shapes checked by the caller; block (b, s, t) writes part[t, o, s] for its outputs
    // o < R + gains (inject, null without the injection, is read only for o >= R) and block
    // (0, s, t) ssq[t, s]; 16-byte loads only where the slice's length and addresses allow.
    launched(act_kernel, unsafe { b.launch(cfg) })?;
    // The gate's early form where it takes the shape (its own kernel: less code to fetch).
    let early_name = up.kernel("hc_read_gate_se");
    let kernel = if gate_early(cx, up, streams, rank) {
        early_name.as_str()
    } else {
        kernel
    };
    let f = cx.function(FILE, kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *x);
    arg_out_or_null(&mut b, &mut inj);
    b.arg(h).arg(&*part).arg(&*ssq).arg(norm);
    arg_matrix(&mut b, up);
    b.arg(&s64)
        .arg(&h64)
        .arg(&r64)
        .arg(&g64)
        .arg(&wl64)
        .arg(&eps);
    let warps = 8usize;
    let cfg = LaunchConfig {
        grid_dim: (hid.div_ceil(warps) as u32, rows as u32, 1),
        block_dim: ((warps * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: block (b, t) reads part/ssq of row t (written by the launch above on this stream),
    // the early form `up` in 16-byte chunks where gate_early found them whole and aligned,
    // stages rank <= HC_GATE_MAX_RANK activations, and writes x[t, c] for its 8 channels and,
    // block (0, t), inj[t, :] when there are gains (inj is null and never written otherwise).
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok((x, inj))
}

/// Hyper-connection injection gains (`ops::hyper::hc_inject`): `2 * sigmoid(hn·wᵀ / C)`,
/// `hn [rows, streams*H]`, `w [streams, streams*H]` → `[rows, streams]`. One warp per gain, or
/// (`block`, up to `FEW_ROWS` rows) a block per gain.
pub fn hc_inject(
    cx: &Launch,
    hn: &CudaSlice<f32>,
    w: &DeviceMatrix,
    rows: usize,
    streams: usize,
    block: bool,
) -> Result<Buf<f32>, CudaError> {
    let kernel_name = w.kernel(if block {
        "hc_inject_block"
    } else {
        "hc_inject_warp"
    });
    let kernel = kernel_name.as_str();
    let width = hn.len().checked_div(rows).unwrap_or(0);
    shape(
        kernel,
        rows > 0
            && streams > 0
            && width > 0
            && hn.len() == rows * width
            && width.is_multiple_of(streams)
            && w.len() == streams * width,
        || {
            format!(
                "hn {} values, rows {rows}, streams {streams}, weight {} values",
                hn.len(),
                w.len()
            )
        },
    )?;
    let f = cx.function(FILE, kernel)?;
    let outputs = rows * streams;
    let mut y = cx.output::<f32>(outputs, kernel)?;
    let (r64, s64, w64) = (rows as i64, streams as i64, width as i64);
    shape(kernel, !block || rows <= FEW_ROWS, || {
        format!("{rows} rows: the block form takes at most {FEW_ROWS}")
    })?;
    let cfg = if block {
        block_grid(outputs)
    } else {
        warp_grid(outputs)
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(hn);
    arg_matrix(&mut b, w);
    b.arg(&r64).arg(&s64).arg(&w64);
    // SAFETY: hn is rows*width, w streams*width, y rows*streams, all checked above.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
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
