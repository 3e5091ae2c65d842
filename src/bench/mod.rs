//! `graphrun bench`: decode and prefill at the real Qwen3.8-Flash-Next geometry on a CUDA
//! device, with random weights generated on the device, reported against the device's measured
//! copy bandwidth.
//!
//! What is real: every dimension of the config (H 2560, 4 streams, GDN 16/48 heads of 128, QSA
//! 24/2 heads of 256 with its indexer, 512 experts top-10 with I 640, the vocabulary), bf16
//! matrices. What is cut, and why: `--layers N` keeps the first N layers so that bf16 experts
//! (5 GB a layer) fit; the PLE n-gram table is built from a smaller prime base (it is gathered,
//! 16 rows a token, so its size changes memory, not bytes read).

use std::time::Instant;

use serde::Serialize;

pub mod linear_sweep;

use crate::error::{Error, Result};
use crate::exec::cuda::executor::CudaExecutor;
use crate::exec::cuda::launch::DeviceMatrix;
use crate::exec::cuda::Gpu;
use crate::ir::{LogitsMode, Node, Op, Phase, Program, StateKind};
use crate::plan::ModelPlan;
use crate::runtime::{Model, ModelOptions, Session};

/// A sequence on the CUDA executor, whose instrumentation the bench sets and reads.
type CudaSession<'m> = Session<'m, CudaExecutor<'m>>;

pub struct BenchOptions {
    /// Also time every one-token linear variant on every one-token matrix shape.
    pub sweep_linear: bool,
    /// Graph files, rule overrides and fusions to benchmark with (the model options' fields of
    /// the same names; the rest of the options are the bench's own).
    pub graphs_dir: Option<std::path::PathBuf>,
    pub overrides: Vec<crate::passes::schedule::RuleOverride>,
    pub fusions: Option<Vec<String>>,
    /// Op kinds whose nodes every step launches twice (`ModelOptions::cuda_launch_twice`):
    /// the decode times then include those nodes' marginal cost a second time. For measurement:
    /// the model's results are not what is timed.
    pub launch_twice: Vec<String>,
    /// Also trace replayed decode steps at the largest context launch by launch
    /// (`exec::cuda::trace`; the kernels are then built with the trace's records, which cost
    /// every launch a few clock reads and one atomic).
    pub trace: bool,
    pub layers: usize,
    pub contexts: Vec<usize>,
    pub prefills: Vec<usize>,
    pub decode_steps: usize,
    /// Prefill tokens per step; 0: each prompt in one step (as `graphrun run` prefills).
    pub chunk: usize,
    pub ple_vocab_base: u64,
    pub seed: u64,
}

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
    pub wait: f64,
    pub download: f64,
    pub outside: f64,
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
pub struct ByteCount {
    pub dense_weights: u64,
    pub expert_weights: u64,
    pub embedding_rows: u64,
    pub recurrent_state: u64,
    pub kv_and_indexer: u64,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// One-token linear variants by shape (`--sweep-linear`; empty otherwise).
    pub linear_sweep: Vec<linear_sweep::SweepRow>,
    pub device: String,
    /// The graphs, rules and fusions benchmarked ([`BenchOptions`]).
    pub schedule: String,
    pub layers: usize,
    pub layer_kinds: String,
    pub weight_bytes_on_device: usize,
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

/// Nodes listed one by one in the profile.
const SLOWEST_NODES: usize = 16;

/// Launch records the trace buffer holds (`--trace`): `TRACED_STEPS` decode steps of a few
/// hundred launches each fit.
const TRACE_CAPACITY: usize = 1 << 16;
const TRACED_STEPS: usize = 32;

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
struct Profile {
    by_op: Vec<ProfileRow>,
    slowest: Vec<ProfileRow>,
    /// Every node, slowest first (`slowest` is its head).
    every_node: Vec<ProfileRow>,
    dense: (u64, f64),
    experts: (u64, f64),
}

/// `bytes` over `ms`, over the copy bandwidth (GB/s); 0 when nothing was timed.
fn fraction(bytes: u64, ms: f64, bandwidth: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms / 1e3) / (bandwidth * 1e9)
    } else {
        0.0
    }
}

