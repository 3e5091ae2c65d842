//! Random checkpoints in the official layout, for tests and benchmarks: the tensor list comes
//! from the lowered program (the same contract loading checks), values from a seeded stream.
//!
//! Layout: `model.language_model.` prefix for a composite config (`model.` for a flat one),
//! fused experts and the n-gram table in `split_ngram_parts` row pieces (`shard_{k}`, sized as
//! `torch.chunk` makes them) as the bf16 release has them, or ModelOpt NVFP4 per expert and the
//! table whole as the NVFP4 release has them; the int64 PLE buffers, files
//! (`model.safetensors`, or `model-0000k-of-0000n.safetensors` with a
//! `model.safetensors.index.json`) of at most `shard_bytes` of data.
//!
//! Writing streams ([`layout`] plans every tensor first, [`files`] writes headers then data a
//! piece at a time), so a full-size model is written in bounded memory; `sparse` leaves the bulk
//! tensors as holes, so it takes almost no disk either. [`values`] is the seeded value stream.

mod files;
mod layout;
mod values;

use std::path::Path;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::ir::{LogitsMode, Phase, WeightClass};
use crate::lower::{self, GraphSet, LowerOptions};
use crate::plan::{ConfigKind, ModelPlan};
use crate::progress::Progress;
use crate::quant::nvfp4;
use crate::weights::{WeightTensor, Weights};

use files::Files;
use layout::{Layout, Source};

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

#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub dtype: SynthDtype,
    pub seed: u64,
    /// Largest safetensors file to write (bytes of tensor data).
    pub shard_bytes: usize,
    pub experts: ExpertFormat,
    /// Leave the bulk tensors (rank 2 or more, conv1d kernels excepted: matrices, embeddings,
    /// `lm_head`, expert banks, NVFP4 codes and block scales, the n-gram pieces) as holes: they
    /// read as zeros and take no disk. The rest is written with the values a dense checkpoint
    /// of the seed holds, except the NVFP4 global scales, which come from the fan-in (their
    /// matrices are never made). For timing loads of a full-size model on a small disk.
    pub sparse: bool,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            dtype: SynthDtype::F32,
            seed: 0,
            shard_bytes: 4 << 30,
            experts: ExpertFormat::Fused,
            sparse: false,
        }
    }
}

/// Every this many scale groups of a synthetic NVFP4 matrix holds an E4M3 NaN code.
const NAN_SCALE_EVERY: usize = 29;

/// Values made (and encoded) at a time: the most a float tensor holds in memory.
const CHUNK: usize = 1 << 20;

/// Writes `config_text` (which must parse to `plan`) and random weights into `out`.
///
/// Every tensor's name, dtype and shape is known from the program before any value is made, so
/// each file's header is written first and the data streamed after it, a piece at a time: host
/// memory stays bounded by a piece ([`CHUNK`] values, or one NVFP4 expert matrix), not the
/// model. Files are written under temporary names and renamed when complete; a progress bar
/// shows on a terminal.
pub fn write(plan: &ModelPlan, config_text: &str, out: &Path, opts: &SynthOptions) -> Result<()> {
    let io = |path: &Path, e: std::io::Error| Error::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    };
    let program = contract_program(plan)?;
    let layout = Layout::new(plan, &program, opts)?;
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let config = out.join("config.json");
    std::fs::write(&config, config_text).map_err(|e| io(&config, e))?;
    if opts.experts == ExpertFormat::Nvfp4 {
        let quant = serde_json::json!({
            "producer": {"name": "graphrun synth"},
            "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
        });
        let path = out.join("hf_quant_config.json");
        std::fs::write(&path, quant.to_string()).map_err(|e| io(&path, e))?;
    }
    let progress = Progress::bytes(layout.total_bytes(), &format!("synth {}", out.display()));
    let mut files = Files::new(out, &layout, progress);
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    for part in &layout.parts {
        let w = part.weight;
        let first = part.tensors.start;
        match &part.source {
            Source::Buffer(values) => files.put(first, 0, &checkpoint::i64_bytes(values))?,
            Source::Float => {
                for t in part.tensors.clone() {
                    let tensor = &layout.tensors[t];
                    let elem = tensor.dtype.size_bytes().expect("a float dtype");
                    let n = tensor.len / elem;
                    if tensor.hole {
                        values::skip(w, &mut rng, n);
                        files.hole(t)?;
                        continue;
                    }
                    for start in (0..n).step_by(CHUNK) {
                        let v = values::next(w, &mut rng, CHUNK.min(n - start));
                        files.put(t, start * elem, &encode(opts.dtype, &v))?;
                    }
                }
            }
            &Source::Nvfp4 {
                experts,
                kinds,
                out: rows,
                cols,
            } => {
                for e in 0..experts {
                    for k in 0..kinds {
                        let t = first + (e * kinds + k) * 4;
                        nvfp4_matrix(&layout, &mut files, &mut rng, w, t, e, rows, cols)?;
                    }
                }
            }
        }
    }
    files.finish()
}

