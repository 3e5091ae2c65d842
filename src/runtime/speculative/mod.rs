//! Speculative decoding with the MTP draft head (spec mtp-spec-seams-graphs.md §A.4-A.5,
//! §B.4-B.10). The draft is a second sequence on its own executor, running the draft programs
//! (`graphs/qwen4exp/mtp.ron`); its row `r` pairs the trunk's final hyper state after position
//! `r` (the trunk's `hidden` export) with the token at `r + 1`, and its logits there predict the
//! token at `r + 2`.
//!
//! A round at trunk position `m` (the trunk has consumed `m` tokens, the draft `m` rows, `tip`
//! is the last token emitted and not yet consumed, `tip_logits` the draft's prediction after
//! it): draft `k` tokens by chaining one-row draft steps, each seeded by the previous step's
//! `carrier`; verify `[tip, d_1..d_k]` in one trunk step of `k + 1` rows; keep the agreeing
//! drafts ([`accept`]) and one token of the trunk's; rewind both sequences to what the kept rows
//! leave (`Executor::checkpoint` / `rewind`, rerunning rows where the executor keeps no per-row
//! state); the draft then consumes the kept tokens seeded by the verify's true hidden rows.
//!
//! Greedy output equals plain greedy decoding's wherever a step of many rows computes each row
//! as a one-row step does (the CPU reference: tests/parity.rs checks it); sampled output is
//! distributed as plain sampling's (rejection sampling), reproducible for a seed, though not
//! the same tokens as plain sampling with that seed.

pub mod accept;
pub mod adapt;
pub mod report;

pub use report::SpecReport;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::ir::{LogitsMode, Program};
use crate::rules::speculative::{self as cost_rules, SpecRule};
use crate::rules::steps::StepFacts;

use super::model::ProgramKey;
use super::sampling::{BadLogit, Dist, Sampler, Sampling};
use super::session::{GenerateOptions, LogitsError, Session};
use accept::Verdict;
use adapt::AdaptiveK;

/// The most drafts a round takes (`--spec-k`).
pub const MAX_K: usize = 16;

/// The most drafts a round takes in verify-exact mode: its verify steps of up to 8 rows take
/// the one-token steps' kernels (graphs/rules.ron; tests/verify_exact.rs checks 2 to 8 rows).
pub const MAX_EXACT_K: usize = 7;

/// The trunk's export the draft is seeded by, and the draft's own (the next chained seed).
const HIDDEN: &str = "hidden";
const CARRIER: &str = "carrier";

#[derive(Debug, Clone, PartialEq)]
pub struct SpecOptions {
    /// The most drafts a round takes, 1..=[`MAX_K`] (`--spec-k`).
    pub max_k: usize,
    /// Each round's K from the measured acceptance (`adapt`); `false`: `max_k` every round.
    pub adaptive: bool,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            max_k: 5,
            adaptive: true,
        }
    }
}

impl SpecOptions {
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_K).contains(&self.max_k) {
            return Err(Error::Input(format!(
                "--spec-k {}: a round drafts 1 to {MAX_K} tokens",
                self.max_k
            )));
        }
        Ok(())
    }
}

/// Cost figures for an executor no rule of `speculative.ron` covers: a round prices as k
/// plain steps' worth of extra rows (drafting then pays only with every draft kept).
const FALLBACK_COST: (f64, f64) = (0.7, 0.3);

/// Every program a speculative generation runs, lowered before any step does (a lowering
/// error changes nothing).
struct Programs {
    lowered: HashMap<ProgramKey, Arc<Program>>,
}

impl Programs {
    fn get(&self, key: ProgramKey) -> &Program {
        &self.lowered[&key]
    }
}

/// The trunk's step of `rows` tokens that returns its hidden rows (every row's logits for a
/// verify, the last one's for a prefill part).
fn trunk_key(rows: usize, logits: LogitsMode) -> ProgramKey {
    ProgramKey::trunk(rows, logits).with_exports()
}

