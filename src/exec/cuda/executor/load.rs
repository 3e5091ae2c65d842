//! Loading a checked checkpoint straight onto the device: each tensor goes from the mapped file
//! to the device in the format the device keeps it (bf16 matrices of a bf16 checkpoint and NVFP4
//! banks as stored, everything else widened to f32), with no host copy of the model: bytes
//! already in the device's format go through the pinned pipeline of [`Uploader`] (read from
//! the mapping by several threads, copied while the next piece is read), the rest through a
//! conversion buffer of at most `STAGING_BYTES`.

use std::time::Instant;

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

use super::upload::Uploader;
use super::weights::{Keep, Keeping};
use super::*;
use crate::checkpoint::{Checkpoint, DType};
use crate::error::Error;
use crate::registry::Placement;
use crate::weights::contract::{self, Resolved};
use crate::weights::{HostTable, TableElement};

/// Largest conversion buffer a load holds at once.
const STAGING_BYTES: usize = 64 << 20;

/// What a load moved and how fast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadReport {
    /// Bytes placed on the device (weights, as the device holds them).
    pub device_bytes: usize,
    pub seconds: f64,
    /// The process's peak resident memory after the load (Linux: `VmHWM`, which counts the
    /// mapped checkpoint pages the load touched), if known.
    pub peak_rss_bytes: Option<usize>,
    /// Its anonymous resident memory after the load (`RssAnon`: what the load allocated, not the
    /// mapped files), if known.
    pub anon_rss_bytes: Option<usize>,
}

impl LoadReport {
    pub fn gb_per_s(&self) -> f64 {
        self.device_bytes as f64 / self.seconds.max(1e-9) / 1e9
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} GB onto the device in {:.2} s ({:.2} GB/s)",
            self.device_bytes as f64 / 1e9,
            self.seconds,
            self.gb_per_s()
        )?;
        if let Some(rss) = self.peak_rss_bytes {
            write!(
                f,
                ", peak host RSS {:.2} GB (mapped files included)",
                rss as f64 / 1e9
            )?;
        }
        if let Some(anon) = self.anon_rss_bytes {
            write!(f, ", anonymous {:.2} GB", anon as f64 / 1e9)?;
        }
        Ok(())
    }
}

/// The process's peak resident set (`VmHWM` of /proc/self/status), where the system says.
pub fn peak_rss_bytes() -> Option<usize> {
    proc_status_bytes("VmHWM:")
}

