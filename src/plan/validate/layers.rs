//! The layer kinds (`layer_types`) and the attention layers' fields: heads, rope, the QSA indexer.

use crate::plan::error::{number, quote, PlanError};
use crate::plan::fields::Fields;
use crate::plan::{AttnPlan, IndexerPlan, LayerKind};

use super::{cap, size};

/// `layer_types` names of the GDN mixer.
const GDN_TYPES: [&str; 1] = ["linear_attention"];

/// `layer_types` names of the attention + QSA indexer mixer. HF renamed it over time
/// (`deepseek_sparse_attention`/`hybrid_indexed`, `qwen_sparse_attention`, `indexed_attention`)
/// and remaps the checkpoint's `full_attention` to it; the math is the same in all versions.
pub(super) const QSA_TYPES: [&str; 5] = [
    "full_attention",
    "qwen_sparse_attention",
    "indexed_attention",
    "deepseek_sparse_attention",
    "hybrid_indexed",
];

/// The five indexer fields, which come all together or not at all.
pub(super) const INDEXER_FIELDS: [&str; 5] = [
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
];

fn layer_kind(name: &str) -> Option<LayerKind> {
    if GDN_TYPES.contains(&name) {
        Some(LayerKind::Gdn)
    } else if QSA_TYPES.contains(&name) {
        Some(LayerKind::Qsa)
    } else {
        None
    }
}

/// The kind and written name of each layer, from `layer_types` or, when that is absent, from
/// `full_attention_interval` as HF derives it.
pub(super) fn layer_types(
    t: &Fields,
    num_layers: usize,
) -> Result<Vec<(LayerKind, String)>, PlanError> {
    let Some(list) = t.list("layer_types")? else {
        let interval = t.usize("full_attention_interval")?.unwrap_or(4);
        if interval == 0 {
            return Err(t.invalid(
                "full_attention_interval",
                0,
                "must be > 0 (layer_types is absent, so it is derived from this interval)",
            ));
        }
        // Layer i is attention iff (i+1) % interval == 0; HF 5.23.0 names those
        // `indexed_attention`.
        let derived = (0..num_layers)
            .map(|i| {
                if (i + 1).is_multiple_of(interval) {
                    (LayerKind::Qsa, "indexed_attention".to_string())
                } else {
                    (LayerKind::Gdn, "linear_attention".to_string())
                }
            })
            .collect();
        return Ok(derived);
    };
    if list.len() != num_layers {
        return Err(t.invalid(
            "layer_types",
            format!("[{} entries]", list.len()),
            format!("needs one entry per layer (num_hidden_layers = {num_layers})"),
        ));
    }
    let accepted: Vec<&str> = GDN_TYPES.iter().chain(&QSA_TYPES).copied().collect();
    list.iter()
        .enumerate()
        .map(|(i, value)| {
            let path = t.path(&format!("layer_types[{i}]"));
            let name = value
                .as_str()
                .ok_or_else(|| t.wrong_type(&path, value, "a layer type name (string)"))?;
            let kind = layer_kind(name).ok_or_else(|| t.unknown_layer_type(i, value, &accepted))?;
            Ok((kind, name.to_string()))
        })
        .collect()
}

/// Where the rope settings came from, so errors can point at the right field.
struct Rope<'a> {
    theta: f64,
    factor: f64,
    /// The object that holds `partial_rotary_factor`; `None` when it defaulted to 1.0.
    factor_from: Option<Fields<'a>>,
}

fn rope<'a>(t: &Fields<'a>) -> Result<Rope<'a>, PlanError> {
    // HF v5 calls the object rope_parameters; older configs wrote the same thing as rope_scaling.
    let params = match t.object("rope_parameters")? {
        Some(p) => Some(p),
        None => t.object("rope_scaling")?,
    };
    if let Some(p) = &params {
        // Older configs spell the key `type`.
        let (key, rope_type) = match p.str("rope_type")? {
            Some(s) => ("rope_type", Some(s)),
            None => ("type", p.str("type")?),
        };
        match rope_type {
            // "mrope" is how Qwen2-VL-era configs wrote the default rope with mRoPE sections;
            // HF maps it to "default". For text the three position rows coincide.
            None | Some("default") | Some("mrope") => {}
            Some(other) => {
                return Err(p.unsupported(
                    key,
                    quote(other),
                    "graphrun implements only the \"default\" rope type (no scaling)",
                ))
            }
        }
    }

    // rope_parameters is what HF's rotary embedding reads, so when it and an older top-level
    // key (rope_theta, partial_rotary_factor) are both present and differ, rope_parameters wins.
    let theta = rope_number(params.as_ref(), t, "rope_theta")?;
    let factor = rope_number(params.as_ref(), t, "partial_rotary_factor")?;

    let (theta, theta_from) = theta.unwrap_or((10000.0, t.clone()));
    if !(theta.is_finite() && theta > 0.0) {
        return Err(theta_from.invalid("rope_theta", number(theta), "must be a positive number"));
    }
    // Absent everywhere, the factor is 1.0 (full rotary): Qwen4ExpTextConfig does not apply the
    // Qwen3.5 back-compat default of 0.25.
    let (factor, factor_from) = match factor {
        Some((f, from)) => (f, Some(from)),
        None => (1.0, None),
    };
    if let Some(from) = &factor_from {
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(from.invalid("partial_rotary_factor", number(factor), "must be in (0, 1]"));
        }
    }
    Ok(Rope {
        theta,
        factor,
        factor_from,
    })
}

