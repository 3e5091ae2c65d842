//! `graphrun synth` writes a tensor at a time: the files are those the in-memory writer made
//! (pinned by hash for a seed), `--sparse` leaves the bulk tensors as holes in files of the same
//! sizes that still load and run, and a write that cannot be made names its path.

mod common;

use std::borrow::Cow;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use graphrun::checkpoint::{self, Checkpoint, TensorData};
use graphrun::ir::LogitsMode;
use graphrun::plan::ModelPlan;
use graphrun::runtime::{Model, ModelOptions};
use graphrun::synth::{self, ExpertFormat, SynthDtype, SynthOptions};

const TINY: &str = "models/tiny-qwen4exp/config.json";
const COMPOSITE: &str = "tests/fixtures/tiny-composite-bf16/config.json";

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

fn plan_of(config: &str) -> (ModelPlan, String) {
    let text = std::fs::read_to_string(common::repo().join(config)).unwrap();
    (ModelPlan::from_json_str(&text, config).unwrap(), text)
}

fn synth_into(config: &str, tag: &str, opts: &SynthOptions) -> PathBuf {
    let (plan, text) = plan_of(config);
    let dir = common::temp_dir(tag);
    synth::write(&plan, &text, &dir, opts).unwrap();
    dir
}

/// The safetensors files of `dir`, sorted.
fn shards(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files
}

/// 64-bit FNV-1a: a pin on a file's bytes without a hashing crate.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The files of the streaming writer are those the in-memory writer wrote before it, byte for
/// byte (hashes taken from that writer's output for these seeds; the NVFP4 cases' since synth
/// writes their n-gram table whole, as the NVFP4 release does), and those `write_safetensors`
/// writes from the same tensors.
#[test]
fn streaming_keeps_the_files_of_a_seed() {
    let opts = |dtype, seed, shard_bytes, experts| SynthOptions {
        dtype,
        seed,
        shard_bytes,
        experts,
        sparse: false,
    };
    let cases = [
        (
            TINY,
            opts(SynthDtype::F32, 4, 1 << 20, ExpertFormat::Fused),
            &[0x764dcbba674ef5a9, 0x6d5f3d27d507844e][..],
        ),
        (
            TINY,
            opts(SynthDtype::Bf16, 11, 4 << 30, ExpertFormat::Nvfp4),
            &[0x7c710b5fbececf42],
        ),
        (
            TINY,
            opts(SynthDtype::F32, 2, 1 << 20, ExpertFormat::Nvfp4),
            &[0x2619cfa2dabc500b],
        ),
        (
            COMPOSITE,
            opts(SynthDtype::F16, 5, 4 << 30, ExpertFormat::Fused),
            &[0x2d26e6e3815d905a],
        ),
        (
            COMPOSITE,
            opts(SynthDtype::Bf16, 9, 1 << 20, ExpertFormat::Fused),
            &[0x9e6c5d873c38135c],
        ),
    ];
    for (config, opts, hashes) in cases {
        let dir = synth_into(config, "synth-pin", &opts);
        let files = shards(&dir);
        let found: Vec<u64> = files
            .iter()
            .map(|f| fnv1a(&std::fs::read(f).unwrap()))
            .collect();
        assert_eq!(found, hashes, "{config} {opts:?}");
        // The n-gram table: whole as the NVFP4 release stores it, in pieces as the bf16 one.
        let names: Vec<String> = Checkpoint::open_files(&files)
            .unwrap()
            .names()
            .map(str::to_string)
            .collect();
        let whole = names.iter().any(|n| n.ends_with("ngram_embedding.weight"));
        let pieces = names.iter().any(|n| n.contains("ngram_embedding.shard_"));
        let nvfp4 = opts.experts == ExpertFormat::Nvfp4;
        assert!(
            whole == nvfp4 && pieces != nvfp4,
            "{config} {opts:?}: whole {whole}, pieces {pieces}"
        );

        // The same tensors through the in-memory writer give the same files.
        let again = common::temp_dir("synth-pin-again");
        for f in &files {
            let ck = Checkpoint::open_files(std::slice::from_ref(f)).unwrap();
            let tensors: Vec<TensorData> = ck
                .names()
                .map(|n| {
                    let info = ck.info(n).unwrap();
                    TensorData {
                        name: n.to_string(),
                        dtype: info.dtype,
                        shape: info.shape,
                        bytes: Cow::Borrowed(ck.bytes(n).unwrap()),
                    }
                })
                .collect();
            let copy = again.join(f.file_name().unwrap());
            checkpoint::write_safetensors(&copy, &tensors, None).unwrap();
            assert_eq!(std::fs::read(f).unwrap(), std::fs::read(&copy).unwrap());
        }
    }
}

