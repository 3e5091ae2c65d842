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

    /// The body of every `__global__` function in `text`: (kernel name, text between its
    /// braces), braces matched (macro line continuations are plain text here).
    fn kernel_bodies(text: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find("__global__") {
            let after = &rest[at..];
            let open = after.find('{').expect("a kernel has a body");
            // The name: the identifier before the parameter list, past `__launch_bounds__(..)`.
            let mut sig = &after[..open];
            if let Some(lb) = sig.find("__launch_bounds__") {
                sig = &sig[lb + sig[lb..].find(')').expect("closed bounds") + 1..];
            }
            let head = &sig[..sig.find('(').expect("a kernel has parameters")];
            let name = head.split_whitespace().last().unwrap_or("").to_string();
            let mut depth = 0usize;
            let mut end = open;
            for (i, c) in after[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            out.push((name, after[open + 1..end].to_string()));
            rest = &after[end..];
        }
        out
    }

    /// Programmatic dependent launch (`exec::cuda::launcher`) lets a kernel start before the one
    /// ahead of it has finished: a kernel that touched an activation, a state or its output
    /// before `wait_for_producers()` would race with it. So every kernel waits, and before the
    /// wait it only computes indices from its arguments and prefetches weights (or reads its own
    /// state: `load_own_state`, which only the same node's earlier steps write, or fills a
    /// shared-memory table from constants: `fill_shared_*`). A kernel that
    /// may run ahead (`wait_for_producers_unless(ahead)`, kernels/common.cuh) must also call the
    /// plain wait, before its writes.
    #[test]
    fn every_kernel_waits_for_its_producers_before_touching_memory() {
        let mut kernels = 0;
        for file in files() {
            for (name, body) in kernel_bodies(source(file).unwrap()) {
                kernels += 1;
                let first_wait = ["wait_for_producers();", "wait_for_producers_unless("]
                    .iter()
                    .filter_map(|w| body.find(w))
                    .min();
                let before = &body[..first_wait.unwrap_or(body.len())];
                assert!(
                    body.contains("wait_for_producers();"),
                    "{file}: kernel {name} never calls wait_for_producers()"
                );
                for stmt in before.split(';') {
                    let code: String = stmt
                        .lines()
                        .map(|l| l.trim().trim_end_matches('\\').trim())
                        .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with("/*"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    // Index arithmetic over the kernel's arguments (a `const` whose value
                    // indexes nothing: no `[`), or a weight prefetch.
                    let index_math = code.starts_with("const ") && !code.contains('[');
                    // Declarations: a local without a value (registers that `load_own_state` or a
                    // weight prefetch fills),
                    // shared memory, a type alias.
                    let declaration = ((code.starts_with("float ") || code.starts_with("uint4 "))
                        && !code.contains('='))
                        || code.starts_with("__shared__ ")
                        || code.starts_with("extern __shared__ ")
                        || code.starts_with("using ");
                    assert!(
                        code.is_empty()
                            || code == "release_dependents_early()"
                            || code.contains("prefetch")
                            || code.contains("load_own_state")
                            || code.starts_with("fill_shared_")
                            || index_math
                            || declaration,
                        "{file}: kernel {name} runs `{code}` before wait_for_producers()"
                    );
                }
            }
        }
        assert!(kernels > 60, "found only {kernels} kernels");
    }
}
