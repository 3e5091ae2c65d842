//! Bad inputs give a clear error, never a panic: broken checkpoints, invalid configs, malformed
//! graph files, bad token ids and bad command-line settings. Each case copies a model (or the
//! graph files) into a temporary directory, breaks one thing, and checks both the CLI (exit status,
//! `error:` prefix, no panic, the message naming the culprit) and, where natural, the library.

mod common;

use std::borrow::Cow;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use graphrun::checkpoint::{self, Checkpoint, DType, TensorData};
use graphrun::exec::CpuExecutor;
use graphrun::ir::LogitsMode;
use graphrun::passes::schedule::RuleOverride;
use graphrun::plan::ModelPlan;
use graphrun::runtime::{Model, ModelOptions, Session};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn demo() -> PathBuf {
    common::repo().join("models/tiny-qwen4exp")
}

/// A session on the CPU executor, whose state a test can compare before and after a call.
fn cpu_session(model: &Model) -> Session<'_, CpuExecutor<'_>> {
    Session::with_executor(model, CpuExecutor::new(&model.weights))
}

fn graphrun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_graphrun"))
        .args(args)
        .output()
        .expect("spawn graphrun")
}

fn graphrun_os<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_graphrun"))
        .args(args)
        .output()
        .expect("spawn graphrun")
}

/// The command failed cleanly: non-zero exit, no panic, stderr starts with `error:` and contains
/// every one of `needles`. Returns stderr.
#[track_caller]
fn assert_fails(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "graphrun panicked:\n{stderr}");
    assert!(
        out.status.code().is_some(),
        "killed by a signal: {:?}\n{stderr}",
        out.status
    );
    assert!(
        stderr.starts_with("error:"),
        "stderr does not start with `error:`:\n{stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}:\n{stderr}");
    }
    stderr
}

#[track_caller]
fn assert_ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "expected success; stderr:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The Display text of `Model::load`'s error (the model must not load).
#[track_caller]
fn load_err(dir: &Path) -> String {
    load_err_with(dir, ModelOptions::default())
}

#[track_caller]
fn load_err_with(dir: &Path, options: ModelOptions) -> String {
    match Model::load(dir, options) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn assert_contains(text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "{n:?} not in:\n{text}");
    }
}

/// A copy of a model directory (plain files only; `expected.safetensors` is left out so it can
/// never be mistaken for a weight file).
fn copy_model(src: &Path, tag: &str) -> PathBuf {
    let dst = common::temp_dir(tag);
    for entry in fs::read_dir(src).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap();
        if p.is_file() && name != "expected.safetensors" {
            fs::copy(&p, dst.join(name)).unwrap();
        }
    }
    dst
}

fn copy_tree(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for entry in fs::read_dir(src).unwrap() {
        let p = entry.unwrap().path();
        let to = dst.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &to);
        } else {
            fs::copy(&p, &to).unwrap();
        }
    }
}

/// Reads every tensor of one safetensors file, lets `edit` change the list, and writes it back.
fn rewrite_tensors(file: &Path, edit: impl FnOnce(&mut Vec<TensorData<'static>>)) {
    let metadata = Checkpoint::open_files(&[file.to_path_buf()])
        .unwrap()
        .file_metadata(0)
        .cloned();
    let mut tensors = common::read_tensors(file);
    edit(&mut tensors);
    checkpoint::write_safetensors(file, &tensors, metadata.as_ref()).unwrap();
}

fn remove_tensors(tensors: &mut Vec<TensorData<'static>>, names: &[&str]) {
    let before = tensors.len();
    tensors.retain(|t| !names.contains(&t.name.as_str()));
    assert_eq!(
        before - tensors.len(),
        names.len(),
        "not all of {names:?} exist"
    );
}

fn tensor_mut<'a>(
    tensors: &'a mut [TensorData<'static>],
    name: &str,
) -> &'a mut TensorData<'static> {
    tensors
        .iter_mut()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

/// Edits `dir/config.json` as JSON.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(v.as_object_mut().unwrap());
    fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

const NORM: &str = "model.layers.0.linear_attn.norm.weight";
const DT_BIAS: &str = "model.layers.0.linear_attn.dt_bias";

// ---------------------------------------------------------------------------------------------
// Positive: help
// ---------------------------------------------------------------------------------------------

#[test]
fn help_succeeds_for_every_command() {
    let top = assert_ok(&graphrun(&["--help"]));
    for cmd in ["run", "logits", "lower", "inspect", "synth"] {
        assert!(top.contains(cmd), "top-level help lacks {cmd}:\n{top}");
        let out = assert_ok(&graphrun(&[cmd, "--help"]));
        assert!(out.contains("Usage"), "{cmd} --help:\n{out}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Missing tensors
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_tensor_is_named() {
    let dir = copy_model(&demo(), "missing-tensor");
    let file = dir.join("model.safetensors");
    rewrite_tensors(&file, |t| remove_tensors(t, &[NORM]));
    let err = load_err(&dir);
    assert_contains(
        &err,
        &[&format!("missing {NORM}"), &s(&dir), "1 problem(s)"],
    );
    for cmd in ["inspect", "run"] {
        let mut args = vec![cmd, "--model", dir.to_str().unwrap()];
        if cmd == "run" {
            args.extend(["--prompt-ids", "5,6"]);
        }
        assert_fails(&graphrun(&args), &[&format!("missing {NORM}")]);
    }
}

#[test]
fn two_missing_tensors_are_both_listed() {
    let dir = copy_model(&demo(), "missing-two");
    let file = dir.join("model.safetensors");
    rewrite_tensors(&file, |t| remove_tensors(t, &[NORM, DT_BIAS]));
    let err = load_err(&dir);
    assert_contains(
        &err,
        &[
            &format!("missing {NORM}"),
            &format!("missing {DT_BIAS}"),
            "2 problem(s)",
        ],
    );
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&format!("missing {NORM}"), &format!("missing {DT_BIAS}")],
    );
}

#[test]
fn missing_per_expert_tensor_is_reported() {
    let dir = copy_model(&demo(), "missing-expert");
    let gone = "model.layers.0.mlp.experts.2.up_proj.weight";
    rewrite_tensors(&dir.join("model.safetensors"), |t| {
        remove_tensors(t, &[gone])
    });
    let err = load_err(&dir);
    // The canonical fused weight is named, and the per-expert pattern that was looked for.
    assert_contains(
        &err,
        &[
            "missing model.layers.0.mlp.experts.gate_up_proj",
            "model.layers.0.mlp.experts.{0..4}.{gate,up}_proj.weight",
        ],
    );
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &["model.layers.0.mlp.experts.gate_up_proj"],
    );
}

#[test]
fn missing_tensor_in_sharded_checkpoint_names_tensor_and_shard() {
    let src = common::repo().join("tests/fixtures/tiny-composite-bf16");
    let dir = copy_model(&src, "missing-shard-tensor");
    let shard = dir.join("model-00001-of-00002.safetensors");
    let victim = {
        let ck = Checkpoint::open_files(std::slice::from_ref(&shard)).unwrap();
        let n = ck
            .names()
            .find(|n| n.ends_with("norm.weight"))
            .unwrap()
            .to_string();
        n
    };
    rewrite_tensors(&shard, |t| remove_tensors(t, &[&victim]));
    let err = load_err(&dir);
    assert_contains(&err, &[&victim, "model-00001-of-00002.safetensors"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&victim, "model-00001-of-00002.safetensors"],
    );
}

#[test]
fn missing_ngram_shard_is_reported() {
    let dir = copy_model(&demo(), "missing-ngram-shard");
    let gone = "model.layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight";
    rewrite_tensors(&dir.join("model.safetensors"), |t| {
        remove_tensors(t, &[gone])
    });
    let want = ["model.layers.1.ple.ple_embedding.ngram_embedding", gone];
    assert_contains(&load_err(&dir), &want);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &want,
    );
}

