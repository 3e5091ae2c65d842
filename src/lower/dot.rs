//! Views of a lowered program for people: a table of every node's kernels and the rule that
//! chose them, and a Graphviz graph (nodes coloured by op family, labelled with their kernels
//! and rule, fused nodes naming what they replaced, segments as clusters), so that trying a
//! fusion or a rule shows its effect.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::template::Fusion;
use crate::ir::{Op, Program};

/// One line per node: index, name, op, variant, rule, kernels.
pub fn kernel_table(p: &Program) -> String {
    let mut out = String::new();
    let name_w = p.nodes.iter().map(|n| n.name.len()).max().unwrap_or(4);
    let rule_w = p.nodes.iter().map(|n| n.rule.len()).max().unwrap_or(4);
    for (i, n) in p.nodes.iter().enumerate() {
        let _ = writeln!(
            out,
            "{i:>5}  {:<name_w$}  {:<28}  {:<rule_w$}  {}",
            n.name,
            format!("{}.{}", n.op.kind(), n.variant),
            n.rule,
            n.kernels.join(" + "),
        );
    }
    out
}

/// The op family a kind belongs to, and its fill colour.
fn family(op: &Op<usize>) -> (&'static str, &'static str) {
    match op {
        Op::Linear
        | Op::StreamLinear { .. }
        | Op::LinearGroup { .. }
        | Op::LinearHcWrite { .. }
        | Op::SwigluLinear
        | Op::MoeSharedWrite { .. } => ("linear", "#cfe2f3"),
        Op::Attention { .. }
        | Op::GatedAttention { .. }
        | Op::IndexerSelect { .. }
        | Op::IndexerSelectQk { .. }
        | Op::Rope { .. }
        | Op::NormRope { .. }
        | Op::SplitQGate { .. } => ("attention", "#f4cccc"),
        Op::CausalConv { .. }
        | Op::GdnGates
        | Op::GdnRecurrence { .. }
        | Op::GdnGatedRecurrence { .. }
        | Op::GdnNormedRecurrence { .. }
        | Op::GdnConvNormedRecurrence { .. } => ("gdn", "#d9ead3"),
        Op::MoeRouter { .. } | Op::MoeExperts { .. } => ("moe", "#fff2cc"),
        Op::HcRead { .. }
        | Op::HcMix { .. }
        | Op::HcInject { .. }
        | Op::HcWrite { .. }
        | Op::StreamMean { .. }
        | Op::GatedStreamMean { .. }
        | Op::RepeatStreams { .. } => ("hyper", "#d9d2e9"),
        Op::Embed | Op::EmbedStreams { .. } | Op::PleNgramIds { .. } | Op::PleEmbed { .. } => {
            ("embed", "#fce5cd")
        }
        Op::PleGate { .. } | Op::PleMix { .. } => ("ple", "#fce5cd"),
        Op::RmsNorm { .. } | Op::GatedRmsNorm { .. } => ("norm", "#eeeeee"),
        _ => ("elementwise", "#ffffff"),
    }
}

