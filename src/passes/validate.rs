//! Checks a finished program: values defined once and before use (a topological order, checked
//! with petgraph), weights and states declared, shapes consistent with the op shape rules,
//! every node scheduled onto a known variant, and the arena of `memplan` sound: every value's
//! rows and bytes as its producer makes them, offsets aligned and inside the arena, and no two
//! values that are live at the same node sharing bytes.

use std::collections::HashMap;

use petgraph::graph::DiGraph;

use crate::ir::{Program, ValueType};
use crate::lower::error::LowerError;
use crate::ops::shape;
use crate::passes::memplan;

pub fn run(program: &Program) -> Result<(), LowerError> {
    let invalid = |node: &str, msg: String| LowerError::Invalid {
        node: node.to_string(),
        msg,
    };
    let values: HashMap<&str, (ValueType, usize)> = program
        .values
        .iter()
        .map(|v| (v.name.as_str(), (v.ty, v.width)))
        .collect();
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut graph = DiGraph::<usize, ()>::new();
    let ids: Vec<_> = (0..program.nodes.len())
        .map(|i| graph.add_node(i))
        .collect();
    for (i, node) in program.nodes.iter().enumerate() {
        let mut in_info = Vec::new();
        for input in &node.inputs {
            if !program.is_given(input) {
                let p = *producer.get(input.as_str()).ok_or_else(|| {
                    invalid(&node.name, format!("reads `{input}` before it is defined"))
                })?;
                graph.add_edge(ids[p], ids[i], ());
            }
            in_info.push(
                *values
                    .get(input.as_str())
                    .ok_or_else(|| invalid(&node.name, format!("unknown value `{input}`")))?,
            );
        }
        let mut shapes = Vec::new();
        for w in &node.weights {
            let info = program
                .weights
                .iter()
                .find(|x| &x.name == w)
                .ok_or_else(|| invalid(&node.name, format!("undeclared weight `{w}`")))?;
            shapes.push(info.shape.clone());
        }
        for s in &node.states {
            if !program.states.iter().any(|x| &x.name == s) {
                return Err(invalid(&node.name, format!("undeclared state `{s}`")));
            }
        }
        let out = shape::infer(&node.op, &in_info, &shapes).map_err(|m| invalid(&node.name, m))?;
        if out.len() != node.outputs.len() {
            return Err(invalid(
                &node.name,
                format!(
                    "{} outputs named, op makes {}",
                    node.outputs.len(),
                    out.len()
                ),
            ));
        }
        for (o, info) in node.outputs.iter().zip(out) {
            if producer.insert(o.as_str(), i).is_some() {
                return Err(invalid(&node.name, format!("value `{o}` is defined twice")));
            }
            if values.get(o.as_str()) != Some(&info) {
                return Err(invalid(
                    &node.name,
                    format!(
                        "value `{o}` is declared {:?}, the op makes {info:?}",
                        values.get(o.as_str())
                    ),
                ));
            }
        }
        if crate::registry::find(program.device, node.op.kind(), &node.variant).is_none() {
            return Err(invalid(
                &node.name,
                format!(
                    "variant `{}` is unknown for {}",
                    node.variant,
                    node.op.kind()
                ),
            ));
        }
        if node.kernels.is_empty() {
            return Err(invalid(&node.name, "names no kernel".into()));
        }
    }
    if !producer.contains_key(program.output.as_str()) {
        return Err(invalid(
            "(output)",
            format!("output `{}` is never produced", program.output),
        ));
    }
    for e in &program.exports {
        if !producer.contains_key(e.value.as_str()) {
            return Err(invalid(
                "(exports)",
                format!(
                    "export `{}` (value `{}`) is never produced",
                    e.name, e.value
                ),
            ));
        }
    }
    petgraph::algo::toposort(&graph, None).map_err(|c| {
        invalid(
            &program.nodes[graph[c.node_id()]].name,
            "is part of a cycle".into(),
        )
    })?;
    check_segments(program)?;
    check_arena(program)
}

/// The segments of `passes::segment`: contiguous, non-empty, covering every node in order, and
/// every node that needs the host ends one.
fn check_segments(program: &Program) -> Result<(), LowerError> {
    let invalid = |msg: String| LowerError::Invalid {
        node: "(segments)".to_string(),
        msg,
    };
    let mut next = 0;
    for seg in &program.segments {
        if seg.start != next || seg.end <= seg.start || seg.end > program.nodes.len() {
            return Err(invalid(format!(
                "segment [{}, {}) does not continue at node {next}",
                seg.start, seg.end
            )));
        }
        if let Some(i) = (seg.start..seg.end - 1).find(|&i| program.nodes[i].op.needs_host()) {
            return Err(invalid(format!(
                "node `{}` needs the host but does not end its segment",
                program.nodes[i].name
            )));
        }
        next = seg.end;
    }
    if next != program.nodes.len() {
        return Err(invalid(format!(
            "the segments end at node {next} of {}",
            program.nodes.len()
        )));
    }
    Ok(())
}

