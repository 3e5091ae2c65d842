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
    use crate::ir::{Device, LogitsMode, Phase};
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

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

    /// The `__global__` names of the kernel sources, as pieces: a macro-built name
    /// (`hc_read_act_s##R##_##SUFFIX`) is literal pieces and upper-case parameters, which stand for
    /// any identifier characters; and the names a kernel macro is instantiated with (a line
    /// `ATTENTION_SPLIT_KERNEL(attention_split_g4_f32, ...)`).
    fn kernel_name_patterns() -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for file in files() {
            let text = source(file).unwrap();
            for (name, _) in kernel_bodies(text) {
                out.push(name.split("##").map(str::to_string).collect());
            }
            for line in text.lines() {
                let Some((mac, args)) = line.split_once('(') else {
                    continue;
                };
                let is_macro = !mac.is_empty()
                    && mac
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                let first = args.split([',', ')']).next().unwrap_or("").trim();
                if is_macro
                    && first.contains('_')
                    && first.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    out.push(vec![first.to_string()]);
                }
            }
        }
        out
    }

    fn matches_pattern(name: &str, pieces: &[String]) -> bool {
        let Some((first, rest)) = pieces.split_first() else {
            return name.is_empty();
        };
        let parameter = !first.is_empty()
            && first
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && first.chars().next().unwrap().is_ascii_uppercase();
        if parameter {
            (1..=name.len()).any(|n| {
                name[..n].chars().all(|c| c.is_ascii_alphanumeric())
                    && matches_pattern(&name[n..], rest)
            })
        } else {
            name.strip_prefix(first.as_str())
                .is_some_and(|r| matches_pattern(r, rest))
        }
    }

    /// Every kernel a CUDA program of the real config names (decode, verify-sized and prefill steps,
    /// bf16 and NVFP4 experts, the n-gram table on the device and the host) is defined in kernels/:
    /// a registry entry naming a kernel the sources lack fails here, not on the GPU machine.
    #[test]
    fn every_kernel_a_cuda_program_names_is_in_the_sources() {
        let patterns = kernel_name_patterns();
        assert!(patterns.len() > 60, "found {} kernels", patterns.len());
        let plan = ModelPlan::from_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/configs/qwen3.8-flash-next.json"),
        )
        .unwrap();
        let graphs = GraphSet::embedded().unwrap();
        let mut checked = 0;
        for experts in [
            crate::registry::WeightFormat::Bf16,
            crate::registry::WeightFormat::Nvfp4,
        ] {
            for (phase, tokens) in [
                (Phase::Decode, 1),
                (Phase::Prefill, 2),
                (Phase::Prefill, 6),
                (Phase::Prefill, 16),
                (Phase::Prefill, 64),
                (Phase::Prefill, 4096),
            ] {
                let opts = LowerOptions {
                    device: Device::Cuda,
                    weight_format: Some(crate::registry::WeightFormat::Bf16),
                    expert_format: Some(experts),
                    ..LowerOptions::new(phase, tokens, LogitsMode::Last)
                };
                let program = lower(&plan, &graphs, &opts).unwrap().program;
                for node in &program.nodes {
                    for k in &node.kernels {
                        if k.starts_with("host_") || k.starts_with("cu") {
                            continue; // host steps and driver copies
                        }
                        assert!(
                            patterns.iter().any(|p| matches_pattern(k, p)),
                            "{} ({}.{}) names kernel `{k}`, which no file in kernels/ defines",
                            node.name,
                            node.op.kind(),
                            node.variant
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 1000, "checked {checked} kernel names");
    }
}
