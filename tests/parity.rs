//! The CPU executor against transformers' `qwen4_exp` on the committed fixtures: logits within
//! 1e-5 relative (per row, to the row's largest |logit|), identical greedy tokens, and chunked
//! prefill + decode equal to one full prefill.

mod common;

use graphrun::ir::LogitsMode;
use graphrun::runtime::{GenerateOptions, Model, ModelOptions, Sampling};

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
