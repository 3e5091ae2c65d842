//! What rules and kernels see of a node and of the device it runs on.
//!
//! A node's facts are its op's own parameters (by their RON names: `streams`, `head_dim`,
//! `top_k`...), the shapes its weights and inputs give (`n`, `k`, `experts`, `width`...), how
//! its matrix rows split into 16-byte loads (`row_chunks`, `row_tail`), its token count and the
//! storage format of its matrices. All are known at lowering, so the choice is made once and
//! shown in the program.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ir::{Device, Node, Op, Program};

/// How a node's matrices are stored on the executor (the CPU widens everything to f32; the
/// CUDA executor keeps bf16 checkpoints in bf16, widens f32 and f16 ones to f32, and keeps
/// NVFP4 expert banks packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum WeightFormat {
    F32,
    Bf16,
    /// ModelOpt NVFP4 (`quant::nvfp4`): E2M1 codes with an E4M3 scale per 16 and an f32 scale
    /// per tensor. Routed experts only.
    Nvfp4,
}

impl WeightFormat {
    /// The suffix kernels carry for it (`linear_rows1_bf16`).
    pub fn suffix(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Nvfp4 => "nvfp4",
        }
    }

    /// Weights in one 16-byte load (of NVFP4: of codes).
    pub fn chunk_len(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::Bf16 => 8,
            WeightFormat::Nvfp4 => 32,
        }
    }

    /// The format a checkpoint dtype (`"f32"`, `"bf16"`, `"f16"`) is stored in on `device`.
    pub fn on(device: Device, checkpoint_dtype: &str) -> WeightFormat {
        match (device, checkpoint_dtype) {
            (Device::Cuda, "bf16") => WeightFormat::Bf16,
            _ => WeightFormat::F32,
        }
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(WeightFormat::F32),
            "bf16" => Ok(WeightFormat::Bf16),
            "nvfp4" => Ok(WeightFormat::Nvfp4),
            other => Err(format!(
                "unknown weight format `{other}` (expected f32, bf16 or nvfp4)"
            )),
        }
    }
}

/// How an executor stores a program's matrices: the routed experts' banks may be stored
/// otherwise than the rest (NVFP4 experts beside a bf16 trunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageFormats {
    pub matrices: WeightFormat,
    pub experts: WeightFormat,
    /// Where the PLE n-gram table is kept (the fact `host_table` of the nodes that read it).
    pub ple_table: Placement,
}

/// Where an executor keeps a table a step reads only a few rows of (the PLE n-gram table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Placement {
    /// In the executor's memory (a CPU's tables are always there).
    #[default]
    Device,
    /// In host memory (the checkpoint's mapping), the rows a step needs gathered there.
    Host,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "device" => Ok(Placement::Device),
            "host" => Ok(Placement::Host),
            other => Err(format!(
                "unknown placement `{other}` (expected device or host)"
            )),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Device => "device",
            Placement::Host => "host",
        })
    }
}

impl StorageFormats {
    /// The format of the matrices of a node of `op`.
    pub fn of<D>(&self, op: &Op<D>) -> WeightFormat {
        match op {
            Op::MoeExperts { .. } => self.experts,
            _ => self.matrices,
        }
    }
}

impl From<WeightFormat> for StorageFormats {
    /// Every matrix in one format.
    fn from(f: WeightFormat) -> StorageFormats {
        StorageFormats {
            matrices: f,
            experts: f,
            ple_table: Placement::Device,
        }
    }
}

/// The properties of the device that kernel choices depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFacts {
    pub device: Device,
    /// Compute capability as major*10 + minor (90 for sm_90); 0 for the CPU.
    pub arch: u32,
    /// Streaming multiprocessors (CUDA); 0 for the CPU.
    pub sms: usize,
    /// Arrival counters the executor gives kernels that meet across blocks.
    pub arrival_counters: usize,
}

/// Arrival counters the CUDA executor allocates a device (`Gpu::counters`).
pub const ARRIVAL_COUNTERS: usize = 256;

