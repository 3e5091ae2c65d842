//! Per-node times (device-event profiles, traced timelines) summed by op kind and variant, and
//! set against the bytes the nodes read and the copy bandwidth.

use serde::Serialize;

use crate::ir::{Op, Program};

use super::bytes::{node_bytes, total};

/// Nodes listed one by one in the profile.
const SLOWEST_NODES: usize = 16;

#[derive(Clone, Debug, Serialize)]
pub struct ProfileRow {
    /// `kind` or `kind/variant` when the variant is not the reference.
    pub op: String,
    pub nodes_per_step: usize,
    pub ms_per_step: f64,
    pub bytes_per_step: u64,
    pub fraction_of_copy_bandwidth: f64,
}

/// A per-node profile (node name, steps, seconds) summed by op kind and variant, with the slowest
/// nodes, and the (bytes, ms) of the routed experts and of everything else.
#[derive(Default)]
pub(super) struct Profile {
    pub(super) by_op: Vec<ProfileRow>,
    pub(super) slowest: Vec<ProfileRow>,
    /// Every node, slowest first (`slowest` is its head).
    pub(super) every_node: Vec<ProfileRow>,
    pub(super) dense: (u64, f64),
    pub(super) experts: (u64, f64),
}

/// `bytes` over `ms`, over the copy bandwidth (GB/s); 0 when nothing was timed.
pub(super) fn fraction(bytes: u64, ms: f64, bandwidth: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms / 1e3) / (bandwidth * 1e9)
    } else {
        0.0
    }
}

/// Milliseconds `bytes` take at the copy rate (GB/s).
pub(super) fn copy_ms(bytes: u64, bandwidth: f64) -> f64 {
    bytes as f64 / (bandwidth * 1e9) * 1e3
}

/// The dense parts' fraction of the copy rate inside the replayed segments: their bytes over the
/// segments' time less the time charged to the experts.
pub(super) fn dense_share(
    dense_bytes: u64,
    segments_ms: f64,
    experts_ms: f64,
    bandwidth: f64,
) -> f64 {
    fraction(dense_bytes, (segments_ms - experts_ms).max(0.0), bandwidth)
}

impl Profile {
    /// Bytes are counted as a decode step at `context` reads them ([`node_bytes`]); `None`
    /// counts none (a prefill chunk, where the time is not the bytes').
    pub(super) fn collect(
        program: &Program,
        nodes: &[(String, usize, f64)],
        context: Option<usize>,
        bandwidth: f64,
    ) -> Profile {
        let mut p = Profile::default();
        for (name, steps, secs) in nodes {
            let Some(node) = program.nodes.iter().find(|n| &n.name == name) else {
                continue;
            };
            let op = if node.variant == "reference" {
                node.op.kind().to_string()
            } else {
                format!("{}/{}", node.op.kind(), node.variant)
            };
            let bytes = context.map_or(0, |c| total(&node_bytes(program, node, c)));
            let ms = secs * 1e3 / (*steps).max(1) as f64;
            let part = if matches!(node.op, Op::MoeExperts { .. }) {
                &mut p.experts
            } else {
                &mut p.dense
            };
            part.0 += bytes;
            part.1 += ms;
            p.slowest.push(ProfileRow {
                op: format!("{name} ({op})"),
                nodes_per_step: 1,
                ms_per_step: ms,
                bytes_per_step: bytes,
                fraction_of_copy_bandwidth: 0.0,
            });
            match p.by_op.iter_mut().find(|r| r.op == op) {
                Some(r) => {
                    r.nodes_per_step += 1;
                    r.ms_per_step += ms;
                    r.bytes_per_step += bytes;
                }
                None => p.by_op.push(ProfileRow {
                    op,
                    nodes_per_step: 1,
                    ms_per_step: ms,
                    bytes_per_step: bytes,
                    fraction_of_copy_bandwidth: 0.0,
                }),
            }
        }
        for r in p.by_op.iter_mut().chain(p.slowest.iter_mut()) {
            r.fraction_of_copy_bandwidth = fraction(r.bytes_per_step, r.ms_per_step, bandwidth);
        }
        p.by_op
            .sort_by(|a, b| b.ms_per_step.total_cmp(&a.ms_per_step));
        p.slowest
            .sort_by(|a, b| b.ms_per_step.total_cmp(&a.ms_per_step));
        p.every_node = p.slowest.clone();
        p.slowest.truncate(SLOWEST_NODES);
        p
    }
}

