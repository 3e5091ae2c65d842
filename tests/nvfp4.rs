//! ModelOpt NVFP4 checkpoints on the CPU: `graphrun synth --experts nvfp4` writes one (per-expert
//! U8 codes, E4M3 scales with NaN codes among them, f32 global scales, `hf_quant_config.json`);
//! loading it gives the logits of the same model with each expert matrix replaced by its exact
//! dequantisation, computed here from the spec's formula; and every malformed piece is refused
//! by its tensor or file name. The committed fixture `tests/fixtures/tiny-nvfp4` (such a
//! checkpoint with an f32 trunk) is compared with transformers: logits within 1e-5, as
//! tests/parity.rs, and identical greedy tokens, against the `expected.safetensors` that
//! `scripts/make_nvfp4_fixture.py` makes from it.

mod common;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use graphrun::checkpoint::{self, Checkpoint, DType, TensorData};
use graphrun::ir::LogitsMode;
use graphrun::plan::ModelPlan;
use graphrun::runtime::{GenerateOptions, Model, ModelOptions, Sampling};
use graphrun::synth::ExpertFormat;

/// The tiny model's config with its routed experts in NVFP4, written to a fresh directory.
fn nvfp4_checkpoint(tag: &str) -> PathBuf {
    common::synth_bf16(
        "models/tiny-qwen4exp/config.json",
        tag,
        ExpertFormat::Nvfp4,
        11,
    )
}

/// The spec's meaning of one NVFP4 weight, written out here independently of `quant::nvfp4`:
/// `(e2m1(code) * e4m3(scale)) * global`, element 2i in the low nibble, NaN scales as +0.
fn spec_weight(codes: &[u8], scales: &[u8], global: f32, cols: usize, r: usize, c: usize) -> f32 {
    const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let byte = codes[r * cols / 2 + c / 2];
    let code = if c.is_multiple_of(2) {
        byte & 15
    } else {
        byte >> 4
    };
    let magnitude = E2M1[(code & 7) as usize];
    let value = if code & 8 != 0 { -magnitude } else { magnitude };
    let s = scales[r * cols / 16 + c / 16];
    let scale = if s & 0x7F == 0x7F {
        0.0
    } else {
        let (e, m) = (((s >> 3) & 15) as i32, (s & 7) as f32);
        let v = if e == 0 {
            m / 8.0 / 64.0
        } else {
            (1.0 + m / 8.0) * 2f32.powi(e - 7)
        };
        if s & 0x80 != 0 {
            -v
        } else {
            v
        }
    };
    (value * scale) * global
}

/// The checkpoint rewritten as fused f32 expert banks of the spec's dequantisation (every other
/// tensor as it is), without `hf_quant_config.json`.
fn dequantized_copy(dir: &Path, tag: &str) -> PathBuf {
    let ck = Checkpoint::open_dir(dir).unwrap();
    let out = common::temp_dir(tag);
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    let mut tensors: Vec<TensorData> = Vec::new();
    // Per fused bank: (expert, 0 gate / 1 up, the matrix, its columns).
    type Part = (usize, usize, Vec<f32>, usize);
    let mut banks: std::collections::BTreeMap<String, Vec<Part>> = Default::default();
    for name in ck.names() {
        let info = ck.info(name).unwrap();
        let Some(stem) = name
            .strip_suffix(".weight")
            .filter(|_| info.dtype == DType::U8)
        else {
            if name.contains(".experts.") {
                continue; // the scales, folded in below
            }
            tensors.push(TensorData {
                name: name.to_string(),
                dtype: info.dtype.clone(),
                shape: info.shape.clone(),
                bytes: Cow::Owned(ck.bytes(name).unwrap().to_vec()),
            });
            continue;
        };
        // `{base}experts.{e}.{kind}`
        let (base, rest) = stem.split_once("experts.").unwrap();
        let (e, kind) = rest.split_once('.').unwrap();
        let (rows, cols) = (info.shape[0], info.shape[1] * 2);
        let codes = ck.bytes(name).unwrap();
        let scales = ck.bytes(&format!("{stem}.weight_scale")).unwrap();
        let global = ck.to_f32(&format!("{stem}.weight_scale_2")).unwrap()[0];
        let mut w = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                w.push(spec_weight(codes, scales, global, cols, r, c));
            }
        }
        let fused = match kind {
            "gate_proj" | "up_proj" => format!("{base}experts.gate_up_proj"),
            _ => format!("{base}experts.down_proj"),
        };
        let part = usize::from(kind == "up_proj");
        banks
            .entry(fused)
            .or_default()
            .push((e.parse().unwrap(), part, w, cols));
    }
    for (name, mut parts) in banks {
        parts.sort_by_key(|(e, part, ..)| (*e, *part));
        let experts = parts.iter().map(|p| p.0).max().unwrap() + 1;
        let cols = parts[0].3;
        let data: Vec<f32> = parts.iter().flat_map(|p| p.2.iter().copied()).collect();
        let rows = data.len() / experts / cols;
        tensors.push(TensorData {
            name,
            dtype: DType::F32,
            shape: vec![experts, rows, cols],
            bytes: Cow::Owned(checkpoint::f32_bytes(&data)),
        });
    }
    checkpoint::write_safetensors(&out.join("model.safetensors"), &tensors, None).unwrap();
    out
}

