//! A model: its plan, the graph files, its weights, and the programs lowered so far.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::exec::cuda::executor::{DeviceWeights, Instrumentation};
use crate::exec::cuda::{self, Gpu};
use crate::exec::Executor;
use crate::ir::{LogitsMode, Phase, Program};
use crate::lower::{self, GraphSet, LowerOptions, ProgramKind};
use crate::passes::schedule::RuleOverride;
use crate::plan::ModelPlan;
use crate::registry::{Placement, WeightFormat};
use crate::weights::{self, Weights};

use super::backend::{Backend, CudaBackend};
use super::checked::{host_available_bytes, CheckedDir, DraftHead, DRAFT_PREFIX};
use super::memory::MemoryPlan;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    /// Read graph files from this directory instead of the built-in copy.
    pub graphs_dir: Option<PathBuf>,
    pub overrides: Vec<RuleOverride>,
    /// Only these fusions (`None`: all).
    pub fusions: Option<Vec<String>>,
    /// Where programs run.
    pub device: DeviceChoice,
    /// Launch every CUDA step eagerly instead of capturing and replaying CUDA graphs.
    pub no_cuda_graphs: bool,
    /// Synchronise after every node on the GPU (eager), so a kernel fault names its kernel.
    pub cuda_sync_each_node: bool,
    /// On the GPU, launch the nodes of these op kinds twice (measurement only: see
    /// `exec::cuda::executor::Instrumentation::launch_twice`; results may be wrong).
    pub cuda_launch_twice: Vec<String>,
    /// Longest sequence a session holds, on every device (`Session::capacity`): a step past it
    /// is refused. A CUDA session preallocates its caches for it (rounded up to the indexer's
    /// block); unset, a CUDA session holds min(max_position_embeddings, 8192), a CPU session
    /// max_position_embeddings.
    pub context_capacity: Option<usize>,
    /// Where a CUDA model keeps the PLE n-gram table (`--ple-table`); `None`: on the device
    /// when the memory plan fits it there, else on the host (`runtime::memory`).
    pub ple_table: Option<Placement>,
    /// Most tokens one prefill step takes (`--prefill-chunk`; at least 1): a longer prompt runs
    /// as consecutive steps (`Session::prefill_chunk`). Unset: the step rule of
    /// `graphs/steps.ron` that holds for the session.
    pub prefill_chunk: Option<usize>,
    /// Verify-exact mode (`--verify-exact`, `LowerOptions::exact`): one-token steps take the
    /// verify steps' kernels, so that speculative greedy decoding is plain greedy bit for bit on
    /// the GPU too.
    pub verify_exact: bool,
}

impl ModelOptions {
    /// How a step's program is lowered under these options (their rules and fusions) for
    /// `device` and the weights' dtype.
    pub fn lower_options(
        &self,
        phase: Phase,
        tokens: usize,
        logits: LogitsMode,
        device: crate::ir::Device,
        weight_dtype: Option<String>,
    ) -> LowerOptions {
        let mut opts = LowerOptions::new(phase, tokens, logits);
        opts.overrides = self.overrides.clone();
        opts.fusions = self.fusions.clone();
        opts.weight_dtype = weight_dtype;
        opts.device = device;
        opts.exact = self.verify_exact;
        opts
    }

    /// The CUDA executor's instrumentation these options set (`cuda_sync_each_node`,
    /// `cuda_launch_twice`).
    pub fn instrumentation(&self) -> Instrumentation {
        Instrumentation {
            sync_each_node: self.cuda_sync_each_node,
            launch_twice: self.cuda_launch_twice.clone(),
            ..Default::default()
        }
    }

    /// The graph files these options name (a directory, else the built-in copy).
    pub fn graph_set(&self) -> Result<GraphSet> {
        Ok(match &self.graphs_dir {
            Some(d) => GraphSet::load_dir(d)?,
            None => GraphSet::embedded()?,
        })
    }
}

/// A context bound (`--context`) must hold a token and stay within the model's positions.
fn check_context(plan: &ModelPlan, context: Option<usize>) -> Result<()> {
    let max = plan.max_position_embeddings;
    match context {
        Some(0) => Err(Error::Input(
            "--context 0: a session needs room for at least one token".into(),
        )),
        Some(c) if c > max => Err(Error::Input(format!(
            "--context {c}: more than max_position_embeddings = {max}, the longest sequence the \
             model takes"
        ))),
        _ => Ok(()),
    }
}

