//! What a synthetic checkpoint holds, before any value is made: every tensor's name, dtype,
//! shape and size in the order its values are drawn, which program weight each comes from, and
//! which file each goes to. Headers are written from this, then the data streamed.

use std::ops::Range;

use crate::checkpoint::DType;
use crate::error::{Error, Result};
use crate::ir::{Program, WeightClass, WeightInfo};
use crate::plan::ModelPlan;
use crate::quant::nvfp4;

use super::{checkpoint_name, ExpertFormat, SynthDtype, SynthOptions};

/// One tensor of the checkpoint.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Data bytes.
    pub len: usize,
    /// Left as a hole (a sparse checkpoint's bulk tensor): never written, reads as zeros.
    pub hole: bool,
}

/// How a program weight's values become tensors.
#[derive(Debug, Clone)]
pub(super) enum Source {
    /// An int64 buffer with these values.
    Buffer(Vec<i64>),
    /// The weight's random values in order, encoded in the checkpoint's float dtype, cut into
    /// the part's tensors (one; or the n-gram table's row pieces).
    Float,
    /// A fused expert bank as ModelOpt NVFP4, per expert and per projection (`kinds` of them,
    /// `out` rows by `cols` each, in the bank's row order): codes, block scales, global scale,
    /// input scale.
    Nvfp4 {
        experts: usize,
        kinds: usize,
        out: usize,
        cols: usize,
    },
}

/// A program weight, how it is stored, and its tensors (`tensors` in [`Layout::tensors`]).
pub(super) struct Part<'a> {
    pub weight: &'a WeightInfo,
    pub source: Source,
    pub tensors: Range<usize>,
}

pub(super) struct Layout<'a> {
    pub parts: Vec<Part<'a>>,
    /// Every tensor, in the order its values are drawn.
    pub tensors: Vec<Planned>,
    /// The files: each a run of consecutive tensors.
    pub files: Vec<Range<usize>>,
}

/// The sparse rule: a tensor of rank 2 or more (matrices, embeddings, `lm_head`, expert banks,
/// NVFP4 codes and block scales, the n-gram pieces) is a hole, except the conv1d kernels; the
/// rest (norms, biases, `A_log`, `dt_bias`, conv kernels, scalars such as the NVFP4 global and
/// input scales, the int64 buffers) is written.
pub(super) fn is_bulk(name: &str, dtype: &DType, shape: &[usize]) -> bool {
    shape.len() >= 2 && *dtype != DType::I64 && !name.ends_with("conv1d.weight")
}

