//! The whole model against transformers at the real geometry, with a prompt long enough for the
//! indexer's sparse selection: the real config cut to 4 layers (GDN, GDN+PLE, GDN, QSA), every
//! width the release's, a random bf16 checkpoint written by transformers and the same trunk with
//! NVFP4 experts, each with transformers' float32 logits for the last rows of a ~9000-token
//! prompt (past the 2048-token budget: every compared row selects 512 of ~2250 blocks) and its
//! greedy continuation. On the CPU and on CUDA: those rows within 1e-4 of transformers' (per
//! row, relative to the row's largest |logit|), the greedy tokens identical (`Session::generate`,
//! greedy), and the decode step after them within 1e-4 too.
//!
//! The fixture is too big to commit (24 GB at 512 experts): `scripts/make_real_parity_fixture.py`
//! makes it on the GPU machine, and `scripts/gpu_real_parity.sh` runs both. The tests read it
//! from the folder `GRAPHRUN_REAL_PARITY` names and skip, saying so, when it is unset or holds no
//! fixture (and the CUDA ones without a device).
//!
//! Near-ties: a top-k (a router's 10 of 512, the indexer's 512 blocks) whose k-th and
//! (k+1)-th candidates are closer than the two implementations' float error may select either,
//! and that moves the row's logits by far more than 1e-4. The fixture stores each compared row's
//! smallest relative top-k gap; rows under [`NEAR_TIE`] are left out and listed (the script
//! draws prompts to have none), and at most a quarter of them may be.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use graphrun::checkpoint::Checkpoint;
use graphrun::ir::LogitsMode;
use graphrun::registry::WeightFormat;
use graphrun::runtime::sampling::argmax;
use graphrun::runtime::{DeviceChoice, GenerateOptions, Model, ModelOptions, Sampling};

/// The folder `scripts/make_real_parity_fixture.py --out` wrote.
const ENV: &str = "GRAPHRUN_REAL_PARITY";

const TOLERANCE: f32 = 1e-4;

/// A compared row's selections closer than this (relative) are near-ties: the row is left out.
/// The script's `NEAR_TIE`.
const NEAR_TIE: f32 = 1e-5;

/// One model at a time, whatever the harness's threads: a CPU load widens the checkpoint to f32
/// (48 GB at 512 experts), a CUDA load puts it on the device.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn bf16_on_the_cpu() {
    parity("bf16", DeviceChoice::Cpu);
}

#[test]
fn bf16_on_cuda() {
    parity("bf16", DeviceChoice::Cuda);
}

#[test]
fn nvfp4_on_the_cpu() {
    parity("nvfp4", DeviceChoice::Cpu);
}

#[test]
fn nvfp4_on_cuda() {
    parity("nvfp4", DeviceChoice::Cuda);
}

/// `$GRAPHRUN_REAL_PARITY/variant`, or None after saying why the test is skipped.
fn fixture(variant: &str) -> Option<PathBuf> {
    let how = "the fixture is made on the GPU machine: scripts/gpu_real_parity.sh";
    let Some(root) = std::env::var_os(ENV) else {
        common::gpu::say_skipped_for(&format!("{ENV} is unset"), how);
        return None;
    };
    let dir = PathBuf::from(root).join(variant);
    if !dir.join("expected.safetensors").is_file() {
        let why = format!("{} holds no expected.safetensors", dir.display());
        common::gpu::say_skipped_for(&why, how);
        return None;
    }
    Some(dir)
}

/// What transformers computed (`scripts/make_real_parity_fixture.py`'s expected.safetensors).
struct Expected {
    prompt: Vec<u32>,
    /// The last rows of the prefill, `[rows, vocab]`, and their positions.
    logits: Vec<f32>,
    positions: Vec<usize>,
    /// Each of those rows' smallest relative top-k gap (inf: it selects nothing).
    gaps: Vec<f32>,
    greedy: Vec<u32>,
    /// The logits after feeding every greedy token, and that step's gap.
    next_logits: Vec<f32>,
    next_gap: f32,
    vocab: usize,
}

fn expected(dir: &Path) -> Expected {
    let ck = Checkpoint::open_files(&[dir.join("expected.safetensors")]).unwrap();
    let ids = |name: &str| ck.to_i64(name).unwrap();
    let vocab = ck.info("logits").unwrap().shape[1];
    Expected {
        prompt: ids("prompt_ids").iter().map(|&t| t as u32).collect(),
        logits: ck.to_f32("logits").unwrap(),
        positions: ids("logits_positions")
            .iter()
            .map(|&p| p as usize)
            .collect(),
        gaps: ck.to_f32("logits_min_gap").unwrap(),
        greedy: ids("greedy_ids").iter().map(|&t| t as u32).collect(),
        next_logits: ck.to_f32("next_logits").unwrap(),
        next_gap: ck.to_f32("next_min_gap").unwrap()[0],
        vocab,
    }
}

