//! Opening a model directory as laid out by Hugging Face: one
//! `model.safetensors`, or shards listed in `model.safetensors.index.json`,
//! or (for hand-made directories) whatever `*.safetensors` files are there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::CheckpointError;
use super::reader::Checkpoint;

/// File name of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The part of the index we use; `metadata` (total_size) is not needed
/// because the shards' own headers are authoritative.
#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Opens a model directory: `model.safetensors` if present, else the
    /// shards named by `model.safetensors.index.json`, else every
    /// `*.safetensors` file in the directory (sorted by name).
    ///
    /// With an index, every tensor it lists must be in the shard it names.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(CheckpointError::BadDir {
                    path: dir.to_path_buf(),
                    reason: "not a directory",
                })
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(CheckpointError::BadDir {
                    path: dir.to_path_buf(),
                    reason: "directory does not exist",
                })
            }
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: dir.to_path_buf(),
                    action: "read directory",
                    source,
                })
            }
        }

        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Checkpoint::open_files(&[single]);
        }
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return open_indexed(dir, &index);
        }
        let files = list_safetensors(dir)?;
        if files.is_empty() {
            return Err(CheckpointError::NoSafetensors {
                path: dir.to_path_buf(),
            });
        }
        Checkpoint::open_files(&files)
    }
}

fn open_indexed(dir: &Path, index_path: &Path) -> Result<Checkpoint, CheckpointError> {
    let text = fs::read_to_string(index_path).map_err(|source| CheckpointError::Io {
        path: index_path.to_path_buf(),
        action: "read index",
        source,
    })?;
    let index: IndexFile = serde_json::from_str(&text).map_err(|e| {
        // serde_json appends " at line L column C" to its message; the
        // location is reported in its own fields, so drop the suffix.
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        CheckpointError::IndexJson {
            path: index_path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message,
        }
    })?;
    if index.weight_map.is_empty() {
        return Err(CheckpointError::InvalidHeader {
            path: index_path.to_path_buf(),
            reason: "index weight_map is empty".to_string(),
        });
    }

    // Each shard once, in name order (shard names sort by their number).
    let shards: BTreeSet<&str> = index.weight_map.values().map(String::as_str).collect();
    let mut files = Vec::with_capacity(shards.len());
    for shard in shards {
        let shard_path = dir.join(shard);
        if !shard_path.is_file() {
            return Err(CheckpointError::IndexMissingShard {
                path: index_path.to_path_buf(),
                shard: shard.to_string(),
                shard_path,
            });
        }
        files.push(shard_path);
    }

    let checkpoint = Checkpoint::open_files(&files)?;
    for (tensor, shard) in &index.weight_map {
        let shard_path = dir.join(shard);
        let expected = checkpoint.file_index(&shard_path);
        if expected.is_none() || checkpoint.file_of(tensor) != expected {
            return Err(CheckpointError::IndexMissingTensor {
                path: shard_path,
                tensor: tensor.clone(),
                index: index_path.to_path_buf(),
            });
        }
    }
    Ok(checkpoint)
}

/// Every regular file (or link to one) named `*.safetensors` in `dir`, sorted.
fn list_safetensors(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let io_err = |source| CheckpointError::Io {
        path: dir.to_path_buf(),
        action: "list directory",
        source,
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let path = entry.map_err(io_err)?.path();
        if path.extension().is_some_and(|e| e == "safetensors") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
