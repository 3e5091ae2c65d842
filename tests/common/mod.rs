//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use graphrun::checkpoint::Checkpoint;

/// The repository root: where the test was built, or the current directory when the test binary
/// runs elsewhere (the GPU machine runs copies of the test binaries from its repo root).
pub fn repo() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if built.join("tests/fixtures").exists() {
        return built;
    }
    std::env::current_dir().unwrap()
}

/// Every parity fixture: the tiny models made by `scripts/make_fixtures.py` with transformers.
pub fn fixture_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo().join("tests/fixtures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.safetensors").exists())
        .collect();
    dirs.push(repo().join("models/tiny-qwen4exp"));
    dirs.sort();
    dirs
}

pub struct Expected {
    pub prompt: Vec<u32>,
    pub logits: Vec<f32>,
    pub chunked_logits: Vec<f32>,
    pub greedy: Vec<u32>,
    pub vocab: usize,
}

pub fn expected(dir: &Path) -> Expected {
    let ck = Checkpoint::open_files(&[dir.join("expected.safetensors")]).unwrap();
    let vocab = ck.info("logits").unwrap().shape[1];
    Expected {
        prompt: ck
            .to_i64("prompt_ids")
            .unwrap()
            .iter()
            .map(|&t| t as u32)
            .collect(),
        logits: ck.to_f32("logits").unwrap(),
        chunked_logits: ck.to_f32("chunked_logits").unwrap(),
        greedy: ck
            .to_i64("greedy_ids")
            .unwrap()
            .iter()
            .map(|&t| t as u32)
            .collect(),
        vocab,
    }
}

/// Largest per-row error relative to the row's largest |reference| value.
pub fn max_row_rel_err(got: &[f32], want: &[f32], width: usize) -> f32 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    got.chunks(width)
        .zip(want.chunks(width))
        .map(|(g, w)| {
            let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let err = g
                .iter()
                .zip(w)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            err / scale
        })
        .fold(0.0f32, f32::max)
}

/// A fresh temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "graphrun-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub mod gpu;

/// A random checkpoint of the repo's `config` (a path under the repo) with bf16 matrices and
/// routed experts in `experts`, written by synth to a fresh directory.
pub fn synth_bf16(
    config: &str,
    tag: &str,
    experts: graphrun::synth::ExpertFormat,
    seed: u64,
) -> PathBuf {
    let text = std::fs::read_to_string(repo().join(config)).unwrap();
    let plan = graphrun::plan::ModelPlan::from_json_str(&text, config).unwrap();
    let dir = temp_dir(tag);
    let opts = graphrun::synth::SynthOptions {
        dtype: graphrun::synth::SynthDtype::Bf16,
        seed,
        shard_bytes: 1 << 30,
        experts,
        sparse: false,
    };
    graphrun::synth::write(&plan, &text, &dir, &opts).unwrap();
    dir
}

/// Every tensor of one safetensors file, owned (for tests that edit a checkpoint and write it
/// back).
pub fn read_tensors(file: &Path) -> Vec<graphrun::checkpoint::TensorData<'static>> {
    let ck = Checkpoint::open_files(&[file.to_path_buf()]).unwrap();
    ck.names()
        .map(|n| {
            let info = ck.info(n).unwrap();
            graphrun::checkpoint::TensorData {
                name: n.to_string(),
                dtype: info.dtype,
                shape: info.shape,
                bytes: std::borrow::Cow::Owned(ck.bytes(n).unwrap().to_vec()),
            }
        })
        .collect()
}