/// How many E4M3 NaN codes (0x7F, 0xFF) the checkpoint's scales hold.
fn nan_scale_bytes(dir: &Path) -> usize {
    let ck = Checkpoint::open_dir(dir).unwrap();
    ck.names()
        .filter(|n| n.ends_with(".weight_scale"))
        .map(|n| {
            ck.bytes(n)
                .unwrap()
                .iter()
                .filter(|&&b| b & 0x7F == 0x7F)
                .count()
        })
        .sum::<usize>()
}

#[test]
fn an_nvfp4_checkpoint_computes_with_its_exact_dequantisation() {
    let dir = nvfp4_checkpoint("nvfp4-exact");
    // The synthetic checkpoint holds NaN scale bytes, so the convention is exercised.
    assert!(
        nan_scale_bytes(&dir) > 0,
        "no NaN scale byte in the synthetic checkpoint"
    );
    assert_equals_its_dequantisation(&dir, "nvfp4-exact-ref");
}

/// The model of `dir` (NVFP4 experts) gives, bit for bit, the logits of its copy with every
/// expert bank replaced by the spec's dequantisation in f32, and reports every routed-expert
/// bank as NVFP4.
fn assert_equals_its_dequantisation(dir: &Path, tag: &str) {
    let reference = dequantized_copy(dir, tag);
    let prompt = [5u32, 6, 7, 8, 9, 10, 11];
    let nv = Model::load(dir, ModelOptions::default()).unwrap();
    // Every routed-expert bank (gate_up and down of each layer) is reported as NVFP4.
    let layers = nv.plan.num_layers;
    assert_eq!(
        nv.stored_formats["nvfp4"].len(),
        2 * layers,
        "{:?}",
        nv.stored_formats
    );
    assert!(nv.stored_formats["nvfp4"]
        .iter()
        .all(|n| n.contains(".mlp.experts.")));
    let f32_model = Model::load(&reference, ModelOptions::default()).unwrap();
    let a = nv.session().prefill(&prompt, LogitsMode::All).unwrap();
    let b = f32_model
        .session()
        .prefill(&prompt, LogitsMode::All)
        .unwrap();
    assert_eq!(a.data.len(), b.data.len());
    let differing = a
        .data
        .iter()
        .zip(&b.data)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differing, 0, "logits differ from the dequantised model's");
}

/// The committed NVFP4 parity fixture: written by `graphrun synth --experts nvfp4 --dtype f32
/// --seed 5005` (the command is in scripts/make_nvfp4_fixture.py), its expected outputs by that
/// script with transformers.
const FIXTURE: &str = "tests/fixtures/tiny-nvfp4";

/// As tests/parity.rs: per row, relative to the row's largest |logit|.
const TOLERANCE: f32 = 1e-5;

