//! The CPU executor against transformers' `qwen4_exp` on the committed fixtures: logits within
//! 1e-5 relative (per row, to the row's largest |logit|), identical greedy tokens, and chunked
//! prefill + decode equal to one full prefill.

mod common;

use graphrun::exec::Executor;
use graphrun::ir::{LogitsMode, Program};
use graphrun::runtime::sampling::BadLogit;
use graphrun::runtime::{GenerateOptions, Model, ModelOptions, Sampling, Session};

const TOLERANCE: f32 = 1e-5;

#[test]
fn logits_match_transformers() {
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let model = Model::load(&dir, ModelOptions::default()).unwrap();
        let logits = model
            .session()
            .prefill(&exp.prompt, LogitsMode::All)
            .unwrap();
        let err = common::max_row_rel_err(&logits.data, &exp.logits, exp.vocab);
        eprintln!("{}: max row-relative logit error {err:.2e}", dir.display());
        assert!(
            err <= TOLERANCE,
            "{}: logits differ from transformers by {err:e}",
            dir.display()
        );
    }
}

#[test]
fn greedy_tokens_match_transformers() {
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let model = Model::load(&dir, ModelOptions::default()).unwrap();
        let opts = GenerateOptions {
            max_new_tokens: exp.greedy.len(),
            sampling: Sampling::Greedy,
            stop_on_eos: false,
        };
        let got = model.session().generate(&exp.prompt, &opts).unwrap();
        assert_eq!(got, exp.greedy, "{}", dir.display());
    }
}

/// Prefill in two chunks, then the rest one token at a time: every row equals the full prefill
/// (and transformers' own chunked run).
#[test]
fn chunked_prefill_and_decode_equal_full_prefill() {
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let model = Model::load(&dir, ModelOptions::default()).unwrap();
        let full = model
            .session()
            .prefill(&exp.prompt, LogitsMode::All)
            .unwrap();
        let t = exp.prompt.len();
        let mut s = model.session();
        let mut rows = Vec::new();
        let first = t / 3;
        let second = 2 * t / 3;
        rows.extend(
            s.prefill(&exp.prompt[..first], LogitsMode::All)
                .unwrap()
                .data,
        );
        rows.extend(
            s.prefill(&exp.prompt[first..second], LogitsMode::All)
                .unwrap()
                .data,
        );
        for &tok in &exp.prompt[second..] {
            rows.extend(s.decode(tok).unwrap());
        }
        assert_eq!(s.position(), t);
        let err = common::max_row_rel_err(&rows, &full.data, exp.vocab);
        eprintln!("{}: chunked vs full {err:.2e}", dir.display());
        assert!(
            err <= TOLERANCE,
            "{}: chunked prefill differs by {err:e}",
            dir.display()
        );
        let err_hf = common::max_row_rel_err(&rows, &exp.chunked_logits, exp.vocab);
        assert!(
            err_hf <= TOLERANCE,
            "{}: differs from transformers' chunked run by {err_hf:e}",
            dir.display()
        );
    }
}

/// `Session::greedy` (the step that returns only the chosen id: on a GPU it is chosen on the
/// device) picks what `sampling::argmax` picks from the same step's logits, and advances the
/// session the same way.
#[test]
fn greedy_step_is_argmax_of_the_logits() {
    for dir in common::fixture_dirs() {
        let exp = common::expected(&dir);
        let model = Model::load(&dir, ModelOptions::default()).unwrap();
        let (mut a, mut b) = (model.session(), model.session());
        let mut next = a.greedy(&exp.prompt).unwrap();
        let logits = b.prefill(&exp.prompt, LogitsMode::Last).unwrap();
        assert_eq!(next, graphrun::runtime::sampling::argmax(logits.last()));
        for _ in 0..3 {
            let logits = b.decode(next).unwrap();
            next = a.greedy(&[next]).unwrap();
            assert_eq!(next, graphrun::runtime::sampling::argmax(&logits));
            assert_eq!(a.position(), b.position());
        }
    }
}

/// The model in `dir` whose prefill steps take at most `chunk` tokens (`--prefill-chunk`).
fn in_chunks_of(dir: &std::path::Path, chunk: usize) -> Model {
    let options = ModelOptions {
        prefill_chunk: Some(chunk),
        ..Default::default()
    };
    Model::load(dir, options).unwrap()
}

/// The model's executor, recording each step: its tokens, its program's logits, whether it
/// chose the greedy token.
struct Recorded<E> {
    inner: E,
    steps: Vec<(usize, LogitsMode, bool)>,
}

