//! The `graphrun` commands end to end, and `synth` checkpoints loading back.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use graphrun::checkpoint::Checkpoint;
use graphrun::ir::LogitsMode;
use graphrun::plan::ModelPlan;
use graphrun::runtime::{Model, ModelOptions};
use graphrun::synth::{self, SynthDtype, SynthOptions};
use graphrun::weights::{WeightTensor, Weights};
use half::f16;

fn graphrun(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_graphrun"))
        .args(args)
        .current_dir(common::repo())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !stderr.contains("panicked"),
        "graphrun {args:?} panicked:\n{stderr}"
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        stderr,
    )
}

#[test]
fn run_prints_ids_as_the_last_line() {
    let exp = common::expected(&common::repo().join("models/tiny-qwen4exp"));
    let ids: Vec<String> = exp.prompt.iter().map(|t| t.to_string()).collect();
    let (ok, stdout, stderr) = graphrun(&[
        "run",
        "--model",
        "models/tiny-qwen4exp",
        "--prompt-ids",
        &ids.join(","),
        "--max-new-tokens",
        "8",
        "--greedy",
        "--ignore-eos",
    ]);
    assert!(ok, "{stderr}");
    let last = stdout.lines().last().unwrap();
    let want: Vec<String> = exp.greedy.iter().map(|t| t.to_string()).collect();
    assert_eq!(last, want.join(","));
}

#[test]
fn run_with_text_prompt_prints_text_then_ids() {
    let (ok, stdout, stderr) = graphrun(&[
        "run",
        "--model",
        "models/tiny-qwen4exp",
        "--prompt",
        "the cat sat on the mat .",
        "--max-new-tokens",
        "5",
    ]);
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let ids: Vec<u32> = lines[1].split(',').map(|s| s.parse().unwrap()).collect();
    assert!(!ids.is_empty() && ids.len() <= 5);
    assert!(!lines[0].is_empty());
}

#[test]
fn sampling_is_reproducible_and_seeded() {
    let args = |seed: &str| {
        graphrun(&[
            "run",
            "--model",
            "models/tiny-qwen4exp",
            "--prompt-ids",
            "5,6,7,8",
            "--max-new-tokens",
            "12",
            "--ignore-eos",
            "--temperature",
            "1.3",
            "--top-k",
            "40",
            "--top-p",
            "0.95",
            "--seed",
            seed,
        ])
    };
    let (a, b, c) = (args("1"), args("1"), args("2"));
    assert!(a.0 && c.0, "{}", a.2);
    assert_eq!(a.1, b.1);
    assert_ne!(a.1, c.1, "different seeds gave the same 12 tokens");
}

