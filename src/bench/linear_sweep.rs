//! Every one-token linear variant (`launch::linear::OneToken`) on every one-token matrix shape of
//! the decode program, and every variant of the fused hyper-connection read
//! (`launch::layout::HcReadAct`), each timed alone: which variant a shape should take, from
//! measurement. [`proposed_rules`] writes what the timings imply as rules for `graphs/rules.ron`.
//!
//! A shape's launches run back to back (queued behind a spinning kernel, with programmatic
//! launch as in a step) over enough copies of the matrix that none is still in L2 when it comes
//! round again, into one reused output buffer.

use std::collections::BTreeSet;

use serde::Serialize;

use super::fraction;
use crate::error::Result;
use crate::exec::cuda::launch::layout::{hc_read, HcReadAct};
use crate::exec::cuda::launch::linear::{
    linear_group, linear_hc_write, linear_one_token, GroupKernel, OneToken,
};
use crate::exec::cuda::launch::{self, DeviceMatrix};
use crate::exec::cuda::{CudaError, Gpu, Launch};
use crate::ir::{Op, Program};

#[derive(Debug, Serialize)]
pub struct SweepRow {
    /// The op kind timed (`linear`, `linear_hc_write`, `linear_group`, `hc_read`), or a
    /// measurement that is no op's (`read ceiling`).
    pub op: String,
    /// What was timed, with its shape.
    pub kernel: String,
    pub k: usize,
    pub n: usize,
    /// The variant as rules name it (`rows1`, `group1_g2u2`, `parts1_stream`, `s2`...), or what
    /// else was timed (`separate launches`, `4 blocks/SM`).
    pub variant: String,
    pub us_per_launch: f64,
    pub fraction_of_copy_bandwidth: f64,
    /// The variant the rules give this shape's nodes today.
    pub chosen: bool,
}

/// Bytes of matrix copies cycled per shape: several times the H200's 50 MB L2.
const ROTATION_BYTES: usize = 512 << 20;
const LAUNCHES: usize = 48;
const STREAMS: usize = 4;

/// Blocks a multiprocessor the read ceiling is timed with (of 256 threads: 8 fill an H200's SM).
const READ_CEILING_BLOCKS: [usize; 2] = [4, 8];

/// The read ceiling: kernels that only read the matrices of `sets` (`launch::read_bytes`), with
/// the bytes a launch reads over the copy bandwidth (the copy both reads and writes, so a pure
/// read may exceed 1): how near a one-token linear of these matrices could come to memory's
/// limit.
fn read_ceiling(cx: &Launch, sets: &[Vec<DeviceMatrix>], bandwidth: f64) -> Result<Vec<SweepRow>> {
    let m = &sets[0][0];
    let bytes = m.bytes();
    let out = std::cell::RefCell::new(cx.zeros::<u32>(1, "the read ceiling's word")?);
    let mut rows = Vec::new();
    for blocks in READ_CEILING_BLOCKS {
        let us = time_back_to_back(cx, LAUNCHES.max(sets.len()), &|i| {
            launch::read_bytes(cx, &mut out.borrow_mut(), &sets[i % sets.len()][0], blocks)
        })?;
        rows.push(SweepRow {
            op: "read ceiling".to_string(),
            kernel: "read ceiling".to_string(),
            k: 0,
            n: bytes,
            variant: format!("{blocks} blocks/SM"),
            us_per_launch: us,
            fraction_of_copy_bandwidth: fraction(bytes as u64, us / 1e3, bandwidth),
            chosen: false,
        });
    }
    Ok(rows)
}

/// The (fused with the residual write?, k, n) of each one-token linear node of `program`.
fn shapes(program: &Program) -> BTreeSet<(bool, usize, usize)> {
    let width = |name: &str| program.value(name).map_or(0, |v| v.width);
    let mut out = BTreeSet::new();
    for node in &program.nodes {
        match &node.op {
            Op::Linear => {
                out.insert((false, width(&node.inputs[0]), width(&node.outputs[0])));
            }
            Op::LinearHcWrite { streams } => {
                let n = width(&node.outputs[0]) / (*streams).max(1);
                out.insert((true, width(&node.inputs[2]), n));
            }
            _ => {}
        }
    }
    out
}

fn elapsed_us(
    a: &cudarc::driver::CudaEvent,
    b: &cudarc::driver::CudaEvent,
) -> std::result::Result<f64, CudaError> {
    a.elapsed_ms(b)
        .map(|ms| f64::from(ms) * 1e3)
        .map_err(|e| CudaError::driver("reading a timing event", None, e))
}

fn event(cx: &Launch) -> std::result::Result<cudarc::driver::CudaEvent, CudaError> {
    cx.stream
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| CudaError::driver("recording a timing event", None, e))
}

