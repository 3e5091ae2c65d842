//! NVFP4 as ModelOpt stores it: a matrix `[out, in]` as 4-bit E2M1 codes, two a byte (element
//! `2i` in the low nibble), one E4M3 scale byte per 16 consecutive inputs of a row, and one f32
//! per-tensor scale. A weight is `(e2m1(code) * e4m3(scale)) * global`, in f32, in that order;
//! the first product is exact (at most 6 significant bits), so only the global multiply rounds.

/// Inputs that share one scale byte.
pub const GROUP: usize = 16;

/// E2M1 values by code; bit 3 is the sign.
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// An E4M3 scale byte (sign, 4 exponent bits of bias 7, 3 mantissa bits). The NaN codes
/// `0x7F` and `0xFF` decode to +0.0, as ModelOpt writes and its readers take them: a group
/// with a NaN scale contributes nothing.
pub fn e4m3(byte: u8) -> f32 {
    let mag = byte & 0x7F;
    if mag == 0x7F {
        return 0.0;
    }
    let (e, m) = ((mag >> 3) as i32, (mag & 7) as f32);
    let v = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    if byte & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// One packed matrix, borrowed: `codes [out, in/2]`, `scales [out, in/16]`, `global`.
#[derive(Debug, Clone, Copy)]
pub struct Packed<'a> {
    pub out: usize,
    pub inputs: usize,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    pub global: f32,
}

impl Packed<'_> {
    /// Weight `[r, c]`.
    pub fn weight(&self, r: usize, c: usize) -> f32 {
        let byte = self.codes[r * self.inputs / 2 + c / 2];
        let code = if c.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        };
        let scale = self.scales[r * self.inputs / GROUP + c / GROUP];
        (E2M1[code as usize] * e4m3(scale)) * self.global
    }

    /// The whole matrix in f32, row-major `[out, in]` (what the CPU reference computes with).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = Vec::with_capacity(self.out * self.inputs);
        for r in 0..self.out {
            for c in 0..self.inputs {
                w.push(self.weight(r, c));
            }
        }
        w
    }
}

/// Packs `w [out, in]` (for synthetic checkpoints): per group of 16, the scale is the E4M3
/// value nearest `max|w| / 6 / global`, and each code the E2M1 value nearest `w / (scale *
/// global)`. Returns `(codes, scales)`. Not ModelOpt's calibration, only a faithful encoding
/// that round-trips through [`Packed::dequantize`].
pub fn quantize(w: &[f32], out: usize, inputs: usize, global: f32) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(w.len(), out * inputs, "quantize: [out, in] values");
    assert!(
        inputs.is_multiple_of(GROUP),
        "quantize: in is a multiple of {GROUP}"
    );
    let mut codes = vec![0u8; out * inputs / 2];
    let mut scales = vec![0u8; out * inputs / GROUP];
    for r in 0..out {
        for g in 0..inputs / GROUP {
            let group = &w[r * inputs + g * GROUP..][..GROUP];
            let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
            let byte = nearest_e4m3(amax / 6.0 / global);
            scales[r * inputs / GROUP + g] = byte;
            let unit = e4m3(byte) * global;
            for (i, &v) in group.iter().enumerate() {
                let code = if unit == 0.0 {
                    0
                } else {
                    nearest_e2m1(v / unit)
                };
                let c = g * GROUP + i;
                let at = &mut codes[r * inputs / 2 + c / 2];
                *at |= if c.is_multiple_of(2) { code } else { code << 4 };
            }
        }
    }
    (codes, scales)
}

/// The non-negative, non-NaN E4M3 byte nearest `v` (0 for `v <= 0`): bytes 0..0x7E decode in
/// increasing order, so a binary search finds it.
fn nearest_e4m3(v: f32) -> u8 {
    nearest_sorted(0x7F, |i| e4m3(i as u8), v) as u8
}

/// The E2M1 code nearest `v` (the positive zero for 0): codes 0..7 are the increasing
/// magnitudes, 8.. their negatives.
fn nearest_e2m1(v: f32) -> u8 {
    let code = nearest_sorted(8, |i| E2M1[i], v.abs()) as u8;
    if v < 0.0 && code != 0 {
        code | 8
    } else {
        code
    }
}