#[test]
fn logits_command_writes_every_position() {
    let dir = common::temp_dir("logits");
    let out = dir.join("logits.safetensors");
    let (ok, _, stderr) = graphrun(&[
        "logits",
        "--model",
        "tests/fixtures/tiny-flat-f32",
        "--prompt-ids",
        "5,6,2,7",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let ck = Checkpoint::open_files(&[out]).unwrap();
    let info = ck.info("logits").unwrap();
    assert_eq!(info.shape, vec![4, 128]);
    let model = Model::load(
        &common::repo().join("tests/fixtures/tiny-flat-f32"),
        ModelOptions::default(),
    )
    .unwrap();
    let want = model
        .session()
        .prefill(&[5, 6, 2, 7], LogitsMode::All)
        .unwrap();
    assert_eq!(ck.to_f32("logits").unwrap(), want.data);
}

#[test]
fn lower_the_real_config_without_weights() {
    for phase in ["prefill", "decode"] {
        let (ok, stdout, stderr) = graphrun(&[
            "lower",
            "--config",
            "tests/data/configs/qwen3.8-flash-next.json",
            "--phase",
            phase,
        ]);
        assert!(ok, "{stderr}");
        assert!(stdout.starts_with("Program("));
        assert!(stderr.contains("fusion swiglu: 48 match(es)"), "{stderr}");
    }
    // Scheduled for the CUDA executor: its own rules choose the variants.
    let (ok, stdout, stderr) = graphrun(&[
        "lower",
        "--config",
        "tests/data/configs/qwen3.8-flash-next.json",
        "--device",
        "cuda",
        "--tokens",
        "64",
    ]);
    assert!(ok, "{stderr}");
    // bf16 matrices (the release's) by default: tensor-core tiles, the kernel named.
    assert!(stdout.contains("device: Cuda") && stdout.contains("rule: \"linear.cuda_mma\""));
    assert!(
        stdout.contains("kernels: [\"linear_mma_wide_bf16\""),
        "{stdout}"
    );
    assert!(!stdout.contains("linear.prefill_tiled"));
    let (ok, stdout, stderr) = graphrun(&[
        "lower",
        "--config",
        "tests/data/configs/qwen3.8-flash-next.json",
        "--device",
        "cuda",
        "--tokens",
        "64",
        "--weights",
        "f32",
        "--format",
        "kernels",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("linear.cuda_tiled") && stdout.contains("linear_tiled_f32"),
        "{stdout}"
    );
    assert!(!stdout.contains("bf16"), "{stdout}");
    let (ok, stdout, _) = graphrun(&[
        "lower",
        "--model",
        "models/tiny-qwen4exp",
        "--tokens",
        "8",
        "--rule",
        "linear.prefill_tiled=rows",
        "--no-fusions",
    ]);
    assert!(ok);
    assert!(!stdout.contains("variant: \"tiled\""));
    assert!(!stdout.contains("fused:"));
}

#[test]
fn inspect_reports_plan_and_contract() {
    let (ok, stdout, stderr) =
        graphrun(&["inspect", "--model", "tests/fixtures/tiny-composite-bf16"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("contract holds"), "{stdout}");
    assert!(stdout.contains("stored as bf16"), "{stdout}");
    assert!(
        stdout.contains("mtp.fc_hidden.weight") && stdout.contains("model.visual."),
        "{stdout}"
    );
}

/// synth writes the official layout (composite prefix, fused experts, shard_{k} table pieces,
/// several files with an index); loading it gives the same logits as the same random weights
/// in memory.
#[test]
fn synth_checkpoints_load_back() {
    for config in [
        "models/tiny-qwen4exp/config.json",
        "tests/fixtures/tiny-composite-bf16/config.json",
    ] {
        let text = std::fs::read_to_string(common::repo().join(config)).unwrap();
        let plan = ModelPlan::from_json_str(&text, config).unwrap();
        let dir = common::temp_dir("synth");
        synth::write(
            &plan,
            &text,
            &dir,
            &SynthOptions {
                dtype: SynthDtype::F32,
                seed: 4,
                shard_bytes: 64 << 10,
                experts: Default::default(),
                sparse: false,
            },
        )
        .unwrap();
        assert!(
            dir.join("model.safetensors.index.json").exists(),
            "{config}: expected several files"
        );
        let ck = Checkpoint::open_dir(&dir).unwrap();
        assert!(ck
            .names()
            .any(|n| n.contains("ngram_embedding.shard_0.weight")));
        let loaded = Model::load(&dir, ModelOptions::default()).unwrap();
        let memory = Model::from_parts(
            plan.clone(),
            graphrun::lower::GraphSet::embedded().unwrap(),
            synth::random_weights(&plan, 4).unwrap(),
            ModelOptions::default(),
        );
        let prompt = [3, 9, 4, 1, 7, 7, 2];
        let a = loaded.session().prefill(&prompt, LogitsMode::All).unwrap();
        let b = memory.session().prefill(&prompt, LogitsMode::All).unwrap();
        assert_eq!(a, b, "{config}");
        assert!(a.data.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn synth_cli_bf16() {
    let dir = common::temp_dir("synthcli");
    let (ok, _, stderr) = graphrun(&[
        "synth",
        "--config",
        "models/tiny-qwen4exp/config.json",
        "--out",
        dir.to_str().unwrap(),
        "--dtype",
        "bf16",
        "--seed",
        "3",
    ]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = graphrun(&["inspect", "--model", dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stored as bf16"), "{stdout}");
    let (ok, stdout, _) = graphrun(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "4",
    ]);
    assert!(ok);
    assert!(!stdout.trim().is_empty());
}

/// Without a GPU, `--device auto` runs on the CPU with a notice and `--device cuda` is a clear
/// error (on the GPU machine both run on the GPU: tests/gpu_e2e.rs).
#[test]
fn device_choice_without_a_gpu() {
    if graphrun::exec::cuda::probe().is_ok() {
        return;
    }
    let args = |device: &str| {
        graphrun(&[
            "run",
            "--model",
            "models/tiny-qwen4exp",
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "3",
            "--device",
            device,
        ])
    };
    let (ok, stdout, stderr) = args("auto");
    assert!(ok, "{stderr}");
    assert!(stderr.contains("notice: no CUDA device"), "{stderr}");
    assert_eq!(stdout.lines().last().unwrap().split(',').count(), 3);
    let (ok, _, stderr) = args("cuda");
    assert!(!ok);
    assert!(
        stderr.starts_with("error:") && stderr.contains("CUDA"),
        "{stderr}"
    );
    let (ok, _, stderr) = args("tpu");
    assert!(!ok);
    assert!(stderr.contains("unknown device `tpu`"), "{stderr}");
}

/// The benchmark takes the same graph files, rules and fusions as `run` and `lower`, and checks
/// them before it opens the device: a bad one is an error naming it, with or without a GPU.
#[test]
fn bench_checks_its_schedule_before_the_device() {
    let (ok, _, stderr) = graphrun(&["bench", "--rule", "nosuch=rows"]);
    assert!(!ok && stderr.contains("no rule named `nosuch`"), "{stderr}");
    let (ok, _, stderr) = graphrun(&["bench", "--rule", "linear.cuda_mma=bogus"]);
    assert!(!ok && stderr.contains("no variant `bogus`"), "{stderr}");
    let (ok, _, stderr) = graphrun(&["bench", "--fusions", "nope"]);
    assert!(!ok && stderr.contains("fusion `nope`"), "{stderr}");
    let (ok, _, stderr) = graphrun(&["--graphs", "no/such/dir", "bench"]);
    assert!(!ok && stderr.contains("no/such/dir"), "{stderr}");
    let (ok, _, stderr) = graphrun(&["bench", "--prefills", "2048,0"]);
    assert!(!ok && stderr.contains("--prefills"), "{stderr}");
    let (ok, _, stderr) = graphrun(&["bench", "--launch-twice", "hc_read,hc_raed"]);
    assert!(
        !ok && stderr.contains("--launch-twice") && stderr.contains("`hc_raed`"),
        "{stderr}"
    );
}

/// The real config's prefill program: far more RON than a pipe holds (64 KiB on Linux).
const LOWER_REAL: [&str; 5] = [
    "lower",
    "--config",
    "tests/data/configs/qwen3.8-flash-next.json",
    "--tokens",
    "64",
];

const RUN_TINY: [&str; 7] = [
    "run",
    "--model",
    "models/tiny-qwen4exp",
    "--prompt",
    "the cat sat on the mat .",
    "--max-new-tokens",
    "4",
];

/// A reader that goes away (`graphrun lower | head -1`) ends the command quietly: exit 0, no
/// panic, no error.
#[test]
fn a_closed_stdout_pipe_ends_quietly() {
    let (ok, whole, stderr) = graphrun(&LOWER_REAL);
    assert!(ok, "{stderr}");
    assert!(
        whole.len() > 4 << 16,
        "{} bytes: too few to outlast the pipe's buffer",
        whole.len()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_graphrun"))
        .args(LOWER_REAL)
        .current_dir(common::repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(first, whole.lines().next().unwrap().to_string() + "\n");
    assert!(
        status.success() && !stderr.contains("panicked") && !stderr.contains("error"),
        "{status}:\n{stderr}"
    );

    // `run` with its stdout closed before it writes (it loads and generates first).
    let mut child = Command::new(env!("CARGO_BIN_EXE_graphrun"))
        .args(RUN_TINY)
        .current_dir(common::repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("panicked") && !stderr.contains("error"),
        "{}:\n{stderr}",
        out.status
    );
}

/// stdout on a full disk (/dev/full: every write fails with ENOSPC) is an error naming stdout.
#[cfg(target_os = "linux")]
#[test]
fn a_full_stdout_is_an_error_naming_it() {
    for args in [&LOWER_REAL[..], &RUN_TINY[..]] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_graphrun"))
            .args(args)
            .current_dir(common::repo())
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: exit 0 on a full disk");
        assert!(!stderr.contains("panicked"), "{args:?}:\n{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: stdout: ") && last.contains("No space left"),
            "{args:?}:\n{stderr}"
        );
    }
}

/// `--tokens` is bounded by the plan's max_position_embeddings (and is at least 1): an error
/// naming the flag, where an unchecked 2^61 tokens wrapped the arena's size to 0 bytes.
#[test]
fn lower_checks_tokens_against_the_plan() {
    let lower =
        |config: &str, tokens: &str| graphrun(&["lower", "--config", config, "--tokens", tokens]);
    let tiny = "models/tiny-qwen4exp/config.json";
    let real = "tests/data/configs/qwen3.8-flash-next.json";
    for (config, tokens) in [
        (tiny, "2305843009213693952"),
        (tiny, "513"),
        (real, "262145"),
    ] {
        let max = ModelPlan::from_file(&common::repo().join(config))
            .unwrap()
            .max_position_embeddings;
        let (ok, stdout, stderr) = lower(config, tokens);
        assert!(
            !ok && stdout.is_empty(),
            "{config} --tokens {tokens}: {stderr}"
        );
        assert!(
            stderr.starts_with(&format!("error: --tokens {tokens}: "))
                && stderr.contains(&format!("max_position_embeddings = {max}")),
            "{stderr}"
        );
    }
    let (ok, _, stderr) = lower(tiny, "0");
    assert!(!ok && stderr.starts_with("error: --tokens 0: "), "{stderr}");
    // The longest step the model takes lowers.
    let (ok, stdout, stderr) = lower(tiny, "512");
    assert!(ok && stdout.contains("tokens: 512"), "{stderr}");
}

/// A generation that cannot fit the context is refused before any step, naming
/// --max-new-tokens and the bound (max_position_embeddings, or --context); one that fits exactly
/// runs (every new token but the last is fed back). The tiny model takes 512 positions.
#[test]
fn run_refuses_max_new_tokens_past_the_context() {
    let run = |new: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            "models/tiny-qwen4exp",
            "--prompt-ids",
            "5,6,7",
            "--ignore-eos",
            "--max-new-tokens",
            new,
        ];
        args.extend_from_slice(extra);
        graphrun(&args)
    };
    let (ok, stdout, stderr) = run("511", &[]);
    assert!(!ok && stdout.is_empty(), "{stderr}");
    assert!(
        stderr.starts_with("error: --max-new-tokens 511: ")
            && stderr.contains("max_position_embeddings = 512")
            && stderr.contains("at most 510 new tokens fit"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&usize::MAX.to_string(), &[]);
    assert!(!ok && stderr.contains("--max-new-tokens"), "{stderr}");
    // --context bounds a CPU session too.
    let (ok, _, stderr) = run("7", &["--context", "8"]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.starts_with("error: --max-new-tokens 7: ") && stderr.contains("--context 8"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = run("6", &["--context", "8"]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().last().unwrap().split(',').count(), 6);
}

/// `--context` applies on the CPU: a prompt past it is refused; 0 and more than the model's
/// positions are refused by name.
#[test]
fn context_bounds_a_cpu_session() {
    let run = |ids: &str, context: &str| {
        graphrun(&[
            "run",
            "--model",
            "models/tiny-qwen4exp",
            "--prompt-ids",
            ids,
            "--max-new-tokens",
            "1",
            "--context",
            context,
        ])
    };
    let (ok, _, stderr) = run("5,6,7,8,9", "4");
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("context of 5 tokens exceeds --context 4"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = run("5,6,7", "4");
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().last().unwrap().split(',').count(), 1);
    for (context, why) in [
        ("0", "at least one token"),
        ("513", "max_position_embeddings = 512"),
    ] {
        let (ok, _, stderr) = run("5,6,7", context);
        assert!(
            !ok && stderr.starts_with(&format!("error: --context {context}: "))
                && stderr.contains(why),
            "{stderr}"
        );
    }
    // `logits` takes the same placement.
    let dir = common::temp_dir("logits-context");
    let (ok, _, stderr) = graphrun(&[
        "logits",
        "--model",
        "models/tiny-qwen4exp",
        "--prompt-ids",
        "5,6,7",
        "--context",
        "2",
        "--out",
        dir.join("l.safetensors").to_str().unwrap(),
    ]);
    assert!(!ok && stderr.contains("exceeds --context 2"), "{stderr}");
}

/// `--prefill-chunk N` cuts the prompt into steps of N tokens on `run` and `logits` (the same
/// tokens, the same logits); 0 is refused by name before the model loads.
#[test]
fn prefill_chunk_flag() {
    let exp = common::expected(&common::repo().join("models/tiny-qwen4exp"));
    let ids: Vec<String> = exp.prompt.iter().map(|t| t.to_string()).collect();
    let ids = ids.join(",");
    let run = |chunk: &str| {
        graphrun(&[
            "run",
            "--model",
            "models/tiny-qwen4exp",
            "--prompt-ids",
            &ids,
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--prefill-chunk",
            chunk,
        ])
    };
    let (ok, stdout, stderr) = run("3");
    assert!(ok, "{stderr}");
    let want: Vec<String> = exp.greedy.iter().map(|t| t.to_string()).collect();
    assert_eq!(stdout.lines().last().unwrap(), want.join(","));
    let (ok, _, stderr) = run("0");
    assert!(
        !ok && stderr.starts_with("error: --prefill-chunk 0: ")
            && stderr.contains("at least one token"),
        "{stderr}"
    );
    let dir = common::temp_dir("logits-chunk");
    let logits = |chunk: &str, name: &str| {
        let out = dir.join(name);
        let (ok, _, stderr) = graphrun(&[
            "logits",
            "--model",
            "models/tiny-qwen4exp",
            "--prompt-ids",
            &ids,
            "--prefill-chunk",
            chunk,
            "--out",
            out.to_str().unwrap(),
        ]);
        (ok, stderr, out)
    };
    let (ok, stderr, out) = logits("5", "chunked.safetensors");
    assert!(ok, "{stderr}");
    let (ok, stderr, whole) = logits("4096", "whole.safetensors");
    assert!(ok, "{stderr}");
    let read = |p: std::path::PathBuf| Checkpoint::open_files(&[p]).unwrap().to_f32("logits");
    assert_eq!(read(out).unwrap(), read(whole).unwrap());
    let (ok, stderr, _) = logits("0", "none.safetensors");
    assert!(
        !ok && stderr.starts_with("error: --prefill-chunk 0: "),
        "{stderr}"
    );
}

/// An empty prompt is an error naming the flag it came from.
#[test]
fn an_empty_prompt_names_its_flag() {
    let run = |flag: &str| {
        graphrun(&[
            "run",
            "--model",
            "models/tiny-qwen4exp",
            flag,
            "",
            "--max-new-tokens",
            "2",
        ])
    };
    let (ok, _, stderr) = run("--prompt");
    assert!(
        !ok && stderr.starts_with("error: --prompt \"\": "),
        "{stderr}"
    );
    let (ok, _, stderr) = run("--prompt-ids");
    assert!(!ok && stderr.starts_with("error: --prompt-ids"), "{stderr}");
}

/// synth writes f16 weights that load (as f16) and give the logits of the same random weights
/// rounded to f16 in memory; the CLI writes, inspects and runs one.
#[test]
fn synth_f16_loads_and_runs() {
    let config = "models/tiny-qwen4exp/config.json";
    let text = std::fs::read_to_string(common::repo().join(config)).unwrap();
    let plan = ModelPlan::from_json_str(&text, config).unwrap();
    let dir = common::temp_dir("synth-f16");
    synth::write(
        &plan,
        &text,
        &dir,
        &SynthOptions {
            dtype: SynthDtype::F16,
            seed: 5,
            shard_bytes: 1 << 30,
            experts: Default::default(),
            sparse: false,
        },
    )
    .unwrap();
    let loaded = Model::load(&dir, ModelOptions::default()).unwrap();
    assert_eq!(loaded.weight_dtype, "f16");
    let exact = synth::random_weights(&plan, 5).unwrap();
    let mut rounded = Weights::new();
    for name in exact.names() {
        let w = exact.get(name).unwrap();
        let data = w.data.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        rounded.insert(
            name,
            WeightTensor {
                shape: w.shape.clone(),
                data,
            },
        );
    }
    let mut memory = Model::from_parts(
        plan,
        graphrun::lower::GraphSet::embedded().unwrap(),
        rounded,
        ModelOptions::default(),
    );
    // The same rules as the loaded model's (they may test the dtype).
    memory.weight_dtype = "f16".into();
    let prompt = [3, 9, 4, 1, 7];
    let a = loaded.session().prefill(&prompt, LogitsMode::All).unwrap();
    let b = memory.session().prefill(&prompt, LogitsMode::All).unwrap();
    assert_eq!(a, b);
    assert!(a.data.iter().all(|v| v.is_finite()));

    let dir = common::temp_dir("synth-f16-cli");
    let (ok, _, stderr) = graphrun(&[
        "synth",
        "--config",
        config,
        "--out",
        dir.to_str().unwrap(),
        "--dtype",
        "f16",
    ]);
    assert!(ok, "{stderr}");
    let (ok, stdout, stderr) = graphrun(&["inspect", "--model", dir.to_str().unwrap()]);
    assert!(ok && stdout.contains("stored as f16"), "{stdout}{stderr}");
    let (ok, stdout, stderr) = graphrun(&[
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.lines().last().unwrap().split(',').count(), 4);
    let (ok, _, stderr) = graphrun(&[
        "synth",
        "--config",
        config,
        "--out",
        dir.to_str().unwrap(),
        "--dtype",
        "f8",
    ]);
    assert!(
        !ok && stderr.contains("--dtype f8: expected f32, bf16 or f16"),
        "{stderr}"
    );
}

/// Run by `gpu_skips_reach_ci_output` in a child process.
#[test]
#[ignore = "a probe that gpu_skips_reach_ci_output runs"]
fn gpu_skip_probe() {
    let _ = common::gpu::gpu_or_skip();
}

/// A GPU test without a device says so where CI sees it: the harness drops a passing test's
/// captured output (println! and eprintln! alike), so the line must get past the capture.
#[test]
fn gpu_skips_reach_ci_output() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "gpu_skip_probe", "--include-ignored"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let skipped = stderr.contains("SKIPPED gpu_skip_probe: no CUDA device");
    assert_eq!(
        skipped,
        graphrun::exec::cuda::probe().is_err(),
        "stderr:\n{stderr}"
    );
}

/// A stderr whose reader is gone (`graphrun ... 2>&1 | head` after head exits, a closed
/// terminal) fails every write with a broken pipe; the command still ends with its own exit
/// status, not a panic (101): a notice written on success, and the `error:` line of a failure.
#[test]
fn a_closed_stderr_is_not_a_panic() {
    let cases: [(&[&str], i32); 2] = [
        // Writes its fusion counts and arena size to stderr, the program to stdout.
        (
            &[
                "lower",
                "--config",
                "models/tiny-qwen4exp/config.json",
                "--phase",
                "decode",
            ],
            0,
        ),
        (&["run", "--model", "no/such/model", "--prompt-ids", "1"], 1),
    ];
    for (args, code) in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_graphrun"))
            .args(args)
            .current_dir(common::repo())
            .env("RUST_BACKTRACE", "0")
            .stderr(writer)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(code),
            "graphrun {args:?}:\n{stdout}"
        );
        assert!(!stdout.contains("panicked"), "graphrun {args:?}:\n{stdout}");
        if code == 0 {
            assert!(
                stdout.contains("nodes:"),
                "graphrun {args:?}: no program on stdout"
            );
        }
    }
}

/// `run --speculative` prints plain greedy's tokens and the report's lines on stderr; without a
/// draft head, or with K out of range, it fails before generating, naming the cause.
#[test]
fn run_speculative_prints_plain_tokens_and_the_report() {
    let args = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "--model",
            "models/tiny-qwen4exp-mtp",
            "--prompt-ids",
            "4,5,6,7,4,8",
            "--max-new-tokens",
            "20",
            "--ignore-eos",
        ];
        a.extend(extra);
        graphrun(&a)
    };
    let (ok, plain, stderr) = args(&[]);
    assert!(ok, "{stderr}");
    for extra in [
        &["--speculative"][..],
        &["--speculative", "--spec-k", "3", "--spec-fixed"],
    ] {
        let (ok, stdout, stderr) = args(extra);
        assert!(ok, "{stderr}");
        assert_eq!(stdout, plain, "{extra:?}");
        assert!(stderr.contains("speculative: 20 tokens, "), "{stderr}");
        assert!(stderr.contains("acceptance by draft position"), "{stderr}");
        assert!(stderr.contains("tokens/s decoding"), "{stderr}");
    }
    let (ok, _, stderr) = args(&["--speculative", "--spec-k", "17"]);
    assert!(!ok);
    assert!(
        stderr.contains("--spec-k 17: a round drafts 1 to 16 tokens"),
        "{stderr}"
    );
    let (ok, _, stderr) = graphrun(&[
        "run",
        "--model",
        "models/tiny-qwen4exp",
        "--prompt-ids",
        "4,5",
        "--speculative",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains(
            "speculative decoding is unavailable: the checkpoint holds no MTP draft head"
        ),
        "{stderr}"
    );
    let (ok, stdout, _) = graphrun(&["inspect", "--model", "models/tiny-qwen4exp-mtp"]);
    assert!(ok);
    assert!(
        stdout.contains("draft head: MTP, 1 layer(s), checked with the trunk"),
        "{stdout}"
    );
}
