//! Scheduling: every node gets a kernel variant, chosen by the rules of `graphs/rules.ron`.
//!
//! For a node, the rules for its op kind whose predicate holds compete; the highest priority
//! wins. Equal priorities that can both hold are refused when the rules are loaded (`check_rules`),
//! so the choice never depends on file order. No matching rule: the kind's reference variant
//! (the first in `ops::variants`). `--rule NAME=VARIANT` replaces a rule's variant,
//! `--rule NAME=off` removes the rule.

use crate::ir::dims::Dims;
use crate::ir::{Device, Phase, Program};
use crate::lower::template::{Predicate, Rule};
use crate::lower::LowerError;
use crate::ops;

/// A user's override of one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleOverride {
    pub rule: String,
    /// A variant name, or `None` to disable the rule.
    pub variant: Option<String>,
}

impl std::str::FromStr for RuleOverride {
    type Err = LowerError;
    /// `NAME=VARIANT` or `NAME=off`.
    fn from_str(arg: &str) -> Result<Self, LowerError> {
        let (rule, value) = arg.split_once('=').ok_or_else(|| LowerError::Override {
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

/// What the predicates see.
pub struct Facts<'a> {
    pub device: Device,
    pub phase: Phase,
    pub tokens: usize,
    pub dims: &'a Dims,
    pub weight_dtype: Option<&'a str>,
}

/// Checks rules against the op catalogue and each other; applies overrides. Returns the
/// effective rule list.
pub fn check_rules(rules: &[Rule], overrides: &[RuleOverride]) -> Result<Vec<Rule>, LowerError> {
    for o in overrides {
        let Some(rule) = rules.iter().find(|r| r.name == o.rule) else {
            let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
            return Err(LowerError::Override {
                arg: format!("{}={}", o.rule, o.variant.as_deref().unwrap_or("off")),
                msg: format!("no rule named `{}` (rules: {})", o.rule, names.join(", ")),
            });
        };
        if let Some(v) = &o.variant {
            if !rule_devices(rule)
                .iter()
                .all(|d| ops::variants_on(*d, &rule.op).contains(&v.as_str()))
            {
                return Err(LowerError::Override {
                    arg: format!("{}={v}", o.rule),
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
        let err = |msg: String| LowerError::Rule {
            rule: rule.name.clone(),
            msg,
        };
        if rules.iter().filter(|r| r.name == rule.name).count() > 1 {
            return Err(err("the name is used twice".into()));
        }
        if ops::variants(&rule.op).is_empty() {
            return Err(err(format!("unknown op `{}`", rule.op)));
        }
        let valid = rule_devices(rule)
            .iter()
            .all(|d| ops::variants_on(*d, &rule.op).contains(&rule.variant.as_str()));
        let variants = variant_list(rule);
        if !valid {
            return Err(err(format!(
                "op `{}` has no variant `{}` (variants: {})",
                rule.op, rule.variant, variants
            )));
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
                return Err(LowerError::Rule {
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
        .map(|d| format!("{d}: {}", ops::variants_on(*d, &rule.op).join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether some program could satisfy both predicates.
fn may_overlap(a: &Predicate, b: &Predicate) -> bool {
    let device = a.device.is_none() || b.device.is_none() || a.device == b.device;
    let phase = a.phase.is_none() || b.phase.is_none() || a.phase == b.phase;
    let lo = a.min_tokens.unwrap_or(1).max(b.min_tokens.unwrap_or(1));
    let hi = a
        .max_tokens
        .unwrap_or(usize::MAX)
        .min(b.max_tokens.unwrap_or(usize::MAX));
    let dtype =
        a.weight_dtype.is_none() || b.weight_dtype.is_none() || a.weight_dtype == b.weight_dtype;
    device && phase && lo <= hi && dtype
}

pub(crate) fn holds(p: &Predicate, f: &Facts) -> bool {
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
}

pub fn run(program: &mut Program, rules: &[Rule], facts: &Facts) -> Result<(), LowerError> {
    for node in &mut program.nodes {
        let kind = node.op.kind();
        let best = rules
            .iter()
            .filter(|r| r.op == kind && holds(&r.when, facts))
            .max_by_key(|r| r.priority);
        match best {
            Some(rule) => {
                node.variant = rule.variant.clone();
                node.rule = rule.name.clone();
            }
            None => {
                let reference = ops::variants_on(facts.device, kind)
                    .first()
                    .ok_or_else(|| LowerError::Invalid {
                        node: node.name.clone(),
                        msg: format!("op `{kind}` has no kernel variant"),
                    })?;
                node.variant = reference.to_string();
                node.rule = "default".into();
            }
        }
    }
    Ok(())
}