/// Graphviz text escaped for a double-quoted label.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The program as a Graphviz digraph. `fusions`: the fusion definitions, so that a fused node
/// names the op kinds it replaced.
pub fn to_dot(p: &Program, fusions: &[Fusion]) -> String {
    let replaced: HashMap<&str, String> = fusions
        .iter()
        .map(|f| {
            let ops: Vec<&str> = f.pattern.iter().map(|n| n.op.as_str()).collect();
            (f.name.as_str(), ops.join(" + "))
        })
        .collect();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in p.nodes.iter().enumerate() {
        for o in &n.outputs {
            producer.insert(o.as_str(), i);
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "digraph program {{");
    let _ = writeln!(
        out,
        "  label=\"{}, {} token(s) a step, on {}\"; rankdir=TB; node [shape=box, style=filled, fontname=\"monospace\", fontsize=10];",
        p.phase, p.tokens, p.device
    );
    let _ = writeln!(out, "  input [label=\"{}\", shape=ellipse];", esc(&p.input));
    let mut in_segment = vec![None; p.nodes.len()];
    for (s, seg) in p.segments.iter().enumerate() {
        for slot in in_segment.iter_mut().take(seg.end).skip(seg.start) {
            *slot = Some(s);
        }
    }
    let node_line = |i: usize| {
        let n = &p.nodes[i];
        let (fam, colour) = family(&n.op);
        let mut label = format!(
            "{}\\n{}.{} [{fam}]",
            esc(&n.name),
            n.op.kind(),
            esc(&n.variant)
        );
        if let Some(f) = &n.fused {
            let what = match (replaced.get(f.as_str()), &n.op) {
                (Some(r), _) => format!(": {r}"),
                // A grouping (groups.ron): sibling linears over one input.
                (None, Op::LinearGroup { parts }) => format!(": {parts} x linear"),
                (None, _) => String::new(),
            };
            label.push_str(&format!("\\nfused {}{}", esc(f), esc(&what)));
        }
        label.push_str(&format!("\\nrule {}", esc(&n.rule)));
        for k in &n.kernels {
            label.push_str(&format!("\\n{}", esc(k)));
        }
        format!("n{i} [label=\"{label}\", fillcolor=\"{colour}\"];")
    };
    for (s, seg) in p.segments.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_segment{s} {{");
        let _ = writeln!(
            out,
            "    label=\"segment {s}: nodes {}..{} (one CUDA graph)\"; style=dashed;",
            seg.start, seg.end
        );
        for i in seg.start..seg.end.min(p.nodes.len()) {
            let _ = writeln!(out, "    {}", node_line(i));
        }
        let _ = writeln!(out, "  }}");
    }
    for (i, _) in in_segment.iter().enumerate().filter(|(_, s)| s.is_none()) {
        let _ = writeln!(out, "  {}", node_line(i));
    }
    for (i, n) in p.nodes.iter().enumerate() {
        for x in &n.inputs {
            match producer.get(x.as_str()) {
                Some(&j) => {
                    let _ = writeln!(out, "  n{j} -> n{i};");
                }
                None if x == &p.input => {
                    let _ = writeln!(out, "  input -> n{i};");
                }
                None => {}
            }
        }
    }
    let _ = writeln!(out, "}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Device, LogitsMode, Phase};
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    fn tiny(device: Device, phase: Phase, tokens: usize) -> (Program, GraphSet) {
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/tiny-qwen4exp/config.json");
        let plan = ModelPlan::from_file(&config).unwrap();
        let graphs = GraphSet::embedded().unwrap();
        let opts = LowerOptions {
            device,
            ..LowerOptions::new(phase, tokens, LogitsMode::Last)
        };
        (lower(&plan, &graphs, &opts).unwrap().program, graphs)
    }

    #[test]
    fn the_graph_has_every_node_and_edge_and_names_fusions_kernels_and_segments() {
        let (p, graphs) = tiny(Device::Cuda, Phase::Decode, 1);
        let dot = to_dot(&p, &graphs.fusions);
        assert!(dot.starts_with("digraph program {") && dot.trim_end().ends_with('}'));
        for (i, n) in p.nodes.iter().enumerate() {
            assert!(
                dot.contains(&format!("n{i} [label=\"{}", esc(&n.name))),
                "{}",
                n.name
            );
            for k in &n.kernels {
                assert!(dot.contains(k.as_str()), "{k}");
            }
        }
        let edges: usize = p.nodes.iter().map(|n| n.inputs.len()).sum();
        assert_eq!(dot.matches(" -> n").count(), edges);
        assert_eq!(
            dot.matches("subgraph cluster_segment").count(),
            p.segments.len()
        );
        // A fused node names the op kinds its fusion replaced.
        let fused = p
            .nodes
            .iter()
            .find(|n| n.fused.as_deref() == Some("hc_read"))
            .unwrap();
        assert!(fused.fused.is_some());
        assert!(dot.contains("fused hc_read: rms_norm + "), "{dot}");
    }

    #[test]
    fn the_table_has_a_line_per_node_with_its_kernels_and_rule() {
        let (p, _) = tiny(Device::Cpu, Phase::Prefill, 8);
        let table = kernel_table(&p);
        assert_eq!(table.lines().count(), p.nodes.len());
        let line = table.lines().find(|l| l.contains("linear.tiled")).unwrap();
        assert!(line.contains("linear.prefill_tiled") && line.contains("ops::linear::tiled"));
    }
}
