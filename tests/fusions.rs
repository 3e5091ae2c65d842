//! Every fusion of `graphs/fusions.ron` (with the fusions before it in the file) against the
//! unfused program, on random weights and random tokens: each fused node's output equals the
//! value the unfused chain computes (same name), and the logits agree. A fusion that never fires
//! fails the test (it would check nothing). The groupings of `graphs/groups.ron` likewise.

mod common;

use graphrun::exec::{cpu, SessionState};
use graphrun::ir::{Device, LogitsMode, Op, Phase, Program};
use graphrun::lower::{lower, GraphSet, LowerOptions};
use graphrun::ops::indexer::RowSel;
use graphrun::plan::{LayerKind, ModelPlan};
use graphrun::synth;
use graphrun::weights::Weights;
use rand::{Rng, SeedableRng};

const TOLERANCE: f32 = 1e-5;

/// The program lowered for `device` (its fusion predicates and rules) with only `fusions`; the
/// CPU executor runs either (it takes each op's reference whatever variant a rule chose).
fn program_on(
    plan: &ModelPlan,
    device: Device,
    phase: Phase,
    tokens: usize,
    fusions: Vec<String>,
) -> (Program, usize) {
    let mut opts = LowerOptions::new(phase, tokens, LogitsMode::All);
    opts.device = device;
    opts.fusions = Some(fusions.clone());
    let lowered = lower(plan, &GraphSet::embedded().unwrap(), &opts).unwrap();
    let fired = fusions.iter().map(|f| lowered.fusion_counts[f]).sum();
    (lowered.program, fired)
}

/// A kept value: activations (compared within the tolerance) or a QSA selection (compared
/// exactly: the fused indexer must keep the same blocks).
#[derive(Debug, PartialEq)]
enum Kept {
    F32(Vec<f32>),
    Sel(Vec<RowSel>),
}

fn values(
    p: &Program,
    w: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    keep: &[&str],
) -> Vec<(String, Kept)> {
    let mut got = cpu::run_values(p, w, state, tokens, keep).unwrap();
    keep.iter()
        .map(|k| match got.remove(*k).unwrap() {
            cpu::Val::F32 { data, .. } => (k.to_string(), Kept::F32(data)),
            cpu::Val::Sel(sel) => (k.to_string(), Kept::Sel(sel)),
            other => panic!("{k}: unexpected {other:?}"),
        })
        .collect()
}

fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn each_fusion_matches_the_unfused_graph() {
    let graphs = GraphSet::embedded().unwrap();
    assert!(!graphs.fusions.is_empty());
    let configs = [
        "models/tiny-qwen4exp/config.json",
        "tests/fixtures/tiny-composite-bf16/config.json",
    ];
    // Each fusion must fire somewhere: on the CPU, or where its predicates put it on CUDA (a
    // CUDA-only fusion is checked there; those that fire on both are checked under each
    // device's predicates and rules).
    let mut fired_anywhere = std::collections::BTreeSet::new();
    // Prompts of 12 tokens and of 70 (past the 63-token bound of the CUDA predicates that give
    // many-token steps their GEMMs: the fusions for those steps fire only there).
    for (config, prompt_len) in configs.into_iter().flat_map(|c| [(c, 12), (c, 70)]) {
        let plan = ModelPlan::from_file(&common::repo().join(config)).unwrap();
        let weights = synth::random_weights(&plan, 11).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let prompt: Vec<i64> = (0..prompt_len)
            .map(|_| rng.random_range(0..plan.vocab_size as i64))
            .collect();
        let next: i64 = rng.random_range(0..plan.vocab_size as i64);
        for device in [Device::Cpu, Device::Cuda] {
            for (i, fusion) in graphs.fusions.iter().enumerate() {
                let name = fusion.name.clone();
                // This fusion with the ones before it in the file (a pattern may match the ops
                // that earlier fusions made), against no fusion at all.
                let upto: Vec<String> = graphs.fusions[..=i]
                    .iter()
                    .map(|f| f.name.clone())
                    .collect();
                let lowered =
                    |phase, tokens, fusions| program_on(&plan, device, phase, tokens, fusions).0;
                let plain_pre = lowered(Phase::Prefill, prompt.len(), vec![]);
                let fused_pre = lowered(Phase::Prefill, prompt.len(), upto.clone());
                let plain_dec = lowered(Phase::Decode, 1, vec![]);
                let fused_dec = lowered(Phase::Decode, 1, upto);
                // The outputs of the fused nodes, plus the logits, in each step.
                let mut keep_of = |p: &Program| {
                    let mut keep: Vec<String> = p
                        .nodes
                        .iter()
                        .filter(|n| n.fused.as_deref() == Some(name.as_str()))
                        .flat_map(|n| n.outputs.clone())
                        .collect();
                    if !keep.is_empty() {
                        fired_anywhere.insert(name.clone());
                    }
                    keep.push(p.output.clone());
                    keep
                };
                let (keep_pre, keep_dec) = (keep_of(&fused_pre), keep_of(&fused_dec));
                let (mut s_plain, mut s_fused) = (SessionState::default(), SessionState::default());
                for (p_plain, p_fused, toks, keep) in [
                    (&plain_pre, &fused_pre, prompt.as_slice(), &keep_pre),
                    (
                        &plain_dec,
                        &fused_dec,
                        std::slice::from_ref(&next),
                        &keep_dec,
                    ),
                ] {
                    let keep: Vec<&str> = keep.iter().map(|s| s.as_str()).collect();
                    let a = values(p_plain, &weights, &mut s_plain, toks, &keep);
                    let b = values(p_fused, &weights, &mut s_fused, toks, &keep);
                    for ((value, x), (_, y)) in b.iter().zip(&a) {
                        match (x, y) {
                            (Kept::F32(x), Kept::F32(y)) => {
                                let err = rel_err(x, y);
                                assert!(
                                    err <= TOLERANCE,
                                    "{config} ({device:?}): fusion `{name}`: `{value}` differs by {err:e}"
                                );
                            }
                            (x, y) => assert_eq!(
                                x, y,
                                "{config} ({device:?}): fusion `{name}`: `{value}` differs"
                            ),
                        }
                    }
                }
            }
        }
    }
    for f in &graphs.fusions {
        assert!(
            fired_anywhere.contains(&f.name),
            "fusion `{}` never fires",
            f.name
        );
    }
}

/// Every grouping of `graphs/groups.ron` against the ungrouped program, on the CPU (each
/// grouping's `when` lifted so that it fires there): a group node's outputs equal the separate
/// nodes' bit for bit, and so do the logits, over a prefill and a decode step.
#[test]
fn each_grouping_matches_the_ungrouped_graph() {
    let mut graphs = GraphSet::embedded().unwrap();
    assert!(!graphs.groups.is_empty());
    for g in &mut graphs.groups {
        g.when.clear();
    }
    let plan =
        ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap();
    let weights = synth::random_weights(&plan, 13).unwrap();
    let lowered = |phase: Phase, tokens: usize, names: Vec<String>| {
        let mut opts = LowerOptions::new(phase, tokens, LogitsMode::All);
        opts.fusions = Some(names);
        lower(&plan, &graphs, &opts).unwrap()
    };
    for g in graphs.groups.clone() {
        let name = g.name.clone();
        let mut state = (SessionState::default(), SessionState::default());
        for (phase, toks) in [
            (Phase::Prefill, vec![3i64, 17, 5, 9]),
            (Phase::Decode, vec![11i64]),
        ] {
            let plain = lowered(phase, toks.len(), vec![]).program;
            let grouped = lowered(phase, toks.len(), vec![name.clone()]);
            assert!(grouped.fusion_counts[&name] > 0, "`{name}` never groups");
            let mut keep: Vec<String> = grouped
                .program
                .nodes
                .iter()
                .filter(|n| n.fused.as_deref() == Some(name.as_str()))
                .flat_map(|n| n.outputs.clone())
                .collect();
            keep.push(grouped.program.output.clone());
            let keep: Vec<&str> = keep.iter().map(|s| s.as_str()).collect();
            let a = values(&plain, &weights, &mut state.0, &toks, &keep);
            let b = values(&grouped.program, &weights, &mut state.1, &toks, &keep);
            assert!(a == b, "grouping `{name}` changed a value ({phase:?})");
        }
    }
}

