//! The tensor contract: every weight a program needs, with its shape and element class, checked
//! against a checkpoint before any compute. All problems are collected and reported together,
//! each by its checkpoint name; a long list is cut to its first [`MAX_SHOWN`] and counted by
//! kind, and the config fields the checkpoint contradicts are named first.
//!
//! Nothing here is sized from a config value before the checkpoint is known to hold it: shapes
//! are compared as numbers, expert and shard lists are read off the checkpoint's names
//! (`resolve`), and only a contract that holds is loaded.

use rayon::prelude::*;
use thiserror::Error;

use crate::checkpoint::{find_non_finite, Checkpoint, CheckpointError, DType, NonFinite};
use crate::ir::{Consts, WeightClass, WeightInfo};

use super::causes::{field_mismatches, size_mismatches, FieldMismatch};
use super::resolve::{resolve, Source};
use super::{WeightTensor, Weights};
use crate::plan::ModelPlan;
use crate::quant::nvfp4::Packed;
use crate::quant::QuantConfig;

#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    Missing {
        weight: String,
        tried: Vec<String>,
    },
    Shape {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    Dtype {
        tensor: String,
        expected: &'static str,
        found: String,
    },
    /// An int64 PLE buffer whose values differ from those recomputed from the config.
    BufferValues {
        tensor: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    /// A checkpoint tensor no weight uses, listed only when the contract fails for other
    /// reasons (on its own an unused tensor is fine: `Resolved::unused`).
    Unexpected {
        tensor: String,
    },
    /// A quantised tensor, or a malformed quantisation scale: what is wrong with it.
    Quant {
        tensor: String,
        msg: String,
    },
}

impl Problem {
    /// The kind, as the summary of a long list counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Missing { .. } => "missing",
            Problem::Shape { .. } => "wrong shape",
            Problem::Dtype { .. } => "wrong dtype",
            Problem::BufferValues { .. } => "wrong values",
            Problem::Unexpected { .. } => "unexpected",
            Problem::Quant { .. } => "wrong quantisation",
        }
    }
}

/// The kinds in the order the summary counts them.
const KINDS: [&str; 6] = [
    "missing",
    "wrong shape",
    "wrong dtype",
    "wrong values",
    "wrong quantisation",
    "unexpected",
];

/// How many problems a mismatch lists before it only counts.
pub const MAX_SHOWN: usize = 20;

/// Checkpoint tensors of the models a Qwen4Exp checkpoint ships beside the text model.
const COMPANION_PREFIXES: [&str; 2] = ["mtp.", "model.visual."];

/// At most 16 values of a buffer, for a message.
fn show_values(v: &[i64]) -> String {
    const MAX: usize = 16;
    if v.len() <= MAX {
        format!("{v:?}")
    } else {
        format!("{:?} and {} more", &v[..MAX], v.len() - MAX)
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Missing { weight, tried } => write!(f, "missing {weight} (looked for: {})", tried.join(", ")),
            Problem::Shape { tensor, expected, found } => {
                write!(f, "{tensor}: shape {found:?}, expected {expected:?}")
            }
            Problem::Dtype { tensor, expected, found } => write!(f, "{tensor}: dtype {found}, expected {expected}"),
            Problem::BufferValues { tensor, expected, found } => write!(
                f,
                "{tensor}: values {} differ from {}, recomputed from config.json (wrong ngram settings?)",
                show_values(found),
                show_values(expected)
            ),
            Problem::Unexpected { tensor } => write!(f, "{tensor}: in the checkpoint, but no weight uses it"),
            Problem::Quant { tensor, msg } => write!(f, "{tensor}: {msg}"),
        }
    }
}

