//! Scheduling rules, step rules and graph files as data: overlap checks, overrides, editing a
//! copy of `graphs/` to change what lowering does and how a prompt is cut into steps.

mod common;

use graphrun::ir::{Device, LogitsMode, Phase, Program};
use graphrun::lower::{lower, GraphSet, LowerError, LowerOptions};
use graphrun::passes::schedule::RuleOverride;
use graphrun::plan::ModelPlan;
use graphrun::registry::{DeviceFacts, WeightFormat};
use graphrun::runtime::{Model, ModelOptions};

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
    let disk = GraphSet::load_dir(&common::repo().join("graphs")).unwrap();
    assert_eq!(GraphSet::embedded().unwrap().steps, disk.steps);
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
    assert_eq!(moe.kernels, ["ops::moe::token_major"]);
}

fn real_plan() -> ModelPlan {
    ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
        .unwrap()
}

fn cuda_decode(
    graphs: &GraphSet,
    format: WeightFormat,
    facts: DeviceFacts,
) -> Result<Program, LowerError> {
    let opts = LowerOptions {
        device: Device::Cuda,
        weight_format: Some(format),
        device_facts: Some(facts),
        ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
    };
    lower(&real_plan(), graphs, &opts).map(|l| l.program)
}

fn node<'a>(p: &'a Program, name: &str) -> &'a graphrun::ir::Node {
    p.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

/// Rules see the node's own shape and weight format: the lm head (2560 -> 248320) streams in
/// bf16, where a lane holds its row, and takes a warp per row in f32, where it does not; the
/// router's 512 rows take a block per row; and each names the kernel it launches.
#[test]
fn rules_choose_by_the_node_shape_and_name_the_kernel() {
    let g = GraphSet::embedded().unwrap();
    let bf16 = cuda_decode(&g, WeightFormat::Bf16, DeviceFacts::h200()).unwrap();
    let head = node(&bf16, "lm_head.logits");
    assert_eq!(
        (
            head.variant.as_str(),
            head.rule.as_str(),
            head.kernels.as_slice()
        ),
        (
            "rows1_stream",
            "linear.one_token_streamed",
            &["linear_rows1_stream_bf16".to_string()][..]
        )
    );
    let f32 = cuda_decode(&g, WeightFormat::F32, DeviceFacts::h200()).unwrap();
    let head = node(&f32, "lm_head.logits");
    assert_eq!(
        (
            head.variant.as_str(),
            head.rule.as_str(),
            head.kernels.as_slice()
        ),
        (
            "rows1",
            "linear.one_token",
            &["linear_rows1_f32".to_string()][..]
        )
    );
    let router = node(&bf16, "blk.0.moe.router_logits");
    assert_eq!(
        (router.variant.as_str(), router.rule.as_str()),
        ("group1_g1u4", "linear.one_token_few_rows")
    );
    // Every CUDA node names at least one kernel; no node is left to the launcher.
    assert!(bf16.nodes.iter().all(|n| !n.kernels.is_empty()));
    // In a prefill of 4 tokens the lm head sees one row (after `LastRow`) and streams; the
    // other linears see 4: bf16 ones take the few-row tensor-core kernels by their shape (GDN's
    // qkv 2560 -> 10240 32 weight rows a block, the output projections' k of 6144 eight warps
    // along k), f32 ones a warp per row, every token in the warp.
    let opts = LowerOptions {
        device: Device::Cuda,
        weight_format: Some(WeightFormat::Bf16),
        ..LowerOptions::new(Phase::Prefill, 4, LogitsMode::Last)
    };
    let p = lower(&real_plan(), &g, &opts).unwrap().program;
    assert_eq!(node(&p, "lm_head.logits").variant, "rows1_stream");
    let few = |name: &str| {
        let n = node(&p, name);
        (n.variant.clone(), n.rule.clone(), n.kernels.clone())
    };
    assert_eq!(
        few("blk.0.gdn.qkv"),
        (
            "few_r32s4".into(),
            "linear.few_rows_many_rows".into(),
            vec!["linear_few_r32_s4_t8_bf16".to_string()]
        )
    );
    assert_eq!(few("blk.0.gdn.z").0, "few_r16s4");
    assert_eq!(
        few("blk.0.attn_res.h_new").2,
        vec!["linear_hc_write_few_r16_s8_t8_bf16".to_string()]
    );
    let opts = LowerOptions {
        weight_format: Some(WeightFormat::F32),
        ..opts
    };
    let p = lower(&real_plan(), &g, &opts).unwrap().program;
    assert!(p
        .nodes
        .iter()
        .filter(|n| n.op.kind() == "linear" && n.name != "lm_head.logits")
        .all(|n| n.variant == "rows" && n.rule == "linear.cuda_rows"));
}