impl DeviceFacts {
    pub fn cpu() -> DeviceFacts {
        DeviceFacts {
            device: Device::Cpu,
            arch: 0,
            sms: 0,
            arrival_counters: 0,
        }
    }

    /// An NVIDIA H200 (sm_90, 132 multiprocessors): what `graphrun lower --device cuda`
    /// schedules for when no device is at hand, and what the snapshots hold.
    pub fn h200() -> DeviceFacts {
        DeviceFacts::cuda(90, 132)
    }

    pub fn cuda(arch: u32, sms: usize) -> DeviceFacts {
        DeviceFacts {
            device: Device::Cuda,
            arch,
            sms,
            arrival_counters: ARRIVAL_COUNTERS,
        }
    }

    /// The default facts of an executor.
    pub fn default_for(device: Device) -> DeviceFacts {
        match device {
            Device::Cpu => DeviceFacts::cpu(),
            Device::Cuda => DeviceFacts::h200(),
        }
    }
}

/// What a rule's predicate and a kernel's acceptance test see of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFacts {
    pub op: &'static str,
    /// The node's rows: what its kernels are launched over (the step's tokens, or 1 downstream
    /// of `LastRow`); also the fact `rows`.
    pub tokens: usize,
    /// The step's tokens (the program's): what a rule's `tokens` range tests.
    pub step: usize,
    /// Named dimensions (see the module doc); booleans of the op are 0 or 1.
    pub dims: BTreeMap<String, usize>,
    /// The storage format of the node's matrices; `None` for nodes without one.
    pub weight: Option<WeightFormat>,
}

impl NodeFacts {
    /// The dimension `name`; 0 when the node has none (kernels test the dims their op has).
    pub fn dim(&self, name: &str) -> usize {
        self.dims.get(name).copied().unwrap_or(0)
    }

    /// The matrices' format (f32 for nodes without one).
    pub fn format(&self) -> WeightFormat {
        self.weight.unwrap_or(WeightFormat::F32)
    }

    /// `<base>_<format>`: the kernel of a family that is compiled once per weight format.
    pub fn kernel(&self, base: &str) -> String {
        format!("{base}_{}", self.format().suffix())
    }