#[derive(Debug, Error)]
pub enum ContractError {
    #[error(
        "checkpoint {dir} does not match config.json ({} problem(s)):\n{}",
        problems.len(),
        report(fields, problems)
    )]
    Mismatch {
        dir: String,
        /// Config fields the checkpoint contradicts (the likely causes), possibly none.
        fields: Vec<FieldMismatch>,
        problems: Vec<Problem>,
    },
    /// Config sizes the checkpoint cannot hold, found before the contract is even built
    /// (`check_sizes`).
    #[error(
        "checkpoint {dir} does not hold the sizes config.json gives:\n{}",
        report(fields, &[])
    )]
    Sizes {
        dir: String,
        fields: Vec<FieldMismatch>,
    },
    /// Float weights holding NaN or infinity, in name order.
    #[error(
        "checkpoint weights hold NaN or infinity ({} tensor(s)):\n{}",
        tensors.len(),
        report_non_finite(tensors)
    )]
    NonFinite { tensors: Vec<NonFiniteTensor> },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// One checkpoint tensor with NaN or infinity in it.
#[derive(Debug, Clone, PartialEq)]
pub struct NonFiniteTensor {
    pub tensor: String,
    pub file: std::path::PathBuf,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub found: NonFinite,
}

/// The likely causes, then the first `MAX_SHOWN` problems, then (for a longer list) how many of
/// each kind there are. Linear in the number of problems.
fn report(fields: &[FieldMismatch], problems: &[Problem]) -> String {
    let mut lines: Vec<String> = fields.iter().map(|m| format!("  cause: {m}")).collect();
    lines.extend(problems.iter().take(MAX_SHOWN).map(|p| format!("  - {p}")));
    if problems.len() > MAX_SHOWN {
        let mut counts = [0usize; KINDS.len()];
        for p in problems {
            if let Some(i) = KINDS.iter().position(|k| *k == p.kind()) {
                counts[i] += 1;
            }
        }
        let by_kind: Vec<String> = KINDS
            .iter()
            .zip(counts)
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        lines.push(format!(
            "  ... {} more not shown; by kind: {} ({} in all)",
            problems.len() - MAX_SHOWN,
            by_kind.join(", "),
            problems.len()
        ));
    }
    lines.join("\n")
}

fn report_non_finite(tensors: &[NonFiniteTensor]) -> String {
    let mut lines: Vec<String> = tensors
        .iter()
        .take(MAX_SHOWN)
        .map(|t| {
            format!(
                "  - {} ({} {:?}, in {}): {}",
                t.tensor,
                t.dtype,
                t.shape,
                t.file.display(),
                t.found.describe(&t.shape)
            )
        })
        .collect();
    if tensors.len() > MAX_SHOWN {
        lines.push(format!(
            "  ... and {} more tensor(s)",
            tensors.len() - MAX_SHOWN
        ));
    }
    lines.join("\n")
}

/// A contract that holds: where each weight comes from, and the checkpoint's float dtype.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub weights: Vec<(WeightInfo, Source)>,
    /// `f32`, `bf16` or `f16`: the dtype of most float weights (for rules and reports).
    pub float_dtype: String,
    /// Checkpoint tensors no weight uses (`mtp.*`, `model.visual.*` and anything unexpected).
    pub unused: Vec<String>,
    /// The NVFP4 matrices among the sources' tensors, by their codes tensor.
    pub nvfp4: std::collections::BTreeMap<String, Nvfp4Tensors>,
}

/// The tensors of one NVFP4 matrix `[out, in]` (ModelOpt's layout, `quant::nvfp4`).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Tensors {
    /// U8 `[out, in/2]`.
    pub codes: String,
    /// F8_E4M3 `[out, in/16]`.
    pub scale: String,
    /// F32 `[]`: the per-tensor scale, checked finite and positive.
    pub global: String,
    /// F32 `[]`: ModelOpt's static activation scale, if stored (recorded, unused).
    pub input_scale: Option<String>,
    pub out: usize,
    pub inputs: usize,
}

fn is_float(d: &DType) -> bool {
    matches!(d, DType::F32 | DType::BF16 | DType::F16)
}

