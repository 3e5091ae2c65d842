//! One memory-mapped safetensors file: header parsing and validation.
//!
//! Layout: an 8-byte little-endian `u64` N, then N bytes of UTF-8 JSON
//! `{name: {"dtype", "shape", "data_offsets": [start, end]}, "__metadata__": {..}}`,
//! then the data section, which `data_offsets` index (relative to its start).
//!
//! The header is parsed here rather than through the `safetensors` crate so
//! that every defect can be reported with the file, the tensor and the exact
//! numbers involved, and so that unknown dtypes survive as `DType::Other`.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::Deserialize;

use super::dtype::DType;
use super::error::CheckpointError;

/// Name of the reserved header key that holds free-form string metadata.
pub(crate) const METADATA_KEY: &str = "__metadata__";

/// One tensor as described by a header, its offsets relative to the data
/// section.
#[derive(Debug, Clone)]
pub(crate) struct StoredTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

/// Shape of one header entry as written in the JSON.
#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// What a parsed header yields.
#[derive(Debug)]
pub(crate) struct Header {
    /// Offset of the data section from the start of the file (8 + N).
    pub data_start: usize,
    pub metadata: BTreeMap<String, String>,
    /// In header (name) order.
    pub tensors: Vec<StoredTensor>,
}

/// An open, validated safetensors file.
#[derive(Debug)]
pub(crate) struct SafetensorsFile {
    pub path: PathBuf,
    /// Shared with what outlives the checkpoint's other uses (a table read on the host).
    mmap: Arc<Mmap>,
    pub header: Header,
}

impl SafetensorsFile {
    /// Maps `path` and validates its header against the file's size.
    pub(crate) fn open(path: &Path) -> Result<SafetensorsFile, CheckpointError> {
        let io_err = |action, source| CheckpointError::Io {
            path: path.to_path_buf(),
            action,
            source,
        };
        let file = File::open(path).map_err(|e| io_err("open file", e))?;
        let len = file
            .metadata()
            .map_err(|e| io_err("read file metadata", e))?
            .len();
        // Checked before mapping: mapping an empty file fails with an
        // unhelpful EINVAL, and a short file is a format error, not an I/O one.
        if len < 8 {
            return Err(invalid(
                path,
                format!("file is only {len} bytes, shorter than the 8-byte header length prefix"),
            ));
        }
        // SAFETY: the mapping is only ever read. Another process truncating
        // or rewriting the file while it is mapped would change what we see
        // (or fault); checkpoints are treated as read-only inputs, which is
        // the same contract every mmap-based safetensors reader relies on.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| io_err("memory-map file", e))?;
        let header = parse_header(path, &mmap)?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            mmap: Arc::new(mmap),
            header,
        })
    }

    /// Bytes of a tensor of this file's header (offsets already validated).
    pub(crate) fn tensor_bytes(&self, t: &StoredTensor) -> &[u8] {
        &self.mmap[self.header.data_start + t.start..self.header.data_start + t.end]
    }

    /// The mapping and the byte range of a tensor of this file's header.
    pub(crate) fn tensor_mapping(&self, t: &StoredTensor) -> MappedTensor {
        MappedTensor {
            map: self.mmap.clone(),
            start: self.header.data_start + t.start,
            end: self.header.data_start + t.end,
        }
    }
}

/// A tensor's bytes that keep their file mapped for as long as they are held.
#[derive(Debug, Clone)]
pub struct MappedTensor {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl MappedTensor {
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

fn invalid(path: &Path, reason: String) -> CheckpointError {
    CheckpointError::InvalidHeader {
        path: path.to_path_buf(),
        reason,
    }
}

/// Parses and validates the header of a whole safetensors file held in
/// `file`. `path` is only used in error messages.
pub(crate) fn parse_header(path: &Path, file: &[u8]) -> Result<Header, CheckpointError> {
    let Some(prefix) = file.get(..8) else {
        return Err(invalid(
            path,
            format!(
                "file is only {} bytes, shorter than the 8-byte header length prefix",
                file.len()
            ),
        ));
    };
    let header_len = u64::from_le_bytes(prefix.try_into().expect("8 bytes"));
    let available = (file.len() - 8) as u64;
    if header_len > available {
        return Err(invalid(
            path,
            format!(
                "truncated or corrupt header: header length is {header_len} bytes \
                 but only {available} bytes follow the length prefix"
            ),
        ));
    }
    // Fits in usize: it is no larger than the in-memory file.
    let data_start = 8 + header_len as usize;
    let text = std::str::from_utf8(&file[8..data_start]).map_err(|e| {
        invalid(
            path,
            format!("truncated or corrupt header: header is not valid UTF-8 ({e})"),
        )
    })?;
    let json: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| {
            invalid(
                path,
                format!("truncated or corrupt header: header is not a valid JSON object ({e})"),
            )
        })?;

