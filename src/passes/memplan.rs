//! Memory planning: liveness, static sizes, and one arena for every value of a step.
//!
//! 1. Liveness: each value is marked on the node after which nothing reads it
//!    (`Node::last_use`), so an executor that allocates per value can release it there.
//! 2. Sizes: every value's rows are static. The program's input has `tokens` rows; a node's
//!    outputs have the rows of its first input, except `LastRow`, whose output has one. Bytes per
//!    row come from the element type ([`row_bytes`]); set on `ValueInfo::rows` and `bytes`.
//!    Sizes are computed with checked arithmetic: a step too large to address (absurdly many
//!    tokens) is a [`SizeError`] naming the value, not a wrapped size.
//! 3. Arena: every value gets a byte offset (`ValueInfo::offset`, a multiple of [`ALIGN`]) in one
//!    buffer of `Program::arena_bytes`, so an executor allocates once per step shape and every
//!    value has a fixed address (what CUDA-graph replay needs).
//!
//! A value's lifetime is an inclusive interval of node indices ([`lifetimes`]): from the node
//! that produces it (the program's input: from node 0, it is written before the step) to the
//! last node that reads it (the program's output: to the last node). A value is live through the
//! whole node that last reads it, so a node's outputs never share bytes with its inputs (kernels
//! are not in-place). Two values may share bytes only if their lifetimes are disjoint.
//!
//! Placement ([`place`]) is greedy by size (Pisarchyk & Lee 2020, "Efficient Memory Management
//! for Deep Neural Net Inference", as in TFLite's arena planner): values in order of decreasing
//! size (ties: earlier start, then declaration order), each at the lowest offset where it fits
//! between the already placed values whose lifetimes overlap its own (first fit; sizes rounded up
//! to [`ALIGN`]). Large values are placed first, while the arena has room; small ones fill the
//! gaps. The result is deterministic; it is never below [`peak_live_bytes`] (the most bytes
//! live at one node); on the Qwen4Exp programs (real config, decode and prefill) it equals it,
//! so it is optimal there (`tests/lower.rs` prints both).

use std::collections::HashMap;

use crate::ir::{Op, Program, ValueType};

/// Alignment of every offset and of the arena: cudarc allocations are 256-byte aligned, and
/// kernels use 16-byte vector loads.
pub const ALIGN: usize = 256;

/// `n` rounded up to a multiple of [`ALIGN`].
pub fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// [`align_up`], or `None` past `usize::MAX`.
fn checked_align_up(n: usize) -> Option<usize> {
    n.div_ceil(ALIGN).checked_mul(ALIGN)
}

/// A size that does not fit in `usize`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error(
        "memory plan: value `{value}` of {rows} rows of {width} columns overflows the address \
         space (the step has {tokens} tokens)"
    )]
    Value {
        value: String,
        rows: usize,
        width: usize,
        tokens: usize,
    },
    #[error(
        "memory plan: the step's values together overflow the address space (the step has \
         {tokens} tokens)"
    )]
    Arena { tokens: usize },
}

pub fn run(program: &mut Program) -> Result<(), SizeError> {
    mark_last_use(program);
    plan_arena(program)
}

/// Marks every value (but the program's input and output) on the node that reads or writes it
/// last.
fn mark_last_use(program: &mut Program) {
    let mut last: HashMap<String, usize> = HashMap::new();
    for (i, node) in program.nodes.iter().enumerate() {
        for v in node.inputs.iter().chain(&node.outputs) {
            last.insert(v.clone(), i);
        }
    }
    last.retain(|v, _| !program.is_given(v) && !program.is_returned(v));
    for node in &mut program.nodes {
        node.last_use.clear();
    }
    let mut by_node: Vec<(usize, String)> = last.into_iter().map(|(v, i)| (i, v)).collect();
    by_node.sort();
    for (i, v) in by_node {
        program.nodes[i].last_use.push(v);
    }
}

