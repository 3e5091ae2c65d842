//! The rules: read every field the runtime uses (HF defaults where absent), check it, and
//! assemble the `ModelPlan`.
//!
//! The checks are those of transformers' `Qwen4ExpTextConfig.validate_architecture`, plus the
//! ones the runtime relies on (layer count matches `layer_types`, head counts divide, sizes are
//! positive, token ids are inside the vocabulary, only the activations and rope we implement).
//! The first broken rule is reported; its error names the field and the value.

use serde_json::Value;

use super::error::{number, quote, show, PlanError};
use super::fields::{as_usize, Fields};
use super::ple_tables;
use super::{
    AttnPlan, ConfigKind, GateAct, GdnPlan, HcPlan, IndexerPlan, LayerKind, LayerPlan, ModelPlan,
    MoePlan, PlePlan,
};

/// The largest size field we accept. Far above any real model, and small enough that the
/// derived products in `ModelPlan::dims` (two sizes times a small constant) fit in 64 bits.
const MAX_DIM: usize = 1 << 31;

/// The most decoder layers we plan for (a derived `layer_types` allocates one entry per layer).
const MAX_LAYERS: usize = 1 << 16;

/// The most elements of one derived size (a projection's width, the GDN recurrent state), far
/// above any real model's (the largest, the PLE table, has 3.2e8 rows), and low enough that
/// byte counts and the graphs' products of these stay far from overflow.
const MAX_DERIVED: u64 = 1 << 40;

/// The most n-gram heads over all PLE layers: each needs a prime to be searched for.
const MAX_PLE_HEADS: usize = 4096;

/// `layer_types` names of the GDN mixer.
const GDN_TYPES: [&str; 1] = ["linear_attention"];

/// `layer_types` names of the attention + QSA indexer mixer. HF renamed it over time
/// (`deepseek_sparse_attention`/`hybrid_indexed`, `qwen_sparse_attention`, `indexed_attention`)
/// and remaps the checkpoint's `full_attention` to it; the math is the same in all versions.
const QSA_TYPES: [&str; 5] = [
    "full_attention",
    "qwen_sparse_attention",
    "indexed_attention",
    "deepseek_sparse_attention",
    "hybrid_indexed",
];

/// The five indexer fields, which come all together or not at all.
const INDEXER_FIELDS: [&str; 5] = [
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
];

pub(super) fn plan_from_json(root: &Value, origin: &str) -> Result<ModelPlan, PlanError> {
    let Some(root_map) = root.as_object() else {
        return Err(PlanError::WrongType {
            origin: origin.to_string(),
            field: "(top level)".to_string(),
            value: show(root),
            expected: "a JSON object".to_string(),
        });
    };
    let top = Fields::new(root_map, "", origin);
    let (config_kind, t) = match top.str("model_type")? {
        Some("qwen4_exp") => {
            let text = top.object("text_config")?.ok_or_else(|| {
                top.missing(
                    "text_config",
                    "a composite qwen4_exp config keeps the text model's fields in text_config",
                )
            })?;
            match text.str("model_type")? {
                None | Some("qwen4_exp_text") => {}
                Some(other) => {
                    return Err(text.unsupported(
                        "model_type",
                        quote(other),
                        "the text_config of a qwen4_exp config must be qwen4_exp_text",
                    ))
                }
            }
            (ConfigKind::Composite, text)
        }
        Some("qwen4_exp_text") => (ConfigKind::Flat, top.clone()),
        Some(other) => {
            return Err(top.unsupported(
                "model_type",
                quote(other),
                "graphrun runs \"qwen4_exp\" (composite) and \"qwen4_exp_text\" (flat) configs",
            ))
        }
        None => {
            return Err(top.missing("model_type", "expected \"qwen4_exp\" or \"qwen4_exp_text\""))
        }
    };

    // Geometry.
    let vocab_size = size(&t, "vocab_size", 248_320)?;
    let hidden_size = size(&t, "hidden_size", 2048)?;
    let num_layers = size(&t, "num_hidden_layers", 40)?;
    if num_layers > MAX_LAYERS {
        return Err(t.invalid(
            "num_hidden_layers",
            num_layers,
            format!("implausibly many layers (limit {MAX_LAYERS})"),
        ));
    }
    let max_position_embeddings = size(&t, "max_position_embeddings", 32_768)?;
    let rms_norm_eps = rms_norm_eps(&t)?;
    let gate_act = gate_activation(&t)?;

    // Hyper connections.
    let hc_count = t.usize("hc_count")?.unwrap_or(4);
    if hc_count < 2 {
        return Err(t.invalid("hc_count", hc_count, "Qwen4Exp requires hc_count > 1"));
    }
    let hc = HcPlan {
        count: cap(&t, "hc_count", hc_count)?,
        lowrank: size(&t, "hc_lowrank", 320)?,
    };

    let kinds = layer_types(&t, num_layers)?;

    // Gated DeltaNet. Checked even without GDN layers: HF builds nothing from them then, but a
    // zero there is still a broken config.
    let gdn = GdnPlan {
        conv_kernel: size(&t, "linear_conv_kernel_dim", 4)?,
        key_head_dim: size(&t, "linear_key_head_dim", 128)?,
        value_head_dim: size(&t, "linear_value_head_dim", 128)?,
        num_key_heads: size(&t, "linear_num_key_heads", 16)?,
        num_value_heads: size(&t, "linear_num_value_heads", 32)?,
        gate_act,
    };
    if !gdn.num_value_heads.is_multiple_of(gdn.num_key_heads) {
        return Err(t.invalid(
            "linear_num_value_heads",
            gdn.num_value_heads,
            format!(
                "must be a multiple of linear_num_key_heads ({}): each key head serves a group of value heads",
                gdn.num_key_heads
            ),
        ));
    }

    let attn = attention(&t)?;
    let indexer = indexer(&t, &kinds, attn.rotary_dim)?;
    let moe = moe(&t)?;
    derived_sizes(&t, hidden_size, &hc, &gdn, &attn, indexer.as_ref(), &moe)?;

    // Token ids. A composite config normally keeps them in text_config; we fall back to the
    // top level, where some exporters put them.
    let token_source = |name: &str| {
        if config_kind == ConfigKind::Composite && !t.has(name) && top.has(name) {
            &top
        } else {
            &t
        }
    };
    let eos_source = token_source("eos_token_id");
    let eos_token_ids = eos_ids(eos_source, vocab_size)?;
    let bos_token_id = single_token(token_source("bos_token_id"), "bos_token_id", vocab_size)?;
    let pad_token_id = single_token(token_source("pad_token_id"), "pad_token_id", vocab_size)?;

    // For the composite model the top-level flag is the one its lm_head follows.
    let tie_word_embeddings = match config_kind {
        ConfigKind::Composite => {
            let outer = top.bool("tie_word_embeddings")?;
            outer.or(t.bool("tie_word_embeddings")?)
        }
        ConfigKind::Flat => t.bool("tie_word_embeddings")?,
    }
    .unwrap_or(false);

    let ple = ple(&t, num_layers, vocab_size, hidden_size)?;
    // transformers (5.17 and 5.23) allows PLE only on linear_attention layers.
    if let Some(p) = &ple {
        for (i, id) in p.layer_ids.iter().enumerate() {
            let (kind, type_name) = &kinds[id - 1];
            if *kind != LayerKind::Gdn {
                return Err(t.invalid(
                    &format!("ple_layer_ids[{i}]"),
                    id,
                    format!("Qwen4Exp supports PLE only on linear_attention layers; layer {id} (one-indexed) is {type_name:?}"),
                ));
            }
        }
    }
    if ple.is_some() && eos_token_ids.is_empty() {
        // The n-gram history before the first token (and after each eos) is eos_token_id[0].
        let reason = "Qwen4Exp requires eos_token_id when ple_layer_ids is non-empty: the PLE n-gram history is padded with eos_token_id[0]";
        return Err(match eos_source.get("eos_token_id") {
            Some(value) => eos_source.invalid("eos_token_id", show(value), reason),
            None => eos_source.missing("eos_token_id", reason),
        });
    }

    let layers = kinds
        .into_iter()
        .enumerate()
        .map(|(index, (kind, type_name))| LayerPlan {
            index,
            kind,
            type_name,
            ple: ple
                .as_ref()
                .and_then(|p| p.tables.iter().position(|tables| tables.layer == index)),
        })
        .collect();

    Ok(ModelPlan {
        config_kind,
        vocab_size,
        hidden_size,
        num_layers,
        layers,
        rms_norm_eps,
        hc,
        gdn,
        attn,
        indexer,
        moe,
        ple,
        eos_token_ids,
        bos_token_id,
        pad_token_id,
        tie_word_embeddings,
        max_position_embeddings,
    })
}

