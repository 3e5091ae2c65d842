//! Lowering: plan + graph files + phase → a scheduled, validated [`Program`].
//!
//! ```text
//! instantiate (templates, plan dims) → fuse (fusions.ron) → schedule (rules.ron) → memplan → validate
//! ```
//! Lowering needs no weights, so the real config lowers anywhere (`graphrun lower --config`).

pub mod dot;
pub mod error;
pub mod graphset;
pub mod instantiate;
pub mod template;

use std::collections::BTreeMap;

pub use error::LowerError;
pub use graphset::GraphSet;

use crate::ir::{Device, LogitsMode, Phase, Program};
use crate::passes;
use crate::plan::ModelPlan;
use crate::registry::{DeviceFacts, Placement, StorageFormats, WeightFormat};
use crate::rules::RuleOverride;

/// Which program of the model to lower.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ProgramKind {
    /// The model itself (`graphs/qwen4exp/model.ron`).
    #[default]
    Trunk,
    /// The MTP draft head (`graphs/qwen4exp/mtp.ron`).
    Draft,
}

/// What to lower for.
#[derive(Debug, Clone)]
pub struct LowerOptions {
    /// The trunk or the draft head.
    pub kind: ProgramKind,
    /// Whether a trunk program returns its composition's exports (the final hyper state a
    /// speculative session hands the draft); a draft program always does.
    pub exports: bool,
    pub phase: Phase,
    /// Tokens per step (1 for decode).
    pub tokens: usize,
    pub logits: LogitsMode,
    pub overrides: Vec<RuleOverride>,
    /// Fusions to apply: `None` = all of `fusions.ron`, `Some(list)` = only those named.
    pub fusions: Option<Vec<String>>,
    /// The checkpoint's float dtype, when known (fusion predicates may test it).
    pub weight_dtype: Option<String>,
    /// How the executor stores matrices (rules test it; kernel names carry it). `None`: as it
    /// would store `weight_dtype`, or, without one, f32 on the CPU and bf16 (the release's
    /// format) on CUDA.
    pub weight_format: Option<WeightFormat>,
    /// How the executor stores the routed experts' banks, where not as the other matrices
    /// (NVFP4 experts on CUDA).
    pub expert_format: Option<WeightFormat>,
    /// Where a CUDA executor keeps the PLE n-gram table (on the CPU it is always in memory).
    pub ple_table: Placement,
    /// The executor the program is for.
    pub device: Device,
    /// The device's properties the rules and kernels depend on; `None`: the executor's defaults
    /// (`DeviceFacts::default_for`: an H200 for CUDA).
    pub device_facts: Option<DeviceFacts>,
    /// Verify-exact mode: one-token steps take the groupings and kernel variants of the few-row
    /// (verify) steps, whose rows' sums do not depend on the step's other rows, so that a verify
    /// row's logits equal a decode step's bit for bit (the rules and groupings that test
    /// `exact`; docs/speculative.md).
    pub exact: bool,
}

impl LowerOptions {
    pub fn new(phase: Phase, tokens: usize, logits: LogitsMode) -> Self {
        LowerOptions {
            kind: ProgramKind::Trunk,
            exports: false,
            phase,
            tokens,
            logits,
            overrides: Vec::new(),
            fusions: None,
            weight_dtype: None,
            weight_format: None,
            expert_format: None,
            ple_table: Placement::Device,
            device: Device::Cpu,
            device_facts: None,
            exact: false,
        }
    }

    /// The storage format the schedule assumes (see `weight_format`).
    pub fn format(&self) -> WeightFormat {
        self.weight_format
            .unwrap_or_else(|| match &self.weight_dtype {
                Some(d) => WeightFormat::on(self.device, d),
                None if self.device == Device::Cuda => WeightFormat::Bf16,
                None => WeightFormat::F32,
            })
    }