/// A sparse checkpoint of the tiny model, fused or NVFP4: the same files, headers and sizes as
/// the dense one of its seed; bulk tensors read as zeros and take no disk; the rest holds the
/// dense checkpoint's values (NVFP4 global scales excepted: finite and positive); it passes
/// `graphrun inspect` and runs on the CPU with finite logits.
#[test]
fn sparse_checkpoints_keep_the_layout_and_run() {
    for experts in [ExpertFormat::Fused, ExpertFormat::Nvfp4] {
        let opts = SynthOptions {
            dtype: SynthDtype::Bf16,
            seed: 6,
            shard_bytes: 64 << 10,
            experts,
            sparse: false,
        };
        let dense = synth_into(TINY, "synth-dense", &opts);
        let sparse = synth_into(
            TINY,
            "synth-sparse",
            &SynthOptions {
                sparse: true,
                ..opts.clone()
            },
        );
        let (dense_files, sparse_files) = (shards(&dense), shards(&sparse));
        assert!(dense_files.len() > 1, "several files");
        let names = |fs: &[PathBuf]| -> Vec<PathBuf> {
            fs.iter().map(|f| f.file_name().unwrap().into()).collect()
        };
        assert_eq!(names(&dense_files), names(&sparse_files));
        let (mut dense_blocks, mut sparse_blocks) = (0, 0);
        for (d, s) in dense_files.iter().zip(&sparse_files) {
            let (dm, sm) = (d.metadata().unwrap(), s.metadata().unwrap());
            assert_eq!(dm.len(), sm.len(), "{}", s.display());
            dense_blocks += dm.blocks();
            sparse_blocks += sm.blocks();
            let (db, sb) = (std::fs::read(d).unwrap(), std::fs::read(s).unwrap());
            let header = 8 + u64::from_le_bytes(db[..8].try_into().unwrap()) as usize;
            assert_eq!(db[..header], sb[..header], "{}: same header", s.display());
        }
        assert_eq!(
            std::fs::read(dense.join("model.safetensors.index.json")).unwrap(),
            std::fs::read(sparse.join("model.safetensors.index.json")).unwrap()
        );
        assert!(
            sparse_blocks < dense_blocks,
            "{experts:?}: holes take no disk ({sparse_blocks} vs {dense_blocks} blocks)"
        );

        let (d, s) = (
            Checkpoint::open_dir(&dense).unwrap(),
            Checkpoint::open_dir(&sparse).unwrap(),
        );
        let mut holes = 0;
        for name in s.names() {
            let info = s.info(name).unwrap();
            let bytes = s.bytes(name).unwrap();
            if info.shape.len() >= 2 && !name.ends_with("conv1d.weight") {
                assert!(bytes.iter().all(|&b| b == 0), "{name} is a hole");
                holes += 1;
            } else if name.ends_with("weight_scale_2") {
                let g = s.to_f32(name).unwrap()[0];
                assert!(g.is_finite() && g > 0.0, "{name} = {g}");
            } else {
                assert_eq!(bytes, d.bytes(name).unwrap(), "{name} as in the dense file");
            }
        }
        assert!(holes > 10, "{experts:?}: {holes} holes");

        let (ok, stdout, stderr) = graphrun(&["inspect", "--model", sparse.to_str().unwrap()]);
        assert!(ok, "{stderr}");
        assert!(stdout.contains("contract holds"), "{stdout}");
        let model = Model::load(&sparse, ModelOptions::default()).unwrap();
        let logits = model
            .session()
            .prefill(&[3, 9, 4, 1, 7], LogitsMode::All)
            .unwrap();
        assert!(!logits.data.is_empty());
        assert!(logits.data.iter().all(|v| v.is_finite()), "{experts:?}");
        let _ = std::fs::remove_dir_all(&dense);
        let _ = std::fs::remove_dir_all(&sparse);
    }
}

