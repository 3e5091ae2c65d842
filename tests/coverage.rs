//! Every node of the real config's programs gets a kernel that accepts it: decode and prefill at
//! several token counts, on the CPU and on CUDA, with f32 and bf16 matrices. Lowering refuses a
//! choice its kernels do not take, so a program that lowers is one whose every node is taken.

mod common;

use graphrun::ir::{Device, LogitsMode, Phase};
use graphrun::lower::{lower, GraphSet, LowerOptions};
use graphrun::plan::ModelPlan;
use graphrun::registry::{self, NodeFacts, WeightFormat};

/// Token counts on both sides of every threshold in rules.ron and fusions.ron (1, 8, 63, 64),
/// and long prompts.
const PREFILLS: [usize; 8] = [2, 8, 9, 63, 64, 65, 512, 2048];

#[test]
fn every_node_of_the_real_programs_gets_a_kernel_that_accepts_it() {
    let plan =
        ModelPlan::from_file(&common::repo().join("tests/data/configs/qwen3.8-flash-next.json"))
            .unwrap();
    let graphs = GraphSet::embedded().unwrap();
    let steps =
        std::iter::once((Phase::Decode, 1)).chain(PREFILLS.iter().map(|&t| (Phase::Prefill, t)));
    let mut used = std::collections::BTreeSet::new();
    for (phase, tokens) in steps {
        for (device, format) in [
            (Device::Cpu, WeightFormat::F32),
            (Device::Cuda, WeightFormat::F32),
            (Device::Cuda, WeightFormat::Bf16),
        ] {
            let opts = LowerOptions {
                device,
                weight_format: Some(format),
                ..LowerOptions::new(phase, tokens, LogitsMode::Last)
            };
            let p = lower(&plan, &graphs, &opts)
                .unwrap_or_else(|e| panic!("{phase} {tokens} on {device} ({format}): {e}"))
                .program;
            let rows = registry::node_rows(&p);
            for (node, &r) in p.nodes.iter().zip(&rows) {
                let what = format!("{phase} {tokens} on {device} ({format}): {}", node.name);
                assert!(!node.kernels.is_empty(), "{what} names no kernel");
                // The recorded choice is one the registry has, and it accepts the node.
                let v = registry::find(device, node.op.kind(), &node.variant)
                    .unwrap_or_else(|| panic!("{what}: unknown variant {}", node.variant));
                let facts = NodeFacts::of(&p, node, r, format);
                let dev = registry::DeviceFacts::default_for(device);
                (v.accepts)(&facts, &dev).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!((v.kernels)(&facts, &dev), node.kernels, "{what}");
                used.insert((device, node.op.kind(), node.variant.clone()));
            }
        }
    }
    // The programs exercise both executors' main variants (a sanity check of the loop itself).
    for (device, op, variant) in [
        (Device::Cuda, "linear", "rows1_stream"),
        (Device::Cuda, "linear", "mma_wide"),
        (Device::Cuda, "moe_experts", "expert_major_mma"),
        (Device::Cuda, "gated_attention", "split"),
        (Device::Cpu, "linear", "tiled"),
    ] {
        assert!(
            used.contains(&(device, op, variant.to_string())),
            "{op}.{variant} on {device} never chosen"
        );
    }
}