/// With one per-expert tensor gone, the error names that tensor, not just the fused weight.
#[test]
fn missing_per_expert_tensor_is_named_exactly() {
    let dir = copy_model(&demo(), "missing-expert-exact");
    let gone = "model.layers.0.mlp.experts.2.up_proj.weight";
    rewrite_tensors(&dir.join("model.safetensors"), |t| {
        remove_tensors(t, &[gone])
    });
    assert_contains(&load_err(&dir), &[gone]);
}

/// With `shard_1` of 3 gone, the error names `shard_1` (the gap), rather than a row count.
#[test]
fn missing_ngram_shard_is_named_exactly() {
    let dir = copy_model(&demo(), "missing-ngram-shard-exact");
    let gone = "model.layers.1.ple.ple_embedding.ngram_embedding.shard_1.weight";
    rewrite_tensors(&dir.join("model.safetensors"), |t| {
        remove_tensors(t, &[gone])
    });
    assert_contains(&load_err(&dir), &[gone]);
}

fn composite_copy(tag: &str) -> PathBuf {
    copy_model(
        &common::repo().join("tests/fixtures/tiny-composite-bf16"),
        tag,
    )
}

#[test]
fn index_naming_a_missing_shard_names_index_and_shard() {
    let dir = composite_copy("index-missing-shard");
    let shard = dir.join("model-00002-of-00002.safetensors");
    fs::remove_file(&shard).unwrap();
    let want = [
        "model.safetensors.index.json",
        "model-00002-of-00002.safetensors",
        "does not exist",
    ];
    assert_contains(&load_err(&dir), &want);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &want,
    );
}

#[test]
fn malformed_index_names_file_and_line() {
    let dir = composite_copy("index-json");
    let index = dir.join("model.safetensors.index.json");
    let text = fs::read_to_string(&index).unwrap();
    fs::write(&index, &text[..text.len() / 2]).unwrap();
    let want = [s(&index), "malformed index".to_string(), "line".to_string()];
    let want: Vec<&str> = want.iter().map(|x| x.as_str()).collect();
    assert_contains(&load_err(&dir), &want);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &want,
    );
}

#[test]
fn truncated_shard_names_the_shard() {
    let dir = composite_copy("shard-truncated");
    let shard = dir.join("model-00002-of-00002.safetensors");
    let bytes = fs::read(&shard).unwrap();
    fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let want = [s(&shard), "truncated".to_string()];
    let want: Vec<&str> = want.iter().map(|x| x.as_str()).collect();
    assert_contains(&load_err(&dir), &want);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &want,
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Wrong shape
// ---------------------------------------------------------------------------------------------

#[test]
fn wrong_shape_names_tensor_found_and_expected() {
    let dir = copy_model(&demo(), "wrong-shape");
    rewrite_tensors(&dir.join("model.safetensors"), |ts| {
        let t = tensor_mut(ts, NORM);
        assert_eq!(t.shape, vec![16]);
        t.shape = vec![15];
        t.bytes = Cow::Owned(t.bytes[..15 * 4].to_vec());
    });
    let want = format!("{NORM}: shape [15], expected [16]");
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
}

#[test]
fn wrong_shape_of_expert_tensor_is_named() {
    let dir = copy_model(&demo(), "wrong-shape-expert");
    let name = "model.layers.1.mlp.experts.3.down_proj.weight";
    rewrite_tensors(&dir.join("model.safetensors"), |ts| {
        let t = tensor_mut(ts, name);
        assert_eq!(t.shape, vec![64, 16]);
        t.shape = vec![16, 64];
    });
    let want = format!("{name}: shape [16, 64], expected [64, 16]");
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Wrong dtype
// ---------------------------------------------------------------------------------------------

#[test]
fn float_tensor_stored_as_i64_is_named_with_dtype() {
    let dir = copy_model(&demo(), "dtype-i64");
    rewrite_tensors(&dir.join("model.safetensors"), |ts| {
        let t = tensor_mut(ts, NORM);
        t.dtype = DType::I64;
        t.bytes = Cow::Owned(checkpoint::i64_bytes(&[1; 16]));
    });
    let want = format!("{NORM}: dtype i64, expected f32, bf16 or f16");
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
}

#[test]
fn float_tensor_stored_as_i32_is_named_with_dtype() {
    let dir = copy_model(&demo(), "dtype-i32");
    rewrite_tensors(&dir.join("model.safetensors"), |ts| {
        // Same byte count as f32: only the dtype string differs.
        tensor_mut(ts, DT_BIAS).dtype = DType::I32;
    });
    let want = format!("{DT_BIAS}: dtype i32, expected f32, bf16 or f16");
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
        ]),
        &[&want],
    );
}

