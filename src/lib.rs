//! graphrun: a data-driven kernel-graph compiler and runtime for Qwen4Exp (HF `qwen4_exp`).
//!
//! ```text
//! config.json ─► plan ─► lower (graphs/*.ron: instantiate, fuse, schedule, memplan, validate) ─► Program
//! safetensors ─► checkpoint ─► weights (contract check, f32) ─┐                                   │
//!                                                             ▼                                   ▼
//!                                         runtime: Model, Session (state), generate ◄── exec::cpu
//! ```
//! Modules, in data-flow order: [`plan`], [`ir`], [`lower`] and [`passes`], [`checkpoint`],
//! [`quant`], [`weights`], [`ops`], [`exec`], [`runtime`]; [`synth`] writes random checkpoints.

pub mod bench;
pub mod checkpoint;
pub mod error;
pub mod exec;
pub mod ir;
pub mod lower;
pub mod ops;
pub mod passes;
pub mod plan;
pub mod progress;
pub mod quant;
pub mod registry;
pub mod rules;
pub mod runtime;
pub mod stderr;
pub mod synth;
pub mod weights;

pub use error::Error;
pub use runtime::{GenerateOptions, Model, Sampling, Session};
