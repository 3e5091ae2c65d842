//! Which config.json sizes the checkpoint contradicts, read off a few tensors whose shapes pin
//! one field each (HF's names for them), so that a config saying `num_experts: 2147483648` is
//! answered with the field, not only with the tensors it broke: [`size_mismatches`] before lowering
//! (the layer count, which lowering's work grows with), and the contract's causes after.

use std::collections::BTreeSet;

use crate::checkpoint::Checkpoint;
use crate::ir::WeightInfo;
use crate::plan::{ConfigKind, ModelPlan};

use super::resolve::candidates;

/// A config size that disagrees with what the checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMismatch {
    /// The config.json field as a JSON path (`text_config.num_experts` in a composite config).
    pub field: String,
    /// The size the config implies.
    pub config: usize,
    /// The size the checkpoint holds.
    pub checkpoint: usize,
    /// The tensor (or tensors) that show it.
    pub evidence: String,
}

impl std::fmt::Display for FieldMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "config.json {} = {}, but the checkpoint holds {} ({})",
            self.field, self.config, self.checkpoint, self.evidence
        )
    }
}

/// Tensors whose shape pins a field: (canonical name suffix, dimension, field, the dimension in
/// the per-expert layout when the canonical weight is fused experts).
const PINS: [(&str, usize, &str, Option<usize>); 5] = [
    ("model.embed_tokens.weight", 0, "vocab_size", None),
    ("model.embed_tokens.weight", 1, "hidden_size", None),
    (".mlp.gate.weight", 0, "num_experts", None),
    (
        ".mlp.shared_expert.down_proj.weight",
        1,
        "shared_expert_intermediate_size",
        None,
    ),
    // Fused `[E, H, I]`; per expert `[H, I]`.
    (
        ".mlp.experts.down_proj",
        2,
        "moe_intermediate_size",
        Some(1),
    ),
];

/// The layer index of `name` under `model.layers.` or `model.language_model.layers.`.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("model.language_model.layers."))?;
    rest.split('.').next()?.parse().ok()
}

/// Compares dimension `dim` of the first expected weight named `*suffix` with the checkpoint.
fn pin(
    ckpt: &Checkpoint,
    expected: &[WeightInfo],
    (suffix, dim, field, per_expert): (&str, usize, &'static str, Option<usize>),
) -> Option<FieldMismatch> {
    let w = expected.iter().find(|w| w.name.ends_with(suffix))?;
    let config = *w.shape.get(dim)?;
    let stored = |name: &str| candidates(name).iter().find_map(|n| ckpt.info(n));
    let (info, at) = match stored(&w.name) {
        Some(info) => (info, dim),
        None => {
            let name = w
                .name
                .replace("experts.down_proj", "experts.0.down_proj.weight");
            (stored(&name)?, per_expert?)
        }
    };
    let held = *info.shape.get(at)?;
    (held != config).then(|| FieldMismatch {
        field: field_path(ckpt, field),
        config,
        checkpoint: held,
        evidence: format!("{} has shape {:?}", info.name, info.shape),
    })
}

/// The layers the checkpoint holds: how many distinct layer indices its names carry. Counted, not
/// taken as the highest index plus one, since a name may carry any number
/// (`model.layers.18446744073709551615.x`); so it never exceeds the tensor count.
fn checkpoint_layers(ckpt: &Checkpoint) -> Held {
    let indices: BTreeSet<usize> = ["model.layers.", "model.language_model.layers."]
        .iter()
        .flat_map(|p| ckpt.names_with_prefix(p))
        .filter_map(layer_of)
        .collect();
    Held {
        count: indices.len(),
        // Contiguous from 0 exactly when the last index is count - 1.
        contiguous: indices.last().is_none_or(|&l| l == indices.len() - 1),
    }
}

struct Held {
    count: usize,
    contiguous: bool,
}

fn layers_mismatch(field: String, config: usize, held: &Held) -> FieldMismatch {
    FieldMismatch {
        field,
        config,
        checkpoint: held.count,
        evidence: match (held.count, held.contiguous) {
            (0, _) => "no tensor under model.layers. or model.language_model.layers.".to_string(),
            (n, true) => format!("tensors of layers 0 to {}", n - 1),
            (n, false) => format!("tensors of {n} distinct layer indices, not 0 to {}", n - 1),
        },
    }
}

/// A composite checkpoint's sizes live under `text_config.` in its config.
fn field_path(ckpt: &Checkpoint, field: &str) -> String {
    let composite = ckpt
        .names_with_prefix("model.language_model.")
        .next()
        .is_some();
    if composite {
        format!("text_config.{field}")
    } else {
        field.to_string()
    }
}

/// The layer count's mismatch when the plan has more layers than the checkpoint holds (checked
/// before anything is built from the count: lowering's work and the program's size grow with
/// it; every other size is only a number until the contract compares it). Fewer layers are
/// fine: the rest go unused. Empty when the checkpoint holds them all.
pub fn size_mismatches(plan: &ModelPlan, ckpt: &Checkpoint) -> Vec<FieldMismatch> {
    let held = checkpoint_layers(ckpt);
    if plan.num_layers <= held.count {
        return Vec::new();
    }
    let field = match plan.config_kind {
        ConfigKind::Composite => "text_config.num_hidden_layers",
        ConfigKind::Flat => "num_hidden_layers",
    };
    vec![layers_mismatch(field.to_string(), plan.num_layers, &held)]
}

/// The config fields the checkpoint contradicts, judged from the expected weights.
pub fn field_mismatches(ckpt: &Checkpoint, expected: &[WeightInfo]) -> Vec<FieldMismatch> {
    let mut out = Vec::new();
    // The layer count: the expected names reach layer L-1; the checkpoint's names may not.
    let config_layers = expected
        .iter()
        .filter_map(|w| layer_of(&w.name))
        .max()
        .map(|l| l + 1);
    let held = checkpoint_layers(ckpt);
    if let Some(config) = config_layers {
        if config != held.count || !held.contiguous {
            out.push(layers_mismatch(
                field_path(ckpt, "num_hidden_layers"),
                config,
                &held,
            ));
        }
    }
    out.extend(PINS.into_iter().filter_map(|p| pin(ckpt, expected, p)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint<S: AsRef<str>>(tag: &str, names: &[S]) -> Checkpoint {
        crate::weights::test_checkpoint(tag, names)
    }

    const TINY: &str = include_str!("../../tests/data/configs/tiny_flat.json");

    /// Found by the fuzz suite (model-header, seed 1, 33 of 30000 cases): a tensor renamed to
    /// layer 2^64 - 1 overflowed "highest index + 1". Layers are counted now.
    #[test]
    fn layer_indices_are_counted_not_added_to() {
        let plan = ModelPlan::from_json_str(TINY, "tiny.json").unwrap();
        assert_eq!(plan.num_layers, 2);
        let far = "model.layers.18446744073709551615.x";
        let ckpt = checkpoint("far", &[far]);
        let held = checkpoint_layers(&ckpt);
        assert_eq!((held.count, held.contiguous), (1, false));
        assert_eq!(size_mismatches(&plan, &ckpt).len(), 1);
        let ckpt = checkpoint(
            "two",
            &["model.layers.0.x", "model.layers.1.y", "model.layers.1.z"],
        );
        let held = checkpoint_layers(&ckpt);
        assert_eq!((held.count, held.contiguous), (2, true));
        assert!(size_mismatches(&plan, &ckpt).is_empty());
    }
}
