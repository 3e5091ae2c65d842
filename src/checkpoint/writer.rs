//! Writing safetensors files and shard indexes, plus helpers that turn
//! `f32`/`i64` slices into the little-endian bytes the writer takes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{BufWriter, Seek, SeekFrom, Write};
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
    let headers: Vec<TensorHeader> = tensors
        .iter()
        .map(|t| TensorHeader {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            len: t.bytes.len(),
        })
        .collect();
    let mut out = SafetensorsWriter::create(path, &headers, metadata)?;
    // Data in file order (sorted by name), so the writes are sequential.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    for i in order {
        out.write(i, 0, &tensors[i].bytes)?;
    }
    out.finish()
}

/// A tensor whose bytes [`SafetensorsWriter`] takes later: name, dtype, shape
/// and the number of data bytes.
#[derive(Debug, Clone)]
pub struct TensorHeader {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub len: usize,
}

/// A safetensors file written piece by piece: the header (names sorted, as
/// [`write_safetensors`] lays them out) is fixed when the file is created,
/// then each tensor's bytes are written at their place, in any order and in
/// as many pieces as the caller likes, so no more than one piece need be in
/// memory. Bytes never written read as zeros and, on file systems with
/// sparse files, take no disk (holes).
///
/// The file is written under a temporary name in the same directory and
/// renamed into place by [`finish`](Self::finish); a writer dropped before
/// that (an error, a full disk) removes the temporary, so no half-written
/// file is ever left under the final name.
pub struct SafetensorsWriter {
    path: PathBuf,
    tmp: PathBuf,
    /// `None` once finished.
    out: Option<BufWriter<File>>,
    /// Each tensor's bytes in the file, in the order given: (start, len).
    ranges: Vec<(u64, u64)>,
    names: Vec<String>,
    /// Where the next byte written goes.
    pos: u64,
    len: u64,
}

