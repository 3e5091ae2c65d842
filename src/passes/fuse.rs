//! Fusion: rewrite every match of a fusion pattern into one node of the fused op.
//!
//! A pattern is matched backwards from its last node (the output): each non-`$` argument must be
//! produced by the pattern node it names, `$` arguments bind outside values (the same variable must
//! bind the same value everywhere), weight variables bind weights likewise. Values produced inside
//! a match may not be used outside it. The fused node takes the output node's name and outputs, and
//! its position, which is valid because every outside input is produced before the pattern's first
//! node.

use std::collections::{BTreeMap, HashMap};

use crate::ir::dims::{self, Dims};
use crate::ir::{Node, Op, Program};
use crate::lower::template::Fusion;
use crate::lower::LowerError;
use crate::passes::schedule::{holds, Facts};

/// Applies each fusion (in file order) wherever it matches; returns how often each one fired.
pub fn run(
    program: &mut Program,
    fusions: &[Fusion],
    dims: &Dims,
    facts: &Facts,
) -> Result<BTreeMap<String, usize>, LowerError> {
    let mut counts = BTreeMap::new();
    for fusion in fusions {
        check_fusion(fusion)?;
        if !fusion.when.is_empty() && !fusion.when.iter().any(|p| holds(p, facts)) {
            counts.insert(fusion.name.clone(), 0);
            continue;
        }
        let replace_op: Op<usize> = fusion
            .replace
            .op
            .map_dims(|s| dims::eval(s, dims))
            .map_err(|msg| LowerError::Fusion {
                fusion: fusion.name.clone(),
                msg,
            })?;
        let exact: Vec<Option<Op<usize>>> = fusion
            .pattern
            .iter()
            .map(|p| {
                p.exact
                    .as_ref()
                    .map(|op| op.map_dims(|s| dims::eval(s, dims)))
                    .transpose()
            })
            .collect::<Result<_, _>>()
            .map_err(|msg| LowerError::Fusion {
                fusion: fusion.name.clone(),
                msg,
            })?;
        let mut fired = 0;
        let mut start = 0;
        loop {
            let producers = producer_map(program);
            let consumers = consumer_counts(program);
            let found = (start..program.nodes.len()).find_map(|i| {
                try_match(program, fusion, &exact, i, &producers, &consumers).map(|m| (i, m))
            });
            let Some((i, m)) = found else { break };
            apply(program, fusion, &replace_op, i, m);
            fired += 1;
            start = 0;
        }
        counts.insert(fusion.name.clone(), fired);
    }
    Ok(counts)
}

/// Structural checks of a fusion entry, independent of any program.
fn check_fusion(f: &Fusion) -> Result<(), LowerError> {
    let err = |msg: String| LowerError::Fusion {
        fusion: f.name.clone(),
        msg,
    };
    if f.pattern.is_empty() {
        return Err(err("empty pattern".into()));
    }
    let ids: Vec<&str> = f.pattern.iter().map(|p| p.id.as_str()).collect();
    for (i, p) in f.pattern.iter().enumerate() {
        for a in &p.args {
            if !a.starts_with('$') && !ids[..i].contains(&a.as_str()) {
                return Err(err(format!(
                    "pattern node `{}` reads `{a}`, which is no earlier pattern node",
                    p.id
                )));
            }
        }
        if let Some(op) = &p.exact {
            if op.kind() != p.op {
                return Err(err(format!(
                    "pattern node `{}`: exact op {} is not a {}",
                    p.id,
                    op.kind(),
                    p.op
                )));
            }
        }
    }
    let vars: Vec<&String> = f
        .pattern
        .iter()
        .flat_map(|p| p.args.iter().chain(&p.weights))
        .collect();
    for a in f.replace.args.iter().chain(&f.replace.weights) {
        if !vars.contains(&a) {
            return Err(err(format!(
                "replacement uses `{a}`, which the pattern never binds"
            )));
        }
    }
    Ok(())
}

fn producer_map(p: &Program) -> HashMap<&str, usize> {
    let mut m = HashMap::new();
    for (i, n) in p.nodes.iter().enumerate() {
        for o in &n.outputs {
            m.insert(o.as_str(), i);
        }
    }
    m
}

fn consumer_counts(p: &Program) -> HashMap<&str, usize> {
    let mut m = HashMap::new();
    for n in &p.nodes {
        for i in &n.inputs {
            *m.entry(i.as_str()).or_insert(0) += 1;
        }
    }
    m
}

