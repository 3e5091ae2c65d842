//! NVFP4 experts on the device (`kernels/moe_nvfp4.cu`, `moe_nvfp4_union.cu`,
//! `moe_nvfp4_persistent.cu` and their launchers): the four forms (token-major, expert-major on
//! the tensor cores, the union of the step's experts by a block per tile and by a grid sized to
//! the GPU) against the CPU reference
//! (`ops::moe::token_major` over the spec's dequantisation, `Nvfp4Bank::dequantize`) on fresh
//! random banks with E4M3 NaN scale bytes among them, at tiny shapes and at the real ones (H 2560,
//! I 640, top 10; 32 experts to save memory), with experts selected by several tokens and a token
//! selecting one expert twice; an id out of range poisons only its row. Then a whole NVFP4
//! checkpoint loaded onto the device: its banks stay packed, and its logits are the CPU's.
//!
//! Runs where a CUDA device is present (the GPU machine: `scripts/gpu_tests.sh`). Elsewhere it
//! says so and checks nothing else. Bounds as `tests/gpu_moe.rs`: within 1e-5 relative.

mod common;

use common::gpu::*;
use graphrun::exec::cuda::launch::moe_nvfp4::{
    moe_experts_nvfp4_expert_major, moe_experts_nvfp4_token_major, DeviceNvfp4,
};
use graphrun::exec::cuda::launch::moe_nvfp4_persistent::moe_experts_nvfp4_persistent;
use graphrun::exec::cuda::launch::moe_nvfp4_union::moe_experts_nvfp4_union;
use graphrun::exec::cuda::Launch;
use graphrun::ir::LogitsMode;
use graphrun::ops::moe;
use graphrun::runtime::{DeviceChoice, Model, ModelOptions};
use graphrun::weights::Nvfp4Bank;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Every this many scale groups of a part is an E4M3 NaN code (as synth writes them).
const NAN_EVERY: usize = 7;

type Form = fn(
    &Launch,
    &cudarc::driver::CudaSlice<f32>,
    &cudarc::driver::CudaSlice<i64>,
    &cudarc::driver::CudaSlice<f32>,
    &DeviceNvfp4,
    &DeviceNvfp4,
    [usize; 4],
) -> Result<graphrun::exec::cuda::device::Buf<f32>, graphrun::exec::cuda::CudaError>;

const FORMS: [(&str, Form); 4] = [
    ("moe_experts_*_nvfp4", moe_experts_nvfp4_token_major),
    (
        "moe_experts_expert_major_*_mma_nvfp4",
        moe_experts_nvfp4_expert_major,
    ),
    ("moe_experts_union_*_nvfp4", moe_experts_nvfp4_union),
    (
        "moe_experts_persistent_*_nvfp4",
        moe_experts_nvfp4_persistent,
    ),
];

/// Random banks `[E, 2I, H]` (a gate and an up global per expert) and `[E, H, I]`, packed, with
/// their dequantisations.
struct Banks {
    gate_up: Nvfp4Bank,
    down: Nvfp4Bank,
    gate_up_f32: Vec<f32>,
    down_f32: Vec<f32>,
}

fn banks(rng: &mut ChaCha8Rng, experts: usize, hidden: usize, inter: usize) -> Banks {
    let gu = random_scaled(
        rng,
        experts * 2 * inter * hidden,
        1.0 / (hidden as f32).sqrt(),
    );
    let dn = random_scaled(rng, experts * hidden * inter, 1.0 / (inter as f32).sqrt());
    let gate_up = Nvfp4Bank::quantize(&[experts, 2 * inter, hidden], &gu, inter, NAN_EVERY);
    let down = Nvfp4Bank::quantize(&[experts, hidden, inter], &dn, hidden, NAN_EVERY);
    assert!(
        gate_up.scales.contains(&0x7F) && gate_up.scales.contains(&0xFF),
        "the banks hold both E4M3 NaN codes"
    );
    Banks {
        gate_up_f32: gate_up.dequantize(),
        down_f32: down.dequantize(),
        gate_up,
        down,
    }
}

