//! Memory planning, first step: liveness. Each value is marked on the node after which nothing
//! reads it, so an executor can release its buffer there. (Slot assignment for a device arena
//! builds on the same liveness and comes with the CUDA executor.)

use std::collections::HashMap;

use crate::ir::Program;

pub fn run(program: &mut Program) {
    let mut last: HashMap<String, usize> = HashMap::new();
    for (i, node) in program.nodes.iter().enumerate() {
        for v in node.inputs.iter().chain(&node.outputs) {
            last.insert(v.clone(), i);
        }
    }
    last.remove(&program.output);
    last.remove(&program.input);
    for node in &mut program.nodes {
        node.last_use.clear();
    }
    let mut by_node: Vec<(usize, String)> = last.into_iter().map(|(v, i)| (i, v)).collect();
    by_node.sort();
    for (i, v) in by_node {
        program.nodes[i].last_use.push(v);
    }
}
