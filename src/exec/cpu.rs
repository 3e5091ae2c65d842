//! The CPU reference executor: interprets a program node by node with the f32 math of
//! `crate::ops`, dispatching on each node's scheduled variant.

use std::collections::HashMap;

use thiserror::Error;

use crate::ir::{Node, Op, Program};
use crate::ops::{
    attention, conv, elementwise as ew, embed, gdn, hyper, indexer, linear, moe, norm, ple, rope,
};
use crate::weights::{WeightTensor, Weights};

use super::state::{SessionState, StateBuf};
use super::{Imports, StepOutput};

#[derive(Debug, Error)]
pub enum ExecError {
    #[error("program for {expected} token(s) given {got}")]
    TokenCount { expected: usize, got: usize },
    #[error("import `{name}`: {msg}")]
    Import { name: String, msg: String },
    #[error("weight `{0}` is not loaded")]
    MissingWeight(String),
    #[error("node `{node}`: {msg}")]
    Node { node: String, msg: String },
}

/// A value during execution; `rows` is the step's token count (1 after `last_row`).
#[derive(Debug, Clone)]
pub enum Val {
    F32 { rows: usize, data: Vec<f32> },
    I64 { rows: usize, data: Vec<i64> },
    Sel(Vec<indexer::RowSel>),
}

impl Val {
    fn f32(&self) -> (&[f32], usize) {
        match self {
            Val::F32 { rows, data } => (data, *rows),
            _ => unreachable!("validated programs feed f32 inputs where f32 is expected"),
        }
    }
    fn i64(&self) -> &[i64] {
        match self {
            Val::I64 { data, .. } => data,
            _ => unreachable!("validated programs feed i64 inputs where i64 is expected"),
        }
    }
}

/// Runs one step of `program` for `tokens` (already range-checked by the caller) and returns the
/// logits `[rows, vocab]` with their row count. `state.position` advances by the token count.
pub fn run(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
) -> Result<(Vec<f32>, usize), ExecError> {
    let out = run_step(program, weights, state, tokens, &[])?;
    Ok((out.logits, out.rows))
}

/// Runs one step given the program's imports (by name, `[tokens, width]` each) and returns the
/// logits and the program's exports. A missing or misshaped import is refused before any node
/// runs, the state untouched.
pub fn run_step(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    imports: Imports,
) -> Result<StepOutput, ExecError> {
    if tokens.len() != program.tokens {
        return Err(ExecError::TokenCount {
            expected: program.tokens,
            got: tokens.len(),
        });
    }
    let mut keep = vec![program.output.as_str()];
    keep.extend(program.exports.iter().map(|e| e.value.as_str()));
    let mut outs = run_observed(program, weights, state, tokens, imports, &keep, None)?;
    let (logits, rows) = match outs.remove(&program.output) {
        Some(Val::F32 { rows, data }) => (data, rows),
        _ => unreachable!("validated programs output f32 logits"),
    };
    let exports = program
        .exports
        .iter()
        .map(|e| match outs.get(&e.value) {
            Some(Val::F32 { data, .. }) => (e.name.clone(), data.clone()),
            _ => unreachable!("validated programs export f32 values"),
        })
        .collect();
    Ok(StepOutput {
        logits,
        rows,
        exports,
    })
}

/// Runs one step and returns the named values (kept alive past their last use). Used by `run`
/// and by tests that compare intermediate values.
pub fn run_values(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    keep: &[&str],
) -> Result<HashMap<String, Val>, ExecError> {
    run_observed(program, weights, state, tokens, &[], keep, None)
}

/// [`run_values`] for a program with imports.
pub fn run_values_with(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    imports: Imports,
    keep: &[&str],
) -> Result<HashMap<String, Val>, ExecError> {
    run_observed(program, weights, state, tokens, imports, keep, None)
}