/// Which executor runs the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    #[default]
    Cpu,
    /// CUDA device 0; an error when there is none.
    Cuda,
    /// CUDA when a device is present, else the CPU (see `Model::fallback_notice`).
    Auto,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "auto" => Ok(DeviceChoice::Auto),
            other => Err(format!(
                "unknown device `{other}` (expected cpu, cuda or auto)"
            )),
        }
    }
}

pub struct Model {
    pub plan: ModelPlan,
    pub graphs: GraphSet,
    pub weights: Weights,
    /// Float dtype of the checkpoint (`f32`, `bf16`, `f16`).
    pub weight_dtype: String,
    /// Checkpoint tensors the model does not use (`mtp.*`, `model.visual.*`, ...).
    pub unused_tensors: Vec<String>,
    /// How the checkpoint stores each weight (`bf16`, `nvfp4`...): the weights by format.
    pub stored_formats: std::collections::BTreeMap<String, Vec<String>>,
    pub backend: Backend,
    /// Why `DeviceChoice::Auto` fell back to the CPU, if it did.
    pub fallback_notice: Option<String>,
    /// How the backend stores the routed experts, where not as the other matrices (NVFP4 banks
    /// on CUDA).
    pub expert_format: Option<WeightFormat>,
    /// How the weights reached the device (a CUDA load from files).
    pub load_report: Option<crate::exec::cuda::executor::LoadReport>,
    /// What the model takes on its device, by part (a CUDA model).
    pub memory_plan: Option<MemoryPlan>,
    /// Where the PLE n-gram table is kept (the device's memory, or the host's on CUDA).
    pub ple_table: Placement,
    options: ModelOptions,
    /// Whether the model drafts tokens for speculative decoding (its MTP head), or why not.
    pub draft: DraftHead,
    programs: Mutex<HashMap<ProgramKey, Arc<Program>>>,
}

/// Which lowered program of a model: `Model::program_for` lowers each once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgramKey {
    pub kind: ProgramKind,
    pub phase: Phase,
    pub tokens: usize,
    pub logits: LogitsMode,
    /// Whether a trunk program returns the final hyper state (the draft's seeds).
    pub exports: bool,
}

impl ProgramKey {
    /// The trunk's step of `tokens` (decode for one, prefill for more), without exports.
    pub fn trunk(tokens: usize, logits: LogitsMode) -> ProgramKey {
        ProgramKey {
            kind: ProgramKind::Trunk,
            phase: if tokens == 1 {
                Phase::Decode
            } else {
                Phase::Prefill
            },
            tokens,
            logits,
            exports: false,
        }
    }

    /// The draft head's step of `tokens` (it always exports its carrier).
    pub fn draft(tokens: usize, logits: LogitsMode) -> ProgramKey {
        ProgramKey {
            kind: ProgramKind::Draft,
            exports: true,
            ..ProgramKey::trunk(tokens, logits)
        }
    }

    pub fn with_exports(self) -> ProgramKey {
        ProgramKey {
            exports: true,
            ..self
        }
    }
}

impl Model {
    /// Loads `dir/config.json` and the safetensors beside it; the whole tensor contract is checked
    /// before anything is converted.
    pub fn load(dir: &Path, options: ModelOptions) -> Result<Model> {
        let checked = CheckedDir::open(dir, options.graph_set()?)?;
        check_context(&checked.plan, options.context_capacity)?;
        let (gpu, fallback_notice) = pick_gpu(options.device)?;
        // On a device, every tensor goes from the mapped files to the device in the format the
        // device keeps it: no host copy of the model. On the CPU, everything is widened to f32.
        let host_weights = match gpu {
            Some(_) => Weights::new(),
            None => {
                fits_the_host(&checked, dir, host_available_bytes())?;
                weights::contract::load(&checked.ckpt, &checked.resolved)?
            }
        };
        let stored_formats = checked.stored_formats();
        let CheckedDir {
            plan,
            graphs,
            ckpt,
            resolved,
            probe,
            draft,
            draft_probe,
        } = checked;
        let mut model = Model::from_parts(plan, graphs, host_weights, options);
        model.draft = draft;
        // The device keeps the draft head's weights beside the trunk's.
        let probe = super::checked::with_draft_weights(&probe, draft_probe.as_ref());
        model.stored_formats = stored_formats;
        model.weight_dtype = resolved.float_dtype.clone();
        model.unused_tensors = resolved.unused.clone();
        model.fallback_notice = fallback_notice;
        if let Some(gpu) = gpu {
            if !resolved.nvfp4.is_empty() {
                model.expert_format = Some(WeightFormat::Nvfp4);
            }
            let bf16 = model.weight_dtype == "bf16";
            let weights = |p| cuda::executor::planned_bytes(&probe, &resolved, bf16, p);
            let memory = model.plan_memory(&gpu, weights)?;
            model.ple_table = memory.ple_table;
            model.memory_plan = Some(memory);
            let (weights, report) =
                DeviceWeights::load(&gpu, &probe, &ckpt, &resolved, bf16, model.ple_table)?;
            model.load_report = Some(report);
            model.backend = cuda_backend(&model.plan, &model.options, gpu, weights);
        }
        Ok(model)
    }

