//! Mutation fuzzing of everything graphrun reads from a user: safetensors headers, config.json,
//! the RON graph files, and a whole model directory (config or checkpoint header mutated) loaded
//! and run through the library entry the CLI uses (`runtime::Model::load`, then a short
//! generation). Mutants are seeded from the repository's real files and made deterministically
//! (`fuzzing/mod.rs`: byte flips, truncations, huge numbers, swapped keys and strings, structural
//! JSON edits).
//!
//! A case passes when the code returns `Ok` or an `Err`. A panic fails the test, naming the case
//! and how it was made; an abort (an allocation above the cap, the hang watchdog) names the case
//! in the progress file under the temp dir. By default each target runs a short deterministic
//! set for CI; `GRAPHRUN_FUZZ_CASES=N` runs N cases per target (see `fuzzing/mod.rs` for the
//! other settings). A long run, one target at a time:
//!
//! ```text
//! GRAPHRUN_FUZZ_CASES=100000 nice cargo test --test fuzz -- --nocapture --test-threads 1 header
//! ```

mod common;
mod fuzzing;

use std::fs;
use std::path::{Path, PathBuf};

use graphrun::checkpoint;
use graphrun::ir::{LogitsMode, Phase};
use graphrun::lower::{self, GraphSet, LowerOptions};
use graphrun::plan::ModelPlan;
use graphrun::runtime::{GenerateOptions, Model, ModelOptions, Sampling};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use fuzzing::{mutate_json, mutate_text, number_value, Case, Outcome, Settings};

#[global_allocator]
static ALLOC: fuzzing::Capped = fuzzing::Capped;

// ---------------------------------------------------------------------------------------------
// Seeds and helpers
// ---------------------------------------------------------------------------------------------

fn repo() -> PathBuf {
    common::repo()
}

/// The model directories the seeds come from: the demo model and the parity fixtures.
fn model_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![repo().join("models/tiny-qwen4exp")];
    let mut fixtures: Vec<PathBuf> = fs::read_dir(repo().join("tests/fixtures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    fixtures.sort();
    dirs.extend(fixtures);
    dirs
}

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// An error's kind for the report: its Debug text up to the first field (`Contract(Mismatch`
/// becomes `Contract::Mismatch`).
fn label(debug: &str) -> String {
    debug
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '(' || *c == '_')
        .collect::<String>()
        .trim_end_matches('(')
        .replace('(', "::")
}

fn outcome<T, E: std::fmt::Debug>(r: Result<T, E>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(e) => Outcome::Err(label(&format!("{e:?}"))),
    }
}

/// 1 to `max` mutations, most often one.
fn how_many(rng: &mut ChaCha8Rng, max: usize) -> usize {
    if rng.random_bool(0.6) {
        1
    } else {
        rng.random_range(1..=max)
    }
}

/// A safetensors image split into its header text and what follows it.
struct Image {
    header: Vec<u8>,
    data: Vec<u8>,
}

impl Image {
    fn read(path: &Path) -> Image {
        let bytes = fs::read(path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        Image {
            header: bytes[8..8 + n].to_vec(),
            data: bytes[8 + n..].to_vec(),
        }
    }

    /// Length prefix (of the header as it now is), header, data.
    fn bytes(header: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header);
        out.extend_from_slice(data);
        out
    }
}

