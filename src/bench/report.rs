//! The bench's report: its rows, and the text `graphrun bench` prints.

use serde::Serialize;

use super::linear_sweep;
use super::{ByteCount, ProfileRow};

#[derive(Debug, Serialize)]
pub struct DecodeRow {
    pub context: usize,
    pub ms_per_token_graphs: f64,
    /// Graphs replayed with programmatic dependent launch off (each kernel starts only after
    /// the one before it has finished), to show what the overlap gains.
    pub ms_per_token_graphs_serial: f64,
    /// Each segment's graph timed with device events over the replayed steps (ms per step).
    pub ms_per_segment: Vec<f64>,
    pub ms_per_token_eager: f64,
    /// Graphs replayed as for `ms_per_token_graphs`, each token chosen greedily on the device
    /// (`Session::greedy`: 8 bytes downloaded instead of the logits).
    pub ms_per_token_greedy: f64,
    /// Replayed, the logits downloaded and sampled on the host (temperature 0.7, top-k 50,
    /// top-p 0.9).
    pub ms_per_token_sampled: f64,
    /// The host side of replayed steps, µs a token (a pass of its own).
    pub host_us_per_token: HostRow,
    pub bytes_per_token: u64,
    /// Bytes per token over the step time, over the measured copy bandwidth (graphs on).
    pub fraction_of_copy_bandwidth: f64,
}

/// Where a replayed decode step's wall time goes on the host, µs a token
/// (`exec::cuda::executor::HostTimes`): until the graph is launched, waiting for the device,
/// downloading the logits, and outside the executor (the session and the caller).
#[derive(Debug, Default, Serialize)]
pub struct HostRow {
    pub submit: f64,
    /// Of `submit`, the host steps (the PLE rows gathered on the host, where it keeps the table).
    pub host_steps: f64,
    pub wait: f64,
    pub download: f64,
    pub outside: f64,
}

/// A step of `rows` tokens at a 1k context (MTP's verify, batched decode), replayed.
#[derive(Debug, Serialize)]
pub struct RowsRow {
    pub rows: usize,
    pub ms_per_step: f64,
    /// What the step must read when it reads each weight once (`bench::step_bytes`).
    pub mb_to_read: f64,
    /// Those bytes at the measured copy rate.
    pub ms_at_copy_rate: f64,
}