    /// The storage formats the schedule assumes: the experts' as `expert_format` says, else
    /// as the other matrices'.
    pub fn formats(&self) -> StorageFormats {
        let matrices = self.format();
        StorageFormats {
            matrices,
            experts: self.expert_format.unwrap_or(matrices),
            ple_table: match self.device {
                Device::Cpu => Placement::Device,
                Device::Cuda => self.ple_table,
            },
        }
    }
}

/// The lowered program and what the passes report about it.
#[derive(Debug, Clone)]
pub struct Lowered {
    pub program: Program,
    /// How often each fusion fired (and how many nodes each grouping made).
    pub fusion_counts: BTreeMap<String, usize>,
}

pub fn lower(
    plan: &ModelPlan,
    graphs: &GraphSet,
    opts: &LowerOptions,
) -> Result<Lowered, LowerError> {
    if opts.tokens == 0 {
        return Err(LowerError::Options(
            "--tokens 0: a step needs at least one token".into(),
        ));
    }
    // A step longer than the longest sequence the model takes can never run.
    if opts.tokens > plan.max_position_embeddings {
        return Err(LowerError::Options(format!(
            "--tokens {}: more than max_position_embeddings = {}, the longest sequence the model takes",
            opts.tokens, plan.max_position_embeddings
        )));
    }
    if opts.phase == Phase::Decode && opts.tokens != 1 {
        return Err(LowerError::Options(format!(
            "--tokens {}: decode steps have exactly one token",
            opts.tokens
        )));
    }
    let rules = crate::rules::check(&graphs.rules, &opts.overrides)?;
    let mut program = instantiate::instantiate(plan, graphs, opts)?;
    // `opts.fusions` names the fusions and groupings to apply (None: every one of the files).
    if let Some(names) = &opts.fusions {
        for n in names {
            let known = graphs.fusions.iter().any(|f| &f.name == n)
                || graphs.groups.iter().any(|g| &g.name == n);
            if !known {
                return Err(LowerError::Fusion {
                    fusion: n.clone(),
                    msg: "no such fusion in fusions.ron or groups.ron".into(),
                });
            }
        }
    }
    let chosen = |name: &str| {
        opts.fusions
            .as_ref()
            .is_none_or(|ns| ns.iter().any(|n| n == name))
    };
    let fusions: Vec<_> = graphs
        .fusions
        .iter()
        .filter(|f| chosen(&f.name))
        .cloned()
        .collect();
    let groups: Vec<_> = graphs
        .groups
        .iter()
        .filter(|g| chosen(&g.name))
        .cloned()
        .collect();
    let dims = plan.dims();
    let facts = crate::rules::ProgramFacts {
        device: opts.device,
        phase: opts.phase,
        tokens: opts.tokens,
        dims: &dims,
        weight_dtype: opts.weight_dtype.as_deref(),
        exact: opts.exact,
    };
    let mut fusion_counts = passes::fuse::run(&mut program, &fusions, &dims, &facts)?;
    fusion_counts.extend(passes::group::run(&mut program, &groups, &facts)?);
    let device = opts
        .device_facts
        .unwrap_or_else(|| DeviceFacts::default_for(opts.device));
    if device.device != opts.device {
        return Err(LowerError::Options(format!(
            "device facts for {} given to a {} lowering",
            device.device, opts.device
        )));
    }
    let formats = opts.formats();
    if formats.matrices == WeightFormat::Nvfp4 {
        return Err(LowerError::Options(
            "weight format nvfp4 is a format of routed experts only (the expert format)".into(),
        ));
    }
    if formats.experts == WeightFormat::Nvfp4 && opts.device == Device::Cpu {
        return Err(LowerError::Options(
            "NVFP4 experts on the CPU: the CPU reference computes with their f32 widening".into(),
        ));
    }
    let schedule = passes::schedule::Facts {
        phase: opts.phase,
        device,
        formats,
        exact: opts.exact,
    };
    passes::schedule::run(&mut program, &rules, &schedule)?;
    passes::memplan::run(&mut program)?;
    passes::segment::run(&mut program);
    passes::validate::run(&program)?;
    Ok(Lowered {
        program,
        fusion_counts,
    })
}