/// The (k, [n_p]) of each `LinearGroup` node of `program`.
fn group_shapes(program: &Program) -> BTreeSet<(usize, Vec<usize>)> {
    let width = |name: &str| program.value(name).map_or(0, |v| v.width);
    program
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::LinearGroup { .. }))
        .map(|n| {
            (
                width(&n.inputs[0]),
                n.outputs.iter().map(|o| width(o)).collect(),
            )
        })
        .collect()
}

/// Times `launches` calls of `once(i)` back to back (queued behind a spinning kernel): µs each.
fn time_back_to_back(
    cx: &Launch,
    launches: usize,
    once: &dyn Fn(usize) -> std::result::Result<(), CudaError>,
) -> std::result::Result<f64, CudaError> {
    once(0)?;
    cx.sync("a sweep warm-up")?;
    launch::hold_gpu(cx, 20_000_000)?;
    let start = event(cx)?;
    for i in 0..launches {
        once(i)?;
    }
    let end = event(cx)?;
    cx.sync("a sweep")?;
    Ok(elapsed_us(&start, &end)? / launches as f64)
}

/// Enough copies of random bf16 matrices `[n_p, k]` (a set of parts a copy) that cycling
/// through them, no copy is still in L2 when it comes round again.
fn rotating_sets(cx: &Launch, k: usize, ns: &[usize]) -> Result<Vec<Vec<DeviceMatrix>>> {
    let bytes: usize = ns.iter().map(|n| n * k * 2).sum();
    let copies = ROTATION_BYTES.div_ceil(bytes.max(1)).clamp(2, 64);
    let mut sets = Vec::with_capacity(copies);
    for c in 0..copies {
        let mut set = Vec::with_capacity(ns.len());
        for (p, &n) in ns.iter().enumerate() {
            let mut m = DeviceMatrix::Bf16(cx.zeros::<u16>(n * k, "a sweep matrix")?);
            launch::fill_uniform(cx, &mut m, (c * 8 + p) as u64, -0.05, 0.05)?;
            set.push(m);
        }
        sets.push(set);
    }
    Ok(sets)
}

/// `bytes` of device memory as the scratch pool the launchers' outputs come from, reused by
/// every launch (a fresh allocation would be a stream operation between the kernels); keep the
/// returned buffer alive while it is the pool.
fn output_pool(cx: &Launch, bytes: usize) -> Result<cudarc::driver::CudaSlice<u8>> {
    use cudarc::driver::DevicePtr as _;
    let out = cx.zeros::<u8>(bytes, "the sweep output")?;
    cx.set_scratch_pool(Some((out.device_ptr(&cx.stream).0, out.len())));
    Ok(out)
}

/// Each sibling group of the program in one launch, by blocks and streamed (`linear_group_with`;
/// the launcher's choice starred), and as separate launches (each part with its own variant), over
/// rotating copies of the matrices.
fn groups(cx: &Launch, program: &Program, bandwidth: f64) -> Result<Vec<SweepRow>> {
    let chosen_of = |k: usize, total: usize| chosen_variant(program, "linear_group", k, total);
    let mut rows = Vec::new();
    for (k, ns) in group_shapes(program) {
        let bytes: usize = ns.iter().map(|n| n * k * 2).sum();
        if bytes == 0 {
            continue;
        }
        let sets = rotating_sets(cx, k, &ns)?;
        let copies = sets.len();
        let x = cx.zeros::<f32>(k, "a sweep input")?;
        let total: usize = ns.iter().sum();
        let _pool = output_pool(cx, total * 4 + 256 * ns.len())?;
        let launches = LAUNCHES.max(copies);
        let one_launch = |how| {
            time_back_to_back(cx, launches, &|i| {
                cx.reset_scratch();
                let refs: Vec<&DeviceMatrix> = sets[i % copies].iter().collect();
                linear_group(cx, &x, &refs, 1, how).map(drop)
            })
        };
        let blocks = one_launch(GroupKernel::Blocks)?;
        let refs: Vec<&DeviceMatrix> = sets[0].iter().collect();
        let chosen = chosen_of(k, total);
        let streamed = if GroupKernel::Streamed.takes(cx, &x, &refs) {
            Some(one_launch(GroupKernel::Streamed)?)
        } else {
            None
        };
        let separate = time_back_to_back(cx, launches, &|i| {
            cx.reset_scratch();
            for (m, &n) in sets[i % copies].iter().zip(&ns) {
                linear_one_token(cx, &x, m, k, n, separate_part(program, k, n))?;
            }
            Ok(())
        })?;
        cx.set_scratch_pool(None);
        let shape = ns
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join("+");
        let rows_of = [
            Some(("parts1", blocks)),
            streamed.map(|us| ("parts1_stream", us)),
            Some(("separate launches", separate)),
        ];
        for (variant, us) in rows_of.into_iter().flatten() {
            rows.push(SweepRow {
                op: "linear_group".to_string(),
                kernel: format!("linear_group {shape}"),
                k,
                n: total,
                variant: variant.to_string(),
                us_per_launch: us,
                fraction_of_copy_bandwidth: fraction(bytes as u64, us / 1e3, bandwidth),
                chosen: chosen.as_deref() == Some(variant),
            });
        }
    }
    Ok(rows)
}

