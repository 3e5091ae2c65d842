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

pub mod linear_sweep;
pub mod speculative;

mod bytes;
mod profile;
mod report;

use crate::error::{Error, Result};
use crate::exec::cuda::executor::CudaExecutor;
use crate::exec::cuda::launch::DeviceMatrix;
use crate::exec::cuda::Gpu;
use crate::ir::{LogitsMode, Phase};
use crate::plan::ModelPlan;
use crate::runtime::{Model, ModelOptions, Session};

use bytes::total;
pub use bytes::{decode_bytes, node_bytes, ByteCount};
pub use profile::ProfileRow;
use profile::{copy_ms, dense_share, fraction, timeline_profile, Profile};
pub use report::{BenchReport, DecodeRow, HostRow, PrefillRow};

/// A sequence on the CUDA executor, whose instrumentation the bench sets and reads.
type CudaSession<'m> = Session<'m, CudaExecutor<'m>>;

pub struct BenchOptions {
    /// Also time every one-token linear variant on every one-token matrix shape.
    pub sweep_linear: bool,
    pub schedule: Schedule,
    /// Op kinds whose nodes every step launches twice (`ModelOptions::cuda_launch_twice`):
    /// the decode times then include those nodes' marginal cost a second time. For measurement:
    /// the model's results are not what is timed.
    pub launch_twice: Vec<String>,
    /// Also trace replayed decode steps at the largest context launch by launch
    /// (`exec::cuda::trace`; the kernels are then built with the trace's records, which cost
    /// every launch a few clock reads and one atomic).
    pub trace: bool,
    /// Keep the first N layers (`None`: all of the config's).
    pub layers: Option<usize>,
    /// How the routed experts are stored (bf16 banks, or NVFP4 as the release users run).
    pub experts: crate::registry::WeightFormat,
    pub contexts: Vec<usize>,
    pub prefills: Vec<usize>,
    pub decode_steps: usize,
    /// Step sizes (tokens a step) to time at a 1k context, as MTP's verify and batched decode
    /// run them; empty: none.
    pub step_rows: Vec<usize>,
    /// Prefill tokens per step; 0: each prompt in one step; `None`: the step rule
    /// (`graphs/steps.ron`) for CUDA at the bench's capacity, as `graphrun run` prefills.
    pub chunk: Option<usize>,
    /// The PLE n-gram table's prime base (`None`: the config's, the real table's size).
    pub ple_vocab_base: Option<u64>,
    /// Where the n-gram table is kept (`None`: as the memory plan places it in a real load).
    pub ple_table: Option<crate::registry::Placement>,
    pub seed: u64,
}

/// Launch records the trace buffer holds (`--trace`): `TRACED_STEPS` decode steps of a few
/// hundred launches each fit.
const TRACE_CAPACITY: usize = 1 << 16;
const TRACED_STEPS: usize = 32;
/// The context the T-row steps are timed at.
const ROWS_CONTEXT: usize = 1024;

