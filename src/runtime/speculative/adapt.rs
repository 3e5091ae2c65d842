//! How many tokens a round drafts. The acceptance at each draft position is measured as the
//! generation goes (the share of rounds that drafted position `i`, having kept every draft
//! before it, that kept it too; older rounds weigh less); a round of `k` drafts is then
//! expected to emit `1 + a_1 + a_1 a_2 + ... + a_1...a_k` tokens at the cost the executor's
//! cost model gives it (`graphs/speculative.ron`). Each round takes the `k` with the most
//! tokens per cost; when no `k` beats a plain step for `PATIENCE` rounds in a row, drafting
//! stops for the rest of the generation. Everything here depends on the accepted counts alone
//! (no clocks), so a seeded generation is reproducible.

use crate::rules::speculative::SpecRule;

/// The acceptance the first position starts from, and how many rounds' weight a position's
/// prior has.
const PRIOR: f64 = 0.6;
const PRIOR_WEIGHT: f64 = 2.0;
/// Each round's weight relative to the next one's: the last ~20 rounds count.
const DECAY: f64 = 0.95;
/// Rounds before a verdict that drafting does not pay, and rounds in a row it must hold.
const WARMUP: usize = 8;
const PATIENCE: usize = 4;

/// The per-round choice of K.
#[derive(Debug, Clone)]
pub struct AdaptiveK {
    max_k: usize,
    adaptive: bool,
    cost: SpecRule,
    /// By draft position (0: the first draft): decayed rounds that drafted it after keeping
    /// all before it, and of those, decayed rounds that kept it.
    tried: Vec<f64>,
    kept: Vec<f64>,
    rounds: usize,
    losing: usize,
    off: bool,
}

impl AdaptiveK {
    /// At most `max_k` drafts a round; `adaptive: false` drafts `max_k` every round.
    pub fn new(max_k: usize, adaptive: bool, cost: SpecRule) -> AdaptiveK {
        AdaptiveK {
            max_k,
            adaptive,
            cost,
            tried: vec![0.0; max_k],
            kept: vec![0.0; max_k],
            rounds: 0,
            losing: 0,
            off: false,
        }
    }

    /// The acceptance estimated at draft position `i`: its measured share, drawn towards the
    /// estimate of the position before it (towards `PRIOR` for the first) while it has few
    /// rounds. So a position no round has reached yet is expected to do as the last one
    /// measured, and K grows when the deepest drafts tried are kept.
    pub fn acceptance(&self, i: usize) -> f64 {
        let prior = if i == 0 {
            PRIOR
        } else {
            self.acceptance(i - 1)
        };
        (self.kept[i] + prior * PRIOR_WEIGHT) / (self.tried[i] + PRIOR_WEIGHT)
    }

    /// Tokens a round of `k` drafts is expected to emit.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut all_kept = 1.0;
        let mut tokens = 1.0;
        for i in 0..k {
            all_kept *= self.acceptance(i);
            tokens += all_kept;
        }
        tokens
    }

    /// Expected tokens per plain-step cost of a round of `k` drafts (a plain step: 1).
    pub fn rate(&self, k: usize) -> f64 {
        self.expected_tokens(k) / self.cost.round_cost(k)
    }

    /// The drafts of the next round, at most `room` (what the generation still needs beyond the
    /// trunk's own token); 0: a plain step.
    pub fn next_k(&self, room: usize) -> usize {
        let limit = self.max_k.min(room);
        if self.off || limit == 0 {
            return 0;
        }
        if !self.adaptive {
            return limit;
        }
        (1..=limit)
            .max_by(|&a, &b| self.rate(a).total_cmp(&self.rate(b)).then(b.cmp(&a)))
            .unwrap_or(0)
    }

    /// Records a round that drafted `k` and kept `kept` of them.
    pub fn record(&mut self, k: usize, kept: usize) {
        for i in 0..self.max_k {
            self.tried[i] *= DECAY;
            self.kept[i] *= DECAY;
        }
        for i in 0..k.min(kept + 1) {
            self.tried[i] += 1.0;
            if i < kept {
                self.kept[i] += 1.0;
            }
        }
        self.rounds += 1;
        if !self.adaptive {
            return;
        }
        let best = (1..=self.max_k).map(|k| self.rate(k)).fold(0.0, f64::max);
        self.losing = if best < 1.0 { self.losing + 1 } else { 0 };
        if self.rounds >= WARMUP && self.losing >= PATIENCE {
            self.off = true;
        }
    }

    /// Whether drafting has stopped for good (it did not pay).
    pub fn is_off(&self) -> bool {
        self.off
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(verify_row: f64, draft_step: f64) -> SpecRule {
        SpecRule {
            name: "test".into(),
            doc: String::new(),
            when: Default::default(),
            verify_row,
            draft_step,
            priority: 0,
        }
    }

    /// High acceptance and cheap rounds draft deep; low acceptance drafts shallow; drafts that
    /// are never kept, at a cost, stop drafting after the warm-up.
    #[test]
    fn k_follows_the_measured_acceptance() {
        let mut k = AdaptiveK::new(6, true, cost(0.1, 0.08));
        for _ in 0..40 {
            let n = k.next_k(100);
            k.record(n, n);
        }
        assert_eq!(k.next_k(100), 6);
        assert_eq!(k.next_k(3), 3, "bounded by the room left");
        let mut k = AdaptiveK::new(6, true, cost(0.1, 0.08));
        for _ in 0..40 {
            let n = k.next_k(100);
            // Keeps the first draft half the time, never a second.
            k.record(n, usize::from(k.rounds.is_multiple_of(2)).min(n));
        }
        assert!(!k.is_off());
        assert!(k.next_k(100) <= 2, "{}", k.next_k(100));
        let mut k = AdaptiveK::new(6, true, cost(0.5, 0.4));
        for _ in 0..WARMUP + PATIENCE {
            let n = k.next_k(100);
            k.record(n, 0);
        }
        assert!(k.is_off());
        assert_eq!(k.next_k(100), 0);
    }

    #[test]
    fn fixed_k_drafts_the_bound() {
        let mut k = AdaptiveK::new(4, false, cost(0.5, 0.4));
        for _ in 0..20 {
            k.record(4, 0);
        }
        assert!(!k.is_off());
        assert_eq!(k.next_k(100), 4);
        assert_eq!(k.next_k(2), 2);
    }

    #[test]
    fn acceptance_is_measured_by_position() {
        let mut k = AdaptiveK::new(3, true, cost(0.1, 0.1));
        for _ in 0..200 {
            k.record(3, 1);
        }
        // Position 0 always kept, position 1 always refused, position 2 never tried: expected
        // to do as position 1.
        assert!(k.acceptance(0) > 0.9, "{}", k.acceptance(0));
        assert!(k.acceptance(1) < 0.1, "{}", k.acceptance(1));
        assert_eq!(k.acceptance(2), k.acceptance(1));
    }
}
