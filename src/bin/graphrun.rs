//! The `graphrun` command line: a thin shell over the library.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use graphrun::checkpoint::{self, DType, TensorData};
use graphrun::ir::{LogitsMode, Phase};
use graphrun::lower::{self, GraphSet, LowerOptions};
use graphrun::passes::schedule::RuleOverride;
use graphrun::plan::ModelPlan;
use graphrun::registry::{DeviceFacts, WeightFormat};
use graphrun::runtime::{
    DeviceChoice, GenerateOptions, Model, ModelOptions, Sampling, SpecOptions,
};
use graphrun::synth::{self, SynthDtype, SynthOptions};
use graphrun::{stderr, Error};

#[derive(Parser)]
#[command(
    name = "graphrun",
    version,
    about = "Qwen4Exp (qwen4_exp) kernel-graph compiler and runtime"
)]
struct Cli {
    /// Read graph files (qwen4exp/*.ron, fusions.ron, rules.ron) from DIR instead of the built-in copy.
    #[arg(long, global = true, value_name = "DIR")]
    graphs: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate tokens from a prompt; prints the generated ids, comma-separated, as the last line.
    Run(RunArgs),
    /// Write the logits of every prompt position to a safetensors file (tensor `logits`, [T, vocab], f32).
    Logits(LogitsArgs),
    /// Print the lowered program as RON (needs no weights).
    Lower(LowerArgs),
    /// Show the plan and check the checkpoint's tensor contract.
    Inspect(InspectArgs),
    /// Write a random checkpoint in the official layout, streamed a tensor at a time (--sparse:
    /// its matrices left as holes, for timing loads on a small disk).
    Synth(SynthArgs),
    /// Decode and prefill at the real geometry on a CUDA device (random weights made on the device).
    Bench(BenchArgs),
}

#[derive(Args)]
struct BenchArgs {
    /// The model config (default: the real Qwen3.8-Flash-Next config shipped in tests/data).
    #[arg(long, default_value = "tests/data/configs/qwen3.8-flash-next.json")]
    config: PathBuf,
    /// Keep the first N layers (default: all; bf16 experts take about 5 GB a layer, NVFP4 ones
    /// 1.4 GB).
    #[arg(long)]
    layers: Option<usize>,
    /// How the routed experts are stored: nvfp4 (as the release users run on one GPU) or bf16.
    #[arg(long, default_value = "nvfp4")]
    experts: graphrun::registry::WeightFormat,
    /// Contexts to time decode at.
    #[arg(long, value_delimiter = ',', default_value = "1024,8192")]
    contexts: Vec<usize>,
    /// Prompt lengths to time prefill for.
    #[arg(long, value_delimiter = ',', default_value = "2048,8192")]
    prefills: Vec<usize>,
    #[arg(long, default_value_t = 32)]
    decode_steps: usize,
    /// Step sizes to time at a 1k context (steps of T tokens: MTP's verify, batched decode),
    /// beside the bytes each must read; `--step-rows` with no value for none.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,2,4,6,8,16,32,64")]
    step_rows: Vec<usize>,
    /// Prime base of the PLE n-gram table (default: the config's; the real 20000000 makes a
    /// 102 GB table, kept on the host as a real load keeps it; a token reads 16 rows whatever
    /// the table's size).
    #[arg(long)]
    ple_vocab_base: Option<u64>,
    /// Where the n-gram table is kept: device or host (default: as the memory plan places it).
    #[arg(long, value_name = "WHERE")]
    ple_table: Option<graphrun::registry::Placement>,
    /// Prefill chunk (tokens per step); 0: each prompt in one step. Default: the step rule of
    /// graphs/steps.ron for CUDA, as `graphrun run` prefills.
    #[arg(long)]
    chunk: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also time every one-token linear variant on every one-token matrix shape of the decode
    /// program (which variant a shape should take).
    #[arg(long)]
    sweep_linear: bool,
    /// Launch every node of these op kinds twice (comma-separated kinds, e.g.
    /// hc_read,moe_router): the decode times grow by those nodes' marginal cost inside the
    /// replayed graph. A measurement: the model's results are not what is timed.
    #[arg(long, value_delimiter = ',', value_name = "KINDS")]
    launch_twice: Vec<String>,
    /// Also trace replayed decode steps at the largest context, launch by launch inside the
    /// graph (kernels built with the trace's records: a few clock reads and one atomic a launch).
    #[arg(long)]
    trace: bool,
    /// Time speculative decoding's steps instead (a plain decode step, verify steps of 2 to
    /// --spec-rows rows, draft steps, a checkpoint and a rewind, at the largest of --contexts)
    /// and model the tokens/s they give at --acceptances.
    #[arg(long)]
    speculative: bool,
    #[arg(long, default_value_t = 8, requires = "speculative")]
    spec_rows: usize,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.6,0.75,0.85",
        requires = "speculative"
    )]
    acceptances: Vec<f64>,
    /// Time the speculative steps on the CPU reference (random weights in memory: a small
    /// --config, such as models/tiny-qwen4exp-mtp/config.json).
    #[arg(long, requires = "speculative")]
    cpu: bool,
    #[command(flatten)]
    schedule: Schedule,
}