/// Sets every value's rows, bytes and offset, and the program's arena size.
fn plan_arena(program: &mut Program) -> Result<(), SizeError> {
    let sizes = sizes(program)?;
    let life = lifetimes(program);
    let bytes: Vec<usize> = sizes.iter().map(|s| s.1).collect();
    // Every offset plus its size is at most the sum of all aligned sizes, so once that sum fits,
    // `place` cannot overflow.
    bytes
        .iter()
        .try_fold(0usize, |sum, &b| sum.checked_add(checked_align_up(b)?))
        .ok_or(SizeError::Arena {
            tokens: program.tokens,
        })?;
    let (offsets, arena) = place(&bytes, &life);
    for (v, ((rows, bytes), offset)) in program
        .values
        .iter_mut()
        .zip(sizes.into_iter().zip(offsets))
    {
        v.rows = rows;
        v.bytes = bytes;
        v.offset = offset;
    }
    program.arena_bytes = arena;
    Ok(())
}

/// Bytes of one row of a value of type `ty` and `width` columns made by `producer`: f32 `4 *
/// width`, i64 `8 * width`, a QSA selection `4 * (2 + budget/block)` (`i32 [T, 2 + K]`:
/// `visible`, `count`, then `K = budget/block` block ids, docs/cuda-plan.md), its `budget` and
/// `block` those of the producing `IndexerSelect` or `IndexerSelectQk` (K = 0 for any other producer, which
/// `validate` rejects). `None` past `usize::MAX`.
pub fn row_bytes(ty: ValueType, width: usize, producer: Option<&Op<usize>>) -> Option<usize> {
    match ty {
        ValueType::F32 => width.checked_mul(4),
        ValueType::I64 => width.checked_mul(8),
        ValueType::Selection => {
            let keep = match producer {
                Some(
                    Op::IndexerSelect { budget, block, .. }
                    | Op::IndexerSelectQk { budget, block, .. },
                ) if *block > 0 => budget / block,
                _ => 0,
            };
            keep.checked_add(2)?.checked_mul(4)
        }
    }
}

/// Bytes of a value of `rows` rows (see [`row_bytes`]): what an executor's buffer for it holds.
/// `None` past `usize::MAX`.
pub fn value_bytes(
    ty: ValueType,
    width: usize,
    rows: usize,
    producer: Option<&Op<usize>>,
) -> Option<usize> {
    rows.checked_mul(row_bytes(ty, width, producer)?)
}

/// `(rows, bytes)` of every value, in the order of `program.values`. A value that is neither the
/// input nor produced (which `validate` rejects) gets `tokens` rows. An error names the first
/// value whose bytes overflow `usize`.
pub fn sizes(program: &Program) -> Result<Vec<(usize, usize)>, SizeError> {
    let index = value_index(program);
    let mut rows: Vec<Option<usize>> = vec![None; program.values.len()];
    let mut producer: Vec<Option<&Op<usize>>> = vec![None; program.values.len()];
    for given in std::iter::once(program.input.as_str())
        .chain(program.imports.iter().map(|i| i.name.as_str()))
    {
        if let Some(&i) = index.get(given) {
            rows[i] = Some(program.tokens);
        }
    }
    for node in &program.nodes {
        let r = match node.op {
            Op::LastRow => 1,
            _ => node
                .inputs
                .first()
                .and_then(|x| index.get(x.as_str()))
                .and_then(|&i| rows[i])
                .unwrap_or(program.tokens),
        };
        for o in &node.outputs {
            if let Some(&i) = index.get(o.as_str()) {
                if producer[i].is_none() {
                    producer[i] = Some(&node.op);
                    rows[i] = Some(r);
                }
            }
        }
    }
    program
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let r = rows[i].unwrap_or(program.tokens);
            let bytes =
                value_bytes(v.ty, v.width, r, producer[i]).ok_or_else(|| SizeError::Value {
                    value: v.name.clone(),
                    rows: r,
                    width: v.width,
                    tokens: program.tokens,
                })?;
            Ok((r, bytes))
        })
        .collect()
}

