//! Fused hyper-connection ops (the unfused chains are in `graphs/qwen4exp/hc_read.ron`).

use super::{dot, sigmoid, silu};

/// `mean_s(sigmoid(silu(hn·Wdownᵀ / C)·Wupᵀ) * hn)` for each row of `hn [T, C*H]`.
pub fn hc_mix(hn: &[f32], down: &[f32], up: &[f32], tokens: usize, streams: usize) -> Vec<f32> {
    let width = hn.len() / tokens;
    let rank = down.len() / width;
    let hid = width / streams;
    let mut out = vec![0.0f32; tokens * hid];
    for t in 0..tokens {
        let row = &hn[t * width..(t + 1) * width];
        let act: Vec<f32> = (0..rank)
            .map(|r| silu(dot(row, &down[r * width..(r + 1) * width]) / streams as f32))
            .collect();
        let mut sums = vec![0.0f32; hid];
        for s in 0..streams {
            for (c, sum) in sums.iter_mut().enumerate() {
                let ch = s * hid + c;
                let gate = sigmoid(dot(&act, &up[ch * rank..(ch + 1) * rank]));
                *sum += gate * row[ch];
            }
        }
        for (o, sum) in out[t * hid..(t + 1) * hid].iter_mut().zip(&sums) {
            *o = sum / streams as f32;
        }
    }
    out
}

/// The fused hyper-connection read: `hn = rms_norm(h)` per stream of `H` channels (unit offset),
/// then `(hc_mix(hn), hc_inject(hn))`, as unfused; without `inject` (the exit mixer) only the mix.
#[allow(clippy::too_many_arguments)]
pub fn hc_read(
    h: &[f32],
    norm: &[f32],
    down: &[f32],
    up: &[f32],
    inject: Option<&[f32]>,
    tokens: usize,
    streams: usize,
    eps: f32,
) -> (Vec<f32>, Option<Vec<f32>>) {
    let hid = h.len() / tokens / streams;
    let hn = super::norm::rms_norm(h, norm, hid, true, eps);
    (
        hc_mix(&hn, down, up, tokens, streams),
        inject.map(|w| hc_inject(&hn, w, tokens, streams)),
    )
}

/// `2 * sigmoid(hn·Winjᵀ / C)`, one gain per stream.
pub fn hc_inject(hn: &[f32], w: &[f32], tokens: usize, streams: usize) -> Vec<f32> {
    let width = hn.len() / tokens;
    let mut out = vec![0.0f32; tokens * streams];
    for t in 0..tokens {
        let row = &hn[t * width..(t + 1) * width];
        for s in 0..streams {
            out[t * streams + s] =
                2.0 * sigmoid(dot(row, &w[s * width..(s + 1) * width]) / streams as f32);
        }
    }
    out
}