/// The draft's step of `rows` pairs (the last row's logits).
fn draft_key(rows: usize) -> ProgramKey {
    ProgramKey::draft(rows, LogitsMode::Last)
}

/// The draft sequence: its executor and what its last step left.
struct Draft<'m> {
    exec: Box<dyn Executor + 'm>,
    /// Its prediction after the last token it consumed.
    logits: Vec<f32>,
    /// Its final hyper state at that row (the next chained step's seed).
    carrier: Vec<f32>,
}

impl Draft<'_> {
    /// Consumes `tokens`, row `i` seeded by row `i` of `seeds`.
    fn step(&mut self, program: &Program, tokens: &[u32], seeds: &[f32]) -> Result<()> {
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let out = self.exec.step_with(program, &ids, &[(HIDDEN, seeds)])?;
        let carrier = out
            .export(CARRIER)
            .ok_or_else(|| Error::Input("the draft program exports no `carrier`".into()))?;
        let width = carrier.len() / tokens.len();
        self.carrier = carrier[carrier.len() - width..].to_vec();
        self.logits = out.logits;
        Ok(())
    }
}

/// A step's exports, by name.
type Exports = Vec<(String, Vec<f32>)>;

/// A verify step's rows as the acceptance reads them.
enum VerifyRows {
    /// Each row's greedy choice (or its first NaN).
    Chosen(Vec<std::result::Result<u32, BadLogit>>),
    /// Every row's logits, and the vocabulary.
    Logits(Vec<f32>, usize),
}

/// The draft's choice from its logits: the argmax (greedy), or a draw from the sampler's
/// distribution, with that distribution.
fn draft_choice(sampler: &mut Sampler, logits: &[f32]) -> Result<(u32, Dist)> {
    let dist = sampler.distribution(logits).map_err(draft_logits_error)?;
    let id = match sampler.sampling() {
        Sampling::Greedy => dist[0].0,
        Sampling::Sample { .. } => sampler.draw(&dist),
    };
    Ok((id, dist))
}

fn draft_logits_error(bad: BadLogit) -> Error {
    Error::Input(format!(
        "the MTP draft head's logits hold {} at token id {}: the draft head's numbers broke down",
        bad.value, bad.token
    ))
}

