//! Element types of stored tensors and their conversion to `f32` / `i64`.

use std::fmt;

use half::{bf16, f16};
use rayon::prelude::*;

/// Element type of a stored tensor.
///
/// Only the types the runtime reads are named; anything else is kept as the
/// string found in the header so that opening a checkpoint never fails just
/// because it also holds, say, an `F8_E4M3` tensor we do not use.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
    U8,
    Other(String),
}

impl DType {
    /// Parses the dtype string of a safetensors header (`"F32"`, `"BF16"`, ...).
    pub fn from_safetensors(s: &str) -> DType {
        match s {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            "I64" => DType::I64,
            "I32" => DType::I32,
            "U8" => DType::U8,
            other => DType::Other(other.to_string()),
        }
    }

    /// The string written into a safetensors header.
    pub fn safetensors_name(&self) -> &str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I64 => "I64",
            DType::I32 => "I32",
            DType::U8 => "U8",
            DType::Other(s) => s,
        }
    }

    /// Bytes per element, when it is a whole number of bytes and known.
    ///
    /// The `Other` arm covers the remaining standard safetensors types so
    /// that their byte ranges are still checked; sub-byte types (F4, F6) and
    /// unknown strings give `None` and are not size-checked.
    pub fn size_bytes(&self) -> Option<usize> {
        match self {
            DType::F32 | DType::I32 => Some(4),
            DType::F16 | DType::BF16 => Some(2),
            DType::I64 => Some(8),
            DType::U8 => Some(1),
            DType::Other(s) => match s.as_str() {
                "F64" | "U64" | "C64" => Some(8),
                "U32" => Some(4),
                "I16" | "U16" => Some(2),
                "I8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => Some(1),
                _ => None,
            },
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Other(s) => s,
        };
        f.write_str(s)
    }
}

/// Below this many elements a conversion runs on the calling thread: rayon's
/// dispatch costs more than it saves on small tensors (norm weights, biases).
const PARALLEL_MIN_ELEMS: usize = 1 << 16;
/// Elements per rayon task; large enough to amortise scheduling, small
/// enough to balance a few huge embedding matrices across all cores.
const CHUNK_ELEMS: usize = 1 << 15;

/// Widens little-endian `f32`/`f16`/`bf16` bytes to `f32`. Returns `None` for
/// any other dtype. `bytes.len()` must be a multiple of the element size (the
/// header validation guarantees that for tensors of a checkpoint).
pub(crate) fn bytes_to_f32(dtype: &DType, bytes: &[u8]) -> Option<Vec<f32>> {
    match dtype {
        DType::F32 => Some(convert(bytes, |b: &[u8; 4]| f32::from_le_bytes(*b))),
        // f16 and bf16 both embed exactly in f32, so these widen without loss.
        DType::F16 => Some(convert(bytes, |b: &[u8; 2]| {
            f16::from_bits(u16::from_le_bytes(*b)).to_f32()
        })),
        DType::BF16 => Some(convert(bytes, |b: &[u8; 2]| {
            bf16::from_bits(u16::from_le_bytes(*b)).to_f32()
        })),
        _ => None,
    }
}

/// Widens little-endian `i64`/`i32` bytes to `i64`; `None` for other dtypes.
pub(crate) fn bytes_to_i64(dtype: &DType, bytes: &[u8]) -> Option<Vec<i64>> {
    match dtype {
        DType::I64 => Some(convert(bytes, |b: &[u8; 8]| i64::from_le_bytes(*b))),
        DType::I32 => Some(convert(bytes, |b: &[u8; 4]| {
            i64::from(i32::from_le_bytes(*b))
        })),
        _ => None,
    }
}

/// Decodes fixed-size little-endian elements of `N` bytes each, in parallel
/// for large inputs. Any trailing partial element is ignored.
fn convert<T, const N: usize, F>(bytes: &[u8], decode: F) -> Vec<T>
where
    T: Send + Copy + Default,
    F: Fn(&[u8; N]) -> T + Sync,
{
    let n = bytes.len() / N;
    let bytes = &bytes[..n * N];
    let decode_into = |out: &mut [T], src: &[u8]| {
        for (o, b) in out.iter_mut().zip(src.chunks_exact(N)) {
            // chunks_exact(N) yields exactly N bytes, so the conversion holds.
            *o = decode(b.try_into().expect("chunk of N bytes"));
        }
    };
    let mut out = vec![T::default(); n];
    if n < PARALLEL_MIN_ELEMS {
        decode_into(&mut out, bytes);
    } else {
        out.par_chunks_mut(CHUNK_ELEMS)
            .zip(bytes.par_chunks(CHUNK_ELEMS * N))
            .for_each(|(o, b)| decode_into(o, b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_names() {
        assert_eq!(DType::BF16.to_string(), "bf16");
        assert_eq!(DType::Other("F8_E4M3".into()).to_string(), "F8_E4M3");
        for s in ["F32", "F16", "BF16", "I64", "I32", "U8", "F64"] {
            assert_eq!(DType::from_safetensors(s).safetensors_name(), s);
        }
        assert_eq!(
            DType::from_safetensors("F64"),
            DType::Other("F64".to_string())
        );
        assert_eq!(DType::Other("F4".into()).size_bytes(), None);
    }

    #[test]
    fn parallel_path_matches_serial() {
        // Big enough to take the rayon path, with a partial last chunk.
        let n = PARALLEL_MIN_ELEMS * 3 + 17;
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(bytes_to_f32(&DType::F32, &bytes).unwrap(), values);

        let ints: Vec<i64> = (0..n as i64).map(|i| i - 1000).collect();
        let bytes: Vec<u8> = ints
            .iter()
            .flat_map(|&v| (v as i32).to_le_bytes())
            .collect();
        assert_eq!(bytes_to_i64(&DType::I32, &bytes).unwrap(), ints);
    }

    #[test]
    fn wrong_dtype_gives_none() {
        assert!(bytes_to_f32(&DType::I64, &[0; 8]).is_none());
        assert!(bytes_to_i64(&DType::F32, &[0; 4]).is_none());
    }
}