#[test]
fn int64_buffer_stored_as_float_is_named_with_dtype() {
    let dir = copy_model(&demo(), "dtype-buffer");
    let name = "model.layers.1.ple.ple_embedding.layer_multipliers";
    rewrite_tensors(&dir.join("model.safetensors"), |ts| {
        let t = tensor_mut(ts, name);
        t.dtype = DType::F32;
        t.bytes = Cow::Owned(checkpoint::f32_bytes(&[1.0; 3]));
    });
    let want = format!("{name}: dtype f32, expected i64");
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Truncated file
// ---------------------------------------------------------------------------------------------

#[test]
fn truncated_data_names_file_and_says_truncated() {
    let dir = copy_model(&demo(), "truncated");
    let file = dir.join("model.safetensors");
    let bytes = fs::read(&file).unwrap();
    fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(&dir);
    assert_contains(&err, &[&s(&file), "truncated"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), "truncated"],
    );
}

#[test]
fn file_cut_inside_header_names_file_and_says_truncated() {
    let dir = copy_model(&demo(), "truncated-header");
    let file = dir.join("model.safetensors");
    let bytes = fs::read(&file).unwrap();
    fs::write(&file, &bytes[..200]).unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), "truncated"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), "truncated"],
    );
}

#[test]
fn file_shorter_than_length_prefix_names_file() {
    let dir = copy_model(&demo(), "truncated-prefix");
    let file = dir.join("model.safetensors");
    fs::write(&file, [1u8, 2, 3]).unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), "only 3 bytes"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), "only 3 bytes"],
    );
}

#[test]
fn empty_safetensors_file_names_file() {
    let dir = copy_model(&demo(), "empty-file");
    let file = dir.join("model.safetensors");
    fs::write(&file, b"").unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), "only 0 bytes"]);
}

// ---------------------------------------------------------------------------------------------
// 5. Corrupt header
// ---------------------------------------------------------------------------------------------

#[test]
fn corrupt_header_json_names_file() {
    let dir = copy_model(&demo(), "corrupt-json");
    let file = dir.join("model.safetensors");
    let mut bytes = fs::read(&file).unwrap();
    bytes[8..16].copy_from_slice(b"}}}}}}}}");
    fs::write(&file, &bytes).unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), "corrupt header", "JSON"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), "corrupt header"],
    );
}

#[test]
fn corrupt_header_utf8_names_file() {
    let dir = copy_model(&demo(), "corrupt-utf8");
    let file = dir.join("model.safetensors");
    let mut bytes = fs::read(&file).unwrap();
    bytes[20..24].copy_from_slice(&[0xff, 0xfe, 0xfd, 0xfc]);
    fs::write(&file, &bytes).unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), "UTF-8"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), "UTF-8"],
    );
}

#[test]
fn huge_header_length_names_file() {
    let dir = copy_model(&demo(), "corrupt-len");
    let file = dir.join("model.safetensors");
    let mut bytes = fs::read(&file).unwrap();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    fs::write(&file, &bytes).unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), "header length"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), "header length"],
    );
}

#[test]
fn corrupt_header_entry_names_file_and_tensor() {
    let dir = copy_model(&demo(), "corrupt-entry");
    let file = dir.join("model.safetensors");
    let mut bytes = fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    // `"shape":[16]` of the norm weight → `"shape":"16"` (same length is not needed: pad with spaces).
    let key = format!("\"{NORM}\":");
    let at = header.find(&key).unwrap();
    let shape_at = at + header[at..].find("\"shape\":[16]").unwrap();
    let mut h = header.clone();
    h.replace_range(
        shape_at..shape_at + "\"shape\":[16]".len(),
        "\"shape\":\"16\"",
    );
    assert_eq!(h.len(), header.len());
    bytes[8..8 + n].copy_from_slice(h.as_bytes());
    fs::write(&file, &bytes).unwrap();
    assert_contains(&load_err(&dir), &[&s(&file), NORM]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&file), NORM],
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Invalid config fields
// ---------------------------------------------------------------------------------------------

/// Sets one field of the demo model's config and checks that the CLI (`inspect`, `lower`) and the
/// library name the config path and every one of `needles`.
fn bad_config(tag: &str, field: &str, value: serde_json::Value, needles: &[&str]) {
    let dir = copy_model(&demo(), tag);
    edit_config(&dir, |m| {
        m.insert(field.to_string(), value);
    });
    let cfg = s(&dir.join("config.json"));
    let mut all = vec![cfg.as_str()];
    all.extend_from_slice(needles);
    let err = ModelPlan::from_model_dir(&dir).unwrap_err().to_string();
    assert_contains(&err, &all);
    assert_contains(&load_err(&dir), &all);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &all,
    );
    assert_fails(
        &graphrun(&["lower", "--model", dir.to_str().unwrap()]),
        &all,
    );
    assert_fails(&graphrun(&["lower", "--config", &cfg]), &all);
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
        ]),
        &all,
    );
}

#[test]
fn config_hc_count_one() {
    bad_config(
        "cfg-hc",
        "hc_count",
        1.into(),
        &["field hc_count = 1", "hc_count > 1"],
    );
}

#[test]
fn config_more_experts_per_token_than_experts() {
    bad_config(
        "cfg-topk",
        "num_experts_per_tok",
        5.into(),
        &["field num_experts_per_tok = 5", "num_experts (4)"],
    );
}

#[test]
fn config_indexer_budget_not_multiple_of_compress_ratio() {
    bad_config(
        "cfg-budget",
        "indexer_budget",
        5.into(),
        &["field indexer_budget = 5", "indexer_compress_ratio (2)"],
    );
}

#[test]
fn config_indexer_kv_heads_two() {
    bad_config(
        "cfg-ikv",
        "indexer_kv_heads",
        2.into(),
        &["field indexer_kv_heads = 2", "indexer_kv_heads == 1"],
    );
}

#[test]
fn config_ple_embed_dim_not_divisible() {
    bad_config(
        "cfg-ple",
        "ple_embed_dim",
        18.into(),
        &["field ple_embed_dim = 18", "divisible"],
    );
}

#[test]
fn config_output_gate_type_relu() {
    bad_config(
        "cfg-gate",
        "output_gate_type",
        "relu".into(),
        &["field output_gate_type = \"relu\""],
    );
}

#[test]
fn config_field_of_wrong_type() {
    bad_config(
        "cfg-type",
        "hidden_size",
        "64".into(),
        &["field hidden_size = \"64\"", "expected"],
    );
}

#[test]
fn config_negative_size() {
    bad_config(
        "cfg-neg",
        "num_experts",
        (-4).into(),
        &["field num_experts = -4"],
    );
}