/// The arena laid out by `memplan` (see there): sizes, alignment, bounds, and no two values with
/// overlapping lifetimes overlapping in memory.
fn check_arena(program: &Program) -> Result<(), LowerError> {
    let invalid = |msg: String| LowerError::Invalid {
        node: "(arena)".to_string(),
        msg,
    };
    if !program.arena_bytes.is_multiple_of(memplan::ALIGN) {
        return Err(invalid(format!(
            "arena_bytes {} is not a multiple of {}",
            program.arena_bytes,
            memplan::ALIGN
        )));
    }
    for (v, (rows, bytes)) in program.values.iter().zip(memplan::sizes(program)?) {
        if (v.rows, v.bytes) != (rows, bytes) {
            return Err(invalid(format!(
                "value `{}` is planned as {} rows, {} bytes; its producer makes {rows} rows, \
                 {bytes} bytes",
                v.name, v.rows, v.bytes
            )));
        }
        if !v.offset.is_multiple_of(memplan::ALIGN) || v.offset + v.bytes > program.arena_bytes {
            return Err(invalid(format!(
                "value `{}` at offset {} ({} bytes) is not {}-aligned inside the arena of {} bytes",
                v.name,
                v.offset,
                v.bytes,
                memplan::ALIGN,
                program.arena_bytes
            )));
        }
    }
    let life = memplan::lifetimes(program);
    let bytes: Vec<usize> = program.values.iter().map(|v| v.bytes).collect();
    let offsets: Vec<usize> = program.values.iter().map(|v| v.offset).collect();
    if let Some((a, b)) = memplan::find_clash(&bytes, &offsets, &life) {
        let (va, vb) = (&program.values[a], &program.values[b]);
        return Err(invalid(format!(
            "values `{}` (nodes {}..={}, bytes {}..{}) and `{}` (nodes {}..={}, bytes {}..{}) \
             are live together and share memory",
            va.name,
            life[a].0,
            life[a].1,
            va.offset,
            va.offset + va.bytes,
            vb.name,
            life[b].0,
            life[b].1,
            vb.offset,
            vb.offset + vb.bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::ir::{LogitsMode, Phase};
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    fn tiny() -> Program {
        let plan = ModelPlan::from_file(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-qwen4exp/config.json"),
        )
        .unwrap();
        let opts = LowerOptions::new(Phase::Prefill, 4, LogitsMode::Last);
        lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program
    }

    fn error(p: &Program) -> String {
        run(p).unwrap_err().to_string()
    }

    #[test]
    fn segment_problems_are_reported() {
        use crate::ir::Segment;
        let p = tiny();
        let n = p.nodes.len();
        let cases = [
            (vec![], "end at node 0"),
            (
                vec![Segment {
                    start: 0,
                    end: n - 1,
                }],
                "end at node",
            ),
            (
                vec![Segment { start: 0, end: 2 }, Segment { start: 3, end: n }],
                "does not continue at node 2",
            ),
            (
                vec![Segment {
                    start: 0,
                    end: n + 1,
                }],
                "does not continue",
            ),
            (
                vec![Segment { start: 0, end: 0 }, Segment { start: 0, end: n }],
                "does not continue",
            ),
        ];
        for (segments, want) in cases {
            let mut bad = p.clone();
            bad.segments = segments.clone();
            let e = error(&bad);
            assert!(e.contains(want), "{segments:?}: {e}");
        }
    }

    #[test]
    fn arena_problems_are_reported() {
        let p = tiny();
        run(&p).unwrap();

        // A node's output placed on its input (a linear whose output fits the arena there).
        let mut bad = p.clone();
        let node = bad
            .nodes
            .iter()
            .find(|n| {
                let (x, y) = (bad.value(&n.inputs[0]), bad.value(&n.outputs[0]));
                n.op.kind() == "linear"
                    && x.zip(y)
                        .is_some_and(|(x, y)| x.offset + y.bytes <= bad.arena_bytes)
            })
            .unwrap();
        let (x, y) = (node.inputs[0].clone(), node.outputs[0].clone());
        let at = bad.value(&x).unwrap().offset;
        bad.values.iter_mut().find(|v| v.name == y).unwrap().offset = at;
        // (The first clash found may be with another value live there too.)
        let e = error(&bad);
        assert!(e.contains("share memory") && e.contains(&y), "{e}");

        let mut bad = p.clone();
        bad.arena_bytes -= memplan::ALIGN;
        assert!(error(&bad).contains("inside the arena"));

        let mut bad = p.clone();
        bad.values[3].offset += 16;
        assert!(error(&bad).contains("aligned"));

        let mut bad = p.clone();
        bad.values[3].bytes /= 2;
        assert!(error(&bad).contains("its producer makes"));
    }
}
