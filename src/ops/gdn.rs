//! Gated DeltaNet: gates and the delta-rule recurrence (HF `torch_recurrent_gated_delta_rule`).

use rayon::prelude::*;

use super::conv;
use super::norm;
use super::sigmoid;
use crate::ir::{GateActivation, Op};

/// torch's softplus (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `beta = sigmoid(b)`, `g = -exp(A_log) * softplus(a + dt_bias)` (a log-decay ≤ 0).
pub fn gates(b: &[f32], a: &[f32], a_log: &[f32], dt_bias: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let heads = a_log.len();
    let beta = b.iter().map(|&v| sigmoid(v)).collect();
    let g = a
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let h = i % heads;
            -a_log[h].exp() * softplus(v + dt_bias[h])
        })
        .collect();
    (beta, g)
}

/// `x * rsqrt(Σx² + 1e-6)`.
fn l2norm(x: &[f32]) -> Vec<f32> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter().map(|v| v * inv).collect()
}

pub struct GdnShape {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

impl GdnShape {
    /// The shape a recurrence op (`GdnRecurrence`, `GdnGatedRecurrence` with its gates,
    /// `GdnNormedRecurrence` with its gates and output norm, or `GdnConvNormedRecurrence` with
    /// the convolution ahead of those) runs.
    pub fn of(op: &Op<usize>) -> Option<GdnShape> {
        match *op {
            Op::GdnRecurrence {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
            }
            | Op::GdnGatedRecurrence {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
            }
            | Op::GdnNormedRecurrence {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
            }
            | Op::GdnConvNormedRecurrence {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
                ..
            } => Some(GdnShape {
                key_heads,
                value_heads,
                key_dim,
                value_dim,
            }),
            _ => None,
        }
    }

    /// The recurrence with its gates and output norm (`GdnNormedRecurrence`) of this shape.
    pub fn normed_recurrence_op(&self) -> Op<usize> {
        Op::GdnNormedRecurrence {
            key_heads: self.key_heads,
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
        }
    }

    /// The recurrence with its gates formed inside (`GdnGatedRecurrence`) of this shape.
    pub fn gated_recurrence_op(&self) -> Op<usize> {
        Op::GdnGatedRecurrence {
            key_heads: self.key_heads,
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
        }
    }

    /// The plain recurrence op of this shape.
    pub fn recurrence_op(&self) -> Op<usize> {
        Op::GdnRecurrence {
            key_heads: self.key_heads,
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
        }
    }
}

/// The recurrence over `tokens` rows of `qkv` (channels `[q | k | v]`, heads contiguous), with
/// `state [Vh, dk, dv]` updated in place. Value head `v` reads key head `v / (Vh/Kh)`.
///
/// Per value head and token: `S *= exp(g)`; `u = (v - Sᵀk) * beta`; `S += k ⊗ u`; `o = Sᵀq`,
/// with `q = l2norm(q) / sqrt(dk)`, `k = l2norm(k)`.
pub fn recurrence(
    qkv: &[f32],
    beta: &[f32],
    g: &[f32],
    state: &mut [f32],
    tokens: usize,
    s: &GdnShape,
) -> Vec<f32> {
    let (dk, dv, vh) = (s.key_dim, s.value_dim, s.value_heads);
    let key_dim = s.key_heads * dk;
    let width = 2 * key_dim + vh * dv;
    let group = vh / s.key_heads;
    let scale = 1.0 / (dk as f32).sqrt();
    let mut out = vec![0.0f32; tokens * vh * dv];
    // One value head per task: heads are independent.
    let per_head: Vec<Vec<f32>> = state
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(h, st)| {
            let kh = h / group;
            let mut o_head = vec![0.0f32; tokens * dv];
            for t in 0..tokens {
                let row = &qkv[t * width..(t + 1) * width];
                let q: Vec<f32> = l2norm(&row[kh * dk..(kh + 1) * dk])
                    .iter()
                    .map(|x| x * scale)
                    .collect();
                let k = l2norm(&row[key_dim + kh * dk..key_dim + (kh + 1) * dk]);
                let v = &row[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv];
                let decay = g[t * vh + h].exp();
                let b = beta[t * vh + h];
                for x in st.iter_mut() {
                    *x *= decay;
                }
                let mut u = vec![0.0f32; dv];
                for j in 0..dv {
                    let mut kv = 0.0f32;
                    for i in 0..dk {
                        kv += st[i * dv + j] * k[i];
                    }
                    u[j] = (v[j] - kv) * b;
                }
                for i in 0..dk {
                    for j in 0..dv {
                        st[i * dv + j] += k[i] * u[j];
                    }
                }
                for j in 0..dv {
                    let mut acc = 0.0f32;
                    for i in 0..dk {
                        acc += st[i * dv + j] * q[i];
                    }
                    o_head[t * dv + j] = acc;
                }
            }
            o_head
        })
        .collect();
    for (h, o_head) in per_head.iter().enumerate() {
        for t in 0..tokens {
            out[t * vh * dv + h * dv..t * vh * dv + (h + 1) * dv]
                .copy_from_slice(&o_head[t * dv..(t + 1) * dv]);
        }
    }
    out
}

/// `gates` then `recurrence` (`Op::GdnGatedRecurrence`, the fused op): the gates formed from
/// `b`, `a [tokens, Vh]` and `a_log`, `dt_bias [Vh]` feed the recurrence as they are.
#[allow(clippy::too_many_arguments)]
pub fn gated_recurrence(
    qkv: &[f32],
    b: &[f32],
    a: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    tokens: usize,
    s: &GdnShape,
) -> Vec<f32> {
    let (beta, g) = gates(b, a, a_log, dt_bias);
    recurrence(qkv, &beta, &g, state, tokens, s)
}

/// `gated_recurrence` then the output norm (`Op::GdnNormedRecurrence`, the fused op):
/// `norm::gated_rms_norm` over each value head's `dv` outputs with the plain weight `norm_w
/// [dv]` and `act(z)`, `z [tokens, Vh*dv]`.
#[allow(clippy::too_many_arguments)]
pub fn normed_recurrence(
    qkv: &[f32],
    b: &[f32],
    a: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    z: &[f32],
    norm_w: &[f32],
    state: &mut [f32],
    tokens: usize,
    s: &GdnShape,
    act: GateActivation,
    eps: f32,
) -> Vec<f32> {
    let o = gated_recurrence(qkv, b, a, a_log, dt_bias, state, tokens, s);
    norm::gated_rms_norm(&o, z, norm_w, s.value_dim, act, eps)
}

/// The causal convolution of the raw projection `qkv [tokens, 2*Kh*dk + Vh*dv]` (`kernel` taps,
/// dilation 1, SiLU; `conv_w [width, kernel]`, `window` its last `kernel - 1` rows, updated as
/// `conv::causal_conv` does), then `normed_recurrence` over its output
/// (`Op::GdnConvNormedRecurrence`, the fused op).
#[allow(clippy::too_many_arguments)]
pub fn conv_normed_recurrence(
    qkv: &[f32],
    conv_w: &[f32],
    window: &mut [f32],
    kernel: usize,
    b: &[f32],
    a: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    z: &[f32],
    norm_w: &[f32],
    state: &mut [f32],
    tokens: usize,
    s: &GdnShape,
    act: GateActivation,
    eps: f32,
) -> Vec<f32> {
    let x = conv::causal_conv(qkv, window, conv_w, tokens, kernel, 1, true);
    normed_recurrence(
        &x, b, a, a_log, dt_bias, z, norm_w, state, tokens, s, act, eps,
    )
}
