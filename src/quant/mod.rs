//! Quantised weight formats: how a checkpoint declares them ([`config`]) and what their bytes
//! mean ([`nvfp4`]: ModelOpt's NVFP4, the format of the release's routed experts).

pub mod config;
pub mod nvfp4;

pub use config::{QuantAlgo, QuantConfig, QuantConfigError};
