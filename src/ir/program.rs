//! The lowered program: what `graphrun lower` prints, what snapshots hold, what executors run.
//!
//! Nodes refer to values, weights and states by name, so that the RON form reads on its own and
//! diffs well. Executors bind names to slots once per program (`exec::cpu::Bound`).

use serde::{Deserialize, Serialize};

use super::op::{Op, ValueType};

/// Which step a program computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum Phase {
    /// `T` prompt tokens appended to whatever the session holds.
    Prefill,
    /// One token.
    Decode,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        })
    }
}

impl std::str::FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "prefill" => Ok(Phase::Prefill),
            "decode" => Ok(Phase::Decode),
            other => Err(format!(
                "unknown phase `{other}` (expected prefill or decode)"
            )),
        }
    }
}

/// Which executor a program is scheduled for: rules may test it, and the variants a node may
/// use are that executor's.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord,
)]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        })
    }
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(format!("unknown device `{other}` (expected cpu or cuda)")),
        }
    }
}

/// Which positions get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum LogitsMode {
    All,
    Last,
}

/// Activation of the GDN output gate (`output_gate_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GateActivation {
    Sigmoid,
    Silu,
}

/// Plan facts that ops need but that are not dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Consts {
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub gate_activation: GateActivation,
    /// Renormalise the routing weights of the chosen experts (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// The token that resets PLE n-gram history (eos_token_id[0]); None without PLE.
    pub ple_eos: Option<i64>,
    pub ple_tables: Vec<PleTable>,
    /// Added to a row's position wherever a rotation is computed (queries, keys, the indexer's
    /// pooled keys), not to the caches' row counts: the MTP draft's row r sits at position r + 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rope_offset: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A value the caller gives a step beside the tokens: `[tokens, width]` f32 (the MTP draft's
/// `hidden`, the trunk's final hyper state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Import {
    pub name: String,
    pub width: usize,
}

/// A value a step gives back beside the logits, all its rows: `name` as the caller knows it,
/// `value` the program's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Export {
    pub name: String,
    pub value: String,
}

/// Hash constants of one PLE layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PleTable {
    pub layer: usize,
    pub multipliers: Vec<i64>,
    pub head_sizes: Vec<i64>,
    pub head_offsets: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValueInfo {
    pub name: String,
    pub ty: ValueType,
    /// Columns per token row (0 for selections).
    pub width: usize,
    /// Rows (set by `memplan`): the program's `tokens`, or 1 downstream of `LastRow`.
    #[serde(default)]
    pub rows: usize,
    /// Size in bytes (set by `memplan`, `passes::memplan::value_bytes`): `rows` times 4·width
    /// (f32), 8·width (i64) or 4·(2 + budget/block) (a selection, `i32 [rows, 2 + K]`).
    #[serde(default)]
    pub bytes: usize,
    /// Byte offset in the step's arena (set by `memplan`), a multiple of
    /// `passes::memplan::ALIGN`. Values whose lifetimes overlap never overlap in the arena.
    #[serde(default)]
    pub offset: usize,
}

/// A run of nodes `[start, end)` of a program that executes without the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub start: usize,
    pub end: usize,
}

/// Element class a weight must have in the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WeightClass {
    /// f32, bf16 or f16; the CPU executor widens to f32.
    Float,
    /// An int64 buffer (PLE tables); cross-checked against the plan, not used by ops.
    I64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightInfo {
    /// Canonical name (the `Qwen4ExpForCausalLM` runtime name).
    pub name: String,
    pub shape: Vec<usize>,
    pub class: WeightClass,
    /// Absent is allowed (the int64 PLE buffers, which HF recomputes from the config).
    pub optional: bool,
}

/// Persistent per-sequence state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StateKind {
    /// The last `rows` inputs of a causal conv, `[rows, width]`, zero at the start.
    Window { rows: usize, width: usize },
    /// A fixed f32 buffer of `len` elements, zero at the start (GDN recurrent state).
    Zeros { len: usize },
    /// Rows appended every step (KV cache, indexer keys, pooled block keys).
    Append { width: usize },
    /// The last `len` token ids, eos at the start (PLE n-gram context).
    Tokens { len: usize },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateInfo {
    pub name: String,
    pub kind: StateKind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub op: Op<usize>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<String>,
    /// The kernel variant chosen by `schedule`, and the rule that chose it.
    pub variant: String,
    pub rule: String,
    /// The kernels the variant launches for this node, in order (`kernels/*.cu` names on CUDA,
    /// the `ops` function on the CPU): what the executor runs and nothing else.
    #[serde(default)]
    pub kernels: Vec<String>,
    /// The fusion that produced this node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused: Option<String>,
    /// Values whose last use is this node (set by `memplan`): an executor may free them after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_use: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub phase: Phase,
    pub tokens: usize,
    pub logits: LogitsMode,
    pub device: Device,
    pub consts: Consts,
    /// The program's input: token ids `[T, 1]` (i64).
    pub input: String,
    /// The program's output: logits `[T or 1, vocab]`.
    pub output: String,
    /// Values given beside the tokens (their value names are the import names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<Import>,
    /// Values given back beside the logits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exports: Vec<Export>,
    /// Bytes of the arena that holds every value at its `offset` (set by `memplan`): one device
    /// buffer per step shape.
    #[serde(default)]
    pub arena_bytes: usize,
    /// Runs of nodes `[start, end)` with no host work between their kernels (set by
    /// `passes::segment`): each is one CUDA graph.
    #[serde(default)]
    pub segments: Vec<Segment>,
    pub values: Vec<ValueInfo>,
    pub weights: Vec<WeightInfo>,
    pub states: Vec<StateInfo>,
    pub nodes: Vec<Node>,
}

impl Program {
    /// Deterministic RON text: one node per line.
    pub fn to_ron(&self) -> String {
        let pretty = ron::ser::PrettyConfig::new()
            .depth_limit(2)
            .struct_names(true)
            .indentor("  ".to_string());
        ron::ser::to_string_pretty(self, pretty).expect("a program always serialises")
    }

    pub fn from_ron(text: &str) -> Result<Program, ron::error::SpannedError> {
        ron::from_str(text)
    }

    /// Whether the caller gives `name` (the tokens or an import): no node produces it.
    pub fn is_given(&self, name: &str) -> bool {
        name == self.input || self.imports.iter().any(|i| i.name == name)
    }

    /// Whether the caller reads `name` after the step (the logits or an export).
    pub fn is_returned(&self, name: &str) -> bool {
        name == self.output || self.exports.iter().any(|e| e.value == name)
    }

    pub fn value(&self, name: &str) -> Option<&ValueInfo> {
        self.values.iter().find(|v| v.name == name)
    }
}
