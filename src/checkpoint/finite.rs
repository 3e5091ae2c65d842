//! Finding NaN and infinity in stored float tensors by their bit patterns, without widening them
//! into a new buffer: the CPU loader runs it before converting to f32, and a device upload path
//! can run it on the mapped bytes it is about to copy.

use std::fmt;

use half::{bf16, f16};
use rayon::prelude::*;

use super::dtype::DType;

/// The NaN and infinite elements of one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    /// Row-major element index of the first NaN or infinity.
    pub first_index: usize,
    /// That element, widened to f32 (NaN, inf or -inf).
    pub first_value: f32,
    /// How many elements are NaN or infinite.
    pub count: usize,
}

impl NonFinite {
    /// `3 non-finite value(s), the first NaN at element 17 ([0, 17])`: the flat index and, for a
    /// tensor of more than one dimension, its row-major coordinates in `shape`.
    pub fn describe(&self, shape: &[usize]) -> String {
        if shape.len() < 2 || shape.contains(&0) {
            return self.to_string();
        }
        let mut rest = self.first_index;
        let mut at = vec![0; shape.len()];
        for (slot, &dim) in at.iter_mut().zip(shape).rev() {
            *slot = rest % dim;
            rest /= dim;
        }
        format!("{self} ({at:?})")
    }
}

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} non-finite value(s), the first {} at element {}",
            self.count, self.first_value, self.first_index
        )
    }
}

/// Below this many bytes the scan runs on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 18;
/// Bytes per rayon task (a multiple of every element size).
const CHUNK_BYTES: usize = 1 << 17;

/// Scans the little-endian bytes of an `f32`, `bf16` or `f16` tensor for NaN and ±infinity
/// (an all-ones exponent), reading them in place. `None` when every element is finite, and for
/// any other dtype: integers cannot hold NaN, and other float formats are never loaded.
///
/// A trailing partial element is ignored, as the converters do; a checkpoint's tensors have
/// none (their byte sizes are checked against dtype × shape when the file is opened).
pub fn find_non_finite(dtype: &DType, bytes: &[u8]) -> Option<NonFinite> {
    match dtype {
        DType::F32 => scan::<4>(bytes, |b| {
            u32::from_le_bytes(*b) & 0x7F80_0000 == 0x7F80_0000
        })
        .map(|(i, n)| found(i, n, f32::from_le_bytes(element(bytes, i)))),
        DType::BF16 => {
            scan::<2>(bytes, |b| u16::from_le_bytes(*b) & 0x7F80 == 0x7F80).map(|(i, n)| {
                let v = bf16::from_bits(u16::from_le_bytes(element(bytes, i)));
                found(i, n, v.to_f32())
            })
        }
        DType::F16 => {
            scan::<2>(bytes, |b| u16::from_le_bytes(*b) & 0x7C00 == 0x7C00).map(|(i, n)| {
                let v = f16::from_bits(u16::from_le_bytes(element(bytes, i)));
                found(i, n, v.to_f32())
            })
        }
        _ => None,
    }
}

fn found(first_index: usize, count: usize, first_value: f32) -> NonFinite {
    NonFinite {
        first_index,
        first_value,
        count,
    }
}

/// The bytes of element `i` (which the scan found, so it is in range).
fn element<const N: usize>(bytes: &[u8], i: usize) -> [u8; N] {
    bytes[i * N..(i + 1) * N]
        .try_into()
        .expect("a found element lies inside the tensor")
}

