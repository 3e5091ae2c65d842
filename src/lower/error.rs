use thiserror::Error;

/// What can go wrong between the graph files and a lowered program. Every message names the
/// file (and line/column for syntax errors), the block, node, fusion or rule at fault.
#[derive(Debug, Error)]
pub enum LowerError {
    #[error("{file}:{line}:{col}: {msg}")]
    Ron {
        file: String,
        line: usize,
        col: usize,
        msg: String,
    },
    #[error("{file}: {msg}")]
    Io { file: String, msg: String },
    #[error("{file}: {msg}")]
    Graph { file: String, msg: String },
    #[error("fusion `{fusion}`: {msg}")]
    Fusion { fusion: String, msg: String },
    #[error("rule `{rule}`: {msg}")]
    Rule { rule: String, msg: String },
    #[error("--rule {arg}: {msg}")]
    Override { arg: String, msg: String },
    /// A lowering option that cannot be (zero tokens, more than the model's positions, a
    /// multi-token decode).
    #[error("{0}")]
    Options(String),
    /// The chosen variant's kernels do not take the node.
    #[error(
        "node `{node}`: rule `{rule}` chose {variant} ({kernels}), which does not accept it: {why}"
    )]
    Refused {
        node: String,
        rule: String,
        variant: String,
        kernels: String,
        why: String,
    },
    #[error(transparent)]
    Size(#[from] crate::passes::memplan::SizeError),
    #[error("lowered program is invalid at node `{node}`: {msg}")]
    Invalid { node: String, msg: String },
}

impl LowerError {
    pub(crate) fn graph(file: &str, msg: impl Into<String>) -> Self {
        LowerError::Graph {
            file: file.to_string(),
            msg: msg.into(),
        }
    }
}

impl From<crate::rules::RuleError> for LowerError {
    fn from(e: crate::rules::RuleError) -> Self {
        match e {
            crate::rules::RuleError::Rule { rule, msg } => LowerError::Rule { rule, msg },
            crate::rules::RuleError::Override { arg, msg } => LowerError::Override { arg, msg },
        }
    }
}
