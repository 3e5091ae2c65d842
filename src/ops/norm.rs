//! RMS norms. All compute `x * rsqrt(mean(x²) + eps)` in f32 over a group of channels.

use crate::ir::GateActivation;

use super::{sigmoid, silu};

/// Grouped RMS norm: every `group` consecutive channels are normalised on their own, then scaled
/// by `w` (or `1 + w` with `unit_offset`); `w` has one entry per channel or one per group channel.
pub fn rms_norm(x: &[f32], w: &[f32], group: usize, unit_offset: bool, eps: f32) -> Vec<f32> {
    let width_w = w.len();
    let mut out = vec![0.0f32; x.len()];
    for (g, (xs, os)) in x.chunks(group).zip(out.chunks_mut(group)).enumerate() {
        let ms = xs.iter().map(|v| v * v).sum::<f32>() / group as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (c, (xv, o)) in xs.iter().zip(os.iter_mut()).enumerate() {
            let wi = if width_w == group {
                w[c]
            } else {
                w[(g * group + c) % width_w]
            };
            let scale = if unit_offset { 1.0 + wi } else { wi };
            *o = xv * inv * scale;
        }
    }
    out
}

/// GDN output norm: per head of `head_dim`, `w * rms(x) * act(gate)` (plain `w`, not `1 + w`).
pub fn gated_rms_norm(
    x: &[f32],
    gate: &[f32],
    w: &[f32],
    head_dim: usize,
    act: GateActivation,
    eps: f32,
) -> Vec<f32> {
    let normed = rms_norm(x, w, head_dim, false, eps);
    normed
        .iter()
        .zip(gate)
        .map(|(n, g)| {
            let a = match act {
                GateActivation::Sigmoid => sigmoid(*g),
                GateActivation::Silu => silu(*g),
            };
            n * a
        })
        .collect()
}
