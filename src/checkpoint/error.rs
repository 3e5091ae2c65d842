//! The one error type of the checkpoint module.
//!
//! Every variant that concerns a file carries its path, and every message
//! starts with `checkpoint <path>: ` so that a user looking at a broken model
//! directory can tell at once which shard is at fault.

use std::path::PathBuf;

use super::dtype::DType;
use super::finite::NonFinite;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The model directory given to `Checkpoint::open_dir` does not exist or
    /// is not a directory.
    #[error("checkpoint {}: {reason}", path.display())]
    BadDir { path: PathBuf, reason: &'static str },

    /// The directory holds no `model.safetensors`, no index and no
    /// `*.safetensors` file.
    #[error(
        "checkpoint {}: no safetensors files (looked for model.safetensors, \
         model.safetensors.index.json and *.safetensors)",
        path.display()
    )]
    NoSafetensors { path: PathBuf },

    /// `Checkpoint::open_files` was called with an empty list.
    #[error("checkpoint: no files given")]
    NoFilesGiven,

    /// An operating-system error while reading, mapping or writing a file.
    #[error("checkpoint {}: cannot {action}: {source}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },

    /// The header of a safetensors file is unreadable: file too short,
    /// header length past the end of the file, not UTF-8, not JSON, or an
    /// entry of the wrong form.
    #[error("checkpoint {}: {reason}", path.display())]
    InvalidHeader { path: PathBuf, reason: String },

    /// A tensor's bytes lie past the end of the data section.
    #[error(
        "checkpoint {}: file is truncated: tensor {tensor} needs bytes [{start},{end}) \
         but the data section has only {data_len} bytes",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        tensor: String,
        start: usize,
        end: usize,
        data_len: usize,
    },

    /// `data_offsets` reversed, or two tensors sharing bytes.
    #[error("checkpoint {}: tensor {tensor}: {reason}", path.display())]
    BadOffsets {
        path: PathBuf,
        tensor: String,
        reason: String,
    },

    /// The byte range of a tensor does not match `dtype` × `shape`.
    #[error(
        "checkpoint {}: tensor {tensor} ({dtype} {shape:?}) should have {expected} bytes \
         but its data_offsets span {actual}",
        path.display()
    )]
    SizeMismatch {
        path: PathBuf,
        tensor: String,
        dtype: DType,
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },

    /// `model.safetensors.index.json` is not valid JSON or lacks `weight_map`.
    #[error(
        "checkpoint {}: malformed index (line {line}, column {column}): {message}",
        path.display()
    )]
    IndexJson {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    /// The index names a shard that is not in the directory.
    #[error(
        "checkpoint {}: index names shard {shard}, which does not exist ({})",
        path.display(),
        shard_path.display()
    )]
    IndexMissingShard {
        path: PathBuf,
        shard: String,
        shard_path: PathBuf,
    },

    /// The index says a tensor is in a shard, but the shard does not hold it.
    #[error(
        "checkpoint {}: tensor {tensor} is listed in {} but absent from this shard",
        path.display(),
        index.display()
    )]
    IndexMissingTensor {
        path: PathBuf,
        tensor: String,
        index: PathBuf,
    },

    /// The same tensor name appears in two files (or twice in one list).
    #[error(
        "checkpoint {}: tensor {tensor} is also in {}",
        path.display(),
        other.display()
    )]
    DuplicateTensor {
        path: PathBuf,
        tensor: String,
        other: PathBuf,
    },

    /// A lookup for a name the checkpoint does not hold.
    #[error("checkpoint: no tensor named {0:?}")]
    NoSuchTensor(String),

    /// A conversion (`to_f32`, `to_i64`) asked of a tensor whose dtype it
    /// does not handle.
    #[error(
        "checkpoint {}: tensor {tensor} has dtype {dtype}, which cannot be converted to {wanted}",
        path.display()
    )]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: DType,
        wanted: &'static str,
    },

    /// A float tensor holds NaN or infinity (`Checkpoint::check_finite`). Boxed: the largest
    /// variant sets the size of every `Result` that carries this error.
    #[error(
        "checkpoint {}: tensor {tensor} ({dtype} {shape:?}) holds {}",
        path.display(),
        found.describe(shape)
    )]
    NonFinite {
        path: PathBuf,
        tensor: String,
        dtype: DType,
        shape: Vec<usize>,
        found: Box<NonFinite>,
    },

    /// The writer was handed a tensor it cannot store faithfully.
    #[error("checkpoint {}: cannot write tensor {tensor}: {reason}", path.display())]
    InvalidTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
}
