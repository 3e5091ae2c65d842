//! Speculative decoding on the CUDA executor: the trunk's exported hidden rows and the draft
//! head's steps (imports, exports, rotations one past the cache rows) against the CPU
//! reference, and speculative greedy decoding on the GPU equal to plain greedy on the GPU, with
//! rounds that keep none, some and all of their drafts (checkpoint and rewind on the device).
//! Runs where a CUDA device is present (`scripts/gpu_tests.sh`); elsewhere it says so.

mod common;

use std::borrow::Cow;
use std::path::PathBuf;

use graphrun::checkpoint::{self, Checkpoint};
use graphrun::ir::LogitsMode;
use graphrun::runtime::model::ProgramKey;
use graphrun::runtime::{
    DeviceChoice, GenerateOptions, Model, ModelOptions, Sampling, SpecOptions,
};

const TOLERANCE: f32 = 1e-4;

fn on(device: DeviceChoice) -> ModelOptions {
    ModelOptions {
        device,
        ..Default::default()
    }
}

/// `models/tiny-qwen4exp-mtp` with the lm head's rows of `boost` scaled up (trunk and draft
/// then choose among those tokens and agree often), written to a fresh directory.
fn boosted(boost: &[u32]) -> PathBuf {
    let src = common::repo().join("models/tiny-qwen4exp-mtp");
    let dir = common::temp_dir("gpu-spec");
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let file = dir.join("model.safetensors");
    let mut values = Checkpoint::open_files(std::slice::from_ref(&file))
        .unwrap()
        .to_f32("lm_head.weight")
        .unwrap();
    let mut tensors = common::read_tensors(&file);
    let head = tensors
        .iter_mut()
        .find(|t| t.name == "lm_head.weight")
        .unwrap();
    let cols = head.shape[1];
    for &t in boost {
        for v in &mut values[t as usize * cols..(t as usize + 1) * cols] {
            *v *= 6.0;
        }
    }
    head.bytes = Cow::Owned(checkpoint::f32_bytes(&values));
    checkpoint::write_safetensors(&file, &tensors, None).unwrap();
    dir
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    }
}

/// A trunk step that exports its hidden rows, then draft steps seeded by them (a prefill of the
/// draft, then a one-row chained step at a later row): logits, `hidden` and `carrier` within
/// 1e-4 of the CPU's.
#[test]
fn trunk_exports_and_draft_steps_match_the_cpu() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let dir = common::repo().join("models/tiny-qwen4exp-mtp");
    let cpu = Model::load(&dir, on(DeviceChoice::Cpu)).unwrap();
    let gpu = Model::load(&dir, on(DeviceChoice::Cuda)).unwrap();
    gpu.draft.require().unwrap();
    let prompt = [4i64, 5, 6, 7, 4, 8, 9];
    let vocab = cpu.plan.vocab_size;
    let width = cpu.plan.hc.count * cpu.plan.hidden_size;
    let mut results = Vec::new();
    for model in [&cpu, &gpu] {
        let trunk = model
            .program_for(ProgramKey::trunk(prompt.len(), LogitsMode::All).with_exports())
            .unwrap();
        let mut t = model.executor();
        let out = t.step_with(&trunk, &prompt, &[]).unwrap();
        let hidden = out.export("hidden").unwrap().to_vec();
        let mut d = model.executor();
        let draft = model
            .program_for(ProgramKey::draft(6, LogitsMode::Last))
            .unwrap();
        let ids: Vec<i64> = prompt[1..].to_vec();
        let first = d
            .step_with(&draft, &ids, &[("hidden", &hidden[..6 * width])])
            .unwrap();
        let one = model
            .program_for(ProgramKey::draft(1, LogitsMode::Last))
            .unwrap();
        let carrier = first.export("carrier").unwrap();
        let chained = d
            .step_with(&one, &[11], &[("hidden", &carrier[5 * width..])])
            .unwrap();
        results.push((out, first, chained));
    }
    let (c, g) = (&results[0], &results[1]);
    let checks = [
        ("trunk logits", &c.0.logits, &g.0.logits, vocab),
        ("trunk hidden", &c.0.exports[0].1, &g.0.exports[0].1, width),
        ("draft logits", &c.1.logits, &g.1.logits, vocab),
        ("draft carrier", &c.1.exports[0].1, &g.1.exports[0].1, width),
        ("chained logits", &c.2.logits, &g.2.logits, vocab),
        (
            "chained carrier",
            &c.2.exports[0].1,
            &g.2.exports[0].1,
            width,
        ),
    ];
    for (what, cpu, gpu, w) in checks {
        let err = common::max_row_rel_err(gpu, cpu, w);
        println!("{what}: {err:.2e}");
        assert!(err < TOLERANCE, "{what}: {err:.2e}");
    }
}