/// Written again into the same directory as one file, a checkpoint drops the index of an
/// earlier sharded one (it would shadow the new file).
#[test]
fn a_single_file_drops_a_stale_index() {
    let (plan, text) = plan_of(TINY);
    let dir = common::temp_dir("synth-stale-index");
    let sharded = SynthOptions {
        shard_bytes: 64 << 10,
        ..SynthOptions::default()
    };
    synth::write(&plan, &text, &dir, &sharded).unwrap();
    assert!(dir.join("model.safetensors.index.json").exists());
    synth::write(&plan, &text, &dir, &SynthOptions::default()).unwrap();
    assert!(!dir.join("model.safetensors.index.json").exists());
    let ck = Checkpoint::open_dir(&dir).unwrap();
    assert_eq!(ck.files(), [dir.join("model.safetensors")]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Off a terminal (as here) the progress bar draws nothing: stderr holds the one closing line.
#[test]
fn cli_sparse_prints_one_line() {
    let dir = common::temp_dir("synth-cli-sparse");
    let (ok, stdout, stderr) = graphrun(&[
        "synth",
        "--config",
        TINY,
        "--out",
        dir.to_str().unwrap(),
        "--dtype",
        "bf16",
        "--experts",
        "nvfp4",
        "--sparse",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "wrote a random bf16 sparse checkpoint to {}\n",
            dir.display()
        )
    );
    let (ok, stdout, stderr) = graphrun(&["inspect", "--model", dir.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("stored as nvfp4"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory that cannot be made, or a file that cannot be put in place, is an error naming
/// the path; nothing is left under a temporary or the final name.
#[test]
fn unwritable_places_are_named() {
    let (plan, text) = plan_of(TINY);
    let root = common::temp_dir("synth-unwritable");
    let file = root.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_a_file = file.join("model");
    let e = synth::write(&plan, &text, &under_a_file, &SynthOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(&under_a_file.display().to_string()), "{e}");

    // A directory where the safetensors file goes: everything else is written, that fails.
    let out = root.join("blocked");
    let blocked = out.join("model.safetensors");
    std::fs::create_dir_all(&blocked).unwrap();
    let e = synth::write(&plan, &text, &out, &SynthOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&blocked.display().to_string()) && e.contains("cannot write file"),
        "{e}"
    );
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
    assert!(std::fs::read_dir(&blocked).unwrap().next().is_none());

    let (ok, _, stderr) = graphrun(&[
        "synth",
        "--config",
        TINY,
        "--out",
        under_a_file.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains(&under_a_file.display().to_string()),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The real config (composite, NVFP4 experts, bf16, sparse): written quickly in little disk,
/// its tensors pass the loader's contract check (headers and scalars; the model is far too
/// large to widen here), and it holds the NVFP4 release's text tensors (296,347 = these
/// 296,110 - 127 for the one-piece n-gram table the release stores + 31 `mtp.*` + 333
/// `model.visual.*`). Minutes of I/O and ~370 MB of disk: run by hand with `--ignored`.
#[test]
#[ignore]
fn real_config_sparse() {
    let (plan, text) = plan_of("tests/data/configs/qwen3.8-flash-next.json");
    let dir = common::temp_dir("synth-real-sparse");
    let opts = SynthOptions {
        dtype: SynthDtype::Bf16,
        seed: 0,
        shard_bytes: 4 << 30,
        experts: ExpertFormat::Nvfp4,
        sparse: true,
    };
    let start = std::time::Instant::now();
    synth::write(&plan, &text, &dir, &opts).unwrap();
    let took = start.elapsed();
    let (mut apparent, mut disk) = (0u64, 0u64);
    for e in std::fs::read_dir(&dir).unwrap() {
        let m = e.unwrap().metadata().unwrap();
        apparent += m.len();
        disk += m.blocks() * 512;
    }
    eprintln!(
        "real sparse: {:.1} s, {} MiB on disk, {} GiB apparent",
        took.as_secs_f64(),
        disk >> 20,
        apparent >> 30
    );
    assert!(took.as_secs() < 60, "{took:?}");
    assert!(disk < 1 << 30, "{disk} bytes on disk");

    let ck = Checkpoint::open_dir(&dir).unwrap();
    assert_eq!(ck.len(), 296_110);
    let quant = graphrun::quant::QuantConfig::from_model_dir(&dir).unwrap();
    let probe = graphrun::lower::lower(
        &plan,
        &graphrun::lower::GraphSet::embedded().unwrap(),
        &graphrun::lower::LowerOptions::new(graphrun::ir::Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap();
    graphrun::weights::check_sizes(&plan, &ck, "real").unwrap();
    let resolved = graphrun::weights::check_contract(
        &ck,
        "real",
        &probe.program.weights,
        &probe.program.consts,
        plan.moe.num_experts,
        quant.as_ref(),
    )
    .unwrap();
    assert_eq!(resolved.float_dtype, "bf16");
    let _ = std::fs::remove_dir_all(&dir);
}