/// The real config cut to its first `layers` layers (all: `None`), with a smaller PLE table.
pub fn bench_plan(
    config_text: &str,
    origin: &str,
    layers: Option<usize>,
    ple_vocab_base: Option<u64>,
) -> Result<ModelPlan> {
    let mut v: serde_json::Value =
        serde_json::from_str(config_text).map_err(|e| Error::Input(format!("{origin}: {e}")))?;
    let text = if v.get("text_config").is_some() {
        &mut v["text_config"]
    } else {
        &mut v
    };
    let total = text["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
    let layers = layers.unwrap_or(total);
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
    if let Some(base) = ple_vocab_base {
        text["ngram_vocab_size_base"] = base.into();
    }
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

/// Graph files, rule overrides and fusions to benchmark with (the model options' fields of
/// the same names; the rest of a bench's options are its own).
#[derive(Debug, Clone, Default)]
pub struct Schedule {
    pub graphs_dir: Option<std::path::PathBuf>,
    pub overrides: Vec<crate::passes::schedule::RuleOverride>,
    pub fusions: Option<Vec<String>>,
    pub verify_exact: bool,
}

impl Schedule {
    /// `options` with this schedule's graphs, rules and fusions.
    pub fn apply(&self, options: ModelOptions) -> ModelOptions {
        ModelOptions {
            graphs_dir: self.graphs_dir.clone(),
            overrides: self.overrides.clone(),
            fusions: self.fusions.clone(),
            verify_exact: self.verify_exact,
            ..options
        }
    }

    /// The changes from the built-in graphs, rules and fusions, in words.
    pub fn changes(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if self.verify_exact {
            parts.push("verify-exact".into());
        }
        if let Some(dir) = &self.graphs_dir {
            parts.push(format!("graphs from {}", dir.display()));
        }
        if !self.overrides.is_empty() {
            let rules: Vec<String> = self.overrides.iter().map(|o| o.to_string()).collect();
            parts.push(format!("rules {}", rules.join(", ")));
        }
        match &self.fusions {
            Some(f) if f.is_empty() => parts.push("no fusions".into()),
            Some(f) => parts.push(format!("only fusions {}", f.join(", "))),
            None => {}
        }
        parts
    }

    /// [`Schedule::changes`] in one line ("built-in graphs, rules and fusions" when none).
    pub fn summary(&self) -> String {
        let parts = self.changes();
        if parts.is_empty() {
            "built-in graphs, rules and fusions".into()
        } else {
            parts.join("; ")
        }
    }
}

/// The schedule a report was made with, in words (built-in graphs and rules when no option
/// changes them).
fn schedule_summary(opts: &BenchOptions) -> String {
    let mut parts = opts.schedule.changes();
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
    // A T-row pass: the 1k context, then 3 + decode_steps steps of T rows.
    let rows_need = opts
        .step_rows
        .iter()
        .map(|t| ROWS_CONTEXT + t * (opts.decode_steps.max(1) + 3))
        .max()
        .unwrap_or(0);
    if opts.step_rows.contains(&0) {
        return Err(Error::Input(
            "--step-rows: a step takes at least one token".into(),
        ));
    }
    let options = opts.schedule.apply(ModelOptions {
        // Each context runs six timed passes of `decode_steps` tokens (graphs without and with
        // overlap, greedy, sampled, host times, eager), five of them after 3 warm-up tokens, up
        // to 16 segment-timed, 4 profiled and 32 traced tokens: within 7 * decode_steps + 96.
        context_capacity: Some(max_ctx.max(rows_need) + opts.decode_steps * 7 + 96),
        cuda_launch_twice: opts.launch_twice.clone(),
        ple_table: opts.ple_table,
        ..Default::default()
    });
    // Graph files, rules and fusions are checked before the device is opened: lowering the
    // step shapes the bench runs names a bad one without a GPU.
    let graphs = options.graph_set()?;
    // The sessions' capacity (`Session::capacity`) and the chunk the step rules give it.
    let facts = crate::rules::steps::StepFacts {
        device: crate::ir::Device::Cuda,
        capacity: options
            .context_capacity
            .unwrap_or(usize::MAX)
            .min(plan.max_position_embeddings),
    };
    let chunk = opts.chunk.unwrap_or_else(|| {
        crate::rules::steps::choose(&graphs.steps, &facts).map_or(0, |r| r.max_rows)
    });
    // The prefill step sizes the bench runs: the chunk, or each prompt whole (chunk 0).
    let step_len = |n: usize| if chunk == 0 { n } else { chunk.min(n) };
    // The session takes each piece the bench gives it as one step.
    let options = ModelOptions {
        prefill_chunk: Some(step_len(max_ctx)),
        ..options
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
    let plan_layers = plan.layers.len();
    let layer_kinds = plan
        .layers
        .iter()
        .map(|l| l.kind.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let vocab = plan.vocab_size;
    let model = Model::random_on_gpu(plan, gpu, options, opts.experts, opts.seed)?;
    let cuda = model
        .backend
        .cuda()
        .expect("a model made on the GPU runs there");
    let weight_bytes = cuda.weights.bytes;
    let memory_plan = model
        .memory_plan
        .map_or_else(|| "not made".to_string(), |p| p.to_string());
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
        if chunk == 0 {
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
        // How a timed step chooses: not at all (the logits downloaded), greedily on the device,
        // or sampled on the host from the downloaded logits (temperature 0.7, top-k 50, top-p
        // 0.9: a chat's settings).
        #[derive(Clone, Copy, PartialEq)]
        enum Choice {
            Logits,
            Greedy,
            Sampled,
        }
        let sampling = crate::runtime::Sampling::Sample {
            temperature: 0.7,
            top_k: Some(50),
            top_p: Some(0.9),
            seed: 1,
        };
        let timed_with = |s: &mut CudaSession, graphs: bool, choice: Choice| -> Result<f64> {
            s.executor_mut().graphs = graphs;
            let mut sampler = crate::runtime::Sampler::new(sampling.clone())?;
            let mut step = |s: &mut CudaSession, id: u32| -> Result<()> {
                match choice {
                    Choice::Greedy => {
                        s.greedy(&[id])?;
                    }
                    Choice::Logits => {
                        s.decode(id)?;
                    }
                    Choice::Sampled => {
                        let logits = s.decode(id)?;
                        sampler.next(&logits).map_err(|bad| {
                            Error::Input(format!("the bench's logits hold {}", bad.value))
                        })?;
                    }
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
        let timed = |s: &mut CudaSession, graphs: bool| timed_with(s, graphs, Choice::Logits);
        s.executor_mut().instrumentation.programmatic_launch = false;
        let ms_graphs_serial = timed(&mut s, true)?;
        s.executor_mut().instrumentation.programmatic_launch = true;
        let ms_graphs = timed(&mut s, true)?;
        let ms_greedy = timed_with(&mut s, true, Choice::Greedy)?;
        let ms_sampled = timed_with(&mut s, true, Choice::Sampled)?;
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
            host_steps: per(host.host_steps),
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
            ms_per_token_sampled: ms_sampled,
            host_us_per_token,
            bytes_per_token: bytes,
            fraction_of_copy_bandwidth: bytes as f64 / (ms_graphs / 1e3) / (bandwidth * 1e9),
        });
    }
    // Steps of T rows at a 1k context, replayed, beside the bytes each must read.
    let mut rows_steps = Vec::new();
    for &t in &opts.step_rows {
        let mut s = session();
        chunk_prefill(&mut s, ROWS_CONTEXT, 13)?;
        s.executor_mut().graphs = true;
        let ids = |i: usize| -> Vec<u32> { (0..t).map(|j| token(i * t + j + 90, vocab)).collect() };
        for i in 0..3 {
            s.prefill(&ids(i), LogitsMode::Last)?;
        }
        let steps = opts.decode_steps.max(1);
        let started = Instant::now();
        for i in 0..steps {
            s.prefill(&ids(i + 3), LogitsMode::Last)?;
        }
        let ms = started.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let phase = if t == 1 {
            Phase::Decode
        } else {
            Phase::Prefill
        };
        let program = model.program(phase, t, LogitsMode::Last)?;
        let bytes = total(&bytes::step_bytes(&program, ROWS_CONTEXT, t));
        rows_steps.push(report::RowsRow {
            rows: t,
            ms_per_step: ms,
            mb_to_read: bytes as f64 / 1e6,
            ms_at_copy_rate: copy_ms(bytes, bandwidth),
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
        layers: plan_layers,
        experts: opts.experts.to_string(),
        layer_kinds,
        weight_bytes_on_device: weight_bytes,
        memory_plan,
        rows_steps,
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