#[derive(Args)]
struct Schedule {
    /// Override a scheduling rule: NAME=VARIANT, or NAME=off to disable it (repeatable).
    #[arg(long = "rule", value_name = "NAME=VALUE")]
    rules: Vec<String>,
    /// Apply only these fusions (comma-separated names from fusions.ron).
    #[arg(long, value_delimiter = ',', conflicts_with = "no_fusions")]
    fusions: Option<Vec<String>>,
    /// Apply no fusion.
    #[arg(long)]
    no_fusions: bool,
    /// Verify-exact mode: one-token steps take the kernels of the few-row (verify) steps, whose
    /// sums for a row do not depend on the step's other rows, so that speculative greedy output
    /// is plain greedy's bit for bit on the GPU too (a decode step costs a little more).
    #[arg(long)]
    verify_exact: bool,
}

impl Schedule {
    fn overrides(&self) -> Result<Vec<RuleOverride>, Error> {
        self.rules
            .iter()
            .map(|r| r.parse::<RuleOverride>().map_err(Error::from))
            .collect()
    }
    fn fusions(&self) -> Option<Vec<String>> {
        if self.no_fusions {
            Some(Vec::new())
        } else {
            self.fusions.clone()
        }
    }
}

#[derive(Args)]
struct Placement {
    /// Where to run: cpu (the reference), cuda (GPU 0), or auto (cuda when present, else cpu with a notice).
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// Most tokens a session holds (the prompt and each generated token fed back: all but the
    /// last), on every device; on a GPU its caches are preallocated for it. Default:
    /// max_position_embeddings on the CPU, min(max_position_embeddings, 8192) on a GPU.
    #[arg(long, value_name = "TOKENS")]
    context: Option<usize>,
    /// Most prompt tokens one prefill step takes (a longer prompt runs as consecutive steps).
    /// Default: the step rule of graphs/steps.ron for the device (4096 rows).
    #[arg(long, value_name = "TOKENS")]
    prefill_chunk: Option<usize>,
    /// On the GPU, launch every step's kernels eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    no_graphs: bool,
    /// On the GPU, synchronise after every node (eager, slow) so that a kernel fault names its kernel.
    #[arg(long)]
    sync_each_node: bool,
    /// On the GPU, where the PLE n-gram table is kept: device, or host (each step's rows
    /// gathered there and copied in). Default: the device when the memory plan fits it there.
    #[arg(long, value_name = "WHERE")]
    ple_table: Option<graphrun::registry::Placement>,
}

#[derive(Args)]
struct RunArgs {
    /// Model directory (config.json, safetensors, optional tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt token ids, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "prompt",
        conflicts_with = "prompt"
    )]
    prompt_ids: Option<Vec<String>>,
    /// Prompt text (needs tokenizer.json in the model directory); the output is printed as text too.
    #[arg(long)]
    prompt: Option<String>,
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    /// Always take the most likely token (the default unless --temperature is given).
    #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p", "seed"])]
    greedy: bool,
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating after an eos token.
    #[arg(long)]
    ignore_eos: bool,
    /// Speculative decoding with the model's MTP draft head: the same tokens as plain greedy
    /// decoding (or, sampled, the same distribution), its report on stderr.
    #[arg(long)]
    speculative: bool,
    /// The most tokens a speculative round drafts (1 to 16).
    #[arg(long, default_value_t = 5, requires = "speculative")]
    spec_k: usize,
    /// Draft --spec-k tokens every round, rather than choosing each round's K by the measured
    /// acceptance.
    #[arg(long, requires = "speculative")]
    spec_fixed: bool,
    #[command(flatten)]
    schedule: Schedule,
    #[command(flatten)]
    placement: Placement,
}

