//! Scheduling rules and graph files as data: overlap checks, overrides, editing a copy of
//! `graphs/` to change what lowering does.

mod common;

use graphrun::ir::{LogitsMode, Phase};
use graphrun::lower::{lower, GraphSet, LowerError, LowerOptions};
use graphrun::passes::schedule::RuleOverride;
use graphrun::plan::ModelPlan;

fn tiny_plan() -> ModelPlan {
    ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap()
}

/// A copy of the repository's graph files to edit.
fn graphs_copy(tag: &str) -> std::path::PathBuf {
    let dir = common::temp_dir(tag);
    std::fs::create_dir_all(dir.join("qwen4exp")).unwrap();
    for entry in std::fs::read_dir(common::repo().join("graphs/qwen4exp")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join("qwen4exp").join(p.file_name().unwrap())).unwrap();
    }
    for f in ["fusions.ron", "rules.ron"] {
        std::fs::copy(common::repo().join("graphs").join(f), dir.join(f)).unwrap();
    }
    dir
}

#[test]
fn the_files_on_disk_are_the_embedded_ones() {
    let plan = tiny_plan();
    let opts = LowerOptions::new(Phase::Prefill, 5, LogitsMode::All);
    let a = lower(&plan, &GraphSet::embedded().unwrap(), &opts).unwrap();
    let b = lower(
        &plan,
        &GraphSet::load_dir(&common::repo().join("graphs")).unwrap(),
        &opts,
    )
    .unwrap();
    assert_eq!(a.program, b.program);
}

#[test]
fn rules_choose_variants_by_token_count() {
    let plan = tiny_plan();
    let g = GraphSet::embedded().unwrap();
    let pre = lower(
        &plan,
        &g,
        &LowerOptions::new(Phase::Prefill, 8, LogitsMode::All),
    )
    .unwrap()
    .program;
    let dec = lower(
        &plan,
        &g,
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap()
    .program;
    let linear = |p: &graphrun::ir::Program| {
        p.nodes
            .iter()
            .filter(|n| n.op.kind() == "linear")
            .map(|n| (n.rule.clone(), n.variant.clone()))
            .collect::<Vec<_>>()
    };
    assert!(linear(&pre)
        .iter()
        .all(|(r, v)| r == "linear.prefill_tiled" && v == "tiled"));
    assert!(linear(&dec)
        .iter()
        .all(|(r, v)| r == "linear.decode_rows" && v == "rows"));
    let moe = pre
        .nodes
        .iter()
        .find(|n| n.op.kind() == "moe_experts")
        .unwrap();
    assert_eq!(
        (moe.rule.as_str(), moe.variant.as_str()),
        ("moe.prefill_expert_major", "expert_major")
    );
    let moe = dec
        .nodes
        .iter()
        .find(|n| n.op.kind() == "moe_experts")
        .unwrap();
    assert_eq!(
        (moe.rule.as_str(), moe.variant.as_str()),
        ("default", "token_major")
    );
}

#[test]
fn overrides_replace_or_disable_a_rule() {
    let plan = tiny_plan();
    let g = GraphSet::embedded().unwrap();
    let mut opts = LowerOptions::new(Phase::Prefill, 8, LogitsMode::All);
    opts.overrides = vec![
        "linear.prefill_tiled=rows".parse().unwrap(),
        "moe.prefill_expert_major=off".parse().unwrap(),
    ];
    let p = lower(&plan, &g, &opts).unwrap().program;
    for n in &p.nodes {
        match n.op.kind() {
            "linear" => assert_eq!(
                (n.rule.as_str(), n.variant.as_str()),
                ("linear.prefill_tiled", "rows")
            ),
            "moe_experts" => assert_eq!(
                (n.rule.as_str(), n.variant.as_str()),
                ("default", "token_major")
            ),
            _ => {}
        }
    }
    let bad = RuleOverride {
        rule: "linear.prefill_tiled".into(),
        variant: Some("warp".into()),
    };
    opts.overrides = vec![bad];
    let err = lower(&plan, &g, &opts).unwrap_err().to_string();
    assert!(
        err.contains("no variant `warp`") && err.contains("rows, tiled"),
        "{err}"
    );
}

#[test]
fn overlapping_rules_are_refused() {
    let dir = graphs_copy("overlap");
    let rules = std::fs::read_to_string(dir.join("rules.ron")).unwrap();
    let extra = r#"  (name: "linear.clash", op: "linear", when: (min_tokens: Some(4)), variant: "rows", priority: 10),
]"#;
    let edited = rules.trim_end().strip_suffix(']').unwrap().to_string() + extra;
    std::fs::write(dir.join("rules.ron"), edited).unwrap();
    let g = GraphSet::load_dir(&dir).unwrap();
    let err = lower(
        &tiny_plan(),
        &g,
        &LowerOptions::new(Phase::Prefill, 8, LogitsMode::All),
    )
    .unwrap_err();
    assert!(matches!(err, LowerError::Rule { .. }), "{err}");
    assert!(
        err.to_string().contains("overlaps rule `linear.clash`"),
        "{err}"
    );
}

/// Editing fusions.ron is how a user tries or drops a fusion.
#[test]
fn removing_a_fusion_from_the_file_turns_it_off() {
    let dir = graphs_copy("nofusion");
    std::fs::write(dir.join("fusions.ron"), "[]\n").unwrap();
    let g = GraphSet::load_dir(&dir).unwrap();
    let p = lower(
        &tiny_plan(),
        &g,
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap()
    .program;
    assert!(p.nodes.iter().all(|n| n.fused.is_none()));
    assert!(p.nodes.iter().any(|n| n.op.kind() == "stream_mean"));
}

#[test]
fn a_fusion_whose_replacement_breaks_shapes_is_caught() {
    let dir = graphs_copy("badfusion");
    let text = std::fs::read_to_string(dir.join("fusions.ron")).unwrap();
    // Replace the injection gate by the mixing op, whose weights must be [R, CH] and [CH, R].
    let edited = text.replace(
        "replace: (op: HcInject(streams: \"C\"), args: [\"$hn\"], weights: [\"$w\"])",
        "replace: (op: HcMix(streams: \"C\"), args: [\"$hn\"], weights: [\"$w\", \"$w\"])",
    );
    assert_ne!(edited, text);
    std::fs::write(dir.join("fusions.ron"), edited).unwrap();
    let g = GraphSet::load_dir(&dir).unwrap();
    match lower(
        &tiny_plan(),
        &g,
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    ) {
        Err(err @ LowerError::Invalid { .. }) => assert!(err.to_string().contains("inj"), "{err}"),
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("a fusion that breaks shapes was accepted"),
    }
}