impl SafetensorsWriter {
    /// Creates the temporary file of `path`, sized for every tensor, and
    /// writes its header.
    pub fn create(
        path: &Path,
        tensors: &[TensorHeader],
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<SafetensorsWriter, CheckpointError> {
        let (header, offsets) = build_header(path, tensors, metadata)?;
        let data_start = 8 + header.len() as u64;
        let data_len = offsets.iter().map(|&(_, end)| end).max().unwrap_or(0) as u64;
        let tmp = temp_path(path);
        let file = File::create(&tmp).map_err(|source| write_error(path, source))?;
        let mut writer = SafetensorsWriter {
            path: path.to_path_buf(),
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            ranges: offsets
                .iter()
                .map(|&(start, end)| (data_start + start as u64, (end - start) as u64))
                .collect(),
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            pos: 0,
            len: data_start + data_len,
        };
        // From here on a failure drops `writer`, which removes the temporary.
        let len = writer.len;
        writer.io(|out| {
            out.get_ref().set_len(len)?;
            out.write_all(&(header.len() as u64).to_le_bytes())?;
            out.write_all(header.as_bytes())
        })?;
        writer.pos = data_start;
        Ok(writer)
    }

    /// The size the file will have: header and every tensor's bytes.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// Writes `bytes` into tensor `tensor` (its index in the list given to
    /// [`create`](Self::create)), starting `offset` bytes into its data.
    pub fn write(
        &mut self,
        tensor: usize,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), CheckpointError> {
        let (start, len) = self.ranges[tensor];
        if offset + bytes.len() as u64 > len {
            return Err(CheckpointError::InvalidTensor {
                path: self.path.clone(),
                tensor: self.names[tensor].clone(),
                reason: format!(
                    "{} bytes at offset {offset} run past its {len} bytes",
                    bytes.len()
                ),
            });
        }
        let at = start + offset;
        let pos = self.pos;
        self.io(|out| {
            if at != pos {
                out.seek(SeekFrom::Start(at))?;
            }
            out.write_all(bytes)
        })?;
        self.pos = at + bytes.len() as u64;
        Ok(())
    }

    /// Flushes and syncs the file and renames it to its final name.
    pub fn finish(mut self) -> Result<(), CheckpointError> {
        let (tmp, path) = (self.tmp.clone(), self.path.clone());
        let out = self.out.take().expect("a writer finishes once");
        let done = (|| -> std::io::Result<()> {
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        done.map_err(|source| {
            let _ = fs::remove_file(&tmp);
            write_error(&path, source)
        })
    }

    fn io(
        &mut self,
        f: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
    ) -> Result<(), CheckpointError> {
        let out = self
            .out
            .as_mut()
            .expect("a finished writer is not written to");
        f(out).map_err(|source| write_error(&self.path, source))
    }
}

impl Drop for SafetensorsWriter {
    fn drop(&mut self) {
        if let Some(out) = self.out.take() {
            // Not finished: an error cut it short. Best effort.
            drop(out.into_inner());
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn write_error(path: &Path, source: std::io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_path_buf(),
        action: "write file",
        source,
    }
}

/// Validates the tensors and returns the JSON header, padded with spaces so
/// that the data section starts 8-byte aligned (as the format recommends),
/// and each tensor's `data_offsets`, in the order given.
fn build_header(
    path: &Path,
    tensors: &[TensorHeader],
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(String, Vec<(usize, usize)>), CheckpointError> {
    let bad = |t: &TensorHeader, reason: String| CheckpointError::InvalidTensor {
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
            if expected != Some(t.len) {
                return Err(bad(
                    t,
                    format!(
                        "{} {:?} needs {} bytes but {} were given",
                        t.dtype,
                        t.shape,
                        expected.map_or("too many".to_string(), |n| n.to_string()),
                        t.len
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
    let mut sorted: Vec<usize> = (0..tensors.len()).collect();
    sorted.sort_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    let mut offsets = vec![(0, 0); tensors.len()];
    let mut offset = 0usize;
    for i in sorted {
        let t = &tensors[i];
        let end = offset + t.len;
        map.insert(
            t.name.clone(),
            json!({
                "dtype": t.dtype.safetensors_name(),
                "shape": t.shape,
                "data_offsets": [offset, end],
            }),
        );
        offsets[i] = (offset, end);
        offset = end;
    }
    let mut header = Value::Object(map).to_string();
    while !header.len().is_multiple_of(8) {
        header.push(' ');
    }
    Ok((header, offsets))
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

    fn header(name: &str, dtype: DType, shape: Vec<usize>, len: usize) -> TensorHeader {
        TensorHeader {
            name: name.to_string(),
            dtype,
            shape,
            len,
        }
    }

    #[test]
    fn header_is_padded_and_sorted() {
        let t = |name: &str| header(name, DType::U8, vec![1], 1);
        let (h, offsets) = build_header(Path::new("f"), &[t("b"), t("a")], None).unwrap();
        assert_eq!(h.len() % 8, 0);
        assert!(h.find("\"a\"").unwrap() < h.find("\"b\"").unwrap());
        assert!(h.contains(r#""a":{"data_offsets":[0,1]"#), "{h}");
        assert_eq!(offsets, [(1, 2), (0, 1)]);
    }

    #[test]
    fn rejects_bad_tensors() {
        let t = |name: &str, n: usize| header(name, DType::F32, vec![2], n);
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

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("graphrun-writer-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Pieces written out of order, and a tensor never written, give the file
    /// `write_safetensors` writes with that tensor's bytes zero.
    #[test]
    fn streamed_pieces_and_holes() {
        let dir = scratch("stream");
        let tensors = [
            header("z", DType::F32, vec![2], 8),
            header("hole", DType::U8, vec![3, 4], 12),
            header("a", DType::U8, vec![3], 3),
        ];
        let path = dir.join("s.safetensors");
        let mut w = SafetensorsWriter::create(&path, &tensors, None).unwrap();
        w.write(0, 4, &2f32.to_le_bytes()).unwrap();
        w.write(2, 0, &[1, 2, 3]).unwrap();
        w.write(0, 0, &1f32.to_le_bytes()).unwrap();
        let len = w.file_len();
        w.finish().unwrap();
        let streamed = fs::read(&path).unwrap();
        assert_eq!(streamed.len() as u64, len);

        let whole = dir.join("w.safetensors");
        let data = |t: &TensorHeader, bytes: Vec<u8>| TensorData {
            name: t.name.clone(),
            dtype: t.dtype.clone(),
            shape: t.shape.clone(),
            bytes: Cow::Owned(bytes),
        };
        let full = [
            data(&tensors[0], f32_bytes(&[1.0, 2.0])),
            data(&tensors[1], vec![0; 12]),
            data(&tensors[2], vec![1, 2, 3]),
        ];
        write_safetensors(&whole, &full, None).unwrap();
        assert_eq!(streamed, fs::read(&whole).unwrap());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2, "no temporary left");
        let _ = fs::remove_dir_all(&dir);
    }

    /// A write past a tensor's end is refused by name; a writer dropped
    /// unfinished leaves nothing behind.
    #[test]
    fn bad_writes_and_unfinished_files() {
        let dir = scratch("unfinished");
        let path = dir.join("u.safetensors");
        let mut w =
            SafetensorsWriter::create(&path, &[header("t", DType::U8, vec![2], 2)], None).unwrap();
        let e = w.write(0, 1, &[1, 2]).unwrap_err().to_string();
        assert!(
            e.contains("tensor t") && e.contains("run past its 2 bytes"),
            "{e}"
        );
        drop(w);
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "nothing left");
        let e = SafetensorsWriter::create(&dir.join("no/such/dir/f"), &[], None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("no/such/dir/f") && e.contains("cannot write file"),
            "{e}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