impl<'m, E: Executor> Session<'m, E> {
    /// As [`Session::generate`], drafting with the model's MTP head and verifying the drafts
    /// in one trunk step a round. Refused before anything runs: a model without a draft head,
    /// `spec.max_k` out of range, a session that is not empty, what `generate` refuses.
    pub fn generate_speculative(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        spec: &SpecOptions,
    ) -> Result<(Vec<u32>, SpecReport)> {
        let start = Instant::now();
        self.model.draft.require()?;
        spec.validate()?;
        if self.model.options().verify_exact && spec.max_k > MAX_EXACT_K {
            return Err(Error::Input(format!(
                "--spec-k {} with --verify-exact: verify steps of up to {} rows take the \
                 one-token steps' kernels, so a round drafts at most {MAX_EXACT_K} tokens",
                spec.max_k,
                MAX_EXACT_K + 1
            )));
        }
        let mut sampler = Sampler::new(opts.sampling.clone())?;
        if self.position() != 0 {
            return Err(Error::Input(format!(
                "--speculative: the draft head is seeded from the prompt's prefill, so a \
                 speculative generation starts from an empty session (this one holds {})",
                self.position()
            )));
        }
        self.check_generation(prompt, opts)?;
        let mut report = SpecReport::new(spec.max_k);
        if opts.max_new_tokens == 0 {
            return Ok((Vec::new(), report));
        }
        let chunk = self
            .prefill_chunk()
            .unwrap_or(prompt.len())
            .min(prompt.len());
        if chunk == 0 {
            return Err(Error::Input(
                "ModelOptions::prefill_chunk is 0: a prefill step takes at least one token".into(),
            ));
        }
        let programs = self.lower_speculative(prompt.len(), chunk, spec.max_k)?;
        let mut k_choice = AdaptiveK::new(spec.max_k, spec.adaptive, self.cost_rule());
        let mut draft = Draft {
            exec: self.model.executor(),
            logits: Vec::new(),
            carrier: Vec::new(),
        };
        // Everything a caller can get wrong was checked above; the state changes only from here.
        let (mut tip, draft_time) =
            self.prefill_with_draft(prompt, chunk, &programs, &mut draft, &mut sampler)?;
        report.prefill = start.elapsed() - draft_time;
        report.draft += draft_time;
        let mut out = vec![tip];

        let model = self.model;
        let eos = &model.plan.eos_token_ids;
        let done = |out: &[u32]| {
            out.len() >= opts.max_new_tokens
                || (opts.stop_on_eos && out.last().is_some_and(|t| eos.contains(t)))
        };
        while !done(&out) {
            let m = self.position();
            let k = k_choice.next_k(opts.max_new_tokens - out.len() - 1);
            if k == 0 {
                // A plain step: nothing left to draft, or drafting stopped paying.
                if k_choice.is_off() && report.spec_off_at.is_none() {
                    report.spec_off_at = Some(out.len());
                }
                let t = Instant::now();
                tip = self.plain_step(tip, &mut sampler, out.len())?;
                report.verify += t.elapsed();
                report.plain_steps += 1;
                out.push(tip);
                continue;
            }

            let t = Instant::now();
            let (drafts, dists) = draft_tokens(&mut draft, &programs, &mut sampler, k)?;
            report.draft += t.elapsed();

            // Verify [tip, d_1..d_k] in one step of k + 1 rows; keep what the trunk agrees to.
            let t = Instant::now();
            self.exec.checkpoint()?;
            let ids: Vec<i64> = std::iter::once(tip)
                .chain(drafts.iter().copied())
                .map(|t| t as i64)
                .collect();
            let (rows, hidden) = self.verify(
                programs.get(trunk_key(k + 1, LogitsMode::All)),
                &ids,
                &sampler,
            )?;
            let at_row = |i: usize, bad: BadLogit| {
                // Named at the row's position, as a plain step's NaN would be.
                Error::from(LogitsError {
                    position: m + i,
                    step: Some(out.len() + i),
                    token: bad.token,
                    value: bad.value,
                })
            };
            let emitted = accept_rows(&rows, &drafts, &dists, &mut sampler, at_row)?;
            report.verify += t.elapsed();
            let kept = emitted.len() - 1;
            report.round(k, kept);
            k_choice.record(k, kept);

            // What the generation takes of them: up to max_new_tokens, up to an eos; the trunk
            // keeps the rows they leave fed (the tip and each taken token but the last).
            let mut taken = 0;
            for &id in &emitted {
                out.push(id);
                taken += 1;
                if done(&out) {
                    break;
                }
            }
            let t = Instant::now();
            self.rewind_trunk(&programs, &ids, m, taken)?;
            report.rewind += t.elapsed();
            tip = *out.last().expect("a round emits a token");
            if done(&out) {
                break;
            }
            let t = Instant::now();
            catch_up(&mut draft, &programs, m, &emitted, &hidden, k + 1)?;
            report.draft += t.elapsed();
        }
        out.truncate(opts.max_new_tokens);
        report.tokens = out.len();
        report.total = start.elapsed();
        Ok((out, report))
    }

    /// The prompt's prefill in parts of `chunk`, each part's hidden rows seeding a draft step
    /// one row behind it (draft row j needs the token at j + 1); the last part's last row pairs
    /// with the first new token, which this returns, with the time the draft took.
    fn prefill_with_draft(
        &mut self,
        prompt: &[u32],
        chunk: usize,
        programs: &Programs,
        draft: &mut Draft<'_>,
        sampler: &mut Sampler,
    ) -> Result<(u32, std::time::Duration)> {
        let mut draft_time = std::time::Duration::ZERO;
        let parts: Vec<&[u32]> = prompt.chunks(chunk).collect();
        let mut first = 0;
        let mut tip = 0;
        for (i, part) in parts.iter().enumerate() {
            let ids: Vec<i64> = part.iter().map(|&t| t as i64).collect();
            let program = programs.get(trunk_key(part.len(), LogitsMode::Last));
            let step = self.exec.step_with(program, &ids, &[])?;
            let mut pairs: Vec<u32> =
                prompt[first + 1..(first + part.len() + 1).min(prompt.len())].to_vec();
            if i + 1 == parts.len() {
                tip = sampler
                    .next(&step.logits)
                    .map_err(|bad| self.logits_error(bad, Some(0)))?;
                pairs.push(tip);
            }
            let t = Instant::now();
            draft.step(
                programs.get(draft_key(pairs.len())),
                &pairs,
                hidden_of(&step.exports)?,
            )?;
            draft_time += t.elapsed();
            first += part.len();
        }
        Ok((tip, draft_time))
    }