/// A header mutant: text or JSON edits with the length prefix kept right, raw edits of the
/// prefix and the bytes around it, truncation, and edits that keep the header valid but change
/// what it says (shapes, dtypes, names, offsets), or NaN written into the data.
fn mutate_image(rng: &mut ChaCha8Rng, seed: &Image, how: &mut Vec<String>) -> Vec<u8> {
    let mut header = seed.header.clone();
    let mut data = seed.data.clone();
    match rng.random_range(0..10) {
        0..=3 => {
            let mut v: Value = serde_json::from_slice(&header).unwrap();
            for _ in 0..how_many(rng, 3) {
                let step = if rng.random_bool(0.5) {
                    semantic_header_edit(rng, &mut v)
                } else {
                    mutate_json(rng, &mut v)
                };
                how.push(step);
            }
            header = serde_json::to_vec(&v).unwrap();
        }
        4..=6 => {
            for _ in 0..how_many(rng, 3) {
                how.push(mutate_text(rng, &mut header));
            }
        }
        7 => {
            if data.len() >= 4 {
                let at = rng.random_range(0..data.len() / 4) * 4;
                let bits: u32 =
                    *fuzz_pick(rng, &[0x7FC0_0000, 0x7F80_0000, 0xFF80_0000, 0xFFFF_FFFF]);
                data[at..at + 4].copy_from_slice(&bits.to_le_bytes());
                how.push(format!("wrote f32 bits {bits:#x} at data byte {at}"));
            }
        }
        8 => {
            let mut image = Image::bytes(&header, &data);
            let end = (8 + header.len() + 16).min(image.len());
            let mut head = image[..end].to_vec();
            for _ in 0..how_many(rng, 3) {
                how.push(format!("raw: {}", mutate_text(rng, &mut head)));
            }
            image.splice(..end, head);
            return image;
        }
        _ => {
            let mut image = Image::bytes(&header, &data);
            if rng.random_bool(0.5) {
                let n = rng.random_range(0..image.len());
                image.truncate(n);
                how.push(format!("truncated the file to {n} bytes"));
            } else {
                let v: u64 = fuzzing::number(rng)
                    .parse::<i64>()
                    .map_or(u64::MAX, |x| x as u64);
                image[..8].copy_from_slice(&v.to_le_bytes());
                how.push(format!("set the header length prefix to {v}"));
            }
            return image;
        }
    }
    Image::bytes(&header, &data)
}

