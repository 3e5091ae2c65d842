//! Weights for the executors: the tensor contract a program implies, resolved against a
//! checkpoint's layout, checked as a whole before any compute, then loaded: as f32 for the CPU
//! reference, NVFP4 expert banks kept packed ([`Nvfp4Bank`]) for a device that computes with them.
//!
//! Canonical names are the `Qwen4ExpForCausalLM` runtime names (`model.layers.3.mlp.gate.weight`,
//! fused experts, one n-gram table). [`resolve`] maps each to what the checkpoint holds:
//! the `model.language_model.` prefix, per-expert tensors, `shard_{k}` pieces of the table.
//!
//! Order of use: [`check_sizes`] (the plan against the checkpoint, before lowering), then
//! [`check_contract`] (every weight of the lowered program), then [`contract::load`].

pub mod causes;
pub mod contract;
pub mod host_table;
pub mod resolve;

use std::collections::HashMap;

pub use causes::FieldMismatch;
pub use contract::{check_contract, check_sizes, ContractError, NonFiniteTensor, Problem};
pub use host_table::{HostTable, TableElement};

/// One weight, widened to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A bank of NVFP4 matrices as the checkpoint stores them (`quant::nvfp4`), for a device that
/// computes with the packed form: logically `shape` (`[experts, out, in]`), its rows one after
/// another, each `in/2` code bytes (element 2i in the low nibble) and `in/16` E4M3 scale bytes;
/// one f32 global scale per `rows_per_global` rows (one per checkpoint tensor: a fused gate/up
/// bank has a gate and an up global per expert).
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Bank {
    pub shape: Vec<usize>,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub globals: Vec<f32>,
    pub rows_per_global: usize,
}

impl Nvfp4Bank {
    /// The input width (the last dimension).
    pub fn inputs(&self) -> usize {
        self.shape.last().copied().unwrap_or(0)
    }

    /// Every weight in f32, `(e2m1 * e4m3) * global` (the spec's meaning, as the CPU computes).
    pub fn dequantize(&self) -> Vec<f32> {
        let inputs = self.inputs();
        let rows = self.codes.len() / (inputs / 2).max(1);
        let mut out = Vec::with_capacity(rows * inputs);
        for (g, &global) in self.globals.iter().enumerate() {
            let r0 = g * self.rows_per_global;
            let packed = crate::quant::nvfp4::Packed {
                out: self.rows_per_global,
                inputs,
                codes: &self.codes[r0 * inputs / 2..(r0 + self.rows_per_global) * inputs / 2],
                scales: &self.scales[r0 * inputs / crate::quant::nvfp4::GROUP
                    ..(r0 + self.rows_per_global) * inputs / crate::quant::nvfp4::GROUP],
                global,
            };
            out.extend(packed.dequantize());
        }
        out
    }

    /// Packs `values` (`shape`, f32) as NVFP4, one global per `rows_per_global` rows chosen from
    /// those rows' largest magnitude (not a power of two, as the release's are), and, where
    /// `nan_every` > 0, every `nan_every`-th scale group of each part set to an E4M3 NaN code
    /// (0x7F or 0xFF, which read as +0): synthetic banks for tests and checkpoints.
    pub fn quantize(
        shape: &[usize],
        values: &[f32],
        rows_per_global: usize,
        nan_every: usize,
    ) -> Nvfp4Bank {
        use crate::quant::nvfp4::{quantize, GROUP};
        let inputs = shape.last().copied().unwrap_or(0);
        let part = rows_per_global * inputs;
        let mut bank = Nvfp4Bank {
            shape: shape.to_vec(),
            codes: Vec::with_capacity(values.len() / 2),
            scales: Vec::with_capacity(values.len() / GROUP),
            globals: Vec::new(),
            rows_per_global,
        };
        for (p, m) in values.chunks(part.max(1)).enumerate() {
            let amax = m.iter().fold(0f32, |a, v| a.max(v.abs()));
            let global = (amax / (6.0 * 448.0)).max(f32::MIN_POSITIVE) * 1.37;
            let (codes, mut scales) = quantize(m, rows_per_global, inputs, global);
            if nan_every > 0 {
                for (g, byte) in scales.iter_mut().enumerate() {
                    if (g + p) % nan_every == nan_every - 1 {
                        *byte = if g % 2 == 0 { 0x7F } else { 0xFF };
                    }
                }
            }
            bank.codes.extend(codes);
            bank.scales.extend(scales);
            bank.globals.push(global);
        }
        bank
    }

    /// Bytes the bank holds (codes, scales and globals).
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len() + 4 * self.globals.len()
    }
}

/// All weights of a model by canonical name: f32 tensors, and NVFP4 banks kept packed.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    map: HashMap<String, WeightTensor>,
    nvfp4: HashMap<String, Nvfp4Bank>,
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
    /// The packed NVFP4 bank of `name`, where the weights were loaded packed.
    pub fn nvfp4(&self, name: &str) -> Option<&Nvfp4Bank> {
        self.nvfp4.get(name)
    }
    pub fn insert_nvfp4(&mut self, name: impl Into<String>, bank: Nvfp4Bank) {
        self.nvfp4.insert(name.into(), bank);
    }
    /// The names of the packed banks.
    pub fn nvfp4_names(&self) -> impl Iterator<Item = &str> {
        self.nvfp4.keys().map(|k| k.as_str())
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
