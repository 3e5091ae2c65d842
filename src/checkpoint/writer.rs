//! Writing safetensors files and shard indexes, plus helpers that turn
//! `f32`/`i64` slices into the little-endian bytes the writer takes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::{json, Map, Value};

use super::dtype::DType;
use super::error::CheckpointError;
use super::safetensors_file::METADATA_KEY;

/// One tensor to write: little-endian bytes plus dtype and shape.
#[derive(Debug, Clone)]
pub struct TensorData<'a> {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Cow<'a, [u8]>,
}

/// Writes `tensors` to a safetensors file at `path`, names sorted, with an
/// optional `__metadata__` map.
///
/// The file is written under a temporary name and renamed into place, so a
/// reader that has the old file mapped keeps a consistent view and no one
/// ever sees a half-written file.
pub fn write_safetensors(
    path: &Path,
    tensors: &[TensorData],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(), CheckpointError> {
    let header = build_header(path, tensors, metadata)?;

    let mut order: Vec<&TensorData> = tensors.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));

    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut out = BufWriter::new(File::create(&tmp)?);
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(header.as_bytes())?;
        for t in &order {
            out.write_all(&t.bytes)?;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::rename(&tmp, path)
    })();
    result.map_err(|source| {
        // Best effort: the temporary may not even exist if create failed.
        let _ = fs::remove_file(&tmp);
        CheckpointError::Io {
            path: path.to_path_buf(),
            action: "write file",
            source,
        }
    })
}

/// Validates the tensors and returns the JSON header, padded with spaces so
/// that the data section starts 8-byte aligned (as the format recommends).
fn build_header(
    path: &Path,
    tensors: &[TensorData],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<String, CheckpointError> {
    let bad = |t: &TensorData, reason: String| CheckpointError::InvalidTensor {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        reason,
    };
    let mut seen = BTreeSet::new();
    for t in tensors {
        if t.name == METADATA_KEY {
            return Err(bad(t, format!("{METADATA_KEY} is a reserved name")));
        }
        if !seen.insert(t.name.as_str()) {
            return Err(bad(t, "name given twice".to_string()));
        }
        if let Some(elem) = t.dtype.size_bytes() {
            let expected = t.shape.iter().try_fold(elem, |acc, &d| acc.checked_mul(d));
            if expected != Some(t.bytes.len()) {
                return Err(bad(
                    t,
                    format!(
                        "{} {:?} needs {} bytes but {} were given",
                        t.dtype,
                        t.shape,
                        expected.map_or("too many".to_string(), |n| n.to_string()),
                        t.bytes.len()
                    ),
                ));
            }
        }
    }

    // serde_json's Map is ordered by key, which gives the sorted layout.
    let mut map = Map::new();
    if let Some(meta) = metadata {
        map.insert(METADATA_KEY.to_string(), json!(meta));
    }
    let mut sorted: Vec<&TensorData> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut offset = 0usize;
    for t in sorted {
        let end = offset + t.bytes.len();
        map.insert(
            t.name.clone(),
            json!({
                "dtype": t.dtype.safetensors_name(),
                "shape": t.shape,
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut header = Value::Object(map).to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    Ok(header)
}

/// A sibling of `path` that is unique to this process.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes a `model.safetensors.index.json`-style index: `weight_map` maps
/// each tensor to the file name of its shard (relative to the index's
/// directory); `total_size` is the sum of tensor data bytes.
pub fn write_index(
    path: &Path,
    weight_map: &BTreeMap<String, String>,
    total_size: u64,
) -> Result<(), CheckpointError> {
    let index = json!({
        "metadata": { "total_size": total_size },
        "weight_map": weight_map,
    });
    let mut text = serde_json::to_string_pretty(&index).expect("a JSON value always serialises");
    text.push('\n');
    fs::write(path, text).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        action: "write index",
        source,
    })
}

/// `f32` values as little-endian bf16 bytes, rounded to nearest-even.
pub fn f32_to_bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
        .collect()
}

/// `f32` values as little-endian f16 bytes, rounded to nearest-even.
pub fn f32_to_f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
        .collect()
}

/// `f32` values as little-endian bytes.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `i64` values as little-endian bytes.
pub fn i64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7):
        // ties go to the even mantissa, i.e. 1.0.
        let tie = 1.0 + f32::powi(2.0, -8);
        assert_eq!(f32_to_bf16_bytes(&[tie]), 0x3f80u16.to_le_bytes());
        // Just above the tie rounds up.
        let above = f32::from_bits(tie.to_bits() + 1);
        assert_eq!(f32_to_bf16_bytes(&[above]), 0x3f81u16.to_le_bytes());
        assert_eq!(f32_to_f16_bytes(&[1.0]), 0x3c00u16.to_le_bytes());
    }

    #[test]
    fn header_is_padded_and_sorted() {
        let t = |name: &str| TensorData {
            name: name.to_string(),
            dtype: DType::U8,
            shape: vec![1],
            bytes: Cow::Owned(vec![7]),
        };
        let h = build_header(Path::new("f"), &[t("b"), t("a")], None).unwrap();
        assert_eq!(h.len() % 8, 0);
        assert!(h.find("\"a\"").unwrap() < h.find("\"b\"").unwrap());
        assert!(h.contains(r#""a":{"data_offsets":[0,1]"#), "{h}");
    }

    #[test]
    fn rejects_bad_tensors() {
        let t = |name: &str, n: usize| TensorData {
            name: name.to_string(),
            dtype: DType::F32,
            shape: vec![2],
            bytes: Cow::Owned(vec![0; n]),
        };
        let e = build_header(Path::new("/o.safetensors"), &[t("w", 7)], None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "checkpoint /o.safetensors: cannot write tensor w: f32 [2] needs 8 bytes but 7 were given"
        );
        let e = build_header(Path::new("f"), &[t("w", 8), t("w", 8)], None).unwrap_err();
        assert!(e.to_string().contains("name given twice"), "{e}");
        let e = build_header(Path::new("f"), &[t(METADATA_KEY, 8)], None).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
    }
}