#[test]
fn config_layer_count_disagrees_with_layer_types() {
    bad_config(
        "cfg-layers",
        "num_hidden_layers",
        3.into(),
        &["num_hidden_layers"],
    );
}

#[test]
fn config_malformed_json_names_file_line_and_column() {
    let dir = copy_model(&demo(), "cfg-json");
    let path = dir.join("config.json");
    let text = fs::read_to_string(&path).unwrap();
    // Drop the comma after `"hc_count": 4` (line of hc_count): the parser stops on the next line.
    let line = text
        .lines()
        .position(|l| l.contains("\"hc_count\""))
        .unwrap()
        + 1;
    fs::write(
        &path,
        text.replacen("\"hc_count\": 4,", "\"hc_count\": 4", 1),
    )
    .unwrap();
    let want = format!("malformed JSON at line {}", line + 1);
    assert_contains(&load_err(&dir), &[&s(&path), &want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&s(&path), &want],
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Unknown layer type
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_layer_type_names_index_and_name() {
    let dir = copy_model(&demo(), "layer-type");
    edit_config(&dir, |m| {
        m["layer_types"][2] = "sliding_attention".into();
    });
    let cfg = s(&dir.join("config.json"));
    let needles = [
        cfg.as_str(),
        "layer_types[2]",
        "\"sliding_attention\"",
        "layer 2",
    ];
    assert_contains(&load_err(&dir), &needles);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &needles,
    );
    assert_fails(&graphrun(&["lower", "--config", &cfg]), &needles);
}

// ---------------------------------------------------------------------------------------------
// 8. Token ids
// ---------------------------------------------------------------------------------------------

#[test]
fn cli_token_id_out_of_range_names_id_and_position() {
    let model = demo();
    for cmd in ["run", "logits"] {
        let out_file = common::temp_dir("ids-range").join("logits.safetensors");
        let mut args = vec![
            cmd,
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "5,999999",
        ];
        if cmd == "logits" {
            args.extend(["--out", out_file.to_str().unwrap()]);
        }
        assert_fails(
            &graphrun(&args),
            &["token id 999999 at position 1", "out of range", "256"],
        );
        assert!(!out_file.exists(), "{cmd}: wrote {}", out_file.display());
    }
}

#[test]
fn cli_vocab_size_id_is_out_of_range() {
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            demo().to_str().unwrap(),
            "--prompt-ids",
            "256",
        ]),
        &["token id 256 at position 0"],
    );
}

#[test]
fn cli_non_numeric_token_id_names_it_and_its_position() {
    let model = demo();
    for ids in ["5,x", "5,-1", "5,1.5", "5,", "5,99999999999"] {
        let bad = ids.split(',').nth(1).unwrap();
        let want = format!("`{bad}` at position 1 is not a token id");
        assert_fails(
            &graphrun(&[
                "run",
                "--model",
                model.to_str().unwrap(),
                "--prompt-ids",
                ids,
            ]),
            &["--prompt-ids", &want],
        );
    }
    let out = common::temp_dir("ids-nan").join("l.safetensors");
    assert_fails(
        &graphrun(&[
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "5,x",
            "--out",
            out.to_str().unwrap(),
        ]),
        &["`x` at position 1 is not a token id"],
    );
}

#[test]
fn library_bad_token_leaves_session_unchanged_and_usable() {
    let model = Model::load(&demo(), ModelOptions::default()).unwrap();
    let mut session = cpu_session(&model);
    session.prefill(&[5, 6, 7], LogitsMode::Last).unwrap();
    let before = session.executor().state().clone();
    assert_eq!(session.position(), 3);

    let err = session
        .prefill(&[8, 999_999], LogitsMode::All)
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["token id 999999 at position 1", "out of range"]);
    assert_eq!(session.position(), 3);
    assert!(
        session.executor().state() == &before,
        "state changed by a refused prefill"
    );

    let err = session.decode(256).unwrap_err().to_string();
    assert_contains(&err, &["token id 256 at position 0"]);
    assert!(
        session.executor().state() == &before,
        "state changed by a refused decode"
    );

    let err = session.greedy(&[3, 256]).unwrap_err().to_string();
    assert_contains(&err, &["token id 256 at position 1"]);
    assert!(
        session.executor().state() == &before,
        "state changed by a refused greedy step"
    );

    let err = session
        .prefill(&[], LogitsMode::All)
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["no tokens"]);
    assert!(
        session.executor().state() == &before,
        "state changed by an empty prefill"
    );

    // Still works, and exactly as a fresh session fed the same good tokens.
    let got = session.prefill(&[8, 9], LogitsMode::All).unwrap();
    let mut fresh = cpu_session(&model);
    fresh.prefill(&[5, 6, 7], LogitsMode::Last).unwrap();
    let want = fresh.prefill(&[8, 9], LogitsMode::All).unwrap();
    assert_eq!(got, want);
    assert_eq!(session.position(), 5);
    assert!(session.executor().state() == fresh.executor().state());
}

#[test]
fn library_bad_token_on_fresh_session_leaves_it_fresh() {
    let model = Model::load(&demo(), ModelOptions::default()).unwrap();
    let mut session = cpu_session(&model);
    let before = session.executor().state().clone();
    assert!(session.prefill(&[1, 2, 300], LogitsMode::All).is_err());
    assert!(session.executor().state() == &before);
    assert_eq!(session.position(), 0);
    let got = session.prefill(&[1, 2, 3], LogitsMode::All).unwrap();
    let want = model
        .session()
        .prefill(&[1, 2, 3], LogitsMode::All)
        .unwrap();
    assert_eq!(got, want);
}

#[test]
fn library_over_long_context_is_refused_and_leaves_state() {
    let model = Model::load(&demo(), ModelOptions::default()).unwrap();
    let max = model.plan.max_position_embeddings;
    let mut session = cpu_session(&model);
    session.prefill(&[5, 6], LogitsMode::Last).unwrap();
    let before = session.executor().state().clone();
    let ids = vec![3u32; max - 1];
    let err = session
        .prefill(&ids, LogitsMode::Last)
        .unwrap_err()
        .to_string();
    assert_contains(&err, &[&format!("{}", max + 1), "max_position_embeddings"]);
    assert!(session.executor().state() == &before);
    assert_eq!(session.position(), 2);
}