/// A choice whose kernel does not accept the node fails the lowering, naming the node, the rule
/// and the kernel's limit; a refused override leaves nothing half-lowered.
#[test]
fn a_kernel_that_does_not_accept_the_node_is_refused_at_lowering() {
    let g = GraphSet::embedded().unwrap();
    // f32 rows of 2560 do not fit the streamed kernels' registers.
    let opts = LowerOptions {
        device: Device::Cuda,
        weight_format: Some(WeightFormat::F32),
        overrides: vec!["linear.one_token_few_rows=rows1_stream".parse().unwrap()],
        ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
    };
    let err = lower(&real_plan(), &g, &opts).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LowerError::Refused { .. }), "{msg}");
    assert!(
        msg.contains("node `blk.0.moe.router_logits`")
            && msg.contains("rule `linear.one_token_few_rows`")
            && msg.contains("linear_rows1_stream_f32")
            && msg.contains("whole 16-byte chunks"),
        "{msg}"
    );
    // The tensor-core tiles take bf16 weights only.
    let opts = LowerOptions {
        device: Device::Cuda,
        weight_format: Some(WeightFormat::F32),
        overrides: vec!["linear.cuda_tiled=mma".parse().unwrap()],
        ..LowerOptions::new(Phase::Prefill, 64, LogitsMode::Last)
    };
    let msg = lower(&real_plan(), &g, &opts).unwrap_err().to_string();
    assert!(
        msg.contains("rule `linear.cuda_tiled`") && msg.contains("bf16"),
        "{msg}"
    );
}

/// A rule may test the device: on a device of few multiprocessors the rule below applies, on an
/// H200 it does not. A rule that tests a dimension its op's nodes lack is an error naming it.
#[test]
fn rules_see_the_device_and_name_unknown_dimensions() {
    let dir = graphs_copy("device");
    let rules = std::fs::read_to_string(dir.join("rules.ron")).unwrap();
    let extra = r#"  (name: "linear.small_gpu", op: "linear", when: (device: Cuda, tokens: (max: 1), sms: (max: 100)), variant: "rows1", priority: 99),
]"#;
    let edited = rules.trim_end().strip_suffix(']').unwrap().to_string() + extra;
    std::fs::write(dir.join("rules.ron"), &edited).unwrap();
    let g = GraphSet::load_dir(&dir).unwrap();
    let small = cuda_decode(&g, WeightFormat::Bf16, DeviceFacts::cuda(90, 80)).unwrap();
    let h200 = cuda_decode(&g, WeightFormat::Bf16, DeviceFacts::h200()).unwrap();
    assert_eq!(node(&small, "lm_head.logits").rule, "linear.small_gpu");
    assert_eq!(
        node(&h200, "lm_head.logits").rule,
        "linear.one_token_streamed"
    );

    let typo = rules.trim_end().strip_suffix(']').unwrap().to_string()
        + r#"  (name: "linear.typo", op: "linear", when: (dims: {"rowz": (max: 4)}), variant: "rows", priority: 99),
]"#;
    std::fs::write(dir.join("rules.ron"), typo).unwrap();
    let g = GraphSet::load_dir(&dir).unwrap();
    let msg = cuda_decode(&g, WeightFormat::Bf16, DeviceFacts::h200())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("rule `linear.typo`")
            && msg.contains("tests `rowz`")
            && msg.contains("row_chunks"),
        "{msg}"
    );
}