    /// A model whose weights are generated on the GPU (benchmarks at the real geometry: no files,
    /// no host copy; `weights` stays empty): bf16 matrices, the routed experts as `experts`
    /// (bf16 or NVFP4 banks).
    pub fn random_on_gpu(
        plan: ModelPlan,
        gpu: Gpu,
        options: ModelOptions,
        experts: WeightFormat,
        seed: u64,
    ) -> Result<Model> {
        if experts == WeightFormat::F32 {
            return Err(Error::Input(
                "--experts f32: random experts are bf16 or nvfp4".into(),
            ));
        }
        let graphs = options.graph_set()?;
        let probe = lower::lower(
            &plan,
            &graphs,
            &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
        )?;
        // With a draft head where the config declares one (and the graph set composes it).
        let draft = match (plan.mtp_layers, &graphs.draft) {
            (0, _) | (_, None) => None,
            _ => {
                let mut opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
                opts.kind = ProgramKind::Draft;
                Some(lower::lower(&plan, &graphs, &opts)?.program)
            }
        };
        let mut probe = probe;
        probe.program = super::checked::with_draft_weights(&probe.program, draft.as_ref());
        let nvfp4 = experts == WeightFormat::Nvfp4;
        let mut model = Model::from_parts(plan, graphs, Weights::new(), options);
        if draft.is_some() {
            model.draft = DraftHead::Present;
        }
        model.weight_dtype = "bf16".into();
        model.expert_format = nvfp4.then_some(WeightFormat::Nvfp4);
        let program = &probe.program;
        let memory = model.plan_memory(&gpu, |p| {
            cuda::executor::planned_random_bytes(program, nvfp4, p)
        })?;
        model.ple_table = memory.ple_table;
        model.memory_plan = Some(memory);
        let weights = DeviceWeights::random(&gpu, program, true, nvfp4, model.ple_table, seed)?;
        model.backend = cuda_backend(&model.plan, &model.options, gpu, weights);
        Ok(model)
    }

    /// A model from weights already in memory (tests, synthetic models).
    pub fn from_parts(
        plan: ModelPlan,
        graphs: GraphSet,
        weights: Weights,
        options: ModelOptions,
    ) -> Model {
        let draft = draft_in(&plan, &graphs, &weights);
        Model {
            draft,
            plan,
            graphs,
            weights,
            weight_dtype: "f32".into(),
            unused_tensors: Vec::new(),
            stored_formats: Default::default(),
            backend: Backend::Cpu,
            fallback_notice: None,
            expert_format: None,
            load_report: None,
            memory_plan: None,
            ple_table: Placement::Device,
            options,
            programs: Mutex::new(HashMap::new()),
        }
    }

    /// The program for a step, lowered on first use.
    pub fn program(&self, phase: Phase, tokens: usize, logits: LogitsMode) -> Result<Arc<Program>> {
        self.program_for(ProgramKey {
            phase,
            ..ProgramKey::trunk(tokens, logits)
        })
    }