/// A `kB` field of /proc/self/status, in bytes.
fn proc_status_bytes(field: &str) -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The bytes [`DeviceWeights::load`] places on the device for `resolved` (kept as [`Keeping`]
/// says: NVFP4 banks as stored, matrices as bf16 when `bf16`, the rest as f32, host tables
/// not at all): what the memory plan (`runtime::memory`) counts for the weights before a load.
pub fn planned_bytes(
    program: &Program,
    resolved: &Resolved,
    bf16: bool,
    ple_table: Placement,
) -> usize {
    let keeping = Keeping::new(program, bf16, ple_table);
    let used: std::collections::HashSet<&str> =
        program.weights.iter().map(|w| w.name.as_str()).collect();
    resolved
        .weights
        .iter()
        .filter(|(info, _)| info.class == WeightClass::Float && used.contains(info.name.as_str()))
        .map(|(info, source)| {
            let elements: usize = info.shape.iter().product();
            let parts = source.tensors();
            keeping
                .of(&info.name, is_nvfp4(resolved, &parts))
                .device_bytes(elements, parts.len())
        })
        .sum()
}

/// The bytes [`DeviceWeights::random`] places on the device for `program` (bf16 matrices, the
/// routed experts as NVFP4 banks with `nvfp4_experts`).
pub fn planned_random_bytes(program: &Program, nvfp4_experts: bool, ple_table: Placement) -> usize {
    let keeping = Keeping::new(program, true, ple_table);
    let experts = super::weights::expert_banks(program);
    program
        .weights
        .iter()
        .filter(|w| w.class == WeightClass::Float)
        .map(|w| {
            let elements: usize = w.shape.iter().product();
            let per_global = experts.get(&w.name).filter(|_| nvfp4_experts);
            let globals = per_global.map_or(0, |&r| {
                elements / (r * w.shape.last().copied().unwrap_or(1)).max(1)
            });
            keeping
                .of(&w.name, per_global.is_some())
                .device_bytes(elements, globals)
        })
        .sum()
}

/// Whether a weight's checkpoint tensors are NVFP4 matrices.
fn is_nvfp4(resolved: &Resolved, parts: &[&str]) -> bool {
    parts
        .first()
        .is_some_and(|t| resolved.nvfp4.contains_key(*t))
}

impl DeviceWeights {
    /// Every weight `program` uses, from the checked contract `resolved` of `ckpt`, after the
    /// non-finite scan ([`contract::check_finite_except`]); matrices as bf16 when `bf16` (a
    /// bf16 checkpoint), NVFP4 banks packed, the PLE n-gram tables left in their mapping when
    /// `ple_table` keeps them on the host.
    pub fn load(
        gpu: &Gpu,
        program: &Program,
        ckpt: &Checkpoint,
        resolved: &Resolved,
        bf16: bool,
        ple_table: Placement,
    ) -> Result<(DeviceWeights, LoadReport), Error> {
        let start = Instant::now();
        // What the progress bar counts to; `runtime::memory` planned it against the free memory.
        let need = planned_bytes(program, resolved, bf16, ple_table);
        let keeping = Keeping::new(program, bf16, ple_table);
        // A host table's rows are checked as they are gathered (`HostTable::gather`): scanning
        // all of it here would read the release's 102 GB table that the load otherwise leaves
        // unread.
        let skipped: Vec<&str> = resolved
            .weights
            .iter()
            .filter(|(info, _)| keeping.on_host(&info.name))
            .flat_map(|(_, source)| source.tensors())
            .collect();
        contract::check_finite_except(ckpt, resolved, &skipped)?;
        let mut dw = DeviceWeights::empty();
        let used: std::collections::HashSet<&str> =
            program.weights.iter().map(|w| w.name.as_str()).collect();
        // Drawn on a terminal only (`crate::progress`): the bytes placed of those planned.
        let progress = crate::progress::Progress::bytes(need as u64, "loading onto the device");
        let mut up = Uploader::new(gpu)?;
        for (info, source) in &resolved.weights {
            if info.class != WeightClass::Float || !used.contains(info.name.as_str()) {
                continue;
            }
            let parts = source.tensors();
            let name = info.name.as_str();
            let before = dw.bytes;
            match keeping.of(name, is_nvfp4(resolved, &parts)) {
                Keep::HostTable { .. } => {
                    let table = host_table(ckpt, info, &parts)?;
                    dw.host_tables.insert(info.name.clone(), table);
                }
                Keep::Nvfp4 => {
                    let bank = nvfp4_bank(gpu, &mut up, ckpt, resolved, info, &parts)?;
                    dw.bytes += bank.bytes();
                    dw.nvfp4.insert(info.name.clone(), bank);
                }
                Keep::Matrix { bf16: true } => {
                    let m = upload_parts::<u16>(gpu, &mut up, ckpt, &parts, name)?;
                    dw.bytes += m.len() * 2;
                    dw.matrices.insert(info.name.clone(), DeviceMatrix::Bf16(m));
                }
                keep => {
                    let v = upload_parts::<f32>(gpu, &mut up, ckpt, &parts, name)?;
                    dw.bytes += v.len() * 4;
                    if keep == Keep::Vector {
                        dw.vectors.insert(info.name.clone(), v);
                    } else {
                        dw.matrices.insert(info.name.clone(), DeviceMatrix::F32(v));
                    }
                }
            }
            progress.inc((dw.bytes - before) as u64);
        }
        up.finish()?;
        progress.finish();
        dw.upload_ple_tables(gpu, program)?;
        gpu.sync("loading the weights")?;
        let report = LoadReport {
            device_bytes: dw.bytes,
            seconds: start.elapsed().as_secs_f64(),
            peak_rss_bytes: peak_rss_bytes(),
            anon_rss_bytes: proc_status_bytes("RssAnon:"),
        };
        Ok((dw, report))
    }
}

/// A table kept on the host: its parts left in their mappings where stored as bf16 or f32, else
/// widened to f32 in host memory.
fn host_table(
    ckpt: &Checkpoint,
    info: &crate::ir::WeightInfo,
    parts: &[&str],
) -> Result<HostTable, Error> {
    let name = info.name.as_str();
    let width = info.shape.get(1).copied().unwrap_or(1);
    let dtypes: Vec<DType> = parts
        .iter()
        .map(|p| ckpt.info(p).map(|i| i.dtype))
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Input(format!("weight `{name}`: a checkpoint tensor vanished")))?;
    let element = match dtypes.first() {
        Some(DType::BF16) if dtypes.iter().all(|d| *d == DType::BF16) => Some(TableElement::Bf16),
        Some(DType::F32) if dtypes.iter().all(|d| *d == DType::F32) => Some(TableElement::F32),
        _ => None,
    };
    let table = match element {
        Some(element) => {
            let pieces = parts
                .iter()
                .map(|p| ckpt.mapped(p))
                .collect::<Result<Vec<_>, _>>()?;
            HostTable::mapped(name, width, element, pieces)
        }
        None => {
            let mut values = Vec::new();
            for p in parts {
                values.extend(ckpt.to_f32(p)?);
            }
            Ok(HostTable::from_f32(name, width, TableElement::F32, &values))
        }
    };
    table.map_err(Error::Input)
}

