//! The op catalogue's CPU side: the reference math of every op, written plainly (it is the
//! specification in executable form), plus the faster CPU variants the scheduler may choose.
//!
//! Each file is one op family. Functions work on row-major `f32` slices `[rows, width]`.
//! Variants of one op compute the same values (checked by `tests/variants.rs`).

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod embed;
pub mod gdn;
pub mod hyper;
pub mod indexer;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod ple;
pub mod rope;
pub mod shape;

/// `x / (1 + e^-x)`, as torch's SiLU.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Dot product with eight independent partial sums (vectorises; the order is fixed, so every
/// caller gets the same rounding).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        let (x, y) = (&a[c * 8..c * 8 + 8], &b[c * 8..c * 8 + 8]);
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}