/// The index `i < n` whose increasing `value(i)` is nearest `v` (the lower one on a tie).
fn nearest_sorted(n: usize, value: impl Fn(usize) -> f32, v: f32) -> usize {
    // The first index whose value is not below `v`.
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if value(mid) < v {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let above = lo;
    match above {
        0 => 0,
        i if i == n => n - 1,
        i if v - value(i - 1) <= value(i) - v => i - 1,
        i => i,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_as_the_spec_table() {
        let table = [
            (0x00, 0.0),
            (0x01, 2f32.powi(-9)),
            (0x08, 2f32.powi(-6)),
            (0x30, 0.5),
            (0x38, 1.0),
            (0x3C, 1.5),
            (0x3F, 1.875),
            (0x40, 2.0),
            (0x7E, 448.0),
            (0xB8, -1.0),
        ];
        for (byte, want) in table {
            assert_eq!(e4m3(byte), want, "byte {byte:#04x}");
        }
        assert_eq!(e4m3(0x80).to_bits(), (-0.0f32).to_bits());
        // NaN codes: +0.0, the sign not applied.
        for nan in [0x7F, 0xFF] {
            assert_eq!(e4m3(nan).to_bits(), 0.0f32.to_bits());
        }
    }

    /// The spec's worked example: codes[0] = 0x7A, scale 0x38 (then 0x3C), global 5.9945243e-5.
    #[test]
    fn the_worked_example_dequantizes_exactly() {
        let m = 5.994_524_3e-5f32;
        let mut codes = vec![0u8; 8];
        codes[0] = 0x7A;
        let p = Packed {
            out: 1,
            inputs: 16,
            codes: &codes,
            scales: &[0x38],
            global: m,
        };
        assert_eq!(p.weight(0, 0), -m);
        assert_eq!(p.weight(0, 1), 6.0 * m);
        let p = Packed {
            scales: &[0x3C],
            ..p
        };
        assert_eq!(p.weight(0, 1), 9.0 * m);
        assert_eq!(p.weight(0, 1), 5.395_072e-4);
        // A NaN scale zeroes its group.
        let p = Packed {
            scales: &[0xFF],
            ..p
        };
        assert!(p.dequantize().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn codes_are_read_low_nibble_first_and_groups_along_the_row() {
        // Two rows of 32 inputs: row 1's second group has scale 2, so its element 16 is
        // E2M1[code] * 2.
        let mut codes = vec![0u8; 2 * 16];
        codes[16 + 8] = 0x21; // row 1, inputs 16 (low: code 1 = 0.5) and 17 (high: code 2 = 1)
        let scales = [0x38, 0x38, 0x38, 0x40];
        let p = Packed {
            out: 2,
            inputs: 32,
            codes: &codes,
            scales: &scales,
            global: 1.0,
        };
        let w = p.dequantize();
        assert_eq!(w[32 + 16], 1.0);
        assert_eq!(w[32 + 17], 2.0);
        assert_eq!(w.iter().filter(|&&v| v != 0.0).count(), 2);
    }

    /// The binary searches give what a scan of every candidate gives.
    #[test]
    fn nearest_values_match_a_full_scan() {
        let scan_e4m3 = |v: f32| {
            (0u8..0x7F)
                .min_by(|&a, &b| (e4m3(a) - v).abs().total_cmp(&(e4m3(b) - v).abs()))
                .unwrap()
        };
        let scan_e2m1 = |v: f32| {
            (0u8..16)
                .filter(|&c| c != 8)
                .min_by(|&a, &b| {
                    let d = |c: u8| (E2M1[c as usize] - v).abs();
                    d(a).total_cmp(&d(b))
                })
                .unwrap()
        };
        for i in 0..4000 {
            let v = (i as f32 * 0.731).sin() * 500.0;
            let (a, b) = (nearest_e4m3(v.abs()), scan_e4m3(v.abs()));
            assert_eq!(e4m3(a), e4m3(b), "e4m3 near {v}");
            let (a, b) = (nearest_e2m1(v / 80.0), scan_e2m1(v / 80.0));
            assert_eq!(E2M1[a as usize], E2M1[b as usize], "e2m1 near {}", v / 80.0);
        }
    }

    #[test]
    fn quantize_round_trips_representable_weights() {
        // Values that are E2M1 multiples of a power-of-two scale times the global scale.
        let global = 0.37f32;
        let (out, inputs) = (3, 32);
        let w: Vec<f32> = (0..out * inputs)
            .map(|i| E2M1[i % 16] * 0.5 * global)
            .collect();
        let (codes, scales) = quantize(&w, out, inputs, global);
        let p = Packed {
            out,
            inputs,
            codes: &codes,
            scales: &scales,
            global,
        };
        let back = p.dequantize();
        for (a, b) in back.iter().zip(&w) {
            assert_eq!(a.abs(), b.abs(), "{back:?}");
        }
        assert_eq!(
            (codes.len(), scales.len()),
            (out * inputs / 2, out * inputs / GROUP)
        );
    }
}
