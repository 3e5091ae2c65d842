//! Kernel launches through `cuLaunchKernelEx`, so that a launch may carry Hopper's
//! programmatic-dependent-launch attribute.
//!
//! A decode step is ~230 short kernels; between two of them the GPU drains the first, then starts
//! the second, whose loads only then begin. With the attribute
//! (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`), the next kernel may be scheduled
//! while the one before it still runs: it can prefetch its weights (never written during a step)
//! and then waits (`griddepcontrol.wait`, `wait_for_producers()` in `kernels/common.cuh`) until
//! the kernel before it has finished and its writes are visible. Every kernel calls that wait
//! before it touches anything but weights (a test in `kernels.rs` checks each kernel's text), so
//! the stream order of reads and writes is kept: by induction, when a kernel passes its wait,
//! every kernel before it has completed. Captured into a CUDA graph, the launches become
//! programmatic edges.
//!
//! The builder takes arguments as cudarc's does (`.arg(&x)`), but holds each one's bits itself:
//! graphrun turns cudarc's per-buffer event tracking off and orders its work on one stream.

use std::ffi::c_void;

use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaView, DevicePtr, DriverError, LaunchConfig,
};

use super::device::Gpu;

/// One kernel launch being built: the function and its arguments' bits, in order.
pub struct KernelLaunch<'a> {
    gpu: &'a Gpu,
    func: &'a CudaFunction,
    /// Whether the launch carries the programmatic-launch attribute.
    programmatic: bool,
    /// The node it belongs to (the timeline's label).
    node: &'a str,
    /// Each argument's bytes in the low bytes of a u64 (pointers and 64-bit scalars fill it,
    /// 32-bit scalars take the first four bytes, which is where the driver reads them on the
    /// little-endian hosts CUDA runs on).
    args: Vec<u64>,
}

/// A value that can be passed to a kernel parameter.
pub trait KernelArg {
    fn bits(&self, gpu: &Gpu) -> u64;
}

impl<T> KernelArg for &CudaSlice<T> {
    fn bits(&self, gpu: &Gpu) -> u64 {
        self.device_ptr(&gpu.stream).0
    }
}

impl<T> KernelArg for &CudaView<'_, T> {
    fn bits(&self, gpu: &Gpu) -> u64 {
        self.device_ptr(&gpu.stream).0
    }
}

impl<T> KernelArg for &mut CudaSlice<T> {
    fn bits(&self, gpu: &Gpu) -> u64 {
        // A shared reborrow gives the same address as `device_ptr_mut`.
        let s: &CudaSlice<T> = self;
        s.device_ptr(&gpu.stream).0
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $u:ty),*) => {$(
        impl KernelArg for &$t {
            fn bits(&self, _: &Gpu) -> u64 {
                // The value's own bytes, zero-extended.
                <$u>::from_ne_bytes(self.to_ne_bytes()) as u64
            }
        }
    )*};
}
scalar_arg!(i64 => u64, u64 => u64, f64 => u64, i32 => u32, u32 => u32, f32 => u32);

impl<'a> KernelLaunch<'a> {
    /// Made by [`Launch::launch_builder`](super::context::Launch::launch_builder).
    pub(super) fn new(
        gpu: &'a Gpu,
        func: &'a CudaFunction,
        programmatic: bool,
        node: &'a str,
    ) -> KernelLaunch<'a> {
        KernelLaunch {
            gpu,
            func,
            programmatic,
            node,
            args: Vec::with_capacity(16),
        }
    }

    pub fn arg<A: KernelArg>(&mut self, a: A) -> &mut Self {
        self.args.push(a.bits(self.gpu));
        self
    }

    /// Launches on the device's stream, with the programmatic-launch attribute when the device
    /// supports it and the step allows it ([`Launch::programmatic_launch`](super::context::Launch)).
    ///
    /// # Safety
    /// As cudarc's `launch`: the arguments must match the kernel's parameters in number, order
    /// and type, and the kernel must stay inside the buffers it is given.
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<(), DriverError> {
        self.gpu.ctx.bind_to_thread()?;
        self.gpu.trace_launch(self.func, self.node);
        let mut params: Vec<*mut c_void> = self
            .args
            .iter_mut()
            .map(|a| a as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: plain C structs; zero is "no attribute value".
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        let mut count = 0;
        if self.programmatic {
            let attr = &mut attrs[count];
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            count += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            // Dynamic shared memory in whole 16-byte words: a kernel's compiled reads of a small
            // array may be vector loads past its last element (compute-sanitizer found
            // moe_experts_down reading 12 bytes of the 8 given at top-2).
            sharedMemBytes: cfg.shared_mem_bytes.next_multiple_of(16),
            hStream: self.gpu.stream.cu_stream(),
            attrs: if count > 0 {
                attrs.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            numAttrs: count as u32,
        };
        // SAFETY: `params` points at one value per kernel parameter (the caller's contract);
        // `config` and `attrs` outlive the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                self.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }
}