#[test]
fn library_generate_with_bad_prompt_is_refused() {
    use graphrun::runtime::{GenerateOptions, Sampling};
    let model = Model::load(&demo(), ModelOptions::default()).unwrap();
    let mut session = model.session();
    let opts = GenerateOptions {
        max_new_tokens: 2,
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    };
    let err = session.generate(&[4, 1000], &opts).unwrap_err().to_string();
    assert_contains(&err, &["token id 1000 at position 1"]);
    assert_eq!(session.position(), 0);
    let err = session.generate(&[], &opts).unwrap_err().to_string();
    assert_contains(&err, &["no tokens"]);
}

// ---------------------------------------------------------------------------------------------
// 9. Missing config.json / model directory
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_config_names_path() {
    let dir = copy_model(&demo(), "no-config");
    let cfg = dir.join("config.json");
    fs::remove_file(&cfg).unwrap();
    let want = s(&cfg);
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
    assert_fails(
        &graphrun(&["lower", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
    assert_fails(
        &graphrun(&["run", "--model", dir.to_str().unwrap(), "--prompt-ids", "1"]),
        &[&want],
    );
    assert_fails(&graphrun(&["lower", "--config", &want]), &[&want]);
    let out = common::temp_dir("no-config-synth").join("m");
    assert_fails(
        &graphrun(&["synth", "--config", &want, "--out", out.to_str().unwrap()]),
        &[&want],
    );
}

#[test]
fn missing_model_dir_names_path() {
    let dir = common::temp_dir("no-model").join("does-not-exist");
    let want = s(&dir);
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(&graphrun(&["inspect", "--model", &want]), &[&want]);
}

#[test]
fn missing_weights_names_dir() {
    let dir = copy_model(&demo(), "no-weights");
    fs::remove_file(dir.join("model.safetensors")).unwrap();
    let want = s(&dir);
    assert_contains(&load_err(&dir), &[&want, "no safetensors"]);
    assert_fails(
        &graphrun(&["inspect", "--model", &want]),
        &[&want, "no safetensors"],
    );
}

#[test]
fn missing_tokenizer_names_path() {
    let dir = copy_model(&demo(), "no-tokenizer");
    fs::remove_file(dir.join("tokenizer.json")).unwrap();
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "the cat",
        ]),
        &[&s(&dir.join("tokenizer.json"))],
    );
}

#[test]
fn corrupt_tokenizer_names_path() {
    let dir = copy_model(&demo(), "bad-tokenizer");
    let tok = dir.join("tokenizer.json");
    fs::write(&tok, "{ not json").unwrap();
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "the cat",
        ]),
        &[&format!("tokenizer {}", tok.display())],
    );
}

#[test]
fn logits_into_missing_directory_names_path() {
    let out = common::temp_dir("logits-out").join("no/such/dir/l.safetensors");
    assert_fails(
        &graphrun(&[
            "logits",
            "--model",
            demo().to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--out",
            out.to_str().unwrap(),
        ]),
        &[&s(&out)],
    );
}

// ---------------------------------------------------------------------------------------------
// 10. Malformed RON in graph files
// ---------------------------------------------------------------------------------------------

/// Where a RON mistake was made: the copied graphs dir, the edited file, and the 1-based line
/// and column at which `from` started.
struct Broken {
    graphs: PathBuf,
    path: PathBuf,
    line: usize,
    col: usize,
}

/// A copy of the repository's `graphs/` where `file` has its first `from` replaced by `to`.
fn broken_graphs(tag: &str, file: &str, from: &str, to: &str) -> Broken {
    let graphs = common::temp_dir(tag).join("graphs");
    copy_tree(&common::repo().join("graphs"), &graphs);
    let path = graphs.join(file);
    let text = fs::read_to_string(&path).unwrap();
    let at = text
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} not in {file}"));
    let line = text[..at].matches('\n').count() + 1;
    let col = at - text[..at].rfind('\n').map_or(0, |i| i + 1) + 1;
    fs::write(&path, text.replacen(from, to, 1)).unwrap();
    Broken {
        graphs,
        path,
        line,
        col,
    }
}

fn lower_with_graphs(graphs: &Path) -> Output {
    let cfg = demo().join("config.json");
    graphrun_os(&[
        "--graphs".as_ref(),
        graphs.as_os_str(),
        "lower".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
    ])
}

/// `lower`, `run` and `Model::load` with `--graphs DIR` fail naming `path:line:col`; the column
/// is checked when `col` is given. Returns the CLI's stderr.
fn assert_ron_error(graphs: &Path, path: &Path, line: usize, col: Option<usize>) -> String {
    let want = format!("{}:{line}:", path.display());
    let stderr = assert_fails(&lower_with_graphs(graphs), &[&want]);
    let rest = &stderr[stderr.find(&want).unwrap() + want.len()..];
    let found_col: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    assert!(!found_col.is_empty(), "no column after {want}: {stderr}");
    if let Some(col) = col {
        assert_eq!(found_col, col.to_string(), "column in: {stderr}");
    }
    let options = ModelOptions {
        graphs_dir: Some(graphs.to_path_buf()),
        ..Default::default()
    };
    assert_contains(&load_err_with(&demo(), options), &[&want]);
    let out = graphrun_os(&[
        "--graphs".as_ref(),
        graphs.as_os_str(),
        "run".as_ref(),
        "--model".as_ref(),
        demo().as_os_str(),
        "--prompt-ids".as_ref(),
        "1,2".as_ref(),
    ]);
    assert_fails(&out, &[&want]);
    stderr
}

#[test]
fn unmodified_graphs_copy_lowers() {
    let graphs = common::temp_dir("graphs-ok").join("graphs");
    copy_tree(&common::repo().join("graphs"), &graphs);
    assert_ok(&lower_with_graphs(&graphs));
}

#[test]
fn rules_ron_misspelled_field_names_file_line_and_column() {
    let b = broken_graphs(
        "ron-rules-field",
        "rules.ron",
        "priority: 10",
        "priorty: 10",
    );
    let stderr = assert_ron_error(&b.graphs, &b.path, b.line, Some(b.col));
    assert_contains(&stderr, &["`priorty`", "`priority`"]);
}

#[test]
fn rules_ron_missing_paren_names_file_and_line() {
    // `when: (device: Cpu, tokens: (max: 1)),` → `... (max: 1),`: the predicate goes on into
    // the next line, where `variant` is the first token that cannot belong to it.
    let b = broken_graphs("ron-rules-paren", "rules.ron", "(max: 1)),", "(max: 1),");
    let stderr = assert_ron_error(&b.graphs, &b.path, b.line + 1, None);
    assert_contains(&stderr, &["`variant`", "When"]);
}