/// The variant the program gives its `op` nodes of rows `k` wide and `n` outputs (the first such
/// node's; nodes of one shape get one variant from shape rules).
fn chosen_variant(program: &Program, op: &str, k: usize, n: usize) -> Option<String> {
    let width = |name: &str| program.value(name).map_or(0, |v| v.width);
    program.nodes.iter().find_map(|node| {
        let (nk, nn) = match &node.op {
            Op::Linear => (width(&node.inputs[0]), width(&node.outputs[0])),
            Op::LinearHcWrite { streams } => (
                width(&node.inputs[2]),
                width(&node.outputs[0]) / (*streams).max(1),
            ),
            Op::LinearGroup { .. } => (
                width(&node.inputs[0]),
                node.outputs.iter().map(|o| width(o)).sum(),
            ),
            Op::HcRead { .. } => (
                width(&node.inputs[0]),
                program
                    .weights
                    .iter()
                    .find(|w| w.name == node.weights[1])
                    .and_then(|w| w.shape.first().copied())
                    .unwrap_or(0),
            ),
            _ => return None,
        };
        (node.op.kind() == op && (nk, nn) == (k, n)).then(|| node.variant.clone())
    })
}

/// The one-token variant a part of a group would get as a plain linear of its shape (what the
/// rules give a linear of that shape in the program, else a warp per row).
fn separate_part(program: &Program, k: usize, n: usize) -> OneToken {
    chosen_variant(program, "linear", k, n)
        .and_then(|v| OneToken::from_variant(&v))
        .unwrap_or(OneToken::WarpPerRow)
}

/// The rules the sweep's timings imply: for each op and shape timed, the fastest variant as a
/// rule for exactly that shape (priority 100, above `graphs/rules.ron`'s), to paste into the
/// file. Shapes whose fastest variant is today's choice are written as comments.
pub fn proposed_rules(rows: &[SweepRow]) -> String {
    let mut shapes: Vec<(&str, usize, usize)> = rows
        .iter()
        .filter(|r| r.op != "read ceiling")
        .map(|r| (r.op.as_str(), r.k, r.n))
        .collect();
    shapes.dedup();
    let mut out = String::from(
        "// Proposed by `graphrun bench --sweep-linear`: the fastest variant of each one-token shape timed.
",
    );
    for (op, k, n) in shapes {
        let timed: Vec<&SweepRow> = rows
            .iter()
            .filter(|r| (r.op.as_str(), r.k, r.n) == (op, k, n))
            .collect();
        let Some(best) = timed
            .iter()
            .min_by(|a, b| a.us_per_launch.total_cmp(&b.us_per_launch))
        else {
            continue;
        };
        let times = timed
            .iter()
            .map(|r| format!("{} {:.1}", r.variant, r.us_per_launch))
            .collect::<Vec<_>>()
            .join(", ");
        let (kn, dims) = match op {
            "hc_read" => ("width", "rank"),
            _ => ("k", "n"),
        };
        let rule = format!(
            "(name: \"{op}.sweep_{kn}{k}_{dims}{n}\", doc: \"one token, {kn} {k}, {dims} {n}: {times} us\", op: \"{op}\", when: (device: Cuda, tokens: (max: 1), dims: {{\"{kn}\": (min: {k}, max: {k}), \"{dims}\": (min: {n}, max: {n})}}), variant: \"{}\", priority: 100),",
            best.variant
        );
        if best.variant == "separate launches" {
            out.push_str(&format!(
                "// {op} {kn} {k} {dims} {n}: separate launches are fastest ({times} us): drop the grouping for it (groups.ron)\n"
            ));
        } else if best.chosen {
            out.push_str(&format!("// today's choice is fastest: {rule}\n"));
        } else {
            out.push_str(&format!("{rule}\n"));
        }
    }
    out
}

/// The (width C*H, rank R, streams C, norm length) of each `HcRead` node of `program`.
fn hc_read_shapes(program: &Program) -> BTreeSet<(usize, usize, usize, usize)> {
    let width = |name: &str| program.value(name).map_or(0, |v| v.width);
    let shape = |name: &str| {
        program
            .weights
            .iter()
            .find(|w| w.name == name)
            .map(|w| w.shape.clone())
    };
    program
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            // The exit's read (no injection) has a layer read's shape: swept with the gains.
            Op::HcRead { streams, .. } => {
                let rank = shape(&n.weights[1])?.first().copied()?;
                let norm = shape(&n.weights[0])?.iter().product();
                Some((width(&n.inputs[0]), rank, streams, norm))
            }
            _ => None,
        })
        .collect()
}

