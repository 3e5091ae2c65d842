//! Checks a finished program: values defined once and before use (a topological order, checked
//! with petgraph), weights and states declared, shapes consistent with the op shape rules,
//! every node scheduled onto a known variant.

use std::collections::HashMap;

use petgraph::graph::DiGraph;

use crate::ir::{Program, ValueType};
use crate::lower::LowerError;
use crate::ops::{self, shape};

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
            if input != &program.input {
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
        if !ops::variants_on(program.device, node.op.kind()).contains(&node.variant.as_str()) {
            return Err(invalid(
                &node.name,
                format!(
                    "variant `{}` is unknown for {}",
                    node.variant,
                    node.op.kind()
                ),
            ));
        }
    }
    if !producer.contains_key(program.output.as_str()) {
        return Err(invalid(
            "(output)",
            format!("output `{}` is never produced", program.output),
        ));
    }
    petgraph::algo::toposort(&graph, None).map_err(|c| {
        invalid(
            &program.nodes[graph[c.node_id()]].name,
            "is part of a cycle".into(),
        )
    })?;
    Ok(())
}