/// (first index, count) of the elements of `N` bytes for which `bad` holds; `None` if none.
fn scan<const N: usize>(
    bytes: &[u8],
    bad: impl Fn(&[u8; N]) -> bool + Sync,
) -> Option<(usize, usize)> {
    let serial = |chunk: &[u8], base: usize| -> (Option<usize>, usize) {
        let mut first = None;
        let mut count = 0;
        for (i, b) in chunk.chunks_exact(N).enumerate() {
            if bad(b.try_into().expect("chunk of N bytes")) {
                first.get_or_insert(base + i);
                count += 1;
            }
        }
        (first, count)
    };
    let (first, count) = if bytes.len() < PARALLEL_MIN_BYTES {
        serial(bytes, 0)
    } else {
        bytes
            .par_chunks(CHUNK_BYTES)
            .enumerate()
            .map(|(c, chunk)| serial(chunk, c * (CHUNK_BYTES / N)))
            // Chunks are combined in any order: the first index is the smallest one found.
            .reduce(
                || (None, 0),
                |(fa, na), (fb, nb)| {
                    let first = match (fa, fb) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    (first, na + nb)
                },
            )
    };
    first.map(|i| (i, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{f32_bytes, f32_to_bf16_bytes, f32_to_f16_bytes};

    #[test]
    fn finite_tensors_give_none() {
        let v = [0.0, -0.0, 1.5, f32::MAX, f32::MIN, f32::MIN_POSITIVE / 4.0];
        assert_eq!(find_non_finite(&DType::F32, &f32_bytes(&v)), None);
        let small = [0.0, -2.0, 65504.0, 3.0e-5];
        assert_eq!(
            find_non_finite(&DType::F16, &f32_to_f16_bytes(&small)),
            None
        );
        // f32::MAX would round up to infinity in bf16.
        let wide = [0.0, -0.0, 1.5, 3.0e38, -3.0e38, 1.0e-38];
        assert_eq!(
            find_non_finite(&DType::BF16, &f32_to_bf16_bytes(&wide)),
            None
        );
        assert_eq!(find_non_finite(&DType::F32, &[]), None);
    }

    #[test]
    fn every_float_dtype_reports_first_index_value_and_count() {
        let v = [1.0, f32::NAN, 2.0, f32::NEG_INFINITY, f32::INFINITY, 3.0];
        for (dtype, bytes) in [
            (DType::F32, f32_bytes(&v)),
            (DType::BF16, f32_to_bf16_bytes(&v)),
            (DType::F16, f32_to_f16_bytes(&v)),
        ] {
            let nf = find_non_finite(&dtype, &bytes).unwrap_or_else(|| panic!("{dtype}"));
            assert_eq!((nf.first_index, nf.count), (1, 3), "{dtype}");
            assert!(nf.first_value.is_nan(), "{dtype}");
        }
        let nf = find_non_finite(&DType::F16, &f32_to_f16_bytes(&[0.5, -1.0e6])).unwrap();
        // -1e6 overflows f16 to -inf.
        assert_eq!(
            (nf.first_index, nf.count, nf.first_value),
            (1, 1, f32::NEG_INFINITY)
        );
    }

    #[test]
    fn integer_and_unknown_dtypes_are_not_scanned() {
        // All-ones bytes would be NaN as any float type.
        let ones = [0xFF; 16];
        for d in [
            DType::I64,
            DType::I32,
            DType::U8,
            DType::Other("F64".into()),
        ] {
            assert_eq!(find_non_finite(&d, &ones), None, "{d}");
        }
        assert!(find_non_finite(&DType::F32, &ones).is_some());
    }

    #[test]
    fn parallel_scan_finds_the_first_bad_element_across_chunks() {
        // Several chunks; bad values in a late chunk and an early one, the early one first.
        let n = PARALLEL_MIN_BYTES / 4 * 5 + 3;
        let mut v = vec![0.25f32; n];
        let late = n - 2;
        let early = CHUNK_BYTES / 4 + 7;
        v[late] = f32::INFINITY;
        v[early] = f32::NAN;
        let nf = find_non_finite(&DType::F32, &f32_bytes(&v)).unwrap();
        assert_eq!((nf.first_index, nf.count), (early, 2));
        // The same for a two-byte dtype, whose chunks hold twice as many elements.
        let nf = find_non_finite(&DType::BF16, &f32_to_bf16_bytes(&v)).unwrap();
        assert_eq!((nf.first_index, nf.count), (early, 2));
        assert_eq!(
            nf.to_string(),
            format!("2 non-finite value(s), the first NaN at element {early}")
        );
    }

    #[test]
    fn describe_gives_row_major_coordinates() {
        let nf = found(17, 3, f32::INFINITY);
        assert_eq!(
            nf.describe(&[4, 8]),
            "3 non-finite value(s), the first inf at element 17 ([2, 1])"
        );
        assert_eq!(nf.describe(&[2, 3, 4]), format!("{nf} ([1, 1, 1])"));
        assert_eq!(nf.describe(&[64]), nf.to_string());
    }
}
