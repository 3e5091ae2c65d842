//! `y = x · Wᵀ` (no bias), `W [n, k]` row-major. Both variants use the same dot product per
//! output, so they agree bit for bit; they differ only in how work is split across cores.

use rayon::prelude::*;

use super::{dot, sigmoid, silu};

/// Below this many multiply-adds a step stays on one core (thread hand-off costs more).
const PARALLEL_WORK: usize = 1 << 16;

/// Reference: one token after another, output rows spread across cores.
pub fn rows(x: &[f32], w: &[f32], tokens: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; tokens * n];
    for t in 0..tokens {
        let xt = &x[t * k..(t + 1) * k];
        let yt = &mut y[t * n..(t + 1) * n];
        if n * k >= PARALLEL_WORK {
            yt.par_chunks_mut(64).enumerate().for_each(|(c, out)| {
                for (j, o) in out.iter_mut().enumerate() {
                    let r = c * 64 + j;
                    *o = dot(xt, &w[r * k..(r + 1) * k]);
                }
            });
        } else {
            for (r, o) in yt.iter_mut().enumerate() {
                *o = dot(xt, &w[r * k..(r + 1) * k]);
            }
        }
    }
    y
}

/// Several tokens: blocks of output rows across cores, each weight row used for every token
/// while it is in cache.
pub fn tiled(x: &[f32], w: &[f32], tokens: usize, k: usize, n: usize) -> Vec<f32> {
    const ROWS: usize = 16;
    let mut yt = vec![0.0f32; n * tokens]; // [n, tokens], transposed back at the end
    let work = |(c, out): (usize, &mut [f32])| {
        for j in 0..out.len() / tokens {
            let r = c * ROWS + j;
            let wr = &w[r * k..(r + 1) * k];
            for t in 0..tokens {
                out[j * tokens + t] = dot(&x[t * k..(t + 1) * k], wr);
            }
        }
    };
    if n * k * tokens >= PARALLEL_WORK {
        yt.par_chunks_mut(ROWS * tokens).enumerate().for_each(work);
    } else {
        yt.chunks_mut(ROWS * tokens).enumerate().for_each(work);
    }
    let mut y = vec![0.0f32; tokens * n];
    for r in 0..n {
        for t in 0..tokens {
            y[t * n + r] = yt[r * tokens + t];
        }
    }
    y
}

pub fn by_variant(
    variant: &str,
    x: &[f32],
    w: &[f32],
    tokens: usize,
    k: usize,
    n: usize,
) -> Vec<f32> {
    match variant {
        "tiled" => tiled(x, w, tokens, k, n),
        _ => rows(x, w, tokens, k, n),
    }
}

/// Fused linear layer and hyper-connection write: `h + inj ⊗ (x·Wᵀ)` for `x [T, k]`,
/// `W [n, k]`, `h [T, streams*n]`, `inj [T, streams]`: the unfused linear then `hc_write`.
pub fn linear_hc_write(
    h: &[f32],
    inj: &[f32],
    x: &[f32],
    w: &[f32],
    tokens: usize,
    streams: usize,
) -> Vec<f32> {
    let k = x.len() / tokens;
    let n = w.len() / k;
    let y = rows(x, w, tokens, k, n);
    super::elementwise::hc_write(h, inj, &y, tokens, streams)
}

/// Fused gated sum `a + sigmoid(x·wᵀ) * b` for each row: `x [T, H]`, `w [H]` (one gate logit
/// per token), `a, b [T, D]`. The same roundings as the unfused linear → sigmoid → mul → add.
pub fn sigmoid_gated_add(x: &[f32], w: &[f32], b: &[f32], a: &[f32], tokens: usize) -> Vec<f32> {
    let h = x.len() / tokens;
    let d = a.len() / tokens;
    let mut y = Vec::with_capacity(a.len());
    for t in 0..tokens {
        let gate = sigmoid(dot(&x[t * h..(t + 1) * h], w));
        let (at, bt) = (&a[t * d..(t + 1) * d], &b[t * d..(t + 1) * d]);
        y.extend(at.iter().zip(bt).map(|(a, b)| a + b * gate));
    }
    y
}

/// Fused end of the MoE block: `h + inj ⊗ (a + sigmoid(x·wgᵀ) * (s·Wdᵀ))` for `s [T, I]`,
/// `Wd [H, I]`, `x, a [T, H]`, `wg [H]`, `h [T, streams*H]`, `inj [T, streams]`: the shared
/// expert's down projection, then `sigmoid_gated_add`, then `hc_write`, as unfused.
#[allow(clippy::too_many_arguments)]
pub fn moe_shared_write(
    h: &[f32],
    inj: &[f32],
    x: &[f32],
    s: &[f32],
    a: &[f32],
    wd: &[f32],
    wg: &[f32],
    tokens: usize,
    streams: usize,
) -> Vec<f32> {
    let inter = s.len() / tokens;
    let hid = wd.len() / inter;
    let shared = rows(s, wd, tokens, inter, hid);
    let y = sigmoid_gated_add(x, wg, &shared, a, tokens);
    super::elementwise::hc_write(h, inj, &y, tokens, streams)
}

/// Fused expert gate/up: `silu(x·Wgᵀ) * (x·Wuᵀ)`, both dot products of an output row taken in
/// one visit of the token's row.
pub fn swiglu(x: &[f32], wg: &[f32], wu: &[f32], tokens: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; tokens * n];
    let work = |(t, yt): (usize, &mut [f32])| {
        let xt = &x[t * k..(t + 1) * k];
        for (r, o) in yt.iter_mut().enumerate() {
            let g = dot(xt, &wg[r * k..(r + 1) * k]);
            let u = dot(xt, &wu[r * k..(r + 1) * k]);
            *o = silu(g) * u;
        }
    };
    if 2 * n * k * tokens >= PARALLEL_WORK && tokens > 1 {
        y.par_chunks_mut(n).enumerate().for_each(work);
    } else {
        y.chunks_mut(n).enumerate().for_each(work);
    }
    y
}