/// An element type the device keeps a stored tensor in.
trait Element: DeviceRepr + ValidAsZeroBits + Copy + Default {
    const NAME: &'static str;
    /// Whether `dtype`'s bytes are this type's values as they are.
    fn stored_as(dtype: &DType) -> bool;
    /// Appends `chunk` (whole values of `dtype`) converted; `None` for a conversion the device
    /// does not make.
    fn extend_from(dtype: &DType, chunk: &[u8], out: &mut Vec<Self>) -> Option<()>;
}

/// bf16 bits, from bf16 tensors only (the device keeps a bf16 checkpoint's matrices so).
impl Element for u16 {
    const NAME: &'static str = "bf16";
    fn stored_as(dtype: &DType) -> bool {
        *dtype == DType::BF16
    }
    fn extend_from(dtype: &DType, chunk: &[u8], out: &mut Vec<u16>) -> Option<()> {
        Self::stored_as(dtype).then(|| {
            out.extend(
                chunk
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]])),
            );
        })
    }
}

/// f32, from any float tensor (f16 and bf16 widen exactly).
impl Element for f32 {
    const NAME: &'static str = "f32";
    fn stored_as(dtype: &DType) -> bool {
        *dtype == DType::F32
    }
    fn extend_from(dtype: &DType, chunk: &[u8], out: &mut Vec<f32>) -> Option<()> {
        out.extend(crate::checkpoint::bytes_to_f32(dtype, chunk)?);
        Some(())
    }
}