/// Top-k ids for `rows` tokens: random distinct experts, except that, where `twice`, the first
/// token selects expert 0 in two slots; and router-like weights.
fn selections(
    rng: &mut ChaCha8Rng,
    rows: usize,
    experts: usize,
    k: usize,
    twice: bool,
) -> (Vec<i64>, Vec<f32>) {
    let mut ids = Vec::with_capacity(rows * k);
    let mut w = Vec::with_capacity(rows * k);
    for t in 0..rows {
        let mut chosen: Vec<i64> = Vec::new();
        while chosen.len() < k {
            let e = rng.random_range(0..experts as i64);
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        if twice && t == 0 && k >= 2 {
            chosen[0] = 0;
            chosen[1] = 0;
        }
        ids.extend(&chosen);
        let raw: Vec<f32> = (0..k).map(|_| rng.random_range(0.05f32..1.0)).collect();
        let sum: f32 = raw.iter().sum();
        w.extend(raw.iter().map(|v| v / sum));
    }
    (ids, w)
}

#[test]
fn nvfp4_experts_match_the_reference() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_00f4);
    // (experts, hidden, intermediate, top_k, row counts): the tiny model's shape; one scale
    // group per down row; sizes past one tile of outputs; the real H and I with top 10.
    for (experts, hidden, inter, k, row_counts) in [
        (4, 64, 16, 2, &[1, 2, 5][..]),
        (6, 48, 32, 3, &[1, 7][..]),
        (9, 160, 144, 4, &[1, 3, 70][..]),
        (32, 2560, 640, 10, &[1, 2, 8, 64][..]),
    ] {
        let b = banks(&mut rng, experts, hidden, inter);
        let reference = moe::ExpertBank {
            gate_up: &b.gate_up_f32,
            down: &b.down_f32,
            hidden,
            intermediate: inter,
        };
        let dgu = DeviceNvfp4::upload(&gpu, &b.gate_up, "gate_up").unwrap();
        let ddown = DeviceNvfp4::upload(&gpu, &b.down, "down").unwrap();
        for &rows in row_counts {
            for twice in [false, true] {
                let x = random_scaled(&mut rng, rows * hidden, 1.0);
                let (ids, w) = selections(&mut rng, rows, experts, k, twice);
                let want = moe::token_major(&x, &ids, &w, rows, k, &reference);
                let (dx, di, dw) = (
                    gpu.upload(&x, "x").unwrap(),
                    gpu.upload(&ids, "ids").unwrap(),
                    gpu.upload(&w, "w").unwrap(),
                );
                for (kernel, form) in FORMS {
                    let run = || {
                        let y = form(&gpu, &dx, &di, &dw, &dgu, &ddown, [rows, k, hidden, inter])
                            .unwrap();
                        gpu.download(&y, "y").unwrap()
                    };
                    let got = run();
                    let shape = format!(
                        "T{rows} E{experts} H{hidden} I{inter} top {k}{}",
                        if twice { " twice" } else { "" }
                    );
                    check(kernel, &shape, &got, &want);
                    let again = run();
                    assert_eq!(
                        bits(&got),
                        bits(&again),
                        "{kernel} at {shape}: a second run differs"
                    );
                }
            }
        }
    }
    gpu.sync("the NVFP4 expert checks").unwrap();
}

#[test]
fn an_id_out_of_range_poisons_only_its_row() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_00f5);
    let (experts, hidden, inter, k, rows) = (3, 32, 16, 2, 2);
    let b = banks(&mut rng, experts, hidden, inter);
    let reference = moe::ExpertBank {
        gate_up: &b.gate_up_f32,
        down: &b.down_f32,
        hidden,
        intermediate: inter,
    };
    let dgu = DeviceNvfp4::upload(&gpu, &b.gate_up, "gate_up").unwrap();
    let ddown = DeviceNvfp4::upload(&gpu, &b.down, "down").unwrap();
    let x = random_scaled(&mut rng, rows * hidden, 1.0);
    let ids = vec![0i64, 2, 1, experts as i64];
    let w = vec![0.5f32; 4];
    let want = moe::token_major(&x[..hidden], &ids[..k], &w[..k], 1, k, &reference);
    for (kernel, form) in FORMS {
        let y = form(
            &gpu,
            &gpu.upload(&x, "x").unwrap(),
            &gpu.upload(&ids, "ids").unwrap(),
            &gpu.upload(&w, "w").unwrap(),
            &dgu,
            &ddown,
            [rows, k, hidden, inter],
        )
        .unwrap();
        let got = gpu.download(&y, "y").unwrap();
        assert!(
            got[hidden..].iter().all(|v| v.is_nan()),
            "{kernel}: {got:?}"
        );
        check(kernel, "bad id in another row", &got[..hidden], &want);
    }
}

