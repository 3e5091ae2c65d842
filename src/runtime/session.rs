//! A session: one sequence of a model, the generation logic over an executor ([`Executor`]) that
//! keeps the sequence's state (KV caches, indexer keys, GDN conv and recurrent states, PLE conv
//! window and token history). Prefilling in chunks and then decoding gives the same logits as one
//! prefill of everything: every step reads and writes only this state. So a prompt longer than
//! [`Session::prefill_chunk`] runs as consecutive steps of that many tokens (the step rules of
//! `graphs/steps.ron`), which bounds what one step holds. A refused call (bad token, over-long
//! context) is refused here, before the executor runs, and leaves it untouched.

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::ir::{LogitsMode, Phase, Program};
use crate::rules::steps::{self, StepFacts};

use super::model::Model;
use super::sampling::{BadLogit, Sampler, Sampling};

/// A step's logits no token can be chosen from (a NaN: the model's numbers broke down). The
/// step ran: the session holds its tokens.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the logits at position {position}{} hold {value} at token id {token}: no next token can be \
     chosen (the model's numbers broke down)",
    step_note(.step)
)]
pub struct LogitsError {
    /// The position of the token whose logits these are.
    pub position: usize,
    /// Which new token of `generate` they were to choose (0: the first), if it was generating.
    pub step: Option<usize>,
    pub token: usize,
    pub value: f32,
}

fn step_note(step: &Option<usize>) -> String {
    step.map(|s| format!(" (generation step {s})"))
        .unwrap_or_default()
}

/// What bounds a session's length (see [`Session::capacity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bound {
    /// `max_position_embeddings`.
    Positions,
    /// `ModelOptions::context_capacity` (`--context`).
    Context,
    /// The executor's preallocated caches (a GPU's), at their default size.
    Device,
}

impl Bound {
    pub(super) fn describe(self, limit: usize) -> String {
        match self {
            Bound::Positions => format!("max_position_embeddings = {limit}"),
            Bound::Context => format!("--context {limit}"),
            Bound::Device => {
                format!("this session's device capacity of {limit} (raise it with --context)")
            }
        }
    }
}

/// Logits `[rows, vocab]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
    pub fn last(&self) -> &[f32] {
        self.row(self.rows - 1)
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop after emitting an eos token (it is included in the output).
    pub stop_on_eos: bool,
}

/// One sequence of a model, run by an executor `E` (by default the one the model's backend gives
/// a new sequence; [`Session::with_executor`] takes any other).
pub struct Session<'m, E = Box<dyn Executor + 'm>> {
    pub(super) model: &'m Model,
    pub(super) exec: E,
}

impl Model {
    /// A new sequence on the model's executor.
    pub fn session(&self) -> Session<'_> {
        Session::with_executor(self, self.executor())
    }
}

impl<'m, E: Executor> Session<'m, E> {
    /// A sequence of `model` on `exec`, which runs the programs `Model::program` lowers for the
    /// model's backend.
    pub fn with_executor(model: &'m Model, exec: E) -> Self {
        Session { model, exec }
    }