/// What one node of a step read and wrote: the parity loop over the CUDA kernels
/// (tests/gpu_parity.rs) runs each CUDA variant of the node on these inputs and states and
/// compares it with these outputs.
#[derive(Debug, Clone)]
pub struct NodeRecord {
    /// The node's place in the program.
    pub index: usize,
    /// The step's start position.
    pub start: usize,
    pub inputs: Vec<Val>,
    pub states_before: Vec<StateBuf>,
    pub outputs: Vec<Val>,
    pub states_after: Vec<StateBuf>,
}

/// Runs one step and records every node's inputs, outputs and states (for the nodes `want`
/// accepts by their place in the program; the others run unrecorded).
pub fn record_step(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    want: &dyn Fn(usize) -> bool,
) -> Result<Vec<NodeRecord>, ExecError> {
    record_step_with(program, weights, state, tokens, &[], want)
}

/// [`record_step`] for a program with imports.
pub fn record_step_with(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    imports: Imports,
    want: &dyn Fn(usize) -> bool,
) -> Result<Vec<NodeRecord>, ExecError> {
    let mut records = Vec::new();
    let mut observe = |r: &Observed| records.push(r.to_record());
    run_observed(
        program,
        weights,
        state,
        tokens,
        imports,
        &[],
        Some((want, &mut observe)),
    )?;
    Ok(records)
}

/// One node's launch as [`run_observed`] reports it (borrowed; [`NodeRecord`] owns one).
struct Observed<'a> {
    index: usize,
    start: usize,
    inputs: &'a [&'a Val],
    states_before: &'a [StateBuf],
    outputs: &'a [Val],
    states_after: &'a [StateBuf],
}

impl Observed<'_> {
    fn to_record(&self) -> NodeRecord {
        NodeRecord {
            index: self.index,
            start: self.start,
            inputs: self.inputs.iter().map(|v| (*v).clone()).collect(),
            states_before: self.states_before.to_vec(),
            outputs: self.outputs.to_vec(),
            states_after: self.states_after.to_vec(),
        }
    }
}

/// What a recording step reports to: the nodes wanted, and where each one's launch goes.
type Observer<'o> = (&'o dyn Fn(usize) -> bool, &'o mut dyn FnMut(&Observed));

/// The step's interpreter loop; `observer` sees the launches of the nodes it wants.
fn run_observed(
    program: &Program,
    weights: &Weights,
    state: &mut SessionState,
    tokens: &[i64],
    imports: Imports,
    keep: &[&str],
    mut observer: Option<Observer>,
) -> Result<HashMap<String, Val>, ExecError> {
    let mut values: HashMap<&str, Val> = HashMap::new();
    for import in &program.imports {
        let given = imports
            .iter()
            .find(|(name, _)| *name == import.name)
            .ok_or_else(|| ExecError::Import {
                name: import.name.clone(),
                msg: "not given".into(),
            })?;
        let want = tokens.len() * import.width;
        if given.1.len() != want {
            return Err(ExecError::Import {
                name: import.name.clone(),
                msg: format!(
                    "{} values given, {} expected ({} rows of {})",
                    given.1.len(),
                    want,
                    tokens.len(),
                    import.width
                ),
            });
        }
        values.insert(
            import.name.as_str(),
            Val::F32 {
                rows: tokens.len(),
                data: given.1.to_vec(),
            },
        );
    }
    if let Some((name, _)) = imports
        .iter()
        .find(|(name, _)| !program.imports.iter().any(|i| i.name == *name))
    {
        return Err(ExecError::Import {
            name: name.to_string(),
            msg: "the program takes no such import".into(),
        });
    }
    let start = state.position;
    state.ensure(&program.states, program.consts.ple_eos.unwrap_or(0));
    values.insert(
        program.input.as_str(),
        Val::I64 {
            rows: tokens.len(),
            data: tokens.to_vec(),
        },
    );
    let mut kept = HashMap::new();
    for (index, node) in program.nodes.iter().enumerate() {
        let inputs: Vec<&Val> = node.inputs.iter().map(|i| &values[i.as_str()]).collect();
        let ws: Vec<&WeightTensor> = node
            .weights
            .iter()
            .map(|w| {
                weights
                    .get(w)
                    .ok_or_else(|| ExecError::MissingWeight(w.clone()))
            })
            .collect::<Result<_, _>>()?;
        let mut bufs: Vec<StateBuf> = node
            .states
            .iter()
            .map(|s| {
                state
                    .bufs
                    .remove(s)
                    .expect("ensure() created every declared state")
            })
            .collect();
        // The states are copied only for a recorded node.
        let recorded = observer.as_ref().is_some_and(|(want, _)| want(index));
        let before = if recorded { bufs.clone() } else { Vec::new() };
        let result = exec_node(program, node, &inputs, &ws, &mut bufs, start);
        if let (Ok(outputs), true, Some((_, observe))) = (&result, recorded, observer.as_mut()) {
            observe(&Observed {
                index,
                start,
                inputs: &inputs,
                states_before: &before,
                outputs,
                states_after: &bufs,
            });
        }
        for (name, buf) in node.states.iter().zip(bufs) {
            state.bufs.insert(name.clone(), buf);
        }
        let outputs = result.map_err(|msg| ExecError::Node {
            node: node.name.clone(),
            msg,
        })?;
        for (name, v) in node.outputs.iter().zip(outputs) {
            values.insert(name.as_str(), v);
        }
        for dead in &node.last_use {
            if let Some(v) = values.remove(dead.as_str()) {
                if keep.contains(&dead.as_str()) {
                    kept.insert(dead.clone(), v);
                }
            }
        }
    }
    for k in keep {
        if let Some(v) = values.remove(k) {
            kept.insert(k.to_string(), v);
        }
    }
    state.position += tokens.len();
    Ok(kept)
}

