//! The hyper-connection read on the device (`kernels/layout.cu`, as `ops::hyper`): the mix of
//! the streams through the low-rank projections (`hc_mix`), the injection gains (`hc_inject`),
//! and both fused with their RMS norm (`hc_read`).

use super::*;
use crate::registry::cuda::layout::{gate_early as gate_early_for, FEW_ROWS, HC_GATE_MAX_RANK};

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
    /// By stream, every row of a few (at most [`HC_FEW_ROWS`]) in each act block
    /// (`hc_read_act_s{R}_few`): each weight chunk loaded once a step, not once a row; each row's
    /// sums are the one-row kernel's.
    pub few_rows: bool,
    /// By stream, every row of a few in each gate block (`hc_read_gate_se_few`: a lane's up
    /// chunks held for all of them).
    pub few_gate: bool,
}
pub use crate::registry::cuda::layout::HC_FEW_ROWS;

impl HcReadAct {
    /// Every variant compiled in kernels/layout.cu (`HC_READ_KERNELS`), for the sweep and tests.
    pub const ALL: [HcReadAct; 10] = [
        HcReadAct::of(1, false, false),
        HcReadAct::of(2, false, false),
        HcReadAct::of(4, false, false),
        HcReadAct::of(2, true, false),
        HcReadAct::of(4, true, false),
        HcReadAct::of(8, true, false),
        HcReadAct::of(16, true, false),
        HcReadAct::few(2, true, true),
        HcReadAct::few(8, false, true),
        HcReadAct::few(16, false, true),
    ];

    pub const fn of(outputs_per_block: usize, by_stream: bool, few_rows: bool) -> HcReadAct {
        HcReadAct {
            outputs_per_block,
            by_stream,
            few_rows,
            few_gate: few_rows,
        }
    }

    /// By stream for a few rows: the act kernel's rows in one block (`rows`) or a grid row
    /// each, the gate's (`gate`) likewise.
    pub const fn few(outputs_per_block: usize, rows: bool, gate: bool) -> HcReadAct {
        HcReadAct {
            outputs_per_block,
            by_stream: true,
            few_rows: rows,
            few_gate: gate,
        }
    }

    /// The variant a rule names (`r1`, `r2`, `r4`, `s2`, `s4`: `registry::cuda::layout`).
    pub fn from_variant(name: &str) -> Option<HcReadAct> {
        HcReadAct::ALL.into_iter().find(|v| v.name() == name)
    }

    pub fn name(self) -> String {
        if self.few_rows {
            format!("s{}_few", self.outputs_per_block)
        } else if self.few_gate {
            format!("s{}_gate_few", self.outputs_per_block)
        } else if self.by_stream {
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
            "{per_block} outputs a block{}: kernels/layout.cu has 1, 2 and 4 a row, 2 and 4 a stream, 2 a stream for a few rows",
            if variant.by_stream { " a stream" } else { "" }
        )
    })?;
    let act_name = down.kernel(&format!(
        "hc_read_act_s{}{}",
        variant.outputs_per_block,
        if variant.few_rows { "_few" } else { "" }
    ));
    let act_name = if variant.by_stream {
        act_name
    } else {
        down.kernel(&format!("hc_read_act_{}", variant.name()))
    };
    let gate_name = down.kernel(if variant.few_gate {
        "hc_read_gate_se_few"
    } else if variant.by_stream {
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
            [variant.few_rows, variant.few_gate],
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
    [few_rows, few_gate]: [bool; 2],
) -> Result<(Buf<f32>, Option<Buf<f32>>), CudaError> {
    let hid = width / streams;
    shape(kernel, rank <= HC_GATE_MAX_RANK, || {
        format!("rank {rank}: the by-stream gate stages at most {HC_GATE_MAX_RANK} activations")
    })?;
    shape(
        kernel,
        !(few_rows || few_gate) || (rows <= HC_FEW_ROWS && gate_early(cx, up, streams, rank)),
        || {
            format!(
                "{rows} rows, {streams} streams of rank {rank}: the few-row kernels take up to {HC_FEW_ROWS} rows and the gate's early form (a warp's lanes holding an up row in 16-byte chunks)"
            )
        },
    )?;
    // The few-row kernels take every row in each block; the others a grid row a row.
    let grid_rows = |few: bool| if few { 1 } else { rows as u32 };
    let rows32 = rows as i32;
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
    if few_rows {
        b.arg(&rows32);
    }
    // Threads: a 16-byte chunk of the stream's slice each where the slice allows, at most 512.
    let threads = hid
        .div_ceil(down.chunk_len())
        .next_multiple_of(32)
        .clamp(32, 512);
    let cfg = LaunchConfig {
        grid_dim: (
            outs.div_ceil(per_block) as u32,
            streams as u32,
            grid_rows(few_rows),
        ),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: shapes checked by the caller; block (b, s, t) writes part[t, o, s] for its outputs
    // o < R + gains (inject, null without the injection, is read only for o >= R) and block
    // (0, s, t) ssq[t, s]; 16-byte loads only where the slice's length and addresses allow.
    launched(act_kernel, unsafe { b.launch(cfg) })?;
    // The gate's early form where it takes the shape (its own kernel: less code to fetch).
    let early_name = up.kernel("hc_read_gate_se");
    let kernel = if !few_gate && gate_early(cx, up, streams, rank) {
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
    if few_gate {
        b.arg(&rows32);
    }
    let warps = 8usize;
    let cfg = LaunchConfig {
        grid_dim: (hid.div_ceil(warps) as u32, grid_rows(few_gate), 1),
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
