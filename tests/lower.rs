//! Snapshots of lowered programs (in `snapshots/`): the demo model and the real
//! Qwen3.8-Flash-Next config, prefill and decode. A change to a template, fusion, rule or pass
//! shows up here as a reviewable diff (`cargo insta review`).

mod common;

use graphrun::ir::{Device, LogitsMode, Phase};
use graphrun::lower::{lower, GraphSet, LowerOptions, ProgramKind};
use graphrun::plan::ModelPlan;

fn snapshot(config: &str, name: &str, phase: Phase, tokens: usize, logits: LogitsMode) {
    snapshot_on(Device::Cpu, config, name, phase, tokens, logits)
}

fn snapshot_on(
    device: Device,
    config: &str,
    name: &str,
    phase: Phase,
    tokens: usize,
    logits: LogitsMode,
) {
    let opts = LowerOptions {
        device,
        ..LowerOptions::new(phase, tokens, logits)
    };
    snapshot_with(config, name, &opts)
}

fn snapshot_with(config: &str, name: &str, opts: &LowerOptions) {
    let opts = opts.clone();
    let plan = ModelPlan::from_file(&common::repo().join(config)).unwrap();
    let lowered = lower(&plan, &GraphSet::embedded().unwrap(), &opts).unwrap();
    // Lowering is deterministic: twice gives the same text.
    let again = lower(&plan, &GraphSet::embedded().unwrap(), &opts).unwrap();
    let text = lowered.program.to_ron();
    assert_eq!(text, again.program.to_ron());
    // The text form reads back into the same program.
    assert_eq!(
        graphrun::ir::Program::from_ron(&text).unwrap(),
        lowered.program
    );
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(common::repo().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, text));
}

#[test]
fn tiny_prefill() {
    snapshot(
        "models/tiny-qwen4exp/config.json",
        "tiny_prefill_t8",
        Phase::Prefill,
        8,
        LogitsMode::All,
    );
}

#[test]
fn tiny_decode() {
    snapshot(
        "models/tiny-qwen4exp/config.json",
        "tiny_decode",
        Phase::Decode,
        1,
        LogitsMode::Last,
    );
}

#[test]
fn real_prefill() {
    snapshot(
        "tests/data/configs/qwen3.8-flash-next.json",
        "qwen3.8_flash_next_prefill_t64",
        Phase::Prefill,
        64,
        LogitsMode::Last,
    );
}

#[test]
fn real_decode() {
    snapshot(
        "tests/data/configs/qwen3.8-flash-next.json",
        "qwen3.8_flash_next_decode",
        Phase::Decode,
        1,
        LogitsMode::Last,
    );
}

/// The MTP draft head of the real config (`graphs/qwen4exp/mtp.ron`): a decode step and a
/// prefill of the prompt's rows.
#[test]
fn real_draft() {
    for (name, phase, tokens) in [
        ("qwen3.8_flash_next_draft_decode", Phase::Decode, 1),
        ("qwen3.8_flash_next_draft_prefill_t8", Phase::Prefill, 8),
    ] {
        let opts = LowerOptions {
            kind: ProgramKind::Draft,
            ..LowerOptions::new(phase, tokens, LogitsMode::Last)
        };
        snapshot_with("tests/data/configs/qwen3.8-flash-next.json", name, &opts);
    }
}