    /// The facts of `node` (of `program`, whose rows per node are `rows`), its matrices stored
    /// as `formats` says for its op.
    pub fn of(
        program: &Program,
        node: &Node,
        rows: usize,
        formats: impl Into<StorageFormats>,
    ) -> NodeFacts {
        let formats = formats.into();
        let format = formats.of(&node.op);
        let mut dims = op_params(&node.op);
        let weight_shape = |i: usize| {
            node.weights
                .get(i)
                .and_then(|w| program.weights.iter().find(|x| &x.name == w))
                .map(|w| w.shape.clone())
                .unwrap_or_default()
        };
        let width =
            |name: Option<&String>| name.and_then(|n| program.value(n)).map_or(0, |v| v.width);
        dims.insert("rows".into(), rows);
        dims.insert("width".into(), width(node.inputs.first()));
        dims.insert("out_width".into(), width(node.outputs.first()));
        let has_matrix = (0..node.weights.len()).any(|i| node.op.weight_is_matrix(i));
        let matrix = |n: usize, k: usize, dims: &mut BTreeMap<String, usize>| {
            dims.insert("n".into(), n);
            dims.insert("k".into(), k);
            let chunk = format.chunk_len();
            dims.insert("row_chunks".into(), k.div_ceil(chunk));
            dims.insert("row_tail".into(), k % chunk);
        };
        match &node.op {
            Op::Linear | Op::StreamLinear { .. } | Op::SwigluLinear | Op::LinearHcWrite { .. } => {
                let s = weight_shape(0);
                if let [n, k] = s[..] {
                    matrix(n, k, &mut dims);
                }
            }
            Op::LinearGroup { .. } => {
                let shapes: Vec<Vec<usize>> = (0..node.weights.len()).map(weight_shape).collect();
                let k = shapes.first().and_then(|s| s.get(1)).copied().unwrap_or(0);
                let ns: Vec<usize> = shapes
                    .iter()
                    .map(|s| s.first().copied().unwrap_or(0))
                    .collect();
                matrix(ns.iter().sum(), k, &mut dims);
                dims.insert("n_max".into(), ns.iter().copied().max().unwrap_or(0));
                // Every part's rows must split alike: the longest row decides.
                let whole = shapes.iter().all(|s| s.get(1) == Some(&k));
                if !whole {
                    dims.insert("row_tail".into(), usize::MAX);
                }
            }
            Op::MoeSharedWrite { .. } => {
                let s = weight_shape(0);
                if let [n, k] = s[..] {
                    matrix(n, k, &mut dims);
                    dims.insert("hidden".into(), n);
                }
            }
            Op::MoeExperts { .. } => {
                let gu = weight_shape(0);
                dims.insert("experts".into(), gu.first().copied().unwrap_or(0));
                dims.insert("hidden".into(), width(node.inputs.first()));
                dims.insert("top_k".into(), width(node.inputs.get(1)));
            }
            Op::MoeRouter { .. } => {
                dims.insert("experts".into(), width(node.inputs.first()));
            }
            Op::HcRead { .. } | Op::HcMix { .. } => {
                let down = weight_shape(if matches!(node.op, Op::HcRead { .. }) {
                    1
                } else {
                    0
                });
                dims.insert("rank".into(), down.first().copied().unwrap_or(0));
            }
            Op::Attention {
                heads, kv_heads, ..
            }
            | Op::GatedAttention {
                heads, kv_heads, ..
            } => {
                dims.insert("group".into(), heads.checked_div(*kv_heads).unwrap_or(0));
            }
            _ => {}
        }
        if reads_ple_table(program, node) {
            let on_host = formats.ple_table == Placement::Host;
            dims.insert("host_table".into(), on_host as usize);
        }
        NodeFacts {
            op: node.op.kind(),
            tokens: rows,
            step: program.tokens,
            dims,
            weight: has_matrix.then_some(format),
        }
    }
}

/// Whether `node` gathers rows of a PLE n-gram table: the fused `PleEmbed`, or an `Embed` of
/// the ids a `PleNgramIds` node hashed.
pub fn reads_ple_table(program: &Program, node: &Node) -> bool {
    match node.op {
        Op::PleEmbed { .. } => true,
        Op::Embed => node.inputs.first().is_some_and(|ids| {
            program
                .nodes
                .iter()
                .any(|n| matches!(n.op, Op::PleNgramIds { .. }) && n.outputs.contains(ids))
        }),
        _ => false,
    }
}

/// The op's own parameters by their RON names: numbers as they are, booleans as 0 or 1.
fn op_params(op: &Op<usize>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    // An op serialises as `{"Kind": {"field": value, ...}}` (or a bare string with no fields).
    if let Ok(serde_json::Value::Object(outer)) = serde_json::to_value(op) {
        for (_, fields) in outer {
            if let serde_json::Value::Object(fields) = fields {
                for (name, v) in fields {
                    let n = match v {
                        serde_json::Value::Number(n) => n.as_u64().map(|n| n as usize),
                        serde_json::Value::Bool(b) => Some(b as usize),
                        _ => None,
                    };
                    if let Some(n) = n {
                        out.insert(name, n);
                    }
                }
            }
        }
    }
    out
}

/// The rows of every node's step, in program order: a node has the rows of its first input
/// (the program's input has `tokens`), `LastRow` one.
pub fn node_rows(program: &Program) -> Vec<usize> {
    let mut rows: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    rows.insert(program.input.as_str(), program.tokens);
    let mut out = Vec::with_capacity(program.nodes.len());
    for node in &program.nodes {
        let r = match node.op {
            Op::LastRow => 1,
            _ => node
                .inputs
                .first()
                .and_then(|x| rows.get(x.as_str()).copied())
                .unwrap_or(program.tokens),
        };
        for o in &node.outputs {
            rows.entry(o.as_str()).or_insert(r);
        }
        out.push(r);
    }
    out
}