/// Speculative greedy on the GPU gives plain greedy's tokens on the GPU (and the CPU's), for
/// prompts of several lengths and K of 1 to 6, with a boosted lm head so that rounds keep none,
/// some and all of their drafts; the session then decodes on as plain decoding's does.
#[test]
fn speculative_greedy_on_the_gpu_equals_plain_greedy() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let dir = boosted(&[3, 17, 40, 77]);
    let gpu = Model::load(&dir, on(DeviceChoice::Cuda)).unwrap();
    let cpu = Model::load(&dir, on(DeviceChoice::Cpu)).unwrap();
    let base = [10u32, 232, 31, 42, 113, 253, 2, 233, 24, 221, 167, 27];
    let mut hist = vec![0usize; 7];
    for (len, k, adaptive) in [(1, 3, true), (4, 1, false), (7, 4, false), (12, 6, false)] {
        let prompt = &base[..len];
        let spec = SpecOptions { max_k: k, adaptive };
        let plain = gpu.session().generate(prompt, &greedy(30)).unwrap();
        let on_cpu = cpu.session().generate(prompt, &greedy(30)).unwrap();
        let mut s = gpu.session();
        let (got, report) = s.generate_speculative(prompt, &greedy(30), &spec).unwrap();
        println!("prompt {len}, {spec:?}: {report}");
        assert_eq!(got, plain, "prompt {len}, {spec:?}");
        assert_eq!(got, on_cpu, "prompt {len}, {spec:?} (CPU)");
        let mut p = gpu.session();
        p.prefill(prompt, LogitsMode::Last).unwrap();
        for &t in &plain[..plain.len() - 1] {
            p.decode(t).unwrap();
        }
        let last = *got.last().unwrap();
        let (a, b) = (s.decode(last).unwrap(), p.decode(last).unwrap());
        let err = common::max_row_rel_err(&a, &b, a.len());
        assert!(err < TOLERANCE, "decoding on after the rounds: {err:.2e}");
        for (i, n) in report.kept_hist.iter().enumerate() {
            hist[i] += n;
        }
    }
    println!("rounds by drafts kept: {hist:?}");
    assert!(
        hist[0] > 0 && hist[1..].iter().sum::<usize>() > 0,
        "{hist:?}"
    );
}

/// Sampled speculative decoding on the GPU: the same seed gives the same tokens, another seed
/// others, and drafts are kept as well as refused.
#[test]
fn sampled_speculative_on_the_gpu_is_seeded() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let dir = boosted(&[3, 17, 40, 77]);
    let gpu = Model::load(&dir, on(DeviceChoice::Cuda)).unwrap();
    let opts = |seed| GenerateOptions {
        max_new_tokens: 24,
        sampling: Sampling::Sample {
            temperature: 1.0,
            top_k: Some(8),
            top_p: None,
            seed,
        },
        stop_on_eos: false,
    };
    let spec = SpecOptions {
        max_k: 3,
        adaptive: false,
    };
    let run = |seed| {
        gpu.session()
            .generate_speculative(&[10, 232, 31, 42], &opts(seed), &spec)
            .unwrap()
    };
    let (a, report) = run(5);
    println!("{report}");
    assert_eq!(a, run(5).0);
    assert_ne!(a, run(6).0);
    assert!(
        report.accepted > 0 && report.accepted < report.drafted,
        "{report}"
    );
}

