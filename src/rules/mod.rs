//! Scheduling rules as data (`graphs/rules.ron`): which kernel variant a node gets, by the
//! program's facts (executor, phase, the step's tokens), the node's own (rows, dimensions,
//! weight format: see `registry::NodeFacts`) and the device's (architecture, multiprocessors).
//!
//! For a node, the rules for its op kind whose predicate holds compete; the highest priority
//! wins. Two rules for one op at one priority that could both hold are refused when the rules
//! are loaded ([`check`]), so the choice never depends on file order. A rule marked
//! `where_accepted` applies only to nodes its variant's kernels accept (for limits that are the
//! kernel's, such as registers a row or shared memory); any other rule whose variant does not
//! accept a node it matches is a lowering error naming the node and the rule. No matching rule:
//! the op's default variant (the first in `registry`). `--rule NAME=VARIANT` replaces a rule's
//! variant, `--rule NAME=off` removes the rule. How many tokens a prefill step takes is chosen
//! the same way, by the step rules of `graphs/steps.ron` ([`steps`]).

pub mod speculative;
pub mod steps;

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::ir::{Device, Phase};
use crate::registry::{self, DeviceFacts, NodeFacts, WeightFormat};

/// One rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    #[serde(default)]
    pub doc: String,
    /// Op kind the rule applies to.
    pub op: String,
    #[serde(default)]
    pub when: When,
    /// Apply only to the nodes the variant's kernels accept.
    #[serde(default)]
    pub where_accepted: bool,
    pub variant: String,
    #[serde(default)]
    pub priority: i32,
}

/// An inclusive range; an absent bound is open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    #[serde(default)]
    pub min: Option<usize>,
    #[serde(default)]
    pub max: Option<usize>,
}

impl Range {
    pub fn holds(&self, v: usize) -> bool {
        self.min.is_none_or(|m| v >= m) && self.max.is_none_or(|m| v <= m)
    }

    /// Whether some value lies in both.
    fn meets(&self, other: &Range) -> bool {
        let lo = self.min.unwrap_or(0).max(other.min.unwrap_or(0));
        let hi = self
            .max
            .unwrap_or(usize::MAX)
            .min(other.max.unwrap_or(usize::MAX));
        lo <= hi
    }

    fn is_empty(&self) -> bool {
        matches!((self.min, self.max), (Some(a), Some(b)) if a > b)
    }
}

/// All given fields must hold.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct When {
    /// The executor the program is for.
    #[serde(default)]
    pub device: Option<Device>,
    #[serde(default)]
    pub phase: Option<Phase>,
    /// The step's tokens (the program's; a node's own rows are the fact `rows`).
    #[serde(default)]
    pub tokens: Range,
    /// The node's named dimensions (`{"n": (min: 65537), "k": (max: 1023)}`); a node without the
    /// dimension is an error naming the rule.
    #[serde(default)]
    pub dims: BTreeMap<String, Range>,
    /// Dimensions that must be multiples of the given values (`{"k": 8}`).
    #[serde(default)]
    pub multiple_of: BTreeMap<String, usize>,
    /// The storage format of the node's matrices on the executor.
    #[serde(default)]
    pub weight: Option<WeightFormat>,
    /// The device's compute capability, major*10 + minor (CUDA).
    #[serde(default)]
    pub arch: Range,
    /// The device's multiprocessors (CUDA).
    #[serde(default)]
    pub sms: Range,
    /// Whether the program is lowered in verify-exact mode (`LowerOptions::exact`: one-token
    /// steps take the variants of the verify steps, so that their rows' sums agree bit for bit).
    #[serde(default)]
    pub exact: Option<bool>,
}

/// A user's override of one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleOverride {
    pub rule: String,
    /// A variant name, or `None` to disable the rule.
    pub variant: Option<String>,
}

/// What is wrong with a rule file or an override.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("rule `{rule}`: {msg}")]
    Rule { rule: String, msg: String },
    #[error("--rule {arg}: {msg}")]
    Override { arg: String, msg: String },
}