impl<'a> Layout<'a> {
    pub fn new(plan: &ModelPlan, program: &'a Program, opts: &SynthOptions) -> Result<Layout<'a>> {
        let float = match opts.dtype {
            SynthDtype::F32 => DType::F32,
            SynthDtype::Bf16 => DType::BF16,
            SynthDtype::F16 => DType::F16,
        };
        let mut tensors: Vec<Planned> = Vec::new();
        let push = |tensors: &mut Vec<Planned>, name: String, dtype: DType, shape: Vec<usize>| {
            let len = shape.iter().product::<usize>() * dtype.size_bytes().unwrap_or(1);
            let hole = opts.sparse && is_bulk(&name, &dtype, &shape);
            tensors.push(Planned {
                name,
                dtype,
                shape,
                len,
                hole,
            });
        };
        let mut parts = Vec::new();
        let mut start = 0;
        for w in &program.weights {
            let name = checkpoint_name(plan, &w.name);
            let source = if w.class == WeightClass::I64 {
                let values = crate::weights::contract::buffer_expectation(&w.name, &program.consts)
                    .unwrap_or_default();
                push(&mut tensors, name, DType::I64, w.shape.clone());
                Source::Buffer(values)
            } else if let Some((base, kinds)) = expert_bank(&name, w, opts) {
                let [experts, rows, cols] = w.shape[..] else {
                    unreachable!("expert_bank checks the rank")
                };
                if !cols.is_multiple_of(nvfp4::GROUP) {
                    return Err(Error::Input(format!(
                        "synth --experts nvfp4: {name} has {cols} input columns, not a multiple \
                         of {}; such projections cannot be stored as NVFP4",
                        nvfp4::GROUP
                    )));
                }
                let out = rows / kinds.len();
                for e in 0..experts {
                    for kind in kinds {
                        let stem = format!("{base}experts.{e}.{kind}");
                        push(
                            &mut tensors,
                            format!("{stem}.weight"),
                            DType::U8,
                            vec![out, cols / 2],
                        );
                        push(
                            &mut tensors,
                            format!("{stem}.weight_scale"),
                            DType::Other("F8_E4M3".into()),
                            vec![out, cols / nvfp4::GROUP],
                        );
                        push(
                            &mut tensors,
                            format!("{stem}.weight_scale_2"),
                            DType::F32,
                            vec![],
                        );
                        push(
                            &mut tensors,
                            format!("{stem}.input_scale"),
                            DType::F32,
                            vec![],
                        );
                    }
                }
                Source::Nvfp4 {
                    experts,
                    kinds: kinds.len(),
                    out,
                    cols,
                }
            } else {
                match (name.strip_suffix("ngram_embedding.weight"), &plan.ple) {
                    // The bf16 release splits the n-gram table into `shard_{k}` pieces; the
                    // NVFP4 release (ModelOpt's export) stores it whole.
                    (Some(base), Some(ple)) if opts.experts != ExpertFormat::Nvfp4 => {
                        // torch.chunk: pieces of ceil(rows/parts) rows, the last one shorter.
                        let (rows, cols) = (w.shape[0], w.shape[1]);
                        let per = rows.div_ceil(ple.split_parts.max(1)).max(1);
                        for (k, first) in (0..rows).step_by(per).enumerate() {
                            let end = (first + per).min(rows);
                            push(
                                &mut tensors,
                                format!("{base}ngram_embedding.shard_{k}.weight"),
                                float.clone(),
                                vec![end - first, cols],
                            );
                        }
                        Source::Float
                    }
                    _ => {
                        push(&mut tensors, name, float.clone(), w.shape.clone());
                        Source::Float
                    }
                }
            };
            let end = tensors.len();
            parts.push(Part {
                weight: w,
                source,
                tensors: start..end,
            });
            start = end;
        }
        let files = split_files(&tensors, opts.shard_bytes);
        Ok(Layout {
            parts,
            tensors,
            files,
        })
    }

    /// Data bytes in all (holes included).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len as u64).sum()
    }
}

/// A fused expert bank to store as NVFP4: its name's stem and its projections in row order.
fn expert_bank<'n>(
    name: &'n str,
    w: &WeightInfo,
    opts: &SynthOptions,
) -> Option<(&'n str, &'static [&'static str])> {
    if opts.experts != ExpertFormat::Nvfp4 || w.shape.len() != 3 {
        return None;
    }
    if let Some(b) = name.strip_suffix("experts.gate_up_proj") {
        Some((b, &["gate_proj", "up_proj"]))
    } else {
        name.strip_suffix("experts.down_proj")
            .map(|b| (b, &["down_proj"][..]))
    }
}

/// Files of at most `shard_bytes` of data, tensors kept in order (a tensor larger than that
/// has a file of its own).
fn split_files(tensors: &[Planned], shard_bytes: usize) -> Vec<Range<usize>> {
    let mut files = Vec::new();
    let (mut first, mut size) = (0, 0usize);
    for (i, t) in tensors.iter().enumerate() {
        if size > 0 && size + t.len > shard_bytes {
            files.push(first..i);
            (first, size) = (i, 0);
        }
        size += t.len;
    }
    files.push(first..tensors.len());
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sparse_rule() {
        let f = DType::BF16;
        assert!(is_bulk("model.layers.0.mlp.gate.weight", &f, &[4, 8]));
        assert!(is_bulk("x.experts.0.up_proj.weight", &DType::U8, &[4, 8]));
        assert!(!is_bulk(
            "model.layers.0.linear_attn.conv1d.weight",
            &f,
            &[8, 1, 4]
        ));
        assert!(!is_bulk("model.norm.weight", &f, &[8]));
        assert!(!is_bulk("x.weight_scale_2", &DType::F32, &[]));
        assert!(!is_bulk("x.ngram_heads_offsets", &DType::I64, &[4, 4]));
    }

    #[test]
    fn files_keep_the_old_split() {
        let t = |len| Planned {
            name: String::new(),
            dtype: DType::U8,
            shape: vec![len],
            len,
            hole: false,
        };
        let ts = [t(6), t(4), t(1), t(20), t(2)];
        assert_eq!(split_files(&ts, 10), [0..2, 2..3, 3..4, 4..5]);
        assert_eq!(split_files(&ts, 100), vec![0..ts.len()]);
        assert_eq!(split_files(&[], 10), vec![0..0usize]);
    }
}