    /// The executor (its own settings and measurements, such as the CUDA executor's).
    pub fn executor(&self) -> &E {
        &self.exec
    }

    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.exec
    }

    /// Tokens processed so far.
    pub fn position(&self) -> usize {
        self.exec.position()
    }

    /// Steps that ran as CUDA-graph replays (0 on the CPU).
    pub fn graph_replays(&self) -> usize {
        self.exec.graph_replays()
    }

    /// The longest sequence this session holds: `max_position_embeddings`, bounded by
    /// `ModelOptions::context_capacity` (`--context`) on every device and, where the executor
    /// preallocates them (a GPU), by its caches.
    pub fn capacity(&self) -> usize {
        self.limit().0
    }

    /// [`Self::capacity`] and what sets it (ties: the explicit `--context` first).
    pub(super) fn limit(&self) -> (usize, Bound) {
        let mut bounds = vec![(self.model.plan.max_position_embeddings, Bound::Positions)];
        if let Some(c) = self.model.options().context_capacity {
            bounds.insert(0, (c, Bound::Context));
        }
        if let Some(c) = self.exec.capacity() {
            bounds.push((c, Bound::Device));
        }
        bounds
            .into_iter()
            .min_by_key(|b| b.0)
            .expect("max_position_embeddings is always a bound")
    }

    pub(super) fn check_tokens(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Input("no tokens given".into()));
        }
        let vocab = self.model.plan.vocab_size;
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
            return Err(Error::Input(format!(
                "token id {id} at position {i} is out of range: the vocabulary has {vocab} tokens (0..{})",
                vocab - 1
            )));
        }
        let end = self.position() + ids.len();
        let (limit, bound) = self.limit();
        if end > limit {
            return Err(Error::Input(format!(
                "context of {end} tokens exceeds {}",
                bound.describe(limit)
            )));
        }
        Ok(())
    }

    /// The most tokens one step of [`Self::prefill`] takes: `ModelOptions::prefill_chunk`, else
    /// the step rule of `graphs/steps.ron` that holds for this session; `None`: every prompt is
    /// one step.
    pub fn prefill_chunk(&self) -> Option<usize> {
        self.model.options().prefill_chunk.or_else(|| {
            let facts = StepFacts {
                device: self.model.backend.device(),
                capacity: self.capacity(),
            };
            steps::choose(&self.model.graphs.steps, &facts).map(|r| r.max_rows)
        })
    }

    /// Appends `ids` and returns their logits (all rows, or only the last), in steps of at most
    /// [`Self::prefill_chunk`] tokens.
    pub fn prefill(&mut self, ids: &[u32], logits: LogitsMode) -> Result<Logits> {
        let vocab = self.model.plan.vocab_size;
        let (mut data, rows, (last, last_rows)) =
            self.steps(ids, logits, |e, program, tokens| e.step(program, tokens))?;
        data.extend(last);
        Ok(Logits {
            rows: rows + last_rows,
            vocab,
            data,
        })
    }

    /// Appends `ids` and returns the greedy choice of the next token: the first index of the
    /// largest logit of the last row (`sampling::argmax`). A NaN logit is a [`LogitsError`], on
    /// the CPU and on a GPU (whose device argmax reports the row's first NaN instead of an id).
    pub fn greedy(&mut self, ids: &[u32]) -> Result<u32> {
        self.greedy_step(ids, None)
    }

    /// [`Self::greedy`], a NaN logit's error naming `step` of a generation.
    fn greedy_step(&mut self, ids: &[u32], step: Option<usize>) -> Result<u32> {
        let (_, _, chosen) = self.steps(ids, LogitsMode::Last, |e, program, tokens| {
            e.step_greedy(program, tokens)
        })?;
        chosen.map_err(|bad| self.logits_error(bad, step))
    }

    /// The error for `bad`, a logit of the row of the last token processed.
    pub(super) fn logits_error(&self, bad: BadLogit, step: Option<usize>) -> Error {
        LogitsError {
            position: self.position() - 1,
            step,
            token: bad.token,
            value: bad.value,
        }
        .into()
    }

    /// `ids` as consecutive steps of at most [`Self::prefill_chunk`] tokens, each program
    /// lowered for `logits` (`Last` is the cheapest the IR offers). `last` runs the last step (an
    /// executor entry point: the logits, or the greedy id); returns the earlier steps' logits
    /// (with `All`; none with `Last`), their rows, and `last`'s result.
    fn steps<T>(
        &mut self,
        ids: &[u32],
        logits: LogitsMode,
        last: impl FnOnce(&mut E, &Program, &[i64]) -> Result<T>,
    ) -> Result<(Vec<f32>, usize, T)> {
        self.check_tokens(ids)?;
        let chunk = self.prefill_chunk().unwrap_or(ids.len());
        if chunk == 0 {
            return Err(Error::Input(
                "ModelOptions::prefill_chunk is 0: a prefill step takes at least one token".into(),
            ));
        }
        let chunk = chunk.min(ids.len());
        let parts: Vec<&[u32]> = ids.chunks(chunk).collect();
        let (tail, early) = parts.split_last().expect("check_tokens refuses no tokens");
        // Both step lengths are lowered before any step runs, so a lowering error changes nothing.
        let program = |len: usize| {
            let phase = if len == 1 {
                Phase::Decode
            } else {
                Phase::Prefill
            };
            self.model.program(phase, len, logits)
        };
        let full = program(chunk)?;
        let tail_program = program(tail.len())?;
        let tokens = |part: &[u32]| part.iter().map(|&t| t as i64).collect::<Vec<_>>();
        // Everything a caller can get wrong was checked above; the state changes only from here.
        let mut data = Vec::new();
        let mut rows = 0;
        for part in early {
            let (d, r) = self.exec.step(&full, &tokens(part))?;
            if logits == LogitsMode::All {
                data.extend(d);
                rows += r;
            }
        }
        let result = last(&mut self.exec, &tail_program, &tokens(tail))?;
        Ok((data, rows, result))
    }

    /// Refuses a generation of `opts.max_new_tokens` after `prompt` that the session cannot
    /// hold (every new token but the last is fed back), before anything runs.
    pub(super) fn check_generation(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<()> {
        self.check_tokens(prompt)?;
        let held = self.position() + prompt.len();
        let (limit, bound) = self.limit();
        let fed_back = opts.max_new_tokens.saturating_sub(1);
        if held.checked_add(fed_back).is_none_or(|n| n > limit) {
            let before = match self.position() {
                0 => String::new(),
                p => format!(" after the {p} this session holds"),
            };
            return Err(Error::Input(format!(
                "--max-new-tokens {}: {} prompt tokens{before} and {} new ones (all but the \
                 last fed back) need more than the context of {}; at most {} new tokens fit",
                opts.max_new_tokens,
                prompt.len(),
                opts.max_new_tokens,
                bound.describe(limit),
                limit - held + 1
            )));
        }
        Ok(())
    }

    /// One token; its logits.
    pub fn decode(&mut self, id: u32) -> Result<Vec<f32>> {
        Ok(self.prefill(&[id], LogitsMode::Last)?.data)
    }

    /// Prefills `prompt` and generates up to `max_new_tokens` tokens. Every new token but the
    /// last is fed back, so the session must hold what it holds, the prompt and
    /// `max_new_tokens - 1` tokens within [`Self::capacity`]: a request past it is refused
    /// before any step runs, even one that an eos token might end early. A NaN logit is a
    /// [`LogitsError`] naming its position and step.
    pub fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Vec<u32>> {
        let mut sampler = Sampler::new(opts.sampling.clone())?;
        self.check_generation(prompt, opts)?;
        let mut out = Vec::new();
        if opts.max_new_tokens == 0 {
            return Ok(out);
        }
        // Greedy decoding chooses on the device (8 bytes a token downloaded instead of the
        // logits); sampling needs the logits on the host.
        let greedy = matches!(opts.sampling, Sampling::Greedy);
        let mut next = if greedy {
            self.greedy_step(prompt, Some(0))?
        } else {
            let logits = self.prefill(prompt, LogitsMode::Last)?;
            sampler
                .next(logits.last())
                .map_err(|bad| self.logits_error(bad, Some(0)))?
        };
        loop {
            out.push(next);
            let is_eos = self.model.plan.eos_token_ids.contains(&next);
            if out.len() >= opts.max_new_tokens || (opts.stop_on_eos && is_eos) {
                return Ok(out);
            }
            let step = Some(out.len());
            next = if greedy {
                self.greedy_step(&[next], step)?
            } else {
                let logits = self.decode(next)?;
                sampler
                    .next(&logits)
                    .map_err(|bad| self.logits_error(bad, step))?
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::lower::GraphSet;
    use crate::plan::ModelPlan;
    use crate::runtime::ModelOptions;
    use crate::weights::Weights;

    /// The tiny model with random weights, `edit`ed.
    fn tiny(options: ModelOptions, edit: impl FnOnce(&mut Weights)) -> Model {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tiny-qwen4exp/config.json");
        let plan = ModelPlan::from_file(&config).unwrap();
        let mut weights = crate::synth::random_weights(&plan, 1).unwrap();
        edit(&mut weights);
        Model::from_parts(plan, GraphSet::embedded().unwrap(), weights, options)
    }

    fn generate(model: &Model, prompt: &[u32], sampling: Sampling) -> Result<Vec<u32>> {
        let opts = GenerateOptions {
            max_new_tokens: 6,
            sampling,
            stop_on_eos: false,
        };
        model.session().generate(prompt, &opts)
    }

    /// A token whose embedding is NaN makes every logit after it NaN: generation stops with an
    /// error naming the position and step (argmax alone would have chosen token 0), greedy and
    /// sampled alike.
    #[test]
    fn nan_logits_are_errors_naming_position_and_step() {
        let prompt = [5, 6, 7];
        let clean = generate(&tiny(Default::default(), |_| {}), &prompt, Sampling::Greedy).unwrap();
        // The first generated token fed back that is new to the sequence.
        let k = (0..clean.len() - 1)
            .find(|&k| !prompt.contains(&clean[k]) && !clean[..k].contains(&clean[k]))
            .expect("a new token among the first five generated");
        let bad = clean[k] as usize;
        let poisoned = tiny(Default::default(), |w| {
            let name = "model.embed_tokens.weight";
            let mut e = w.get(name).unwrap().clone();
            let cols = e.shape[1];
            e.data[bad * cols..(bad + 1) * cols].fill(f32::NAN);
            w.insert(name, e);
        });
        let top1 = Sampling::Sample {
            temperature: 1.0,
            top_k: Some(1),
            top_p: None,
            seed: 0,
        };
        for sampling in [Sampling::Greedy, top1] {
            let err = generate(&poisoned, &prompt, sampling.clone()).unwrap_err();
            let Error::Logits(e) = &err else {
                panic!("{sampling:?}: {err}")
            };
            assert_eq!(
                (e.position, e.step),
                (prompt.len() + k, Some(k + 1)),
                "{err}"
            );
            assert!(e.value.is_nan(), "{err}");
            let text = err.to_string();
            assert!(
                text.contains(&format!(
                    "position {} (generation step {})",
                    prompt.len() + k,
                    k + 1
                )),
                "{text}"
            );
        }
        // A single greedy step says where, without a step.
        let mut s = poisoned.session();
        let err = s.greedy(&[1, bad as u32]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the logits at position 1 hold NaN"),
            "{err}"
        );
    }

    /// `context_capacity` (`--context`) bounds a CPU session: a step past it is refused, as is a
    /// generation that would outgrow it, and neither changes the session.
    #[test]
    fn context_bounds_a_cpu_session() {
        let model = tiny(
            ModelOptions {
                context_capacity: Some(4),
                ..Default::default()
            },
            |_| {},
        );
        let mut s = model.session();
        assert_eq!(s.capacity(), 4);
        let err = s.prefill(&[1, 2, 3, 4, 5], LogitsMode::Last).unwrap_err();
        assert!(err.to_string().contains("exceeds --context 4"), "{err}");
        // 2 prompt tokens and 3 fed back of 4 new ones: 5 positions.
        let opts = GenerateOptions {
            max_new_tokens: 4,
            sampling: Sampling::Greedy,
            stop_on_eos: false,
        };
        let err = s.generate(&[1, 2], &opts).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--max-new-tokens 4: 2 prompt tokens and 4 new ones")
                && err.to_string().contains("at most 3 new tokens fit"),
            "{err}"
        );
        assert_eq!(s.position(), 0);
        s.prefill(&[1, 2, 3], LogitsMode::Last).unwrap();
        let err = s.generate(&[4], &opts).unwrap_err();
        assert!(
            err.to_string().contains("after the 3 this session holds"),
            "{err}"
        );
        assert_eq!(s.position(), 3);
        // Exactly full: the one new token is not fed back.
        let fits = GenerateOptions {
            max_new_tokens: 1,
            ..opts
        };
        assert_eq!(s.generate(&[4], &fits).unwrap().len(), 1);
        assert_eq!(s.position(), 4);
        let err = s.decode(5).unwrap_err();
        assert!(
            err.to_string()
                .contains("context of 5 tokens exceeds --context 4"),
            "{err}"
        );
        assert_eq!(s.position(), 4);
        // Unbounded, the model's positions are the limit.
        let model = tiny(Default::default(), |_| {});
        assert_eq!(
            model.session().capacity(),
            model.plan.max_position_embeddings
        );
    }
}
