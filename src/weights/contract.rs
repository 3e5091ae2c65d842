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
        }
    }
}

/// The kinds in the order the summary counts them.
const KINDS: [&str; 5] = [
    "missing",
    "wrong shape",
    "wrong dtype",
    "wrong values",
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
        for (tensor, want) in part_shapes(&source, &w.shape) {
            let info = ckpt
                .info(tensor)
                .expect("resolve only returns present tensors");
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
    let used: std::collections::HashSet<&str> =
        resolved.iter().flat_map(|(_, s)| s.tensors()).collect();
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
    })
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

/// Loads every float weight of a checked contract as f32 (in parallel). Each stored tensor is
/// first scanned for NaN and infinity ([`find_non_finite`], on the mapped bytes); if any holds
/// some, nothing is returned but the list of them, by tensor name.
pub fn load(ckpt: &Checkpoint, resolved: &Resolved) -> Result<Weights, ContractError> {
    let floats: Vec<&(WeightInfo, Source)> = resolved
        .weights
        .iter()
        .filter(|(w, _)| w.class == WeightClass::Float)
        .collect();
    let mut bad: Vec<NonFiniteTensor> = floats
        .par_iter()
        .flat_map_iter(|(_, source)| source.tensors())
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
    if !bad.is_empty() {
        bad.sort_by(|a, b| a.tensor.cmp(&b.tensor));
        return Err(ContractError::NonFinite { tensors: bad });
    }
    let loaded: Vec<(String, WeightTensor)> = floats
        .par_iter()
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
                "  ... {} more not shown; by kind: {n} missing, 1 wrong shape, 1 wrong dtype, 0 wrong values, 1 unexpected ({total} in all)",
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
