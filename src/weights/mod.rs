//! Weights for the executors: the tensor contract a program implies, resolved against a
//! checkpoint's layout, checked as a whole before any compute, then loaded as f32.
//!
//! Canonical names are the `Qwen4ExpForCausalLM` runtime names (`model.layers.3.mlp.gate.weight`,
//! fused experts, one n-gram table). [`resolve`] maps each to what the checkpoint holds:
//! the `model.language_model.` prefix, per-expert tensors, `shard_{k}` pieces of the table.
//!
//! Order of use: [`check_sizes`] (the plan against the checkpoint, before lowering), then
//! [`check_contract`] (every weight of the lowered program), then [`contract::load`].

pub mod causes;
pub mod contract;
pub mod resolve;

use std::collections::HashMap;

pub use causes::FieldMismatch;
pub use contract::{check_contract, check_sizes, ContractError, NonFiniteTensor, Problem};

/// One weight, widened to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// All weights of a model by canonical name.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    map: HashMap<String, WeightTensor>,
}

impl Weights {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn get(&self, name: &str) -> Option<&WeightTensor> {
        self.map.get(name)
    }
    pub fn insert(&mut self, name: impl Into<String>, t: WeightTensor) {
        self.map.insert(name.into(), t);
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.map.keys().map(|k| k.as_str())
    }
}

/// A checkpoint holding `names` (one f32 each), written to a fresh temp dir (unit tests).
#[cfg(test)]
pub(crate) fn test_checkpoint<S: AsRef<str>>(
    tag: &str,
    names: &[S],
) -> crate::checkpoint::Checkpoint {
    use crate::checkpoint::{f32_bytes, write_safetensors, Checkpoint, DType, TensorData};
    let dir = std::env::temp_dir().join(format!("graphrun-weights-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let tensors: Vec<TensorData> = names
        .iter()
        .map(|n| TensorData {
            name: n.as_ref().to_string(),
            dtype: DType::F32,
            shape: vec![1],
            bytes: std::borrow::Cow::Owned(f32_bytes(&[0.0])),
        })
        .collect();
    write_safetensors(&path, &tensors, None).unwrap();
    let ckpt = Checkpoint::open_files(&[path]).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    ckpt
}