#[test]
fn rules_ron_missing_quote_names_file_and_line() {
    let b = broken_graphs(
        "ron-rules-string",
        "rules.ron",
        "op: \"moe_experts\",",
        "op: moe_experts\",",
    );
    assert_ron_error(&b.graphs, &b.path, b.line, None);
}

#[test]
fn block_ron_missing_paren_names_file_and_line() {
    // The closing parenthesis of the first node: the parser notices at the next node's `(`.
    let b = broken_graphs(
        "ron-moe-paren",
        "qwen4exp/moe.ron",
        "weights: [\"router\"]),",
        "weights: [\"router\"],",
    );
    assert_ron_error(&b.graphs, &b.path, b.line + 1, None);
}

#[test]
fn block_ron_misspelled_op_names_file_line_and_column() {
    let b = broken_graphs(
        "ron-moe-op",
        "qwen4exp/moe.ron",
        "Silu, args",
        "Siluu, args",
    );
    let stderr = assert_ron_error(&b.graphs, &b.path, b.line, Some(b.col));
    assert_contains(&stderr, &["`Siluu`", "`Silu`"]);
}

#[test]
fn block_ron_misspelled_field_names_file_line_and_column() {
    let b = broken_graphs(
        "ron-moe-field",
        "qwen4exp/moe.ron",
        "out: [\"shared_g\"]",
        "uot: [\"shared_g\"]",
    );
    let stderr = assert_ron_error(&b.graphs, &b.path, b.line, Some(b.col));
    assert_contains(&stderr, &["`uot`"]);
}

#[test]
fn block_ron_misspelled_op_parameter_names_file_and_line() {
    let b = broken_graphs(
        "ron-moe-param",
        "qwen4exp/moe.ron",
        "intermediate: \"I\")",
        "intermediat: \"I\")",
    );
    let stderr = assert_ron_error(&b.graphs, &b.path, b.line, None);
    assert_contains(&stderr, &["`intermediate`", "MoeExperts"]);
}

/// An unknown parameter inside an op (`MoeRouter(top_k: "k", topk: 3)`) is refused with its
/// file, line and name, not silently dropped.
#[test]
fn block_ron_unknown_op_parameter_is_refused() {
    let b = broken_graphs(
        "ron-moe-extra",
        "qwen4exp/moe.ron",
        "MoeRouter(top_k: \"k\")",
        "MoeRouter(top_k: \"k\", topk: 3)",
    );
    let stderr = assert_ron_error(&b.graphs, &b.path, b.line, None);
    assert_contains(&stderr, &["`topk`"]);
}

#[test]
fn missing_graphs_dir_names_path() {
    let graphs = common::temp_dir("graphs-missing").join("nope");
    assert_fails(&lower_with_graphs(&graphs), &[&s(&graphs)]);
}

#[test]
fn missing_rules_file_names_path() {
    let graphs = common::temp_dir("graphs-norules").join("graphs");
    copy_tree(&common::repo().join("graphs"), &graphs);
    fs::remove_file(graphs.join("rules.ron")).unwrap();
    assert_fails(
        &lower_with_graphs(&graphs),
        &[&s(&graphs.join("rules.ron"))],
    );
}

// ---------------------------------------------------------------------------------------------
// 11. Rule overrides
// ---------------------------------------------------------------------------------------------

fn lower_with_rule(rule: &str) -> Output {
    let cfg = demo().join("config.json");
    graphrun(&["lower", "--config", cfg.to_str().unwrap(), "--rule", rule])
}

#[test]
fn unknown_rule_override_is_named_with_choices() {
    let needles = [
        "--rule nope=rows",
        "no rule named `nope`",
        "linear.decode_rows",
        "linear.prefill_tiled",
        "moe.prefill_expert_major",
    ];
    assert_fails(&lower_with_rule("nope=rows"), &needles);
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            demo().to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--rule",
            "nope=rows",
        ]),
        &needles,
    );
}

#[test]
fn bad_rule_variant_is_named_with_choices() {
    let out = lower_with_rule("linear.decode_rows=fast");
    let stderr = assert_fails(
        &out,
        &[
            "linear.decode_rows=fast",
            "no variant `fast`",
            "variants:",
            "rows",
            "tiled",
        ],
    );
    assert!(!stderr.contains("no rule named"), "{stderr}");
    assert_fails(
        &graphrun(&[
            "run",
            "--model",
            demo().to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--rule",
            "linear.decode_rows=fast",
        ]),
        &["no variant `fast`", "variants:"],
    );
}

#[test]
fn rule_override_without_equals_is_refused() {
    assert_fails(
        &lower_with_rule("linear.decode_rows"),
        &["--rule linear.decode_rows", "NAME=VARIANT"],
    );
}

#[test]
fn library_bad_rule_override_is_refused() {
    let options = ModelOptions {
        overrides: vec!["linear.decode_rows=fast".parse::<RuleOverride>().unwrap()],
        ..Default::default()
    };
    // The override is checked no later than the first step, and a refused step changes nothing.
    match Model::load(&demo(), options) {
        Err(e) => assert_contains(&e.to_string(), &["no variant `fast`"]),
        Ok(model) => {
            let mut session = model.session();
            let err = session
                .prefill(&[1, 2], LogitsMode::All)
                .unwrap_err()
                .to_string();
            assert_contains(&err, &["no variant `fast`", "variants:"]);
            assert_eq!(session.position(), 0);
        }
    }
    assert!("no_equals".parse::<RuleOverride>().is_err());
}

#[test]
fn unknown_fusion_is_refused() {
    let cfg = demo().join("config.json");
    let out = graphrun(&[
        "lower",
        "--config",
        cfg.to_str().unwrap(),
        "--fusions",
        "nope",
    ]);
    assert_fails(&out, &["nope"]);
}

// ---------------------------------------------------------------------------------------------
// 12. Sampling settings and other CLI values
// ---------------------------------------------------------------------------------------------

fn run_with(extra: &[&str]) -> Output {
    let model = demo();
    let mut args = vec![
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
    ];
    args.extend_from_slice(extra);
    graphrun(&args)
}