/// Milliseconds `bytes` take at the copy rate (GB/s).
fn copy_ms(bytes: u64, bandwidth: f64) -> f64 {
    bytes as f64 / (bandwidth * 1e9) * 1e3
}

/// The dense parts' fraction of the copy rate inside the replayed segments: their bytes over the
/// segments' time less the time charged to the experts.
fn dense_share(dense_bytes: u64, segments_ms: f64, experts_ms: f64, bandwidth: f64) -> f64 {
    fraction(dense_bytes, (segments_ms - experts_ms).max(0.0), bandwidth)
}

impl Profile {
    /// Bytes are counted as a decode step at `context` reads them ([`node_bytes`]); `None`
    /// counts none (a prefill chunk, where the time is not the bytes').
    fn collect(
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
fn timeline_profile(
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

/// The real config cut to its first `layers` layers, with a smaller PLE table.
pub fn bench_plan(
    config_text: &str,
    origin: &str,
    layers: usize,
    ple_vocab_base: u64,
) -> Result<ModelPlan> {
    let mut v: serde_json::Value =
        serde_json::from_str(config_text).map_err(|e| Error::Input(format!("{origin}: {e}")))?;
    let text = if v.get("text_config").is_some() {
        &mut v["text_config"]
    } else {
        &mut v
    };
    let total = text["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
    if layers == 0 || layers > total {
        return Err(Error::Input(format!(
            "--layers {layers}: the config has {total} layers"
        )));
    }
    text["num_hidden_layers"] = layers.into();
    if let Some(types) = text["layer_types"].as_array().cloned() {
        text["layer_types"] = serde_json::Value::Array(types.into_iter().take(layers).collect());
    }
    if let Some(ids) = text["ple_layer_ids"].as_array().cloned() {
        let kept: Vec<serde_json::Value> = ids
            .into_iter()
            .filter(|i| i.as_u64().is_some_and(|i| i as usize <= layers))
            .collect();
        text["ple_layer_ids"] = serde_json::Value::Array(kept);
    }
    text["ngram_vocab_size_base"] = ple_vocab_base.into();
    Ok(ModelPlan::from_json_str(&v.to_string(), origin)?)
}

/// Device-to-device copy bandwidth, counting bytes read plus bytes written.
fn copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let n = 512usize << 20; // 2 GiB of f32
    let src = DeviceMatrix::F32(gpu.zeros::<f32>(n, "copy source")?);
    let mut dst = gpu.zeros::<f32>(n, "copy destination")?;
    let DeviceMatrix::F32(src) = src else {
        unreachable!()
    };
    let copy = |dst: &mut cudarc::driver::CudaSlice<f32>| {
        gpu.stream
            .memcpy_dtod(&src, dst)
            .map_err(|e| crate::exec::cuda::CudaError::driver("copying", None, e))
    };
    copy(&mut dst)?;
    gpu.sync("the copy warm-up")?;
    let reps = 10;
    let t = Instant::now();
    for _ in 0..reps {
        copy(&mut dst)?;
    }
    gpu.sync("the copy benchmark")?;
    let secs = t.elapsed().as_secs_f64();
    Ok((2 * n * 4 * reps) as f64 / secs / 1e9)
}

/// Bytes a decode step reads at `context`, counted from the program: weights (matrices at their
/// device width, experts only the chosen k of E, embeddings only the gathered rows), recurrent
/// and conv state (read and written), KV and indexer keys actually visited.
pub fn decode_bytes(program: &Program, context: usize) -> ByteCount {
    let mut c = ByteCount {
        dense_weights: 0,
        expert_weights: 0,
        embedding_rows: 0,
        recurrent_state: 0,
        kv_and_indexer: 0,
    };
    for node in &program.nodes {
        let n = node_bytes(program, node, context);
        c.dense_weights += n.dense_weights;
        c.expert_weights += n.expert_weights;
        c.embedding_rows += n.embedding_rows;
        c.recurrent_state += n.recurrent_state;
        c.kv_and_indexer += n.kv_and_indexer;
    }
    c
}

/// The K/V positions an attention node visits at `context`: the blocks its selection keeps
/// (`budget / block` of `block` positions, from the selecting node's op) and the incomplete last
/// block's up to `block - 1` positions, or every position when nothing selects them.
fn attended_positions(program: &Program, node: &Node, context: usize) -> usize {
    let selecting = node.inputs.get(3).and_then(|sel| {
        program
            .nodes
            .iter()
            .find(|n| n.outputs.contains(sel))
            .map(|n| &n.op)
    });
    match selecting {
        Some(
            Op::IndexerSelect { budget, block, .. } | Op::IndexerSelectQk { budget, block, .. },
        ) if *block > 0 => context.min(budget / block * block + block - 1),
        _ => context,
    }
}

/// The bytes one node of a decode step reads (see [`decode_bytes`]).
pub fn node_bytes(program: &Program, node: &Node, context: usize) -> ByteCount {
    let mut c = ByteCount {
        dense_weights: 0,
        expert_weights: 0,
        embedding_rows: 0,
        recurrent_state: 0,
        kv_and_indexer: 0,
    };
    let size = |name: &str| -> u64 {
        program
            .weights
            .iter()
            .find(|w| w.name == name)
            .map(|w| w.shape.iter().product::<usize>() as u64)
            .unwrap_or(0)
    };
    match &node.op {
        Op::MoeExperts { experts, .. } => {
            let k = program.value(&node.inputs[1]).map(|v| v.width).unwrap_or(0) as u64;
            for w in &node.weights {
                c.expert_weights += size(w) * 2 * k / *experts as u64;
            }
        }
        // The gathered rows, not the table (a copy per stream is written, not read).
        Op::Embed | Op::EmbedStreams { .. } | Op::PleEmbed { .. } => {
            let ids = match &node.op {
                Op::PleEmbed {
                    ngram,
                    heads_per_ngram,
                    ..
                } => ngram.saturating_sub(1) * heads_per_ngram,
                _ => program.value(&node.inputs[0]).map_or(1, |v| v.width),
            } as u64;
            let d = program
                .weights
                .iter()
                .find(|w| w.name == node.weights[0])
                .map(|w| w.shape[1])
                .unwrap_or(0) as u64;
            c.embedding_rows += ids * d * 2;
        }
        // Matrices, read at their device width (bf16), as the executor stores them.
        op if (0..node.weights.len()).any(|i| op.weight_is_matrix(i)) => {
            for (_, w) in node
                .weights
                .iter()
                .enumerate()
                .filter(|&(i, _)| op.weight_is_matrix(i))
            {
                c.dense_weights += size(w) * 2;
            }
        }
        Op::Attention {
            kv_heads, head_dim, ..
        }
        | Op::GatedAttention {
            kv_heads, head_dim, ..
        } => {
            let visited = attended_positions(program, node, context) as u64;
            c.kv_and_indexer += visited * (*kv_heads * *head_dim) as u64 * 4 * 2;
        }
        Op::IndexerSelect {
            head_dim, block, ..
        }
        | Op::IndexerSelectQk {
            head_dim, block, ..
        } => {
            c.kv_and_indexer += (context / block) as u64 * *head_dim as u64 * 4;
        }
        _ => {
            for w in &node.weights {
                c.dense_weights += size(w) * 4;
            }
        }
    }
    // Conv windows and GDN recurrent states are read and written once per step.
    for name in &node.states {
        let Some(s) = program.states.iter().find(|s| &s.name == name) else {
            continue;
        };
        let elems = match &s.kind {
            StateKind::Window { rows, width } => rows * width,
            StateKind::Zeros { len } => *len,
            StateKind::Append { .. } | StateKind::Tokens { .. } => 0,
        };
        c.recurrent_state += elems as u64 * 4 * 2;
    }
    c
}

fn total(c: &ByteCount) -> u64 {
    c.dense_weights + c.expert_weights + c.embedding_rows + c.recurrent_state + c.kv_and_indexer
}

/// The schedule a report was made with, in words (built-in graphs and rules when no option
/// changes them).
fn schedule_summary(opts: &BenchOptions) -> String {
    let mut parts = Vec::new();
    if let Some(dir) = &opts.graphs_dir {
        parts.push(format!("graphs from {}", dir.display()));
    }
    if !opts.overrides.is_empty() {
        let rules: Vec<String> = opts.overrides.iter().map(|o| o.to_string()).collect();
        parts.push(format!("rules {}", rules.join(", ")));
    }
    match &opts.fusions {
        Some(f) if f.is_empty() => parts.push("no fusions".into()),
        Some(f) => parts.push(format!("only fusions {}", f.join(", "))),
        None => {}
    }
    if !opts.launch_twice.is_empty() {
        parts.push(format!(
            "nodes of {} launched twice (a measurement: not the model's times)",
            opts.launch_twice.join(", ")
        ));
    }
    if parts.is_empty() {
        "built-in graphs, rules and fusions".into()
    } else {
        parts.join("; ")
    }
}

fn token(i: usize, vocab: usize) -> u32 {
    ((i as u64 * 2654435761) % vocab as u64) as u32
}

pub fn run(config_text: &str, origin: &str, opts: &BenchOptions) -> Result<BenchReport> {
    let plan = bench_plan(config_text, origin, opts.layers, opts.ple_vocab_base)?;
    if opts.prefills.contains(&0) {
        return Err(Error::Input(
            "--prefills: a prompt of 0 tokens has no prefill to time".into(),
        ));
    }
    if let Some(kind) = opts
        .launch_twice
        .iter()
        .find(|k| !crate::ir::op::KINDS.contains(&k.as_str()))
    {
        return Err(Error::Input(format!(
            "--launch-twice: `{kind}` is not an op kind (the `op` names of rules.ron and fusions.ron)"
        )));
    }
    let max_ctx = opts
        .contexts
        .iter()
        .chain(&opts.prefills)
        .copied()
        .max()
        .unwrap_or(1024);
    let options = ModelOptions {
        // Each context runs five timed passes of `decode_steps` tokens (graphs without and with
        // overlap, greedy, host times, eager), their warm-ups, up to 16 segment-timed and 4
        // profiled tokens: within 6 * decode_steps + 64 for any decode_steps.
        context_capacity: Some(max_ctx + opts.decode_steps * 6 + 64),
        graphs_dir: opts.graphs_dir.clone(),
        overrides: opts.overrides.clone(),
        fusions: opts.fusions.clone(),
        cuda_launch_twice: opts.launch_twice.clone(),
        ..Default::default()
    };
    // Graph files, rules and fusions are checked before the device is opened: lowering the
    // step shapes the bench runs names a bad one without a GPU.
    let graphs = options.graph_set()?;
    // The prefill step sizes the bench runs: the chunk, or each prompt whole (chunk 0).
    let step_len = |n: usize| {
        if opts.chunk == 0 {
            n
        } else {
            opts.chunk.min(n)
        }
    };
    let mut shapes = vec![(Phase::Decode, 1)];
    shapes.extend(
        opts.prefills
            .iter()
            .chain(&opts.contexts)
            .map(|&n| (Phase::Prefill, step_len(n))),
    );
    shapes.dedup();
    for (phase, tokens) in shapes {
        let lower_opts = options.lower_options(
            phase,
            tokens,
            LogitsMode::Last,
            crate::ir::Device::Cuda,
            Some("bf16".into()),
        );
        crate::lower::lower(&plan, &graphs, &lower_opts)?;
    }
    let schedule = schedule_summary(opts);
    let gpu = Gpu::new(0)?;
    if opts.trace {
        gpu.enable_trace(TRACE_CAPACITY)?;
    }
    let device = format!(
        "{} (sm_{}{})",
        gpu.info.name, gpu.info.compute_capability.0, gpu.info.compute_capability.1
    );
    let bandwidth = copy_bandwidth(&gpu)?;
    let layer_kinds = plan
        .layers
        .iter()
        .map(|l| l.kind.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let vocab = plan.vocab_size;
    let model = Model::random_on_gpu(plan, gpu, options, opts.seed)?;
    let cuda = model
        .backend
        .cuda()
        .expect("a model made on the GPU runs there");
    let weight_bytes = cuda.weights.bytes;
    let session = || -> CudaSession<'_> { Session::with_executor(&model, cuda.executor()) };
    let chunk_prefill = |s: &mut CudaSession, n: usize, offset: usize| -> Result<()> {
        let mut done = 0;
        while done < n {
            let len = step_len(n - done);
            let ids: Vec<u32> = (done..done + len)
                .map(|i| token(i + offset, vocab))
                .collect();
            s.prefill(&ids, LogitsMode::Last)?;
            done += len;
        }
        Ok(())
    };
    // Warm-up: compiles every kernel, lowers the programs (each prompt's step shape when the
    // prompts go whole).
    {
        let mut s = session();
        chunk_prefill(&mut s, step_len(max_ctx), 0)?;
        for i in 0..3 {
            s.decode(token(i, vocab))?;
        }
        if opts.chunk == 0 {
            for &n in &opts.prefills {
                chunk_prefill(&mut session(), n, 0)?;
            }
        }
    }
    let mut prefill = Vec::new();
    for &n in &opts.prefills {
        let mut s = session();
        let t = Instant::now();
        chunk_prefill(&mut s, n, 7)?;
        let secs = t.elapsed().as_secs_f64();
        prefill.push(PrefillRow {
            prompt: n,
            chunk: step_len(n),
            seconds: secs,
            tokens_per_second: n as f64 / secs,
        });
    }
    // Where a prefill chunk's time goes: the first chunk of a prompt, node by node.
    let mut prefill_profile = Vec::new();
    let mut prefill_slowest = Vec::new();
    if let Some(&first) = opts.prefills.first() {
        let len = step_len(first);
        let mut s = session();
        s.executor_mut().instrumentation.profile = Some(Default::default());
        let ids: Vec<u32> = (0..len).map(|i| token(i + 3, vocab)).collect();
        s.prefill(&ids, LogitsMode::Last)?;
        let nodes = s.executor_mut().instrumentation.take_profile();
        let program = model.program(Phase::Prefill, len, LogitsMode::Last)?;
        let p = Profile::collect(&program, &nodes, None, bandwidth);
        prefill_profile = p.by_op;
        prefill_slowest = p.slowest;
    }
    let decode_program = model.program(Phase::Decode, 1, LogitsMode::Last)?;
    let mut decode = Vec::new();
    let mut bytes_last = decode_bytes(&decode_program, 1);
    let mut profile = Profile::default();
    let mut graph_timeline = crate::exec::cuda::trace::Timeline::default();
    for &ctx in &opts.contexts {
        let mut s = session();
        chunk_prefill(&mut s, ctx, 11)?;
        let timed_with = |s: &mut CudaSession, graphs: bool, greedy: bool| -> Result<f64> {
            s.executor_mut().graphs = graphs;
            let step = |s: &mut CudaSession, id: u32| -> Result<()> {
                if greedy {
                    s.greedy(&[id])?;
                } else {
                    s.decode(id)?;
                }
                Ok(())
            };
            for i in 0..3 {
                step(s, token(i, vocab))?;
            }
            let t = Instant::now();
            for i in 0..opts.decode_steps {
                step(s, token(i + 5, vocab))?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e3 / opts.decode_steps as f64)
        };
        let timed = |s: &mut CudaSession, graphs: bool| timed_with(s, graphs, false);
        s.executor_mut().instrumentation.programmatic_launch = false;
        let ms_graphs_serial = timed(&mut s, true)?;
        s.executor_mut().instrumentation.programmatic_launch = true;
        let ms_graphs = timed(&mut s, true)?;
        let ms_greedy = timed_with(&mut s, true, true)?;
        s.executor_mut().instrumentation.segment_ms = Some(Vec::new());
        for i in 0..opts.decode_steps.min(16) {
            s.decode(token(i + 30, vocab))?;
        }
        let ms_per_segment: Vec<f64> = s
            .executor_mut()
            .instrumentation
            .segment_ms
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|(n, ms)| ms / n.max(1) as f64)
            .collect();
        // The host side of replayed steps (their waits included, so that the parts add up to
        // the wall time of the same steps).
        s.executor_mut().graphs = true;
        s.executor_mut().instrumentation.host_times = Some(Default::default());
        let t = Instant::now();
        for i in 0..opts.decode_steps {
            s.decode(token(i + 40, vocab))?;
        }
        let wall_us = t.elapsed().as_secs_f64() * 1e6;
        let host = s
            .executor_mut()
            .instrumentation
            .host_times
            .take()
            .unwrap_or_default();
        let per = |seconds: f64| seconds * 1e6 / host.steps.max(1) as f64;
        let host_us_per_token = HostRow {
            submit: per(host.submit),
            wait: per(host.wait),
            download: per(host.download),
            outside: (wall_us - (host.submit + host.wait + host.download) * 1e6)
                / opts.decode_steps.max(1) as f64,
        };
        let largest = ctx == *opts.contexts.iter().max().unwrap_or(&ctx);
        if opts.trace && largest {
            s.executor_mut().graphs = true;
            s.executor_mut().start_trace()?;
            for i in 0..TRACED_STEPS {
                s.decode(token(i + 60, vocab))?;
            }
            graph_timeline = s.executor_mut().finish_trace()?;
        }
        let ms_eager = timed(&mut s, false)?;
        if largest {
            s.executor_mut().graphs = false;
            s.executor_mut().instrumentation.profile = Some(Default::default());
            for i in 0..4 {
                s.decode(token(i + 50, vocab))?;
            }
            let nodes = s.executor_mut().instrumentation.take_profile();
            profile = Profile::collect(&decode_program, &nodes, Some(ctx), bandwidth);
        }
        bytes_last = decode_bytes(&decode_program, ctx);
        let bytes = total(&bytes_last);
        decode.push(DecodeRow {
            context: ctx,
            ms_per_token_graphs: ms_graphs,
            ms_per_token_graphs_serial: ms_graphs_serial,
            ms_per_segment,
            ms_per_token_eager: ms_eager,
            ms_per_token_greedy: ms_greedy,
            host_us_per_token,
            bytes_per_token: bytes,
            fraction_of_copy_bandwidth: bytes as f64 / (ms_graphs / 1e3) / (bandwidth * 1e9),
        });
    }
    let segments_ms: f64 = decode
        .iter()
        .max_by_key(|r| r.context)
        .map_or(0.0, |r| r.ms_per_segment.iter().sum());
    let dense_fraction_in_graph =
        dense_share(profile.dense.0, segments_ms, profile.experts.1, bandwidth);
    let dense_fraction_in_graph_experts_at_copy = dense_share(
        profile.dense.0,
        segments_ms,
        copy_ms(profile.experts.0, bandwidth),
        bandwidth,
    );
    let ctx = opts.contexts.iter().max().copied();
    let graph = timeline_profile(&decode_program, &graph_timeline, ctx, bandwidth);
    let linear_sweep = if opts.sweep_linear {
        linear_sweep::run(&cuda.gpu, &decode_program, bandwidth)?
    } else {
        Vec::new()
    };
    Ok(BenchReport {
        linear_sweep,
        device,
        schedule,
        layers: opts.layers,
        layer_kinds,
        weight_bytes_on_device: weight_bytes,
        copy_bandwidth_gb_s: bandwidth,
        segments_per_decode_step: decode_program.segments.len(),
        decode,
        decode_bytes_at_largest_context: bytes_last,
        prefill,
        dense_fraction_of_copy_bandwidth: fraction(profile.dense.0, profile.dense.1, bandwidth),
        expert_fraction_of_copy_bandwidth: fraction(
            profile.experts.0,
            profile.experts.1,
            bandwidth,
        ),
        dense_fraction_in_graph,
        dense_fraction_in_graph_experts_at_copy,
        profiled_ms_per_step: profile.dense.1 + profile.experts.1,
        decode_profile: profile.by_op,
        slowest_nodes: profile.slowest,
        prefill_profile,
        prefill_slowest_nodes: prefill_slowest,
        graph_timeline,
        graph_dense_fraction: fraction(graph.dense.0, graph.dense.1, bandwidth),
        graph_profile: graph.by_op,
        graph_slowest_nodes: graph.slowest,
        graph_nodes: graph.every_node,
    })
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
            "model: real geometry, first {} layers ({}), bf16 matrices, {:.1} GB on the device",
            self.layers,
            self.layer_kinds,
            self.weight_bytes_on_device as f64 / 1e9
        )?;
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
                "  greedy decode at {} (the id chosen on the device, 8 bytes downloaded): {:.3} ms/tok",
                r.context, r.ms_per_token_greedy
            )?;
        }
        for r in &self.decode {
            let h = &r.host_us_per_token;
            writeln!(
                f,
                "  host per replayed token at {}: {:.1} us until launched, {:.1} waiting for the \
                 device, {:.1} downloading the logits, {:.1} outside the executor",
                r.context, h.submit, h.wait, h.download, h.outside
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::cuda::trace::{LaunchTime, Timeline};

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
        let plan = bench_plan(text, "qwen3.8-flash-next.json", 1, 1009).unwrap();
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

    /// Attention reads the visited K and V rows (f32) whether fused with its gate or not, and
    /// the indexer its compressed keys: at 8k, the first 8 layers' two QSA layers.
    #[test]
    fn decode_bytes_count_the_kv_cache_of_every_attention() {
        let text = include_str!("../../tests/data/configs/qwen3.8-flash-next.json");
        let plan = bench_plan(text, "qwen3.8-flash-next.json", 8, 1009).unwrap();
        let graphs = crate::lower::GraphSet::embedded().unwrap();
        let mut opts = crate::lower::LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
        opts.device = crate::ir::Device::Cuda;
        let program = crate::lower::lower(&plan, &graphs, &opts).unwrap().program;
        assert!(program
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::GatedAttention { .. })));
        // The config: budget 2048, compress ratio 4, 2 kv heads of 256, indexer keys of 128.
        // 2 layers x (2048 + 3 positions x 2 kv heads x 256 x 4 bytes x (K, V) + 8192 / 4 keys
        // x 128 x 4); at a context below the budget every position.
        let want = 2 * (2051 * 2 * 256 * 4 * 2 + 2048 * 128 * 4);
        assert_eq!(decode_bytes(&program, 8192).kv_and_indexer, want);
        let short = 2 * (1000 * 2 * 256 * 4 * 2 + 250 * 128 * 4);
        assert_eq!(decode_bytes(&program, 1000).kv_and_indexer, short);
    }
}
