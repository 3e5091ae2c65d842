//! Causal depthwise convolution over time, with the previous inputs carried in a window state.
//!
//! `y[t, c] = Σ_j w[c, j] · x[t - (K-1-j)·dilation, c]`, where inputs before the step come from
//! the window (the last `(K-1)·dilation` inputs, zero at the start of a sequence). After the step
//! the window holds the last `(K-1)·dilation` inputs again. GDN uses dilation 1; PLE dilation n.

use super::silu;

pub fn causal_conv(
    x: &[f32],
    window: &mut [f32],
    w: &[f32],
    tokens: usize,
    kernel: usize,
    dilation: usize,
    apply_silu: bool,
) -> Vec<f32> {
    let width = x.len() / tokens;
    let past = (kernel - 1) * dilation;
    debug_assert_eq!(window.len(), past * width);
    // ext = window rows (oldest first) followed by the new rows.
    let mut ext = Vec::with_capacity((past + tokens) * width);
    ext.extend_from_slice(window);
    ext.extend_from_slice(x);
    let mut y = vec![0.0f32; tokens * width];
    for t in 0..tokens {
        for c in 0..width {
            let mut acc = 0.0f32;
            for j in 0..kernel {
                let row = past + t - (kernel - 1 - j) * dilation;
                acc += w[c * kernel + j] * ext[row * width + c];
            }
            y[t * width + c] = if apply_silu { silu(acc) } else { acc };
        }
    }
    let total = past + tokens;
    window.copy_from_slice(&ext[(total - past) * width..]);
    y
}
