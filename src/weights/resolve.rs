//! Where a canonical weight lives in a checkpoint.

use crate::checkpoint::Checkpoint;

/// The checkpoint tensors that make up one canonical weight.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Stored as one tensor under this name.
    Single(String),
    /// Fused experts stored per expert: for `gate_up_proj`, per expert the gate then the up
    /// tensor (concatenated along rows); for `down_proj`, one tensor per expert.
    PerExpert { parts: Vec<Vec<String>> },
    /// The n-gram table stored as `shard_{k}` row blocks, in numeric order.
    Shards(Vec<String>),
}

impl Source {
    /// Every checkpoint tensor involved.
    pub fn tensors(&self) -> Vec<&str> {
        match self {
            Source::Single(n) => vec![n.as_str()],
            Source::PerExpert { parts } => parts.iter().flatten().map(|s| s.as_str()).collect(),
            Source::Shards(v) => v.iter().map(|s| s.as_str()).collect(),
        }
    }
}

/// Checkpoint names a canonical name may appear under, most likely first.
pub fn candidates(canonical: &str) -> Vec<String> {
    match canonical.strip_prefix("model.") {
        Some(rest) => vec![
            canonical.to_string(),
            format!("model.language_model.{rest}"),
        ],
        None => vec![canonical.to_string()],
    }
}

/// For per-expert tensors: None when all are present; otherwise the absent ones by name when
/// some are present, or the name pattern when none is (a fused checkpoint missing a tensor).
fn missing_parts(ckpt: &Checkpoint, parts: &[Vec<String>]) -> Option<Vec<String>> {
    let all: Vec<&String> = parts.iter().flatten().collect();
    let absent: Vec<String> = all
        .iter()
        .filter(|n| !ckpt.contains(n))
        .map(|n| n.to_string())
        .collect();
    if absent.is_empty() {
        None
    } else if absent.len() < all.len() {
        Some(absent)
    } else {
        let first = &parts[0][0];
        let pattern = first.replacen("experts.0.", &format!("experts.{{0..{}}}.", parts.len()), 1);
        Some(vec![if parts[0].len() == 2 {
            pattern.replace("gate_proj", "{gate,up}_proj")
        } else {
            pattern
        }])
    }
}

/// Finds the source of `canonical` (with `experts` experts for fused expert weights), or the list
/// of names that were tried.
pub fn resolve(ckpt: &Checkpoint, canonical: &str, experts: usize) -> Result<Source, Vec<String>> {
    let names = candidates(canonical);
    if let Some(n) = names.iter().find(|n| ckpt.contains(n)) {
        return Ok(Source::Single(n.clone()));
    }
    let mut tried = names.clone();
    for name in &names {
        if let Some(base) = name.strip_suffix("experts.gate_up_proj") {
            let parts: Vec<Vec<String>> = (0..experts)
                .map(|e| {
                    vec![
                        format!("{base}experts.{e}.gate_proj.weight"),
                        format!("{base}experts.{e}.up_proj.weight"),
                    ]
                })
                .collect();
            match missing_parts(ckpt, &parts) {
                None => return Ok(Source::PerExpert { parts }),
                Some(missing) => tried.extend(missing),
            }
        } else if let Some(base) = name.strip_suffix("experts.down_proj") {
            let parts: Vec<Vec<String>> = (0..experts)
                .map(|e| vec![format!("{base}experts.{e}.down_proj.weight")])
                .collect();
            match missing_parts(ckpt, &parts) {
                None => return Ok(Source::PerExpert { parts }),
                Some(missing) => tried.extend(missing),
            }
        } else if let Some(base) = name.strip_suffix("ngram_embedding.weight") {
            // Every `shard_{k}` present, numbered 0..n without gaps.
            let prefix = format!("{base}ngram_embedding.shard_");
            let mut numbers: Vec<usize> = ckpt
                .names()
                .filter_map(|n| {
                    n.strip_prefix(prefix.as_str())?
                        .strip_suffix(".weight")?
                        .parse()
                        .ok()
                })
                .collect();
            numbers.sort_unstable();
            if let Some(&last) = numbers.last() {
                let shard = |k: usize| format!("{prefix}{k}.weight");
                let absent: Vec<String> = (0..=last)
                    .filter(|k| numbers.binary_search(k).is_err())
                    .map(shard)
                    .collect();
                if absent.is_empty() {
                    return Ok(Source::Shards((0..=last).map(shard).collect()));
                }
                tried.extend(absent);
            } else {
                tried.push(format!("{prefix}{{k}}.weight"));
            }
        }
    }
    Err(tried)
}
