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
            if parts.iter().flatten().all(|n| ckpt.contains(n)) {
                return Ok(Source::PerExpert { parts });
            }
            tried.push(format!(
                "{base}experts.{{0..{experts}}}.{{gate,up}}_proj.weight"
            ));
        } else if let Some(base) = name.strip_suffix("experts.down_proj") {
            let parts: Vec<Vec<String>> = (0..experts)
                .map(|e| vec![format!("{base}experts.{e}.down_proj.weight")])
                .collect();
            if parts.iter().flatten().all(|n| ckpt.contains(n)) {
                return Ok(Source::PerExpert { parts });
            }
            tried.push(format!("{base}experts.{{0..{experts}}}.down_proj.weight"));
        } else if let Some(base) = name.strip_suffix("ngram_embedding.weight") {
            let shards: Vec<String> = (0..)
                .map(|k| format!("{base}ngram_embedding.shard_{k}.weight"))
                .take_while(|n| ckpt.contains(n))
                .collect();
            if !shards.is_empty() {
                return Ok(Source::Shards(shards));
            }
            tried.push(format!("{base}ngram_embedding.shard_{{k}}.weight"));
        }
    }
    Err(tried)
}
