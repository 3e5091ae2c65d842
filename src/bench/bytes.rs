//! The bytes a decode step reads, counted from its program: what every bandwidth figure of the
//! bench divides.

use serde::Serialize;

use crate::ir::{Node, Op, Program, StateKind};

#[derive(Debug, Serialize)]
pub struct ByteCount {
    pub dense_weights: u64,
    pub expert_weights: u64,
    pub embedding_rows: u64,
    pub recurrent_state: u64,
    pub kv_and_indexer: u64,
}

/// Bytes a decode step reads at `context`, counted from the program: weights (matrices at their
/// device width, experts only the chosen k of E, embeddings only the gathered rows), recurrent
/// and conv state (read and written), KV and indexer keys actually visited.
pub fn decode_bytes(program: &Program, context: usize) -> ByteCount {
    step_bytes(program, context, 1)
}

/// Bytes a step of `rows` tokens must read at `context` when it reads each weight once: the
/// dense weights once, the union of the rows' experts (its expected size under uniform routing,
/// E·(1 - (1 - k/E)^rows), of E experts and k a row), each row's gathered embedding rows, the
/// state and the K/V visited as at one row.
pub fn step_bytes(program: &Program, context: usize, rows: usize) -> ByteCount {
    let mut c = ByteCount {
        dense_weights: 0,
        expert_weights: 0,
        embedding_rows: 0,
        recurrent_state: 0,
        kv_and_indexer: 0,
    };
    for node in &program.nodes {
        let n = node_bytes_rows(program, node, context, rows);
        c.dense_weights += n.dense_weights;
        c.expert_weights += n.expert_weights;
        c.embedding_rows += n.embedding_rows;
        c.recurrent_state += n.recurrent_state;
        c.kv_and_indexer += n.kv_and_indexer;
    }
    c
}

/// The K/V positions an attention node visits at `context`: the blocks its selection keeps
/// (`budget / block` of `block` positions, from the selecting node's op) and the incomplete last
/// block's up to `block - 1` positions, or every position when nothing selects them.
fn attended_positions(program: &Program, node: &Node, context: usize) -> usize {
    let selecting = node.inputs.get(3).and_then(|sel| {
        program
            .nodes
            .iter()
            .find(|n| n.outputs.contains(sel))
            .map(|n| &n.op)
    });
    match selecting {
        Some(
            Op::IndexerSelect { budget, block, .. } | Op::IndexerSelectQk { budget, block, .. },
        ) if *block > 0 => context.min(budget / block * block + block - 1),
        _ => context,
    }
}

/// The bytes one node of a decode step reads (see [`decode_bytes`]).
pub fn node_bytes(program: &Program, node: &Node, context: usize) -> ByteCount {
    node_bytes_rows(program, node, context, 1)
}

