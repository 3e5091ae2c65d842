//! The rules: read every field the runtime uses (HF defaults where absent), check it, and
//! assemble the `ModelPlan`.
//!
//! The checks are those of transformers' `Qwen4ExpTextConfig.validate_architecture`, plus the
//! ones the runtime relies on (layer count matches `layer_types`, head counts divide, sizes are
//! positive, token ids are inside the vocabulary, only the activations and rope we implement).
//! The first broken rule is reported; its error names the field and the value.

use serde_json::Value;

use super::error::{number, quote, show, PlanError};
use super::fields::Fields;
use super::{
    AttnPlan, ConfigKind, GateAct, GdnPlan, HcPlan, IndexerPlan, LayerKind, LayerPlan, ModelPlan,
    MoePlan,
};

mod layers;
mod ple;

use layers::{attention, indexer, layer_types};
use ple::ple;

/// The largest size field we accept. Far above any real model, and small enough that the
/// derived products in `ModelPlan::dims` (two sizes times a small constant) fit in 64 bits.
const MAX_DIM: usize = 1 << 31;

/// The most decoder layers we plan for (a derived `layer_types` allocates one entry per layer).
const MAX_LAYERS: usize = 1 << 16;
/// Most MTP draft layers a config may declare (the release has one).
const MAX_MTP_LAYERS: usize = 16;

/// The most elements of one derived size (a projection's width, the GDN recurrent state), far
/// above any real model's (the largest, the PLE table, has 3.2e8 rows), and low enough that
/// byte counts and the graphs' products of these stay far from overflow.
const MAX_DERIVED: u64 = 1 << 40;

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
    let mtp_layers = t.usize("mtp_num_hidden_layers")?.unwrap_or(0);
    if mtp_layers > MAX_MTP_LAYERS {
        return Err(t.invalid(
            "mtp_num_hidden_layers",
            mtp_layers,
            format!("implausibly many draft layers (limit {MAX_MTP_LAYERS})"),
        ));
    }
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
    if mtp_layers > 0 && indexer.is_none() {
        return Err(t.invalid(
            "mtp_num_hidden_layers",
            mtp_layers,
            "the MTP draft's layers are QSA layers, which need the indexer_* fields",
        ));
    }
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
        mtp_layers,
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

#[cfg(test)]
mod tests;
