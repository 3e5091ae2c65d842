//! graphrun's intermediate representation.
//!
//! A model is described by block templates (`graphs/qwen4exp/*.ron`): small dataflow graphs over
//! named values whose ops come from the closed catalogue in [`op`], with dimensions written as plan
//! symbols ([`dims`]). Lowering (`crate::lower`) instantiates them for a plan and a phase into a
//! [`program::Program`]: a flat, topologically ordered list of nodes over named values, weights
//! (canonical checkpoint names) and persistent states, annotated by the passes with the fusion that
//! produced a node, the kernel variant chosen for it and the last use of each value.
//!
//! Invariants of a program (checked by `lower::validate`): every input of a node is the program
//! input or an output of an earlier node; every value is produced exactly once; every weight and
//! state a node names is declared; widths agree with each op's shape rule.

pub mod dims;
pub mod op;
pub mod program;

pub use op::{Op, Sym, ValueType};
pub use program::{
    Consts, Device, Export, GateActivation, Import, LogitsMode, Node, Phase, PleTable, Program,
    Segment, StateInfo, StateKind, ValueInfo, WeightClass, WeightInfo,
};
