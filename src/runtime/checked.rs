//! A model directory checked before anything is converted: its config planned, its checkpoint's
//! sizes and whole tensor contract checked against the lowered program. What `Model::load` and
//! `graphrun inspect` start from.

use std::collections::BTreeMap;
use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::ir::{LogitsMode, Phase, Program, WeightClass};
use crate::lower::{self, GraphSet, LowerOptions};
use crate::plan::ModelPlan;
use crate::weights::{self, contract::Resolved};

pub struct CheckedDir {
    pub plan: ModelPlan,
    pub graphs: GraphSet,
    pub ckpt: Checkpoint,
    pub resolved: Resolved,
    /// The decode program the contract was checked against.
    pub probe: Program,
    /// Whether the model has an MTP draft head, and if not, why.
    pub draft: DraftHead,
    /// The draft head's decode program, where it has one.
    pub draft_probe: Option<Program>,
}

/// Whether a model can draft tokens for speculative decoding (its `mtp.*` head).
#[derive(Debug, Clone, PartialEq)]
pub enum DraftHead {
    /// The draft head's tensors were checked with the trunk's.
    Present,
    /// No draft: why (for `--speculative`'s error).
    Absent(String),
}

impl DraftHead {
    /// `Ok` with a draft head, else the error `--speculative` gives.
    pub fn require(&self) -> Result<()> {
        match self {
            DraftHead::Present => Ok(()),
            DraftHead::Absent(why) => Err(crate::error::Error::Input(format!(
                "--speculative: speculative decoding is unavailable: {why}"
            ))),
        }
    }
}

/// `trunk` with the nodes and weights of `draft` appended where it has one: what the device
/// keeps weights for (the scans of nodes and weights that decide how each weight is stored see
/// both programs).
pub fn with_draft_weights(trunk: &Program, draft: Option<&Program>) -> Program {
    let mut both = trunk.clone();
    if let Some(d) = draft {
        both.nodes.extend(d.nodes.iter().cloned());
        for w in &d.weights {
            if !both.weights.iter().any(|t| t.name == w.name) {
                both.weights.push(w.clone());
            }
        }
    }
    both
}

/// The prefix of the draft head's tensors in a checkpoint.
pub const DRAFT_PREFIX: &str = "mtp.";

/// The draft head's decode program where the model has one: the config declares its layers,
/// the graph set composes it and the checkpoint holds `mtp.*` tensors (then every one the
/// draft names is checked with the trunk's).
fn draft_probe(
    plan: &ModelPlan,
    graphs: &GraphSet,
    ckpt: &Checkpoint,
) -> Result<(Option<Program>, DraftHead)> {
    let absent = |why: &str| Ok((None, DraftHead::Absent(why.to_string())));
    if !ckpt.names().any(|n| n.starts_with(DRAFT_PREFIX)) {
        return absent("the checkpoint holds no MTP draft head (no `mtp.*` tensors)");
    }
    if plan.mtp_layers == 0 {
        return absent(
            "the config declares no MTP draft layers (mtp_num_hidden_layers), so the \
             checkpoint's `mtp.*` tensors are left unused",
        );
    }
    if graphs.draft.is_none() {
        return absent("the graph set has no draft composition (qwen4exp/mtp.ron)");
    }
    let mut opts = LowerOptions::new(Phase::Decode, 1, LogitsMode::Last);
    opts.kind = lower::ProgramKind::Draft;
    let program = lower::lower(plan, graphs, &opts)?.program;
    Ok((Some(program), DraftHead::Present))
}

/// What a checked checkpoint holds, in figures.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointSummary {
    pub weights: usize,
    pub parameters: usize,
    /// The float dtype of its tensors (`f32`, `bf16`, `f16`).
    pub float_dtype: String,
    /// The weights by the format the checkpoint stores them in (`bf16`, `nvfp4`...).
    pub stored_formats: BTreeMap<String, Vec<String>>,
    /// Tensors the text model does not use (`mtp.*`, `model.visual.*`, ...).
    pub unused: Vec<String>,
}

impl CheckedDir {
    /// Plans `dir/config.json`, opens the safetensors beside it and checks them whole against
    /// the program `graphs` lower (no tensor is read but the small ones the contract checks by
    /// value).
    pub fn open(dir: &Path, graphs: GraphSet) -> Result<CheckedDir> {
        let plan = ModelPlan::from_model_dir(dir)?;
        let ckpt = Checkpoint::open_dir(dir)?;
        let quant = crate::quant::QuantConfig::from_model_dir(dir)?;
        weights::check_sizes(&plan, &ckpt, &dir.display().to_string())?;
        let probe = lower::lower(
            &plan,
            &graphs,
            &LowerOptions::new(Phase::Decode, 1, LogitsMode::Last),
        )?
        .program;
        let (draft_program, draft) = draft_probe(&plan, &graphs, &ckpt)?;
        // The draft's own weights (the lm head and embeddings are the trunk's) are checked
        // with the trunk's, so a missing or misshaped `mtp.*` tensor is named on load.
        let mut expected = probe.weights.clone();
        for w in draft_program.iter().flat_map(|p: &Program| &p.weights) {
            if !expected.iter().any(|e| e.name == w.name) {
                expected.push(w.clone());
            }
        }
        let resolved = weights::check_contract(
            &ckpt,
            &dir.display().to_string(),
            &expected,
            &probe.consts,
            plan.moe.num_experts,
            quant.as_ref(),
        )?;
        Ok(CheckedDir {
            plan,
            graphs,
            ckpt,
            resolved,
            probe,
            draft,
            draft_probe: draft_program,
        })
    }

    /// The float weights' element count (what the CPU reference widens to f32).
    pub fn parameters(&self) -> usize {
        self.resolved
            .weights
            .iter()
            .filter(|(w, _)| w.class == WeightClass::Float)
            .map(|(w, _)| w.shape.iter().product::<usize>())
            .sum()
    }

    pub fn summary(&self) -> CheckpointSummary {
        CheckpointSummary {
            weights: self
                .resolved
                .weights
                .iter()
                .filter(|(w, _)| w.class == WeightClass::Float)
                .count(),
            parameters: self.parameters(),
            float_dtype: self.resolved.float_dtype.clone(),
            stored_formats: self.stored_formats(),
            unused: self.resolved.unused.clone(),
        }
    }

    /// The weights by the format the checkpoint stores them in: an NVFP4 matrix among a
    /// weight's tensors makes it `nvfp4`, else its first tensor's dtype names it.
    pub fn stored_formats(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = Default::default();
        for (w, source) in &self.resolved.weights {
            let tensors = source.tensors();
            let format = if tensors.iter().any(|t| self.resolved.nvfp4.contains_key(*t)) {
                "nvfp4".to_string()
            } else {
                tensors
                    .first()
                    .and_then(|t| self.ckpt.info(t))
                    .map_or_else(|| "?".to_string(), |i| i.dtype.to_string())
            };
            out.entry(format).or_default().push(w.name.clone());
        }
        out
    }
}

/// Memory the host can still give (`MemAvailable` of /proc/meminfo), where the system says.
pub fn host_available_bytes() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