#[test]
fn temperature_zero_is_refused() {
    assert_fails(
        &run_with(&["--temperature", "0"]),
        &["--temperature 0", "> 0"],
    );
    assert_fails(&run_with(&["--temperature", "nan"]), &["--temperature NaN"]);
    assert_fails(&run_with(&["--temperature", "inf"]), &["--temperature inf"]);
}

#[test]
fn top_p_two_is_refused() {
    assert_fails(
        &run_with(&["--temperature", "1", "--top-p", "2"]),
        &["--top-p 2", "(0, 1]"],
    );
    assert_fails(
        &run_with(&["--temperature", "1", "--top-p", "0"]),
        &["--top-p 0", "(0, 1]"],
    );
}

#[test]
fn top_p_without_temperature_is_refused() {
    assert_fails(
        &run_with(&["--top-p", "0.5"]),
        &["--top-p", "--temperature"],
    );
}

#[test]
fn top_k_zero_is_refused() {
    assert_fails(
        &run_with(&["--temperature", "1", "--top-k", "0"]),
        &["--top-k 0"],
    );
}

#[test]
fn negative_temperature_is_refused() {
    assert_fails(&run_with(&["--temperature=-1"]), &["--temperature -1"]);
}

#[test]
fn bad_lower_options_are_refused() {
    let cfg = demo().join("config.json");
    let cfg = cfg.to_str().unwrap();
    assert_fails(
        &graphrun(&["lower", "--config", cfg, "--logits", "some"]),
        &["--logits some", "all or last"],
    );
    assert_fails(
        &graphrun(&[
            "lower", "--config", cfg, "--phase", "decode", "--tokens", "3",
        ]),
        &["--phase decode", "--tokens"],
    );
    assert_fails(
        &graphrun(&["lower", "--config", cfg, "--phase", "sideways"]),
        &["sideways"],
    );
    assert_fails(
        &graphrun(&["lower", "--config", cfg, "--tokens", "0"]),
        &["--tokens 0", "at least one token"],
    );
}

/// `--tokens` problems are reported as such, not as a rule override.
#[test]
fn tokens_zero_error_does_not_mention_rule() {
    let cfg = demo().join("config.json");
    let stderr = assert_fails(
        &graphrun(&["lower", "--config", cfg.to_str().unwrap(), "--tokens", "0"]),
        &["--tokens 0"],
    );
    assert!(!stderr.contains("--rule"), "{stderr}");
}

#[test]
fn bad_synth_dtype_is_refused() {
    let out = common::temp_dir("synth-dtype").join("m");
    assert_fails(
        &graphrun(&[
            "synth",
            "--config",
            demo().join("config.json").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--dtype",
            "f64",
        ]),
        &["--dtype f64", "expected f32, bf16 or f16"],
    );
}

#[test]
fn clap_usage_errors_are_clean() {
    assert_fails(&graphrun(&["frobnicate"]), &["frobnicate"]);
    assert_fails(&graphrun(&["run", "--model", "x"]), &["--prompt"]);
    assert_fails(
        &run_with(&["--max-new-tokens", "many"]),
        &["--max-new-tokens"],
    );
}

// ---------------------------------------------------------------------------------------------
// Config sizes the checkpoint does not hold
// ---------------------------------------------------------------------------------------------

/// Sets `field` of the demo model's config (which validates) and checks that loading refuses it
/// with the field, the config's value and the checkpoint's, through the library and `inspect`
/// (a clean exit, not an abort on an allocation sized from the value).
fn size_not_held(tag: &str, field: &str, value: u64, held: usize) {
    let dir = copy_model(&demo(), tag);
    edit_config(&dir, |m| {
        m.insert(field.to_string(), value.into());
    });
    let needle = format!("config.json {field} = {value}, but the checkpoint holds {held}");
    assert_contains(&load_err(&dir), &[&needle, "does not match config.json"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&needle],
    );
}

#[test]
fn huge_num_experts_is_refused_naming_the_field() {
    size_not_held("huge-experts", "num_experts", 1 << 31, 4);
}

#[test]
fn huge_hidden_size_is_refused_naming_the_field() {
    size_not_held("huge-hidden", "hidden_size", 1 << 31, 64);
}

#[test]
fn huge_vocab_size_is_refused_naming_the_field() {
    size_not_held("huge-vocab", "vocab_size", 1 << 31, 256);
}

#[test]
fn huge_expert_intermediate_sizes_are_refused_naming_the_field() {
    size_not_held("huge-moe-i", "moe_intermediate_size", 1 << 31, 16);
    size_not_held(
        "huge-shared-i",
        "shared_expert_intermediate_size",
        1 << 31,
        16,
    );
}

/// More layers than the checkpoint holds are refused before lowering (which grows with the
/// count), naming the field.
#[test]
fn more_layers_than_the_checkpoint_holds_are_refused_first() {
    let dir = copy_model(&demo(), "layers-513");
    edit_config(&dir, |m| {
        m.insert("num_hidden_layers".into(), 513.into());
        m.remove("layer_types");
    });
    let needle =
        "config.json num_hidden_layers = 513, but the checkpoint holds 4 (tensors of layers 0 to 3)";
    let err = load_err(&dir);
    assert_eq!(err.lines().count(), 2, "{err}");
    assert_contains(&err, &[needle]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[needle],
    );
}

/// The first line of a mismatch report gives the problem count: `... (N problem(s)):`.
fn problem_count(report: &str) -> usize {
    let first = report.lines().next().unwrap_or_default();
    first
        .rsplit_once(" (")
        .and_then(|(_, rest)| rest.split_once(' '))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no problem count in {first:?}"))
}

