//! One function per kernel: checks the shapes on the host, picks the launch geometry, launches
//! on the device's stream. Names follow `<op>_<variant>_<dtype>` as in `kernels/*.cu`.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::context::Launch;
use super::device::Buf;
use super::error::CudaError;

pub mod attention;
pub mod embed;
pub mod gdn;
pub mod layout;
pub mod linear;
pub mod linear_few;
pub mod moe;
pub mod moe_nvfp4;
pub mod moe_nvfp4_persistent;
pub mod moe_nvfp4_union;
pub mod ple;
pub mod sampling;

pub use embed::{embed, embed_streams, ple_embed, NgramHash};
pub(crate) use linear::arg_matrix;
pub use linear::{linear_hc_write, linear_mma, linear_rows, linear_tiled, DeviceMatrix};

pub(crate) fn shape(kernel: &str, ok: bool, msg: impl FnOnce() -> String) -> Result<(), CudaError> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Shape {
            kernel: kernel.to_string(),
            msg: msg(),
        })
    }
}

pub(crate) fn grid_for(n: usize, block: u32) -> LaunchConfig {
    let blocks = n.div_ceil(block as usize).clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Blocks of 8 warps, a warp per output (grid-strided past the grid limit).
pub(crate) fn warp_grid(outputs: usize) -> LaunchConfig {
    const WARPS: usize = 8;
    LaunchConfig {
        grid_dim: (outputs.div_ceil(WARPS).clamp(1, 65_535 * 8) as u32, 1, 1),
        block_dim: ((WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn launched(kernel: &str, r: Result<(), cudarc::driver::DriverError>) -> Result<(), CudaError> {
    r.map_err(|e| CudaError::driver(format!("launching {kernel}"), None, e))
}

/// Elementwise ops with one input: `silu`, `sigmoid`.
pub fn unary(cx: &Launch, op: &str, x: &CudaSlice<f32>) -> Result<Buf<f32>, CudaError> {
    let kernel = format!("{op}_reference_f32");
    let f = cx.function("elementwise.cu", &kernel)?;
    let n = x.len();
    let mut y = cx.output::<f32>(n, &kernel)?;
    let n64 = n as i64;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x).arg(&n64);
    // SAFETY: the kernel reads n floats of x and writes n floats of y, both n long.
    launched(&kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

/// `div_by` or `mul_by` a scalar.
pub fn scalar(cx: &Launch, op: &str, x: &CudaSlice<f32>, by: f32) -> Result<Buf<f32>, CudaError> {
    let kernel = format!("{op}_reference_f32");
    let f = cx.function("elementwise.cu", &kernel)?;
    let n = x.len();
    let mut y = cx.output::<f32>(n, &kernel)?;
    let n64 = n as i64;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(x).arg(&by).arg(&n64);
    // SAFETY: as `unary`.
    launched(&kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

pub fn add(cx: &Launch, a: &CudaSlice<f32>, b_in: &CudaSlice<f32>) -> Result<Buf<f32>, CudaError> {
    let kernel = "add_reference_f32";
    shape(kernel, a.len() == b_in.len(), || {
        format!("lengths {} and {}", a.len(), b_in.len())
    })?;
    let f = cx.function("elementwise.cu", kernel)?;
    let n = a.len();
    let mut y = cx.output::<f32>(n, kernel)?;
    let n64 = n as i64;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y).arg(a).arg(b_in).arg(&n64);
    // SAFETY: all three buffers hold n floats.
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

/// `a * b` with `a [rows, width]` and `b [rows, width]` or `[rows, 1]`.
pub fn mul(
    cx: &Launch,
    a: &CudaSlice<f32>,
    b_in: &CudaSlice<f32>,
    rows: usize,
) -> Result<Buf<f32>, CudaError> {
    scaled_by(cx, "mul", a, b_in, rows)
}

/// `x * sigmoid(gate)` (`Op::SigmoidMul`), `gate` shaped as `mul`'s `b`.
pub fn sigmoid_mul(
    cx: &Launch,
    x: &CudaSlice<f32>,
    gate: &CudaSlice<f32>,
    rows: usize,
) -> Result<Buf<f32>, CudaError> {
    scaled_by(cx, "sigmoid_mul", x, gate, rows)
}

/// `<op>_reference_f32(y, a, b, width, b_width, n)`: `a [rows, width]` scaled elementwise by a
/// function of `b [rows, width]` or `[rows, 1]`.
fn scaled_by(
    cx: &Launch,
    op: &str,
    a: &CudaSlice<f32>,
    b_in: &CudaSlice<f32>,
    rows: usize,
) -> Result<Buf<f32>, CudaError> {
    let kernel = format!("{op}_reference_f32");
    shape(
        &kernel,
        rows > 0 && a.len().is_multiple_of(rows) && (b_in.len() == a.len() || b_in.len() == rows),
        || format!("a has {} values, b {}, rows {rows}", a.len(), b_in.len()),
    )?;
    let f = cx.function("elementwise.cu", &kernel)?;
    let n = a.len();
    let width = (n / rows) as i64;
    let b_width = (b_in.len() / rows) as i64;
    let mut y = cx.output::<f32>(n, &kernel)?;
    let n64 = n as i64;
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(a)
        .arg(b_in)
        .arg(&width)
        .arg(&b_width)
        .arg(&n64);
    // SAFETY: b is indexed below its length by the width check above.
    launched(&kernel, unsafe { b.launch(grid_for(n, 256)) })?;
    Ok(y)
}

/// Grouped RMS norm (`ops::norm::rms_norm`).
pub fn rms_norm(
    cx: &Launch,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    group: usize,
    unit_offset: bool,
    eps: f32,
) -> Result<Buf<f32>, CudaError> {
    let kernel = "rms_norm_reference_f32";
    shape(
        kernel,
        group > 0
            && x.len().is_multiple_of(group)
            && !w.is_empty()
            && (w.len() == group || x.len().is_multiple_of(w.len())),
        || format!("x {} values, group {group}, weight {}", x.len(), w.len()),
    )?;
    let f = cx.function("norm.cu", kernel)?;
    let groups = (x.len() / group) as i64;
    let mut y = cx.output::<f32>(x.len(), kernel)?;
    let (g32, wl, uo) = (group as i32, w.len() as i32, unit_offset as i32);
    // About two float4s a thread (the kernel keeps up to four in registers): fewer, fuller
    // warps make the block's reduction shorter than one thread per channel would.
    let threads = group.div_ceil(8).next_multiple_of(32).clamp(32, 1024) as u32;
    let cfg = LaunchConfig {
        grid_dim: ((groups as usize).min(65_535 * 8) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = cx.launch_builder(&f);
    b.arg(&mut *y)
        .arg(x)
        .arg(w)
        .arg(&groups)
        .arg(&g32)
        .arg(&wl)
        .arg(&uo)
        .arg(&eps);
    // SAFETY: groups*group == x.len() == y.len(); w is indexed modulo its length.
    launched(kernel, unsafe { b.launch(cfg) })?;
    Ok(y)
}

/// Fills `out` with uniform values in `[lo, hi)` derived from `(seed, index)`.
pub fn fill_uniform(
    cx: &Launch,
    out: &mut DeviceMatrix,
    seed: u64,
    lo: f32,
    hi: f32,
) -> Result<(), CudaError> {
    let n = out.len();
    let n64 = n as i64;
    let (kernel, f) = match out {
        DeviceMatrix::F32(_) => (
            "fill_uniform_f32",
            cx.function("random.cu", "fill_uniform_f32")?,
        ),
        DeviceMatrix::Bf16(_) => (
            "fill_uniform_bf16",
            cx.function("random.cu", "fill_uniform_bf16")?,
        ),
    };
    let mut b = cx.launch_builder(&f);
    arg_matrix(&mut b, out);
    b.arg(&n64).arg(&seed).arg(&lo).arg(&hi);
    // SAFETY: the kernel writes exactly n elements of `out`.
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })
}

/// Fills `out` with bytes uniform in `[lo, hi]`, value i a function of (seed, i) only.
pub fn fill_bytes(
    cx: &Launch,
    out: &mut CudaSlice<u8>,
    seed: u64,
    lo: u8,
    hi: u8,
) -> Result<(), CudaError> {
    let kernel = "fill_bytes_u8";
    let n = out.len();
    let (n64, lo32, hi32) = (n as i64, lo.min(hi) as u32, hi.max(lo) as u32);
    let f = cx.function("random.cu", kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(out).arg(&n64).arg(&seed).arg(&lo32).arg(&hi32);
    // SAFETY: the kernel writes exactly n bytes of `out`.
    launched(kernel, unsafe { b.launch(grid_for(n, 256)) })
}

/// Keeps the GPU busy for `ns` nanoseconds (one thread spinning on the global timer): profiling
/// queues a whole step behind it, so that its events time kernels and not the host's launches.
/// A kernel that only waits (`trace_end` in kernels/timing.cu): with the step timeline on
/// (`exec::cuda::trace`), its release marks the end of the kernel before it.
pub fn trace_end(cx: &Launch) -> Result<(), CudaError> {
    let kernel = "trace_end";
    let f = cx.function("timing.cu", kernel)?;
    let mut b = cx.launch_builder(&f);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel touches no memory (but the trace buffer, when tracing).
    launched(kernel, unsafe { b.launch(cfg) })
}

/// Reads every 16-byte word of `m` and nothing else (`read_bytes` in kernels/timing.cu: the
/// benchmark's read ceiling), a grid of `blocks_per_sm` blocks of 256 threads a multiprocessor.
/// `out`: one word the kernel may write.
pub fn read_bytes(
    cx: &Launch,
    out: &mut CudaSlice<u32>,
    m: &DeviceMatrix,
    blocks_per_sm: usize,
) -> Result<(), CudaError> {
    let kernel = "read_bytes";
    let bytes = m.bytes();
    shape(
        kernel,
        m.device_address(&cx.stream).is_multiple_of(16)
            && bytes.is_multiple_of(16)
            && !out.is_empty(),
        || format!("{bytes} bytes, not whole aligned 16-byte words, or no output word"),
    )?;
    let f = cx.function("timing.cu", kernel)?;
    let chunks = (bytes / 16) as i64;
    let mut b = cx.launch_builder(&f);
    b.arg(out);
    linear::arg_matrix(&mut b, m);
    b.arg(&chunks);
    let cfg = LaunchConfig {
        grid_dim: ((cx.multiprocessors * blocks_per_sm.max(1)) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel reads the `chunks` whole 16-byte words of the matrix (checked above)
    // and writes at most the one word of `out`.
    launched(kernel, unsafe { b.launch(cfg) })
}

pub fn hold_gpu(cx: &Launch, ns: i64) -> Result<(), CudaError> {
    let kernel = "hold_gpu";
    let f = cx.function("timing.cu", kernel)?;
    let mut b = cx.launch_builder(&f);
    b.arg(&ns);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernel touches no memory.
    launched(kernel, unsafe { b.launch(cfg) })
}