/// The fused hyper-connection read (both kernels) with each first-kernel variant, over rotating
/// copies of its three matrices.
fn hc_reads(cx: &Launch, program: &Program, bandwidth: f64) -> Result<Vec<SweepRow>> {
    let mut rows = Vec::new();
    for (width, rank, streams, norm_len) in hc_read_shapes(program) {
        if width == 0 || rank == 0 || streams == 0 {
            continue;
        }
        let bytes = (2 * rank + streams) * width * 2;
        // [down; inject] share k = width; up is [width, rank].
        let row_sets = rotating_sets(cx, width, &[rank, streams])?;
        let up_sets = rotating_sets(cx, rank, &[width])?;
        let h = cx.zeros::<f32>(width, "a sweep residual")?;
        let norm = cx.zeros::<f32>(norm_len, "a sweep norm")?;
        let _pool = output_pool(cx, (rank + 2 * streams + width / streams) * 4 + 1024)?;
        let chosen = chosen_variant(program, "hc_read", width, rank);
        let launches = LAUNCHES.max(row_sets.len()).max(up_sets.len());
        for v in HcReadAct::ALL {
            let us = time_back_to_back(cx, launches, &|i| {
                cx.reset_scratch();
                let (d, u) = (&row_sets[i % row_sets.len()], &up_sets[i % up_sets.len()]);
                hc_read(
                    cx,
                    &h,
                    &norm,
                    &d[0],
                    &u[0],
                    Some(&d[1]),
                    1,
                    streams,
                    1e-6,
                    v,
                )
                .map(drop)
            })?;
            rows.push(SweepRow {
                op: "hc_read".to_string(),
                kernel: "hc_read (act + gate)".to_string(),
                k: width,
                n: rank,
                variant: v.name(),
                us_per_launch: us,
                fraction_of_copy_bandwidth: fraction(bytes as u64, us / 1e3, bandwidth),
                chosen: chosen.as_deref() == Some(v.name().as_str()),
            });
        }
        cx.set_scratch_pool(None);
    }
    Ok(rows)
}

pub fn run(gpu: &Gpu, program: &Program, bandwidth: f64) -> Result<Vec<SweepRow>> {
    let mut rows = Vec::new();
    let cx = &Launch::new(gpu).with_programmatic_launch(true);
    let all = shapes(program);
    // The read ceiling is timed over the largest plain linear's matrices.
    let largest = all
        .iter()
        .filter(|(fused, ..)| !fused)
        .max_by_key(|(_, k, n)| k * n)
        .copied()
        .unwrap_or_default();
    for (fused, k, n) in all {
        if k == 0 || n == 0 {
            continue;
        }
        let bytes = n * k * 2;
        let sets = rotating_sets(cx, k, &[n])?;
        let copies = sets.len();
        let x = cx.zeros::<f32>(k, "a sweep input")?;
        let h = cx.zeros::<f32>(STREAMS * n, "a sweep residual")?;
        let inj = cx.zeros::<f32>(STREAMS, "a sweep gain")?;
        let _pool = output_pool(cx, STREAMS * n * 4 + 256)?;
        let op = if fused { "linear_hc_write" } else { "linear" };
        let chosen = chosen_variant(program, op, k, n);
        let linear_only = OneToken::LINEAR_ONLY
            .into_iter()
            .filter(|v| !fused && v.takes(cx, &x, &sets[0][0]));
        for v in OneToken::ALL.into_iter().chain(linear_only) {
            let us = time_back_to_back(cx, LAUNCHES.max(copies), &|i| {
                cx.reset_scratch();
                let m = &sets[i % copies][0];
                if fused {
                    linear_hc_write(cx, &h, &inj, &x, m, 1, STREAMS, Some(v)).map(drop)
                } else {
                    linear_one_token(cx, &x, m, k, n, v).map(drop)
                }
            })?;
            rows.push(SweepRow {
                op: op.to_string(),
                kernel: op.to_string(),
                k,
                n,
                variant: v.variant(),
                us_per_launch: us,
                fraction_of_copy_bandwidth: fraction(bytes as u64, us / 1e3, bandwidth),
                chosen: chosen.as_deref() == Some(v.variant().as_str()),
            });
        }
        cx.set_scratch_pool(None);
        if (fused, k, n) == largest {
            rows.extend(read_ceiling(cx, &sets, bandwidth)?);
        }
    }
    rows.extend(groups(cx, program, bandwidth)?);
    rows.extend(hc_reads(cx, program, bandwidth)?);
    Ok(rows)
}