fn rows_buf(buf: &mut StateBuf) -> (&mut Vec<f32>, usize) {
    match buf {
        StateBuf::Rows { width, data } => (data, *width),
        _ => unreachable!("state kinds follow the templates"),
    }
}

/// The indexer's step (`Op::IndexerSelect`): the step's raw keys `k` appended to the key state,
/// the blocks they complete pooled (key norm `k_norm`), then the selection for the queries `q`.
#[allow(clippy::too_many_arguments)]
fn indexer_select(
    q: &[f32],
    k: &[f32],
    k_norm: &[f32],
    states: &mut [StateBuf],
    rows: usize,
    start: usize,
    s: &indexer::IndexerShape,
    eps: f32,
    consts: &crate::ir::Consts,
) -> Vec<indexer::RowSel> {
    let (raw, _) = rows_buf(&mut states[0]);
    raw.extend_from_slice(k);
    let raw = std::mem::take(raw);
    let (pooled, _) = rows_buf(&mut states[1]);
    indexer::pool_blocks(
        &raw,
        pooled,
        k_norm,
        s,
        eps,
        consts.rope_theta,
        consts.rope_offset,
    );
    let sel = indexer::select(q, pooled, rows, start, s);
    *rows_buf(&mut states[0]).0 = raw;
    sel
}

fn fixed_buf(buf: &mut StateBuf) -> &mut Vec<f32> {
    match buf {
        StateBuf::Fixed(v) => v,
        _ => unreachable!("state kinds follow the templates"),
    }
}

fn selection(v: &Val) -> &[indexer::RowSel] {
    match v {
        Val::Sel(s) => s,
        _ => unreachable!("validated programs feed a selection"),
    }
}

/// `Attention`'s body: appends `k`, `v` to the caches `states[0]`, `states[1]`, then attends.
fn append_and_attend(
    states: &mut [StateBuf],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    sel: &[indexer::RowSel],
    s: &attention::AttnShape,
) -> Vec<f32> {
    let (kc, _) = rows_buf(&mut states[0]);
    kc.extend_from_slice(k);
    let keys = std::mem::take(kc);
    let (vc, _) = rows_buf(&mut states[1]);
    vc.extend_from_slice(v);
    let out = attention::attend(q, &keys, vc, sel, s);
    *rows_buf(&mut states[0]).0 = keys;
    out
}

