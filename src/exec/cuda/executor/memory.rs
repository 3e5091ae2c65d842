//! What a sequence and a step take on the device, as this executor allocates them
//! (`DeviceState::ensure`, `StepIo::new`, the kernels' scratch): the memory plan's figures
//! (`runtime::memory`), known before anything is allocated.

use super::*;

/// Bytes a sequence's states take with `Append` states of `capacity` rows (KV caches, indexer
/// keys, GDN and conv states, token histories).
pub fn session_bytes(program: &Program, capacity: usize) -> usize {
    program
        .states
        .iter()
        .map(|s| match s.kind {
            StateKind::Window { rows, width } => 4 * rows * width,
            StateKind::Zeros { len } => 4 * len,
            StateKind::Append { width } => 4 * capacity * width,
            StateKind::Tokens { len } => 8 * len,
        })
        .sum()
}

/// Bytes one step shape of `program` holds (its arena, tokens and logits, the host steps'
/// buffers), plus the largest scratch the indexer's selection takes over a context of
/// `capacity` (the one scratch that grows with the context: 4 bytes a row and pooled block).
pub fn step_bytes(program: &Program, capacity: usize) -> usize {
    let rows = program.tokens;
    let vocab = program.value(&program.output).map_or(0, |v| v.width);
    let logits_rows = if program.logits == LogitsMode::Last {
        1
    } else {
        rows
    };
    let host_rows: usize = program
        .nodes
        .iter()
        .filter(|n| crate::registry::cuda::runs_on_host(&n.kernels))
        .filter_map(|n| program.value(&n.outputs[0]))
        .map(|v| 4 * v.rows * v.width)
        .sum();
    let indexer = program
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            crate::ir::Op::IndexerSelect { block, .. }
            | crate::ir::Op::IndexerSelectQk { block, .. } => {
                let blocks = capacity.div_ceil(block.max(1));
                Some(4 * launch::attention::indexer_work_len(rows, blocks))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0);
    program.arena_bytes + 8 * rows + 4 * logits_rows * vocab + host_rows + indexer
}
