//! Gated DeltaNet on the device (`kernels/gdn.cu`): the causal convolution with its window state
//! (`ops::conv::causal_conv`), the gates and the recurrence (`ops::gdn`).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{grid_for, launched, shape};
use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::error::CudaError;
use crate::ops::gdn::GdnShape;

/// Up to this many rows the convolution and the window's shift are one launch (a thread per
/// channel); more rows take a thread per channel over runs of [`CONV_ROWS`] rows (at most
/// [`CONV_MAX_TAPS`] taps; more: a thread per output value), then the shift.
use crate::registry::cuda::gdn::{
    BLOCK_COLS, BLOCK_MAX_DK, CONV_MAX_TAPS, CONV_NORMED_MAX_ROWS, CONV_ROWS,
    CONV_STEP_ROWS as STEP_ROWS, NORMED_MAX_DK, NORMED_MAX_DV, NORMED_WARP_COLS, WARPS_PER_BLOCK,
    WARP_COLS, WARP_MAX_DK,
};

/// Which causal-convolution kernel runs (the `causal_conv` variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvKernel {
    /// `causal_conv_reference_f32`: a thread per output value, then the window's shift.
    Reference,
    /// `causal_conv_rows_f32`: a thread per channel over runs of rows (up to `CONV_MAX_TAPS`).
    Rows,
    /// `causal_conv_step_f32`: up to `STEP_ROWS` rows, the shift in the same launch.
    Step,
}

impl ConvKernel {
    pub const ALL: [ConvKernel; 3] = [ConvKernel::Reference, ConvKernel::Rows, ConvKernel::Step];

    /// The kernel a rule names (`reference`, `rows`, `step`).
    pub fn from_variant(name: &str) -> Option<ConvKernel> {
        match name {
            "reference" => Some(ConvKernel::Reference),
            "rows" => Some(ConvKernel::Rows),
            "step" => Some(ConvKernel::Step),
            _ => None,
        }
    }
}