/// The bytes one node of a step of `rows` tokens must read (see [`step_bytes`]).
fn node_bytes_rows(program: &Program, node: &Node, context: usize, rows: usize) -> ByteCount {
    let mut c = ByteCount {
        dense_weights: 0,
        expert_weights: 0,
        embedding_rows: 0,
        recurrent_state: 0,
        kv_and_indexer: 0,
    };
    let size = |name: &str| -> u64 {
        program
            .weights
            .iter()
            .find(|w| w.name == name)
            .map(|w| w.shape.iter().product::<usize>() as u64)
            .unwrap_or(0)
    };
    match &node.op {
        Op::MoeExperts { experts, .. } => {
            let k = program.value(&node.inputs[1]).map(|v| v.width).unwrap_or(0) as u64;
            // The NVFP4 variants read packed banks: half a byte a weight and a scale byte per 16
            // (the globals, one per expert and tensor, are noise); the others read bf16.
            let sixteenths = if node.variant.starts_with("nvfp4_") {
                9
            } else {
                32
            };
            let e = *experts as f64;
            let chosen = e * (1.0 - (1.0 - k as f64 / e).powi(rows as i32));
            for w in &node.weights {
                let per_expert = size(w) * sixteenths / 16 / *experts as u64;
                c.expert_weights += (per_expert as f64 * chosen).round() as u64;
            }
        }
        // The gathered rows, not the table (a copy per stream is written, not read).
        Op::Embed | Op::EmbedStreams { .. } | Op::PleEmbed { .. } => {
            let ids = match &node.op {
                Op::PleEmbed {
                    ngram,
                    heads_per_ngram,
                    ..
                } => ngram.saturating_sub(1) * heads_per_ngram,
                _ => program.value(&node.inputs[0]).map_or(1, |v| v.width),
            } as u64;
            let d = program
                .weights
                .iter()
                .find(|w| w.name == node.weights[0])
                .map(|w| w.shape[1])
                .unwrap_or(0) as u64;
            c.embedding_rows += ids * d * 2 * rows as u64;
        }
        // Matrices, read at their device width (bf16), as the executor stores them.
        op if (0..node.weights.len()).any(|i| op.weight_is_matrix(i)) => {
            for (_, w) in node
                .weights
                .iter()
                .enumerate()
                .filter(|&(i, _)| op.weight_is_matrix(i))
            {
                c.dense_weights += size(w) * 2;
            }
        }
        Op::Attention {
            kv_heads, head_dim, ..
        }
        | Op::GatedAttention {
            kv_heads, head_dim, ..
        } => {
            let visited = attended_positions(program, node, context) as u64;
            c.kv_and_indexer += visited * (*kv_heads * *head_dim) as u64 * 4 * 2;
        }
        Op::IndexerSelect {
            head_dim, block, ..
        }
        | Op::IndexerSelectQk {
            head_dim, block, ..
        } => {
            c.kv_and_indexer += (context / block) as u64 * *head_dim as u64 * 4;
        }
        _ => {
            for w in &node.weights {
                c.dense_weights += size(w) * 4;
            }
        }
    }
    // Conv windows and GDN recurrent states are read and written once per step.
    for name in &node.states {
        let Some(s) = program.states.iter().find(|s| &s.name == name) else {
            continue;
        };
        let elems = match &s.kind {
            StateKind::Window { rows, width } => rows * width,
            StateKind::Zeros { len } => *len,
            StateKind::Append { .. } | StateKind::Tokens { .. } => 0,
        };
        c.recurrent_state += elems as u64 * 4 * 2;
    }
    c
}

pub(super) fn total(c: &ByteCount) -> u64 {
    c.dense_weights + c.expert_weights + c.embedding_rows + c.recurrent_state + c.kv_and_indexer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::bench_plan;
    use crate::ir::{LogitsMode, Phase};

    /// Attention reads the visited K and V rows (f32) whether fused with its gate or not, and
    /// the indexer its compressed keys: at 8k, the first 8 layers' two QSA layers.
    #[test]
    fn decode_bytes_count_the_kv_cache_of_every_attention() {
        let text = include_str!("../../tests/data/configs/qwen3.8-flash-next.json");
        let plan = bench_plan(text, "qwen3.8-flash-next.json", Some(8), Some(1009)).unwrap();
        let graphs = crate::lower::GraphSet::embedded().unwrap();
        let mut opts = crate::lower::LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
        opts.device = crate::ir::Device::Cuda;
        let program = crate::lower::lower(&plan, &graphs, &opts).unwrap().program;
        assert!(program
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::GatedAttention { .. })));
        // The config: budget 2048, compress ratio 4, 2 kv heads of 256, indexer keys of 128.
        // 2 layers x (2048 + 3 positions x 2 kv heads x 256 x 4 bytes x (K, V) + 8192 / 4 keys
        // x 128 x 4); at a context below the budget every position.
        let want = 2 * (2051 * 2 * 256 * 4 * 2 + 2048 * 128 * 4);
        assert_eq!(decode_bytes(&program, 8192).kv_and_indexer, want);
        let short = 2 * (1000 * 2 * 256 * 4 * 2 + 250 * 128 * 4);
        assert_eq!(decode_bytes(&program, 1000).kv_and_indexer, short);
    }
}