/// The parts' values, one after another, in a device buffer of `T`.
fn upload_parts<'a, T: Element>(
    gpu: &Gpu,
    up: &mut Uploader<'_, 'a>,
    ckpt: &'a Checkpoint,
    parts: &[&str],
    name: &str,
) -> Result<CudaSlice<T>, Error> {
    let mut infos = Vec::with_capacity(parts.len());
    for p in parts {
        let info = ckpt.info(p).ok_or_else(|| {
            Error::Input(format!("weight `{name}`: checkpoint tensor `{p}` vanished"))
        })?;
        infos.push(info);
    }
    let elements: usize = infos
        .iter()
        .map(|i| i.shape.iter().product::<usize>())
        .sum();
    let mut dst = gpu.zeros::<T>(elements, name)?;
    let mut at = 0usize;
    for (p, info) in parts.iter().zip(&infos) {
        let bytes = ckpt.bytes(p)?;
        let width = info.dtype.size_bytes().unwrap_or(0);
        let n = info.shape.iter().product::<usize>();
        if width == 0 || bytes.len() != n * width {
            return Err(Error::Input(format!(
                "tensor `{p}` ({}): {} bytes for {n} values",
                info.dtype,
                bytes.len()
            )));
        }
        if T::stored_as(&info.dtype) {
            up.copy(bytes, &mut dst.slice_mut(at..at + n), name)?;
        } else {
            let per_chunk = (STAGING_BYTES / std::mem::size_of::<T>()).max(1);
            let mut staging: Vec<T> = Vec::with_capacity(per_chunk.min(n));
            for (c, chunk) in bytes.chunks(per_chunk * width).enumerate() {
                staging.clear();
                T::extend_from(&info.dtype, chunk, &mut staging).ok_or_else(|| {
                    Error::Input(format!(
                        "tensor `{p}`: {} cannot be stored as {}",
                        info.dtype,
                        T::NAME
                    ))
                })?;
                let first = at + c * per_chunk;
                let mut view = dst.slice_mut(first..first + staging.len());
                gpu.stream.memcpy_htod(&staging, &mut view).map_err(|e| {
                    CudaError::driver(format!("uploading {name}"), Some(chunk.len()), e)
                })?;
            }
        }
        at += n;
    }
    Ok(dst)
}

/// An NVFP4 bank from its parts (each an NVFP4 matrix of one shape), codes and scales copied
/// from the mapping as stored.
fn nvfp4_bank<'a>(
    gpu: &Gpu,
    up: &mut Uploader<'_, 'a>,
    ckpt: &'a Checkpoint,
    resolved: &Resolved,
    info: &crate::ir::WeightInfo,
    parts: &[&str],
) -> Result<DeviceNvfp4, Error> {
    let name = info.name.as_str();
    let mats: Vec<_> = parts
        .iter()
        .filter_map(|p| resolved.nvfp4.get(*p))
        .collect();
    let [experts, out, inputs] = info.shape[..] else {
        return Err(Error::Input(format!(
            "weight `{name}`: an NVFP4 bank of shape {:?}",
            info.shape
        )));
    };
    let rows = experts * out;
    let mut codes = gpu.zeros::<u8>(rows * inputs / 2, name)?;
    let mut scales = gpu.zeros::<u8>(rows * inputs / crate::quant::nvfp4::GROUP, name)?;
    let (mut c_at, mut s_at) = (0usize, 0usize);
    let mut globals = Vec::with_capacity(mats.len());
    for m in &mats {
        for (src, dst, at) in [
            (ckpt.bytes(&m.codes)?, &mut codes, &mut c_at),
            (ckpt.bytes(&m.scale)?, &mut scales, &mut s_at),
        ] {
            if *at + src.len() > dst.len() {
                return Err(Error::Input(format!(
                    "weight `{name}`: its NVFP4 parts hold more bytes than [{experts}, {out}, {inputs}]"
                )));
            }
            up.copy(src, &mut dst.slice_mut(*at..*at + src.len()), name)?;
            *at += src.len();
        }
        globals.push(ckpt.to_f32(&m.global)?[0]);
    }
    Ok(DeviceNvfp4 {
        codes,
        scales,
        globals: gpu.upload(&globals, name)?,
        rows_per_global: mats.first().map_or(1, |m| m.out) as i64,
        shape: [experts, out, inputs],
    })
}
