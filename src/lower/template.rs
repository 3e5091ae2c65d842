//! The data that drives lowering, as it is written in `graphs/`: block templates, the model
//! composition, fusions and scheduling rules. Everything here deserialises straight from RON and
//! is checked when loaded (`graphset`).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::ir::{Op, Sym};
pub use crate::rules::{Predicate, Rule};

/// One block (`graphs/qwen4exp/<name>.ron`): a small dataflow graph over named values.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Block {
    #[serde(default)]
    pub doc: String,
    /// Values the block reads from its caller (bound by the model composition).
    pub inputs: Vec<String>,
    /// Values the block gives back to its caller.
    pub outputs: Vec<String>,
    #[serde(default)]
    pub weights: Vec<WeightDecl>,
    #[serde(default)]
    pub states: Vec<StateDecl>,
    pub nodes: Vec<NodeDecl>,
}

/// A tensor the block binds, named relative to the instance prefix (`model.layers.{i}.mlp.`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightDecl {
    pub name: String,
    pub tensor: String,
    pub shape: Vec<Sym>,
    #[serde(default)]
    pub int64: bool,
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub enum StateDecl {
    Window { name: String, rows: Sym, width: Sym },
    Zeros { name: String, len: Sym },
    Append { name: String, width: Sym },
    Tokens { name: String, len: Sym },
}

impl StateDecl {
    pub fn name(&self) -> &str {
        match self {
            StateDecl::Window { name, .. }
            | StateDecl::Zeros { name, .. }
            | StateDecl::Append { name, .. }
            | StateDecl::Tokens { name, .. } => name,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDecl {
    pub out: Vec<String>,
    pub op: Op<Sym>,
    pub args: Vec<String>,
    #[serde(default)]
    pub weights: Vec<String>,
    #[serde(default)]
    pub states: Vec<String>,
}

/// `graphs/qwen4exp/model.ron`: how blocks compose into the model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDecl {
    #[serde(default)]
    pub doc: String,
    /// Model values the caller gives beside the tokens (`[T, width]` f32 each).
    #[serde(default)]
    pub imports: Vec<ImportDecl>,
    pub prologue: Vec<Instance>,
    /// Instantiated once per decoder layer, `{i}` in prefixes replaced by the layer index.
    pub layer: Vec<Instance>,
    pub epilogue: Vec<Instance>,
    /// Export name → the model value it returns (as defined at the end), all rows.
    #[serde(default)]
    pub exports: BTreeMap<String, String>,
    /// Added to each row's position where rotations are computed (`Consts::rope_offset`).
    #[serde(default)]
    pub rope_offset: usize,
}

/// A value the caller gives: its name and its width.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportDecl {
    pub name: String,
    pub width: Sym,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub block: String,
    /// Instance name, part of node and value names (`blk.3.attn_hc.x`).
    pub name: String,
    #[serde(default)]
    pub when: When,
    /// Prefix of the block's tensor names.
    #[serde(default)]
    pub prefix: String,
    /// Block input → model value.
    pub bind: BTreeMap<String, String>,
    /// Block output → model value it now defines.
    pub results: BTreeMap<String, String>,
}

/// When an instance applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum When {
    #[default]
    Always,
    /// A Gated DeltaNet (`linear_attention`) layer.
    Gdn,
    /// A QSA layer.
    Qsa,
    /// A layer with a PLE module.
    Ple,
    /// Only the last position's logits are wanted.
    LogitsLast,
    TiedEmbeddings,
    UntiedEmbeddings,
}

/// `graphs/fusions.ron`: a pattern of nodes replaced by one fused node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fusion {
    pub name: String,
    #[serde(default)]
    pub doc: String,
    /// Pattern nodes; the last one is the pattern's output. Arguments starting with `$` are
    /// pattern variables bound to values outside the pattern; others name earlier pattern nodes.
    pub pattern: Vec<PatternNode>,
    /// Pattern nodes whose values the fused node produces, in its output order (their values
    /// may be used outside the match). Default: the last pattern node alone.
    #[serde(default)]
    pub outputs: Vec<String>,
    pub replace: Replacement,
    /// Programs the fusion applies to: any of these predicates (as in rules.ron); empty = all.
    /// (A fused kernel can lose to the unfused chain for some shapes, e.g. a matrix-vector
    /// fusion against tensor-core GEMMs in a long prefill.)
    #[serde(default)]
    pub when: Vec<Predicate>,
}

/// A horizontal fusion (`graphs/groups.ron`): sibling nodes of one op kind that read the same
/// input become one node computing all their outputs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grouping {
    pub name: String,
    #[serde(default)]
    pub doc: String,
    /// The siblings' op kind (`linear`).
    pub op: String,
    /// The op computing a group (`LinearGroup`; its `parts` is the group's size).
    pub into: String,
    /// Largest group; more siblings make several groups, in program order.
    pub max_parts: usize,
    /// Programs the grouping applies to (as a fusion's `when`); empty = all.
    #[serde(default)]
    pub when: Vec<Predicate>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatternNode {
    pub id: String,
    /// Op kind (`linear`, `silu`, ...).
    pub op: String,
    pub args: Vec<String>,
    #[serde(default)]
    pub weights: Vec<String>,
    /// If given, the matched op must equal this one (after resolving its dims).
    #[serde(default)]
    pub exact: Option<Op<Sym>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replacement {
    pub op: Op<Sym>,
    pub args: Vec<String>,
    #[serde(default)]
    pub weights: Vec<String>,
}
