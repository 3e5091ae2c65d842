//! The PLE rules: layer ids, heads, the embedding width and the n-gram tables.

use super::*;
use crate::plan::ple_tables;

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