/// Per row: |got - want| max over the row's largest |want| (`common::max_row_rel_err` by row).
fn row_errors(got: &[f32], want: &[f32], width: usize) -> Vec<f32> {
    assert_eq!(got.len(), want.len(), "length mismatch");
    got.chunks(width)
        .zip(want.chunks(width))
        .map(|(g, w)| common::max_row_rel_err(g, w, width))
        .collect()
}

fn parity(variant: &str, device: DeviceChoice) {
    let Some(dir) = fixture(variant) else {
        return;
    };
    if device == DeviceChoice::Cuda && !common::gpu::cuda_or_skip() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exp = expected(&dir);
    let (t, rows, vocab) = (exp.prompt.len(), exp.positions.len(), exp.vocab);
    assert_eq!(
        exp.positions,
        (t - rows..t).collect::<Vec<_>>(),
        "the last rows"
    );
    assert_eq!(exp.logits.len(), rows * vocab);
    let label = format!("{variant} on {device:?}");

    let started = Instant::now();
    let options = ModelOptions {
        device,
        // The prompt, then every greedy token fed back (the last one by the decode after them).
        context_capacity: Some(t + exp.greedy.len()),
        ..Default::default()
    };
    let model = Model::load(&dir, options).unwrap();
    let load_s = started.elapsed().as_secs_f64();
    assert_eq!(model.plan.vocab_size, vocab);
    assert_eq!(model.weight_dtype, "bf16", "{label}: the trunk");
    let nvfp4 = model.stored_formats.contains_key("nvfp4");
    assert_eq!(
        nvfp4,
        variant == "nvfp4",
        "{label}: {:?}",
        model.stored_formats.keys()
    );
    if device == DeviceChoice::Cuda {
        let packed = model.expert_format == Some(WeightFormat::Nvfp4);
        assert_eq!(
            packed, nvfp4,
            "{label}: the device keeps NVFP4 banks packed"
        );
    }

    // All but the last rows with the cheapest logits, then those rows: a [9000, 248320] logits
    // table would be 9 GB.
    let started = Instant::now();
    let mut s = model.session();
    s.prefill(&exp.prompt[..t - rows], LogitsMode::Last)
        .unwrap();
    let logits = s.prefill(&exp.prompt[t - rows..], LogitsMode::All).unwrap();
    let prefill_s = started.elapsed().as_secs_f64();
    assert_eq!(logits.rows, rows);
    let errors = row_errors(&logits.data, &exp.logits, vocab);

    // The first greedy token from the last row, the rest by `generate` (on CUDA the device's
    // argmax), then the decode step that feeds the last one.
    let started = Instant::now();
    let first = argmax(logits.last());
    let opts = GenerateOptions {
        max_new_tokens: exp.greedy.len() - 1,
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    };
    let mut greedy = vec![first];
    greedy.extend(s.generate(&[first], &opts).unwrap());
    let next = s.decode(*greedy.last().unwrap()).unwrap();
    let next_err = common::max_row_rel_err(&next, &exp.next_logits, vocab);
    let decode_s = started.elapsed().as_secs_f64();

    let ties: Vec<usize> = (0..rows).filter(|&r| exp.gaps[r] < NEAR_TIE).collect();
    let compared: Vec<usize> = (0..rows).filter(|r| !ties.contains(r)).collect();
    let (worst, worst_err) = compared
        .iter()
        .map(|&r| (r, errors[r]))
        .fold((0, 0.0f32), |m, x| if x.1 > m.1 { x } else { m });
    let next_tie = exp.next_gap < NEAR_TIE;
    println!(
        "{label}: {t} tokens, load {load_s:.1} s, prefill {prefill_s:.1} s, {} greedy + 1 decode {decode_s:.1} s",
        greedy.len()
    );
    println!(
        "{label}: last {} of {rows} rows vs transformers: max {worst_err:.2e} (position {}, top-k gap {:.1e}), decode after greedy {next_err:.2e}{}",
        compared.len(),
        exp.positions[worst],
        exp.gaps[worst],
        if next_tie { " (a near-tie: not compared)" } else { "" }
    );
    for &r in &ties {
        println!(
            "{label}: position {} left out, a near-tie (gap {:.1e}): {:.2e}",
            exp.positions[r], exp.gaps[r], errors[r]
        );
    }
    println!(
        "{label}: greedy {greedy:?} {}",
        if greedy == exp.greedy {
            "identical".to_string()
        } else {
            format!("DIFFERENT from transformers' {:?}", exp.greedy)
        }
    );
    assert!(
        ties.len() * 4 <= rows,
        "{label}: {} of {rows} rows are near-ties: draw another prompt",
        ties.len()
    );
    assert!(
        worst_err <= TOLERANCE,
        "{label}: position {}: {worst_err:e} from transformers",
        exp.positions[worst]
    );
    assert_eq!(greedy, exp.greedy, "{label}: greedy tokens");
    assert!(
        next_tie || next_err <= TOLERANCE,
        "{label}: the decode after the greedy tokens: {next_err:e} from transformers"
    );
}
