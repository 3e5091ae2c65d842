//! Scaled dot-product attention with GQA over the KV cache, restricted per row to a selection.
//! `softmax(q·Kᵀ / sqrt(head_dim)) · V` over the row's positions in ascending order.

use rayon::prelude::*;

use super::dot;
use super::indexer::RowSel;

pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `q [T, heads*hd]`; `keys`/`values` hold every cached position `[N, kv_heads*hd]`.
pub fn attend(q: &[f32], keys: &[f32], values: &[f32], sel: &[RowSel], s: &AttnShape) -> Vec<f32> {
    let hd = s.head_dim;
    let qw = s.heads * hd;
    let kw = s.kv_heads * hd;
    let group = s.heads / s.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let tokens = sel.len();
    let mut out = vec![0.0f32; tokens * qw];
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (t, h) = (i / s.heads, i % s.heads);
        let kvh = h / group;
        let qh = &q[t * qw + h * hd..t * qw + (h + 1) * hd];
        let positions = sel[t].positions();
        let scores: Vec<f32> = positions
            .iter()
            .map(|&p| dot(qh, &keys[p * kw + kvh * hd..p * kw + (kvh + 1) * hd]) * scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f32 = exps.iter().sum();
        for (&p, e) in positions.iter().zip(&exps) {
            let w = e / sum;
            let v = &values[p * kw + kvh * hd..p * kw + (kvh + 1) * hd];
            for (oj, vj) in o.iter_mut().zip(v) {
                *oj += w * vj;
            }
        }
    });
    out
}

/// Splits the fused q projection: per head, `head_dim` query channels then `head_dim` gate channels.
pub fn split_q_gate(qg: &[f32], tokens: usize, heads: usize, hd: usize) -> (Vec<f32>, Vec<f32>) {
    let mut q = Vec::with_capacity(tokens * heads * hd);
    let mut gate = Vec::with_capacity(tokens * heads * hd);
    for chunk in qg.chunks(2 * hd) {
        q.extend_from_slice(&chunk[..hd]);
        gate.extend_from_slice(&chunk[hd..]);
    }
    (q, gate)
}
