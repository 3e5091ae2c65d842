//! Horizontal fusion: sibling nodes of one op kind that read the same input become one node that
//! computes all their outputs (`graphs/groups.ron`). A decode step on a GPU pays a few µs of
//! start and drain per launch whatever it reads; GDN's four input projections read one vector.
//!
//! A group's node takes the first sibling's name and position. That is valid: its only input is
//! the siblings' common input, defined before the first sibling, and each output is now defined
//! earlier than before, so every consumer still comes after its producer.

use std::collections::{BTreeMap, HashMap};

use crate::ir::{Node, Op, Program};
use crate::lower::error::LowerError;
use crate::lower::template::Grouping;
use crate::rules::{program_holds as holds, ProgramFacts as Facts};

/// Applies each grouping (in file order) where its `when` holds; returns how many group nodes
/// each one made.
pub fn run(
    program: &mut Program,
    groupings: &[Grouping],
    facts: &Facts,
) -> Result<BTreeMap<String, usize>, LowerError> {
    let mut counts = BTreeMap::new();
    for g in groupings {
        check(g)?;
        let applies = g.when.is_empty() || g.when.iter().any(|p| holds(p, facts));
        let made = if applies { apply(program, g) } else { 0 };
        counts.insert(g.name.clone(), made);
    }
    Ok(counts)
}

fn check(g: &Grouping) -> Result<(), LowerError> {
    let err = |msg: String| LowerError::Fusion {
        fusion: g.name.clone(),
        msg,
    };
    if (g.op.as_str(), g.into.as_str()) != ("linear", "LinearGroup") {
        return Err(err(format!(
            "op `{}` into `{}`: groups.ron knows only op \"linear\" into \"LinearGroup\"",
            g.op, g.into
        )));
    }
    if g.max_parts < 2 {
        return Err(err(format!(
            "max_parts {}: a group has at least 2 parts",
            g.max_parts
        )));
    }
    Ok(())
}

/// Whether `node` can be a part: a plain single-input, single-weight linear layer (the only op
/// `check` lets a grouping name).
fn is_part(node: &Node) -> bool {
    matches!(node.op, Op::Linear)
        && node.inputs.len() == 1
        && node.weights.len() == 1
        && node.states.is_empty()
}

fn apply(program: &mut Program, g: &Grouping) -> usize {
    // Siblings by their input, in program order.
    let mut by_input: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, node) in program.nodes.iter().enumerate() {
        if is_part(node) {
            by_input.entry(node.inputs[0].as_str()).or_default().push(i);
        }
    }
    let mut groups: Vec<Vec<usize>> = by_input
        .into_values()
        .flat_map(|ids| {
            ids.chunks(g.max_parts)
                .filter(|c| c.len() >= 2)
                .map(|c| c.to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    groups.sort();
    let mut replaced: HashMap<usize, Node> = HashMap::new();
    let mut removed = std::collections::HashSet::new();
    for ids in &groups {
        let parts: Vec<&Node> = ids.iter().map(|&i| &program.nodes[i]).collect();
        let node = Node {
            name: parts[0].name.clone(),
            op: Op::LinearGroup { parts: parts.len() },
            inputs: parts[0].inputs.clone(),
            outputs: parts.iter().map(|n| n.outputs[0].clone()).collect(),
            weights: parts.iter().map(|n| n.weights[0].clone()).collect(),
            states: Vec::new(),
            variant: String::new(),
            rule: String::new(),
            kernels: Vec::new(),
            fused: Some(g.name.clone()),
            last_use: Vec::new(),
        };
        replaced.insert(ids[0], node);
        removed.extend(ids[1..].iter().copied());
    }
    let nodes = std::mem::take(&mut program.nodes);
    program.nodes = nodes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !removed.contains(i))
        .map(|(i, n)| replaced.remove(&i).unwrap_or(n))
        .collect();
    groups.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Device, LogitsMode, Phase};
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    fn decode(device: Device) -> Program {
        let text = include_str!("../../models/tiny-qwen4exp/config.json");
        let plan = ModelPlan::from_json_str(text, "tiny").unwrap();
        let mut opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
        opts.device = device;
        lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program
    }

    #[test]
    fn gdn_projections_become_one_node_on_cuda_decode_only() {
        let cuda = decode(Device::Cuda);
        let gdn = cuda
            .nodes
            .iter()
            .find(|n| n.name == "blk.0.gdn.qkv")
            .unwrap();
        assert_eq!(gdn.op, Op::LinearGroup { parts: 4 });
        assert_eq!(
            gdn.outputs,
            ["blk.0.gdn.qkv", "blk.0.gdn.z", "blk.0.gdn.b", "blk.0.gdn.a"]
        );
        assert!(!cuda.nodes.iter().any(|n| n.name == "blk.0.gdn.z"));
        // The CPU keeps its separate linears (it gains nothing from one launch).
        let cpu = decode(Device::Cpu);
        assert!(cpu
            .nodes
            .iter()
            .all(|n| !matches!(n.op, Op::LinearGroup { .. })));
    }

    #[test]
    fn a_bad_entry_names_itself() {
        let g = Grouping {
            name: "mine".into(),
            doc: String::new(),
            op: "silu".into(),
            into: "LinearGroup".into(),
            max_parts: 4,
            when: Vec::new(),
        };
        let err = check(&g).unwrap_err().to_string();
        assert!(err.contains("mine") && err.contains("silu"), "{err}");
    }
}