/// The fixture's directory and transformers' outputs for it; a clear failure while
/// `expected.safetensors` has not been made.
fn fixture_expected() -> (PathBuf, common::Expected) {
    let dir = common::repo().join(FIXTURE);
    let path = dir.join("expected.safetensors");
    assert!(
        path.exists(),
        "{} is missing: transformers' outputs for the NVFP4 fixture are made on the GPU machine \
         (torch, safetensors, transformers with qwen4_exp; run on its CPU) by \
         `CUDA_VISIBLE_DEVICES= python3 scripts/make_nvfp4_fixture.py --model {FIXTURE}`, which \
         writes expected.safetensors and meta.json into {FIXTURE}: commit both, and the printout as \
         results/fixtures.log (scripts/README.md)",
        path.display()
    );
    let exp = common::expected(&dir);
    (dir, exp)
}

/// What the parity below stands on: the fixture is an NVFP4 checkpoint (every routed-expert
/// bank, NaN scale bytes among the scales, an f32 trunk), computed exactly as its dequantisation.
#[test]
fn the_nvfp4_fixture_is_nvfp4_with_nan_scales_and_an_f32_trunk() {
    let dir = common::repo().join(FIXTURE);
    assert!(
        dir.join("hf_quant_config.json").exists(),
        "{FIXTURE}: no hf_quant_config.json"
    );
    assert!(nan_scale_bytes(&dir) > 0, "{FIXTURE}: no NaN scale byte");
    let model = Model::load(&dir, ModelOptions::default()).unwrap();
    assert_eq!(model.weight_dtype, "f32");
    assert!(
        model.unused_tensors.is_empty(),
        "{:?}",
        model.unused_tensors
    );
    assert_equals_its_dequantisation(&dir, "nvfp4-fixture-ref");
}

#[test]
fn nvfp4_fixture_logits_match_transformers() {
    let (dir, exp) = fixture_expected();
    let model = Model::load(&dir, ModelOptions::default()).unwrap();
    let logits = model
        .session()
        .prefill(&exp.prompt, LogitsMode::All)
        .unwrap();
    assert_eq!(logits.data.len(), exp.prompt.len() * exp.vocab);
    let err = common::max_row_rel_err(&logits.data, &exp.logits, exp.vocab);
    eprintln!("{FIXTURE}: max row-relative logit error {err:.2e}");
    assert!(
        err <= TOLERANCE,
        "{FIXTURE}: logits differ from transformers by {err:e}"
    );
}

#[test]
fn nvfp4_fixture_greedy_tokens_match_transformers() {
    let (dir, exp) = fixture_expected();
    let model = Model::load(&dir, ModelOptions::default()).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: exp.greedy.len(),
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    };
    let got = model.session().generate(&exp.prompt, &opts).unwrap();
    assert_eq!(got, exp.greedy, "{FIXTURE}: greedy tokens");
}