/// A rule marked `where_accepted` applies only where its kernels take the node: attention's
/// split kernels take up to 16 query heads a kv head; the real config's QSA has 16, a config with
/// more gets the reference kernels, visibly, by the default rule.
#[test]
fn where_accepted_rules_fall_through_visibly() {
    let g = GraphSet::embedded().unwrap();
    let p = cuda_decode(&g, WeightFormat::Bf16, DeviceFacts::h200()).unwrap();
    let att = p
        .nodes
        .iter()
        .find(|n| n.op.kind() == "gated_attention")
        .unwrap();
    assert_eq!(
        (att.variant.as_str(), att.rule.as_str()),
        ("split", "gated_attention.cuda_split")
    );
    let text =
        std::fs::read_to_string(common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cfg = &mut json["text_config"];
    let kv = cfg["num_key_value_heads"].as_u64().unwrap();
    cfg["num_attention_heads"] = serde_json::json!(kv * 32);
    let dir = common::temp_dir("wide-gqa");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string(&json).unwrap(),
    )
    .unwrap();
    let plan = ModelPlan::from_file(&dir.join("config.json")).unwrap();
    let opts = LowerOptions {
        device: Device::Cuda,
        ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
    };
    let p = lower(&plan, &g, &opts).unwrap().program;
    let att = p
        .nodes
        .iter()
        .find(|n| n.op.kind() == "gated_attention")
        .unwrap();
    assert_eq!(
        (att.variant.as_str(), att.rule.as_str()),
        ("reference", "default")
    );
    assert!(att
        .kernels
        .iter()
        .any(|k| k == "attention_reference_gated_f32"));
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
    let extra = r#"  (name: "linear.clash", op: "linear", when: (tokens: (min: 4)), variant: "rows", priority: 10),
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

/// A replacement that reads a pattern node (not a `$` variable) is refused when the fusions are
/// checked, naming the fusion, instead of failing while the fusion is applied.
#[test]
fn a_replacement_reading_a_pattern_node_is_refused() {
    let dir = graphs_copy("replace-reads-node");
    let text = std::fs::read_to_string(dir.join("fusions.ron")).unwrap();
    let edited = text.replacen(
        "replace: (op: HcInject(streams: \"C\"), args: [\"$hn\"]",
        "replace: (op: HcInject(streams: \"C\"), args: [\"logit\"]",
        1,
    );
    assert_ne!(edited, text);
    std::fs::write(dir.join("fusions.ron"), edited).unwrap();
    let g = GraphSet::load_dir(&dir).unwrap();
    let err = lower(
        &tiny_plan(),
        &g,
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap_err();
    assert!(matches!(err, LowerError::Fusion { .. }), "{err}");
    assert!(
        err.to_string().contains("replacement uses `logit`"),
        "{err}"
    );
}

/// The tiny model's session under a `--graphs` copy whose steps.ron is `steps` (`None`: no
/// steps.ron), with `--prefill-chunk` `chunk`: the chunk it prefills in.
fn session_chunk(tag: &str, steps: Option<&str>, chunk: Option<usize>) -> Option<usize> {
    let dir = graphs_copy(tag);
    if let Some(text) = steps {
        std::fs::write(dir.join("steps.ron"), text).unwrap();
    }
    let options = ModelOptions {
        graphs_dir: Some(dir),
        prefill_chunk: chunk,
        ..Default::default()
    };
    let model = Model::load(&common::repo().join("models/tiny-qwen4exp"), options).unwrap();
    let chunk = model.session().prefill_chunk();
    chunk
}

/// steps.ron decides the chunk by device and capacity; `--prefill-chunk` replaces it; without
/// the file (an older `--graphs` copy), a prompt is one step.
#[test]
fn step_rules_choose_the_prefill_chunk() {
    let model = Model::load(
        &common::repo().join("models/tiny-qwen4exp"),
        ModelOptions::default(),
    )
    .unwrap();
    assert_eq!(
        model.session().prefill_chunk(),
        Some(4096),
        "the built-in CPU rule"
    );
    let edited = r#"[
  (name: "cpu", when: (device: Cpu), max_rows: 5, priority: 1),
  (name: "cpu.short", doc: "up to 512 tokens", when: (device: Cpu, capacity: (max: 512)), max_rows: 3, priority: 2),
  (name: "cuda", when: (device: Cuda), max_rows: 2, priority: 1),
]"#;
    // The tiny model holds 512 positions.
    assert_eq!(session_chunk("steps-edited", Some(edited), None), Some(3));
    assert_eq!(
        session_chunk("steps-override", Some(edited), Some(7)),
        Some(7)
    );
    assert_eq!(session_chunk("steps-absent", None, None), None);
}

/// A bad step rule is refused when the graph files load, naming the file, the rule and the
/// field (syntax errors: the line and column).
#[test]
fn bad_step_rules_name_file_rule_and_field() {
    let cases = [
        (
            "zero",
            r#"[(name: "cpu.none", when: (device: Cpu), max_rows: 0)]"#,
            "steps.ron: step rule `cpu.none`: max_rows: 0 takes no token",
        ),
        (
            "empty",
            r#"[(name: "never", when: (capacity: (min: 9, max: 8)), max_rows: 4)]"#,
            "steps.ron: step rule `never`: when.capacity: its min exceeds its max",
        ),
        (
            "overlap",
            r#"[(name: "all", max_rows: 4), (name: "cuda", when: (device: Cuda), max_rows: 2)]"#,
            "steps.ron: step rule `all`: overlaps step rule `cuda` (same priority 0)",
        ),
        (
            "twice",
            r#"[(name: "a", when: (device: Cpu), max_rows: 4), (name: "a", when: (device: Cuda), max_rows: 2)]"#,
            "steps.ron: step rule `a`: the name is used twice",
        ),
        (
            "missing",
            r#"[(name: "cpu", when: (device: Cpu))]"#,
            "steps.ron:1:35: Unexpected missing field named `max_rows`",
        ),
        (
            "unknown",
            r#"[(name: "cpu", when: (device: Cpu, tokens: (max: 4)), max_rows: 4)]"#,
            "steps.ron:1:36: Unexpected field named `tokens` in `StepWhen`",
        ),
    ];
    for (tag, text, want) in cases {
        let dir = graphs_copy(&format!("steps-{tag}"));
        std::fs::write(dir.join("steps.ron"), text).unwrap();
        let err = GraphSet::load_dir(&dir).unwrap_err().to_string();
        assert!(err.contains(want), "{tag}: {err}");
    }
}