/// Checks every weight of `expected` against `ckpt`.
pub fn check_contract(
    ckpt: &Checkpoint,
    dir: &str,
    expected: &[WeightInfo],
    consts: &Consts,
    experts: usize,
    quant: Option<&QuantConfig>,
) -> Result<Resolved, ContractError> {
    let mut problems = Vec::new();
    let mut resolved = Vec::new();
    let mut nvfp4 = std::collections::BTreeMap::new();
    let mut dtype_counts: std::collections::BTreeMap<String, usize> = Default::default();
    for w in expected {
        let source = match resolve(ckpt, &w.name, experts) {
            Ok(s) => s,
            Err(tried) => {
                if !w.optional {
                    problems.push(Problem::Missing {
                        weight: w.name.clone(),
                        tried,
                    });
                }
                continue;
            }
        };
        let before = problems.len();
        for (tensor, want) in part_shapes(&source, &w.shape) {
            let info = ckpt
                .info(tensor)
                .expect("resolve only returns present tensors");
            // NVFP4 is read for the routed experts (stored per expert) only.
            let per_expert = matches!(source, Source::PerExpert { .. });
            if w.class == WeightClass::Float && info.dtype == DType::U8 && per_expert {
                match nvfp4_matrix(ckpt, tensor, &info.shape, &want, quant) {
                    Ok(m) => {
                        nvfp4.insert(tensor.to_string(), m);
                    }
                    Err(mut p) => problems.append(&mut p),
                }
                continue;
            }
            if !want.admits(&info.shape) {
                problems.push(Problem::Shape {
                    tensor: tensor.to_string(),
                    expected: want.shown(&info.shape),
                    found: info.shape.clone(),
                });
            }
            match w.class {
                WeightClass::Float if !is_float(&info.dtype) => problems.push(Problem::Dtype {
                    tensor: tensor.to_string(),
                    expected: "f32, bf16 or f16",
                    found: info.dtype.to_string(),
                }),
                WeightClass::I64 if info.dtype != DType::I64 => problems.push(Problem::Dtype {
                    tensor: tensor.to_string(),
                    expected: "i64",
                    found: info.dtype.to_string(),
                }),
                WeightClass::Float => *dtype_counts.entry(info.dtype.to_string()).or_default() += 1,
                WeightClass::I64 => {}
            }
        }
        if let Source::PerExpert { parts } = &source {
            // One bank is one format: the kernels read a bank as all NVFP4 or all float.
            let tensors: Vec<&String> = parts.iter().flatten().collect();
            let packed = tensors
                .iter()
                .filter(|t| nvfp4.contains_key(t.as_str()))
                .count();
            let codes = |t: &&&String| ckpt.info(t).is_some_and(|i| i.dtype == DType::U8);
            if let Some(float) = tensors.iter().find(|t| !codes(t)).filter(|_| packed > 0) {
                let first = tensors.iter().find(|t| codes(t)).expect("some are packed");
                problems.push(Problem::Quant {
                    tensor: float.to_string(),
                    msg: format!(
                        "stored as {}, but {first} of the same bank is NVFP4: a bank is one format",
                        ckpt.info(float).map_or("?".into(), |i| i.dtype.to_string())
                    ),
                });
            }
        }
        if let Source::Shards(shards) = &source {
            // Each shard's own width was checked above; here the row blocks must add up.
            let rows: usize = shards
                .iter()
                .filter_map(|s| ckpt.info(s)?.shape.first().copied())
                .fold(0, usize::saturating_add);
            if w.shape.first() != Some(&rows) {
                let mut found = w.shape.clone();
                if let Some(first) = found.first_mut() {
                    *first = rows;
                }
                problems.push(Problem::Shape {
                    tensor: format!("{} ({} shards, rows summed)", shards[0], shards.len()),
                    expected: w.shape.clone(),
                    found,
                });
            }
        }
        if problems.len() == before && w.class == WeightClass::I64 {
            if let (Source::Single(tensor), Some(expect)) =
                (&source, buffer_expectation(&w.name, consts))
            {
                // The shape matched the plan's table, so this reads no more than the plan holds.
                let found = ckpt.to_i64(tensor)?;
                if found != expect {
                    problems.push(Problem::BufferValues {
                        tensor: tensor.clone(),
                        expected: expect,
                        found,
                    });
                }
            }
        }
        resolved.push((w.clone(), source));
    }
    let used: std::collections::HashSet<&str> = resolved
        .iter()
        .flat_map(|(_, s)| s.tensors())
        .chain(nvfp4.values().flat_map(|m: &Nvfp4Tensors| {
            [Some(&m.scale), Some(&m.global), m.input_scale.as_ref()]
                .into_iter()
                .flatten()
                .map(|s| s.as_str())
        }))
        .collect();
    let unused: Vec<String> = ckpt
        .names()
        .filter(|n| !used.contains(n))
        .map(|n| n.to_string())
        .collect();
    if !problems.is_empty() {
        problems.extend(
            unused
                .into_iter()
                .filter(|n| !COMPANION_PREFIXES.iter().any(|p| n.starts_with(p)))
                .map(|tensor| Problem::Unexpected { tensor }),
        );
        return Err(ContractError::Mismatch {
            dir: dir.to_string(),
            fields: field_mismatches(ckpt, expected),
            problems,
        });
    }
    let float_dtype = dtype_counts
        .into_iter()
        .max_by_key(|(_, c)| *c)
        .map(|(d, _)| d)
        .unwrap_or_else(|| "f32".to_string());
    Ok(Resolved {
        weights: resolved,
        float_dtype,
        unused,
        nvfp4,
    })
}