/// The contract of 40 layers against 4 (checked directly, past `check_sizes`): over a thousand
/// missing tensors, reported as the cause, the first 20 and the counts by kind.
#[test]
fn many_missing_tensors_are_summarised_with_the_cause() {
    let dir = copy_model(&demo(), "layers-40");
    edit_config(&dir, |m| {
        m.insert("num_hidden_layers".into(), 40.into());
        // The checkpoint's four layers as they are, then 36 GDN layers it lacks.
        let types = m["layer_types"].as_array_mut().unwrap();
        types.resize(40, "linear_attention".into());
    });
    let plan = ModelPlan::from_model_dir(&dir).unwrap();
    let opts = graphrun::lower::LowerOptions::new(graphrun::ir::Phase::Decode, 1, LogitsMode::Last);
    let program = graphrun::lower::lower(
        &plan,
        &graphrun::lower::GraphSet::embedded().unwrap(),
        &opts,
    )
    .unwrap()
    .program;
    let ckpt = Checkpoint::open_dir(&dir).unwrap();
    let err = graphrun::weights::check_contract(
        &ckpt,
        &s(&dir),
        &program.weights,
        &program.consts,
        plan.moe.num_experts,
        None,
    )
    .unwrap_err()
    .to_string();
    let lines: Vec<&str> = err.lines().collect();
    // Header, the cause, 20 problems, the summary.
    assert_eq!(lines.len(), 23, "{err}");
    assert_eq!(
        lines[1],
        "  cause: config.json num_hidden_layers = 40, but the checkpoint holds 4 (tensors of layers 0 to 3)"
    );
    assert!(lines[2..22]
        .iter()
        .all(|l| l.starts_with("  - missing model.layers.")));
    let total = problem_count(&err);
    // Every layer from 4 on lacks all its tensors (more than 10 each).
    assert!(total > 36 * 10, "{total}");
    assert_eq!(
        lines[22],
        format!(
            "  ... {} more not shown; by kind: {total} missing, 0 wrong shape, 0 wrong dtype, 0 wrong values, 0 wrong quantisation, 0 unexpected ({total} in all)",
            total - 20
        )
    );
}

/// Every float tensor stored as i32 (same byte size): one problem per tensor, summarised by
/// `inspect` in a report of fixed length.
#[test]
fn many_wrong_dtypes_are_summarised_by_inspect() {
    let dir = copy_model(&demo(), "all-i32");
    let file = dir.join("model.safetensors");
    let mut floats = 0;
    rewrite_tensors(&file, |t| {
        for w in t.iter_mut().filter(|w| w.dtype == DType::F32) {
            w.dtype = DType::I32;
            floats += 1;
        }
    });
    let stderr = assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[
            "does not match config.json",
            "more not shown; by kind: 0 missing, 0 wrong shape",
        ],
    );
    assert_eq!(stderr.lines().count(), 22, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{floats} wrong dtype, 0 wrong values, 0 wrong quantisation, 0 unexpected ({floats} in all)"
        )),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// Non-finite weights
// ---------------------------------------------------------------------------------------------

/// NaN and infinity in one weight of the f32 demo model: the tensor, the count and the first
/// index are named, by the library and by `inspect`.
#[test]
fn nan_in_a_weight_is_named_with_first_index_and_count() {
    let dir = copy_model(&demo(), "nan-f32");
    let file = dir.join("model.safetensors");
    let name = "model.layers.0.linear_attn.in_proj_a.weight";
    rewrite_tensors(&file, |t| {
        let w = tensor_mut(t, name);
        let mut v: Vec<f32> = w
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        v[70] = f32::NAN;
        v[100] = f32::NEG_INFINITY;
        w.bytes = Cow::Owned(checkpoint::f32_bytes(&v));
    });
    let needle = format!(
        "{name} (f32 [8, 64], in {}): 2 non-finite value(s), the first NaN at element 70 ([1, 6])",
        s(&file)
    );
    assert_contains(&load_err(&dir), &[&needle, "NaN or infinity (1 tensor(s))"]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&needle],
    );
}

/// The same for a bf16 checkpoint (an infinity in the fused experts of a composite model).
#[test]
fn inf_in_a_bf16_weight_is_named() {
    let dir = composite_copy("inf-bf16");
    let file = dir.join("model-00001-of-00002.safetensors");
    let name = "model.language_model.layers.0.mlp.experts.down_proj";
    rewrite_tensors(&file, |t| {
        let w = tensor_mut(t, name);
        assert_eq!(w.dtype, DType::BF16);
        let mut b = w.bytes.to_vec();
        b[6..8].copy_from_slice(&half::bf16::INFINITY.to_bits().to_le_bytes());
        w.bytes = Cow::Owned(b);
    });
    assert_contains(
        &load_err(&dir),
        &[&format!(
            "{name} (bf16 [8, 32, 8], in {}): 1 non-finite value(s), the first inf at element 3 ([0, 0, 3])",
            s(&file)
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// The MTP draft head
// ---------------------------------------------------------------------------------------------

/// A draft head's tensors are checked with the trunk's: a missing one and a misshaped one are
/// named on load, by inspect and by run (with or without --speculative).
#[test]
fn draft_head_tensors_are_checked_and_named() {
    let src = common::repo().join("models/tiny-qwen4exp-mtp");
    let gone = "mtp.fc_hidden.weight";
    let bent = "mtp.pre_fc_norm_hidden.weight";
    let dir = copy_model(&src, "mtp-missing");
    rewrite_tensors(&dir.join("model.safetensors"), |t| {
        remove_tensors(t, &[gone])
    });
    assert_contains(&load_err(&dir), &[&format!("missing {gone}")]);
    for extra in [&[][..], &["--speculative"][..]] {
        let mut args = vec![
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "5,6",
        ];
        args.extend(extra);
        assert_fails(&graphrun(&args), &[&format!("missing {gone}")]);
    }
    let dir = copy_model(&src, "mtp-shape");
    rewrite_tensors(&dir.join("model.safetensors"), |ts| {
        let t = tensor_mut(ts, bent);
        assert_eq!(t.shape, vec![256]);
        t.shape = vec![64];
        t.bytes = Cow::Owned(t.bytes[..64 * 4].to_vec());
    });
    let want = format!("{bent}: shape [64], expected [256]");
    assert_contains(&load_err(&dir), &[&want]);
    assert_fails(
        &graphrun(&["inspect", "--model", dir.to_str().unwrap()]),
        &[&want],
    );
}

/// `mtp.*` tensors with a config that declares no draft layers load as the trunk alone, and
/// `--speculative` says why it is unavailable.
#[test]
fn draft_head_without_its_config_field_is_unused_and_named() {
    let dir = copy_model(
        &common::repo().join("models/tiny-qwen4exp-mtp"),
        "mtp-no-field",
    );
    edit_config(&dir, |c| {
        c.remove("mtp_num_hidden_layers");
    });
    let out = assert_ok(&graphrun(&["inspect", "--model", dir.to_str().unwrap()]));
    assert_contains(
        &out,
        &["draft head: none (the config declares no MTP draft layers"],
    );
    assert_fails(
        &graphrun(&["run", "--model", dir.to_str().unwrap(), "--prompt-ids", "5,6", "--speculative"]),
        &["--speculative: speculative decoding is unavailable: the config declares no MTP draft layers"],
    );
}
