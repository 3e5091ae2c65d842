//! Reading (and writing) safetensors checkpoints.
//!
//! A [`Checkpoint`] is a set of memory-mapped safetensors files seen as a
//! single sorted table of tensors. It is opened either from a model
//! directory ([`Checkpoint::open_dir`]: `model.safetensors`, or the shards
//! listed in `model.safetensors.index.json`, or every `*.safetensors` file)
//! or from an explicit list of files ([`Checkpoint::open_files`]).
//!
//! Headers are parsed and checked against the file sizes when a file is
//! opened, so later accesses cannot fail on a malformed file: every
//! problem (short file, corrupt header, truncated data, overlapping or
//! mis-sized tensors, index/shard disagreement, duplicate tensors) surfaces
//! from `open_*` as a [`CheckpointError`] naming the file and, where it
//! applies, the tensor. Tensor data is never copied until asked for:
//! [`Checkpoint::bytes`] borrows from the mapping, and
//! [`Checkpoint::to_f32`] / [`Checkpoint::to_i64`] widen into new vectors.
//! [`find_non_finite`] scans a float tensor's bytes in place for NaN and
//! infinity (and [`Checkpoint::check_finite`] names the tensor when it finds
//! any), for loaders that copy stored bytes as they are.
//!
//! Unknown dtypes are kept as [`DType::Other`] and only become an error when
//! a conversion is requested.
//!
//! [`write_safetensors`] and [`write_index`] produce files this module (and
//! any other safetensors reader) can open; [`SafetensorsWriter`] writes the
//! same files a piece at a time (leaving unwritten bytes as holes); the
//! `*_bytes` helpers encode `f32`/`i64` slices for them.

mod dir;
mod dtype;
mod error;
mod finite;
mod reader;
mod safetensors_file;
mod writer;

#[cfg(test)]
mod tests;

pub use dir::{INDEX_FILE, SINGLE_FILE};
pub(crate) use dtype::bytes_to_f32;
pub use dtype::DType;
pub use error::CheckpointError;
pub use finite::{find_non_finite, NonFinite};
pub use reader::{read_header, Checkpoint, TensorInfo};
pub use safetensors_file::MappedTensor;
pub use writer::{
    f32_bytes, f32_to_bf16_bytes, f32_to_f16_bytes, i64_bytes, write_index, write_safetensors,
    SafetensorsWriter, TensorData, TensorHeader,
};
