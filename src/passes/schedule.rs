//! Scheduling: every node gets a kernel variant, chosen by the rules of `graphs/rules.ron`
//! (`crate::rules`), and the kernels that variant launches for it (`crate::registry`).
//!
//! A node's facts (its rows, dimensions and weight format) and the device's decide which rules
//! hold; the winner's variant must accept the node, or lowering fails naming the node, the rule
//! and the kernel's limit. No launcher chooses: the executors launch the kernels named here.

use crate::ir::{Phase, Program};
use crate::lower::error::LowerError;
use crate::registry::{self, DeviceFacts, NodeFacts, StorageFormats};
use crate::rules::{self, Rule};

pub use crate::rules::RuleOverride;

/// What the schedule sees besides the nodes.
pub struct Facts {
    pub phase: Phase,
    pub device: DeviceFacts,
    /// How the executor stores matrices.
    pub formats: StorageFormats,
    /// Verify-exact mode (`LowerOptions::exact`), a fact rules may test.
    pub exact: bool,
}

pub fn run(program: &mut Program, rules: &[Rule], facts: &Facts) -> Result<(), LowerError> {
    let rows = registry::node_rows(program);
    let device = facts.device.device;
    let mut chosen = Vec::with_capacity(program.nodes.len());
    for (node, &r) in program.nodes.iter().zip(&rows) {
        let nf = NodeFacts::of(program, node, r, facts.formats);
        let kind = node.op.kind();
        let invalid = |msg: String| LowerError::Invalid {
            node: node.name.clone(),
            msg,
        };
        let mut best: Option<(&Rule, &registry::Variant)> = None;
        for rule in rules.iter().filter(|r| r.op == kind) {
            let holds = rules::holds(&rule.when, facts.phase, facts.exact, &nf, &facts.device)
                .map_err(|m| LowerError::Rule {
                    rule: rule.name.clone(),
                    msg: m,
                })?;
            if !holds || best.is_some_and(|(b, _)| b.priority >= rule.priority) {
                continue;
            }
            let variant = registry::find(device, kind, &rule.variant).ok_or_else(|| {
                invalid(format!(
                    "rule `{}` names variant `{}`, which {device} does not have for `{kind}`",
                    rule.name, rule.variant
                ))
            })?;
            if rule.where_accepted && (variant.accepts)(&nf, &facts.device).is_err() {
                continue;
            }
            best = Some((rule, variant));
        }
        let (rule_name, variant) = match best {
            Some((rule, v)) => (rule.name.clone(), v),
            None => {
                let v = registry::variants(device, kind).first().ok_or_else(|| {
                    invalid(format!("op `{kind}` has no kernel variant on {device}"))
                })?;
                ("default".to_string(), v)
            }
        };
        (variant.accepts)(&nf, &facts.device).map_err(|why| LowerError::Refused {
            node: node.name.clone(),
            rule: rule_name.clone(),
            variant: format!("{kind}.{}", variant.name),
            kernels: (variant.kernels)(&nf, &facts.device).join(", "),
            why,
        })?;
        chosen.push((
            variant.name.to_string(),
            rule_name,
            (variant.kernels)(&nf, &facts.device),
        ));
    }
    for (node, (variant, rule, kernels)) in program.nodes.iter_mut().zip(chosen) {
        node.variant = variant;
        node.rule = rule;
        node.kernels = kernels;
    }
    Ok(())
}