fn fuzz_pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// An edit of one tensor entry that keeps the header well-formed JSON: another shape of the same
/// size, another dtype, another name (a far layer, a far shard), a huge dimension, moved
/// offsets, or the entry gone.
fn semantic_header_edit(rng: &mut ChaCha8Rng, header: &mut Value) -> String {
    let Some(map) = header.as_object_mut() else {
        return "no-op (header not an object)".into();
    };
    let names: Vec<String> = map
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    if names.is_empty() {
        return "no-op (no tensors)".into();
    }
    let name = fuzz_pick(rng, &names).clone();
    // Earlier edits may have left anything here: every access below tolerates that.
    let shape: Vec<u64> = map
        .get(&name)
        .and_then(|e| e.get("shape"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    fn set(map: &mut serde_json::Map<String, Value>, name: &str, key: &str, v: Value) {
        if let Some(e) = map.get_mut(name).and_then(Value::as_object_mut) {
            e.insert(key.to_string(), v);
        }
    }
    match rng.random_range(0..7) {
        0 => {
            // The same element count, another shape: the byte size still matches.
            let total = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .unwrap_or(u64::MAX);
            let new: Vec<u64> = match rng.random_range(0..3) {
                0 => shape.iter().rev().copied().collect(),
                1 => vec![total],
                _ => std::iter::once(1).chain(shape.iter().copied()).collect(),
            };
            set(map, &name, "shape", Value::from(new.clone()));
            format!("reshaped {name} from {shape:?} to {new:?}")
        }
        1 => {
            let d = *fuzz_pick(
                rng,
                &[
                    "F32", "I32", "BF16", "F16", "I64", "U8", "F64", "F8_E4M3", "F4", "bogus",
                ],
            );
            set(map, &name, "dtype", Value::from(d));
            format!("made {name} {d}")
        }
        2 => {
            let far = fuzzing::number(rng);
            let renamed = if name.contains("layers.") {
                let rest = name
                    .split_once("layers.")
                    .map(|(a, b)| (a, b.split_once('.').map_or("", |x| x.1)));
                let (head, tail) = rest.unwrap_or(("", ""));
                format!("{head}layers.{far}.{tail}")
            } else if name.contains("shard_") {
                let (head, _) = name.split_once("shard_").unwrap();
                format!("{head}shard_{far}.weight")
            } else {
                format!("{name}.{far}")
            };
            let v = map.remove(&name).unwrap();
            map.insert(renamed.clone(), v);
            format!("renamed {name} to {renamed}")
        }
        3 => {
            if shape.is_empty() {
                return "no-op (scalar)".into();
            }
            let i = rng.random_range(0..shape.len());
            let v = number_value(rng);
            let mut new: Vec<Value> = shape.iter().map(|&d| Value::from(d)).collect();
            new[i] = v.clone();
            set(map, &name, "shape", Value::from(new));
            format!("set dim {i} of {name} to {v}")
        }
        4 => {
            let v = number_value(rng);
            let i = rng.random_range(0..2);
            let mut offsets = map
                .get(&name)
                .and_then(|e| e.get("data_offsets"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            offsets.resize(2, Value::from(0));
            offsets[i] = v.clone();
            set(map, &name, "data_offsets", Value::from(offsets));
            format!("set data_offsets[{i}] of {name} to {v}")
        }
        5 => {
            // Two entries trade places: names now point at each other's bytes.
            let other = fuzz_pick(rng, &names).clone();
            let a = map.get(&name).cloned().unwrap();
            let b = map.get(&other).cloned().unwrap();
            map.insert(name.clone(), b);
            map.insert(other.clone(), a);
            format!("swapped the entries of {name} and {other}")
        }
        _ => {
            map.remove(&name);
            format!("removed {name}")
        }
    }
}

/// A model directory copy in the temp dir: config.json and the safetensors files (the
/// parity expectations are left out).
fn copy_model(src: &Path, tag: &str) -> PathBuf {
    let dst = common::temp_dir(tag);
    for p in files_with(src, "safetensors")
        .into_iter()
        .chain(files_with(src, "json"))
    {
        let name = p.file_name().unwrap();
        if name != "expected.safetensors" && name != "meta.json" {
            fs::copy(&p, dst.join(name)).unwrap();
        }
    }
    dst
}

/// Loads the model as the CLI does, then (if it loads) generates two tokens after a short
/// prompt: the `run` and `logits` paths past the load.
fn load_and_run(dir: &Path) -> Outcome {
    let model = match Model::load(dir, ModelOptions::default()) {
        Ok(m) => m,
        Err(e) => return Outcome::Err(format!("load: {}", label(&format!("{e:?}")))),
    };
    let opts = GenerateOptions {
        max_new_tokens: 2,
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    };
    // Bound first: the session (it borrows the model) must be dropped before the model.
    let generated = model.session().generate(&[1, 2, 3], &opts);
    match generated {
        Ok(_) => Outcome::Ok,
        Err(e) => Outcome::Err(format!("run: {}", label(&format!("{e:?}")))),
    }
}

// ---------------------------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------------------------

/// `checkpoint::read_header` (what opening a safetensors file runs) on mutated headers of every
/// safetensors file of the models.
#[test]
fn header_parser() {
    let settings = Settings::from_env(1500);
    let seeds: Vec<(PathBuf, Image)> = model_dirs()
        .iter()
        .flat_map(|d| files_with(d, "safetensors"))
        .map(|p| {
            let img = Image::read(&p);
            (p, img)
        })
        .collect();
    let report = fuzzing::run(
        "header",
        &settings,
        |rng| {
            let (path, seed) = fuzz_pick(rng, &seeds);
            let mut how = vec![format!("seed {}", path.display())];
            let input = mutate_image(rng, seed, &mut how);
            Case { how, input }
        },
        |image| {
            outcome(checkpoint::read_header(
                Path::new("fuzz/model.safetensors"),
                image,
            ))
        },
    );
    report.assert_clean();
}

/// `ModelPlan::from_json_str` on mutated configs (the plan's `dims` and summary too, when the
/// config is accepted).
#[test]
fn config_parser() {
    let settings = Settings::from_env(1500);
    let mut paths: Vec<PathBuf> = model_dirs().iter().map(|d| d.join("config.json")).collect();
    paths.extend(files_with(&repo().join("tests/data/configs"), "json"));
    let seeds: Vec<(PathBuf, String)> = paths
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect();
    let report = fuzzing::run(
        "config",
        &settings,
        |rng| {
            let (path, text) = fuzz_pick(rng, &seeds);
            let mut how = vec![format!("seed {}", path.display())];
            let input = mutate_config(rng, text, &mut how);
            Case { how, input }
        },
        |text| {
            let r = ModelPlan::from_json_str(text, "fuzz/config.json");
            if let Ok(plan) = &r {
                let _ = (plan.dims(), plan.to_string());
            }
            outcome(r)
        },
    );
    report.assert_clean();
}

/// Config size fields, the ones a checkpoint's shapes pin among them.
const SIZE_FIELDS: [&str; 18] = [
    "vocab_size",
    "hidden_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "head_dim",
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "hc_count",
    "hc_lowrank",
    "indexer_budget",
    "max_position_embeddings",
    "ple_embed_dim",
];

/// A config mutant: often one size field set to a number of [`fuzzing::NUMBERS`] or the layer
/// count changed consistently (so that it passes validation and meets the checkpoint), else
/// structural JSON edits or text edits.
fn mutate_config(rng: &mut ChaCha8Rng, text: &str, how: &mut Vec<String>) -> String {
    let mut v: Value = serde_json::from_str(text).unwrap();
    match rng.random_range(0..10) {
        0..=3 => {
            for _ in 0..how_many(rng, 2) {
                let field = *fuzz_pick(rng, &SIZE_FIELDS);
                let value = number_value(rng);
                how.push(format!("set {field} to {value}"));
                text_fields(&mut v).insert(field.to_string(), value);
            }
        }
        4 => {
            let n: u64 = *fuzz_pick(rng, &[1, 2, 3, 5, 8, 64, 513, 4096, 65536, 65537]);
            let t = text_fields(&mut v);
            t.insert("num_hidden_layers".into(), Value::from(n));
            if rng.random_bool(0.5) || n > 70_000 {
                t.remove("layer_types");
                how.push(format!("set num_hidden_layers to {n}, layer_types removed"));
            } else {
                let types: Vec<Value> = (0..n)
                    .map(|i| {
                        Value::from(if i % 4 == 2 {
                            "qwen_sparse_attention"
                        } else {
                            "linear_attention"
                        })
                    })
                    .collect();
                t.insert("layer_types".into(), Value::from(types));
                how.push(format!("set num_hidden_layers to {n} with {n} layer_types"));
            }
        }
        5..=7 => {
            for _ in 0..how_many(rng, 3) {
                how.push(mutate_json(rng, &mut v));
            }
        }
        _ => {
            let mut bytes = serde_json::to_vec_pretty(&v).unwrap();
            for _ in 0..how_many(rng, 3) {
                how.push(mutate_text(rng, &mut bytes));
            }
            return String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    serde_json::to_string_pretty(&v).unwrap()
}

/// The object that holds the text model's fields: `text_config` of a composite config, else
/// the top level.
fn text_fields(v: &mut Value) -> &mut serde_json::Map<String, Value> {
    let composite = v.get("text_config").is_some_and(Value::is_object);
    let root = v.as_object_mut().expect("seed configs are objects");
    if composite {
        root.get_mut("text_config")
            .and_then(Value::as_object_mut)
            .expect("checked above")
    } else {
        root
    }
}

/// `GraphSet::load_dir` on a copy of `graphs/` with one file mutated; a set that loads is then
/// lowered for the demo model (decode and a 3-token prefill).
#[test]
fn graph_files() {
    let settings = Settings::from_env(150);
    let dir = common::temp_dir("fuzz-graphs");
    copy_tree(&repo().join("graphs"), &dir);
    let mut files: Vec<PathBuf> = files_with(&dir.join("qwen4exp"), "ron");
    files.extend(files_with(&dir, "ron"));
    let originals: Vec<(PathBuf, Vec<u8>)> = files
        .iter()
        .map(|p| (p.clone(), fs::read(p).unwrap()))
        .collect();
    let plan = ModelPlan::from_model_dir(&repo().join("models/tiny-qwen4exp")).unwrap();
    let report = fuzzing::run(
        "graphs",
        &settings,
        |rng| {
            let i = rng.random_range(0..originals.len());
            let (path, text) = &originals[i];
            let mut bytes = text.clone();
            let mut how = vec![format!("mutated {}", path.display())];
            for _ in 0..how_many(rng, 3) {
                how.push(mutate_text(rng, &mut bytes));
            }
            Case {
                how,
                input: (i, bytes),
            }
        },
        |(i, bytes)| {
            let (path, original) = &originals[*i];
            // Put the original back however the case ends (a panic unwinds through this).
            let _restore = Restore(path, original);
            fs::write(path, bytes).unwrap();
            let graphs = match GraphSet::load_dir(&dir) {
                Ok(g) => g,
                Err(e) => return Outcome::Err(format!("load: {}", label(&format!("{e:?}")))),
            };
            for (phase, tokens) in [(Phase::Decode, 1), (Phase::Prefill, 3)] {
                let opts = LowerOptions::new(phase, tokens, LogitsMode::Last);
                if let Err(e) = lower::lower(&plan, &graphs, &opts) {
                    return Outcome::Err(format!("lower: {}", label(&format!("{e:?}"))));
                }
            }
            Outcome::Ok
        },
    );
    let _ = fs::remove_dir_all(&dir);
    report.assert_clean();
}

struct Restore<'a>(&'a Path, &'a [u8]);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let _ = fs::write(self.0, self.1);
    }
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

/// The demo model with its config.json mutated, loaded and run as the CLI does (where the
/// aborts on huge sizes came from).
#[test]
fn model_with_mutated_config() {
    let settings = Settings::from_env(200);
    let src = repo().join("models/tiny-qwen4exp");
    let dir = copy_model(&src, "fuzz-model-config");
    let seed = fs::read_to_string(src.join("config.json")).unwrap();
    let config = dir.join("config.json");
    let report = fuzzing::run(
        "model-config",
        &settings,
        |rng| {
            let mut how = Vec::new();
            let input = mutate_config(rng, &seed, &mut how);
            Case { how, input }
        },
        |text| {
            fs::write(&config, text).unwrap();
            load_and_run(&dir)
        },
    );
    let _ = fs::remove_dir_all(&dir);
    report.assert_clean();
}

/// A small f32 fixture with its safetensors header (or data) mutated, loaded and run.
#[test]
fn model_with_mutated_header() {
    let settings = Settings::from_env(200);
    let src = repo().join("tests/fixtures/tiny-flat-f32");
    let dir = copy_model(&src, "fuzz-model-header");
    let seed = Image::read(&src.join("model.safetensors"));
    let file = dir.join("model.safetensors");
    let report = fuzzing::run(
        "model-header",
        &settings,
        |rng| {
            let mut how = Vec::new();
            let input = mutate_image(rng, &seed, &mut how);
            Case { how, input }
        },
        |image| {
            fs::write(&file, image).unwrap();
            load_and_run(&dir)
        },
    );
    let _ = fs::remove_dir_all(&dir);
    report.assert_clean();
}

/// Sizes the demo checkpoint does not hold, each refused with the field named, under the
/// allocation cap (so nothing was sized from them: 2^31 of anything is over 2 GiB).
#[test]
fn huge_sizes_are_refused_without_allocating_from_them() {
    let src = repo().join("models/tiny-qwen4exp");
    let dir = copy_model(&src, "fuzz-huge-sizes");
    let seed: Value =
        serde_json::from_str(&fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let huge = 1u64 << 31;
    let cases: [(&str, u64); 6] = [
        ("num_experts", huge),
        ("hidden_size", huge),
        ("vocab_size", huge),
        ("moe_intermediate_size", huge),
        ("shared_expert_intermediate_size", huge),
        ("num_hidden_layers", 65536),
    ];
    for (field, value) in cases {
        let mut config = seed.clone();
        let m = config.as_object_mut().unwrap();
        m.insert(field.into(), value.into());
        if field == "num_hidden_layers" {
            m.remove("layer_types");
        }
        fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let err = match Model::load(&dir, ModelOptions::default()) {
            Ok(_) => panic!("{field} = {value} loaded"),
            Err(e) => e.to_string(),
        };
        let needle = format!("config.json {field} = {value}, but the checkpoint holds");
        assert!(err.contains(&needle), "{field}: {err}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// Found by the `graphs` target (case 14735 of seed 1): a slice start near 2^64 in a graph file
/// overflowed `start + len` in shape inference (a panic in debug builds). Now an error naming
/// the node.
#[test]
fn graph_slice_past_the_width_is_an_error() {
    let dir = common::temp_dir("fuzz-graph-slice");
    copy_tree(&repo().join("graphs"), &dir);
    let qsa = dir.join("qwen4exp/qsa.ron");
    let text = fs::read_to_string(&qsa).unwrap();
    let slice = "Slice(start: 0, len: \"iH*iD\")";
    assert!(text.contains(slice), "qsa.ron has no {slice}");
    fs::write(
        &qsa,
        text.replacen(
            slice,
            "Slice(start: 18446744073709551615, len: \"iH*iD\")",
            1,
        ),
    )
    .unwrap();
    let graphs = GraphSet::load_dir(&dir).unwrap();
    let plan = ModelPlan::from_model_dir(&repo().join("models/tiny-qwen4exp")).unwrap();
    let opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
    let err = lower::lower(&plan, &graphs, &opts).unwrap_err().to_string();
    assert!(
        err.contains("qsa.ron")
            && err.contains("slice [18446744073709551615, 18446744073709551615) exceeds width"),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}
