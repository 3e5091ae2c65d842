//! Segmenting: cuts a program into runs of nodes that execute without the host, so that an
//! executor can capture each run as one CUDA graph and do the host's work between them.
//!
//! A node needs the host when its result must be read on the host before the next node can be
//! launched ([`Op::needs_host`]): a segment ends after it. graphrun's ops keep everything on the
//! device (MoE routing, the QSA block selection and the step position are device values read
//! by kernels), so today every program is one segment; the seed's router, which read its top-k
//! back to the host, would have cut each layer in two. The pass, not the executor, decides this,
//! so that a new op that needs the host cuts its programs without executor changes.

use crate::ir::{Node, Program, Segment};

pub fn run(program: &mut Program) {
    program.segments = cut(&program.nodes, |n| n.op.needs_host());
}

/// Contiguous node ranges covering `nodes`, each ending after a node `needs_host` marks (or at
/// the end). An empty program has no segment.
pub fn cut(nodes: &[Node], needs_host: impl Fn(&Node) -> bool) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut start = 0;
    for (i, node) in nodes.iter().enumerate() {
        if needs_host(node) {
            segments.push(Segment { start, end: i + 1 });
            start = i + 1;
        }
    }
    if start < nodes.len() {
        segments.push(Segment {
            start,
            end: nodes.len(),
        });
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Op;

    fn node(name: &str, op: Op<usize>) -> Node {
        Node {
            name: name.into(),
            op,
            inputs: vec![],
            outputs: vec![],
            weights: vec![],
            states: vec![],
            variant: String::new(),
            rule: String::new(),
            kernels: vec![],
            fused: None,
            last_use: vec![],
        }
    }

    #[test]
    fn a_program_of_device_ops_is_one_segment() {
        let nodes = vec![
            node("a", Op::Silu),
            node("b", Op::MoeRouter { top_k: 2 }),
            node("c", Op::Add),
        ];
        assert_eq!(
            cut(&nodes, |n| n.op.needs_host()),
            vec![Segment { start: 0, end: 3 }]
        );
    }

    #[test]
    fn a_node_that_needs_the_host_ends_its_segment() {
        // As the seed's router would: its top-k read back to the host.
        let nodes = vec![
            node("a", Op::Silu),
            node("r1", Op::MoeRouter { top_k: 2 }),
            node("b", Op::Add),
            node("r2", Op::MoeRouter { top_k: 2 }),
        ];
        let host = |n: &Node| matches!(n.op, Op::MoeRouter { .. });
        assert_eq!(
            cut(&nodes, host),
            vec![Segment { start: 0, end: 2 }, Segment { start: 2, end: 4 }]
        );
        assert!(cut(&[], host).is_empty());
    }

    #[test]
    fn the_real_programs_are_one_segment_each() {
        use crate::ir::{LogitsMode, Phase};
        use crate::lower::{lower, GraphSet, LowerOptions};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/configs/qwen3.8-flash-next.json");
        let plan = crate::plan::ModelPlan::from_file(&path).unwrap();
        for (phase, tokens) in [(Phase::Decode, 1), (Phase::Prefill, 64)] {
            let opts = LowerOptions::new(phase, tokens, LogitsMode::Last);
            let p = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
                .unwrap()
                .program;
            assert_eq!(
                p.segments,
                vec![Segment {
                    start: 0,
                    end: p.nodes.len()
                }]
            );
        }
    }
}
