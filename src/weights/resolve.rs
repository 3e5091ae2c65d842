//! Where a canonical weight lives in a checkpoint.
//!
//! Counts from the config (the expert count) or from tensor names (the highest `shard_{k}`) are
//! never used to size anything before the checkpoint is known to hold that many tensors: a
//! config saying `num_experts: 2147483648` is answered from the checkpoint's own names, and
//! the absent names are listed only up to [`MAX_LISTED`].

use std::collections::BTreeSet;

use crate::checkpoint::Checkpoint;

/// The most absent names one weight lists; the rest are counted.
pub const MAX_LISTED: usize = 8;

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

/// `text` as a decimal index written the way the checkpoint writers write it (no sign, no
/// leading zeros), so that `shard_01` and `shard_1` cannot both stand for shard 1.
fn index(text: &str) -> Option<usize> {
    let n: usize = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

/// `{base}experts.{e}.{kind}` for every expert `e < experts` and every kind, or what is absent.
fn per_expert(
    ckpt: &Checkpoint,
    base: &str,
    kinds: &[&str],
    experts: usize,
) -> Result<Source, Vec<String>> {
    let prefix = format!("{base}experts.");
    // The expert indices the checkpoint holds per kind: bounded by its tensor count.
    let mut present: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); kinds.len()];
    for name in ckpt.names_with_prefix(&prefix) {
        let Some((e, kind)) = name[prefix.len()..].split_once('.') else {
            continue;
        };
        if let (Some(e), Some(k)) = (index(e), kinds.iter().position(|k| *k == kind)) {
            present[k].insert(e);
        }
    }
    let held: Vec<usize> = present.iter().map(|s| s.range(..experts).count()).collect();
    if held.iter().all(|&n| n == experts) {
        // Every name exists, so this allocates no more than the checkpoint's own table.
        let parts = (0..experts)
            .map(|e| kinds.iter().map(|k| format!("{prefix}{e}.{k}")).collect())
            .collect();
        return Ok(Source::PerExpert { parts });
    }
    if held.iter().all(|&n| n == 0) {
        // None there at all (a fused checkpoint missing the tensor): the pattern looked for.
        let kind = match kinds {
            [k] => k.to_string(),
            _ => {
                let short: Vec<&str> = kinds
                    .iter()
                    .map(|k| k.strip_suffix("_proj.weight").unwrap_or(k))
                    .collect();
                format!("{{{}}}_proj.weight", short.join(","))
            }
        };
        return Err(vec![format!("{prefix}{{0..{experts}}}.{kind}")]);
    }
    // Some there: name the first absent ones. Each expert index scanned is either absent (and
    // listed) or present, so the scan stops within MAX_LISTED + (tensors held) steps.
    let absent: usize = held.iter().map(|&n| experts - n).sum();
    let mut listed = Vec::new();
    'scan: for e in 0..experts {
        for (k, kind) in kinds.iter().enumerate() {
            if !present[k].contains(&e) {
                if listed.len() == MAX_LISTED {
                    break 'scan;
                }
                listed.push(format!("{prefix}{e}.{kind}"));
            }
        }
    }
    if absent > listed.len() {
        listed.push(format!(
            "{} more of {prefix}{{0..{experts}}}.* ({absent} absent in all)",
            absent - listed.len()
        ));
    }
    Err(listed)
}

