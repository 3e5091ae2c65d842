//! A model: its plan, the graph files, its weights, and the programs lowered so far.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::ir::{LogitsMode, Phase, Program};
use crate::lower::{self, GraphSet, LowerOptions};
use crate::passes::schedule::RuleOverride;
use crate::plan::ModelPlan;
use crate::weights::{self, Weights};

use super::session::Session;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    /// Read graph files from this directory instead of the built-in copy.
    pub graphs_dir: Option<PathBuf>,
    pub overrides: Vec<RuleOverride>,
    /// Only these fusions (`None`: all).
    pub fusions: Option<Vec<String>>,
}

pub struct Model {
    pub plan: ModelPlan,
    pub graphs: GraphSet,
    pub weights: Weights,
    /// Float dtype of the checkpoint (`f32`, `bf16`, `f16`).
    pub weight_dtype: String,
    /// Checkpoint tensors the model does not use (`mtp.*`, `model.visual.*`, ...).
    pub unused_tensors: Vec<String>,
    options: ModelOptions,
    programs: Mutex<HashMap<(Phase, usize, LogitsMode), Arc<Program>>>,
}

impl Model {
    /// Loads `dir/config.json` and the safetensors beside it; the whole tensor contract is checked
    /// before anything is converted.
    pub fn load(dir: &Path, options: ModelOptions) -> Result<Model> {
        let plan = ModelPlan::from_model_dir(dir)?;
        let graphs = match &options.graphs_dir {
            Some(d) => GraphSet::load_dir(d)?,
            None => GraphSet::embedded()?,
        };
        let ckpt = Checkpoint::open_dir(dir)?;
        let probe = lower::lower(
            &plan,
            &graphs,
            &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
        )?;
        let resolved = weights::check_contract(
            &ckpt,
            &dir.display().to_string(),
            &probe.program.weights,
            &probe.program.consts,
            plan.moe.num_experts,
        )?;
        let weights = weights::contract::load(&ckpt, &resolved)?;
        let mut model = Model::from_parts(plan, graphs, weights, options);
        model.weight_dtype = resolved.float_dtype;
        model.unused_tensors = resolved.unused;
        Ok(model)
    }

    /// A model from weights already in memory (tests, synthetic models).
    pub fn from_parts(
        plan: ModelPlan,
        graphs: GraphSet,
        weights: Weights,
        options: ModelOptions,
    ) -> Model {
        Model {
            plan,
            graphs,
            weights,
            weight_dtype: "f32".into(),
            unused_tensors: Vec::new(),
            options,
            programs: Mutex::new(HashMap::new()),
        }
    }

    /// The program for a step, lowered on first use.
    pub fn program(&self, phase: Phase, tokens: usize, logits: LogitsMode) -> Result<Arc<Program>> {
        let key = (phase, tokens, logits);
        if let Some(p) = self.programs.lock().expect("program cache lock").get(&key) {
            return Ok(p.clone());
        }
        let mut opts = LowerOptions::new(phase, tokens, logits);
        opts.overrides = self.options.overrides.clone();
        opts.fusions = self.options.fusions.clone();
        opts.weight_dtype = Some(self.weight_dtype.clone());
        let program = Arc::new(lower::lower(&self.plan, &self.graphs, &opts)?.program);
        self.programs
            .lock()
            .expect("program cache lock")
            .insert(key, program.clone());
        Ok(program)
    }

    pub fn session(&self) -> Session<'_> {
        Session::new(self)
    }
}
