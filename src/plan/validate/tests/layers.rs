//! The layer-type, head, rope and indexer rules.

use super::super::layers::QSA_TYPES;
use super::*;

// ---- layer types ----

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