/// Causal depthwise convolution of `x [rows, width]` with `w [width, kernel]`; `window
/// [(kernel-1)*dilation, width]` holds the previous inputs (oldest first) and is updated in place
/// to the last `(kernel-1)*dilation` rows of `window ++ x`.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv(
    cx: &Launch,
    x: &CudaSlice<f32>,
    window: &mut CudaSlice<f32>,
    w: &CudaSlice<f32>,
    rows: usize,
    kernel: usize,
    dilation: usize,
    silu: bool,
    how: ConvKernel,
) -> Result<Buf<f32>, CudaError> {
    let name = "causal_conv_reference_f32";
    shape(
        name,
        rows > 0 && kernel > 0 && dilation > 0 && x.len().is_multiple_of(rows) && !x.is_empty(),
        || {
            format!(
                "x {} values, rows {rows}, kernel {kernel}, dilation {dilation}",
                x.len()
            )
        },
    )?;
    let width = x.len() / rows;
    let past = (kernel - 1) * dilation;
    shape(
        name,
        window.len() == past * width && w.len() == width * kernel,
        || {
            format!(
                "width {width}: window {} values for {past} rows, weight {} for kernel {kernel}",
                window.len(),
                w.len()
            )
        },
    )?;
    let n = rows * width;
    let (r64, w64) = (rows as i64, width as i64);
    let (k32, d32, s32) = (kernel as i32, dilation as i32, silu as i32);
    shape(
        name,
        match how {
            ConvKernel::Step => rows <= STEP_ROWS,
            ConvKernel::Rows => kernel <= CONV_MAX_TAPS,
            ConvKernel::Reference => true,
        },
        || {
            format!("{how:?} takes at most {STEP_ROWS} rows (step) or {CONV_MAX_TAPS} taps (rows): {rows} rows, {kernel} taps")
        },
    )?;
    if how == ConvKernel::Step {
        // One launch: a thread per channel, its rows in order, then its window's shift.
        let name = "causal_conv_step_f32";
        let f = cx.function("gdn.cu", name)?;
        let mut y = cx.output::<f32>(n, name)?;
        let mut b = cx.launch_builder(&f);
        b.arg(&mut *y)
            .arg(&mut *window)
            .arg(x)
            .arg(w)
            .arg(&r64)
            .arg(&w64)
            .arg(&k32)
            .arg(&d32)
            .arg(&s32);
        // SAFETY: the shapes checked above (see many_rows_conv); each thread reads and then
        // rewrites only its own channel's window.
        launched(name, unsafe { b.launch(grid_for(width, 256)) })?;
        return Ok(y);
    }
    let y = if how == ConvKernel::Rows {
        // A thread per channel over runs of CONV_ROWS rows (no division an element).
        let cfg = LaunchConfig {
            grid_dim: (
                width.div_ceil(256).clamp(1, 65_535) as u32,
                rows.div_ceil(CONV_ROWS).clamp(1, 65_535) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // kernel <= CONV_MAX_TAPS (the kernel's register weights); both grid dimensions stride.
        many_rows_conv(
            cx,
            "causal_conv_rows_f32",
            cfg,
            x,
            window,
            w,
            [r64, w64],
            [k32, d32, s32],
        )?
    } else {
        // A thread per value.
        many_rows_conv(
            cx,
            name,
            grid_for(n, 256),
            x,
            window,
            w,
            [r64, w64],
            [k32, d32, s32],
        )?
    };
    shift_window(cx, window, x, rows, width, past)?;
    Ok(y)
}

/// A many-row convolution kernel (`causal_conv_rows_f32` or `causal_conv_reference_f32`: the
/// same arguments) into a new output; the window is only read. Shapes were checked by the
/// caller: y and x hold rows*width floats, window past*width, w width*kernel, and every ext row
/// read is in [0, past + rows).
#[allow(clippy::too_many_arguments)]
fn many_rows_conv(
    cx: &Launch,
    name: &str,
    cfg: LaunchConfig,
    x: &CudaSlice<f32>,
    window: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    [rows, width]: [i64; 2],
    [kernel, dilation, silu]: [i32; 3],
) -> Result<Buf<f32>, CudaError> {
    let f = cx.function("gdn.cu", name)?;
    let mut y = cx.output::<f32>((rows * width) as usize, name)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(x)
        .arg(window)
        .arg(w)
        .arg(&rows)
        .arg(&width)
        .arg(&kernel)
        .arg(&dilation)
        .arg(&silu);
    // SAFETY: the shapes above, checked by the caller.
    launched(name, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// The window's shift after a many-row convolution (`causal_conv_window_f32`): its `past` rows
/// become the last `past` rows of `window ++ x`. Shapes were checked by the caller.
fn shift_window(
    cx: &Launch,
    window: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    rows: usize,
    width: usize,
    past: usize,
) -> Result<(), CudaError> {
    if past == 0 {
        return Ok(());
    }
    let name = "causal_conv_window_f32";
    let (r64, w64, p64) = (rows as i64, width as i64, past as i64);
    let f = cx.function("gdn.cu", name)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *window).arg(x).arg(&r64).arg(&w64).arg(&p64);
    // SAFETY: window holds past*width floats and x rows*width (checked by the caller). Launched
    // after the convolution on the same stream, so every read of the old window is done; within
    // it, one thread per channel shifts rows in ascending order, reading only rows it has not
    // yet overwritten.
    launched(name, unsafe { b.launch(grid_for(width, 256)) })
}

/// `(beta, g)` for `b`, `a [rows, heads]`: `beta = sigmoid(b)`,
/// `g = -exp(a_log) * softplus(a + dt_bias)` (torch's softplus, threshold 20).
pub fn gdn_gates(
    cx: &Launch,
    b_in: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    rows: usize,
    heads: usize,
) -> Result<(Buf<f32>, Buf<f32>), CudaError> {
    let name = "gdn_gates_reference_f32";
    shape(
        name,
        rows > 0
            && heads > 0
            && b_in.len() == rows * heads
            && a.len() == rows * heads
            && a_log.len() == heads
            && dt_bias.len() == heads,
        || {
            format!(
                "rows {rows}, heads {heads}: b {}, a {}, A_log {}, dt_bias {} values",
                b_in.len(),
                a.len(),
                a_log.len(),
                dt_bias.len()
            )
        },
    )?;
    let f = cx.function("gdn.cu", name)?;
    let n = rows * heads;
    let mut beta = cx.output::<f32>(n, "gdn beta")?;
    let mut g = cx.output::<f32>(n, "gdn g")?;
    let (n64, h32) = (n as i64, heads as i32);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *beta)
        .arg(&mut *g)
        .arg(b_in)
        .arg(a)
        .arg(a_log)
        .arg(dt_bias)
        .arg(&n64)
        .arg(&h32);
    // SAFETY: beta, g, b and a hold n floats; a_log and dt_bias are indexed modulo heads.
    launched(name, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok((beta, g))
}

/// Where the recurrence takes each token's gates from.
pub enum GdnGates<'a> {
    /// `beta`, `g [rows, Vh]` as `gdn_gates` makes them.
    Given {
        beta: &'a CudaSlice<f32>,
        g: &'a CudaSlice<f32>,
    },
    /// Formed in the recurrence's kernel from `b`, `a [rows, Vh]` and `A_log`, `dt_bias [Vh]`
    /// (`Op::GdnGatedRecurrence`), with the same expressions as `gdn_gates`.
    Raw {
        b: &'a CudaSlice<f32>,
        a: &'a CudaSlice<f32>,
        a_log: &'a CudaSlice<f32>,
        dt_bias: &'a CudaSlice<f32>,
    },
}

impl<'a> GdnGates<'a> {
    /// The kernel for `layout`, and its gate arguments in order: two `[rows, Vh]`, then (raw)
    /// two `[Vh]`.
    fn kernel_and_args(&self, layout: GdnLayout) -> (&'static str, Vec<&'a CudaSlice<f32>>) {
        let warp = layout == GdnLayout::WarpColumns;
        match *self {
            GdnGates::Given { beta, g } => (
                if warp {
                    "gdn_recurrence_warp_f32"
                } else {
                    "gdn_recurrence_reference_f32"
                },
                vec![beta, g],
            ),
            GdnGates::Raw {
                b,
                a,
                a_log,
                dt_bias,
            } => (
                if warp {
                    "gdn_gated_recurrence_warp_f32"
                } else {
                    "gdn_gated_recurrence_f32"
                },
                vec![b, a, a_log, dt_bias],
            ),
        }
    }
}

/// How the recurrence's kernel lays a head's state `[dk, dv]` over threads (kernels/gdn.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnLayout {
    /// A block per (head, 32 columns), a warp per 32 rows: four block barriers a token; dk up to
    /// 512.
    Block,
    /// A warp per (head, 4 columns), each lane 2 columns x 8 rows (kernels/gdn.cu `GdnLanes<16>`),
    /// the tokens staged a chunk at a time: no block barrier a token; dk up to 128
    /// (`GDNW_MAX_DK`).
    WarpColumns,
}

impl GdnLayout {
    /// Both layouts, for the tests.
    pub const ALL: [GdnLayout; 2] = [GdnLayout::Block, GdnLayout::WarpColumns];

    /// The layout a rule names (`reference`: the block layout, `warp`).
    pub fn from_variant(name: &str) -> Option<GdnLayout> {
        match name {
            "reference" => Some(GdnLayout::Block),
            "warp" => Some(GdnLayout::WarpColumns),
            _ => None,
        }
    }

    fn max_dk(self) -> usize {
        match self {
            GdnLayout::Block => BLOCK_MAX_DK,
            GdnLayout::WarpColumns => WARP_MAX_DK,
        }
    }

    /// Grid and block for `s`.
    fn launch(self, s: &GdnShape) -> LaunchConfig {
        let (grid_y, threads) = match self {
            GdnLayout::Block => (
                s.value_dim.div_ceil(BLOCK_COLS),
                s.key_dim.next_multiple_of(32),
            ),
            GdnLayout::WarpColumns => (
                s.value_dim.div_ceil(WARP_COLS * WARPS_PER_BLOCK),
                WARPS_PER_BLOCK * 32,
            ),
        };
        LaunchConfig {
            grid_dim: (s.value_heads as u32, grid_y as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// The head shape and step length recurrence kernel `name` takes: rows in 1..=i32::MAX, Kh > 0
/// dividing Vh ≤ 65 535 (a grid dimension), dk in 1..=max_dk, dv in 1..=max_dv.
fn check_heads(
    name: &str,
    s: &GdnShape,
    rows: usize,
    max_dk: usize,
    max_dv: usize,
) -> Result<(), CudaError> {
    let (kh, vh, dk, dv) = (s.key_heads, s.value_heads, s.key_dim, s.value_dim);
    shape(
        name,
        rows > 0
            && rows <= i32::MAX as usize
            && kh > 0
            && vh.is_multiple_of(kh)
            && vh <= 65_535
            && (1..=max_dk).contains(&dk)
            && (1..=max_dv).contains(&dv),
        || {
            let dv_bound = if max_dv == usize::MAX {
                String::new()
            } else {
                format!(" (at most {max_dv})")
            };
            format!("Kh {kh}, Vh {vh}, dk {dk} (at most {max_dk}), dv {dv}{dv_bound}, rows {rows}")
        },
    )
}

/// `gdn_recurrence` with the given layout (the tests try both).
pub fn gdn_recurrence_with(
    cx: &Launch,
    qkv: &CudaSlice<f32>,
    gates: GdnGates<'_>,
    state: &mut CudaSlice<f32>,
    rows: usize,
    s: &GdnShape,
    layout: GdnLayout,
) -> Result<Buf<f32>, CudaError> {
    let (name, gate_args) = gates.kernel_and_args(layout);
    let max_dk = layout.max_dk();
    let cfg = layout.launch(s);
    let (kh, vh, dk, dv) = (s.key_heads, s.value_heads, s.key_dim, s.value_dim);
    check_heads(name, s, rows, max_dk, usize::MAX)?;
    shape(name, cfg.grid_dim.1 <= 65_535, || {
        format!("dv {dv}: more column blocks than a grid dimension holds")
    })?;
    let width = 2 * kh * dk + vh * dv;
    let gate_lens: Vec<usize> = gate_args.iter().map(|g| g.len()).collect();
    shape(
        name,
        qkv.len() == rows * width
            && gate_lens[..2].iter().all(|&n| n == rows * vh)
            && gate_lens[2..].iter().all(|&n| n == vh)
            && state.len() == vh * dk * dv,
        || {
            format!(
                "rows {rows} of width {width}: qkv {}, gates {gate_lens:?}, state {} values \
                 (want [rows*Vh] twice, then [Vh] for A_log and dt_bias; state {})",
                qkv.len(),
                state.len(),
                vh * dk * dv
            )
        },
    )?;
    let f = cx.function("gdn.cu", name)?;
    let mut out = cx.output::<f32>(rows * vh * dv, name)?;
    let (r32, kh32, vh32, dk32, dv32) = (rows as i32, kh as i32, vh as i32, dk as i32, dv as i32);
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out).arg(&mut *state).arg(qkv);
    for g in &gate_args {
        b.arg(*g);
    }
    b.arg(&r32).arg(&kh32).arg(&vh32).arg(&dk32).arg(&dv32);
    // SAFETY: the lengths were checked above; block (h, c) touches only state rows of head h and
    // its own columns (Block: [32c, 32c+32); WarpColumns: 4 a warp from 16c) ∩ [0, dv), and o's
    // columns of the same; dk is at most the layout's bound, which the kernel's shared arrays
    // and registers cover (Block: blockDim 32*ceil(dk/32) ≤ GDN_MAX_THREADS).
    launched(name, unsafe { b.launch(cfg) })?;
    Ok(out)
}

/// The gated recurrence with the output norm as its epilogue (`Op::GdnNormedRecurrence`,
/// `ops::gdn::normed_recurrence`): over `rows` tokens of `qkv [rows, 2*Kh*dk + Vh*dv]` with the
/// gates formed from `b`, `a [rows, Vh]`, `a_log`, `dt_bias [Vh]` (as `gdn_gates`); `state [Vh,
/// dk, dv]` is updated in place. Returns `y [rows, Vh*dv]`: each value head's `o` times
/// `rsqrt(mean(o²) + eps) * norm_w * act(z)` (as `layout::gated_rms_norm`), `z [rows, Vh*dv]`,
/// `norm_w [dv]`, `act` sigmoid when `sigmoid`, else silu. A block per value head: for
/// decode-sized steps (the executor's fusion predicate keeps longer steps on the staged scan).
#[allow(clippy::too_many_arguments)]
pub fn gdn_normed_recurrence(
    cx: &Launch,
    qkv: &CudaSlice<f32>,
    b_in: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    norm_w: &CudaSlice<f32>,
    state: &mut CudaSlice<f32>,
    rows: usize,
    s: &GdnShape,
    sigmoid: bool,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let name = "gdn_normed_recurrence_f32";
    let (kh, vh, dk, dv) = (s.key_heads, s.value_heads, s.key_dim, s.value_dim);
    check_heads(name, s, rows, NORMED_MAX_DK, NORMED_MAX_DV)?;
    let width = 2 * kh * dk + vh * dv;
    shape(
        name,
        qkv.len() == rows * width
            && b_in.len() == rows * vh
            && a.len() == rows * vh
            && a_log.len() == vh
            && dt_bias.len() == vh
            && z.len() == rows * vh * dv
            && norm_w.len() == dv
            && state.len() == vh * dk * dv,
        || {
            format!(
                "rows {rows} of width {width}: qkv {}, b {}, a {}, A_log {}, dt_bias {}, z {}, \
                 norm weight {}, state {} values (want rows*Vh for b and a, Vh for A_log and \
                 dt_bias, rows*Vh*dv for z, dv for the weight, Vh*dk*dv for the state)",
                qkv.len(),
                b_in.len(),
                a.len(),
                a_log.len(),
                dt_bias.len(),
                z.len(),
                norm_w.len(),
                state.len()
            )
        },
    )?;
    let f = cx.function("gdn.cu", name)?;
    let mut out = cx.output::<f32>(rows * vh * dv, name)?;
    let (r32, kh32, vh32, dk32, dv32) = (rows as i32, kh as i32, vh as i32, dk as i32, dv as i32);
    let sig = sigmoid as i32;
    let cfg = LaunchConfig {
        grid_dim: (vh as u32, 1, 1),
        block_dim: ((dv.div_ceil(NORMED_WARP_COLS) * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out)
        .arg(&mut *state)
        .arg(qkv)
        .arg(b_in)
        .arg(a)
        .arg(a_log)
        .arg(dt_bias)
        .arg(z)
        .arg(norm_w)
        .arg(&r32)
        .arg(&kh32)
        .arg(&vh32)
        .arg(&dk32)
        .arg(&dv32)
        .arg(&sig)
        .arg(&eps);
    // SAFETY: the lengths were checked above; block h touches only head h's state [dk, dv], o's
    // and z's columns [h*dv, (h+1)*dv) and the gates of head h; dk ≤ 128 and dv ≤ 128, which the
    // kernel's shared arrays (GDNW_MAX_DK rows, GDNN_MAX_DV columns) and its 16 rows x 2 columns
    // a lane cover; blockDim 32*ceil(dv/8) ≤ GDNN_MAX_THREADS (its launch bound).
    launched(name, unsafe { b.launch(cfg) })?;
    Ok(out)
}

/// Whether `gdn_conv_normed_recurrence_f32` takes a step of `rows` over shape `s` with a
/// convolution of `kernel` taps: heads of up to 128 x 128, 1 to 8 rows and taps, whole groups
/// of value heads a key head, and key heads that the device's arrival counters cover
/// ([`Gpu::counters`]); as `registry::cuda::gdn` declares it.
fn conv_normed_takes(cx: &Launch, s: &GdnShape, kernel: usize, rows: usize) -> bool {
    let whole_groups = s.key_heads > 0
        && s.value_heads >= s.key_heads
        && s.value_heads.is_multiple_of(s.key_heads);
    whole_groups
        && (1..=NORMED_MAX_DK).contains(&s.key_dim)
        && (1..=NORMED_MAX_DV).contains(&s.value_dim)
        && (1..=CONV_NORMED_MAX_ROWS).contains(&rows)
        && (1..=CONV_MAX_TAPS).contains(&kernel)
        && s.key_heads <= cx.counter_count()
}

/// The causal convolution (`kernel` taps, dilation 1, SiLU) of the raw projection `qkv [rows,
/// 2*Kh*dk + Vh*dv]` folded into the normed recurrence (`Op::GdnConvNormedRecurrence`,
/// `ops::gdn::conv_normed_recurrence`): `conv_w [width, kernel]`, `window [kernel - 1, width]`
/// (updated in place as [`causal_conv`] does), then as [`gdn_normed_recurrence`] over the
/// convolution's output with `b`, `a`, `a_log`, `dt_bias`, `z`, `norm_w` and `state [Vh, dk, dv]`
/// (updated in place). Returns `y [rows, Vh*dv]`, bit for bit what `causal_conv` then
/// `gdn_normed_recurrence` give. A block per value head, the value heads of a key head meeting at
/// an arrival counter: for decode-sized steps ([`conv_normed_takes`]).
#[allow(clippy::too_many_arguments)]
pub fn gdn_conv_normed_recurrence(
    cx: &Launch,
    qkv: &CudaSlice<f32>,
    conv_w: &CudaSlice<f32>,
    window: &mut CudaSlice<f32>,
    b_in: &CudaSlice<f32>,
    a: &CudaSlice<f32>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    norm_w: &CudaSlice<f32>,
    state: &mut CudaSlice<f32>,
    rows: usize,
    s: &GdnShape,
    kernel: usize,
    sigmoid: bool,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let name = "gdn_conv_normed_recurrence_f32";
    let (kh, vh, dk, dv) = (s.key_heads, s.value_heads, s.key_dim, s.value_dim);
    check_heads(name, s, rows, NORMED_MAX_DK, NORMED_MAX_DV)?;
    shape(name, conv_normed_takes(cx, s, kernel, rows), || {
        format!(
            "rows {rows} (at most {CONV_NORMED_MAX_ROWS}), kernel {kernel} (1 to \
                 {CONV_MAX_TAPS} taps), {kh} key heads (at most {})",
            cx.counter_count()
        )
    })?;
    let width = 2 * kh * dk + vh * dv;
    shape(
        name,
        qkv.len() == rows * width
            && conv_w.len() == width * kernel
            && window.len() == (kernel - 1) * width
            && b_in.len() == rows * vh
            && a.len() == rows * vh
            && a_log.len() == vh
            && dt_bias.len() == vh
            && z.len() == rows * vh * dv
            && norm_w.len() == dv
            && state.len() == vh * dk * dv,
        || {
            format!(
                "rows {rows} of width {width}, kernel {kernel}: qkv {}, conv weight {}, window \
                 {}, b {}, a {}, A_log {}, dt_bias {}, z {}, norm weight {}, state {} values \
                 (want width*kernel for the conv weight, (kernel-1)*width for the window, \
                 rows*Vh for b and a, Vh for A_log and dt_bias, rows*Vh*dv for z, dv for the \
                 norm weight, Vh*dk*dv for the state)",
                qkv.len(),
                conv_w.len(),
                window.len(),
                b_in.len(),
                a.len(),
                a_log.len(),
                dt_bias.len(),
                z.len(),
                norm_w.len(),
                state.len()
            )
        },
    )?;
    let f = cx.function("gdn.cu", name)?;
    let counters = cx.counters();
    let mut out = cx.output::<f32>(rows * vh * dv, name)?;
    let (r32, kh32, vh32, dk32, dv32) = (rows as i32, kh as i32, vh as i32, dk as i32, dv as i32);
    let (k32, sig) = (kernel as i32, sigmoid as i32);
    let cfg = LaunchConfig {
        grid_dim: (vh as u32, 1, 1),
        block_dim: ((dv.div_ceil(NORMED_WARP_COLS) * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *out)
        .arg(&mut *window)
        .arg(&mut *state)
        .arg(qkv)
        .arg(conv_w)
        .arg(b_in)
        .arg(a)
        .arg(a_log)
        .arg(dt_bias)
        .arg(z)
        .arg(norm_w)
        .arg(&counters)
        .arg(&r32)
        .arg(&kh32)
        .arg(&vh32)
        .arg(&dk32)
        .arg(&dv32)
        .arg(&k32)
        .arg(&sig)
        .arg(&eps);
    // SAFETY: the lengths were checked above; as gdn_normed_recurrence for the state, o and z;
    // block h reads qkv's and the conv weight's columns of key head kh's q and k and of its own
    // v, and the window's rows of those columns, which it writes only for its v and (the last
    // of key head kh's blocks to arrive at counters[kh], each past its reads) key head kh's q
    // and k; counters holds at least Kh zeroed words (Gpu::counters; each launch leaves them
    // zero); rows ≤ 8 (GDNN_T rows of the kernel's shared convolution outputs), kernel ≤ 8
    // (CONV_MAX_TAPS: its registers and the next q and k rows in shared memory), 2*dk + dv ≤ 384
    // channels (its shared rows).
    launched(name, unsafe { b.launch(cfg) })?;
    Ok(out)
}