/// Every `{prefix}{k}.weight` present, numbered 0..n without gaps, or what is absent.
fn shards(ckpt: &Checkpoint, prefix: &str) -> Result<Source, Vec<String>> {
    let numbers: BTreeSet<usize> = ckpt
        .names_with_prefix(prefix)
        .filter_map(|n| index(n[prefix.len()..].strip_suffix(".weight")?))
        .collect();
    let shard = |k: usize| format!("{prefix}{k}.weight");
    let Some(&last) = numbers.last() else {
        return Err(vec![format!("{prefix}{{k}}.weight")]);
    };
    if numbers.len() == last.saturating_add(1) {
        return Ok(Source::Shards(numbers.iter().map(|&k| shard(k)).collect()));
    }
    // `last` comes from a name in the checkpoint and may be huge: list the first gaps only.
    let absent = last - (numbers.len() - 1);
    let mut listed: Vec<String> = (0..last)
        .filter(|k| !numbers.contains(k))
        .take(MAX_LISTED)
        .map(shard)
        .collect();
    if absent > listed.len() {
        listed.push(format!(
            "{} more of {prefix}{{0..{last}}}.weight ({absent} absent in all)",
            absent - listed.len()
        ));
    }
    Err(listed)
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
        let found = if let Some(base) = name.strip_suffix("experts.gate_up_proj") {
            per_expert(ckpt, base, &["gate_proj.weight", "up_proj.weight"], experts)
        } else if let Some(base) = name.strip_suffix("experts.down_proj") {
            per_expert(ckpt, base, &["down_proj.weight"], experts)
        } else if let Some(base) = name.strip_suffix("ngram_embedding.weight") {
            shards(ckpt, &format!("{base}ngram_embedding.shard_"))
        } else {
            continue;
        };
        match found {
            Ok(source) => return Ok(source),
            Err(missing) => tried.extend(missing),
        }
    }
    Err(tried)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint<S: AsRef<str>>(tag: &str, names: &[S]) -> Checkpoint {
        crate::weights::test_checkpoint(tag, names)
    }

    fn experts(n: usize) -> Vec<String> {
        (0..n)
            .flat_map(|e| {
                ["gate_proj", "up_proj", "down_proj"]
                    .map(|k| format!("model.layers.0.mlp.experts.{e}.{k}.weight"))
            })
            .collect()
    }

    #[test]
    fn per_expert_weights_resolve_in_expert_order() {
        let ckpt = checkpoint("experts", &experts(3));
        let Ok(Source::PerExpert { parts }) =
            resolve(&ckpt, "model.layers.0.mlp.experts.gate_up_proj", 3)
        else {
            panic!("not per-expert");
        };
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2][1], "model.layers.0.mlp.experts.2.up_proj.weight");
    }

    /// A huge expert count from the config is answered from the checkpoint's names: a bounded
    /// list, with the rest counted (listing them all would be 2^31 strings).
    #[test]
    fn a_huge_expert_count_lists_a_bounded_few() {
        let ckpt = checkpoint("huge-experts", &experts(4));
        let tried = resolve(&ckpt, "model.layers.0.mlp.experts.gate_up_proj", 1 << 31).unwrap_err();
        let absent = 2 * ((1usize << 31) - 4);
        assert_eq!(tried.len(), 2 + MAX_LISTED + 1 + 1, "{tried:?}");
        assert_eq!(tried[2], "model.layers.0.mlp.experts.4.gate_proj.weight");
        assert_eq!(tried[3], "model.layers.0.mlp.experts.4.up_proj.weight");
        assert_eq!(
            tried[2 + MAX_LISTED],
            format!(
                "{} more of model.layers.0.mlp.experts.{{0..2147483648}}.* ({absent} absent in all)",
                absent - MAX_LISTED
            )
        );
        // The composite-prefix candidate holds none: the pattern.
        assert_eq!(
            tried[tried.len() - 1],
            "model.language_model.layers.0.mlp.experts.{0..2147483648}.{gate,up}_proj.weight"
        );
    }

    #[test]
    fn a_far_shard_number_lists_a_bounded_few_gaps() {
        let p = "model.layers.1.ple.ple_embedding.ngram_embedding.shard_";
        let names = vec![
            format!("{p}0.weight"),
            format!("{p}1.weight"),
            format!("{p}18446744073709551615.weight"),
            // Not how writers number shards: ignored rather than taken for shard 2.
            format!("{p}02.weight"),
        ];
        let ckpt = checkpoint("far-shard", &names);
        let tried = resolve(
            &ckpt,
            "model.layers.1.ple.ple_embedding.ngram_embedding.weight",
            4,
        )
        .unwrap_err();
        assert_eq!(tried[2], format!("{p}2.weight"));
        assert_eq!(tried[2 + MAX_LISTED - 1], format!("{p}9.weight"));
        let absent = usize::MAX - 2;
        assert_eq!(
            tried[2 + MAX_LISTED],
            format!(
                "{} more of {p}{{0..{}}}.weight ({absent} absent in all)",
                absent - MAX_LISTED,
                usize::MAX
            )
        );
    }
}