/// The lifetime `(first, last)` of every value, inclusive node indices, in the order of
/// `program.values` (see the module doc). The input starts at node 0, the output ends at the last
/// node; a value no node mentions gets `(0, 0)`.
pub fn lifetimes(program: &Program) -> Vec<(usize, usize)> {
    let index = value_index(program);
    let mut life: Vec<Option<(usize, usize)>> = vec![None; program.values.len()];
    for given in std::iter::once(program.input.as_str())
        .chain(program.imports.iter().map(|i| i.name.as_str()))
    {
        if let Some(&i) = index.get(given) {
            life[i] = Some((0, 0));
        }
    }
    for (n, node) in program.nodes.iter().enumerate() {
        for v in node.inputs.iter().chain(&node.outputs) {
            if let Some(&i) = index.get(v.as_str()) {
                let l = life[i].get_or_insert((n, n));
                l.1 = l.1.max(n);
            }
        }
    }
    let returned = std::iter::once(program.output.as_str())
        .chain(program.exports.iter().map(|e| e.value.as_str()));
    for r in returned {
        if let Some(&i) = index.get(r) {
            let end = program.nodes.len().saturating_sub(1);
            let l = life[i].get_or_insert((end, end));
            l.1 = l.1.max(end);
        }
    }
    life.into_iter().map(|l| l.unwrap_or((0, 0))).collect()
}

fn value_index(program: &Program) -> HashMap<&str, usize> {
    program
        .values
        .iter()
        .enumerate()
        .map(|(i, v)| (v.name.as_str(), i))
        .collect()
}

/// Greedy-by-size placement (see the module doc) of items of `bytes` with inclusive lifetimes
/// `life`: their offsets (multiples of [`ALIGN`]) and the arena size (a multiple of [`ALIGN`]).
/// Items of 0 bytes get offset 0 and take no room.
pub fn place(bytes: &[usize], life: &[(usize, usize)]) -> (Vec<usize>, usize) {
    assert_eq!(bytes.len(), life.len());
    let mut order: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] > 0).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(bytes[i]), life[i].0, i));
    let mut offsets = vec![0; bytes.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(order.len());
    let mut arena = 0;
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for i in order {
        let size = align_up(bytes[i]);
        let (s, e) = life[i];
        taken.clear();
        taken.extend(
            placed
                .iter()
                .filter(|&&j| life[j].0 <= e && s <= life[j].1)
                .map(|&j| (offsets[j], offsets[j] + align_up(bytes[j]))),
        );
        taken.sort_unstable();
        let mut at = 0;
        for &(lo, hi) in &taken {
            if lo >= at + size {
                break;
            }
            at = at.max(hi);
        }
        offsets[i] = at;
        arena = arena.max(at + size);
        placed.push(i);
    }
    (offsets, arena)
}

/// The most bytes (each rounded up to [`ALIGN`]) live at one node: a lower bound of any arena.
pub fn peak_live_bytes(bytes: &[usize], life: &[(usize, usize)]) -> usize {
    let steps = life.iter().map(|l| l.1 + 2).max().unwrap_or(0);
    let mut delta = vec![0i64; steps];
    for (&b, &(s, e)) in bytes.iter().zip(life) {
        delta[s] += align_up(b) as i64;
        delta[e + 1] -= align_up(b) as i64;
    }
    let mut live = 0i64;
    let mut peak = 0i64;
    for d in delta {
        live += d;
        peak = peak.max(live);
    }
    peak as usize
}