/// A gather's ids and row count, every id checked against the table's rows.
fn table_ids<'v>(ids: &'v Val, table: &WeightTensor) -> Result<(&'v [i64], usize), String> {
    let rows = match ids {
        Val::I64 { rows, .. } => *rows,
        _ => unreachable!("validated programs feed i64 ids"),
    };
    check_ids(ids.i64(), table)?;
    Ok((ids.i64(), rows))
}

fn check_ids(ids: &[i64], table: &WeightTensor) -> Result<(), String> {
    let table_rows = table.shape[0] as i64;
    match ids.iter().find(|&&i| i < 0 || i >= table_rows) {
        Some(bad) => Err(format!("id {bad} is outside the table's {table_rows} rows")),
        None => Ok(()),
    }
}

/// The PLE n-gram ids of `tokens` with the node's history (`states[0]`, updated), from the
/// program's hash table `table` and eos.
fn ngram_ids(
    program: &Program,
    tokens: &[i64],
    states: &mut [StateBuf],
    ngram: usize,
    heads_per_ngram: usize,
    table: usize,
) -> Result<Vec<i64>, String> {
    let history = match &mut states[0] {
        StateBuf::Tokens(h) => h,
        _ => unreachable!("validated programs give the n-gram ids their token history"),
    };
    ple::program_ngram_ids(
        &program.consts,
        table,
        tokens,
        history,
        ngram,
        heads_per_ngram,
    )
}