#[derive(Debug, Serialize)]
pub struct PrefillRow {
    pub prompt: usize,
    /// Tokens per step (the prompt's length when it went in one step).
    pub chunk: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// One-token linear variants by shape (`--sweep-linear`; empty otherwise).
    pub linear_sweep: Vec<linear_sweep::SweepRow>,
    pub device: String,
    /// The graphs, rules and fusions benchmarked ([`BenchOptions`]).
    pub schedule: String,
    pub layers: usize,
    /// How the routed experts are stored (`bf16`, `nvfp4`).
    pub experts: String,
    pub layer_kinds: String,
    pub weight_bytes_on_device: usize,
    /// The memory plan (`runtime::memory`): where the n-gram table went, what each part takes.
    pub memory_plan: String,
    /// Steps of T rows at a 1k context (`--step-rows`).
    pub rows_steps: Vec<RowsRow>,
    pub copy_bandwidth_gb_s: f64,
    /// Segments of the decode program (`passes::segment`: runs of nodes with no host work
    /// between them, one CUDA graph each).
    pub segments_per_decode_step: usize,
    pub decode: Vec<DecodeRow>,
    pub decode_bytes_at_largest_context: ByteCount,
    pub prefill: Vec<PrefillRow>,
    /// Decode steps at the largest context timed node by node with device events (eager launches
    /// queued behind a spinning kernel, so the kernels run back to back), by op kind and variant.
    pub decode_profile: Vec<ProfileRow>,
    /// The profile's nodes other than the routed experts (the "dense parts"): bytes over
    /// their summed time, over the copy bandwidth.
    pub dense_fraction_of_copy_bandwidth: f64,
    /// The same for the routed experts (`moe_experts` nodes).
    pub expert_fraction_of_copy_bandwidth: f64,
    /// The dense parts measured in the replayed graph rather than node by node (the per-node
    /// events add a few µs a node, which the graph does not pay): the bytes of every node but
    /// the routed experts, over (the segments' time at the largest context minus the experts'
    /// profiled time), over the copy bandwidth.
    pub dense_fraction_in_graph: f64,
    /// The same with the experts' bytes taken at the copy rate instead of their profiled time
    /// (the profile's launches one at a time are slower than the graph's, so the first measure
    /// leaves the dense parts some of the experts' time): the strictest of the bench's measures.
    pub dense_fraction_in_graph_experts_at_copy: f64,
    /// The sum of the profiled node times (ms), to compare with the replayed step's time.
    pub profiled_ms_per_step: f64,
    /// The slowest nodes of the profile, one row each.
    pub slowest_nodes: Vec<ProfileRow>,
    /// A prefill chunk (the first of a prompt) timed node by node, by op kind and variant (ms
    /// per chunk; bytes are not counted).
    pub prefill_profile: Vec<ProfileRow>,
    /// The slowest nodes of that chunk, one row each.
    pub prefill_slowest_nodes: Vec<ProfileRow>,
    /// With `--trace`: replayed decode steps at the largest context, each launch's time from
    /// its release to the next one's (`exec::cuda::trace`), averaged over the traced steps.
    pub graph_timeline: crate::exec::cuda::trace::Timeline,
    /// The timeline summed by node, then by op kind and variant as the profile is.
    pub graph_profile: Vec<ProfileRow>,
    pub graph_slowest_nodes: Vec<ProfileRow>,
    /// Every node of the timeline, slowest first, with its bytes and fraction of the copy rate
    /// (JSON only).
    pub graph_nodes: Vec<ProfileRow>,
    /// The timeline's dense parts (every node but the routed experts): bytes over their time
    /// in the graph, over the copy bandwidth.
    pub graph_dense_fraction: f64,
}