#[test]
fn mismatched_banks_are_refused_naming_the_kernel() {
    let Some(device) = gpu_or_skip() else { return };
    let gpu = Launch::new(&device);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_00f6);
    let (experts, hidden, inter, k) = (3, 32, 16, 2);
    let b = banks(&mut rng, experts, hidden, inter);
    let dgu = DeviceNvfp4::upload(&gpu, &b.gate_up, "gate_up").unwrap();
    let ddown = DeviceNvfp4::upload(&gpu, &b.down, "down").unwrap();
    let x = gpu
        .upload(&random_scaled(&mut rng, hidden, 1.0), "x")
        .unwrap();
    let ids = gpu.upload(&[0i64, 1], "ids").unwrap();
    let w = gpu.upload(&[0.5f32, 0.5], "w").unwrap();
    for (kernel, form) in FORMS {
        // down given as gate_up: the shapes do not match [E, 2I, H].
        let err = match form(&gpu, &x, &ids, &w, &ddown, &dgu, [1, k, hidden, inter]) {
            Ok(_) => panic!("{kernel}: swapped banks accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("gate_up bank"), "{kernel}: {err}");
        // x of the wrong width.
        let err = match form(&gpu, &x, &ids, &w, &dgu, &ddown, [1, k, hidden + 16, inter]) {
            Ok(_) => panic!("{kernel}: a wrong width accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("x 32 values"), "{kernel}: {err}");
    }
}

/// A tiny NVFP4 checkpoint (synth) loaded onto the device keeps its banks packed (the backend's
/// expert format is NVFP4, the rules pick the NVFP4 kernels, no host copy is kept), and decodes
/// the CPU's logits: a prompt, then greedy steps, within 1e-4 relative of the CPU's (whole
/// steps through every kernel, not one product).
#[test]
fn an_nvfp4_checkpoint_runs_on_the_device_as_on_the_cpu() {
    if !cuda_or_skip() {
        return;
    }
    let dir = common::synth_bf16(
        "models/tiny-qwen4exp/config.json",
        "gpu-nvfp4-model",
        graphrun::synth::ExpertFormat::Nvfp4,
        5,
    );
    let cpu = Model::load(&dir, ModelOptions::default()).unwrap();
    let cuda = Model::load(
        &dir,
        ModelOptions {
            device: DeviceChoice::Cuda,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        cuda.expert_format,
        Some(graphrun::registry::WeightFormat::Nvfp4)
    );
    let program = cuda
        .program(graphrun::ir::Phase::Decode, 1, LogitsMode::Last)
        .unwrap();
    let experts: Vec<&graphrun::ir::Node> = program
        .nodes
        .iter()
        .filter(|n| n.op.kind() == "moe_experts")
        .collect();
    assert!(!experts.is_empty());
    assert!(
        experts.iter().all(|n| n.variant.starts_with("nvfp4_")),
        "the rules pick NVFP4 kernels: {:?}",
        experts.iter().map(|n| &n.variant).collect::<Vec<_>>()
    );
    assert!(
        cuda.weights.is_empty(),
        "a device load keeps no host copy of the weights (the banks go packed to the device)"
    );
    let prompt: Vec<u32> = vec![3, 17, 101, 9, 44, 250, 7, 12, 60];
    let mut a = cpu.session();
    let mut b = cuda.session();
    let mut la = a.prefill(&prompt, LogitsMode::Last).unwrap().data;
    let mut lb = b.prefill(&prompt, LogitsMode::Last).unwrap().data;
    for step in 0..8 {
        let (rel, max) = errors(&lb, &la);
        assert!(
            rel <= 1e-4 && max <= 1e-3,
            "step {step}: rel {rel:e}, max {max:e}"
        );
        let next = la
            .iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        la = a.decode(next).unwrap();
        lb = b.decode(next).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