/// `models/tiny-qwen4exp-mtp`'s config written by synth with bf16 matrices and `experts`.
fn synth_tiny(experts: graphrun::synth::ExpertFormat, tag: &str) -> PathBuf {
    common::synth_bf16("models/tiny-qwen4exp-mtp/config.json", tag, experts, 9)
}

/// Verify-exact mode (`ModelOptions::verify_exact`): the logits of a step of 2 to 8 rows after a
/// prompt are, row for row, bit for bit those of one-token decode steps over the same tokens,
/// for f32 matrices, bf16 ones, and bf16 with NVFP4 experts; and speculative greedy then equals
/// plain greedy (drafts kept with the boosted f32 head). Without the mode, how many rows differ
/// is printed.
#[test]
fn verify_rows_are_decode_steps_bit_for_bit_in_exact_mode() {
    if !common::gpu::cuda_or_skip() {
        return;
    }
    let models = [
        // Boosted, so that rounds keep some of their drafts.
        ("f32", boosted(&[3, 17, 40, 77])),
        (
            "bf16",
            synth_tiny(graphrun::synth::ExpertFormat::Fused, "gpu-exact-bf16"),
        ),
        (
            "bf16, NVFP4 experts",
            synth_tiny(graphrun::synth::ExpertFormat::Nvfp4, "gpu-exact-nvfp4"),
        ),
    ];
    let prompt = [10u32, 232, 31, 42, 113, 253, 2];
    let rows = [233u32, 24, 221, 167, 27, 5, 9, 12];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (what, dir) in &models {
        for exact in [true, false] {
            let gpu = Model::load(
                dir,
                ModelOptions {
                    verify_exact: exact,
                    ..on(DeviceChoice::Cuda)
                },
            )
            .unwrap();
            let mut differing = 0;
            for n in [2, 5, 8] {
                let mut a = gpu.session();
                a.prefill(&prompt, LogitsMode::Last).unwrap();
                let verify = a.prefill(&rows[..n], LogitsMode::All).unwrap();
                let mut b = gpu.session();
                b.prefill(&prompt, LogitsMode::Last).unwrap();
                for (i, &t) in rows[..n].iter().enumerate() {
                    let one = b.decode(t).unwrap();
                    if bits(verify.row(i)) != bits(&one) {
                        differing += 1;
                        assert!(
                            !exact,
                            "{what}: row {i} of a {n}-row step differs from its decode step"
                        );
                    }
                }
            }
            println!("{what}, exact {exact}: {differing} of 15 verify rows differ from their decode steps");
            if exact {
                speculative_is_plain_greedy(what, dir, &gpu, &prompt);
            }
        }
    }
}

/// Greedy speculative decoding on `gpu` (lowered in verify-exact mode) gives plain greedy's
/// tokens; drafts are kept with the boosted f32 head.
fn speculative_is_plain_greedy(what: &str, dir: &std::path::Path, gpu: &Model, prompt: &[u32]) {
    let cpu = Model::load(dir, on(DeviceChoice::Cpu)).unwrap();
    for (len, k) in [(3, 4), (7, 7)] {
        let spec = SpecOptions {
            max_k: k,
            adaptive: false,
        };
        let plain = gpu.session().generate(&prompt[..len], &greedy(40)).unwrap();
        let (got, report) = gpu
            .session()
            .generate_speculative(&prompt[..len], &greedy(40), &spec)
            .unwrap();
        println!("{what}, exact, prompt {len}, K {k}: {report}");
        assert_eq!(got, plain, "{what}: prompt {len}, K {k}");
        if what == "f32" {
            assert!(report.accepted > 0, "{what}: no draft kept: {report}");
        }
        let on_cpu = cpu.session().generate(&prompt[..len], &greedy(40)).unwrap();
        println!(
            "{what}: the CPU's greedy {} the GPU's",
            if on_cpu == plain {
                "equals"
            } else {
                "differs from"
            }
        );
    }
}