/// A decode profile's table by op and its slowest nodes.
fn write_profile(
    f: &mut std::fmt::Formatter<'_>,
    by_op: &[ProfileRow],
    slowest: &[ProfileRow],
) -> std::fmt::Result {
    writeln!(
        f,
        "  {:<24} {:>6} {:>10} {:>10} {:>10}",
        "op", "nodes", "ms/step", "MB/step", "of copy bw"
    )?;
    for r in by_op {
        writeln!(
            f,
            "  {:<24} {:>6} {:>10.3} {:>10.2} {:>10.3}",
            r.op,
            r.nodes_per_step,
            r.ms_per_step,
            r.bytes_per_step as f64 / 1e6,
            r.fraction_of_copy_bandwidth
        )?;
    }
    writeln!(f, "  slowest nodes:")?;
    for r in slowest {
        writeln!(
            f,
            "    {:<48} {:>10.4} ms {:>10.2} MB {:>8.3}",
            r.op,
            r.ms_per_step,
            r.bytes_per_step as f64 / 1e6,
            r.fraction_of_copy_bandwidth
        )?;
    }
    Ok(())
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "device: {}; copy bandwidth (read+write) {:.0} GB/s",
            self.device, self.copy_bandwidth_gb_s
        )?;
        writeln!(
            f,
            "model: real geometry, first {} layers ({}), bf16 matrices, {} routed experts, {:.1} GB on the device",
            self.layers,
            self.layer_kinds,
            self.experts,
            self.weight_bytes_on_device as f64 / 1e9
        )?;
        writeln!(f, "memory plan: {}", self.memory_plan)?;
        writeln!(f, "schedule: {}", self.schedule)?;
        writeln!(
            f,
            "decode (batch 1; {} segment(s) per step, one CUDA graph each; \"no overlap\": graphs without programmatic dependent launch):",
            self.segments_per_decode_step
        )?;
        writeln!(
            f,
            "  {:>8} {:>12} {:>12} {:>12} {:>14} {:>10}  ms per segment (graph, device events)",
            "context", "ms/tok graph", "no overlap", "ms/tok eager", "MB read/tok", "of copy bw"
        )?;
        for r in &self.decode {
            let segs: Vec<String> = r.ms_per_segment.iter().map(|m| format!("{m:.3}")).collect();
            writeln!(
                f,
                "  {:>8} {:>12.3} {:>12.3} {:>12.3} {:>14.1} {:>10.3}  [{}]",
                r.context,
                r.ms_per_token_graphs,
                r.ms_per_token_graphs_serial,
                r.ms_per_token_eager,
                r.bytes_per_token as f64 / 1e6,
                r.fraction_of_copy_bandwidth,
                segs.join(", ")
            )?;
        }
        for r in &self.decode {
            writeln!(
                f,
                "  greedy decode at {} (the id chosen on the device, 8 bytes downloaded): {:.3} ms/tok; \
                 sampled (the logits downloaded, temperature 0.7, top-k 50, top-p 0.9 on the host): \
                 {:.3} ms/tok",
                r.context, r.ms_per_token_greedy, r.ms_per_token_sampled
            )?;
        }
        for r in &self.decode {
            let h = &r.host_us_per_token;
            writeln!(
                f,
                "  host per replayed token at {}: {:.1} us until launched ({:.1} of them in host \
                 steps), {:.1} waiting for the device, {:.1} downloading the logits, {:.1} outside \
                 the executor",
                r.context, h.submit, h.host_steps, h.wait, h.download, h.outside
            )?;
        }
        let b = &self.decode_bytes_at_largest_context;
        writeln!(
            f,
            "  bytes/token at the largest context: dense weights {:.1} MB, experts {:.1} MB, embeddings {:.2} MB, recurrent state {:.1} MB, KV+indexer {:.1} MB",
            b.dense_weights as f64 / 1e6, b.expert_weights as f64 / 1e6, b.embedding_rows as f64 / 1e6, b.recurrent_state as f64 / 1e6, b.kv_and_indexer as f64 / 1e6
        )?;
        if !self.decode_profile.is_empty() {
            writeln!(
                f,
                "decode profile at the largest context (device events per node, kernels back to back): \
                 {:.3} ms/step in all; dense parts {:.3} of copy bw, routed experts {:.3}",
                self.profiled_ms_per_step,
                self.dense_fraction_of_copy_bandwidth,
                self.expert_fraction_of_copy_bandwidth
            )?;
            writeln!(
                f,
                "  dense parts in the replayed graph (segments' time minus the experts' profiled time): {:.3} of copy bw",
                self.dense_fraction_in_graph
            )?;
            writeln!(
                f,
                "  dense parts in the replayed graph, the experts at the copy rate instead (segments' time minus \
                 the experts' bytes at the copy rate): {:.3} of copy bw",
                self.dense_fraction_in_graph_experts_at_copy
            )?;
            write_profile(f, &self.decode_profile, &self.slowest_nodes)?;
        }
        if !self.graph_profile.is_empty() {
            let total: f64 = self.graph_profile.iter().map(|r| r.ms_per_step).sum();
            writeln!(
                f,
                "decode timeline in the replayed graph at the largest context (--trace: each \
                 launch from its release to the next one's, the step's end marked by an empty \
                 kernel): {total:.3} ms/step; dense parts {:.3} of copy bw (a kernel running ahead \
                 does its work before its release: it is counted in the launch before it)",
                self.graph_dense_fraction
            )?;
            write_profile(f, &self.graph_profile, &self.graph_slowest_nodes)?;
            let t = &self.graph_timeline;
            writeln!(
                f,
                "  launches over {} replays ({} consecutive pairs released out of order): us from \
                 release to the next release, us block 0 waited; then the first replay's record \
                 (ns from its first release: arrived, released; SM)",
                t.replays, t.out_of_order
            )?;
            for (l, r) in t.launches.iter().zip(&t.first_replay) {
                writeln!(
                    f,
                    "    {:<64} {:>5} blocks {:>8} {:>8.2}   {:>8} {:>8} sm{}",
                    l.label,
                    l.blocks,
                    l.us.map_or("-".to_string(), |u| format!("{u:.2}")),
                    l.waited_us,
                    r.arrived_ns,
                    r.released_ns,
                    r.sm
                )?;
            }
        }
        if !self.rows_steps.is_empty() {
            let one = self
                .rows_steps
                .iter()
                .find(|r| r.rows == 1)
                .map(|r| r.ms_per_step);
            writeln!(
                f,
                "steps of T rows at a 1k context (replayed; bytes: each weight once, the rows' experts' expected union):"
            )?;
            writeln!(
                f,
                "  {:>4} {:>10} {:>12} {:>14} {:>16} {:>10}",
                "T", "ms/step", "ms/row", "MB to read", "ms at copy rate", "vs T=1"
            )?;
            for r in &self.rows_steps {
                let ratio = one.map_or(String::from("-"), |o| format!("{:.2}", r.ms_per_step / o));
                writeln!(
                    f,
                    "  {:>4} {:>10.3} {:>12.3} {:>14.1} {:>16.3} {:>10}",
                    r.rows,
                    r.ms_per_step,
                    r.ms_per_step / r.rows as f64,
                    r.mb_to_read,
                    r.ms_at_copy_rate,
                    ratio
                )?;
            }
        }
        writeln!(f, "prefill:")?;
        for r in &self.prefill {
            let steps = if r.chunk >= r.prompt {
                "in one step".to_string()
            } else {
                format!("in chunks of {}", r.chunk)
            };
            writeln!(
                f,
                "  {:>6} tokens {steps}: {:.3} s, {:.0} tokens/s",
                r.prompt, r.seconds, r.tokens_per_second
            )?;
        }
        if !self.prefill_profile.is_empty() {
            let total: f64 = self.prefill_profile.iter().map(|r| r.ms_per_step).sum();
            writeln!(
                f,
                "prefill profile, the first prompt's first step (device events per node): {total:.1} ms in all"
            )?;
            for r in &self.prefill_profile {
                writeln!(
                    f,
                    "  {:<24} {:>6} {:>10.3} ms",
                    r.op, r.nodes_per_step, r.ms_per_step
                )?;
            }
            writeln!(f, "  slowest nodes:")?;
            for r in &self.prefill_slowest_nodes {
                writeln!(f, "    {:<48} {:>10.4} ms", r.op, r.ms_per_step)?;
            }
        }
        if !self.linear_sweep.is_empty() {
            writeln!(
                f,
                "one-token linear and hyper-connection read variants, each shape's launches back to back (* the variant the rules give it):"
            )?;
            writeln!(
                f,
                "  {:<34} {:>14} {:<14} {:>10} {:>10}",
                "kernel", "k->n", "variant", "µs", "of copy bw"
            )?;
            for r in &self.linear_sweep {
                writeln!(
                    f,
                    "  {:<34} {:>14} {:<14} {:>10.2} {:>10.3}{}",
                    r.kernel,
                    format!("{}->{}", r.k, r.n),
                    r.variant,
                    r.us_per_launch,
                    r.fraction_of_copy_bandwidth,
                    if r.chosen { " *" } else { "" }
                )?;
            }
            writeln!(f, "rules these timings propose (for graphs/rules.ron):")?;
            write!(f, "{}", linear_sweep::proposed_rules(&self.linear_sweep))?;
        }
        Ok(())
    }
}