/// A traced timeline summed by node (its launches are labelled "node kernel"), then profiled as
/// device-event profiles are ([`Profile::collect`]); the end mark and any label that names no
/// node of `program` are left out.
pub(super) fn timeline_profile(
    program: &Program,
    timeline: &crate::exec::cuda::trace::Timeline,
    context: Option<usize>,
    bandwidth: f64,
) -> Profile {
    let mut nodes: Vec<(String, usize, f64)> = Vec::new();
    for l in &timeline.launches {
        let (Some(us), Some(node)) = (l.us, l.label.split(' ').next()) else {
            continue;
        };
        match nodes.iter_mut().find(|n| n.0 == node) {
            Some(n) => n.2 += us / 1e6,
            None => nodes.push((node.to_string(), 1, us / 1e6)),
        }
    }
    Profile::collect(program, &nodes, context, bandwidth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::bench_plan;
    use crate::exec::cuda::trace::{LaunchTime, Timeline};
    use crate::ir::{LogitsMode, Phase};

    /// Segments at exactly the copy rate give 1 when the experts are charged their bytes at the
    /// copy rate; charging them more time (a slow profile) raises the dense share.
    #[test]
    fn dense_share_charges_the_experts_as_asked() {
        let (dense, experts, bw) = (3_000_000_000u64, 1_000_000_000u64, 4000.0);
        let segments = copy_ms(dense + experts, bw);
        assert!((copy_ms(experts, bw) - 0.25).abs() < 1e-12);
        let strict = dense_share(dense, segments, copy_ms(experts, bw), bw);
        assert!((strict - 1.0).abs() < 1e-9, "{strict}");
        let lenient = dense_share(dense, segments, 2.0 * copy_ms(experts, bw), bw);
        assert!((lenient - 1.5).abs() < 1e-9, "{lenient}");
        assert_eq!(dense_share(dense, 0.1, 0.2, bw), 0.0);
    }

    fn launch(label: &str, us: Option<f64>) -> LaunchTime {
        LaunchTime {
            label: label.into(),
            blocks: 1,
            us,
            waited_us: 0.0,
        }
    }

    /// A timeline's launches are summed by node (a node of two kernels counts both), split into
    /// the routed experts and the dense rest, and the end mark is left out.
    #[test]
    fn a_timeline_is_profiled_by_node() {
        let text = include_str!("../../tests/data/configs/qwen3.8-flash-next.json");
        let plan = bench_plan(text, "qwen3.8-flash-next.json", Some(1), Some(1009)).unwrap();
        let graphs = crate::lower::GraphSet::embedded().unwrap();
        let mut opts = crate::lower::LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
        opts.device = crate::ir::Device::Cuda;
        opts.weight_dtype = Some("bf16".into());
        let program = crate::lower::lower(&plan, &graphs, &opts).unwrap().program;
        let routed = program
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::MoeExperts { .. }))
            .unwrap()
            .name
            .clone();
        let dense = program.nodes[0].name.clone();
        let timeline = Timeline {
            replays: 1,
            launches: vec![
                launch(&format!("{dense} k0"), Some(2.0)),
                launch(&format!("{routed} gate_up"), Some(10.0)),
                launch(&format!("{routed} down"), Some(5.0)),
                launch("end trace_end", None),
            ],
            out_of_order: 0,
            first_replay: Vec::new(),
        };
        let p = timeline_profile(&program, &timeline, Some(1024), 4000.0);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(p.experts.1, 0.015), "{:?}", p.experts);
        assert!(close(p.dense.1, 0.002), "{:?}", p.dense);
        assert_eq!(p.every_node.len(), 2);
        assert_eq!(
            p.every_node[0].op,
            format!("{routed} (moe_experts/token_major_rows)")
        );
        assert!(p.experts.0 > 0 && p.dense.0 > 0);
    }
}
