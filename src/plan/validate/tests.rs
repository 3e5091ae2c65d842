//! The config rules end to end: a config edited one field at a time, loaded, and the error (or
//! the plan) checked. The layer and attention fields are in `layers`, the PLE fields in `ple`.

use super::*;
use serde_json::{json, Map};

use super::layers::INDEXER_FIELDS;

mod layers;
mod ple;

const TINY: &str = include_str!("../../../tests/data/configs/tiny_flat.json");
const REAL: &str = include_str!("../../../tests/data/configs/qwen3.8-flash-next.json");

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
    let composite = json!({"model_type": "qwen4_exp", "text_config": text, "eos_token_id": [2, 3]});
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
