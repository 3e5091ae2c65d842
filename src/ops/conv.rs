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

#[cfg(test)]
mod tests {
    use super::*;

    /// y[t] = Σ_j w[j] x[t-(K-1-j)d], zero history; and the window carries across calls.
    #[test]
    fn dilated_conv_matches_definition_and_chunks() {
        let (width, kernel, dilation, tokens) = (2, 3, 2, 9);
        let x: Vec<f32> = (0..tokens * width)
            .map(|i| (i as f32 * 0.7).sin())
            .collect();
        let w: Vec<f32> = (0..width * kernel).map(|i| 0.3 + i as f32 * 0.1).collect();
        let past = (kernel - 1) * dilation;
        let mut window = vec![0.0; past * width];
        let whole = causal_conv(&x, &mut window, &w, tokens, kernel, dilation, false);
        for t in 0..tokens {
            for c in 0..width {
                let mut want = 0.0f32;
                for j in 0..kernel {
                    let back = (kernel - 1 - j) * dilation;
                    if t >= back {
                        want += w[c * kernel + j] * x[(t - back) * width + c];
                    }
                }
                assert!((whole[t * width + c] - want).abs() < 1e-6);
            }
        }
        let mut window = vec![0.0; past * width];
        let mut parts = causal_conv(&x[..4 * width], &mut window, &w, 4, kernel, dilation, false);
        parts.extend(causal_conv(
            &x[4 * width..5 * width],
            &mut window,
            &w,
            1,
            kernel,
            dilation,
            false,
        ));
        parts.extend(causal_conv(
            &x[5 * width..],
            &mut window,
            &w,
            4,
            kernel,
            dilation,
            false,
        ));
        assert_eq!(parts, whole);
    }
}
