//! Fusion: rewrite every match of a fusion pattern into one node of the fused op.
//!
//! A pattern is matched backwards from its last node (the output): each non-`$` argument must be
//! produced by the pattern node it names (`id`, or `id.N` for its output N), `$` arguments bind
//! outside values (the same variable must bind the same value everywhere), weight variables bind
//! weights likewise. Pattern nodes that the walk back from the last one does not reach (a second
//! output reading a shared intermediate, as the hyper-connection read's `x` and `inj` both read
//! `hn`) are then bound among the consumers of the nodes already bound. Values produced inside a
//! match may not be used outside it, except the values of the pattern's `outputs` (default: the
//! last node). The fused node takes the first output node's name, the outputs' values, and the
//! position of the match's last node in program order: every outside input is produced before the
//! node that reads it, so before that position, and a match whose output is read outside before
//! that position is refused. The fused node carries the matched nodes' states in pattern order (a
//! state belongs to one node, so moving its node reorders no access to it).
//!
//! A dimension of an `exact` op written `"$name"` is a dimension variable: it matches any value
//! and binds it (the same variable must bind the same value everywhere in the match), and the
//! replacement's `"$name"` dimensions take the bound values. So a fusion can carry a parameter
//! that differs between the places it matches (each PLE layer's hash table) into the fused op.
//! Dimension variables are a namespace of their own, apart from the value and weight variables.

use std::collections::{BTreeMap, HashMap};

use crate::ir::dims::{self, Dims};
use crate::ir::{Node, Op, Program, Sym};
use crate::lower::error::LowerError;
use crate::lower::template::Fusion;
use crate::rules::{program_holds as holds, ProgramFacts as Facts};

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
        if names_a_missing_block(fusion, dims) {
            counts.insert(fusion.name.clone(), 0);
            continue;
        }
        let err = |msg| LowerError::Fusion {
            fusion: fusion.name.clone(),
            msg,
        };
        // The replacement's own dimensions, evaluated now so that a bad one is reported even
        // where nothing matches (its variables are bound by each match).
        replacement(fusion, dims, &HashMap::new(), true).map_err(err)?;
        let exact: Vec<Option<ExactOp>> = fusion
            .pattern
            .iter()
            .map(|p| {
                p.exact
                    .as_ref()
                    .map(|op| ExactOp::new(op, dims))
                    .transpose()
            })
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let mut fired = 0;
        let mut start = 0;
        loop {
            let producers = producer_map(program);
            let consumers = consumer_counts(program);
            let found = (start..program.nodes.len()).find_map(|i| {
                try_match(program, fusion, &exact, i, &producers, &consumers).map(|m| (i, m))
            });
            let Some((_, m)) = found else { break };
            let op = replacement(fusion, dims, &m.dim_vars, false).map_err(err)?;
            apply(program, fusion, &op, m);
            fired += 1;
            start = 0;
        }
        counts.insert(fusion.name.clone(), fired);
    }
    Ok(counts)
}

