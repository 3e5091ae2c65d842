//! Random checkpoints in the official layout, for tests and benchmarks: the tensor list comes
//! from the lowered program (the same contract loading checks), values from a seeded stream.
//!
//! Layout: `model.language_model.` prefix for a composite config (`model.` for a flat one),
//! fused experts, the n-gram table in `split_ngram_parts` row pieces (`shard_{k}`, sized as
//! `torch.chunk` makes them), the int64 PLE buffers, files of at most `shard_bytes` with a
//! `model.safetensors.index.json` when there is more than one.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{self, DType, TensorData};
use crate::error::{Error, Result};
use crate::ir::{LogitsMode, Phase, WeightClass, WeightInfo};
use crate::lower::{self, GraphSet, LowerOptions};
use crate::plan::{ConfigKind, ModelPlan};
use crate::quant::nvfp4;
use crate::weights::{WeightTensor, Weights};

/// A tensor ready to write: checkpoint name, dtype, shape, little-endian bytes.
type Encoded = (String, DType, Vec<usize>, Vec<u8>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthDtype {
    F32,
    Bf16,
    F16,
}

impl std::str::FromStr for SynthDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(SynthDtype::F32),
            "bf16" => Ok(SynthDtype::Bf16),
            "f16" => Ok(SynthDtype::F16),
            other => Err(format!("{other}: expected f32, bf16 or f16")),
        }
    }
}

impl std::fmt::Display for SynthDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SynthDtype::F32 => "f32",
            SynthDtype::Bf16 => "bf16",
            SynthDtype::F16 => "f16",
        })
    }
}

/// How the routed experts are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExpertFormat {
    /// Fused banks (`experts.gate_up_proj [E, 2ff, H]`, `experts.down_proj`) in `dtype`: the
    /// bf16 release's layout.
    #[default]
    Fused,
    /// ModelOpt NVFP4, per expert (`experts.{e}.{gate,up,down}_proj.weight` U8 codes with their
    /// `weight_scale`, `weight_scale_2` and `input_scale`), with `hf_quant_config.json`: the
    /// release users run on one GPU. Some scale bytes are E4M3 NaN codes, as such checkpoints
    /// may hold.
    Nvfp4,
}

impl std::str::FromStr for ExpertFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fused" => Ok(ExpertFormat::Fused),
            "nvfp4" => Ok(ExpertFormat::Nvfp4),
            other => Err(format!("{other}: expected fused or nvfp4")),
        }
    }
}

pub struct SynthOptions {
    pub dtype: SynthDtype,
    pub seed: u64,
    /// Largest safetensors file to write (bytes of tensor data).
    pub shard_bytes: usize,
    pub experts: ExpertFormat,
}

/// Every this many scale groups of a synthetic NVFP4 matrix holds an E4M3 NaN code.
const NAN_SCALE_EVERY: usize = 29;

/// Writes `config_text` (which must parse to `plan`) and random weights into `out`.
pub fn write(plan: &ModelPlan, config_text: &str, out: &Path, opts: &SynthOptions) -> Result<()> {
    let io = |e: std::io::Error| Error::Io {
        path: out.display().to_string(),
        msg: e.to_string(),
    };
    std::fs::create_dir_all(out).map_err(io)?;
    std::fs::write(out.join("config.json"), config_text).map_err(io)?;
    let program = contract_program(plan)?;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut tensors: Vec<Encoded> = Vec::new();
    for w in &program.weights {
        let name = checkpoint_name(plan, &w.name);
        if w.class == WeightClass::I64 {
            let values = crate::weights::contract::buffer_expectation(&w.name, &program.consts)
                .unwrap_or_default();
            tensors.push((
                name,
                DType::I64,
                w.shape.clone(),
                checkpoint::i64_bytes(&values),
            ));
            continue;
        }
        let values = random_values(w, &mut rng);
        let encode = |v: &[f32]| match opts.dtype {
            SynthDtype::F32 => (DType::F32, checkpoint::f32_bytes(v)),
            SynthDtype::Bf16 => (DType::BF16, checkpoint::f32_to_bf16_bytes(v)),
            SynthDtype::F16 => (DType::F16, checkpoint::f32_to_f16_bytes(v)),
        };
        if opts.experts == ExpertFormat::Nvfp4 {
            if let Some(parts) = nvfp4_experts(&name, w, &values) {
                tensors.extend(parts);
                continue;
            }
        }
        match (name.strip_suffix("ngram_embedding.weight"), &plan.ple) {
            (Some(base), Some(ple)) => {
                // torch.chunk: pieces of ceil(rows/parts) rows, the last one shorter.
                let (rows, cols) = (w.shape[0], w.shape[1]);
                let per = rows.div_ceil(ple.split_parts.max(1));
                for (k, start) in (0..rows).step_by(per.max(1)).enumerate() {
                    let end = (start + per).min(rows);
                    let (dtype, bytes) = encode(&values[start * cols..end * cols]);
                    tensors.push((
                        format!("{base}ngram_embedding.shard_{k}.weight"),
                        dtype,
                        vec![end - start, cols],
                        bytes,
                    ));
                }
            }
            _ => {
                let (dtype, bytes) = encode(&values);
                tensors.push((name, dtype, w.shape.clone(), bytes));
            }
        }
    }
    if opts.experts == ExpertFormat::Nvfp4 {
        let quant = serde_json::json!({
            "producer": {"name": "graphrun synth"},
            "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
        });
        std::fs::write(out.join("hf_quant_config.json"), quant.to_string()).map_err(io)?;
    }
    write_files(out, tensors, opts.shard_bytes)
}

