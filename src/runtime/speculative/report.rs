//! What a speculative generation did: rounds, drafts, acceptance by position, where the time
//! went.

use std::time::Duration;

/// The figures of one speculative generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecReport {
    /// Tokens generated (the first, chosen by the prefill, included).
    pub tokens: usize,
    /// Rounds that drafted (plain steps not counted).
    pub rounds: usize,
    pub drafted: usize,
    pub accepted: usize,
    /// By draft position (0: a round's first draft): rounds that reached it, and that kept it.
    pub tried_at: Vec<usize>,
    pub kept_at: Vec<usize>,
    /// Rounds by the drafts they kept (`[0..=max K]`).
    pub kept_hist: Vec<usize>,
    /// Steps without drafts: after drafting stopped, or where nothing was left to draft.
    pub plain_steps: usize,
    /// The token count at which drafting stopped because it did not pay.
    pub spec_off_at: Option<usize>,
    pub prefill: Duration,
    /// Draft-head steps (prefill catch-up, chains, catch-up after each round).
    pub draft: Duration,
    /// The trunk's verify steps and its plain steps.
    pub verify: Duration,
    /// Rewinds and the trunk rows they rerun.
    pub rewind: Duration,
    pub total: Duration,
}

impl SpecReport {
    pub(super) fn new(max_k: usize) -> SpecReport {
        SpecReport {
            tried_at: vec![0; max_k],
            kept_at: vec![0; max_k],
            kept_hist: vec![0; max_k + 1],
            ..Default::default()
        }
    }

    pub(super) fn round(&mut self, drafted: usize, kept: usize) {
        self.rounds += 1;
        self.drafted += drafted;
        self.accepted += kept;
        self.kept_hist[kept] += 1;
        for i in 0..drafted.min(kept + 1) {
            self.tried_at[i] += 1;
            self.kept_at[i] += usize::from(i < kept);
        }
    }

    /// Kept drafts over drafted ones (0 with none drafted).
    pub fn acceptance(&self) -> f64 {
        ratio(self.accepted, self.drafted)
    }

    /// Tokens a round emitted, on average: its kept drafts and the trunk's own token.
    pub fn mean_accepted_len(&self) -> f64 {
        ratio(self.accepted + self.rounds, self.rounds)
    }

    /// The acceptance at each draft position, given the drafts before it were kept.
    pub fn acceptance_by_position(&self) -> Vec<f64> {
        self.tried_at
            .iter()
            .zip(&self.kept_at)
            .map(|(&t, &k)| ratio(k, t))
            .collect()
    }

    /// Tokens after the first per second of decoding (prefill excluded).
    pub fn tokens_per_s(&self) -> f64 {
        let decode = self.total.saturating_sub(self.prefill).as_secs_f64();
        if decode > 0.0 {
            self.tokens.saturating_sub(1) as f64 / decode
        } else {
            0.0
        }
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl std::fmt::Display for SpecReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(
            f,
            "speculative: {} tokens, {} rounds, {} drafted, {} accepted ({:.3}), {:.2} tokens a round, {} plain steps{}",
            self.tokens,
            self.rounds,
            self.drafted,
            self.accepted,
            self.acceptance(),
            self.mean_accepted_len(),
            self.plain_steps,
            self.spec_off_at
                .map(|t| format!(", drafting stopped at token {t} (it did not pay)"))
                .unwrap_or_default()
        )?;
        let by_pos: Vec<String> = self
            .acceptance_by_position()
            .iter()
            .zip(&self.tried_at)
            .filter(|(_, &t)| t > 0)
            .map(|(a, t)| format!("{a:.2}/{t}"))
            .collect();
        writeln!(
            f,
            "speculative: acceptance by draft position (kept share/rounds): {}",
            by_pos.join(" ")
        )?;
        write!(
            f,
            "speculative: {:.1} tokens/s decoding; ms: prefill {:.1}, draft {:.1}, verify {:.1}, rewind {:.1}, total {:.1}",
            self.tokens_per_s(),
            ms(self.prefill),
            ms(self.draft),
            ms(self.verify),
            ms(self.rewind),
            ms(self.total)
        )
    }
}