/// Whether `fusion` names a dimension the plan does not define: the dimensions of a block the
/// model lacks (`ple_mix`'s `kp` and `n` where no layer has PLE). No node of such a block was
/// lowered, so the fusion has nothing to match; it counts 0 fires (tests/fusions.rs checks that
/// every fusion fires somewhere, so a misspelt dimension is still caught).
fn names_a_missing_block(fusion: &Fusion, dims: &Dims) -> bool {
    let mut missing = false;
    let mut note = |s: &Sym| {
        missing |= dim_var(s).is_none() && dims::unknown(s, dims).is_some();
        Ok::<(), ()>(())
    };
    let _ = fusion.replace.op.map_dims(&mut note);
    for p in &fusion.pattern {
        if let Some(op) = &p.exact {
            let _ = op.map_dims(&mut note);
        }
    }
    missing
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
            if !a.starts_with('$') && !ids[..i].contains(&pattern_ref(a).0) {
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
    for o in &f.outputs {
        if !ids.contains(&o.as_str()) {
            return Err(err(format!("output `{o}` is no pattern node")));
        }
    }
    // Dimension variables: whole dimensions, and the replacement's bound by an `exact`.
    let mut bound = Vec::new();
    for op in f.pattern.iter().filter_map(|p| p.exact.as_ref()) {
        op.map_dims(|s| {
            bound.extend(dim_var(s).map(str::to_string));
            Ok::<(), String>(())
        })
        .map_err(err)?;
    }
    let mut checked = |s: &Sym| {
        if let Sym::Name(text) = s {
            if text.contains('$') && dim_var(s).is_none() {
                return Err(format!(
                    "dimension `{text}`: a dimension variable stands alone (`$name`)"
                ));
            }
        }
        Ok(())
    };
    for op in f.pattern.iter().filter_map(|p| p.exact.as_ref()) {
        op.map_dims(&mut checked).map_err(err)?;
    }
    f.replace.op.map_dims(&mut checked).map_err(err)?;
    f.replace
        .op
        .map_dims(|s| match dim_var(s) {
            Some(v) if !bound.iter().any(|b| b == v) => Err(format!(
                "replacement dimension `{v}` is bound by no pattern node's `exact`"
            )),
            _ => Ok(()),
        })
        .map_err(err)?;
    let vars: Vec<&String> = f
        .pattern
        .iter()
        .flat_map(|p| p.args.iter().chain(&p.weights))
        .collect();
    for a in f.replace.args.iter().chain(&f.replace.weights) {
        if !a.starts_with('$') || !vars.contains(&a) {
            return Err(err(format!(
                "replacement uses `{a}`: a replacement reads only `$` variables the pattern binds (values from outside the match)"
            )));
        }
    }
    Ok(())
}

/// The variable a dimension names (`"$table"` → `$table`), if it is one: a `$` and a name, alone.
fn dim_var(s: &Sym) -> Option<&str> {
    match s {
        Sym::Name(text) => {
            let name = text.trim();
            let rest = name.strip_prefix('$')?;
            (!rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .then_some(name)
        }
        Sym::Lit(_) => None,
    }
}

/// A dimension of an `exact` op: a value, or a variable binding the matched node's value.
enum DimPattern {
    Value(usize),
    Var(String),
}

/// A pattern node's `exact` op, compiled: the op with every dimension erased (its kind and its
/// other fields, as `unit_offset`), and its dimensions in field order.
struct ExactOp {
    flags: Op<()>,
    dims: Vec<DimPattern>,
}

impl ExactOp {
    fn new(op: &Op<Sym>, dims: &Dims) -> Result<ExactOp, String> {
        let mut patterns = Vec::new();
        let flags = op.map_dims(|s| {
            patterns.push(match dim_var(s) {
                Some(v) => DimPattern::Var(v.to_string()),
                None => DimPattern::Value(dims::eval(s, dims)?),
            });
            Ok::<(), String>(())
        })?;
        Ok(ExactOp {
            flags,
            dims: patterns,
        })
    }

    /// Whether `op` is this op, binding the dimension variables into `bound`.
    fn matches(&self, op: &Op<usize>, bound: &mut HashMap<String, usize>) -> bool {
        let mut values = Vec::new();
        let Ok(flags) = op.map_dims(|&d| {
            values.push(d);
            Ok::<(), ()>(())
        }) else {
            return false;
        };
        flags == self.flags
            && values.len() == self.dims.len()
            && self.dims.iter().zip(values).all(|(p, v)| match p {
                DimPattern::Value(want) => *want == v,
                DimPattern::Var(name) => *bound.entry(name.clone()).or_insert(v) == v,
            })
    }
}

/// The fused op of a match: the replacement's dimensions evaluated, its variables taken from
/// `bound` (with `probe`, 0 for each: the check made before anything matched).
fn replacement(
    fusion: &Fusion,
    dims: &Dims,
    bound: &HashMap<String, usize>,
    probe: bool,
) -> Result<Op<usize>, String> {
    fusion.replace.op.map_dims(|s| match dim_var(s) {
        Some(_) if probe => Ok(0),
        Some(v) => bound
            .get(v)
            .copied()
            .ok_or_else(|| format!("dimension variable `{v}` is unbound")),
        None => dims::eval(s, dims),
    })
}

/// A pattern argument naming a pattern node: `id` (any of its outputs) or `id.N` (its output N,
/// for a node with several, as GDN's gates `beta` and `g`).
fn pattern_ref(arg: &str) -> (&str, Option<usize>) {
    match arg.rsplit_once('.') {
        Some((id, n)) => match n.parse() {
            Ok(n) => (id, Some(n)),
            Err(_) => (arg, None),
        },
        None => (arg, None),
    }
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
    /// Dimension variables (`exact` dimensions written `"$name"`) → their bound values.
    dim_vars: HashMap<String, usize>,
}

fn try_match(
    program: &Program,
    fusion: &Fusion,
    exact: &[Option<ExactOp>],
    out_node: usize,
    producers: &HashMap<&str, usize>,
    consumers: &HashMap<&str, usize>,
) -> Option<Match> {
    let np = fusion.pattern.len();
    let mut m = Match {
        nodes: vec![usize::MAX; np],
        vars: HashMap::new(),
        dim_vars: HashMap::new(),
    };
    if !bind(program, fusion, exact, np - 1, out_node, producers, &mut m) {
        return None;
    }
    // Pattern nodes not reached from the last one: among the consumers of bound nodes.
    while let Some(pi) = (0..np).find(|&pi| m.nodes[pi] == usize::MAX) {
        let bound: Vec<&str> = m
            .nodes
            .iter()
            .filter(|&&k| k != usize::MAX)
            .flat_map(|&k| program.nodes[k].outputs.iter().map(|o| o.as_str()))
            .collect();
        let found = program.nodes.iter().enumerate().find_map(|(ni, node)| {
            if m.nodes.contains(&ni) || !node.inputs.iter().any(|i| bound.contains(&i.as_str())) {
                return None;
            }
            let mut trial = Match {
                nodes: m.nodes.clone(),
                vars: m.vars.clone(),
                dim_vars: m.dim_vars.clone(),
            };
            bind(program, fusion, exact, pi, ni, producers, &mut trial).then_some(trial)
        });
        m = found?;
    }
    let outputs = output_ids(fusion);
    let last = *m.nodes.iter().max()?;
    for (pi, &ni) in m.nodes.iter().enumerate() {
        let is_output = outputs.contains(&fusion.pattern[pi].id.as_str());
        for o in &program.nodes[ni].outputs {
            if is_output {
                // Read outside only after the fused node's position.
                let early = program.nodes[..last]
                    .iter()
                    .enumerate()
                    .any(|(k, n)| !m.nodes.contains(&k) && n.inputs.contains(o));
                if early {
                    return None;
                }
                continue;
            }
            // Intermediate values must be used only inside the match.
            if program.is_returned(o) {
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

/// The pattern ids whose values the fused node produces, in order.
fn output_ids(fusion: &Fusion) -> Vec<&str> {
    if fusion.outputs.is_empty() {
        vec![fusion.pattern.last().map_or("", |p| p.id.as_str())]
    } else {
        fusion.outputs.iter().map(|o| o.as_str()).collect()
    }
}

fn bind(
    program: &Program,
    fusion: &Fusion,
    exact: &[Option<ExactOp>],
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
    if node.op.kind() != pat.op {
        return false;
    }
    if let Some(op) = &exact[pi] {
        if !op.matches(&node.op, &mut m.dim_vars) {
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
            let (id, output) = pattern_ref(arg);
            if output.is_some_and(|n| program.nodes[producer].outputs.get(n) != Some(value)) {
                return false;
            }
            let Some(target) = fusion.pattern.iter().position(|p| p.id == id) else {
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

fn apply(program: &mut Program, fusion: &Fusion, op: &Op<usize>, m: Match) {
    let outputs = output_ids(fusion);
    let out_nodes: Vec<usize> = outputs
        .iter()
        .map(|o| {
            let pi = fusion
                .pattern
                .iter()
                .position(|p| p.id == *o)
                .expect("checked by check_fusion");
            m.nodes[pi]
        })
        .collect();
    let at = *m.nodes.iter().max().expect("a match has nodes");
    let fused = Node {
        name: program.nodes[out_nodes[0]].name.clone(),
        op: op.clone(),
        inputs: fusion
            .replace
            .args
            .iter()
            .map(|a| m.vars[a].clone())
            .collect(),
        outputs: out_nodes
            .iter()
            .flat_map(|&k| program.nodes[k].outputs.clone())
            .collect(),
        weights: fusion
            .replace
            .weights
            .iter()
            .map(|w| m.vars[w].clone())
            .collect(),
        // The matched nodes' states, in pattern order (the fused op's state list).
        states: m
            .nodes
            .iter()
            .flat_map(|&k| program.nodes[k].states.clone())
            .collect(),
        variant: String::new(),
        rule: String::new(),
        kernels: Vec::new(),
        fused: Some(fusion.name.clone()),
        last_use: Vec::new(),
    };
    let dead_values: Vec<String> = m
        .nodes
        .iter()
        .filter(|k| !out_nodes.contains(k))
        .flat_map(|&k| program.nodes[k].outputs.clone())
        .collect();
    program.nodes[at] = fused;
    let mut remove: Vec<usize> = m.nodes.into_iter().filter(|&k| k != at).collect();
    remove.sort_unstable_by(|a, b| b.cmp(a));
    for k in remove {
        program.nodes.remove(k);
    }
    program.values.retain(|v| !dead_values.contains(&v.name));
}
