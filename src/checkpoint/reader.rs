//! `Checkpoint`: a set of mapped safetensors files seen as one name → tensor
//! table. Directory resolution (`open_dir`) lives in `dir.rs`.

use std::collections::btree_map::Entry as MapEntry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::dtype::{bytes_to_f32, bytes_to_i64, DType};
use super::error::CheckpointError;
use super::finite::find_non_finite;
use super::safetensors_file::{parse_header, MappedTensor, SafetensorsFile, StoredTensor};

/// Description of one tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The file that holds the tensor's bytes.
    pub file: PathBuf,
}

/// Parses and validates the header of a whole safetensors file held in memory, exactly as
/// opening a file does after mapping it (`origin` names the file in errors and in the result):
/// the tensors in header order. For tools that hold a file's bytes already, and for fuzzing.
pub fn read_header(origin: &Path, image: &[u8]) -> Result<Vec<TensorInfo>, CheckpointError> {
    let header = parse_header(origin, image)?;
    Ok(header
        .tensors
        .into_iter()
        .map(|t| TensorInfo {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            file: origin.to_path_buf(),
        })
        .collect())
}

/// Where a tensor lives: which file, and its header entry there.
#[derive(Debug)]
struct Location {
    file: usize,
    tensor: StoredTensor,
}

/// All tensors of one or more safetensors files, memory-mapped.
///
/// Tensor bytes are never copied until asked for: `bytes` hands out slices of
/// the mappings, and the OS pages data in on first touch.
#[derive(Debug)]
pub struct Checkpoint {
    files: Vec<SafetensorsFile>,
    /// Same order as `files`; kept separately so `files()` can return a slice.
    paths: Vec<PathBuf>,
    /// A BTreeMap so that `names()` is sorted without extra work.
    tensors: BTreeMap<String, Location>,
}

impl Checkpoint {
    /// Opens explicit files (used by tests and by `logits --out` readers).
    ///
    /// Fails if any file is unreadable or malformed, or if a tensor name
    /// occurs in more than one file.
    pub fn open_files(files: &[PathBuf]) -> Result<Checkpoint, CheckpointError> {
        if files.is_empty() {
            return Err(CheckpointError::NoFilesGiven);
        }
        let opened = files
            .iter()
            .map(|p| SafetensorsFile::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut tensors: BTreeMap<String, Location> = BTreeMap::new();
        for (index, file) in opened.iter().enumerate() {
            for t in &file.header.tensors {
                match tensors.entry(t.name.clone()) {
                    MapEntry::Occupied(prev) => {
                        return Err(CheckpointError::DuplicateTensor {
                            path: file.path.clone(),
                            tensor: t.name.clone(),
                            other: opened[prev.get().file].path.clone(),
                        });
                    }
                    MapEntry::Vacant(slot) => {
                        slot.insert(Location {
                            file: index,
                            tensor: t.clone(),
                        });
                    }
                }
            }
        }
        Ok(Checkpoint {
            paths: opened.iter().map(|f| f.path.clone()).collect(),
            files: opened,
            tensors,
        })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Tensor names that start with `prefix`, sorted; found by a range search, so the cost is
    /// that of the matches, not of the whole checkpoint.
    pub fn names_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.tensors
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .map(|(name, _)| name.as_str())
            .take_while(move |name| name.starts_with(prefix))
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the checkpoint holds no tensor (an empty header is valid).
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn info(&self, name: &str) -> Option<TensorInfo> {
        self.tensors.get(name).map(|loc| TensorInfo {
            name: name.to_string(),
            dtype: loc.tensor.dtype.clone(),
            shape: loc.tensor.shape.clone(),
            file: self.paths[loc.file].clone(),
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Raw little-endian bytes of the tensor (zero-copy from the mmap).
    ///
    /// The slice has no alignment guarantee beyond 1: the data section
    /// starts wherever the header ends.
    pub fn bytes(&self, name: &str) -> Result<&[u8], CheckpointError> {
        let loc = self.locate(name)?;
        Ok(self.files[loc.file].tensor_bytes(&loc.tensor))
    }

    /// The tensor's bytes as a handle that keeps its file mapped (a table read on the host
    /// after the checkpoint is dropped).
    pub fn mapped(&self, name: &str) -> Result<MappedTensor, CheckpointError> {
        let loc = self.locate(name)?;
        Ok(self.files[loc.file].tensor_mapping(&loc.tensor))
    }

    /// Converts an f32/f16/bf16 tensor to `f32` (f16/bf16 widened exactly).
    /// Large tensors are converted in parallel.
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        let loc = self.locate(name)?;
        let bytes = self.files[loc.file].tensor_bytes(&loc.tensor);
        bytes_to_f32(&loc.tensor.dtype, bytes).ok_or_else(|| self.unsupported(loc, "f32"))
    }

    /// Checks an f32/bf16/f16 tensor for NaN and infinity on its mapped bytes, without copying
    /// them: `Err(CheckpointError::NonFinite)` names the tensor, its file, the count and the
    /// first bad element. Tensors of other dtypes pass (see [`find_non_finite`]).
    pub fn check_finite(&self, name: &str) -> Result<(), CheckpointError> {
        let loc = self.locate(name)?;
        let bytes = self.files[loc.file].tensor_bytes(&loc.tensor);
        match find_non_finite(&loc.tensor.dtype, bytes) {
            None => Ok(()),
            Some(found) => Err(CheckpointError::NonFinite {
                path: self.paths[loc.file].clone(),
                tensor: loc.tensor.name.clone(),
                dtype: loc.tensor.dtype.clone(),
                shape: loc.tensor.shape.clone(),
                found: Box::new(found),
            }),
        }
    }

    /// Converts an i64 or i32 tensor to `i64`.
    pub fn to_i64(&self, name: &str) -> Result<Vec<i64>, CheckpointError> {
        let loc = self.locate(name)?;
        let bytes = self.files[loc.file].tensor_bytes(&loc.tensor);
        bytes_to_i64(&loc.tensor.dtype, bytes).ok_or_else(|| self.unsupported(loc, "i64"))
    }

    /// The files of the checkpoint, in the order they were opened.
    pub fn files(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Sum of the tensors' data sizes in bytes (what an index's
    /// `metadata.total_size` records; headers are not counted).
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|loc| (loc.tensor.end - loc.tensor.start) as u64)
            .sum()
    }

    /// The `__metadata__` map of the `index`-th file (empty if it has none);
    /// `None` if there is no such file.
    pub fn file_metadata(&self, index: usize) -> Option<&BTreeMap<String, String>> {
        self.files.get(index).map(|f| &f.header.metadata)
    }

    /// Index of `path` among the files, for `open_dir`'s index check.
    pub(crate) fn file_index(&self, path: &Path) -> Option<usize> {
        self.paths.iter().position(|p| p == path)
    }

    /// The index of the file that holds `name`, if any.
    pub(crate) fn file_of(&self, name: &str) -> Option<usize> {
        self.tensors.get(name).map(|loc| loc.file)
    }

    fn locate(&self, name: &str) -> Result<&Location, CheckpointError> {
        self.tensors
            .get(name)
            .ok_or_else(|| CheckpointError::NoSuchTensor(name.to_string()))
    }

    fn unsupported(&self, loc: &Location, wanted: &'static str) -> CheckpointError {
        CheckpointError::UnsupportedDtype {
            path: self.paths[loc.file].clone(),
            tensor: loc.tensor.name.clone(),
            dtype: loc.tensor.dtype.clone(),
            wanted,
        }
    }
}
