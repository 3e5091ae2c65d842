//! The tensor contract: every weight a program needs, with its shape and element class, checked
//! against a checkpoint before any compute. All problems are collected and reported together,
//! each by its checkpoint name.

use rayon::prelude::*;
use thiserror::Error;

use crate::checkpoint::{Checkpoint, CheckpointError, DType};
use crate::ir::{Consts, WeightClass, WeightInfo};

use super::resolve::{resolve, Source};
use super::{WeightTensor, Weights};

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
                "{tensor}: values {found:?} differ from {expected:?}, recomputed from config.json (wrong ngram settings?)"
            ),
        }
    }
}

#[derive(Debug, Error)]
pub enum ContractError {
    #[error("checkpoint {dir} does not match config.json ({} problem(s)):\n{}", problems.len(), list(problems))]
    Mismatch { dir: String, problems: Vec<Problem> },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A contract that holds: where each weight comes from, and the checkpoint's float dtype.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub weights: Vec<(WeightInfo, Source)>,
    /// `f32`, `bf16` or `f16`: the dtype of most float weights (for rules and reports).
    pub float_dtype: String,
    /// Checkpoint tensors no weight uses (`mtp.*`, `model.visual.*` and anything unexpected).
    pub unused: Vec<String>,
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
) -> Result<Resolved, ContractError> {
    let mut problems = Vec::new();
    let mut resolved = Vec::new();
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
        for (tensor, shape) in part_shapes(&source, &w.shape) {
            let info = ckpt
                .info(tensor)
                .expect("resolve only returns present tensors");
            if let Some(expected_shape) = shape {
                if info.shape != expected_shape {
                    problems.push(Problem::Shape {
                        tensor: tensor.to_string(),
                        expected: expected_shape,
                        found: info.shape.clone(),
                    });
                }
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
        if let Source::Shards(shards) = &source {
            let rows: usize = shards
                .iter()
                .map(|s| {
                    ckpt.info(s)
                        .map(|i| i.shape.first().copied().unwrap_or(0))
                        .unwrap_or(0)
                })
                .sum();
            if rows != w.shape[0] {
                problems.push(Problem::Shape {
                    tensor: format!("{} ({} shards, rows summed)", shards[0], shards.len()),
                    expected: w.shape.clone(),
                    found: vec![rows, w.shape[1]],
                });
            }
        }
        if problems.len() == before && w.class == WeightClass::I64 {
            if let (Source::Single(tensor), Some(expect)) =
                (&source, buffer_expectation(&w.name, consts))
            {
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
    if !problems.is_empty() {
        return Err(ContractError::Mismatch {
            dir: dir.to_string(),
            problems,
        });
    }
    let used: std::collections::HashSet<&str> =
        resolved.iter().flat_map(|(_, s)| s.tensors()).collect();
    let unused = ckpt
        .names()
        .filter(|n| !used.contains(n))
        .map(|n| n.to_string())
        .collect();
    let float_dtype = dtype_counts
        .into_iter()
        .max_by_key(|(_, c)| *c)
        .map(|(d, _)| d)
        .unwrap_or_else(|| "f32".to_string());
    Ok(Resolved {
        weights: resolved,
        float_dtype,
        unused,
    })
}

/// The checkpoint tensors of a source with the shape each must have (None: checked in sum).
fn part_shapes<'a>(source: &'a Source, shape: &[usize]) -> Vec<(&'a str, Option<Vec<usize>>)> {
    match source {
        Source::Single(n) => vec![(n.as_str(), Some(shape.to_vec()))],
        Source::PerExpert { parts } => parts
            .iter()
            .flat_map(|p| {
                let per = if p.len() == 2 {
                    // gate and up halves of [E, 2I, H]
                    vec![shape[1] / 2, shape[2]]
                } else {
                    vec![shape[1], shape[2]]
                };
                p.iter().map(move |n| (n.as_str(), Some(per.clone())))
            })
            .collect(),
        Source::Shards(v) => v.iter().map(|n| (n.as_str(), None)).collect(),
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

/// Loads every float weight of a checked contract as f32 (in parallel).
pub fn load(ckpt: &Checkpoint, resolved: &Resolved) -> Result<Weights, CheckpointError> {
    let loaded: Vec<(String, WeightTensor)> = resolved
        .weights
        .par_iter()
        .filter(|(w, _)| w.class == WeightClass::Float)
        .map(|(w, source)| {
            let data = match source {
                Source::Single(n) => ckpt.to_f32(n)?,
                // Per-expert parts (gate then up rows of each expert) and table shards are both
                // row blocks of the canonical tensor, in order.
                Source::PerExpert { .. } | Source::Shards(_) => {
                    let mut data = Vec::with_capacity(w.shape.iter().product());
                    for n in source.tensors() {
                        data.extend(ckpt.to_f32(n)?);
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
    Ok(weights)
}
