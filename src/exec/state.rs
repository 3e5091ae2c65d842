//! Per-sequence persistent state, keyed by the program's state names (`blk.3.qsa.k_cache`).
//! Prefill and decode programs declare the same states, so one `SessionState` serves both.

use std::collections::BTreeMap;

use crate::ir::{StateInfo, StateKind};

#[derive(Debug, Clone, PartialEq)]
pub enum StateBuf {
    /// Fixed-size f32 buffer (conv windows, recurrent states).
    Fixed(Vec<f32>),
    /// Growing rows of `width` (KV caches, indexer keys, pooled block keys).
    Rows { width: usize, data: Vec<f32> },
    /// Token ids (PLE n-gram context).
    Tokens(Vec<i64>),
}

impl StateBuf {
    pub fn new(kind: &StateKind, eos: i64) -> StateBuf {
        match kind {
            StateKind::Window { rows, width } => StateBuf::Fixed(vec![0.0; rows * width]),
            StateKind::Zeros { len } => StateBuf::Fixed(vec![0.0; *len]),
            StateKind::Append { width } => StateBuf::Rows {
                width: *width,
                data: Vec::new(),
            },
            StateKind::Tokens { len } => StateBuf::Tokens(vec![eos; *len]),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            StateBuf::Fixed(v) | StateBuf::Rows { data: v, .. } => v.len() * 4,
            StateBuf::Tokens(v) => v.len() * 8,
        }
    }
}

/// Everything one sequence carries between steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionState {
    pub bufs: BTreeMap<String, StateBuf>,
    /// Tokens already processed (the next token's position).
    pub position: usize,
}

impl SessionState {
    /// Creates any state of `states` that does not exist yet.
    pub fn ensure(&mut self, states: &[StateInfo], eos: i64) {
        for s in states {
            self.bufs
                .entry(s.name.clone())
                .or_insert_with(|| StateBuf::new(&s.kind, eos));
        }
    }

    pub fn bytes(&self) -> usize {
        self.bufs.values().map(|b| b.bytes()).sum()
    }
}