/// One expert projection `[out, cols]` of a fused bank as NVFP4 tensors `t..t + 4` (codes,
/// block scales, global scale, input scale), from the bank's next `out * cols` values.
#[allow(clippy::too_many_arguments)]
fn nvfp4_matrix(
    layout: &Layout,
    files: &mut Files,
    rng: &mut ChaCha8Rng,
    w: &crate::ir::WeightInfo,
    t: usize,
    expert: usize,
    out: usize,
    cols: usize,
) -> Result<()> {
    let (codes_hole, scales_hole) = (layout.tensors[t].hole, layout.tensors[t + 1].hole);
    let global = if codes_hole && scales_hole {
        values::skip(w, rng, out * cols);
        files.hole(t)?;
        files.hole(t + 1)?;
        // The matrix is never made: a global scale of the size its values would have
        // (N(0, 1/cols), the largest of them about 4.5 standard deviations).
        (4.5 / (cols as f32).sqrt() / (6.0 * 448.0)) * 1.37
    } else {
        let m = values::next(w, rng, out * cols);
        // A global scale that is not a power of two, as the release's are.
        let amax = m.iter().fold(0f32, |a, v| a.max(v.abs()));
        let global = (amax / (6.0 * 448.0)).max(f32::MIN_POSITIVE) * 1.37;
        let (codes, mut scales) = nvfp4::quantize(&m, out, cols, global);
        for (g, byte) in scales.iter_mut().enumerate() {
            if (g + expert) % NAN_SCALE_EVERY == NAN_SCALE_EVERY - 1 {
                *byte = if g % 2 == 0 { 0x7F } else { 0xFF };
            }
        }
        for (i, (hole, bytes)) in [(codes_hole, codes), (scales_hole, scales)]
            .into_iter()
            .enumerate()
        {
            if hole {
                files.hole(t + i)?;
            } else {
                files.put(t + i, 0, &bytes)?;
            }
        }
        global
    };
    files.put(t + 2, 0, &checkpoint::f32_bytes(&[global]))?;
    files.put(t + 3, 0, &checkpoint::f32_bytes(&[1.0]))
}

fn encode(dtype: SynthDtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        SynthDtype::F32 => checkpoint::f32_bytes(v),
        SynthDtype::Bf16 => checkpoint::f32_to_bf16_bytes(v),
        SynthDtype::F16 => checkpoint::f32_to_f16_bytes(v),
    }
}

/// A program of the plan: its weight table is the tensor contract. Where the config declares
/// MTP draft layers, the draft head's own weights follow the trunk's (so the trunk's values
/// are those of a model without a head, drawn first from the same stream).
fn contract_program(plan: &ModelPlan) -> Result<crate::ir::Program> {
    let graphs = GraphSet::embedded()?;
    let opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
    let mut program = lower::lower(plan, &graphs, &opts)?.program;
    if plan.mtp_layers > 0 {
        let draft_opts = LowerOptions {
            kind: lower::ProgramKind::Draft,
            ..opts
        };
        let draft = lower::lower(plan, &graphs, &draft_opts)?.program;
        for w in draft.weights {
            if !program.weights.iter().any(|t| t.name == w.name) {
                program.weights.push(w);
            }
        }
    }
    Ok(program)
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
                data: values::next(w, &mut rng, w.shape.iter().product()),
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