/// The NVFP4 matrix whose codes are the U8 `tensor` of stored shape `stored`, its logical shape
/// wanted as `want`: its scales found and checked, or every problem with them.
fn nvfp4_matrix(
    ckpt: &Checkpoint,
    tensor: &str,
    stored: &[usize],
    want: &Want,
    quant: Option<&QuantConfig>,
) -> Result<Nvfp4Tensors, Vec<Problem>> {
    let problem = |t: &str, msg: String| Problem::Quant {
        tensor: t.to_string(),
        msg,
    };
    let Some(quant) = quant else {
        return Err(vec![Problem::Dtype {
            tensor: tensor.to_string(),
            expected: "f32, bf16 or f16 (u8 holds NVFP4 codes only where hf_quant_config.json or quantization_config declares NVFP4)",
            found: "u8".into(),
        }]);
    };
    let module = tensor.strip_suffix(".weight").unwrap_or(tensor);
    if let Some(pattern) = quant.excludes(module) {
        return Err(vec![problem(
            tensor,
            format!(
                "quantised, but {} excludes module {module} (pattern `{pattern}`)",
                quant.origin
            ),
        )]);
    }
    let (out, half) = match stored {
        [out, half] => (*out, *half),
        _ => {
            return Err(vec![problem(
                tensor,
                format!("NVFP4 codes of shape {stored:?}, expected [out, in/2]"),
            )])
        }
    };
    let inputs = half.saturating_mul(2);
    if !want.admits(&[out, inputs]) {
        return Err(vec![Problem::Shape {
            tensor: format!("{tensor} (NVFP4 codes [{out}, {half}]: [out, in/2])"),
            expected: want.shown(&[out, inputs]),
            found: vec![out, inputs],
        }]);
    }
    let mut problems = Vec::new();
    if inputs % quant.group_size != 0 {
        problems.push(problem(
            tensor,
            format!(
                "{inputs} inputs are not whole groups of {}",
                quant.group_size
            ),
        ));
    }
    // A scale tensor beside the codes, of `dtype` and one of `shape`s (None where absent).
    let companion = |suffix: &str,
                     (dtype, shown): (&str, &'static str),
                     shape: &[&[usize]],
                     problems: &mut Vec<Problem>| {
        let name = format!("{module}.{suffix}");
        let info = ckpt.info(&name)?;
        if info.dtype.safetensors_name() != dtype {
            problems.push(Problem::Dtype {
                tensor: name.clone(),
                expected: shown,
                found: info.dtype.to_string(),
            });
        } else if !shape.contains(&info.shape.as_slice()) {
            problems.push(Problem::Shape {
                tensor: name.clone(),
                expected: shape[0].to_vec(),
                found: info.shape.clone(),
            });
        }
        Some(name)
    };
    let groups = inputs / quant.group_size.max(1);
    let (e4m3, f32) = (("F8_E4M3", "f8_e4m3"), ("F32", "f32"));
    let scalar: &[&[usize]] = &[&[], &[1]];
    let scale = companion("weight_scale", e4m3, &[&[out, groups]], &mut problems);
    let global = companion("weight_scale_2", f32, scalar, &mut problems);
    let input_scale = companion("input_scale", f32, scalar, &mut problems);
    for (name, found) in [("weight_scale", &scale), ("weight_scale_2", &global)] {
        if found.is_none() {
            problems.push(Problem::Missing {
                weight: format!("the NVFP4 scales of {tensor}"),
                tried: vec![format!("{module}.{name}")],
            });
        }
    }
    if let (Some(g), true) = (&global, problems.is_empty()) {
        match ckpt.to_f32(g).map(|v| v.first().copied()) {
            Ok(Some(v)) if v.is_finite() && v > 0.0 => {}
            Ok(v) => problems.push(problem(
                g,
                format!("global scale {v:?}: must be finite and positive"),
            )),
            Err(e) => problems.push(problem(g, e.to_string())),
        }
    }
    match (scale, global, problems.is_empty()) {
        (Some(scale), Some(global), true) => Ok(Nvfp4Tensors {
            codes: tensor.to_string(),
            scale,
            global,
            input_scale,
            out,
            inputs,
        }),
        _ => Err(problems),
    }
}

/// The shape one checkpoint tensor of a source must have.
#[derive(Clone)]
enum Want {
    Exactly(Vec<usize>),
    /// A row block of a table `cols` wide (n-gram shards: the rows are checked in sum).
    Rows {
        cols: Option<usize>,
    },
    /// No layout fits: the canonical shape is not what per-expert parts can make.
    Impossible(Vec<usize>),
}

impl Want {
    fn admits(&self, shape: &[usize]) -> bool {
        match self {
            Want::Exactly(s) => s == shape,
            Want::Rows { cols } => shape.len() == 2 && Some(shape[1]) == *cols,
            Want::Impossible(_) => false,
        }
    }

    /// What the error shows as expected for a tensor of `found` shape.
    fn shown(&self, found: &[usize]) -> Vec<usize> {
        match self {
            Want::Exactly(s) | Want::Impossible(s) => s.clone(),
            Want::Rows { cols } => vec![found.first().copied().unwrap_or(0), cols.unwrap_or(0)],
        }
    }
}

/// The checkpoint tensors of a source with the shape each must have.
fn part_shapes<'a>(source: &'a Source, shape: &[usize]) -> Vec<(&'a str, Want)> {
    match source {
        Source::Single(n) => vec![(n.as_str(), Want::Exactly(shape.to_vec()))],
        Source::PerExpert { parts } => parts
            .iter()
            .flat_map(|p| {
                // Fused `[E, rows, cols]` from one `[rows, cols]` tensor per expert, or from a
                // gate and an up half of `rows / 2` each.
                let per = match (shape, p.len()) {
                    (&[_, rows, cols], 1) => Want::Exactly(vec![rows, cols]),
                    (&[_, rows, cols], 2) if rows % 2 == 0 => Want::Exactly(vec![rows / 2, cols]),
                    _ => Want::Impossible(shape.to_vec()),
                };
                p.iter().map(move |n| (n.as_str(), per.clone()))
            })
            .collect(),
        Source::Shards(v) => v
            .iter()
            .map(|n| {
                let cols = if shape.len() == 2 {
                    shape.get(1).copied()
                } else {
                    None
                };
                (n.as_str(), Want::Rows { cols })
            })
            .collect(),
    }
}