/// The first pair of items (by start, then index) whose lifetimes overlap and whose bytes
/// `[offset, offset + bytes)` overlap too; `None` when the placement is sound. A sweep over the
/// lifetimes: each item is compared with the items still live when it starts.
pub fn find_clash(
    bytes: &[usize],
    offsets: &[usize],
    life: &[(usize, usize)],
) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] > 0).collect();
    order.sort_by_key(|&i| (life[i].0, i));
    let mut active: Vec<usize> = Vec::new();
    for i in order {
        active.retain(|&a| life[a].1 >= life[i].0);
        for &a in &active {
            if offsets[a] < offsets[i] + bytes[i] && offsets[i] < offsets[a] + bytes[a] {
                return Some((a, i));
            }
        }
        active.push(i);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::ir::{Device, LogitsMode, Phase};
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    /// The invariant, checked pair by pair (independently of `find_clash`'s sweep).
    fn assert_sound(bytes: &[usize], offsets: &[usize], life: &[(usize, usize)], arena: usize) {
        for i in 0..bytes.len() {
            assert_eq!(offsets[i] % ALIGN, 0, "item {i} at {}", offsets[i]);
            assert!(offsets[i] + bytes[i] <= arena, "item {i} past the arena");
            for j in 0..i {
                let live = life[i].0 <= life[j].1 && life[j].0 <= life[i].1;
                let mem = bytes[i] > 0
                    && bytes[j] > 0
                    && offsets[i] < offsets[j] + bytes[j]
                    && offsets[j] < offsets[i] + bytes[i];
                assert!(
                    !(live && mem),
                    "items {j} {:?} at {}+{} and {i} {:?} at {}+{}",
                    life[j],
                    offsets[j],
                    bytes[j],
                    life[i],
                    offsets[i],
                    bytes[i]
                );
            }
        }
        assert_eq!(arena % ALIGN, 0);
        assert!(arena >= peak_live_bytes(bytes, life));
    }

    #[test]
    fn random_intervals() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for case in 0..300 {
            let n = rng.random_range(0..60);
            let steps = rng.random_range(1..40);
            let bytes: Vec<usize> = (0..n)
                .map(|_| match rng.random_range(0..10) {
                    0 => 0,
                    1..=5 => rng.random_range(1..2000),
                    _ => rng.random_range(1..40) * ALIGN,
                })
                .collect();
            let life: Vec<(usize, usize)> = (0..n)
                .map(|_| {
                    let s = rng.random_range(0..steps);
                    (s, rng.random_range(s..steps))
                })
                .collect();
            let (offsets, arena) = place(&bytes, &life);
            assert_sound(&bytes, &offsets, &life, arena);
            assert_eq!(find_clash(&bytes, &offsets, &life), None, "case {case}");
            // Deterministic.
            assert_eq!(place(&bytes, &life), (offsets.clone(), arena));
            // A clash made on purpose is found.
            if let Some((a, b)) =
                (0..n)
                    .flat_map(|a| (0..a).map(move |b| (b, a)))
                    .find(|&(a, b)| {
                        bytes[a] > 0
                            && bytes[b] > 0
                            && life[a].0 <= life[b].1
                            && life[b].0 <= life[a].1
                    })
            {
                let mut moved = offsets.clone();
                moved[b] = moved[a];
                assert!(find_clash(&bytes, &moved, &life).is_some(), "case {case}");
            }
        }
    }

    #[test]
    fn chain_reuses_memory() {
        // a -> b -> c -> d, each read only by the next: a and c, b and d may share.
        let bytes = [1024, 1024, 1024, 1024];
        let life = [(0, 1), (1, 2), (2, 3), (3, 3)];
        let (offsets, arena) = place(&bytes, &life);
        assert_sound(&bytes, &offsets, &life, arena);
        assert_eq!(arena, 2048);
        assert_eq!(peak_live_bytes(&bytes, &life), 2048);
    }

    fn lowered(config: &str, device: Device, phase: Phase, tokens: usize) -> Program {
        let plan =
            ModelPlan::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join(config)).unwrap();
        let opts = LowerOptions {
            device,
            ..LowerOptions::new(phase, tokens, LogitsMode::Last)
        };
        lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program
    }

    fn check_program(p: &Program) {
        let life = lifetimes(p);
        let bytes: Vec<usize> = p.values.iter().map(|v| v.bytes).collect();
        let offsets: Vec<usize> = p.values.iter().map(|v| v.offset).collect();
        assert_sound(&bytes, &offsets, &life, p.arena_bytes);
        assert_eq!(find_clash(&bytes, &offsets, &life), None);
        // Lifetimes agree with `last_use`: a value marked on node i ends there.
        for (n, node) in p.nodes.iter().enumerate() {
            for v in &node.last_use {
                let i = p.values.iter().position(|x| &x.name == v).unwrap();
                assert_eq!(life[i].1, n, "{v}");
            }
            // No node's outputs share bytes with its inputs.
            for o in &node.outputs {
                let o = p.value(o).unwrap();
                for x in &node.inputs {
                    let x = p.value(x).unwrap();
                    assert!(
                        o.offset >= x.offset + x.bytes || x.offset >= o.offset + o.bytes,
                        "{}: {} and {}",
                        node.name,
                        o.name,
                        x.name
                    );
                }
            }
        }
        let out = p.value(&p.output).unwrap();
        assert_eq!(out.rows, 1); // LogitsMode::Last
        let input = p.value(&p.input).unwrap();
        assert_eq!((input.rows, input.bytes), (p.tokens, 8 * p.tokens));
        assert!(p.values.iter().all(|v| v.rows == p.tokens || v.rows == 1));
    }

    #[test]
    fn real_and_tiny_programs_are_sound() {
        let real = "tests/data/configs/qwen3.8-flash-next.json";
        let tiny = "models/tiny-qwen4exp/config.json";
        for (config, device, phase, tokens) in [
            (real, Device::Cpu, Phase::Decode, 1),
            (real, Device::Cuda, Phase::Prefill, 64),
            (tiny, Device::Cpu, Phase::Decode, 1),
            (tiny, Device::Cpu, Phase::Prefill, 8),
            (tiny, Device::Cuda, Phase::Prefill, 3),
        ] {
            let p = lowered(config, device, phase, tokens);
            check_program(&p);
        }
    }

    /// A step too large to address is an error naming the value, not a wrapped size: 2^61
    /// tokens of 8-byte ids alone make 2^64 bytes.
    #[test]
    fn overflowing_sizes_are_errors() {
        let mut p = lowered(
            "models/tiny-qwen4exp/config.json",
            Device::Cpu,
            Phase::Prefill,
            8,
        );
        let planned = p.clone();
        p.tokens = 1 << 61;
        let err = run(&mut p).unwrap_err();
        let SizeError::Value { value, rows, .. } = &err else {
            panic!("{err}")
        };
        assert!(p.value(value).is_some() && *rows == 1 << 61, "{err}");
        assert!(
            err.to_string()
                .contains(&format!("value `{value}` of 2305843009213693952 rows")),
            "{err}"
        );
        // The sizes are left as they were.
        assert_eq!(p.values, planned.values);
        assert_eq!(p.arena_bytes, planned.arena_bytes);

        // Each value fits, the arena does not.
        p.tokens = 1 << 50;
        let each = sizes(&p).expect("each value fits");
        assert!(
            each.iter()
                .try_fold(0usize, |sum, s| sum.checked_add(s.1))
                .is_none(),
            "the values together must overflow for this check"
        );
        assert_eq!(run(&mut p), Err(SizeError::Arena { tokens: 1 << 50 }));
    }

    #[test]
    fn selection_bytes() {
        let p = lowered(
            "tests/data/configs/qwen3.8-flash-next.json",
            Device::Cpu,
            Phase::Prefill,
            64,
        );
        let node = p
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::IndexerSelect { .. } | Op::IndexerSelectQk { .. }))
            .unwrap();
        let (Op::IndexerSelect { budget, block, .. } | Op::IndexerSelectQk { budget, block, .. }) =
            node.op
        else {
            unreachable!()
        };
        let sel = p.value(&node.outputs[0]).unwrap();
        assert_eq!(sel.ty, ValueType::Selection);
        assert_eq!(sel.bytes, 64 * 4 * (2 + budget / block));
    }
}