    let data_len = file.len() - data_start;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(json.len());
    for (name, value) in json {
        if name == METADATA_KEY {
            metadata = parse_metadata(path, value)?;
            continue;
        }
        let entry: HeaderEntry = serde_json::from_value(value)
            .map_err(|e| invalid(path, format!("tensor {name}: malformed header entry ({e})")))?;
        tensors.push(validate_entry(path, name, entry, data_len)?);
    }
    check_overlaps(path, &tensors)?;
    Ok(Header {
        data_start,
        metadata,
        tensors,
    })
}

fn parse_metadata(
    path: &Path,
    value: serde_json::Value,
) -> Result<BTreeMap<String, String>, CheckpointError> {
    serde_json::from_value(value).map_err(|e| {
        invalid(
            path,
            format!("{METADATA_KEY} must map strings to strings ({e})"),
        )
    })
}

/// Checks one entry's offsets and size on its own.
fn validate_entry(
    path: &Path,
    name: String,
    entry: HeaderEntry,
    data_len: usize,
) -> Result<StoredTensor, CheckpointError> {
    let [start, end] = entry.data_offsets;
    if start > end {
        return Err(CheckpointError::BadOffsets {
            path: path.to_path_buf(),
            tensor: name,
            reason: format!("data_offsets [{start}, {end}] are out of order"),
        });
    }
    if end > data_len {
        return Err(CheckpointError::Truncated {
            path: path.to_path_buf(),
            tensor: name,
            start,
            end,
            data_len,
        });
    }
    let dtype = DType::from_safetensors(&entry.dtype);
    if let Some(elem) = dtype.size_bytes() {
        let expected = entry
            .shape
            .iter()
            .try_fold(elem, |acc, &d| acc.checked_mul(d));
        let Some(expected) = expected else {
            return Err(invalid(
                path,
                format!(
                    "tensor {name}: shape {:?} of {dtype} overflows the address space",
                    entry.shape
                ),
            ));
        };
        if expected != end - start {
            return Err(CheckpointError::SizeMismatch {
                path: path.to_path_buf(),
                tensor: name,
                dtype,
                shape: entry.shape,
                expected,
                actual: end - start,
            });
        }
    }
    Ok(StoredTensor {
        name,
        dtype,
        shape: entry.shape,
        start,
        end,
    })
}

/// Rejects tensors that share bytes. Gaps between tensors are tolerated:
/// they waste space but cannot make one tensor read another's data.
fn check_overlaps(path: &Path, tensors: &[StoredTensor]) -> Result<(), CheckpointError> {
    let mut by_offset: Vec<&StoredTensor> = tensors.iter().collect();
    by_offset.sort_by_key(|t| (t.start, t.end));
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.end > b.start {
            return Err(CheckpointError::BadOffsets {
                path: path.to_path_buf(),
                tensor: b.name.clone(),
                reason: format!(
                    "bytes [{},{}) overlap tensor {} at [{},{})",
                    b.start, b.end, a.name, a.start, a.end
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a file image from a header string and a data section.
    fn image(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    fn err(header: &str, data: &[u8]) -> String {
        parse_header(Path::new("/x/a.safetensors"), &image(header, data))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_entries_and_metadata() {
        let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[4,7]},"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}"#;
        let parsed = parse_header(Path::new("a"), &image(h, &[0; 7])).unwrap();
        assert_eq!(parsed.metadata["format"], "pt");
        assert_eq!(parsed.data_start, 8 + h.len());
        let names: Vec<_> = parsed.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(parsed.tensors[1].dtype, DType::Other("F8_E4M3".into()));
    }

    #[test]
    fn reversed_offsets() {
        let e = err(
            r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}}"#,
            &[0; 4],
        );
        assert!(
            e.contains("tensor a: data_offsets [2, 1] are out of order"),
            "{e}"
        );
    }

    #[test]
    fn overlapping_tensors() {
        let e = err(
            r#"{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}"#,
            &[0; 4],
        );
        assert!(
            e.contains("tensor b: bytes [2,4) overlap tensor a at [0,3)"),
            "{e}"
        );
    }

    #[test]
    fn size_not_matching_dtype_and_shape() {
        let e = err(
            r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#,
            &[0; 12],
        );
        assert_eq!(
            e,
            "checkpoint /x/a.safetensors: tensor w (f32 [2, 2]) should have 16 bytes \
             but its data_offsets span 12"
        );
    }

    #[test]
    fn malformed_entry_and_metadata() {
        let e = err(r#"{"w":{"dtype":"F32","shape":[1]}}"#, &[0; 4]);
        assert!(e.contains("tensor w: malformed header entry"), "{e}");
        let e = err(r#"{"__metadata__":{"n":1}}"#, &[]);
        assert!(
            e.contains("__metadata__ must map strings to strings"),
            "{e}"
        );
        let e = err("[1,2]", &[]);
        assert!(e.contains("not a valid JSON object"), "{e}");
    }

    #[test]
    fn shape_overflow_is_an_error_not_a_panic() {
        let e = err(
            r#"{"w":{"dtype":"F32","shape":[18446744073709551615,4],"data_offsets":[0,0]}}"#,
            &[],
        );
        assert!(e.contains("overflows"), "{e}");
    }

    #[test]
    fn empty_header_and_zero_sized_tensors() {
        let parsed = parse_header(Path::new("a"), &image("{}", &[])).unwrap();
        assert!(parsed.tensors.is_empty());
        let h = r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        assert_eq!(
            parse_header(Path::new("a"), &image(h, &[0; 4]))
                .unwrap()
                .tensors
                .len(),
            2
        );
    }
}
