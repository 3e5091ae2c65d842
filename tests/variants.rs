//! Every CPU kernel variant against its op's reference variant on fresh random inputs, directly
//! and through whole programs (every rule of `graphs/rules.ron` forced to every variant of its op).

mod common;

use graphrun::exec::{cpu, SessionState};
use graphrun::ir::{Device, LogitsMode, Phase};
use graphrun::lower::{lower, GraphSet, LowerOptions};
use graphrun::ops::{linear, moe};
use graphrun::passes::schedule::RuleOverride;
use graphrun::plan::ModelPlan;
use graphrun::registry;
use graphrun::synth;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TOLERANCE: f32 = 1e-6;

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// The op kinds with more than one CPU variant, each with a direct check. Adding a CPU variant to
/// `registry::cpu` without adding its check here fails `all_multi_variant_ops_are_covered`.
const COVERED: &[&str] = &["linear", "moe_experts"];

#[test]
fn all_multi_variant_ops_are_covered() {
    for family in registry::all(Device::Cpu) {
        let op = family[0].op;
        if family.len() > 1 {
            assert!(
                COVERED.contains(&op),
                "variants of {op} have no direct check in tests/variants.rs"
            );
        }
    }
    for k in graphrun::ir::op::KINDS {
        assert!(
            !registry::variants(Device::Cpu, k).is_empty(),
            "{k} has no variant"
        );
    }
}

#[test]
fn linear_variants_match_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for &(t, k, n) in &[(1, 37, 53), (5, 64, 129), (9, 300, 17), (4, 1024, 300)] {
        let x = random(&mut rng, t * k);
        let w = random(&mut rng, n * k);
        let reference = linear::rows(&x, &w, t, k, n);
        // The reference itself against a plain triple loop in f64.
        for tt in 0..t {
            for r in 0..n {
                let exact: f64 = (0..k)
                    .map(|i| x[tt * k + i] as f64 * w[r * k + i] as f64)
                    .sum();
                assert!((reference[tt * n + r] as f64 - exact).abs() <= 1e-5 * (1.0 + exact.abs()));
            }
        }
        for variant in registry::names(Device::Cpu, "linear") {
            let got = linear::by_variant(variant, &x, &w, t, k, n);
            assert!(
                max_rel(&got, &reference) <= TOLERANCE,
                "linear/{variant} at {t}x{k}x{n}"
            );
        }
    }
}

#[test]
fn moe_variants_match_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for &(t, e, k, h, i) in &[(1, 8, 2, 16, 8), (7, 16, 3, 32, 12), (33, 6, 6, 24, 5)] {
        let x = random(&mut rng, t * h);
        let logits = random(&mut rng, t * e);
        let (ids, w) = moe::route(&logits, e, k, true);
        let gate_up = random(&mut rng, e * 2 * i * h);
        let down = random(&mut rng, e * h * i);
        let bank = moe::ExpertBank {
            gate_up: &gate_up,
            down: &down,
            hidden: h,
            intermediate: i,
        };
        let reference = moe::token_major(&x, &ids, &w, t, k, &bank);
        for variant in registry::names(Device::Cpu, "moe_experts") {
            let got = match variant {
                "expert_major" => moe::expert_major(&x, &ids, &w, t, k, &bank),
                _ => moe::token_major(&x, &ids, &w, t, k, &bank),
            };
            assert!(
                max_rel(&got, &reference) <= TOLERANCE,
                "moe_experts/{variant}"
            );
        }
    }
}

/// Each rule forced to each variant of its op, against every rule off (reference variants), on a
/// random model: prefill then one decode step.
#[test]
fn every_rule_and_variant_in_whole_programs() {
    let graphs = GraphSet::embedded().unwrap();
    let plan =
        ModelPlan::from_file(&common::repo().join("models/tiny-qwen4exp/config.json")).unwrap();
    let weights = synth::random_weights(&plan, 3).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let prompt: Vec<i64> = (0..10)
        .map(|_| rng.random_range(0..plan.vocab_size as i64))
        .collect();
    // Logits of a prefill and a decode step, and the (rule, variant) pairs the programs used.
    let run = |overrides: Vec<RuleOverride>| {
        let mut state = SessionState::default();
        let mut out = Vec::new();
        let mut used = Vec::new();
        for (phase, toks) in [(Phase::Prefill, &prompt[..]), (Phase::Decode, &prompt[..1])] {
            let mut opts = LowerOptions::new(phase, toks.len(), LogitsMode::All);
            opts.overrides = overrides.clone();
            let p = lower(&plan, &graphs, &opts).unwrap().program;
            used.extend(p.nodes.iter().map(|n| (n.rule.clone(), n.variant.clone())));
            out.extend(cpu::run(&p, &weights, &mut state, toks).unwrap().0);
        }
        (out, used)
    };
    let all_off: Vec<RuleOverride> = graphs
        .rules
        .iter()
        .map(|r| RuleOverride {
            rule: r.name.clone(),
            variant: None,
        })
        .collect();
    let (reference, _) = run(all_off);
    // The CPU executor's rules; the CUDA rules are exercised by tests/gpu_e2e.rs.
    let cpu_rules = graphs
        .rules
        .iter()
        .filter(|r| r.when.device.is_none_or(|d| d == Device::Cpu));
    for rule in cpu_rules {
        for variant in registry::names(Device::Cpu, &rule.op) {
            let (got, used) = run(vec![RuleOverride {
                rule: rule.name.clone(),
                variant: Some(variant.to_string()),
            }]);
            assert!(
                used.contains(&(rule.name.clone(), variant.to_string())),
                "rule {} never chose a node here, so forcing it to {variant} checks nothing",
                rule.name
            );
            let err = max_rel(&got, &reference);
            assert!(
                err <= TOLERANCE,
                "rule {} forced to {variant}: logits differ by {err:e}",
                rule.name
            );
        }
    }
}
