//! The QSA indexer's block selection (HF `Qwen4ExpTextQSAIndexer`).
//!
//! For a query at position `p` the visible keys are `0..=p` (N = p+1). They form `nb = N / block`
//! complete blocks and a tail of `N mod block` keys. A block's key is the mean of its raw keys,
//! `k_layernorm`ed and roped at the block's first position; its score is
//! `Σ_h relu(q_h · kb) / sqrt(head_dim)`. When `nb <= budget/block` every block is kept (dense);
//! otherwise the top `budget/block` scores (ties: lower block first) are kept, plus the tail.

use super::norm::rms_norm;
use super::rope;

/// Which keys one query row attends.
#[derive(Debug, Clone, PartialEq)]
pub enum RowSel {
    /// Every position `0..visible`.
    Dense { visible: usize },
    /// The chosen blocks (ascending), plus the tail `[complete*block, visible)`.
    Sparse {
        visible: usize,
        blocks: Vec<usize>,
        block: usize,
    },
}

impl RowSel {
    /// Attended positions in ascending order.
    pub fn positions(&self) -> Vec<usize> {
        match self {
            RowSel::Dense { visible } => (0..*visible).collect(),
            RowSel::Sparse {
                visible,
                blocks,
                block,
            } => {
                let complete = visible / block;
                let mut out: Vec<usize> = blocks
                    .iter()
                    .flat_map(|b| b * block..(b + 1) * block)
                    .collect();
                out.extend(complete * block..*visible);
                out
            }
        }
    }
}

pub struct IndexerShape {
    pub heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub budget: usize,
    pub block: usize,
}

impl IndexerShape {
    /// The shape an indexer op (`IndexerSelect`, or `IndexerSelectQk` over its projection) runs.
    pub fn of(op: &crate::ir::Op<usize>) -> Option<IndexerShape> {
        use crate::ir::Op;
        match *op {
            Op::IndexerSelect {
                heads,
                head_dim,
                rotary_dim,
                budget,
                block,
            }
            | Op::IndexerSelectQk {
                heads,
                head_dim,
                rotary_dim,
                budget,
                block,
            } => Some(IndexerShape {
                heads,
                head_dim,
                rotary_dim,
                budget,
                block,
            }),
            _ => None,
        }
    }
}

/// Extends `pooled` (rows of `head_dim`) with the keys of blocks completed by `raw_keys`, each
/// rotated at its first row's position (the row plus `rope_offset`).
pub fn pool_blocks(
    raw_keys: &[f32],
    pooled: &mut Vec<f32>,
    k_norm: &[f32],
    s: &IndexerShape,
    eps: f32,
    theta: f64,
    rope_offset: usize,
) {
    let d = s.head_dim;
    let complete = raw_keys.len() / d / s.block;
    for b in pooled.len() / d..complete {
        let mut mean = vec![0.0f32; d];
        for r in b * s.block..(b + 1) * s.block {
            for (m, v) in mean.iter_mut().zip(&raw_keys[r * d..(r + 1) * d]) {
                *m += v;
            }
        }
        for m in mean.iter_mut() {
            *m /= s.block as f32;
        }
        let mut key = rms_norm(&mean, k_norm, d, true, eps);
        let (cos, sin) = rope::angles(b * s.block + rope_offset, s.rotary_dim, theta);
        rope::rotate_head(&mut key, &cos, &sin);
        pooled.extend_from_slice(&key);
    }
}

/// Selection for each query row; `queries [T, heads*head_dim]` are already normalised and roped,
/// row `t` is at position `start + t`. `pooled` must cover every complete block up to the last row.
pub fn select(
    queries: &[f32],
    pooled: &[f32],
    tokens: usize,
    start: usize,
    s: &IndexerShape,
) -> Vec<RowSel> {
    let d = s.head_dim;
    let keep = s.budget / s.block;
    let sqrt_d = (d as f32).sqrt();
    (0..tokens)
        .map(|t| {
            let visible = start + t + 1;
            let complete = visible / s.block;
            if complete <= keep {
                return RowSel::Dense { visible };
            }
            let q = &queries[t * s.heads * d..(t + 1) * s.heads * d];
            let scores: Vec<f32> = (0..complete)
                .map(|b| {
                    let kb = &pooled[b * d..(b + 1) * d];
                    let sum: f32 = (0..s.heads)
                        .map(|h| {
                            let dotp: f32 = q[h * d..(h + 1) * d]
                                .iter()
                                .zip(kb)
                                .map(|(a, b)| a * b)
                                .sum();
                            dotp.max(0.0)
                        })
                        .sum();
                    sum / sqrt_d
                })
                .collect();
            let mut order: Vec<usize> = (0..complete).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            let mut blocks = order[..keep].to_vec();
            blocks.sort_unstable();
            RowSel::Sparse {
                visible,
                blocks,
                block: s.block,
            }
        })
        .collect()
}