/// A number from rope_parameters, else from the top level, with the object it came from.
/// Both places are type-checked.
fn rope_number<'a>(
    params: Option<&Fields<'a>>,
    t: &Fields<'a>,
    name: &str,
) -> Result<Option<(f64, Fields<'a>)>, PlanError> {
    let nested = match params {
        Some(p) => p.f64(name)?.map(|v| (v, p.clone())),
        None => None,
    };
    let top_level = t.f64(name)?.map(|v| (v, t.clone()));
    Ok(nested.or(top_level))
}

pub(super) fn attention(t: &Fields) -> Result<AttnPlan, PlanError> {
    let num_heads = size(t, "num_attention_heads", 16)?;
    let num_kv_heads = size(t, "num_key_value_heads", 2)?;
    if !num_heads.is_multiple_of(num_kv_heads) {
        return Err(t.invalid(
            "num_key_value_heads",
            num_kv_heads,
            format!("must divide num_attention_heads ({num_heads}) for grouped-query attention"),
        ));
    }
    let head_dim = size(t, "head_dim", 256)?;
    let rope = rope(t)?;
    // Python's int() truncates; the factor is in (0, 1], so this stays in [0, head_dim].
    let rotary_dim = (head_dim as f64 * rope.factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        // Rope rotates pairs of channels, so an odd or empty rotary part cannot be applied.
        let reason = format!(
            "rotary_dim = int(head_dim {head_dim} * partial_rotary_factor {}) = {rotary_dim} must be even and > 0",
            number(rope.factor)
        );
        return Err(match &rope.factor_from {
            Some(from) => from.invalid("partial_rotary_factor", number(rope.factor), reason),
            None => t.invalid("head_dim", head_dim, reason),
        });
    }
    Ok(AttnPlan {
        num_heads,
        num_kv_heads,
        head_dim,
        rotary_dim,
        rope_theta: rope.theta,
        partial_rotary_factor: rope.factor,
    })
}

pub(super) fn indexer(
    t: &Fields,
    kinds: &[(LayerKind, String)],
    rotary_dim: usize,
) -> Result<Option<IndexerPlan>, PlanError> {
    let mut values = [None; 5];
    for (slot, name) in values.iter_mut().zip(INDEXER_FIELDS) {
        *slot = t.usize(name)?;
    }
    let first_set = INDEXER_FIELDS
        .iter()
        .zip(&values)
        .find(|(_, v)| v.is_some());
    let first_unset = INDEXER_FIELDS
        .iter()
        .zip(&values)
        .find(|(_, v)| v.is_none());
    match (first_set, first_unset) {
        (None, _) => {
            // No indexer: only a model without attention layers can do without one.
            let first_qsa = kinds
                .iter()
                .enumerate()
                .find(|(_, (kind, _))| *kind == LayerKind::Qsa);
            return match first_qsa {
                Some((i, (_, name))) => Err(t.missing(
                    "indexer_n_heads",
                    format!(
                        "layer {i} is an attention layer ({}), and QSA needs the indexer fields ({})",
                        quote(name),
                        INDEXER_FIELDS.join(", ")
                    ),
                )),
                None => Ok(None),
            };
        }
        (Some((set, _)), Some((unset, _))) => {
            return Err(t.missing(
                unset,
                format!(
                    "the indexer fields ({}) must be all set or all unset, and {set} is set",
                    INDEXER_FIELDS.join(", ")
                ),
            ));
        }
        (Some(_), None) => {}
    }

    let [n_heads, kv_heads, head_dim, budget, compress_ratio] = values.map(|v| v.unwrap_or(0));
    for (name, value) in
        INDEXER_FIELDS
            .iter()
            .zip([n_heads, kv_heads, head_dim, budget, compress_ratio])
    {
        if value == 0 {
            return Err(t.invalid(name, 0, format!("Qwen4Exp requires {name} > 0")));
        }
        cap(t, name, value)?;
    }
    if kv_heads != 1 {
        return Err(t.invalid(
            "indexer_kv_heads",
            kv_heads,
            "Qwen4Exp requires indexer_kv_heads == 1",
        ));
    }
    if !budget.is_multiple_of(compress_ratio) {
        return Err(t.invalid(
            "indexer_budget",
            budget,
            format!("must be a multiple of indexer_compress_ratio ({compress_ratio})"),
        ));
    }
    // The indexer applies the same rope to its keys and queries.
    if rotary_dim > head_dim {
        return Err(t.invalid(
            "indexer_head_dim",
            head_dim,
            format!("must be >= rotary_dim = int(head_dim * partial_rotary_factor) = {rotary_dim}"),
        ));
    }
    Ok(Some(IndexerPlan {
        n_heads,
        head_dim,
        budget,
        compress_ratio,
    }))
}