/// The checkpoint of `dir` written again with `edit` applied to its tensor list.
fn rewrite(dir: &Path, edit: impl FnOnce(&mut Vec<TensorData<'static>>)) {
    let ck = Checkpoint::open_dir(dir).unwrap();
    let mut tensors: Vec<TensorData<'static>> = ck
        .names()
        .map(|n| {
            let info = ck.info(n).unwrap();
            TensorData {
                name: n.to_string(),
                dtype: info.dtype.clone(),
                shape: info.shape.clone(),
                bytes: Cow::Owned(ck.bytes(n).unwrap().to_vec()),
            }
        })
        .collect();
    drop(ck);
    edit(&mut tensors);
    checkpoint::write_safetensors(&dir.join("model.safetensors"), &tensors, None).unwrap();
}

fn load_error(dir: &Path) -> String {
    load_error_with(dir, ModelOptions::default())
}

const EXPERT: &str = "model.layers.0.mlp.experts.1.up_proj";

fn find<'a>(tensors: &'a mut [TensorData<'static>], name: &str) -> &'a mut TensorData<'static> {
    tensors.iter_mut().find(|t| t.name == name).unwrap()
}

#[test]
fn malformed_nvfp4_pieces_are_refused_by_name() {
    // (directory tag, how the checkpoint is broken, what the refusal must say)
    type Case = (&'static str, Box<dyn FnOnce(&Path)>, String);
    let cases: Vec<Case> = vec![
        (
            "nvfp4-no-scale",
            Box::new(|d| rewrite(d, |t| t.retain(|x| x.name != format!("{EXPERT}.weight_scale")))),
            format!("missing the NVFP4 scales of {EXPERT}.weight (looked for: {EXPERT}.weight_scale)"),
        ),
        (
            "nvfp4-scale-dtype",
            Box::new(|d| {
                rewrite(d, |t| {
                    let s = find(t, &format!("{EXPERT}.weight_scale"));
                    s.dtype = DType::U8;
                })
            }),
            format!("{EXPERT}.weight_scale: dtype u8, expected f8_e4m3"),
        ),
        (
            "nvfp4-scale-shape",
            Box::new(|d| {
                rewrite(d, |t| {
                    let s = find(t, &format!("{EXPERT}.weight_scale"));
                    let n = s.shape[0] * s.shape[1];
                    s.shape = vec![n];
                })
            }),
            format!("{EXPERT}.weight_scale: shape"),
        ),
        (
            "nvfp4-negative-global",
            Box::new(|d| {
                rewrite(d, |t| {
                    let s = find(t, &format!("{EXPERT}.weight_scale_2"));
                    s.bytes = Cow::Owned(checkpoint::f32_bytes(&[-0.5]));
                })
            }),
            format!("{EXPERT}.weight_scale_2: global scale Some(-0.5): must be finite and positive"),
        ),
        (
            "nvfp4-nan-global",
            Box::new(|d| {
                rewrite(d, |t| {
                    let s = find(t, &format!("{EXPERT}.weight_scale_2"));
                    s.bytes = Cow::Owned(checkpoint::f32_bytes(&[f32::NAN]));
                })
            }),
            format!("{EXPERT}.weight_scale_2: global scale Some(NaN)"),
        ),
        (
            "nvfp4-mixed-bank",
            Box::new(|d| {
                rewrite(d, |t| {
                    // Expert 1's up projection as a bf16 matrix, its scales gone.
                    t.retain(|x| !x.name.starts_with(&format!("{EXPERT}.weight_")));
                    t.retain(|x| x.name != format!("{EXPERT}.input_scale"));
                    let codes = find(t, &format!("{EXPERT}.weight"));
                    let (rows, cols) = (codes.shape[0], codes.shape[1] * 2);
                    codes.dtype = DType::BF16;
                    codes.shape = vec![rows, cols];
                    codes.bytes = Cow::Owned(checkpoint::f32_to_bf16_bytes(&vec![0.5; rows * cols]));
                })
            }),
            format!("{EXPERT}.weight: stored as bf16, but "),
        ),
        (
            "nvfp4-excluded",
            Box::new(|d| {
                let q = r#"{"quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "*.experts.1.*"]}}"#;
                std::fs::write(d.join("hf_quant_config.json"), q).unwrap();
            }),
            format!("{EXPERT}.weight: quantised, but "),
        ),
        (
            "nvfp4-undeclared",
            Box::new(|d| std::fs::remove_file(d.join("hf_quant_config.json")).unwrap()),
            format!("{EXPERT}.weight: dtype u8, expected f32, bf16 or f16 (u8 holds NVFP4 codes only where hf_quant_config.json"),
        ),
        (
            "nvfp4-unknown-algo",
            Box::new(|d| {
                let q = r#"{"quantization": {"quant_algo": "W4A16_AWQ"}}"#;
                std::fs::write(d.join("hf_quant_config.json"), q).unwrap();
            }),
            "hf_quant_config.json: quant_algo \"W4A16_AWQ\" is not supported".to_string(),
        ),
        (
            "nvfp4-group-size",
            Box::new(|d| {
                let q = r#"{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}"#;
                std::fs::write(d.join("hf_quant_config.json"), q).unwrap();
            }),
            "group_size 32: NVFP4 scales groups of 16 inputs".to_string(),
        ),
    ];
    for (tag, break_it, want) in cases {
        let dir = nvfp4_checkpoint(tag);
        break_it(&dir);
        let err = load_error(&dir);
        assert!(err.contains(&want), "{tag}: {err}\n(wanted: {want})");
    }
}

fn load_error_with(dir: &Path, options: ModelOptions) -> String {
    match Model::load(dir, options) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// A load for a device keeps each NVFP4 bank packed (no f32 copy of it), and the packed bank
/// means exactly what the CPU's widened load computes with: its dequantisation equals the
/// widened weights bit for bit; every other weight is loaded alike.
#[test]
fn a_packed_load_keeps_the_banks_as_stored() {
    use graphrun::ir::Phase;
    use graphrun::lower::{lower, GraphSet, LowerOptions};
    use graphrun::weights::{check_contract, contract};
    let dir = nvfp4_checkpoint("nvfp4-packed");
    let plan = ModelPlan::from_model_dir(&dir).unwrap();
    let ckpt = Checkpoint::open_dir(&dir).unwrap();
    let quant = graphrun::quant::QuantConfig::from_model_dir(&dir).unwrap();
    let probe = lower(
        &plan,
        &GraphSet::embedded().unwrap(),
        &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
    )
    .unwrap();
    let resolved = check_contract(
        &ckpt,
        "tiny",
        &probe.program.weights,
        &probe.program.consts,
        plan.moe.num_experts,
        quant.as_ref(),
    )
    .unwrap();
    let widened = contract::load_with(&ckpt, &resolved, contract::Nvfp4Load::Widen).unwrap();
    let packed = contract::load_with(&ckpt, &resolved, contract::Nvfp4Load::Packed).unwrap();
    let banks: Vec<&str> = packed.nvfp4_names().collect();
    assert_eq!(
        banks.len(),
        2 * plan.layers.len(),
        "a gate/up and a down bank a layer"
    );
    assert_eq!(widened.nvfp4_names().count(), 0);
    for name in &banks {
        assert!(
            packed.get(name).is_none(),
            "{name}: no f32 copy beside the bank"
        );
        let bank = packed.nvfp4(name).unwrap();
        let want = &widened.get(name).unwrap().data;
        let got = bank.dequantize();
        assert_eq!(got.len(), want.len(), "{name}");
        assert!(
            got.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the packed bank means what the widened load computes with"
        );
        assert!(
            bank.scales.contains(&0x7F) || bank.scales.contains(&0xFF),
            "{name}: NaN scale codes kept as stored"
        );
    }
    for name in widened.names().filter(|n| !banks.contains(n)) {
        assert_eq!(packed.get(name), widened.get(name), "{name}");
    }
}

/// A device load is planned from the contract before anything is read
/// (`exec::cuda::executor::planned_bytes`): its figure is what the loaded weights hold, NVFP4
/// banks as stored (codes, scales, globals) and everything else as f32 for an f32 trunk.
#[test]
fn a_device_load_is_planned_from_the_contract() {
    use graphrun::runtime::CheckedDir;
    use graphrun::weights::contract;
    let dir = common::repo().join("tests/fixtures/tiny-nvfp4");
    let checked = CheckedDir::open(&dir, graphrun::lower::GraphSet::embedded().unwrap()).unwrap();
    use graphrun::exec::cuda::executor::planned_bytes;
    use graphrun::registry::Placement;
    let planned = planned_bytes(&checked.probe, &checked.resolved, false, Placement::Device);
    let packed = contract::load_with(
        &checked.ckpt,
        &checked.resolved,
        contract::Nvfp4Load::Packed,
    )
    .unwrap();
    let held: usize = packed
        .names()
        .map(|n| 4 * packed.get(n).unwrap().data.len())
        .chain(
            packed
                .nvfp4_names()
                .map(|n| packed.nvfp4(n).unwrap().bytes()),
        )
        .sum();
    assert_eq!(planned, held);
    // With the n-gram table on the host, the device holds all but the table.
    let tables: usize = packed
        .names()
        .filter(|n| n.ends_with("ngram_embedding.weight"))
        .map(|n| 4 * packed.get(n).unwrap().data.len())
        .sum();
    let on_host = planned_bytes(&checked.probe, &checked.resolved, false, Placement::Host);
    assert!(tables > 0);
    assert_eq!(planned - on_host, tables);
}