    /// The program `key` names, lowered once for the model's backend and cached.
    pub fn program_for(&self, key: ProgramKey) -> Result<Arc<Program>> {
        let (phase, tokens, logits) = (key.phase, key.tokens, key.logits);
        if let Some(p) = self.programs.lock().expect("program cache lock").get(&key) {
            return Ok(p.clone());
        }
        let mut opts = self.options.lower_options(
            phase,
            tokens,
            logits,
            self.backend.device(),
            Some(self.weight_dtype.clone()),
        );
        opts.expert_format = self.expert_format;
        opts.ple_table = self.ple_table;
        opts.kind = key.kind;
        opts.exports = key.exports;
        // Scheduled for the device the model is on (its arch and multiprocessors).
        if let Backend::Cuda(cuda) = &self.backend {
            opts.device_facts = Some(cuda.gpu.facts());
        }
        let program = Arc::new(lower::lower(&self.plan, &self.graphs, &opts)?.program);
        self.programs
            .lock()
            .expect("program cache lock")
            .insert(key, program.clone());
        Ok(program)
    }

    /// The memory plan of this model on `gpu` (`runtime::memory`), before anything is placed:
    /// `weights(placement)` is what the weights take on the device with the n-gram table kept
    /// there or on the host; the caches and workspace come from this model's decode and
    /// prefill-chunk programs at its context capacity.
    fn plan_memory(&self, gpu: &Gpu, weights: impl Fn(Placement) -> usize) -> Result<MemoryPlan> {
        use cuda::executor::{session_bytes, step_bytes};
        let capacity = cuda_capacity(&self.plan, &self.options);
        let lowered = |phase, tokens| {
            let mut opts = self.options.lower_options(
                phase,
                tokens,
                LogitsMode::Last,
                crate::ir::Device::Cuda,
                Some(self.weight_dtype.clone()),
            );
            opts.expert_format = self.expert_format;
            opts.device_facts = Some(gpu.facts());
            lower::lower(&self.plan, &self.graphs, &opts).map(|l| l.program)
        };
        let decode = lowered(Phase::Decode, 1)?;
        // The prefill step a session of this capacity takes (`Session::prefill_chunk`).
        let facts = crate::rules::steps::StepFacts {
            device: crate::ir::Device::Cuda,
            capacity,
        };
        let chunk = self
            .options
            .prefill_chunk
            .or_else(|| crate::rules::steps::choose(&self.graphs.steps, &facts).map(|r| r.max_rows))
            .unwrap_or(capacity)
            .min(capacity);
        let workspace = step_bytes(&decode, capacity)
            + match chunk {
                0 | 1 => 0,
                // A full chunk's shape and a prompt's last, shorter one (`CudaExecutor` keeps two).
                n => 2 * step_bytes(&lowered(Phase::Prefill, n)?, capacity),
            };
        let (mut caches, mut workspace) = (session_bytes(&decode, capacity), workspace);
        if self.draft == DraftHead::Present {
            // A speculative session: the draft's own caches, its steps, and the verify steps of
            // up to `MAX_K + 1` rows (each shape's arena kept), counted at their largest.
            let rows = crate::runtime::speculative::MAX_K + 1;
            let lowered_as = |key: ProgramKey| {
                let mut opts = self.options.lower_options(
                    key.phase,
                    key.tokens,
                    key.logits,
                    crate::ir::Device::Cuda,
                    Some(self.weight_dtype.clone()),
                );
                opts.expert_format = self.expert_format;
                opts.device_facts = Some(gpu.facts());
                opts.kind = key.kind;
                opts.exports = key.exports;
                lower::lower(&self.plan, &self.graphs, &opts).map(|l| l.program)
            };
            let draft = lowered_as(ProgramKey::draft(1, LogitsMode::Last))?;
            let verify = lowered_as(ProgramKey::trunk(rows, LogitsMode::All).with_exports())?;
            let draft_rows = lowered_as(ProgramKey::draft(rows, LogitsMode::Last))?;
            caches += session_bytes(&draft, capacity);
            workspace += (rows - 1) * step_bytes(&verify, capacity)
                + rows * step_bytes(&draft_rows, capacity)
                + match chunk {
                    0 | 1 => 0,
                    n => {
                        2 * step_bytes(
                            &lowered_as(ProgramKey::draft(n, LogitsMode::Last))?,
                            capacity,
                        )
                    }
                };
        }
        let (on_device, on_host) = (weights(Placement::Device), weights(Placement::Host));
        let needs = super::memory::Needs {
            weights: on_host,
            table: on_device - on_host,
            caches,
            capacity,
            workspace,
        };
        let (free, _) = gpu
            .ctx
            .mem_get_info()
            .map_err(|e| cuda::CudaError::driver("asking the device's free memory", None, e))?;
        MemoryPlan::make(needs, free, self.options.ple_table)
    }