/// A fusion's `when` predicates decide where it fires: on the CPU always; on CUDA the
/// matrix-vector fusions only for decode-sized steps (from 64 tokens their linears run on the
/// tensor cores unfused), `sigmoid_gated_add` everywhere.
#[test]
fn fusion_predicates_follow_the_device_and_the_step() {
    let plan =
        ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap();
    let fired = |device: graphrun::ir::Device, phase: Phase, tokens: usize| {
        let mut opts = LowerOptions::new(phase, tokens, LogitsMode::Last);
        opts.device = device;
        lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .fusion_counts
    };
    use graphrun::ir::Device::{Cpu, Cuda};
    for device in [Cpu, Cuda] {
        let counts = fired(device, Phase::Decode, 1);
        for name in [
            "swiglu",
            "hc_mix",
            "hc_inject",
            "sigmoid_gated_add",
            "linear_hc_write",
            "moe_shared_write",
            "hc_read",
            "hc_read_exit",
            "embed_streams",
            "ple_embed",
            "gdn_gated_recurrence",
            "gdn_normed_recurrence",
            "gated_attention",
            "ple_mix",
        ] {
            assert!(
                counts[name] > 0,
                "{device:?} decode: `{name}` did not fire: {counts:?}"
            );
        }
    }
    // The convolution folded into the normed recurrence: on the CPU only (graphs/fusions.ron
    // says why).
    assert!(fired(Cpu, Phase::Decode, 1)["gdn_conv_normed_recurrence"] > 0);
    assert_eq!(
        fired(Cuda, Phase::Decode, 1)["gdn_conv_normed_recurrence"],
        0
    );

    let cpu_long = fired(Cpu, Phase::Prefill, 64);
    for name in [
        "swiglu",
        "hc_mix",
        "linear_hc_write",
        "gdn_normed_recurrence",
        "gdn_conv_normed_recurrence",
    ] {
        assert!(cpu_long[name] > 0, "CPU prefill 64: `{name}` did not fire");
    }
    let cuda_8 = fired(Cuda, Phase::Prefill, 8);
    assert!(
        cuda_8["linear_hc_write"] > 0
            && cuda_8["hc_mix"] > 0
            && cuda_8["gdn_normed_recurrence"] > 0,
        "{cuda_8:?}"
    );
    let cuda_9 = fired(Cuda, Phase::Prefill, 9);
    assert_eq!(cuda_9["linear_hc_write"], 0, "{cuda_9:?}");
    // The hyper-connection reads, the exit's too: a block per activation and row, up to 8 rows.
    assert!(
        cuda_8["hc_read"] > 0 && cuda_8["hc_read_exit"] == 1,
        "{cuda_8:?}"
    );
    assert_eq!(cuda_9["hc_read"] + cuda_9["hc_read_exit"], 0, "{cuda_9:?}");
    assert_eq!(cpu_long["hc_read_exit"], 1, "{cpu_long:?}");
    // The PLE mix: a block per stream over the step's rows in order, up to 8 rows on CUDA.
    assert!(cuda_8["ple_mix"] > 0, "{cuda_8:?}");
    assert_eq!(cuda_9["ple_mix"], 0, "{cuda_9:?}");
    assert!(cpu_long["ple_mix"] > 0, "{cpu_long:?}");
    // A block per value head: from 9 tokens the staged scan and the norm run apart.
    assert_eq!(cuda_9["gdn_normed_recurrence"], 0, "{cuda_9:?}");
    assert!(cuda_9["hc_mix"] > 0, "{cuda_9:?}");
    let cuda_64 = fired(Cuda, Phase::Prefill, 64);
    for name in [
        "swiglu",
        "hc_mix",
        "linear_hc_write",
        "gdn_normed_recurrence",
        "gdn_conv_normed_recurrence",
    ] {
        assert_eq!(
            cuda_64[name], 0,
            "CUDA prefill 64: `{name}` fired: {cuda_64:?}"
        );
    }
    assert!(
        cuda_64["sigmoid_gated_add"] > 0
            && cuda_64["embed_streams"] == 1
            && cuda_64["ple_embed"] > 0
            && cuda_64["hc_inject"] > 0
            && cuda_64["gdn_gated_recurrence"] > 0
            && cuda_64["gated_attention"] > 0,
        "{cuda_64:?}"
    );
    // Every step size: the attention kernels take any number of rows.
    assert!(cpu_long["gated_attention"] > 0, "{cpu_long:?}");
}

