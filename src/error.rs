//! The library's error: one variant per stage, each message naming the file, tensor, field or
//! token at fault.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error(transparent)]
    Contract(#[from] crate::weights::ContractError),
    #[error(transparent)]
    Quant(#[from] crate::quant::QuantConfigError),
    #[error(transparent)]
    Lower(#[from] crate::lower::LowerError),
    #[error(transparent)]
    Exec(#[from] crate::exec::cpu::ExecError),
    #[error(transparent)]
    Cuda(#[from] crate::exec::cuda::CudaError),
    #[error(transparent)]
    Logits(#[from] crate::runtime::LogitsError),
    /// A request the model cannot take (bad token id, empty prompt, bad sampling setting).
    #[error("{0}")]
    Input(String),
    #[error("{path}: {msg}")]
    Io { path: String, msg: String },
    #[error("tokenizer {path}: {msg}")]
    Tokenizer { path: String, msg: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::rules::RuleError> for Error {
    fn from(e: crate::rules::RuleError) -> Self {
        Error::Lower(e.into())
    }
}