fn exec_node(
    program: &Program,
    node: &Node,
    inputs: &[&Val],
    w: &[&WeightTensor],
    states: &mut [StateBuf],
    start: usize,
) -> Result<Vec<Val>, String> {
    let consts = &program.consts;
    let eps = consts.rms_norm_eps;
    // Where the step's first row is rotated (its caches still start at `start` rows).
    let rope_at = start + consts.rope_offset;
    let one = |rows: usize, data: Vec<f32>| Ok(vec![Val::F32 { rows, data }]);
    match &node.op {
        Op::Embed => {
            let (ids, rows) = table_ids(inputs[0], w[0])?;
            one(rows, embed::gather(ids, &w[0].data, w[0].shape[1]))
        }
        Op::EmbedStreams { streams } => {
            let (ids, rows) = table_ids(inputs[0], w[0])?;
            let d = w[0].shape[1];
            one(
                rows,
                embed::gather_streams(ids, &w[0].data, d, rows, *streams),
            )
        }
        Op::RepeatStreams { streams } => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::repeat_streams(x, rows, *streams))
        }
        Op::RmsNorm { group, unit_offset } => {
            let (x, rows) = inputs[0].f32();
            one(
                rows,
                norm::rms_norm(x, &w[0].data, *group, *unit_offset, eps),
            )
        }
        Op::Linear => {
            let (x, rows) = inputs[0].f32();
            let (n, k) = (w[0].shape[0], w[0].shape[1]);
            one(
                rows,
                linear::by_variant(&node.variant, x, &w[0].data, rows, k, n),
            )
        }
        Op::StreamLinear { streams } => {
            let (x, rows) = inputs[0].f32();
            let (n, k) = (w[0].shape[0], w[0].shape[1]);
            one(rows, linear::rows(x, &w[0].data, rows * streams, k, n))
        }
        Op::DivBy { by } => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::div_by(x, *by as f32))
        }
        Op::MulBy { by } => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::mul_by(x, *by as f32))
        }
        Op::Silu => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::silu_all(x))
        }
        Op::Sigmoid => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::sigmoid_all(x))
        }
        Op::Mul => {
            let ((a, rows), (b, _)) = (inputs[0].f32(), inputs[1].f32());
            one(rows, ew::mul(a, b, rows))
        }
        Op::Add => {
            let ((a, rows), (b, _)) = (inputs[0].f32(), inputs[1].f32());
            one(rows, ew::add(a, b))
        }
        Op::Slice { start: s, len } => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::slice_cols(x, rows, *s, *len))
        }
        Op::StreamMean { streams } => {
            let (x, rows) = inputs[0].f32();
            one(rows, ew::stream_mean(x, rows, *streams))
        }
        Op::HcWrite { streams } => {
            let (h, rows) = inputs[0].f32();
            one(
                rows,
                ew::hc_write(h, inputs[1].f32().0, inputs[2].f32().0, rows, *streams),
            )
        }
        Op::LastRow => {
            let (x, rows) = inputs[0].f32();
            one(1, ew::last_row(x, rows))
        }
        Op::CausalConv {
            kernel,
            dilation,
            silu,
        } => {
            let (x, rows) = inputs[0].f32();
            let window = fixed_buf(&mut states[0]);
            one(
                rows,
                conv::causal_conv(x, window, &w[0].data, rows, *kernel, *dilation, *silu),
            )
        }
        Op::GdnGates => {
            let (b, rows) = inputs[0].f32();
            let (beta, g) = gdn::gates(b, inputs[1].f32().0, &w[0].data, &w[1].data);
            Ok(vec![
                Val::F32 { rows, data: beta },
                Val::F32 { rows, data: g },
            ])
        }
        Op::GdnRecurrence { .. } | Op::GdnGatedRecurrence { .. } => {
            let shape = gdn::GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = inputs[0].f32();
            let st = fixed_buf(&mut states[0]);
            let (x1, x2) = (inputs[1].f32().0, inputs[2].f32().0);
            let o = match node.op {
                // x1, x2: beta and g.
                Op::GdnRecurrence { .. } => gdn::recurrence(qkv, x1, x2, st, rows, &shape),
                // x1, x2: b and a, the gates' inputs.
                _ => gdn::gated_recurrence(qkv, x1, x2, &w[0].data, &w[1].data, st, rows, &shape),
            };
            one(rows, o)
        }
        Op::GdnNormedRecurrence { .. } => {
            let shape = gdn::GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = inputs[0].f32();
            let st = fixed_buf(&mut states[0]);
            let (b, a, z) = (inputs[1].f32().0, inputs[2].f32().0, inputs[3].f32().0);
            let y = gdn::normed_recurrence(
                qkv,
                b,
                a,
                &w[0].data,
                &w[1].data,
                z,
                &w[2].data,
                st,
                rows,
                &shape,
                consts.gate_activation,
                eps,
            );
            one(rows, y)
        }
        Op::GdnConvNormedRecurrence { kernel, .. } => {
            let shape = gdn::GdnShape::of(&node.op).expect("a recurrence op");
            let (qkv, rows) = inputs[0].f32();
            // The states in the fused nodes' order: the conv's window, then the recurrence's.
            let [window, st] = states else {
                return Err(format!(
                    "{} states, want the window and the state",
                    states.len()
                ));
            };
            let (b, a, z) = (inputs[1].f32().0, inputs[2].f32().0, inputs[3].f32().0);
            let y = gdn::conv_normed_recurrence(
                qkv,
                &w[0].data,
                fixed_buf(window),
                *kernel,
                b,
                a,
                &w[1].data,
                &w[2].data,
                z,
                &w[3].data,
                fixed_buf(st),
                rows,
                &shape,
                consts.gate_activation,
                eps,
            );
            one(rows, y)
        }
        Op::GatedRmsNorm { head_dim } => {
            let (x, rows) = inputs[0].f32();
            one(
                rows,
                norm::gated_rms_norm(
                    x,
                    inputs[1].f32().0,
                    &w[0].data,
                    *head_dim,
                    consts.gate_activation,
                    eps,
                ),
            )
        }
        Op::SplitQGate { heads, head_dim } => {
            let (x, rows) = inputs[0].f32();
            let (q, g) = attention::split_q_gate(x, rows, *heads, *head_dim);
            Ok(vec![Val::F32 { rows, data: q }, Val::F32 { rows, data: g }])
        }
        Op::Rope {
            head_dim,
            rotary_dim,
        } => {
            let (x, rows) = inputs[0].f32();
            one(
                rows,
                rope::rope(x, rows, rope_at, *head_dim, *rotary_dim, consts.rope_theta),
            )
        }
        Op::NormRope {
            head_dim,
            rotary_dim,
        } => {
            let (x, rows) = inputs[0].f32();
            one(
                rows,
                rope::norm_rope(
                    x,
                    &w[0].data,
                    rows,
                    rope_at,
                    *head_dim,
                    *rotary_dim,
                    eps,
                    consts.rope_theta,
                ),
            )
        }
        Op::GatedStreamMean { streams } => {
            let ((up, rows), (hn, _)) = (inputs[0].f32(), inputs[1].f32());
            one(rows, ew::gated_stream_mean(up, hn, rows, *streams))
        }
        Op::SigmoidMul => {
            let ((x, rows), (g, _)) = (inputs[0].f32(), inputs[1].f32());
            one(rows, ew::sigmoid_mul(x, g, rows))
        }
        Op::IndexerSelect { .. } => {
            let s = indexer::IndexerShape::of(&node.op).expect("an indexer op");
            let (q, rows) = inputs[0].f32();
            let (k, _) = inputs[1].f32();
            let sel = indexer_select(q, k, &w[0].data, states, rows, start, &s, eps, consts);
            Ok(vec![Val::Sel(sel)])
        }
        // The unfused chain's slices and query norm_rope, then the indexer.
        Op::IndexerSelectQk { .. } => {
            let s = indexer::IndexerShape::of(&node.op).expect("an indexer op");
            let (qk, rows) = inputs[0].f32();
            let q_width = s.heads * s.head_dim;
            let q_raw = ew::slice_cols(qk, rows, 0, q_width);
            let k = ew::slice_cols(qk, rows, q_width, s.head_dim);
            let q = rope::norm_rope(
                &q_raw,
                &w[0].data,
                rows,
                rope_at,
                s.head_dim,
                s.rotary_dim,
                eps,
                consts.rope_theta,
            );
            let sel = indexer_select(&q, &k, &w[1].data, states, rows, start, &s, eps, consts);
            Ok(vec![Val::Sel(sel)])
        }
        // The CPU selection carries its block size itself.
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            ..
        } => {
            let sel = selection(inputs[3]);
            let s = attention::AttnShape {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
            };
            let (q, k, v) = (inputs[0].f32().0, inputs[1].f32().0, inputs[2].f32().0);
            one(sel.len(), append_and_attend(states, q, k, v, sel, &s))
        }
        // The unfused chain, op by op: split_q_gate, norm_rope of q and of k, attention (with
        // its cache appends), sigmoid_mul by the gate.
        Op::GatedAttention {
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            ..
        } => {
            let (qg, rows) = inputs[0].f32();
            let sel = selection(inputs[3]);
            let (q_raw, gate) = attention::split_q_gate(qg, rows, *heads, *head_dim);
            let norm_rope = |x: &[f32], w: &[f32]| {
                let theta = consts.rope_theta;
                rope::norm_rope(x, w, rows, rope_at, *head_dim, *rotary_dim, eps, theta)
            };
            let q = norm_rope(&q_raw, &w[0].data);
            let k = norm_rope(inputs[1].f32().0, &w[1].data);
            let s = attention::AttnShape {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
            };
            let attn = append_and_attend(states, &q, &k, inputs[2].f32().0, sel, &s);
            one(sel.len(), ew::sigmoid_mul(&attn, &gate, sel.len()))
        }
        Op::MoeRouter { top_k } => {
            let (logits, rows) = inputs[0].f32();
            let experts = logits.len() / rows;
            let (ids, ws) = moe::route(logits, experts, *top_k, consts.norm_topk_prob);
            Ok(vec![
                Val::I64 { rows, data: ids },
                Val::F32 { rows, data: ws },
            ])
        }
        Op::MoeExperts { intermediate, .. } => {
            let (x, rows) = inputs[0].f32();
            let ids = inputs[1].i64();
            let (ws, _) = inputs[2].f32();
            let k = ids.len() / rows;
            let bank = moe::ExpertBank {
                gate_up: &w[0].data,
                down: &w[1].data,
                hidden: x.len() / rows,
                intermediate: *intermediate,
            };
            let out = match node.variant.as_str() {
                "expert_major" => moe::expert_major(x, ids, ws, rows, k, &bank),
                _ => moe::token_major(x, ids, ws, rows, k, &bank),
            };
            one(rows, out)
        }
        Op::PleNgramIds {
            ngram,
            heads_per_ngram,
            table,
        } => {
            let tokens = inputs[0].i64();
            let ids = ngram_ids(program, tokens, states, *ngram, *heads_per_ngram, *table)?;
            Ok(vec![Val::I64 {
                rows: tokens.len(),
                data: ids,
            }])
        }
        Op::PleEmbed {
            ngram,
            heads_per_ngram,
            table,
        } => {
            let tokens = inputs[0].i64();
            let ids = ngram_ids(program, tokens, states, *ngram, *heads_per_ngram, *table)?;
            check_ids(&ids, w[0])?;
            one(tokens.len(), embed::gather(&ids, &w[0].data, w[0].shape[1]))
        }
        Op::PleGate { streams } => {
            let (key, rows) = inputs[0].f32();
            one(
                rows,
                ple::gate(key, inputs[1].f32().0, inputs[2].f32().0, rows, *streams),
            )
        }
        Op::PleMix {
            streams,
            kernel,
            dilation,
        } => {
            let (key_proj, rows) = inputs[0].f32();
            let (h, value) = (inputs[1].f32().0, inputs[2].f32().0);
            let window = fixed_buf(&mut states[0]);
            let y = ple::mix(
                key_proj, h, value, &w[0].data, &w[1].data, &w[2].data, &w[3].data, window, rows,
                *streams, *kernel, *dilation, eps,
            );
            one(rows, y)
        }
        Op::SwigluLinear => {
            let (x, rows) = inputs[0].f32();
            let (n, k) = (w[0].shape[0], w[0].shape[1]);
            one(rows, linear::swiglu(x, &w[0].data, &w[1].data, rows, k, n))
        }
        Op::HcMix { streams } => {
            let (hn, rows) = inputs[0].f32();
            one(
                rows,
                hyper::hc_mix(hn, &w[0].data, &w[1].data, rows, *streams),
            )
        }
        Op::LinearHcWrite { streams } => {
            let (h, rows) = inputs[0].f32();
            let (inj, x) = (inputs[1].f32().0, inputs[2].f32().0);
            one(
                rows,
                linear::linear_hc_write(h, inj, x, &w[0].data, rows, *streams),
            )
        }
        Op::MoeSharedWrite { streams } => {
            let (h, rows) = inputs[0].f32();
            let (inj, x, sh, a) = (
                inputs[1].f32().0,
                inputs[2].f32().0,
                inputs[3].f32().0,
                inputs[4].f32().0,
            );
            one(
                rows,
                linear::moe_shared_write(h, inj, x, sh, a, &w[0].data, &w[1].data, rows, *streams),
            )
        }
        Op::LinearGroup { .. } => {
            // Each part is the linear layer it replaced.
            let (x, rows) = inputs[0].f32();
            Ok(w.iter()
                .map(|wi| {
                    let (n, k) = (wi.shape[0], wi.shape[1]);
                    Val::F32 {
                        rows,
                        data: linear::rows(x, &wi.data, rows, k, n),
                    }
                })
                .collect())
        }
        Op::SigmoidGatedAdd => {
            let (x, rows) = inputs[0].f32();
            let (b, a) = (inputs[1].f32().0, inputs[2].f32().0);
            one(rows, linear::sigmoid_gated_add(x, &w[0].data, b, a, rows))
        }
        Op::HcRead { streams, inject } => {
            let (h, rows) = inputs[0].f32();
            let gains = inject.then(|| w[3].data.as_slice());
            let (x, inj) = hyper::hc_read(
                h, &w[0].data, &w[1].data, &w[2].data, gains, rows, *streams, eps,
            );
            Ok(std::iter::once(x)
                .chain(inj)
                .map(|data| Val::F32 { rows, data })
                .collect())
        }
        Op::HcInject { streams } => {
            let (hn, rows) = inputs[0].f32();
            one(rows, hyper::hc_inject(hn, &w[0].data, rows, *streams))
        }
    }
}
