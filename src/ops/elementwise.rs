//! Elementwise and layout ops.

use super::{sigmoid, silu};

pub fn silu_all(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| silu(v)).collect()
}

pub fn sigmoid_all(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| sigmoid(v)).collect()
}

pub fn div_by(x: &[f32], by: f32) -> Vec<f32> {
    x.iter().map(|&v| v / by).collect()
}

pub fn mul_by(x: &[f32], by: f32) -> Vec<f32> {
    x.iter().map(|&v| v * by).collect()
}

/// `a * b`; `b` may have one column per row (broadcast).
pub fn mul(a: &[f32], b: &[f32], rows: usize) -> Vec<f32> {
    if a.len() == b.len() {
        return a.iter().zip(b).map(|(x, y)| x * y).collect();
    }
    let width = a.len() / rows;
    a.chunks(width)
        .zip(b)
        .flat_map(|(row, &s)| row.iter().map(move |x| x * s))
        .collect()
}

/// `x * sigmoid(gate)` (`Op::SigmoidMul`): `mul(x, sigmoid_all(gate), rows)` in one pass.
pub fn sigmoid_mul(x: &[f32], gate: &[f32], rows: usize) -> Vec<f32> {
    mul(x, &sigmoid_all(gate), rows)
}

/// `stream_mean(mul(sigmoid_all(up), hn), rows, streams)` (`Op::GatedStreamMean`).
pub fn gated_stream_mean(up: &[f32], hn: &[f32], rows: usize, streams: usize) -> Vec<f32> {
    stream_mean(&mul(&sigmoid_all(up), hn, rows), rows, streams)
}

pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

pub fn slice_cols(x: &[f32], rows: usize, start: usize, len: usize) -> Vec<f32> {
    let width = x.len() / rows;
    x.chunks(width)
        .flat_map(|r| r[start..start + len].iter().copied())
        .collect()
}

/// `[T, H]` → `[T, streams*H]`.
pub fn repeat_streams(x: &[f32], rows: usize, streams: usize) -> Vec<f32> {
    let width = x.len() / rows;
    x.chunks(width)
        .flat_map(|r| std::iter::repeat_n(r, streams).flatten().copied())
        .collect()
}

/// `[T, streams*H]` → `[T, H]`, the sum over streams divided by their count.
pub fn stream_mean(x: &[f32], rows: usize, streams: usize) -> Vec<f32> {
    let width = x.len() / rows;
    let h = width / streams;
    let mut out = vec![0.0f32; rows * h];
    for (r, row) in x.chunks(width).enumerate() {
        for c in 0..h {
            let sum: f32 = (0..streams).map(|s| row[s * h + c]).sum();
            out[r * h + c] = sum / streams as f32;
        }
    }
    out
}

/// Hyper-connection write: stream s of `h` gains `inj[s] * y`.
pub fn hc_write(h: &[f32], inj: &[f32], y: &[f32], rows: usize, streams: usize) -> Vec<f32> {
    let width = h.len() / rows;
    let hid = width / streams;
    let mut out = h.to_vec();
    for r in 0..rows {
        for s in 0..streams {
            let g = inj[r * streams + s];
            for c in 0..hid {
                out[r * width + s * hid + c] += g * y[r * hid + c];
            }
        }
    }
    out
}

pub fn last_row(x: &[f32], rows: usize) -> Vec<f32> {
    let width = x.len() / rows;
    x[(rows - 1) * width..].to_vec()
}
