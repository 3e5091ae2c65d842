//! Speculative decoding's cost model as data (`graphs/speculative.ron`): what one round of k
//! drafts costs beside a plain decode step, by executor. The adaptive K
//! (`runtime::speculative::adapt`) weighs the measured acceptance against it. Rules are chosen
//! as the step rules are ([`super::steps`]): the highest priority among those that hold.

use serde::Deserialize;

use super::steps::{StepFacts, StepWhen};

/// One cost model.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecRule {
    pub name: String,
    #[serde(default)]
    pub doc: String,
    #[serde(default)]
    pub when: StepWhen,
    /// What each verify row past the first adds, in plain decode steps.
    pub verify_row: f64,
    /// What one draft-head step costs, in plain decode steps.
    pub draft_step: f64,
    #[serde(default)]
    pub priority: i32,
}

impl SpecRule {
    /// A round of `k` drafts, in plain decode steps: the trunk's step of `k + 1` rows and `k`
    /// draft steps.
    pub fn round_cost(&self, k: usize) -> f64 {
        1.0 + k as f64 * (self.verify_row + self.draft_step)
    }
}

/// Checks a cost-model file's rules; `Err` names the rule and the field.
pub fn check(rules: &[SpecRule]) -> Result<(), String> {
    for (i, r) in rules.iter().enumerate() {
        let err = |msg: &str| Err(format!("speculative rule `{}`: {msg}", r.name));
        if rules[..i].iter().any(|o| o.name == r.name) {
            return err("the name is used twice");
        }
        for (field, v) in [("verify_row", r.verify_row), ("draft_step", r.draft_step)] {
            if !(v.is_finite() && v >= 0.0) {
                return err(&format!(
                    "{field}: {v} is not a cost (a finite number >= 0)"
                ));
            }
        }
    }
    for (i, a) in rules.iter().enumerate() {
        for b in &rules[i + 1..] {
            if a.priority == b.priority && a.when.may_overlap(&b.when) {
                return Err(format!(
                    "speculative rule `{}`: overlaps speculative rule `{}` (same priority {})",
                    a.name, b.name, a.priority
                ));
            }
        }
    }
    Ok(())
}

/// The rule that decides for `facts`.
pub fn choose<'r>(rules: &'r [SpecRule], facts: &StepFacts) -> Option<&'r SpecRule> {
    rules
        .iter()
        .filter(|r| r.when.holds(facts))
        .max_by_key(|r| r.priority)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, verify_row: f64, priority: i32) -> SpecRule {
        SpecRule {
            name: name.into(),
            doc: String::new(),
            when: StepWhen::default(),
            verify_row,
            draft_step: 0.1,
            priority,
        }
    }

    #[test]
    fn bad_costs_and_overlaps_are_refused_by_rule() {
        let err = check(&[rule("a", -1.0, 0)]).unwrap_err();
        assert!(err.contains("`a`: verify_row: -1"), "{err}");
        let err = check(&[rule("a", f64::NAN, 0)]).unwrap_err();
        assert!(err.contains("verify_row: NaN"), "{err}");
        let err = check(&[rule("a", 0.1, 0), rule("b", 0.2, 0)]).unwrap_err();
        assert!(err.contains("`a`: overlaps speculative rule `b`"), "{err}");
        check(&[rule("a", 0.1, 0), rule("b", 0.2, 1)]).unwrap();
        assert_eq!(rule("a", 0.1, 0).round_cost(3), 1.0 + 3.0 * 0.2);
    }
}