impl<E: Executor> Executor for Recorded<E> {
    fn position(&self) -> usize {
        self.inner.position()
    }
    fn capacity(&self) -> Option<usize> {
        self.inner.capacity()
    }
    fn step(
        &mut self,
        program: &Program,
        tokens: &[i64],
    ) -> graphrun::error::Result<(Vec<f32>, usize)> {
        self.steps.push((tokens.len(), program.logits, false));
        self.inner.step(program, tokens)
    }
    fn step_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
    ) -> graphrun::error::Result<Result<u32, BadLogit>> {
        self.steps.push((tokens.len(), program.logits, true));
        self.inner.step_greedy(program, tokens)
    }
}

fn recorded(model: &Model) -> Session<'_, Recorded<Box<dyn Executor + '_>>> {
    Session::with_executor(
        model,
        Recorded {
            inner: model.executor(),
            steps: Vec::new(),
        },
    )
}

/// A prompt longer than the chunk runs as steps of `chunk` tokens, the last one shorter (the
/// fixtures' prompts, of 16 to 40 tokens: 3 and 7 divide none; past the indexer's budget, so
/// rows select sparsely; one holds an eos, which resets PLE's n-grams), and only the last step
/// asks for what the call returns: the logits of every row, the last row alone and greedy
/// generation equal one step's, bit for bit (the CPU reference computes every row in the same
/// order whatever the step's length).
#[test]
fn prefill_in_chunks_equals_one_step() {
    for dir in common::fixture_dirs() {
        chunks_equal_one_step(&dir, &common::expected(&dir).prompt);
    }
}

fn chunks_equal_one_step(dir: &std::path::Path, prompt: &[u32]) {
    use LogitsMode::{All, Last};
    let gen = GenerateOptions {
        max_new_tokens: 4,
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    };
    let whole = in_chunks_of(dir, prompt.len());
    let all = whole.session().prefill(prompt, All).unwrap();
    let tokens = whole.session().generate(prompt, &gen).unwrap();
    let at = |chunk| format!("{} in chunks of {chunk}", dir.display());
    for chunk in [1, 2, 3, 7] {
        let model = in_chunks_of(dir, chunk);
        let lens: Vec<usize> = prompt.chunks(chunk).map(|c| c.len()).collect();
        let (tail, early) = lens.split_last().unwrap();
        let steps = |mode, greedy| {
            let mut want: Vec<_> = early.iter().map(|&n| (n, mode, false)).collect();
            want.push((*tail, mode, greedy));
            want
        };
        let mut s = recorded(&model);
        assert_eq!(s.prefill_chunk(), Some(chunk));
        let got = s.prefill(prompt, All).unwrap();
        assert_eq!(s.executor().steps, steps(All, false), "{}", at(chunk));
        assert_eq!(s.position(), prompt.len());
        assert_eq!((got.rows, got.vocab), (all.rows, all.vocab));
        let differ = got
            .data
            .iter()
            .zip(&all.data)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let err = common::max_row_rel_err(&got.data, &all.data, all.vocab);
        assert_eq!(
            differ,
            0,
            "{}: {differ} logits differ (max row-relative {err:e})",
            at(chunk)
        );

        let mut s = recorded(&model);
        let last = s.prefill(prompt, Last).unwrap();
        assert_eq!(s.executor().steps, steps(Last, false), "{}", at(chunk));
        assert_eq!(last.rows, 1);
        assert_eq!(last.last(), all.last(), "{}: the last row", at(chunk));

        let mut s = recorded(&model);
        assert_eq!(s.greedy(prompt).unwrap(), tokens[0], "{}", at(chunk));
        assert_eq!(s.executor().steps, steps(Last, true), "{}", at(chunk));
        assert_eq!(
            model.session().generate(prompt, &gen).unwrap(),
            tokens,
            "{}: greedy tokens",
            at(chunk)
        );
    }
}

/// A call the session refuses (a bad token, a context past `--context`, a chunk of 0) runs no
/// step, however many steps it would have taken.
#[test]
fn a_refused_chunked_prefill_runs_no_step() {
    let dir = common::repo().join("models/tiny-qwen4exp");
    let options = |chunk| ModelOptions {
        prefill_chunk: Some(chunk),
        context_capacity: Some(10),
        ..Default::default()
    };
    let model = Model::load(&dir, options(3)).unwrap();
    let mut s = recorded(&model);
    let long: Vec<u32> = (1..=11).collect();
    let err = s.prefill(&long, LogitsMode::All).unwrap_err();
    assert!(err.to_string().contains("exceeds --context 10"), "{err}");
    let mut bad = long[..9].to_vec();
    bad[7] = 256;
    let err = s.greedy(&bad).unwrap_err();
    assert!(
        err.to_string().contains("token id 256 at position 7"),
        "{err}"
    );
    assert_eq!((s.position(), s.executor().steps.len()), (0, 0));
    let model = Model::load(&dir, options(0)).unwrap();
    let mut s = recorded(&model);
    let err = s.prefill(&long[..4], LogitsMode::Last).unwrap_err();
    assert!(err.to_string().contains("at least one token"), "{err}");
    assert_eq!((s.position(), s.executor().steps.len()), (0, 0));
}
