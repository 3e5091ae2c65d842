//! NVRTC compilation for the device's architecture, with the PTX cached on disk by a hash of
//! everything that determines it (source after includes, architecture, options), so a kernel is
//! compiled once per machine and change.

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::error::CudaError;
use super::kernels;

/// Options every kernel is compiled with. Precise division and square root keep the GPU's
/// rounding close to the CPU reference; contraction to FMA stays on (it only ever improves it).
const OPTIONS: &[&str] = &[
    "--std=c++17",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// Where compiled kernels are kept: `$GRAPHRUN_KERNEL_CACHE`, else `$XDG_CACHE_HOME/graphrun/kernels`,
/// else `~/.cache/graphrun/kernels`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("GRAPHRUN_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("graphrun").join("kernels"))
}

/// 64-bit FNV-1a: a stable content hash for cache file names (not for security).
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0u8)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

pub struct Compiled {
    pub ptx: String,
    pub from_cache: bool,
}

/// The option that builds the kernels with the step timeline's records (`kernels/common.cuh`,
/// `exec::cuda::trace`).
pub const TRACE_OPTION: &str = "-DGRAPHRUN_TRACE";

/// Compiles `kernels/<file>` for compute capability `(major, minor)`; with `trace`, with the
/// timeline's records ([`TRACE_OPTION`]).
pub fn compile(
    file: &str,
    arch: (i32, i32),
    cache: Option<&Path>,
    trace: bool,
) -> Result<Compiled, CudaError> {
    let source = kernels::expand(file)?;
    let arch_flag = format!("--gpu-architecture=sm_{}{}", arch.0, arch.1);
    let mut key_parts = vec![source.as_str(), arch_flag.as_str()];
    key_parts.extend(OPTIONS);
    if trace {
        key_parts.push(TRACE_OPTION);
    }
    let stem = file.trim_end_matches(".cu");
    let cached = cache.map(|d| d.join(format!("{stem}-{:016x}.ptx", fnv1a(&key_parts))));
    if let Some(path) = &cached {
        if let Ok(ptx) = std::fs::read_to_string(path) {
            return Ok(Compiled {
                ptx,
                from_cache: true,
            });
        }
    }
    // SAFETY: only checks whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc);
    }
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(arch_flag.clone());
    if trace {
        options.push(TRACE_OPTION.to_string());
    }
    let opts = CompileOptions {
        name: Some(file.to_string()),
        options,
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(&source, opts)
        .map_err(|e| compile_error(file, e))?
        .to_src();
    if let Some(path) = &cached {
        // Best effort: a cache that cannot be written only costs a compile next time.
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
    Ok(Compiled {
        ptx,
        from_cache: false,
    })
}

/// Turns NVRTC's log into an error naming the file and the first line it complains about
/// (NVRTC writes `file.cu(12): error: ...`).
fn compile_error(file: &str, e: CompileError) -> CudaError {
    match e {
        CompileError::CompileError { log, .. } => {
            let log = log.to_string_lossy().to_string();
            let (line, msg) = first_error(&log).unwrap_or((None, "compilation failed".to_string()));
            CudaError::Compile {
                file: file.to_string(),
                line,
                msg,
                log,
            }
        }
        other => CudaError::Compile {
            file: file.to_string(),
            line: None,
            msg: format!("{other:?}"),
            log: String::new(),
        },
    }
}

fn first_error(log: &str) -> Option<(Option<u32>, String)> {
    let line = log.lines().find(|l| l.contains("error"))?;
    let number = line
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(n, _)| n.parse().ok());
    let msg = line
        .split_once("error")
        .map(|(_, m)| m.trim_start_matches([':', ' ']).to_string())
        .unwrap_or_default();
    Some((number, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_log_lines_are_parsed() {
        let log =
            "norm.cu(12): warning: unused\nnorm.cu(17): error: identifier \"foo\" is undefined\n";
        assert_eq!(
            first_error(log),
            Some((Some(17), "identifier \"foo\" is undefined".to_string()))
        );
    }

    #[test]
    fn cache_keys_change_with_source_and_arch() {
        assert_ne!(fnv1a(&["a", "sm_90"]), fnv1a(&["a", "sm_80"]));
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
    }

    /// Where NVRTC is present (the GPU machine, or a developer machine with the
    /// `nvidia-cuda-nvrtc` wheel on LD_LIBRARY_PATH; no GPU needed), every kernel file compiles
    /// for sm_90, and a broken one is reported with its file and line.
    #[test]
    fn every_kernel_compiles_when_nvrtc_is_present() {
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            crate::stderr::line(
                "NVRTC not found here: kernel compilation is checked on the GPU machine",
            );
            return;
        }
        for file in super::kernels::files() {
            let compiled = compile(file, (9, 0), None, false).unwrap_or_else(|e| panic!("{e}"));
            assert!(compiled.ptx.contains(".target sm_90"), "{file}");
            assert!(!compiled.ptx.contains("graphrun_trace"), "{file}");
            // The timeline's build compiles too, and its kernels record: the host finds the
            // buffer pointer by its unmangled name.
            let traced = compile(file, (9, 0), None, true).unwrap_or_else(|e| panic!("{e}"));
            assert!(traced.ptx.contains(".u64 graphrun_trace;"), "{file}");
            assert!(traced.ptx.contains("%globaltimer"), "{file}");
            for (kernel, body) in entries(&compiled.ptx) {
                assert!(
                    !body.contains("__local_depot"),
                    "{file}: kernel {kernel} keeps a stack frame (a local array indexed at run \
                     time?): local memory made a grouped linear 3.5x slower in a real step"
                );
            }
        }
    }

    /// Each kernel entry of a PTX module with its body (up to the next function).
    fn entries(ptx: &str) -> Vec<(&str, &str)> {
        let starts: Vec<usize> = ptx
            .match_indices(".entry ")
            .map(|(i, _)| i)
            .chain(ptx.match_indices(".func ").map(|(i, _)| i))
            .collect();
        let mut sorted = starts.clone();
        sorted.sort_unstable();
        ptx.match_indices(".entry ")
            .map(|(i, _)| {
                let end = sorted
                    .iter()
                    .find(|&&j| j > i)
                    .copied()
                    .unwrap_or(ptx.len());
                let name = ptx[i + 7..].split(['(', ' ', '\n']).next().unwrap_or("");
                (name, &ptx[i..end])
            })
            .collect()
    }

    /// Without NVRTC (CI), compiling is a clear error, not a panic.
    #[test]
    fn compiling_without_nvrtc_is_an_error() {
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return; // a machine with CUDA: the GPU tests cover compilation
        }
        assert!(matches!(
            compile("norm.cu", (9, 0), None, false),
            Err(CudaError::NoNvrtc)
        ));
    }
}