/// QSA's attention chain becomes one `GatedAttention` node per QSA layer: the fused q
/// projection, k_raw, v and the selection in, the two norm weights (q's, then k's), the
/// attention's caches as its states in their order, its output the gated attention's; on CUDA
/// the split variant by its rule. Without the fusions that make NormRope and SigmoidMul before
/// it, it finds nothing to match.
#[test]
fn gated_attention_takes_the_qsa_chain_with_its_caches() {
    let plan =
        ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap();
    let graphs = GraphSet::embedded().unwrap();
    for (device, variant) in [(Device::Cpu, "reference"), (Device::Cuda, "split")] {
        for (phase, tokens) in [(Phase::Decode, 1), (Phase::Prefill, 64)] {
            let mut opts = LowerOptions::new(phase, tokens, LogitsMode::Last);
            opts.device = device;
            let lowered = lower(&plan, &graphs, &opts).unwrap();
            let fused: Vec<_> = lowered
                .program
                .nodes
                .iter()
                .filter(|n| n.fused.as_deref() == Some("gated_attention"))
                .collect();
            let qsa_layers = plan
                .layers
                .iter()
                .filter(|l| l.kind == LayerKind::Qsa)
                .count();
            assert!(qsa_layers > 0);
            assert_eq!(fused.len(), qsa_layers, "{device:?} {phase:?}");
            for n in fused {
                let p = n
                    .name
                    .strip_suffix("attn_gated")
                    .expect("the gated output's node");
                let names = |xs: &[&str]| xs.iter().map(|x| format!("{p}{x}")).collect::<Vec<_>>();
                assert_eq!(n.inputs, names(&["qg", "k_raw", "v", "selection"]), "{n:?}");
                assert_eq!(n.outputs, names(&["attn_gated"]), "{n:?}");
                assert_eq!(n.states, names(&["k_cache", "v_cache"]), "{n:?}");
                assert!(
                    n.weights[0].ends_with("q_norm.weight")
                        && n.weights[1].ends_with("k_norm.weight"),
                    "{n:?}"
                );
                assert_eq!(n.variant, variant, "{n:?}");
                assert!(matches!(n.op, Op::GatedAttention { .. }), "{n:?}");
            }
            // Alone (no fusion made NormRope or SigmoidMul before it), it matches nothing.
            let mut alone = opts.clone();
            alone.fusions = Some(vec!["gated_attention".into()]);
            let lowered = lower(&plan, &graphs, &alone).unwrap();
            assert_eq!(lowered.fusion_counts["gated_attention"], 0);
        }
    }
}

