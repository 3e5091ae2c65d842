//! Copies from the mapped checkpoint to the device through pinned staging buffers. Copies are
//! gathered into pieces of `PIECE_BYTES` (a piece holds many small tensors, such as the release's
//! 147,456 expert matrices, or part of a large one); the threads of the rayon pool read a piece
//! from the mappings together (a cold file's page faults then reach the storage in parallel,
//! whatever shard each tensor is in), and a piece's copies to the device run while the next
//! pieces are read. A copy from pageable memory instead goes through the driver's own staging,
//! one tensor at a time on one thread.

use cudarc::driver::{
    result, sys, CudaEvent, CudaViewMut, DevicePtrMut, DeviceRepr, DriverError, PinnedHostSlice,
};
use rayon::prelude::*;

use super::Gpu;
use crate::exec::cuda::error::CudaError;

/// Bytes of one staging buffer.
const PIECE_BYTES: usize = 32 << 20;
/// Staging buffers the pipeline cycles through: a piece is read while up to three others are
/// on their way to the device.
const PIECES: usize = 4;
/// Bytes one reading thread copies at a time.
const READ_SPAN: usize = 1 << 20;

/// A staging buffer and the event after its last copies to the device.
struct Stage {
    host: PinnedHostSlice<u8>,
    sent: Option<CudaEvent>,
}

/// The pinned pipeline; `'a`: the mapped files the queued copies read.
pub struct Uploader<'g, 'a> {
    gpu: &'g Gpu,
    stages: Vec<Stage>,
    next: usize,
    /// The next piece: (device address, bytes, the weight they belong to) in order, `queued`
    /// bytes in all.
    queue: Vec<(sys::CUdeviceptr, &'a [u8], String)>,
    queued: usize,
}

fn failed(e: DriverError) -> CudaError {
    CudaError::driver("uploading the weights", None, e)
}

impl<'g, 'a> Uploader<'g, 'a> {
    /// `PIECES` pinned buffers of `PIECE_BYTES` (128 MiB of page-locked host memory).
    pub fn new(gpu: &'g Gpu) -> Result<Uploader<'g, 'a>, CudaError> {
        let mut stages = Vec::with_capacity(PIECES);
        for _ in 0..PIECES {
            // SAFETY: a buffer's bytes are written (`fill`) before any is copied from it. Flags
            // 0: cached memory, which the reading threads write and the copy engine reads.
            let host =
                unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(PIECE_BYTES, 0) }.map_err(|e| {
                    CudaError::driver("allocating pinned staging buffers", Some(PIECE_BYTES), e)
                })?;
            stages.push(Stage { host, sent: None });
        }
        Ok(Uploader {
            gpu,
            stages,
            next: 0,
            queue: Vec::new(),
            queued: 0,
        })
    }

    /// Queues the copy of `src`, the bytes of `dst`'s values as the device keeps them, into
    /// `dst`. `dst` must stay allocated until [`Uploader::finish`] (a weight's buffer does:
    /// the load keeps it); the copy reaches the device by then.
    pub fn copy<T: DeviceRepr>(
        &mut self,
        src: &'a [u8],
        dst: &mut CudaViewMut<T>,
        what: &str,
    ) -> Result<(), CudaError> {
        let bytes = dst.len() * std::mem::size_of::<T>();
        if src.len() != bytes {
            return Err(CudaError::Shape {
                kernel: format!("uploading {what}"),
                msg: format!("{} bytes for a device buffer of {bytes}", src.len()),
            });
        }
        let (base, _record) = dst.device_ptr_mut(&self.gpu.stream);
        let mut at = 0;
        while at < src.len() {
            let n = (PIECE_BYTES - self.queued).min(src.len() - at);
            self.queue
                .push((base + at as u64, &src[at..at + n], what.to_string()));
            self.queued += n;
            at += n;
            if self.queued == PIECE_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Reads the queued piece into the next staging buffer and starts its copies.
    fn flush(&mut self) -> Result<(), CudaError> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let stream = &self.gpu.stream;
        let stage = &mut self.stages[self.next];
        self.next = (self.next + 1) % PIECES;
        if let Some(sent) = stage.sent.take() {
            sent.synchronize().map_err(failed)?;
        }
        let host = &mut stage.host.as_mut_slice().map_err(failed)?[..self.queued];
        fill(host, &self.queue);
        let mut at = 0;
        for (dst, src, what) in &self.queue {
            // SAFETY: `dst` is the address of `src.len()` bytes inside a buffer that stays
            // allocated until `finish`; the host bytes stay as written until `sent` has completed
            // (waited for above before the buffer is written again, and in `finish` and `drop`).
            unsafe {
                result::memcpy_htod_async(*dst, &host[at..at + src.len()], stream.cu_stream())
            }
            .map_err(|e| CudaError::driver(format!("uploading {what}"), None, e))?;
            at += src.len();
        }
        stage.sent = Some(stream.record_event(None).map_err(failed)?);
        self.queue.clear();
        self.queued = 0;
        Ok(())
    }

    /// Sends what is queued and waits until every copy has reached the device.
    pub fn finish(mut self) -> Result<(), CudaError> {
        self.flush()?;
        self.wait_all()
    }

    fn wait_all(&mut self) -> Result<(), CudaError> {
        for stage in &mut self.stages {
            if let Some(sent) = stage.sent.take() {
                sent.synchronize().map_err(failed)?;
            }
        }
        Ok(())
    }
}

impl Drop for Uploader<'_, '_> {
    /// The buffers are freed only after the copies that read them (a load that failed halfway
    /// drops the uploader with copies in flight; what is still queued is never sent).
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}

/// The queued sources one after another into `dst` (their total length), in spans of at most
/// `READ_SPAN` that the rayon pool's threads copy together.
fn fill(dst: &mut [u8], queue: &[(sys::CUdeviceptr, &[u8], String)]) {
    let mut spans: Vec<(&mut [u8], &[u8])> = Vec::new();
    let mut rest = dst;
    for &(_, src, _) in queue {
        let (here, after) = rest.split_at_mut(src.len());
        spans.extend(here.chunks_mut(READ_SPAN).zip(src.chunks(READ_SPAN)));
        rest = after;
    }
    spans
        .into_par_iter()
        .for_each(|(d, s)| d.copy_from_slice(s));
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fill_lays_the_sources_one_after_another() {
        let span = super::READ_SPAN;
        let lens = [0, 1, span - 1, span, 3 * span + 17, 5];
        let sources: Vec<Vec<u8>> = lens
            .iter()
            .enumerate()
            .map(|(k, &len)| (0..len).map(|i| ((i * 31 + k * 7) % 251) as u8).collect())
            .collect();
        let queue: Vec<(u64, &[u8], String)> = sources
            .iter()
            .map(|s| (0, s.as_slice(), String::new()))
            .collect();
        let mut dst = vec![0u8; lens.iter().sum()];
        super::fill(&mut dst, &queue);
        assert_eq!(dst, sources.concat());
    }
}