    pub fn options(&self) -> &ModelOptions {
        &self.options
    }

    /// The executor of a new sequence of this model.
    pub fn executor(&self) -> Box<dyn Executor + '_> {
        self.backend.executor(&self.weights)
    }
}

/// The GPU `device` asks for (none for the CPU), and why `Auto` fell back to the CPU if it did.
/// Whether weights built in memory (`Model::from_parts`) hold a draft head the plan and graph
/// set can run.
fn draft_in(plan: &ModelPlan, graphs: &GraphSet, weights: &Weights) -> DraftHead {
    let has = weights.names().any(|n| n.starts_with(DRAFT_PREFIX))
        || weights.nvfp4_names().any(|n| n.starts_with(DRAFT_PREFIX));
    if !has {
        DraftHead::Absent("the weights hold no MTP draft head (no `mtp.*` tensors)".into())
    } else if plan.mtp_layers == 0 {
        DraftHead::Absent("the config declares no MTP draft layers (mtp_num_hidden_layers)".into())
    } else if graphs.draft.is_none() {
        DraftHead::Absent("the graph set has no draft composition (qwen4exp/mtp.ron)".into())
    } else {
        DraftHead::Present
    }
}

fn pick_gpu(device: DeviceChoice) -> Result<(Option<Gpu>, Option<String>)> {
    Ok(match device {
        DeviceChoice::Cpu => (None, None),
        DeviceChoice::Cuda => (Some(Gpu::new(0)?), None),
        DeviceChoice::Auto => match cuda::probe() {
            Ok(_) => (Some(Gpu::new(0)?), None),
            Err(e) => (
                None,
                Some(format!("no CUDA device ({e}); running on the CPU")),
            ),
        },
    })
}

/// The model on `gpu`: each sequence's caches hold `context_capacity` rows (rounded up to the
/// indexer's block), by default min(max_position_embeddings, 8192).
fn cuda_backend(
    plan: &ModelPlan,
    options: &ModelOptions,
    gpu: Gpu,
    weights: DeviceWeights,
) -> Backend {
    let capacity = cuda_capacity(plan, options);
    Backend::Cuda(CudaBackend {
        gpu,
        weights,
        capacity,
        graphs: !options.no_cuda_graphs,
        instrumentation: options.instrumentation(),
    })
}

/// The rows each CUDA sequence's caches hold: `context_capacity`, by default
/// min(max_position_embeddings, 8192), rounded up to the indexer's block.
fn cuda_capacity(plan: &ModelPlan, options: &ModelOptions) -> usize {
    let block = plan.indexer.as_ref().map(|i| i.compress_ratio).unwrap_or(1);
    options
        .context_capacity
        .unwrap_or(plan.max_position_embeddings.min(8192))
        .next_multiple_of(block)
}

/// Refuses a CPU load whose f32 widening cannot fit the host's available memory (`available`,
/// where known), naming the figures, before anything is widened.
fn fits_the_host(checked: &CheckedDir, dir: &Path, available: Option<usize>) -> Result<()> {
    let need = checked.parameters().saturating_mul(4);
    match available {
        Some(have) if need > have => Err(Error::Input(format!(
            "{}: the CPU reference widens every weight to f32, {:.1} GB, and the host has {:.1} GB \
             available; run it on a GPU (--device cuda)",
            dir.display(),
            need as f64 / 1e9,
            have as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (CheckedDir, std::path::PathBuf) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-qwen4exp");
        (
            CheckedDir::open(&dir, GraphSet::embedded().unwrap()).unwrap(),
            dir,
        )
    }

    #[test]
    fn a_cpu_load_past_the_hosts_memory_is_refused_with_the_figures() {
        let (checked, dir) = tiny();
        let need = checked.parameters() * 4;
        let err = fits_the_host(&checked, &dir, Some(need - 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("widens every weight to f32") && err.contains("--device cuda"),
            "{err}"
        );
        assert!(fits_the_host(&checked, &dir, Some(need)).is_ok());
        assert!(
            fits_the_host(&checked, &dir, None).is_ok(),
            "unknown memory: no refusal"
        );
    }
}