struct Match {
    /// Pattern index → node index.
    nodes: Vec<usize>,
    vars: HashMap<String, String>,
}

fn try_match(
    program: &Program,
    fusion: &Fusion,
    exact: &[Option<Op<usize>>],
    out_node: usize,
    producers: &HashMap<&str, usize>,
    consumers: &HashMap<&str, usize>,
) -> Option<Match> {
    let np = fusion.pattern.len();
    let mut m = Match {
        nodes: vec![usize::MAX; np],
        vars: HashMap::new(),
    };
    if !bind(program, fusion, exact, np - 1, out_node, producers, &mut m) {
        return None;
    }
    if m.nodes.contains(&usize::MAX) {
        return None;
    }
    // Intermediate values must be used only inside the match.
    for (pi, &ni) in m.nodes.iter().enumerate() {
        if pi == np - 1 {
            continue;
        }
        for o in &program.nodes[ni].outputs {
            if *o == program.output {
                return None;
            }
            let inside = m
                .nodes
                .iter()
                .map(|&k| program.nodes[k].inputs.iter().filter(|x| *x == o).count())
                .sum::<usize>();
            // A node matched twice by different pattern ids would double count; nodes are distinct.
            if consumers.get(o.as_str()).copied().unwrap_or(0) != inside {
                return None;
            }
        }
    }
    let mut distinct = m.nodes.clone();
    distinct.sort_unstable();
    distinct.dedup();
    (distinct.len() == np).then_some(m)
}

fn bind(
    program: &Program,
    fusion: &Fusion,
    exact: &[Option<Op<usize>>],
    pi: usize,
    ni: usize,
    producers: &HashMap<&str, usize>,
    m: &mut Match,
) -> bool {
    if m.nodes[pi] != usize::MAX {
        return m.nodes[pi] == ni;
    }
    let pat = &fusion.pattern[pi];
    let node: &Node = &program.nodes[ni];
    if node.op.kind() != pat.op || !node.states.is_empty() {
        return false;
    }
    if let Some(op) = &exact[pi] {
        if *op != node.op {
            return false;
        }
    }
    if node.inputs.len() != pat.args.len() || node.weights.len() != pat.weights.len() {
        return false;
    }
    m.nodes[pi] = ni;
    for (var, w) in pat.weights.iter().zip(&node.weights) {
        if !bind_var(m, var, w) {
            return false;
        }
    }
    for (arg, value) in pat.args.iter().zip(&node.inputs) {
        if arg.starts_with('$') {
            if !bind_var(m, arg, value) {
                return false;
            }
        } else {
            let Some(&producer) = producers.get(value.as_str()) else {
                return false;
            };
            let Some(target) = fusion.pattern.iter().position(|p| &p.id == arg) else {
                return false;
            };
            if !bind(program, fusion, exact, target, producer, producers, m) {
                return false;
            }
        }
    }
    true
}

fn bind_var(m: &mut Match, var: &str, value: &str) -> bool {
    match m.vars.get(var) {
        Some(v) => v == value,
        None => {
            m.vars.insert(var.to_string(), value.to_string());
            true
        }
    }
}

fn apply(program: &mut Program, fusion: &Fusion, op: &Op<usize>, out_node: usize, m: Match) {
    let out = &program.nodes[out_node];
    let fused = Node {
        name: out.name.clone(),
        op: op.clone(),
        inputs: fusion
            .replace
            .args
            .iter()
            .map(|a| m.vars[a].clone())
            .collect(),
        outputs: out.outputs.clone(),
        weights: fusion
            .replace
            .weights
            .iter()
            .map(|w| m.vars[w].clone())
            .collect(),
        states: Vec::new(),
        variant: String::new(),
        rule: String::new(),
        fused: Some(fusion.name.clone()),
        last_use: Vec::new(),
    };
    let dead_values: Vec<String> = m
        .nodes
        .iter()
        .filter(|&&k| k != out_node)
        .flat_map(|&k| program.nodes[k].outputs.clone())
        .collect();
    program.nodes[out_node] = fused;
    let mut remove: Vec<usize> = m.nodes.into_iter().filter(|&k| k != out_node).collect();
    remove.sort_unstable_by(|a, b| b.cmp(a));
    for k in remove {
        program.nodes.remove(k);
    }
    program.values.retain(|v| !dead_values.contains(&v.name));
}
