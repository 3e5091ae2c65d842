//! Verify-exact mode (`LowerOptions::exact`, `--verify-exact`): a one-token step is lowered to
//! the nodes, variants and kernels the verify steps of 2 to 8 rows take, for the real config
//! and the tiny ones, f32 and bf16 matrices, bf16 and NVFP4 experts; without the mode they
//! differ (the one-token groupings and kernels). The kernels' rows being independent of the
//! step's other rows is checked on the GPU (tests/gpu_speculative.rs).

mod common;

use graphrun::ir::{Device, LogitsMode, Phase, Program};
use graphrun::lower::{lower, GraphSet, LowerOptions};
use graphrun::plan::ModelPlan;
use graphrun::registry::WeightFormat;

/// Each node as the executor sees it: name, variant, kernels; but `last_row`, which copies
/// the one row a decode step's logits are taken from (its bits unchanged).
fn schedule(p: &Program) -> Vec<(String, String, Vec<String>)> {
    p.nodes
        .iter()
        .filter(|n| n.op.kind() != "last_row")
        .map(|n| (n.name.clone(), n.variant.clone(), n.kernels.clone()))
        .collect()
}

fn lowered(
    plan: &ModelPlan,
    phase: Phase,
    tokens: usize,
    matrices: WeightFormat,
    experts: Option<WeightFormat>,
    exact: bool,
    exports: bool,
) -> Program {
    let logits = if phase == Phase::Decode {
        LogitsMode::Last
    } else {
        LogitsMode::All
    };
    let mut opts = LowerOptions::new(phase, tokens, logits);
    opts.device = Device::Cuda;
    opts.weight_format = Some(matrices);
    opts.expert_format = experts;
    opts.exact = exact;
    opts.exports = exports;
    lower(plan, &GraphSet::embedded().unwrap(), &opts)
        .unwrap()
        .program
}

#[test]
fn one_token_steps_take_the_verify_steps_kernels_in_exact_mode() {
    let configs = [
        "tests/data/configs/qwen3.8-flash-next.json",
        "models/tiny-qwen4exp/config.json",
        "models/tiny-qwen4exp-mtp/config.json",
    ];
    let formats = [
        (WeightFormat::Bf16, Some(WeightFormat::Nvfp4)),
        (WeightFormat::Bf16, None),
        (WeightFormat::F32, None),
    ];
    for config in configs {
        let plan = ModelPlan::from_file(&common::repo().join(config)).unwrap();
        for (matrices, experts) in formats {
            for exports in [false, true] {
                let case = format!(
                    "{config}, {matrices:?} matrices, experts {experts:?}, exports {exports}"
                );
                let one =
                    |exact| lowered(&plan, Phase::Decode, 1, matrices, experts, exact, exports);
                let decode = schedule(&one(true));
                for rows in 2..=8 {
                    let verify = schedule(&lowered(
                        &plan,
                        Phase::Prefill,
                        rows,
                        matrices,
                        experts,
                        true,
                        exports,
                    ));
                    assert_eq!(
                        decode.len(),
                        verify.len(),
                        "{case}, {rows} rows: node counts"
                    );
                    for (d, v) in decode.iter().zip(&verify) {
                        assert_eq!(d, v, "{case}: decode against a verify step of {rows} rows");
                    }
                }
                // The mode is what makes them agree: plain decode takes the one-token forms.
                let plain = schedule(&one(false));
                assert_ne!(plain, decode, "{case}: exact mode changed nothing");
            }
        }
    }
}
