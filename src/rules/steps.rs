//! Step rules as data (`graphs/steps.ron`): the most tokens one prefill step takes. A prompt
//! longer than that runs as consecutive steps of `max_rows` tokens, the last one shorter
//! (`runtime::Session::prefill`); the result is the same as one step's, since every step reads
//! and writes only the sequence's state.
//!
//! The rules whose predicate holds for a session compete; the highest priority wins. Two rules
//! at one priority that could both hold are refused when the file is loaded ([`check`]). No rule
//! holds: the whole prompt is one step. `ModelOptions::prefill_chunk` (`--prefill-chunk N`)
//! replaces the rules' choice.

use serde::Deserialize;

use super::Range;
use crate::ir::Device;

/// One rule.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRule {
    pub name: String,
    #[serde(default)]
    pub doc: String,
    #[serde(default)]
    pub when: StepWhen,
    /// The most tokens (rows) one prefill step takes; at least 1.
    pub max_rows: usize,
    #[serde(default)]
    pub priority: i32,
}

/// All given fields must hold.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepWhen {
    /// The executor the session's programs are for.
    #[serde(default)]
    pub device: Option<Device>,
    /// The session's capacity (`Session::capacity`, its longest sequence): what a CUDA
    /// session's caches, and the indexer's scratch a row, are sized by.
    #[serde(default)]
    pub capacity: Range,
}

/// What a step rule sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepFacts {
    pub device: Device,
    pub capacity: usize,
}

impl StepWhen {
    pub fn holds(&self, f: &StepFacts) -> bool {
        self.device.is_none_or(|d| d == f.device) && self.capacity.holds(f.capacity)
    }

    /// Whether some session could satisfy both.
    pub(crate) fn may_overlap(&self, other: &StepWhen) -> bool {
        let device = self.device.is_none() || other.device.is_none() || self.device == other.device;
        device && self.capacity.meets(&other.capacity)
    }
}

/// Checks a step rule file's rules on their own and against each other; `Err` names the rule
/// and the field (the caller adds the file).
pub fn check(rules: &[StepRule]) -> Result<(), String> {
    for (i, r) in rules.iter().enumerate() {
        let err = |msg: &str| Err(format!("step rule `{}`: {msg}", r.name));
        if rules[..i].iter().any(|o| o.name == r.name) {
            return err("the name is used twice");
        }
        if r.max_rows == 0 {
            return err("max_rows: 0 takes no token; a step takes at least 1");
        }
        if r.when.capacity.is_empty() {
            return err("when.capacity: its min exceeds its max, so it holds for no session");
        }
    }
    for (i, a) in rules.iter().enumerate() {
        for b in &rules[i + 1..] {
            if a.priority == b.priority && a.when.may_overlap(&b.when) {
                return Err(format!(
                    "step rule `{}`: overlaps step rule `{}` (same priority {}): give one a \
                     higher priority or disjoint predicates",
                    a.name, b.name, a.priority
                ));
            }
        }
    }
    Ok(())
}

/// The rule that decides for `facts`: the highest priority among those that hold (`check`ed
/// rules: never two at one priority).
pub fn choose<'r>(rules: &'r [StepRule], facts: &StepFacts) -> Option<&'r StepRule> {
    rules
        .iter()
        .filter(|r| r.when.holds(facts))
        .max_by_key(|r| r.priority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, when: StepWhen, max_rows: usize, priority: i32) -> StepRule {
        StepRule {
            name: name.into(),
            doc: String::new(),
            when,
            max_rows,
            priority,
        }
    }

    fn on(device: Device) -> StepWhen {
        StepWhen {
            device: Some(device),
            ..Default::default()
        }
    }

    #[test]
    fn the_highest_priority_that_holds_decides() {
        let long = StepWhen {
            device: Some(Device::Cuda),
            capacity: Range {
                min: Some(65536),
                max: None,
            },
        };
        let rules = vec![
            rule("cuda", on(Device::Cuda), 4096, 10),
            rule("cuda.long", long, 1024, 20),
            rule("cpu", on(Device::Cpu), 512, 10),
        ];
        check(&rules).unwrap();
        let pick = |device, capacity| {
            choose(&rules, &StepFacts { device, capacity }).map(|r| r.name.as_str())
        };
        assert_eq!(pick(Device::Cuda, 8192), Some("cuda"));
        assert_eq!(pick(Device::Cuda, 65536), Some("cuda.long"));
        assert_eq!(pick(Device::Cpu, 1 << 20), Some("cpu"));
        let cpu = StepFacts {
            device: Device::Cpu,
            capacity: 8,
        };
        assert_eq!(choose(&rules[..2], &cpu), None, "no rule: one step");
    }

    #[test]
    fn bad_rules_are_refused_by_name_and_field() {
        let err = check(&[rule("zero", on(Device::Cpu), 0, 1)]).unwrap_err();
        assert!(err.starts_with("step rule `zero`: max_rows: 0"), "{err}");
        let empty = StepWhen {
            capacity: Range {
                min: Some(9),
                max: Some(8),
            },
            ..Default::default()
        };
        let err = check(&[rule("empty", empty, 8, 1)]).unwrap_err();
        assert!(err.starts_with("step rule `empty`: when.capacity"), "{err}");
        let twice = [
            rule("a", on(Device::Cpu), 8, 1),
            rule("a", on(Device::Cuda), 8, 1),
        ];
        assert!(check(&twice).unwrap_err().contains("used twice"));
        // Any device overlaps one; disjoint devices or priorities do not.
        let clash = [
            rule("any", StepWhen::default(), 8, 1),
            rule("cuda", on(Device::Cuda), 8, 1),
        ];
        let err = check(&clash).unwrap_err();
        assert!(err.contains("overlaps step rule `cuda`"), "{err}");
        check(&[
            rule("any", StepWhen::default(), 8, 0),
            rule("cuda", on(Device::Cuda), 8, 1),
            rule("cpu", on(Device::Cpu), 8, 1),
        ])
        .unwrap();
    }
}