    /// One token without drafts: the trunk's choice after `tip` (generation step `step`).
    fn plain_step(&mut self, tip: u32, sampler: &mut Sampler, step: usize) -> Result<u32> {
        let program = self
            .model
            .program_for(ProgramKey::trunk(1, LogitsMode::Last))?;
        let chosen = match sampler.sampling() {
            Sampling::Greedy => self.exec.step_greedy(&program, &[tip as i64])?,
            Sampling::Sample { .. } => {
                let (logits, _) = self.exec.step(&program, &[tip as i64])?;
                sampler.next(&logits)
            }
        };
        chosen.map_err(|bad| self.logits_error(bad, Some(step)))
    }

    /// The verify step over `ids`: greedy rounds take each row's choice where the logits are
    /// (on a GPU, 8 bytes a row), sampled ones every row's logits; and the exports.
    fn verify(
        &mut self,
        program: &Program,
        ids: &[i64],
        sampler: &Sampler,
    ) -> Result<(VerifyRows, Exports)> {
        Ok(match sampler.sampling() {
            Sampling::Greedy => {
                let g = self.exec.step_with_greedy(program, ids, &[])?;
                (VerifyRows::Chosen(g.chosen), g.exports)
            }
            Sampling::Sample { .. } => {
                let out = self.exec.step_with(program, ids, &[])?;
                let vocab = out.logits.len() / out.rows;
                (VerifyRows::Logits(out.logits, vocab), out.exports)
            }
        })
    }

    /// Back to the verify's first `keep` rows (of `ids`, from position `m`): the executor
    /// rewinds as far as it can, the rows past where it got are rerun.
    fn rewind_trunk(
        &mut self,
        programs: &Programs,
        ids: &[i64],
        m: usize,
        keep: usize,
    ) -> Result<()> {
        if keep == ids.len() {
            return Ok(());
        }
        let at = self.exec.rewind(m + keep)?;
        if at < m + keep {
            let rerun = &ids[at - m..keep];
            self.exec.step_with(
                programs.get(trunk_key(rerun.len(), LogitsMode::All)),
                rerun,
                &[],
            )?;
        }
        Ok(())
    }

    /// Lowers every program a speculative generation of a `prompt_len` prompt in parts of
    /// `chunk` runs, with rounds of up to `max_k` drafts.
    fn lower_speculative(&self, prompt_len: usize, chunk: usize, max_k: usize) -> Result<Programs> {
        let mut keys = vec![ProgramKey::trunk(1, LogitsMode::Last)];
        let tail = prompt_len - (prompt_len - 1) / chunk * chunk;
        for part in [chunk, tail] {
            keys.push(trunk_key(part, LogitsMode::Last));
            keys.push(draft_key(part));
        }
        for rows in 1..=max_k + 1 {
            keys.push(trunk_key(rows, LogitsMode::All));
            keys.push(draft_key(rows));
        }
        let mut lowered = HashMap::new();
        for key in keys {
            if let std::collections::hash_map::Entry::Vacant(e) = lowered.entry(key) {
                e.insert(self.model.program_for(key)?);
            }
        }
        Ok(Programs { lowered })
    }

