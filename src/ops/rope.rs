//! Partial NeoX ("rotate half") RoPE, as HF computes it in f32: `inv_freq[i] = 1/θ^(2i/rot)`,
//! angle = position · inv_freq, applied to the first `rot` channels of each head as pairs
//! `(i, i + rot/2)`. For text the three mRoPE rows coincide, so this is plain 1-D RoPE.

/// cos and sin tables `[rot/2]` for one position.
pub fn angles(position: usize, rot: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
    let half = rot / 2;
    let mut cos = Vec::with_capacity(half);
    let mut sin = Vec::with_capacity(half);
    for i in 0..half {
        let exponent = (2 * i) as f32 / rot as f32;
        let inv_freq = 1.0f32 / (theta as f32).powf(exponent);
        let angle = position as f32 * inv_freq;
        cos.push(angle.cos());
        sin.push(angle.sin());
    }
    (cos, sin)
}

/// Rotates one head in place.
pub fn rotate_head(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i] + a * sin[i];
    }
}

/// Applies RoPE to every head of every row; row `t` is at position `start + t`.
pub fn rope(
    x: &[f32],
    tokens: usize,
    start: usize,
    head_dim: usize,
    rot: usize,
    theta: f64,
) -> Vec<f32> {
    let width = x.len() / tokens;
    let mut out = x.to_vec();
    for t in 0..tokens {
        let (cos, sin) = angles(start + t, rot, theta);
        for head in out[t * width..(t + 1) * width].chunks_mut(head_dim) {
            rotate_head(head, &cos, &sin);
        }
    }
    out
}

/// `Op::NormRope`: each head's RMS norm (scale `1 + w`; `w` per head channel or per row channel)
/// and then `rope`, as the two ops compute them one after the other.
#[allow(clippy::too_many_arguments)]
pub fn norm_rope(
    x: &[f32],
    w: &[f32],
    tokens: usize,
    start: usize,
    head_dim: usize,
    rot: usize,
    eps: f32,
    theta: f64,
) -> Vec<f32> {
    let normed = super::norm::rms_norm(x, w, head_dim, true, eps);
    rope(&normed, tokens, start, head_dim, rot, theta)
}