impl std::str::FromStr for RuleOverride {
    type Err = RuleError;
    /// `NAME=VARIANT` or `NAME=off`.
    fn from_str(arg: &str) -> Result<Self, RuleError> {
        let (rule, value) = arg.split_once('=').ok_or_else(|| RuleError::Override {
            arg: arg.to_string(),
            msg: "expected NAME=VARIANT or NAME=off".into(),
        })?;
        Ok(RuleOverride {
            rule: rule.trim().to_string(),
            variant: (value.trim() != "off").then(|| value.trim().to_string()),
        })
    }
}

/// As it is written on the command line: `NAME=VARIANT` or `NAME=off`.
impl std::fmt::Display for RuleOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={}",
            self.rule,
            self.variant.as_deref().unwrap_or("off")
        )
    }
}

/// The executors a rule can apply to.
fn rule_devices(rule: &Rule) -> Vec<Device> {
    match rule.when.device {
        Some(d) => vec![d],
        None => vec![Device::Cpu, Device::Cuda],
    }
}

/// The variants a rule may choose from, for messages.
fn variant_list(rule: &Rule) -> String {
    rule_devices(rule)
        .iter()
        .map(|d| format!("{d}: {}", registry::names(*d, &rule.op).join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

fn has_variant(rule: &Rule, variant: &str) -> bool {
    rule_devices(rule)
        .iter()
        .all(|d| registry::find(*d, &rule.op, variant).is_some())
}

/// Checks rules against the registry and each other and applies overrides. Returns the
/// effective rule list.
pub fn check(rules: &[Rule], overrides: &[RuleOverride]) -> Result<Vec<Rule>, RuleError> {
    for o in overrides {
        let Some(rule) = rules.iter().find(|r| r.name == o.rule) else {
            let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
            return Err(RuleError::Override {
                arg: o.to_string(),
                msg: format!("no rule named `{}` (rules: {})", o.rule, names.join(", ")),
            });
        };
        if let Some(v) = &o.variant {
            if !has_variant(rule, v) {
                return Err(RuleError::Override {
                    arg: o.to_string(),
                    msg: format!(
                        "op `{}` has no variant `{v}` (variants: {})",
                        rule.op,
                        variant_list(rule)
                    ),
                });
            }
        }
    }
    let mut effective = Vec::new();
    for rule in rules {
        let err = |msg: String| RuleError::Rule {
            rule: rule.name.clone(),
            msg,
        };
        if rules.iter().filter(|r| r.name == rule.name).count() > 1 {
            return Err(err("the name is used twice".into()));
        }
        if registry::variants(Device::Cpu, &rule.op).is_empty() {
            return Err(err(format!("unknown op `{}`", rule.op)));
        }
        if !has_variant(rule, &rule.variant) {
            return Err(err(format!(
                "op `{}` has no variant `{}` (variants: {})",
                rule.op,
                rule.variant,
                variant_list(rule)
            )));
        }
        let w = &rule.when;
        let empty = std::iter::once(&w.tokens)
            .chain([&w.arch, &w.sms])
            .chain(w.dims.values())
            .any(Range::is_empty);
        if empty || w.multiple_of.values().any(|&m| m == 0) {
            return Err(err(
                "a range whose min exceeds its max, or a multiple of 0, holds for no node".into(),
            ));
        }
        let mut rule = rule.clone();
        match overrides.iter().rev().find(|o| o.rule == rule.name) {
            Some(RuleOverride { variant: None, .. }) => continue,
            Some(RuleOverride {
                variant: Some(v), ..
            }) => rule.variant = v.clone(),
            None => {}
        }
        effective.push(rule);
    }
    for (i, a) in effective.iter().enumerate() {
        for b in &effective[i + 1..] {
            if a.op == b.op && a.priority == b.priority && may_overlap(&a.when, &b.when) {
                return Err(RuleError::Rule {
                    rule: a.name.clone(),
                    msg: format!(
                        "overlaps rule `{}` (same op `{}`, same priority {}): give one a higher priority or disjoint predicates",
                        b.name, a.op, a.priority
                    ),
                });
            }
        }
    }
    Ok(effective)
}

/// Whether some node could satisfy both predicates (multiples are assumed compatible).
fn may_overlap(a: &When, b: &When) -> bool {
    let same = |x: Option<Device>, y: Option<Device>| x.is_none() || y.is_none() || x == y;
    let phase = a.phase.is_none() || b.phase.is_none() || a.phase == b.phase;
    let weight = a.weight.is_none() || b.weight.is_none() || a.weight == b.weight;
    let exact = a.exact.is_none() || b.exact.is_none() || a.exact == b.exact;
    let dims = a
        .dims
        .iter()
        .all(|(d, r)| b.dims.get(d).is_none_or(|s| r.meets(s)));
    same(a.device, b.device)
        && phase
        && weight
        && exact
        && a.tokens.meets(&b.tokens)
        && a.arch.meets(&b.arch)
        && a.sms.meets(&b.sms)
        && dims
}

/// Whether `when` holds for a node of a `phase` program (`exact`: in verify-exact mode) on a
/// device; `Err` names a dimension the predicate tests that the node does not have.
pub fn holds(
    w: &When,
    phase: Phase,
    exact: bool,
    node: &NodeFacts,
    dev: &DeviceFacts,
) -> Result<bool, String> {
    for d in w.dims.keys().chain(w.multiple_of.keys()) {
        if !node.dims.contains_key(d) {
            let known: Vec<&str> = node.dims.keys().map(|k| k.as_str()).collect();
            return Err(format!(
                "tests `{d}`, which `{}` nodes do not have (their facts: tokens, {})",
                node.op,
                known.join(", ")
            ));
        }
    }
    Ok(w.device.is_none_or(|d| d == dev.device)
        && w.phase.is_none_or(|p| p == phase)
        && w.exact.is_none_or(|e| e == exact)
        && w.tokens.holds(node.step)
        && w.dims.iter().all(|(d, r)| r.holds(node.dim(d)))
        && w.multiple_of
            .iter()
            .all(|(d, &m)| node.dim(d).is_multiple_of(m))
        && w.weight.is_none_or(|f| node.weight == Some(f))
        && w.arch.holds(dev.arch as usize)
        && w.sms.holds(dev.sms))
}

/// A predicate over a whole program (a fusion's or grouping's `when`): all given fields must
/// hold.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    /// The executor the program is for.
    #[serde(default)]
    pub device: Option<Device>,
    #[serde(default)]
    pub phase: Option<Phase>,
    #[serde(default)]
    pub min_tokens: Option<usize>,
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// Plan dimensions that must be at least the given values (`{"E": 64}`).
    #[serde(default)]
    pub min_dims: BTreeMap<String, usize>,
    /// The checkpoint's float dtype (`"bf16"`); never holds when lowering without weights.
    #[serde(default)]
    pub weight_dtype: Option<String>,
    /// Whether the program is lowered in verify-exact mode (as `When::exact`).
    #[serde(default)]
    pub exact: Option<bool>,
}

/// What a program-level predicate sees.
pub struct ProgramFacts<'a> {
    pub device: Device,
    pub phase: Phase,
    pub tokens: usize,
    pub dims: &'a crate::ir::dims::Dims,
    /// The checkpoint's float dtype, when known.
    pub weight_dtype: Option<&'a str>,
    /// Verify-exact mode (`LowerOptions::exact`).
    pub exact: bool,
}

pub fn program_holds(p: &Predicate, f: &ProgramFacts) -> bool {
    p.device.is_none_or(|d| d == f.device)
        && p.phase.is_none_or(|ph| ph == f.phase)
        && p.min_tokens.is_none_or(|m| f.tokens >= m)
        && p.max_tokens.is_none_or(|m| f.tokens <= m)
        && p.min_dims
            .iter()
            .all(|(d, min)| f.dims.get(d).is_some_and(|v| v >= min))
        && p.weight_dtype
            .as_deref()
            .is_none_or(|d| f.weight_dtype == Some(d))
        && p.exact.is_none_or(|e| e == f.exact)
}