/// A pattern argument `id.N` binds only output N of that pattern node: GDN's recurrence reads
/// the gates' `beta` (output 0) then `g` (output 1), so the pattern with the two swapped matches
/// nothing, and the stateful recurrence it fuses keeps its state (as does the normed recurrence
/// that the next fusion makes of it, when that one applies too, and the node that folds the
/// convolution into that one carries both states: the conv's window, then the recurrence's).
#[test]
fn a_pattern_output_index_binds_only_that_output() {
    let plan =
        ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap();
    let mut opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
    let mut graphs = GraphSet::embedded().unwrap();
    let every = lower(&plan, &graphs, &opts).unwrap();
    let fused_nodes = |p: &Program, fusion: &str| -> Vec<graphrun::ir::Node> {
        p.nodes
            .iter()
            .filter(|n| n.fused.as_deref() == Some(fusion))
            .cloned()
            .collect()
    };
    let conv_normed = fused_nodes(&every.program, "gdn_conv_normed_recurrence");
    assert!(!conv_normed.is_empty());
    assert!(
        conv_normed.iter().all(|n| n.states.len() == 2
            && n.states[0].ends_with(".conv")
            && n.states[1].ends_with(".ssm")),
        "{conv_normed:?}"
    );
    // Without the convolution's fusion, the normed recurrence keeps the recurrence's state alone.
    opts.fusions = Some(vec![
        "gdn_gated_recurrence".into(),
        "gdn_normed_recurrence".into(),
    ]);
    let normed = lower(&plan, &graphs, &opts).unwrap().program;
    let normed = fused_nodes(&normed, "gdn_normed_recurrence");
    assert!(!normed.is_empty());
    assert!(normed.iter().all(|n| n.states.len() == 1), "{normed:?}");
    // Without the normed recurrence's fusion, the gated recurrence's nodes stay in the program.
    opts.fusions = Some(vec!["gdn_gated_recurrence".into()]);
    let lowered = lower(&plan, &graphs, &opts).unwrap();
    assert!(lowered.fusion_counts["gdn_gated_recurrence"] > 0);
    let fused = lowered
        .program
        .nodes
        .iter()
        .find(|n| n.fused.as_deref() == Some("gdn_gated_recurrence"))
        .unwrap();
    assert_eq!(fused.states.len(), 1, "{fused:?}");
    let f = graphs
        .fusions
        .iter_mut()
        .find(|f| f.name == "gdn_gated_recurrence")
        .unwrap();
    f.pattern[1].args = vec!["$qkv".into(), "gates.1".into(), "gates.0".into()];
    let swapped = lower(&plan, &graphs, &opts).unwrap();
    assert_eq!(swapped.fusion_counts["gdn_gated_recurrence"], 0);
}

/// A dimension variable (`"$hash"` in `ple_embed`'s `exact`) binds the matched node's value and
/// the fused op takes it: the model with PLE at layers 1 and 3 has two hash tables, and each
/// layer's fused node keeps its own (the ids node's state too). A replacement naming a variable
/// no `exact` binds, or a variable inside an expression, is an error naming the fusion.
#[test]
fn a_dimension_variable_carries_each_layers_table() {
    let plan = ModelPlan::from_file(
        &common::repo().join("tests/fixtures/tiny-composite-bf16/config.json"),
    )
    .unwrap();
    let mut graphs = GraphSet::embedded().unwrap();
    let opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
    let tables = |p: &Program, kind: &str| -> Vec<(String, usize, Vec<String>)> {
        p.nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::PleNgramIds { table, .. } | Op::PleEmbed { table, .. }
                    if n.op.kind() == kind =>
                {
                    // The layer, from the node's name (`blk.3.ple.ids`).
                    let layer = n.name.split('.').nth(1).unwrap_or("").to_string();
                    Some((layer, table, n.states.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let mut plain_opts = opts.clone();
    plain_opts.fusions = Some(vec![]);
    let plain = lower(&plan, &graphs, &plain_opts).unwrap().program;
    let fused = lower(&plan, &graphs, &opts).unwrap().program;
    let want = tables(&plain, "ple_ngram_ids");
    assert_eq!(want.len(), 2, "{want:?}");
    assert_ne!(want[0].1, want[1].1, "two layers, two tables: {want:?}");
    assert_eq!(tables(&fused, "ple_embed"), want);
    assert!(tables(&fused, "ple_ngram_ids").is_empty());

    // A replacement naming a variable no pattern binds, or one inside an expression: an error
    // naming the fusion and the variable.
    for (hpn, table, bad) in [
        ("$hpn", "$nowhere", "$nowhere"),
        ("$hpn*2", "$hash", "$hpn*2"),
    ] {
        let f = graphs
            .fusions
            .iter_mut()
            .find(|f| f.name == "ple_embed")
            .unwrap();
        let name = |s: &str| graphrun::ir::Sym::Name(s.into());
        f.replace.op = Op::PleEmbed {
            ngram: name("$ngram"),
            heads_per_ngram: name(hpn),
            table: name(table),
        };
        let err = lower(&plan, &graphs, &opts).unwrap_err().to_string();
        assert!(err.contains("ple_embed") && err.contains(bad), "{err}");
    }
}