/// Sizes made of several fields, computed with checked arithmetic: overflow or an implausible
/// product is an error naming the field that completes the product.
fn derived_sizes(
    t: &Fields,
    hidden_size: usize,
    hc: &HcPlan,
    gdn: &GdnPlan,
    attn: &AttnPlan,
    indexer: Option<&IndexerPlan>,
    moe: &MoePlan,
) -> Result<(), PlanError> {
    let mul = |factors: &[usize]| {
        factors
            .iter()
            .try_fold(1u64, |acc, &f| acc.checked_mul(f as u64))
    };
    let key_dim = mul(&[gdn.num_key_heads, gdn.key_head_dim]);
    let value_dim = mul(&[gdn.num_value_heads, gdn.value_head_dim]);
    let conv_dim = key_dim
        .and_then(|k| k.checked_mul(2))
        .zip(value_dim)
        .and_then(|(k, v)| k.checked_add(v));
    let mut sizes = vec![
        ("hidden_size", hidden_size, "hc_count * hidden_size", mul(&[hc.count, hidden_size])),
        (
            "linear_value_head_dim",
            gdn.value_head_dim,
            "2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * linear_value_head_dim (the GDN conv width)",
            conv_dim,
        ),
        (
            "linear_value_head_dim",
            gdn.value_head_dim,
            "linear_num_value_heads * linear_key_head_dim * linear_value_head_dim (the GDN recurrent state)",
            mul(&[gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim]),
        ),
        (
            "head_dim",
            attn.head_dim,
            "2 * num_attention_heads * head_dim (queries and their gate)",
            mul(&[2, attn.num_heads, attn.head_dim]),
        ),
        (
            "moe_intermediate_size",
            moe.intermediate,
            "2 * moe_intermediate_size",
            mul(&[2, moe.intermediate]),
        ),
    ];
    if let Some(ix) = indexer {
        sizes.push((
            "indexer_head_dim",
            ix.head_dim,
            "(indexer_n_heads + 1) * indexer_head_dim",
            mul(&[ix.n_heads.saturating_add(1), ix.head_dim]),
        ));
    }
    for (field, value, what, size) in sizes {
        match size {
            Some(n) if n <= MAX_DERIVED => {}
            Some(n) => {
                return Err(t.invalid(
                    field,
                    value,
                    format!("{what} = {n} elements is implausibly large (limit {MAX_DERIVED})"),
                ))
            }
            None => return Err(t.invalid(field, value, format!("{what} overflows 64 bits"))),
        }
    }
    Ok(())
}

/// A size field: a positive integer, `default` when absent.
fn size(t: &Fields, name: &str, default: usize) -> Result<usize, PlanError> {
    let value = t.usize(name)?.unwrap_or(default);
    if value == 0 {
        return Err(t.invalid(name, 0, format!("Qwen4Exp requires {name} > 0")));
    }
    cap(t, name, value)
}

/// Rejects absurd sizes, which would overflow derived sizes downstream.
fn cap(t: &Fields, name: &str, value: usize) -> Result<usize, PlanError> {
    if value > MAX_DIM {
        return Err(t.invalid(name, value, format!("implausibly large (limit {MAX_DIM})")));
    }
    Ok(value)
}

fn rms_norm_eps(t: &Fields) -> Result<f32, PlanError> {
    let eps = t.f64("rms_norm_eps")?.unwrap_or(1e-6);
    // Kernels use it as f32, so it must stay positive after rounding.
    let as_f32 = eps as f32;
    if !(as_f32.is_finite() && as_f32 > 0.0) {
        return Err(t.invalid(
            "rms_norm_eps",
            number(eps),
            "must be a positive number representable as f32",
        ));
    }
    Ok(as_f32)
}