/// The draft imports the trunk's final hyper state and exports its own; its rotations sit one
/// position past its rows; its tensors are the checkpoint's `mtp.*` (with the shared embedding
/// and lm head). A trunk lowered with its exports returns the state its exit mixer reads.
#[test]
fn the_draft_head_reads_the_trunks_final_state() {
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let graphs = GraphSet::embedded().unwrap();
    let draft = LowerOptions {
        kind: ProgramKind::Draft,
        ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
    };
    let p = lower(&plan, &graphs, &draft).unwrap().program;
    let ch = plan.hc.count * plan.hidden_size;
    assert_eq!(
        p.imports,
        vec![graphrun::ir::Import {
            name: "hidden".into(),
            width: ch
        }]
    );
    assert_eq!(p.exports.len(), 1);
    assert_eq!(p.exports[0].name, "carrier");
    assert_eq!(p.value(&p.exports[0].value).unwrap().width, ch);
    assert_eq!(p.consts.rope_offset, 1);
    for w in &p.weights {
        assert!(
            w.name.starts_with("mtp.")
                || w.name == "model.embed_tokens.weight"
                || w.name == "lm_head.weight",
            "{}",
            w.name
        );
    }
    assert!(p.weights.iter().any(|w| w.name == "mtp.fc_hidden.weight"));
    assert!(p
        .weights
        .iter()
        .any(|w| w.name == "mtp.layers.0.mlp.experts.gate_up_proj"));

    let plain = lower(
        &plan,
        &graphs,
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap()
    .program;
    assert!(plain.exports.is_empty());
    let trunk = LowerOptions {
        exports: true,
        ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
    };
    let t = lower(&plan, &graphs, &trunk).unwrap().program;
    assert_eq!(t.exports.len(), 1);
    assert_eq!(t.exports[0].name, "hidden");
    let last_layer = plan.num_layers - 1;
    assert!(
        t.exports[0]
            .value
            .starts_with(&format!("blk.{last_layer}.mlp_res.")),
        "{}",
        t.exports[0].value
    );
    // The same nodes as the plain program: exporting keeps a value, it computes nothing more.
    assert_eq!(t.nodes.len(), plain.nodes.len());
}

/// The same programs scheduled for the CUDA executor: its rules and variants.
#[test]
fn real_decode_cuda() {
    snapshot_on(
        Device::Cuda,
        "tests/data/configs/qwen3.8-flash-next.json",
        "qwen3.8_flash_next_decode_cuda",
        Phase::Decode,
        1,
        LogitsMode::Last,
    );
}

#[test]
fn real_prefill_cuda() {
    snapshot_on(
        Device::Cuda,
        "tests/data/configs/qwen3.8-flash-next.json",
        "qwen3.8_flash_next_prefill_t64_cuda",
        Phase::Prefill,
        64,
        LogitsMode::Last,
    );
}

/// Every op of the real decode program is fused or scheduled as the data files say.
#[test]
fn real_decode_uses_fusions_and_rules() {
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let lowered = lower(
        &plan,
        &GraphSet::embedded().unwrap(),
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap();
    assert_eq!(lowered.fusion_counts["swiglu"], 48);
    assert_eq!(lowered.fusion_counts["hc_inject"], 96);
    assert_eq!(lowered.fusion_counts["hc_mix"], 97); // 96 layer reads + the exit mixer
    let linears: Vec<_> = lowered
        .program
        .nodes
        .iter()
        .filter(|n| n.op.kind() == "linear")
        .collect();
    assert!(!linears.is_empty());
    assert!(linears
        .iter()
        .all(|n| n.rule == "linear.decode_rows" && n.variant == "rows"));
}

/// The arena of `memplan`: its size against every value's bytes (nothing shared) and against the
/// most bytes live at one node (a lower bound), for the real config's decode and prefill steps.
#[test]
fn real_arena_sizes() {
    use graphrun::passes::memplan;
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    for (phase, tokens) in [(Phase::Decode, 1), (Phase::Prefill, 64)] {
        let opts = LowerOptions {
            device: Device::Cuda,
            ..LowerOptions::new(phase, tokens, LogitsMode::Last)
        };
        let p = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program;
        let bytes: Vec<usize> = p.values.iter().map(|v| v.bytes).collect();
        let total: usize = bytes.iter().sum();
        let peak = memplan::peak_live_bytes(&bytes, &memplan::lifetimes(&p));
        println!(
            "{phase} T={tokens}: arena {} bytes, peak live {peak} bytes, {} values of {total} bytes \
             in all ({:.1}x smaller)",
            p.arena_bytes,
            p.values.len(),
            total as f64 / p.arena_bytes as f64
        );
        assert!(peak <= p.arena_bytes && p.arena_bytes < total);
    }
}

/// A device stores each weight once, as a matrix (bf16 for a bf16 checkpoint) or as an f32 vector
/// (`Op::weight_is_matrix`), and every step shape of a model reads the same copy: so no weight may
/// be a matrix in one program and a vector in another (a fused op in decode, its unfused ops in a
/// long prefill), for the real config on CUDA at every step size a rule or fusion tells apart.
#[test]
fn each_weight_is_a_matrix_or_a_vector_in_every_program() {
    use std::collections::BTreeMap;
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let graphs = GraphSet::embedded().unwrap();
    let mut kind: BTreeMap<String, (bool, String)> = BTreeMap::new();
    let steps = [
        (Phase::Decode, 1),
        (Phase::Prefill, 8),
        (Phase::Prefill, 9),
        (Phase::Prefill, 64),
    ];
    for (phase, tokens) in steps {
        let opts = LowerOptions {
            device: Device::Cuda,
            ..LowerOptions::new(phase, tokens, LogitsMode::Last)
        };
        let program = lower(&plan, &graphs, &opts).unwrap().program;
        for node in &program.nodes {
            for (i, w) in node.weights.iter().enumerate() {
                let matrix = node.op.weight_is_matrix(i);
                let seen = kind.entry(w.clone()).or_insert((matrix, node.name.clone()));
                assert_eq!(
                    seen.0, matrix,
                    "`{w}`: a matrix for one node and a vector for another ({} and {}, {phase:?} {tokens})",
                    seen.1, node.name
                );
            }
        }
    }
}

/// The kernel table (`graphrun lower --format kernels`) of the real config on CUDA with NVFP4
/// experts beside a bf16 trunk, for a decode step and a 6-row step (MTP's verify): the rules pick
/// the NVFP4 variants for the routed experts and leave every other node as the bf16 programs have
/// it.
fn nvfp4_kernels(name: &str, phase: Phase, tokens: usize) {
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let opts = LowerOptions {
        device: Device::Cuda,
        weight_format: Some(graphrun::registry::WeightFormat::Bf16),
        expert_format: Some(graphrun::registry::WeightFormat::Nvfp4),
        ..LowerOptions::new(phase, tokens, LogitsMode::Last)
    };
    let program = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
        .unwrap()
        .program;
    let bf16 = lower(
        &plan,
        &GraphSet::embedded().unwrap(),
        &LowerOptions {
            expert_format: None,
            ..opts.clone()
        },
    )
    .unwrap()
    .program;
    for (a, b) in program.nodes.iter().zip(&bf16.nodes) {
        if a.op.kind() == "moe_experts" {
            assert!(a.variant.starts_with("nvfp4_"), "{}: {}", a.name, a.variant);
        } else {
            assert_eq!(
                (&a.variant, &a.kernels),
                (&b.variant, &b.kernels),
                "{}",
                a.name
            );
        }
    }
    let text = graphrun::lower::dot::kernel_table(&program);
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(common::repo().join("snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, text));
}

#[test]
fn real_decode_cuda_nvfp4_kernels() {
    nvfp4_kernels(
        "qwen3.8_flash_next_decode_cuda_nvfp4_kernels",
        Phase::Decode,
        1,
    );
}

#[test]
fn real_verify6_cuda_nvfp4_kernels() {
    nvfp4_kernels(
        "qwen3.8_flash_next_t6_cuda_nvfp4_kernels",
        Phase::Prefill,
        6,
    );
}

/// With the n-gram table on the host (the real release on one H200), the rules give the PLE
/// embedding the host gather and change nothing else; without the `ple_embed` fusion the table's
/// gather would need ids made on the device, and lowering refuses it naming the way out. On the
/// CPU the placement changes nothing.
#[test]
fn a_host_ple_table_changes_only_the_ple_gather() {
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let graphs = GraphSet::embedded().unwrap();
    for device in [Device::Cuda, Device::Cpu] {
        let opts = LowerOptions {
            device,
            expert_format: (device == Device::Cuda)
                .then_some(graphrun::registry::WeightFormat::Nvfp4),
            ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
        };
        let on_device = lower(&plan, &graphs, &opts).unwrap().program;
        let host_opts = LowerOptions {
            ple_table: graphrun::registry::Placement::Host,
            ..opts.clone()
        };
        let on_host = lower(&plan, &graphs, &host_opts).unwrap().program;
        let mut changed = Vec::new();
        for (h, d) in on_host.nodes.iter().zip(&on_device.nodes) {
            if (&h.variant, &h.kernels) != (&d.variant, &d.kernels) {
                changed.push((h.name.clone(), h.rule.clone(), h.kernels.clone()));
            }
        }
        let ple = plan.layers.iter().filter(|l| l.ple.is_some()).count();
        match device {
            Device::Cuda => {
                assert_eq!(changed.len(), ple, "{changed:?}");
                for (name, rule, kernels) in &changed {
                    assert!(name.contains("ple"), "{name}");
                    assert_eq!(rule, "ple_embed.host_table");
                    assert_eq!(
                        kernels,
                        &["host_ple_embed_gather", "cuMemcpyHtoD", "cuMemcpyDtoD"]
                    );
                }
            }
            Device::Cpu => assert!(changed.is_empty(), "{changed:?}"),
        }
        if device == Device::Cuda {
            let unfused = LowerOptions {
                fusions: Some(vec![]),
                ..host_opts.clone()
            };
            let err = lower(&plan, &graphs, &unfused).unwrap_err().to_string();
            assert!(
                err.contains("the n-gram table is on the host") && err.contains("ple_embed fusion"),
                "{err}"
            );
        }
    }
}

/// NVFP4 is a format of routed experts on a device that reads it packed: as the trunk's format,
/// or on the CPU (which computes with the widening), lowering refuses it.
#[test]
fn nvfp4_elsewhere_is_refused() {
    let plan =
        ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap();
    let nvfp4 = Some(graphrun::registry::WeightFormat::Nvfp4);
    for (device, weight, experts, says) in [
        (Device::Cuda, nvfp4, None, "routed experts only"),
        (Device::Cpu, None, nvfp4, "NVFP4 experts on the CPU"),
    ] {
        let opts = LowerOptions {
            device,
            weight_format: weight,
            expert_format: experts,
            ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
        };
        let err = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{err}");
    }
}