#[derive(Args)]
struct LogitsArgs {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<String>,
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    schedule: Schedule,
    #[command(flatten)]
    placement: Placement,
}

#[derive(Args)]
struct LowerArgs {
    /// Model directory (its config.json is used).
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    model: Option<PathBuf>,
    /// A config.json.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long, default_value = "prefill")]
    phase: Phase,
    /// Tokens per step (prefill; decode is always 1).
    #[arg(long)]
    tokens: Option<usize>,
    /// Logits for every position (`all`) or only the last (`last`).
    #[arg(long, default_value = "all")]
    logits: String,
    /// The executor to schedule for (its rules and kernel variants): cpu or cuda.
    #[arg(long, default_value = "cpu")]
    device: graphrun::ir::Device,
    /// How the executor stores matrices (f32 or bf16); default: f32 on the CPU, bf16 (the
    /// release's format) on CUDA.
    #[arg(long)]
    weights: Option<WeightFormat>,
    /// How the routed experts are stored, where not as the other matrices (nvfp4: the
    /// release's packed experts, on CUDA).
    #[arg(long)]
    experts: Option<WeightFormat>,
    /// Where a CUDA executor keeps the PLE n-gram table: device (default) or host.
    #[arg(long, value_name = "WHERE", default_value = "device")]
    ple_table: graphrun::registry::Placement,
    /// The CUDA device's compute capability as major*10 + minor (default: an H200's, 90).
    #[arg(long, default_value_t = 90)]
    arch: u32,
    /// The CUDA device's multiprocessors (default: an H200's, 132).
    #[arg(long, default_value_t = 132)]
    sms: usize,
    /// What to print: `ron` (the program), `kernels` (a line per node: its kernels and the rule
    /// that chose them) or `dot` (a Graphviz graph: nodes by op family, segments as clusters).
    #[arg(long, default_value = "ron")]
    format: LowerFormat,
    /// Lower the MTP draft head (`graphs/qwen4exp/mtp.ron`) instead of the model.
    #[arg(long)]
    draft: bool,
    /// Also return the composition's exports (the trunk's final hyper state, which a
    /// speculative session hands the draft head).
    #[arg(long)]
    exports: bool,
    #[command(flatten)]
    schedule: Schedule,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LowerFormat {
    Ron,
    Kernels,
    Dot,
}

#[derive(Args)]
struct InspectArgs {
    #[arg(long)]
    model: PathBuf,
}

#[derive(Args)]
struct SynthArgs {
    #[arg(long)]
    config: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// Weights' dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest safetensors file, in MiB.
    #[arg(long, default_value_t = 4096)]
    shard_mib: usize,
    /// How the routed experts are stored: `fused` banks in --dtype, or ModelOpt `nvfp4` per
    /// expert (with hf_quant_config.json).
    #[arg(long, default_value = "fused")]
    experts: String,
    /// Leave every tensor of rank 2 or more (conv1d kernels excepted) as a hole of zeros: same
    /// files and sizes, almost no disk. Norms, scalars, conv kernels and int64 buffers are
    /// written; NVFP4 global scales come from the fan-in. For timing loads of a full-size model.
    #[arg(long)]
    sparse: bool,
}

fn parse_ids(raw: &[String]) -> Result<Vec<u32>, Error> {
    raw.iter()
        .enumerate()
        .map(|(i, s)| {
            s.trim().parse::<u32>().map_err(|_| {
                Error::Input(format!("--prompt-ids: `{s}` at position {i} is not a token id (a non-negative integer)"))
            })
        })
        .collect()
}

fn load_model(
    dir: &std::path::Path,
    graphs: &Option<PathBuf>,
    schedule: &Schedule,
    placement: &Placement,
) -> Result<Model, Error> {
    if placement.prefill_chunk == Some(0) {
        return Err(Error::Input(
            "--prefill-chunk 0: a prefill step takes at least one token".into(),
        ));
    }
    let options = ModelOptions {
        graphs_dir: graphs.clone(),
        overrides: schedule.overrides()?,
        fusions: schedule.fusions(),
        device: placement.device,
        context_capacity: placement.context,
        prefill_chunk: placement.prefill_chunk,
        no_cuda_graphs: placement.no_graphs,
        cuda_sync_each_node: placement.sync_each_node,
        cuda_launch_twice: Vec::new(),
        ple_table: placement.ple_table,
        verify_exact: schedule.verify_exact,
    };
    let model = Model::load(dir, options)?;
    if let Some(plan) = &model.memory_plan {
        stderr::line(format_args!("memory plan: {plan}"));
    }
    if let Some(notice) = &model.fallback_notice {
        stderr::line(format_args!("notice: {notice}"));
    }
    if let Some(report) = &model.load_report {
        stderr::line(format_args!("loaded {report}"));
    }
    Ok(model)
}

fn graph_set(graphs: &Option<PathBuf>) -> Result<GraphSet, Error> {
    Ok(match graphs {
        Some(d) => GraphSet::load_dir(d)?,
        None => GraphSet::embedded()?,
    })
}

/// Why a command stopped before the end.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Lib(Error),
    /// stdout's reader went away (`graphrun lower | head -1`): nobody wants the rest, which is
    /// not a failure.
    #[error("stdout was closed")]
    StdoutClosed,
}