/// `hidden_act` must be silu (the only one implemented); the GDN output gate is
/// `output_gate_type or hidden_act` (HF's Python `or`, so an empty string also falls back).
fn gate_activation(t: &Fields) -> Result<GateAct, PlanError> {
    let hidden_act = t.str("hidden_act")?.unwrap_or("silu");
    if hidden_act != "silu" {
        return Err(t.unsupported(
            "hidden_act",
            quote(hidden_act),
            "graphrun implements only \"silu\" (experts, shared expert, GDN conv)",
        ));
    }
    let gate = t.str("output_gate_type")?.filter(|s| !s.is_empty());
    match gate.unwrap_or(hidden_act) {
        "sigmoid" => Ok(GateAct::Sigmoid),
        "silu" => Ok(GateAct::Silu),
        other => Err(t.invalid(
            "output_gate_type",
            quote(other),
            "Qwen4Exp requires the output gate activation to be \"sigmoid\" or \"silu\"",
        )),
    }
}

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
fn layer_types(t: &Fields, num_layers: usize) -> Result<Vec<(LayerKind, String)>, PlanError> {
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

fn attention(t: &Fields) -> Result<AttnPlan, PlanError> {
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

fn indexer(
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

fn moe(t: &Fields) -> Result<MoePlan, PlanError> {
    let num_experts = size(t, "num_experts", 512)?;
    let top_k = t.usize("num_experts_per_tok")?.unwrap_or(10);
    if top_k == 0 || top_k > num_experts {
        return Err(t.invalid(
            "num_experts_per_tok",
            top_k,
            format!("Qwen4Exp requires 0 < num_experts_per_tok <= num_experts ({num_experts})"),
        ));
    }
    Ok(MoePlan {
        num_experts,
        top_k,
        intermediate: size(t, "moe_intermediate_size", 512)?,
        shared_intermediate: size(t, "shared_expert_intermediate_size", 512)?,
        norm_topk_prob: t.bool("norm_topk_prob")?.unwrap_or(true),
    })
}

/// `eos_token_id`: absent, one id, or a list of ids (generation stops on any of them).
fn eos_ids(src: &Fields, vocab_size: usize) -> Result<Vec<u32>, PlanError> {
    let name = "eos_token_id";
    match src.get(name) {
        None => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, v)| token_id(src, &format!("{name}[{i}]"), v, vocab_size))
            .collect(),
        Some(v) => Ok(vec![token_id(src, name, v, vocab_size)?]),
    }
}

fn single_token(src: &Fields, name: &str, vocab_size: usize) -> Result<Option<u32>, PlanError> {
    src.get(name)
        .map(|v| token_id(src, name, v, vocab_size))
        .transpose()
}

/// A token id must index the embedding table.
fn token_id(src: &Fields, name: &str, value: &Value, vocab_size: usize) -> Result<u32, PlanError> {
    let id = value.as_u64().ok_or_else(|| {
        src.wrong_type(&src.path(name), value, "a token id (non-negative integer)")
    })?;
    match u32::try_from(id) {
        Ok(id) if (id as u64) < vocab_size as u64 => Ok(id),
        _ => Err(src.invalid(
            name,
            id,
            format!("token id must be < vocab_size ({vocab_size})"),
        )),
    }
}

fn ple(
    t: &Fields,
    num_layers: usize,
    vocab_size: usize,
    hidden_size: usize,
) -> Result<Option<PlePlan>, PlanError> {
    let mut layer_ids = Vec::new();
    for (i, value) in t.list("ple_layer_ids")?.into_iter().flatten().enumerate() {
        let name = format!("ple_layer_ids[{i}]");
        let id = as_usize(value)
            .ok_or_else(|| t.wrong_type(&t.path(&name), value, "a one-indexed layer id"))?;
        if id == 0 || id > num_layers {
            return Err(t.invalid(
                &name,
                id,
                format!("PLE layer ids are one-indexed and must lie in [1, num_hidden_layers = {num_layers}]"),
            ));
        }
        layer_ids.push(id);
    }
    // HF keeps a sorted set; the table order (and each layer's hash seed) follows it.
    layer_ids.sort_unstable();
    layer_ids.dedup();

    // Read (and type-check) every PLE field even when PLE is off; HF checks values only when on.
    let embed_dim = t.usize("ple_embed_dim")?.unwrap_or(hidden_size);
    let conv_kernel = t.usize("ple_conv_kernel_size")?.unwrap_or(4);
    let ngram_size = t.usize("ngram_size")?.unwrap_or(3);
    let heads_per_ngram = t.usize("heads_per_ngram")?.unwrap_or(8);
    let vocab_base = t.u64("ngram_vocab_size_base")?.unwrap_or(20_000_000);
    let divisible_by = t.u64("make_ngram_vocab_size_divisible_by")?.unwrap_or(128);
    let seed = t.u64_bits("seed")?.unwrap_or(1234);
    let split_parts = t.usize("split_ngram_parts")?.unwrap_or(512);
    if layer_ids.is_empty() {
        return Ok(None);
    }

    // nH = (n-1)*hpn heads: hpn per n-gram order 2..=n.
    let num_heads = ngram_size.saturating_sub(1).saturating_mul(heads_per_ngram);
    if num_heads == 0 {
        let (name, value) = if ngram_size < 2 {
            ("ngram_size", ngram_size)
        } else {
            ("heads_per_ngram", heads_per_ngram)
        };
        return Err(t.invalid(
            name,
            value,
            format!("Qwen4Exp requires nH = (ngram_size - 1) * heads_per_ngram > 0 when ple_layer_ids is set (ngram_size = {ngram_size}, heads_per_ngram = {heads_per_ngram})"),
        ));
    }
    let total_heads = num_heads.saturating_mul(layer_ids.len());
    if total_heads > MAX_PLE_HEADS {
        return Err(t.invalid(
            "heads_per_ngram",
            heads_per_ngram,
            format!("{} PLE layers x nH {num_heads} = {total_heads} n-gram heads is implausibly many (limit {MAX_PLE_HEADS})", layer_ids.len()),
        ));
    }
    if embed_dim == 0 {
        return Err(t.invalid("ple_embed_dim", 0, "Qwen4Exp requires ple_embed_dim > 0"));
    }
    cap(t, "ple_embed_dim", embed_dim)?;
    if !embed_dim.is_multiple_of(num_heads) {
        return Err(t.invalid(
            "ple_embed_dim",
            embed_dim,
            format!("must be divisible by nH = (ngram_size - 1) * heads_per_ngram = {num_heads}"),
        ));
    }
    let conv_kernel = size(t, "ple_conv_kernel_size", conv_kernel)?;
    let split_parts = size(t, "split_ngram_parts", split_parts)?;
    for (name, value) in [
        ("ngram_vocab_size_base", vocab_base),
        ("make_ngram_vocab_size_divisible_by", divisible_by),
    ] {
        if value == 0 {
            return Err(t.invalid(name, 0, format!("Qwen4Exp requires {name} > 0")));
        }
    }

    // PLE layer k uses primes k*nH .. (k+1)*nH - 1 counted from the base.
    let primes = ple_tables::primes_from(vocab_base, total_heads).ok_or_else(|| {
        t.invalid(
            "ngram_vocab_size_base",
            vocab_base,
            "the n-gram head sizes (primes from this base) would exceed the int64 range",
        )
    })?;
    let tables = layer_ids
        .iter()
        .zip(primes.chunks(num_heads))
        .enumerate()
        .map(|(ple_index, (&id, sizes))| {
            let multipliers =
                ple_tables::layer_multipliers(vocab_size, ngram_size, ple_index, seed);
            ple_tables::layer_tables(id - 1, sizes, divisible_by, multipliers).ok_or_else(|| {
                t.invalid(
                    "make_ngram_vocab_size_divisible_by",
                    divisible_by,
                    "the padded n-gram table row count would exceed the int64 range",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    Ok(Some(PlePlan {
        layer_ids,
        embed_dim,
        conv_kernel,
        ngram_size,
        heads_per_ngram,
        num_heads,
        head_dim: embed_dim / num_heads,
        vocab_base,
        divisible_by,
        seed,
        split_parts,
        tables,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map};

    const TINY: &str = include_str!("../../tests/data/configs/tiny_flat.json");
    const REAL: &str = include_str!("../../tests/data/configs/qwen3.8-flash-next.json");

    fn tiny() -> Value {
        serde_json::from_str(TINY).unwrap()
    }

    fn plan(config: &Value) -> Result<ModelPlan, PlanError> {
        plan_from_json(config, "tiny.json")
    }

    /// The tiny config with one edit applied must load.
    fn load_with(edit: impl FnOnce(&mut Map<String, Value>)) -> ModelPlan {
        let mut config = tiny();
        edit(config.as_object_mut().unwrap());
        match plan(&config) {
            Ok(plan) => plan,
            Err(e) => panic!("expected the config to load, got: {e}"),
        }
    }

    /// The tiny config with one edit applied must fail with a message containing every needle.
    fn fails_with(edit: impl FnOnce(&mut Map<String, Value>), needles: &[&str]) -> PlanError {
        let mut config = tiny();
        edit(config.as_object_mut().unwrap());
        let err = match plan(&config) {
            Ok(_) => panic!("expected an error containing {needles:?}"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(msg.starts_with("config tiny.json: "), "{msg}");
        for needle in needles {
            assert!(msg.contains(needle), "{msg:?} does not contain {needle:?}");
        }
        err
    }

    fn set(name: &'static str, value: Value) -> impl FnOnce(&mut Map<String, Value>) {
        move |m| {
            m.insert(name.to_string(), value);
        }
    }

    fn remove(name: &'static str) -> impl FnOnce(&mut Map<String, Value>) {
        move |m| {
            m.remove(name);
        }
    }

    // ---- config shapes ----

    #[test]
    fn model_type_must_be_qwen4_exp() {
        fails_with(
            set("model_type", json!("qwen3_next")),
            &["field model_type = \"qwen3_next\"", "unsupported"],
        );
        fails_with(remove("model_type"), &["field model_type is missing"]);
    }

    #[test]
    fn composite_needs_a_text_config() {
        fails_with(
            set("model_type", json!("qwen4_exp")),
            &["field text_config is missing"],
        );
        let mut config: Value = serde_json::from_str(REAL).unwrap();
        config["text_config"]["model_type"] = json!("qwen3_5_text");
        let msg = plan(&config).unwrap_err().to_string();
        assert!(
            msg.contains("field text_config.model_type = \"qwen3_5_text\""),
            "{msg}"
        );
    }

    #[test]
    fn top_level_must_be_an_object() {
        let msg = plan(&json!([1, 2])).unwrap_err().to_string();
        assert!(msg.contains("expected a JSON object"), "{msg}");
    }

    #[test]
    fn composite_wraps_the_flat_fields() {
        let mut composite = json!({
            "model_type": "qwen4_exp",
            "text_config": tiny(),
            "vision_config": {"depth": 1},
            "tie_word_embeddings": true
        });
        composite["text_config"]["model_type"] = json!("qwen4_exp_text");
        let plan_c = plan(&composite).unwrap();
        let plan_f = plan(&tiny()).unwrap();
        assert_eq!(plan_c.config_kind, ConfigKind::Composite);
        // Same model apart from the kind and the top-level tie flag.
        assert!(plan_c.tie_word_embeddings);
        assert!(!plan_f.tie_word_embeddings);
        assert_eq!(plan_c.layers, plan_f.layers);
        assert_eq!(plan_c.ple, plan_f.ple);
    }

    #[test]
    fn tie_word_embeddings_inside_text_config_counts_for_composite() {
        let mut composite = json!({"model_type": "qwen4_exp", "text_config": tiny()});
        composite["text_config"]["tie_word_embeddings"] = json!(true);
        assert!(plan(&composite).unwrap().tie_word_embeddings);
        // The top-level flag wins when both are given.
        composite["tie_word_embeddings"] = json!(false);
        assert!(!plan(&composite).unwrap().tie_word_embeddings);
        composite["tie_word_embeddings"] = json!("no");
        let msg = plan(&composite).unwrap_err().to_string();
        assert!(
            msg.contains("field tie_word_embeddings = \"no\": expected true or false"),
            "{msg}"
        );
    }

    #[test]
    fn composite_falls_back_to_top_level_token_ids() {
        let mut text = tiny();
        text.as_object_mut().unwrap().remove("eos_token_id");
        let composite =
            json!({"model_type": "qwen4_exp", "text_config": text, "eos_token_id": [2, 3]});
        assert_eq!(plan(&composite).unwrap().eos_token_ids, [2, 3]);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let plan = load_with(|m| {
            m.insert("mtp".into(), json!({"hybrid": true}));
            m.insert("mamba_ssm_dtype".into(), json!("float32"));
            m.insert("full_attention_interval".into(), json!(4));
        });
        assert_eq!(plan.num_layers, 2);
    }

    #[test]
    fn null_means_absent() {
        // HF passes None for "not given"; a null size falls back to its default.
        let plan = load_with(set("max_position_embeddings", Value::Null));
        assert_eq!(plan.max_position_embeddings, 32768);
        let plan = load_with(|m| {
            for name in INDEXER_FIELDS {
                m.insert(name.into(), Value::Null);
            }
            m.insert(
                "layer_types".into(),
                json!(["linear_attention", "linear_attention"]),
            );
        });
        assert_eq!(plan.indexer, None);
    }

    // ---- field types ----

    #[test]
    fn wrong_type_names_the_field() {
        fails_with(
            set("hidden_size", json!("32")),
            &["field hidden_size = \"32\": expected a non-negative integer"],
        );
        fails_with(
            set("hidden_size", json!(32.0)),
            &["field hidden_size = 32.0: expected a non-negative integer"],
        );
        fails_with(
            set("hidden_size", json!(-32)),
            &["field hidden_size = -32: expected a non-negative integer"],
        );
        fails_with(
            set("rope_parameters", json!("default")),
            &["field rope_parameters = \"default\": expected an object"],
        );
        fails_with(
            set("layer_types", json!("linear_attention")),
            &["field layer_types = \"linear_attention\": expected a list"],
        );
        fails_with(
            set("layer_types", json!(["linear_attention", 3])),
            &["field layer_types[1] = 3: expected a layer type name"],
        );
        fails_with(
            set("ple_layer_ids", json!([1, "2"])),
            &["field ple_layer_ids[1] = \"2\""],
        );
        fails_with(
            set("norm_topk_prob", json!(1)),
            &["field norm_topk_prob = 1: expected true or false"],
        );
        fails_with(
            set("rms_norm_eps", json!("1e-6")),
            &["field rms_norm_eps = \"1e-6\": expected a number"],
        );
        fails_with(
            set("eos_token_id", json!("2")),
            &["field eos_token_id = \"2\": expected a token id"],
        );
        fails_with(
            set("eos_token_id", json!([2, null])),
            &["field eos_token_id[1] = null: expected a token id"],
        );
    }

    #[test]
    fn type_errors_in_unused_ple_fields_are_still_reported() {
        fails_with(
            |m| {
                m.insert("ple_layer_ids".into(), json!([]));
                m.insert("ngram_size".into(), json!("three"));
            },
            &["field ngram_size = \"three\""],
        );
    }

    // ---- geometry and sizes ----

    #[test]
    fn size_fields_must_be_positive() {
        for name in [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "hc_lowrank",
            "ple_conv_kernel_size",
            "split_ngram_parts",
            "ngram_vocab_size_base",
            "make_ngram_vocab_size_divisible_by",
        ] {
            fails_with(
                set(name, json!(0)),
                &[&format!("field {name} = 0: Qwen4Exp requires {name} > 0")],
            );
        }
    }

    #[test]
    fn absurd_sizes_are_rejected() {
        fails_with(
            set("hidden_size", json!(1u64 << 40)),
            &["field hidden_size = 1099511627776: implausibly large"],
        );
        fails_with(
            |m| {
                m.insert("num_hidden_layers".into(), json!(1u64 << 20));
                m.remove("layer_types");
            },
            &["field num_hidden_layers = 1048576: implausibly many layers"],
        );
    }

    #[test]
    fn products_of_sizes_are_checked_naming_a_field() {
        // 8 * 2^31 * 2^31 = 2^65: overflows 64 bits.
        let err = fails_with(
            |m| {
                m.insert("linear_key_head_dim".into(), json!(1u64 << 31));
                m.insert("linear_value_head_dim".into(), json!(1u64 << 31));
            },
            &[
                "field linear_value_head_dim = 2147483648",
                "overflows 64 bits",
            ],
        );
        assert!(err.to_string().contains("GDN recurrent state"), "{err}");
        // 2^31 streams of 2^31: fits 64 bits, but far past any model.
        fails_with(
            |m| {
                m.insert("hc_count".into(), json!(1u64 << 31));
                m.insert("hidden_size".into(), json!(1u64 << 31));
            },
            &[
                "field hidden_size = 2147483648",
                "hc_count * hidden_size = 4611686018427387904 elements is implausibly large",
            ],
        );
    }

    #[test]
    fn vocab_size_zero() {
        fails_with(
            set("vocab_size", json!(0)),
            &["field vocab_size = 0: Qwen4Exp requires vocab_size > 0"],
        );
    }

    #[test]
    fn rms_norm_eps_must_be_positive() {
        fails_with(
            set("rms_norm_eps", json!(0.0)),
            &["field rms_norm_eps = 0.0: must be a positive number"],
        );
        fails_with(
            set("rms_norm_eps", json!(1e-60)),
            &["field rms_norm_eps = 1e-60"],
        );
    }

    #[test]
    fn layer_types_length_must_match() {
        fails_with(
            set("layer_types", json!(["linear_attention"])),
            &["field layer_types = [1 entries]", "num_hidden_layers = 2"],
        );
    }

    #[test]
    fn unknown_layer_type_names_index_and_accepted_names() {
        let err = fails_with(
            set("layer_types", json!(["linear_attention", "mamba"])),
            &[
                "field layer_types[1] = \"mamba\"",
                "unknown type for layer 1",
                "accepted: linear_attention, full_attention, qwen_sparse_attention, indexed_attention, deepseek_sparse_attention, hybrid_indexed",
            ],
        );
        assert!(matches!(err, PlanError::UnknownLayerType { index: 1, .. }));
    }

    #[test]
    fn all_attention_type_names_map_to_qsa() {
        for name in QSA_TYPES {
            let plan = load_with(set("layer_types", json!(["linear_attention", name])));
            assert_eq!(plan.layers[1].kind, LayerKind::Qsa);
            assert_eq!(plan.layers[1].type_name, name);
        }
    }

    #[test]
    fn missing_layer_types_are_derived() {
        let plan = load_with(|m| {
            m.remove("layer_types");
            m.insert("num_hidden_layers".into(), json!(8));
            m.insert("ple_layer_ids".into(), json!([2]));
        });
        let kinds: Vec<LayerKind> = plan.layers.iter().map(|l| l.kind).collect();
        use LayerKind::{Gdn, Qsa};
        assert_eq!(kinds, [Gdn, Gdn, Gdn, Qsa, Gdn, Gdn, Gdn, Qsa]);
        assert_eq!(plan.layers[3].type_name, "indexed_attention");
        assert_eq!(plan.layers[0].type_name, "linear_attention");

        let plan = load_with(|m| {
            m.remove("layer_types");
            m.insert("num_hidden_layers".into(), json!(4));
            m.insert("full_attention_interval".into(), json!(2));
        });
        let kinds: Vec<LayerKind> = plan.layers.iter().map(|l| l.kind).collect();
        assert_eq!(kinds, [Gdn, Qsa, Gdn, Qsa]);

        fails_with(
            |m| {
                m.remove("layer_types");
                m.insert("full_attention_interval".into(), json!(0));
            },
            &["field full_attention_interval = 0: must be > 0"],
        );
    }

    // ---- activations ----

    #[test]
    fn hidden_act_must_be_silu() {
        fails_with(
            set("hidden_act", json!("gelu")),
            &["field hidden_act = \"gelu\": unsupported", "silu"],
        );
    }

    #[test]
    fn output_gate_must_be_sigmoid_or_silu() {
        fails_with(
            set("output_gate_type", json!("relu")),
            &[
                "field output_gate_type = \"relu\"",
                "\"sigmoid\" or \"silu\"",
            ],
        );
        let plan = load_with(set("output_gate_type", json!("sigmoid")));
        assert_eq!(plan.gdn.gate_act, GateAct::Sigmoid);
        // Python's `or`: an empty string falls back to hidden_act.
        let plan = load_with(set("output_gate_type", json!("")));
        assert_eq!(plan.gdn.gate_act, GateAct::Silu);
    }

    // ---- hyper connections, heads ----

    #[test]
    fn hc_count_must_exceed_one() {
        fails_with(
            set("hc_count", json!(1)),
            &["field hc_count = 1: Qwen4Exp requires hc_count > 1"],
        );
        fails_with(set("hc_count", json!(0)), &["field hc_count = 0"]);
    }

    #[test]
    fn attention_heads_must_be_a_multiple_of_kv_heads() {
        fails_with(
            |m| {
                m.insert("num_attention_heads".into(), json!(3));
                m.insert("num_key_value_heads".into(), json!(2));
            },
            &["field num_key_value_heads = 2: must divide num_attention_heads (3)"],
        );
    }

    #[test]
    fn value_heads_must_be_a_multiple_of_key_heads() {
        fails_with(
            set("linear_num_value_heads", json!(6)),
            &["field linear_num_value_heads = 6: must be a multiple of linear_num_key_heads (4)"],
        );
    }

    // ---- rope ----

    #[test]
    fn rope_type_must_be_default() {
        fails_with(
            set(
                "rope_parameters",
                json!({"rope_type": "yarn", "factor": 4.0}),
            ),
            &["field rope_parameters.rope_type = \"yarn\": unsupported"],
        );
        fails_with(
            |m| {
                m.remove("rope_parameters");
                m.insert("rope_scaling".into(), json!({"type": "linear"}));
            },
            &["field rope_scaling.type = \"linear\": unsupported"],
        );
    }

    #[test]
    fn top_level_partial_rotary_factor() {
        let plan = load_with(|m| {
            m.insert("rope_parameters".into(), json!({"rope_type": "default"}));
            m.insert("partial_rotary_factor".into(), json!(0.5));
        });
        assert_eq!(plan.attn.partial_rotary_factor, 0.5);
        assert_eq!(plan.attn.rotary_dim, 8);
        // rope_parameters wins when both are given.
        let plan = load_with(set("partial_rotary_factor", json!(0.5)));
        assert_eq!(plan.attn.partial_rotary_factor, 0.25);
        assert_eq!(plan.attn.rotary_dim, 4);
    }

    #[test]
    fn rope_theta_defaults_and_top_level() {
        let plan = load_with(|_| {});
        assert_eq!(plan.attn.rope_theta, 10000.0);
        let plan = load_with(set("rope_theta", json!(1e6)));
        assert_eq!(plan.attn.rope_theta, 1e6);
        let plan = load_with(|m| {
            m.insert("rope_theta".into(), json!(1e6));
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.25}),
            );
        });
        assert_eq!(plan.attn.rope_theta, 5e5);
        fails_with(
            set("rope_theta", json!(-1.0)),
            &["field rope_theta = -1.0: must be a positive number"],
        );
    }

    #[test]
    fn partial_rotary_factor_defaults_to_one() {
        let plan = load_with(|m| {
            m.remove("rope_parameters");
            m.insert("indexer_head_dim".into(), json!(16));
        });
        assert_eq!(plan.attn.partial_rotary_factor, 1.0);
        assert_eq!(plan.attn.rotary_dim, 16);
    }

    #[test]
    fn partial_rotary_factor_must_be_in_range() {
        fails_with(
            set("rope_parameters", json!({"partial_rotary_factor": 1.5})),
            &["field rope_parameters.partial_rotary_factor = 1.5: must be in (0, 1]"],
        );
        fails_with(
            set("rope_parameters", json!({"partial_rotary_factor": 0.0})),
            &["field rope_parameters.partial_rotary_factor = 0.0: must be in (0, 1]"],
        );
    }

    #[test]
    fn rotary_dim_must_be_even_and_positive() {
        // int(16 * 0.05) = 0
        fails_with(
            set("rope_parameters", json!({"partial_rotary_factor": 0.05})),
            &[
                "field rope_parameters.partial_rotary_factor = 0.05",
                "= 0 must be even and > 0",
            ],
        );
        // int(16 * 0.1875) = 3
        fails_with(
            set("rope_parameters", json!({"partial_rotary_factor": 0.1875})),
            &["= 3 must be even and > 0"],
        );
        // No factor anywhere: full rotary over an odd head_dim.
        fails_with(
            |m| {
                m.remove("rope_parameters");
                m.insert("head_dim".into(), json!(7));
            },
            &["field head_dim = 7", "= 7 must be even and > 0"],
        );
    }

    #[test]
    fn rotary_dim_must_fit_the_indexer_head() {
        // rotary_dim 4 > indexer_head_dim 2
        fails_with(
            set("indexer_head_dim", json!(2)),
            &["field indexer_head_dim = 2: must be >= rotary_dim", "= 4"],
        );
    }

    // ---- indexer ----

    #[test]
    fn indexer_fields_all_or_none() {
        let err = fails_with(
            remove("indexer_budget"),
            &[
                "field indexer_budget is missing",
                "must be all set or all unset",
            ],
        );
        assert!(matches!(err, PlanError::Missing { .. }));
    }

    #[test]
    fn indexer_fields_must_be_positive() {
        for name in INDEXER_FIELDS {
            fails_with(
                set(name, json!(0)),
                &[&format!("field {name} = 0: Qwen4Exp requires {name} > 0")],
            );
        }
    }

    #[test]
    fn indexer_kv_heads_must_be_one() {
        fails_with(
            set("indexer_kv_heads", json!(2)),
            &["field indexer_kv_heads = 2: Qwen4Exp requires indexer_kv_heads == 1"],
        );
    }

    #[test]
    fn indexer_budget_must_be_a_multiple_of_compress_ratio() {
        fails_with(
            set("indexer_budget", json!(5)),
            &["field indexer_budget = 5: must be a multiple of indexer_compress_ratio (2)"],
        );
    }

    #[test]
    fn attention_layers_need_the_indexer() {
        fails_with(
            |m| {
                for name in INDEXER_FIELDS {
                    m.remove(name);
                }
            },
            &[
                "field indexer_n_heads is missing",
                "layer 1 is an attention layer (\"full_attention\")",
            ],
        );
        // Without attention layers the indexer may be absent.
        let plan = load_with(|m| {
            for name in INDEXER_FIELDS {
                m.remove(name);
            }
            m.insert(
                "layer_types".into(),
                json!(["linear_attention", "linear_attention"]),
            );
        });
        assert_eq!(plan.indexer, None);
        assert_eq!(plan.num_qsa_layers(), 0);
    }

    // ---- MoE ----

    #[test]
    fn num_experts_must_be_positive() {
        fails_with(
            set("num_experts", json!(0)),
            &["field num_experts = 0: Qwen4Exp requires num_experts > 0"],
        );
    }

    #[test]
    fn top_k_must_be_within_the_experts() {
        fails_with(
            set("num_experts_per_tok", json!(0)),
            &[
                "field num_experts_per_tok = 0",
                "0 < num_experts_per_tok <= num_experts (4)",
            ],
        );
        fails_with(
            set("num_experts_per_tok", json!(5)),
            &["field num_experts_per_tok = 5", "<= num_experts (4)"],
        );
    }

    #[test]
    fn expert_sizes_must_be_positive() {
        fails_with(
            set("moe_intermediate_size", json!(0)),
            &["field moe_intermediate_size = 0: Qwen4Exp requires moe_intermediate_size > 0"],
        );
        fails_with(
            set("shared_expert_intermediate_size", json!(0)),
            &["field shared_expert_intermediate_size = 0: Qwen4Exp requires shared_expert_intermediate_size > 0"],
        );
    }

    // ---- tokens ----

    #[test]
    fn eos_as_int_or_list() {
        assert_eq!(load_with(set("eos_token_id", json!(5))).eos_token_ids, [5]);
        let plan = load_with(set("eos_token_id", json!([7, 2, 9])));
        assert_eq!(plan.eos_token_ids, [7, 2, 9]);
        assert_eq!(plan.ple_eos(), Some(7));
    }

    #[test]
    fn eos_optional_without_ple() {
        let plan = load_with(|m| {
            m.remove("eos_token_id");
            m.insert("ple_layer_ids".into(), json!([]));
        });
        assert!(plan.eos_token_ids.is_empty());
        assert_eq!(plan.ple_eos(), None);
        assert_eq!(plan.ple, None);
        assert!(plan.layers.iter().all(|l| l.ple.is_none()));
    }

    #[test]
    fn ple_needs_eos() {
        fails_with(
            remove("eos_token_id"),
            &["field eos_token_id is missing", "ple_layer_ids"],
        );
        fails_with(
            set("eos_token_id", json!([])),
            &["field eos_token_id = []", "ple_layer_ids"],
        );
    }

    #[test]
    fn token_ids_must_be_inside_the_vocab() {
        fails_with(
            set("eos_token_id", json!(99)),
            &["field eos_token_id = 99: token id must be < vocab_size (99)"],
        );
        fails_with(
            set("eos_token_id", json!([2, 100])),
            &["field eos_token_id[1] = 100"],
        );
        fails_with(
            set("bos_token_id", json!(1000)),
            &["field bos_token_id = 1000"],
        );
        fails_with(
            set("pad_token_id", json!(1u64 << 40)),
            &["field pad_token_id = 1099511627776"],
        );
    }

    #[test]
    fn bos_and_pad_are_optional() {
        let plan = load_with(|m| {
            m.remove("bos_token_id");
            m.remove("pad_token_id");
        });
        assert_eq!((plan.bos_token_id, plan.pad_token_id), (None, None));
    }

    // ---- PLE ----

    #[test]
    fn ple_ids_are_one_indexed_and_in_range() {
        fails_with(
            set("ple_layer_ids", json!([0])),
            &["field ple_layer_ids[0] = 0", "[1, num_hidden_layers = 2]"],
        );
        fails_with(
            set("ple_layer_ids", json!([1, 3])),
            &["field ple_layer_ids[1] = 3", "[1, num_hidden_layers = 2]"],
        );
    }

    #[test]
    fn ple_ids_are_sorted_and_deduplicated() {
        let plan = load_with(|m| {
            m.insert("num_hidden_layers".into(), json!(4));
            m.insert(
                "layer_types".into(),
                json!([
                    "linear_attention",
                    "full_attention",
                    "linear_attention",
                    "linear_attention"
                ]),
            );
            m.insert("ple_layer_ids".into(), json!([4, 1, 4, 3]));
        });
        let ple = plan.ple.as_ref().unwrap();
        assert_eq!(ple.layer_ids, [1, 3, 4]);
        let layers: Vec<usize> = ple.tables.iter().map(|t| t.layer).collect();
        assert_eq!(layers, [0, 2, 3]);
        let refs: Vec<Option<usize>> = plan.layers.iter().map(|l| l.ple).collect();
        assert_eq!(refs, [Some(0), None, Some(1), Some(2)]);
        // Each PLE layer takes the next nH primes, and hashes with its own seed offset.
        assert_eq!(ple.tables[0].head_sizes, [31, 37, 41, 43]);
        assert_eq!(ple.tables[1].head_sizes, [47, 53, 59, 61]);
        assert_eq!(ple.tables[2].head_sizes, [67, 71, 73, 79]);
        assert_eq!(ple.tables[1].padded_rows, 224); // 220 rounded up to 8
        assert_ne!(ple.tables[0].multipliers, ple.tables[1].multipliers);
    }

    #[test]
    fn ple_on_an_attention_layer_is_refused() {
        fails_with(
            set("ple_layer_ids", json!([2])),
            &[
                "field ple_layer_ids[0] = 2",
                "only on linear_attention layers",
                "\"full_attention\"",
            ],
        );
    }

    #[test]
    fn ple_needs_heads() {
        fails_with(
            set("ngram_size", json!(1)),
            &[
                "field ngram_size = 1",
                "nH = (ngram_size - 1) * heads_per_ngram > 0",
            ],
        );
        fails_with(
            set("heads_per_ngram", json!(0)),
            &[
                "field heads_per_ngram = 0",
                "nH = (ngram_size - 1) * heads_per_ngram > 0",
            ],
        );
        fails_with(
            set("heads_per_ngram", json!(100_000)),
            &["field heads_per_ngram = 100000", "implausibly many"],
        );
    }

    #[test]
    fn ple_embed_dim_must_split_into_heads() {
        fails_with(
            set("ple_embed_dim", json!(0)),
            &["field ple_embed_dim = 0: Qwen4Exp requires ple_embed_dim > 0"],
        );
        fails_with(
            set("ple_embed_dim", json!(18)),
            &["field ple_embed_dim = 18: must be divisible by nH", "= 4"],
        );
    }

    #[test]
    fn ple_defaults() {
        let plan = load_with(|m| {
            m.remove("ple_embed_dim");
            m.remove("seed");
        });
        let ple = plan.ple.as_ref().unwrap();
        assert_eq!(ple.embed_dim, 32); // hidden_size
        assert_eq!(ple.head_dim, 8);
        assert_eq!(ple.seed, 1234);
        assert_eq!(ple.num_heads, 4);
    }

    #[test]
    fn ple_seed_changes_the_multipliers() {
        let plan = load_with(set("seed", json!(1)));
        let ple = plan.ple.as_ref().unwrap();
        assert_eq!(ple.seed, 1);
        assert_eq!(
            ple.tables[0].multipliers,
            ple_tables::layer_multipliers(99, 3, 0, 1)
        );
        assert_ne!(
            ple.tables[0].multipliers,
            ple_tables::layer_multipliers(99, 3, 0, 1234)
        );
        // A negative seed is taken modulo 2^64, as Python's `& M64` does.
        let plan = load_with(set("seed", json!(-1)));
        assert_eq!(plan.ple.unwrap().seed, u64::MAX);
    }

    #[test]
    fn ple_tables_beyond_int64_are_rejected() {
        fails_with(
            set("ngram_vocab_size_base", json!(u64::MAX)),
            &[
                "field ngram_vocab_size_base = 18446744073709551615",
                "int64",
            ],
        );
    }

    // ---- robustness ----

    #[test]
    fn never_panics_on_odd_values() {
        let odd = [
            Value::Null,
            json!(-1),
            json!(0),
            json!(1),
            json!(3),
            json!(2.5),
            json!(1e300),
            json!(u64::MAX),
            json!(i64::MIN),
            json!("x"),
            json!(""),
            json!(true),
            json!([]),
            json!([0]),
            json!([1, 2, 3]),
            json!({}),
            json!({"rope_type": "default"}),
        ];
        let names: Vec<String> = tiny()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .chain(
                [
                    "rope_scaling",
                    "rope_theta",
                    "partial_rotary_factor",
                    "output_gate_type",
                    "full_attention_interval",
                    "seed",
                    "tie_word_embeddings",
                    "norm_topk_prob",
                    "rms_norm_eps",
                ]
                .map(String::from),
            )
            .collect();
        for name in &names {
            for value in &odd {
                let mut config = tiny();
                config[name.as_str()] = value.clone();
                // Either outcome is fine; a panic fails the test.
                let _ = plan(&config);
                config.as_object_mut().unwrap().remove("layer_types");
                let _ = plan(&config);
            }
        }
        for root in [
            json!(null),
            json!(1),
            json!("x"),
            json!({}),
            json!({"model_type": 3}),
        ] {
            assert!(plan(&root).is_err());
        }
    }
}