    /// The cost model of `graphs/speculative.ron` for this session's executor.
    fn cost_rule(&self) -> SpecRule {
        let facts = StepFacts {
            device: self.model.backend.device(),
            capacity: self.capacity(),
        };
        cost_rules::choose(&self.model.graphs.speculative, &facts)
            .cloned()
            .unwrap_or_else(|| SpecRule {
                name: "fallback".into(),
                doc: "no rule of speculative.ron holds".into(),
                when: Default::default(),
                verify_row: FALLBACK_COST.0,
                draft_step: FALLBACK_COST.1,
                priority: 0,
            })
    }
}

/// The trunk's hidden rows among a step's exports.
fn hidden_of(exports: &[(String, Vec<f32>)]) -> Result<&[f32]> {
    crate::exec::export(exports, HIDDEN)
        .ok_or_else(|| Error::Input("the trunk program exports no `hidden`".into()))
}

/// `k` drafted tokens with the distributions they were drawn from: the first from the draft's
/// last logits, each next from a one-row step seeded by the previous step's carrier (the
/// draft's checkpoint is taken first: these rows are dropped after the verify).
fn draft_tokens(
    draft: &mut Draft<'_>,
    programs: &Programs,
    sampler: &mut Sampler,
    k: usize,
) -> Result<(Vec<u32>, Vec<Dist>)> {
    draft.exec.checkpoint()?;
    let mut drafts = Vec::with_capacity(k);
    let mut dists = Vec::with_capacity(k);
    for j in 0..k {
        if j > 0 {
            let seed = draft.carrier.clone();
            draft.step(programs.get(draft_key(1)), &[drafts[j - 1]], &seed)?;
        }
        let (id, dist) = draft_choice(sampler, &draft.logits)?;
        drafts.push(id);
        dists.push(dist);
    }
    Ok((drafts, dists))
}

/// The tokens a round emits: the drafts the verify rows keep ([`accept::judge`]), then the
/// replacement of the first refused one, or, all kept, the trunk's token after the last.
/// `at_row` names a row no token can be chosen from.
fn accept_rows(
    rows: &VerifyRows,
    drafts: &[u32],
    dists: &[Dist],
    sampler: &mut Sampler,
    at_row: impl Fn(usize, BadLogit) -> Error,
) -> Result<Vec<u32>> {
    let k = drafts.len();
    let mut emitted = Vec::with_capacity(k + 1);
    for i in 0..=k {
        let p = match rows {
            VerifyRows::Chosen(chosen) => vec![(chosen[i].map_err(|b| at_row(i, b))?, 1.0)],
            VerifyRows::Logits(logits, vocab) => sampler
                .distribution(&logits[i * vocab..(i + 1) * vocab])
                .map_err(|b| at_row(i, b))?,
        };
        if i == k {
            emitted.push(sampler.draw(&p));
            break;
        }
        let (u, v) = match sampler.sampling() {
            Sampling::Greedy => (0.0, 0.0),
            Sampling::Sample { .. } => (sampler.uniform(), sampler.uniform()),
        };
        match accept::judge(&p, &dists[i], drafts[i], u, v) {
            Verdict::Keep => emitted.push(drafts[i]),
            Verdict::Replace(id) => {
                emitted.push(id);
                break;
            }
        }
    }
    Ok(emitted)
}

/// The draft back at the round's start `m` (its chained rows dropped), then the emitted tokens
/// consumed, seeded by the verify's true hidden rows m..m + emitted (of its `verify_rows`).
fn catch_up(
    draft: &mut Draft<'_>,
    programs: &Programs,
    m: usize,
    emitted: &[u32],
    exports: &[(String, Vec<f32>)],
    verify_rows: usize,
) -> Result<()> {
    let at = draft.exec.rewind(m)?;
    if at != m {
        return Err(Error::Input(format!(
            "the draft's rewind reached position {at}, not the round's start {m}"
        )));
    }
    let hidden = hidden_of(exports)?;
    let width = hidden.len() / verify_rows;
    let rows = emitted.len();
    draft.step(
        programs.get(draft_key(rows)),
        emitted,
        &hidden[..rows * width],
    )
}