/// A fused expert bank (`...experts.gate_up_proj [E, 2ff, H]` or `...experts.down_proj`) as
/// ModelOpt's per-expert NVFP4 tensors; `None` for any other weight.
fn nvfp4_experts(name: &str, w: &WeightInfo, values: &[f32]) -> Option<Vec<Encoded>> {
    let (base, kinds): (&str, &[&str]) = if let Some(b) = name.strip_suffix("experts.gate_up_proj")
    {
        (b, &["gate_proj", "up_proj"])
    } else if let Some(b) = name.strip_suffix("experts.down_proj") {
        (b, &["down_proj"])
    } else {
        return None;
    };
    let [experts, rows, cols] = w.shape[..] else {
        return None;
    };
    let out = rows / kinds.len();
    let mut tensors = Vec::new();
    for e in 0..experts {
        for (k, kind) in kinds.iter().enumerate() {
            let start = (e * rows + k * out) * cols;
            let m = &values[start..start + out * cols];
            // A global scale that is not a power of two, as the release's are.
            let amax = m.iter().fold(0f32, |a, v| a.max(v.abs()));
            let global = (amax / (6.0 * 448.0)).max(f32::MIN_POSITIVE) * 1.37;
            let (codes, mut scales) = nvfp4::quantize(m, out, cols, global);
            for (g, byte) in scales.iter_mut().enumerate() {
                if (g + e) % NAN_SCALE_EVERY == NAN_SCALE_EVERY - 1 {
                    *byte = if g % 2 == 0 { 0x7F } else { 0xFF };
                }
            }
            let stem = format!("{base}experts.{e}.{kind}");
            let groups = cols / nvfp4::GROUP;
            tensors.push((
                format!("{stem}.weight"),
                DType::U8,
                vec![out, cols / 2],
                codes,
            ));
            tensors.push((
                format!("{stem}.weight_scale"),
                DType::Other("F8_E4M3".into()),
                vec![out, groups],
                scales,
            ));
            tensors.push((
                format!("{stem}.weight_scale_2"),
                DType::F32,
                vec![],
                checkpoint::f32_bytes(&[global]),
            ));
            tensors.push((
                format!("{stem}.input_scale"),
                DType::F32,
                vec![],
                checkpoint::f32_bytes(&[1.0]),
            ));
        }
    }
    Some(tensors)
}

/// A program of the plan: its weight table is the tensor contract.
fn contract_program(plan: &ModelPlan) -> Result<crate::ir::Program> {
    let opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
    Ok(lower::lower(plan, &GraphSet::embedded()?, &opts)?.program)
}

/// Random weights for `plan`, in memory (the values `write` would store as f32).
pub fn random_weights(plan: &ModelPlan, seed: u64) -> Result<Weights> {
    let program = contract_program(plan)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut weights = Weights::new();
    for w in program
        .weights
        .iter()
        .filter(|w| w.class == WeightClass::Float)
    {
        weights.insert(
            w.name.clone(),
            WeightTensor {
                shape: w.shape.clone(),
                data: random_values(w, &mut rng),
            },
        );
    }
    Ok(weights)
}

/// The canonical (CausalLM) name as the config's layout stores it.
fn checkpoint_name(plan: &ModelPlan, canonical: &str) -> String {
    match (plan.config_kind, canonical.strip_prefix("model.")) {
        (ConfigKind::Composite, Some(rest)) => format!("model.language_model.{rest}"),
        _ => canonical.to_string(),
    }
}

/// Standard normal by Box–Muller (deterministic for a seed).
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// Values that keep activations in a healthy range and exercise every path: matrices
/// N(0, 1/fan_in), embeddings N(0, 1), (1+w) norms N(0, 0.1), plain norms 1+N(0, 0.1),
/// A_log = ln U(1, 16), dt_bias 1+N(0, 0.1), convs N(0, 1/kernel).
fn random_values(w: &WeightInfo, rng: &mut ChaCha8Rng) -> Vec<f32> {
    let n: usize = w.shape.iter().product();
    let name = w.name.as_str();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let z = normal(rng);
        let v = if name.ends_with("A_log") {
            (1.0 + 15.0 * rng.random::<f32>()).ln()
        } else if name.ends_with("dt_bias") || name.ends_with("linear_attn.norm.weight") {
            1.0 + 0.1 * z
        } else if w.shape.len() == 1 {
            0.1 * z
        } else if name.ends_with("conv1d.weight") {
            z / (*w.shape.last().unwrap() as f32).sqrt()
        } else if name.ends_with("embed_tokens.weight") || name.ends_with("ngram_embedding.weight")
        {
            z
        } else {
            z / (*w.shape.last().unwrap() as f32).sqrt()
        };
        out.push(v);
    }
    out
}

fn write_files(
    out: &Path,
    tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    shard_bytes: usize,
) -> Result<()> {
    let mut files: Vec<Vec<Encoded>> = vec![Vec::new()];
    let mut size = 0usize;
    for t in tensors {
        if size > 0 && size + t.3.len() > shard_bytes {
            files.push(Vec::new());
            size = 0;
        }
        size += t.3.len();
        files.last_mut().unwrap().push(t);
    }
    let count = files.len();
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (i, file) in files.iter().enumerate() {
        let fname = if count == 1 {
            checkpoint::SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, count)
        };
        let data: Vec<TensorData> = file
            .iter()
            .map(|(n, d, s, b)| TensorData {
                name: n.clone(),
                dtype: d.clone(),
                shape: s.clone(),
                bytes: Cow::Borrowed(b),
            })
            .collect();
        for (n, _, _, b) in file {
            weight_map.insert(n.clone(), fname.clone());
            total += b.len() as u64;
        }
        checkpoint::write_safetensors(&out.join(&fname), &data, None)?;
    }
    if count > 1 {
        checkpoint::write_index(&out.join(checkpoint::INDEX_FILE), &weight_map, total)?;
    }
    Ok(())
}
