//! The kernel sources, embedded from `kernels/` by `build.rs`. A `.cu` file may
//! `#include "x.cuh"` another embedded file; [`expand`] inlines it (once per file, with `#line`
//! markers so that NVRTC's messages name the right file and line).

use super::error::CudaError;

const SOURCES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/embedded_kernels.rs"));

pub fn source(file: &str) -> Option<&'static str> {
    SOURCES
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, text)| *text)
}

/// The `.cu` files.
pub fn files() -> impl Iterator<Item = &'static str> {
    SOURCES
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| n.ends_with(".cu"))
}

/// The source of `file` with its includes inlined.
pub fn expand(file: &str) -> Result<String, CudaError> {
    let mut out = String::new();
    let mut seen = Vec::new();
    expand_into(file, &mut out, &mut seen)?;
    Ok(out)
}

fn expand_into(file: &str, out: &mut String, seen: &mut Vec<String>) -> Result<(), CudaError> {
    let text = source(file).ok_or_else(|| CudaError::NoSource(file.to_string()))?;
    seen.push(file.to_string());
    out.push_str(&format!("#line 1 \"{file}\"\n"));
    for (i, line) in text.lines().enumerate() {
        let include = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'));
        match include {
            Some(inc) if source(inc).is_some() => {
                if !seen.iter().any(|s| s == inc) {
                    expand_into(inc, out, seen)?;
                }
                out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_are_inlined_once_with_line_markers() {
        let text = expand("linear.cu").unwrap();
        assert!(text.contains("__device__ __forceinline__ float warp_sum"));
        assert!(!text.lines().any(|l| l.trim_start().starts_with("#include")));
        assert_eq!(text.matches("#line 1 \"common.cuh\"").count(), 1);
        assert!(text.starts_with("#line 1 \"linear.cu\""));
    }

    #[test]
    fn every_kernel_file_expands() {
        let names: Vec<&str> = files().collect();
        assert!(names.contains(&"norm.cu") && names.contains(&"linear.cu"));
        for f in names {
            expand(f).unwrap();
        }
        assert!(matches!(expand("nope.cu"), Err(CudaError::NoSource(_))));
    }
}