// Every library error converts, so that `?` works on each stage's own error type.
impl<E: Into<Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Lib(e.into())
    }
}

/// Writes `text` and a newline to stdout, flushed, so that a write error surfaces here as a
/// value (`println!` panics on one): a closed pipe is [`Failure::StdoutClosed`], anything else (a
/// full disk) an error naming stdout.
fn print_line(text: &str) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    written.map_err(|e| match e.kind() {
        io::ErrorKind::BrokenPipe => Failure::StdoutClosed,
        _ => Failure::Lib(Error::Io {
            path: "stdout".into(),
            msg: format!("cannot write the output: {e}"),
        }),
    })
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Run(a) => {
            let sampling = match (a.greedy, a.temperature) {
                (_, None) => {
                    if a.top_k.is_some() || a.top_p.is_some() {
                        return Err(
                            Error::Input("--top-k/--top-p need --temperature".into()).into()
                        );
                    }
                    Sampling::Greedy
                }
                (_, Some(t)) => Sampling::Sample {
                    temperature: t,
                    top_k: a.top_k,
                    top_p: a.top_p,
                    seed: a.seed,
                },
            };
            sampling.validate()?;
            let spec = a.speculative.then_some(SpecOptions {
                max_k: a.spec_k,
                adaptive: !a.spec_fixed,
            });
            if let Some(spec) = &spec {
                spec.validate()?;
            }
            let tokenizer = match &a.prompt {
                Some(_) => Some(load_tokenizer(&a.model)?),
                None => None,
            };
            let prompt = match (&a.prompt_ids, &a.prompt, &tokenizer) {
                (Some(ids), _, _) => parse_ids(ids)?,
                (None, Some(text), Some(tok)) => tok
                    .encode(text.as_str(), false)
                    .map_err(|e| Error::Tokenizer {
                        path: a.model.join("tokenizer.json").display().to_string(),
                        msg: e.to_string(),
                    })?
                    .get_ids()
                    .to_vec(),
                _ => return Err(Error::Input("give --prompt-ids or --prompt".into()).into()),
            };
            // The session would refuse it too, without the flag's name.
            if prompt.is_empty() {
                let given = match &a.prompt {
                    Some(text) => format!("--prompt {text:?}: the text encodes to no tokens"),
                    None => "--prompt-ids: no token ids given".to_string(),
                };
                return Err(Error::Input(format!("{given}; the prompt needs at least one")).into());
            }
            let model = load_model(&a.model, &cli.graphs, &a.schedule, &a.placement)?;
            let opts = GenerateOptions {
                max_new_tokens: a.max_new_tokens,
                sampling,
                stop_on_eos: !a.ignore_eos,
            };
            let out = match &spec {
                Some(spec) => {
                    let (out, report) =
                        model.session().generate_speculative(&prompt, &opts, spec)?;
                    stderr::line(format_args!("{report}"));
                    out
                }
                None => model.session().generate(&prompt, &opts)?,
            };
            if let Some(tok) = &tokenizer {
                let text = tok.decode(&out, false).map_err(|e| Error::Tokenizer {
                    path: a.model.join("tokenizer.json").display().to_string(),
                    msg: e.to_string(),
                })?;
                print_line(&text)?;
            }
            let ids: Vec<String> = out.iter().map(|t| t.to_string()).collect();
            print_line(&ids.join(","))?;
        }
        Command::Logits(a) => {
            let prompt = parse_ids(&a.prompt_ids)?;
            let model = load_model(&a.model, &cli.graphs, &a.schedule, &a.placement)?;
            let logits = model.session().prefill(&prompt, LogitsMode::All)?;
            let bytes = checkpoint::f32_bytes(&logits.data);
            let t = TensorData {
                name: "logits".into(),
                dtype: DType::F32,
                shape: vec![logits.rows, logits.vocab],
                bytes: std::borrow::Cow::Owned(bytes),
            };
            checkpoint::write_safetensors(&a.out, &[t], None)?;
            stderr::line(format_args!(
                "wrote logits [{}, {}] to {}",
                logits.rows,
                logits.vocab,
                a.out.display()
            ));
        }
        Command::Lower(a) => {
            let plan = match (&a.model, &a.config) {
                (Some(dir), _) => ModelPlan::from_model_dir(dir)?,
                (None, Some(file)) => ModelPlan::from_file(file)?,
                _ => unreachable!("clap requires one of --model/--config"),
            };
            let logits = match a.logits.as_str() {
                "all" => LogitsMode::All,
                "last" => LogitsMode::Last,
                other => {
                    return Err(
                        Error::Input(format!("--logits {other}: expected all or last")).into(),
                    )
                }
            };
            let tokens = match a.phase {
                Phase::Decode => 1,
                Phase::Prefill => a.tokens.unwrap_or(16),
            };
            if a.phase == Phase::Decode && a.tokens.is_some_and(|t| t != 1) {
                return Err(Error::Input(
                    "--phase decode has exactly one token; drop --tokens".into(),
                )
                .into());
            }
            let mut opts = LowerOptions::new(a.phase, tokens, logits);
            if a.draft {
                opts.kind = graphrun::lower::ProgramKind::Draft;
            }
            opts.exports = a.exports;
            opts.device = a.device;
            opts.weight_format = a.weights;
            opts.expert_format = a.experts;
            opts.ple_table = a.ple_table;
            if a.device == graphrun::ir::Device::Cuda {
                opts.device_facts = Some(DeviceFacts::cuda(a.arch, a.sms));
            }
            opts.overrides = a.schedule.overrides()?;
            opts.fusions = a.schedule.fusions();
            opts.exact = a.schedule.verify_exact;
            let graphs = graph_set(&cli.graphs)?;
            let lowered = lower::lower(&plan, &graphs, &opts)?;
            for (name, n) in &lowered.fusion_counts {
                stderr::line(format_args!("fusion {name}: {n} match(es)"));
            }
            let p = &lowered.program;
            stderr::line(format_args!(
                "arena: {} bytes for {} values ({} bytes unshared)",
                p.arena_bytes,
                p.values.len(),
                p.values.iter().map(|v| v.bytes).sum::<usize>()
            ));
            match a.format {
                LowerFormat::Ron => print_line(&p.to_ron())?,
                LowerFormat::Kernels => print_line(lower::dot::kernel_table(p).trim_end())?,
                LowerFormat::Dot => print_line(lower::dot::to_dot(p, &graphs.fusions).trim_end())?,
            }
        }
        Command::Inspect(a) => {
            let plan = ModelPlan::from_model_dir(&a.model)?;
            print_line(&plan.to_string())?;
            // The contract and a scan for NaN and infinity, without widening anything: a
            // checkpoint too large for the host's memory is inspected too.
            let checked = graphrun::runtime::CheckedDir::open(&a.model, graph_set(&cli.graphs)?)?;
            graphrun::weights::contract::check_finite(&checked.ckpt, &checked.resolved)?;
            let summary = checked.summary();
            print_line(&format!(
                "checkpoint: contract holds: {} weights, {} parameters, stored as {}",
                summary.weights, summary.parameters, summary.float_dtype
            ))?;
            for (format, names) in &summary.stored_formats {
                print_line(&format!(
                    "checkpoint: {} weight(s) stored as {format} (first: {})",
                    names.len(),
                    names.first().map_or("", |n| n.as_str())
                ))?;
            }
            print_line(&match &checked.draft {
                graphrun::runtime::checked::DraftHead::Present => format!(
                    "draft head: MTP, {} layer(s), checked with the trunk: --speculative available",
                    checked.plan.mtp_layers
                ),
                graphrun::runtime::checked::DraftHead::Absent(why) => {
                    format!("draft head: none ({why})")
                }
            })?;
            if !summary.unused.is_empty() {
                let shown: Vec<&str> = summary.unused.iter().take(8).map(|s| s.as_str()).collect();
                print_line(&format!(
                    "checkpoint: {} tensor(s) not used by the model (model.visual.*, ...): {}{}",
                    summary.unused.len(),
                    shown.join(", "),
                    if summary.unused.len() > 8 {
                        ", ..."
                    } else {
                        ""
                    }
                ))?;
            }
        }
        Command::Synth(a) => {
            let text = std::fs::read_to_string(&a.config).map_err(|e| Error::Io {
                path: a.config.display().to_string(),
                msg: e.to_string(),
            })?;
            let plan = ModelPlan::from_json_str(&text, &a.config.display().to_string())?;
            let dtype: SynthDtype = a
                .dtype
                .parse()
                .map_err(|e| Error::Input(format!("--dtype {e}")))?;
            let experts: synth::ExpertFormat = a
                .experts
                .parse()
                .map_err(|e| Error::Input(format!("--experts {e}")))?;
            let opts = SynthOptions {
                dtype,
                seed: a.seed,
                shard_bytes: a.shard_mib.max(1) << 20,
                experts,
                sparse: a.sparse,
            };
            synth::write(&plan, &text, &a.out, &opts)?;
            stderr::line(format_args!(
                "wrote a random {dtype}{} checkpoint to {}",
                if a.sparse { " sparse" } else { "" },
                a.out.display()
            ));
        }
        Command::Bench(a) => {
            let text = std::fs::read_to_string(&a.config).map_err(|e| Error::Io {
                path: a.config.display().to_string(),
                msg: e.to_string(),
            })?;
            let schedule = graphrun::bench::Schedule {
                graphs_dir: cli.graphs.clone(),
                overrides: a.schedule.overrides()?,
                fusions: a.schedule.fusions(),
                verify_exact: a.schedule.verify_exact,
            };
            if a.speculative {
                let opts = graphrun::bench::speculative::SpecBenchOptions {
                    on_cpu: a.cpu,
                    layers: a.layers,
                    experts: a.experts,
                    context: a.contexts.iter().copied().max().unwrap_or(1024),
                    steps: a.decode_steps.max(1),
                    max_rows: a.spec_rows,
                    acceptances: a.acceptances.clone(),
                    ple_vocab_base: a.ple_vocab_base,
                    seed: a.seed,
                    schedule: schedule.clone(),
                };
                let origin = a.config.display().to_string();
                let report = graphrun::bench::speculative::run(&text, &origin, &opts)?;
                print_line(&report.to_string())?;
                return write_json(a.json.as_deref(), &report);
            }
            let opts = graphrun::bench::BenchOptions {
                layers: a.layers,
                experts: a.experts,
                contexts: a.contexts.clone(),
                prefills: a.prefills.clone(),
                decode_steps: a.decode_steps.max(1),
                step_rows: a.step_rows.clone(),
                chunk: a.chunk,
                ple_vocab_base: a.ple_vocab_base,
                ple_table: a.ple_table,
                seed: a.seed,
                sweep_linear: a.sweep_linear,
                schedule,
                launch_twice: a.launch_twice.clone(),
                trace: a.trace,
            };
            let report = graphrun::bench::run(&text, &a.config.display().to_string(), &opts)?;
            print_line(&report.to_string())?;
            write_json(a.json.as_deref(), &report)?;
        }
    }
    Ok(())
}

/// Writes `report` as JSON to `path`, where one is given (`--json`).
fn write_json(
    path: Option<&std::path::Path>,
    report: &impl serde::Serialize,
) -> Result<(), Failure> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(report).expect("a report always serialises");
        std::fs::write(path, json).map_err(|e| Error::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
    }
    Ok(())
}

fn load_tokenizer(dir: &std::path::Path) -> Result<tokenizers::Tokenizer, Error> {
    let path = dir.join("tokenizer.json");
    tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::Tokenizer {
        path: path.display().to_string(),
        msg: e.to_string(),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) | Err(Failure::StdoutClosed) => ExitCode::SUCCESS,
        Err(e) => {
            stderr::line(format_args!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