/// The values an int64 PLE buffer must hold, from the plan's tables.
pub fn buffer_expectation(name: &str, consts: &Consts) -> Option<Vec<i64>> {
    let layer: usize = name
        .strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()?;
    let table = consts.ple_tables.iter().find(|t| t.layer == layer)?;
    if name.ends_with("layer_multipliers") {
        Some(table.multipliers.clone())
    } else if name.ends_with("ngram_heads_vocab_sizes") {
        Some(table.head_sizes.clone())
    } else if name.ends_with("ngram_heads_offsets") {
        Some(table.head_offsets.clone())
    } else {
        None
    }
}

/// Scans every stored float tensor of a checked contract for NaN and infinity
/// ([`find_non_finite`], on the mapped bytes, in parallel): the list of those that hold some, by
/// tensor name. (NVFP4 codes and scales have no non-finite values: NaN scale bytes read as +0,
/// and the global scales were checked finite and positive.)
pub fn check_finite(ckpt: &Checkpoint, resolved: &Resolved) -> Result<(), ContractError> {
    check_finite_except(ckpt, resolved, &[])
}

/// [`check_finite`] but for the checkpoint tensors `skipped` (tables read a few rows at a time,
/// whose rows are checked as they are read).
pub fn check_finite_except(
    ckpt: &Checkpoint,
    resolved: &Resolved,
    skipped: &[&str],
) -> Result<(), ContractError> {
    let mut bad: Vec<NonFiniteTensor> = resolved
        .weights
        .par_iter()
        .filter(|(w, _)| w.class == WeightClass::Float)
        .flat_map_iter(|(_, source)| source.tensors())
        .filter(|name| !skipped.contains(name))
        .filter_map(|name| {
            let info = ckpt.info(name)?;
            let found = find_non_finite(&info.dtype, ckpt.bytes(name).ok()?)?;
            Some(NonFiniteTensor {
                tensor: info.name,
                file: info.file,
                dtype: info.dtype,
                shape: info.shape,
                found,
            })
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    bad.sort_by(|a, b| a.tensor.cmp(&b.tensor));
    Err(ContractError::NonFinite { tensors: bad })
}

/// What a load does with NVFP4 banks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nvfp4Load {
    /// Widened to f32 (`quant::nvfp4`'s meaning): the CPU reference computes with them.
    Widen,
    /// Kept as stored ([`super::Nvfp4Bank`]): a device computes with the packed form.
    Packed,
}

/// Loads every float weight of a checked contract as f32 (in parallel), NVFP4 banks widened.
pub fn load(ckpt: &Checkpoint, resolved: &Resolved) -> Result<Weights, ContractError> {
    load_with(ckpt, resolved, Nvfp4Load::Widen)
}

/// Loads every float weight of a checked contract (in parallel): as f32, NVFP4 banks as
/// `nvfp4` says, after [`check_finite`] (if a tensor holds NaN or infinity, nothing is loaded).
pub fn load_with(
    ckpt: &Checkpoint,
    resolved: &Resolved,
    nvfp4: Nvfp4Load,
) -> Result<Weights, ContractError> {
    check_finite(ckpt, resolved)?;
    let floats: Vec<&(WeightInfo, Source)> = resolved
        .weights
        .iter()
        .filter(|(w, _)| w.class == WeightClass::Float)
        .collect();
    let is_packed = |source: &Source| {
        nvfp4 == Nvfp4Load::Packed
            && source
                .tensors()
                .first()
                .is_some_and(|t| resolved.nvfp4.contains_key(*t))
    };
    let banks: Vec<(String, super::Nvfp4Bank)> = floats
        .par_iter()
        .filter(|(_, source)| is_packed(source))
        .map(|(w, source)| Ok((w.name.clone(), packed_bank(ckpt, resolved, w, source)?)))
        .collect::<Result<_, CheckpointError>>()?;
    let loaded: Vec<(String, WeightTensor)> = floats
        .par_iter()
        .filter(|(_, source)| !is_packed(source))
        .map(|(w, source)| {
            let data = match source {
                Source::Single(n) => ckpt.to_f32(n)?,
                // Per-expert parts (gate then up rows of each expert) and table shards are both
                // row blocks of the canonical tensor, in order. The checked contract bounds the
                // element count by the checkpoint's own sizes.
                Source::PerExpert { .. } | Source::Shards(_) => {
                    let elements = w
                        .shape
                        .iter()
                        .try_fold(1usize, |a, &d| a.checked_mul(d))
                        .unwrap_or(0);
                    let mut data = Vec::with_capacity(elements);
                    for n in source.tensors() {
                        match resolved.nvfp4.get(n) {
                            Some(m) => data.extend(dequantize(ckpt, m)?),
                            None => data.extend(ckpt.to_f32(n)?),
                        }
                    }
                    data
                }
            };
            Ok((
                w.name.clone(),
                WeightTensor {
                    shape: w.shape.clone(),
                    data,
                },
            ))
        })
        .collect::<Result<_, CheckpointError>>()?;
    let mut weights = Weights::new();
    for (n, t) in loaded {
        weights.insert(n, t);
    }
    for (n, b) in banks {
        weights.insert_nvfp4(n, b);
    }
    Ok(weights)
}

/// The NVFP4 parts of `w` (each an NVFP4 matrix of the same shape: the contract refuses a bank
/// mixing formats) concatenated in order, as stored.
fn packed_bank(
    ckpt: &Checkpoint,
    resolved: &Resolved,
    w: &WeightInfo,
    source: &Source,
) -> Result<super::Nvfp4Bank, CheckpointError> {
    let parts: Vec<&Nvfp4Tensors> = source
        .tensors()
        .into_iter()
        .filter_map(|t| resolved.nvfp4.get(t))
        .collect();
    let rows_per_global = parts.first().map_or(0, |m| m.out);
    let mut bank = super::Nvfp4Bank {
        shape: w.shape.clone(),
        codes: Vec::new(),
        scales: Vec::new(),
        globals: Vec::with_capacity(parts.len()),
        rows_per_global,
    };
    for m in parts {
        bank.codes.extend_from_slice(ckpt.bytes(&m.codes)?);
        bank.scales.extend_from_slice(ckpt.bytes(&m.scale)?);
        bank.globals.push(ckpt.to_f32(&m.global)?[0]);
    }
    Ok(bank)
}

/// An NVFP4 matrix in f32 (`quant::nvfp4`: `(e2m1 * e4m3) * global`), as the CPU reference
/// computes with it.
fn dequantize(ckpt: &Checkpoint, m: &Nvfp4Tensors) -> Result<Vec<f32>, CheckpointError> {
    let global = ckpt.to_f32(&m.global)?;
    let packed = Packed {
        out: m.out,
        inputs: m.inputs,
        codes: ckpt.bytes(&m.codes)?,
        scales: ckpt.bytes(&m.scale)?,
        global: global[0],
    };
    Ok(packed.dequantize())
}

/// Refuses a plan with more layers than the checkpoint in `dir` holds ([`size_mismatches`]),
/// before anything is built from the count.
pub fn check_sizes(plan: &ModelPlan, ckpt: &Checkpoint, dir: &str) -> Result<(), ContractError> {
    let fields = size_mismatches(plan, ckpt);
    if fields.is_empty() {
        return Ok(());
    }
    Err(ContractError::Sizes {
        dir: dir.to_string(),
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = include_str!("../../tests/data/configs/tiny_flat.json");

    /// Found by the fuzz suite (model-header, seed 1): a tensor renamed to layer 2^64 - 1; the
    /// refusal names the field, the count and why.
    #[test]
    fn more_layers_than_the_checkpoint_holds_are_refused_by_field() {
        let plan = ModelPlan::from_json_str(TINY, "tiny.json").unwrap();
        let far = "model.layers.18446744073709551615.x";
        let ckpt = crate::weights::test_checkpoint("far-sizes", &[far]);
        let err = check_sizes(&plan, &ckpt, "/m").unwrap_err().to_string();
        assert_eq!(
            err,
            "checkpoint /m does not hold the sizes config.json gives:\n  cause: config.json num_hidden_layers = 2, but the checkpoint holds 1 (tensors of 1 distinct layer indices, not 0 to 0)"
        );
        let ckpt = crate::weights::test_checkpoint("none-sizes", &["lm_head.weight"]);
        let err = check_sizes(&plan, &ckpt, "/m").unwrap_err().to_string();
        assert!(
            err.ends_with(
                "holds 0 (no tensor under model.layers. or model.language_model.layers.)"
            ),
            "{err}"
        );
        let two = ["model.layers.0.x", "model.layers.1.y"];
        check_sizes(
            &plan,
            &crate::weights::test_checkpoint("two-sizes", &two),
            "/m",
        )
        .unwrap();
    }

    fn missing(i: usize) -> Problem {
        Problem::Missing {
            weight: format!("model.layers.{i}.w"),
            tried: vec![format!("model.layers.{i}.w")],
        }
    }

    #[test]
    fn a_short_list_is_shown_whole() {
        let problems: Vec<Problem> = (0..MAX_SHOWN).map(missing).collect();
        let err = ContractError::Mismatch {
            dir: "/m".into(),
            fields: Vec::new(),
            problems,
        };
        let text = err.to_string();
        assert_eq!(text.lines().count(), 1 + MAX_SHOWN, "{text}");
        assert!(!text.contains("more not shown"), "{text}");
    }

    /// A list far longer than anyone reads: fixed-length output, counts by kind. (Building it is
    /// linear; the quadratic report this replaces took minutes at this size.)
    #[test]
    fn a_long_list_is_cut_and_counted_by_kind() {
        let n = 300_000;
        let mut problems: Vec<Problem> = (0..n).map(missing).collect();
        problems.push(Problem::Shape {
            tensor: "a".into(),
            expected: vec![1],
            found: vec![2],
        });
        problems.push(Problem::Dtype {
            tensor: "b".into(),
            expected: "i64",
            found: "f32".into(),
        });
        problems.push(Problem::Unexpected { tensor: "c".into() });
        let total = n + 3;
        let err = ContractError::Mismatch {
            dir: "/m".into(),
            fields: vec![FieldMismatch {
                field: "num_hidden_layers".into(),
                config: 9,
                checkpoint: 4,
                evidence: "tensors of layers 0 to 3".into(),
            }],
            problems,
        };
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 1 + MAX_SHOWN + 1, "{text}");
        assert_eq!(
            lines[0],
            format!("checkpoint /m does not match config.json ({total} problem(s)):")
        );
        assert_eq!(
            lines[1],
            "  cause: config.json num_hidden_layers = 9, but the checkpoint holds 4 (tensors of layers 0 to 3)"
        );
        assert_eq!(
            lines[2],
            "  - missing model.layers.0.w (looked for: model.layers.0.w)"
        );
        assert_eq!(
            lines[lines.len() - 1],
            format!(
                "  ... {} more not shown; by kind: {n} missing, 1 wrong shape, 1 wrong dtype, 0 wrong values, 0 wrong quantisation, 1 unexpected ({total} in all)",
                total - MAX_SHOWN
            )
        );
    }

    #[test]
    fn long_buffers_are_shown_cut() {
        let p = Problem::BufferValues {
            tensor: "t".into(),
            expected: (0..100).collect(),
            found: vec![1, 2],
        };
        let text = p.to_string();
        assert!(text.contains("values [1, 2] differ from [0, 1,"), "{text}");
        assert!(text.contains("15] and 84 more"), "{text}");
    }
}
