//! Speculative decoding with the MTP draft head on the CPU reference: greedy output equal to
//! plain greedy's on every fixture (prompts of many lengths, long generations, rounds that keep
//! none, some and all of their drafts, prefill in parts, eos), sampled output distributed as
//! plain sampling's, and the refusals.

mod common;

use std::path::Path;

use graphrun::ir::LogitsMode;
use graphrun::runtime::{
    GenerateOptions, Model, ModelOptions, Sampler, Sampling, SpecOptions, SpecReport,
};

/// The fixture in `dir` with a random MTP head of one layer (seeded by `seed`); with `boost`,
/// the lm head's rows of `boost` tokens scaled up, so that trunk and draft choose among them
/// and agree often (random weights alone make the draft's guesses nearly always wrong).
fn with_draft(dir: &Path, seed: u64, boost: &[u32], options: ModelOptions) -> Model {
    let loaded = Model::load(dir, options.clone()).unwrap();
    let mut plan = loaded.plan.clone();
    plan.mtp_layers = 1;
    let head = graphrun::synth::random_weights(&plan, seed).unwrap();
    let mut weights = loaded.weights;
    for name in head.names().filter(|n| n.starts_with("mtp.")) {
        weights.insert(name, head.get(name).unwrap().clone());
    }
    if !boost.is_empty() {
        let name = if weights.get("lm_head.weight").is_some() {
            "lm_head.weight"
        } else {
            "model.embed_tokens.weight"
        };
        let mut head = weights.get(name).unwrap().clone();
        let cols = head.shape[1];
        for &t in boost {
            for v in &mut head.data[t as usize * cols..(t as usize + 1) * cols] {
                *v *= 6.0;
            }
        }
        weights.insert(name, head);
    }
    let mut model = Model::from_parts(plan, loaded.graphs, weights, options);
    model.weight_dtype = loaded.weight_dtype;
    model.expert_format = loaded.expert_format;
    model
}

fn greedy(max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        sampling: Sampling::Greedy,
        stop_on_eos: false,
    }
}

/// `prompt`'s tokens cycled to `len`.
fn prompt_of(prompt: &[u32], len: usize) -> Vec<u32> {
    prompt.iter().cycle().take(len).copied().collect()
}

/// Speculative greedy equals plain greedy, token for token, and the session ends where plain
/// decoding's does (every token but the last fed).
fn check_greedy(
    model: &Model,
    prompt: &[u32],
    opts: &GenerateOptions,
    spec: &SpecOptions,
) -> SpecReport {
    let plain = model.session().generate(prompt, opts).unwrap();
    let mut s = model.session();
    let (got, report) = s.generate_speculative(prompt, opts, spec).unwrap();
    let at = format!("prompt of {}, {spec:?}", prompt.len());
    assert_eq!(got, plain, "{at}");
    assert_eq!(s.position(), prompt.len() + got.len() - 1, "{at}");
    assert_eq!(report.tokens, got.len(), "{at}");
    // The session continues as plain decoding's would.
    let mut p = model.session();
    p.prefill(prompt, LogitsMode::Last).unwrap();
    for &t in &plain[..plain.len() - 1] {
        p.decode(t).unwrap();
    }
    let last = *got.last().unwrap();
    assert_eq!(s.decode(last).unwrap(), p.decode(last).unwrap(), "{at}");
    report
}

/// On every fixture, with an untouched trunk (the random draft is nearly always refused) and
/// with a boosted lm head (drafts often kept): greedy speculative decoding gives plain greedy's
/// tokens for prompts of 1 to 40 tokens, rounds of 1 to 8 drafts, fixed and adaptive, and the
/// rounds kept none, some and all of their drafts.
#[test]
fn greedy_speculative_equals_plain_greedy_on_every_fixture() {
    let mut hist = vec![0usize; 9];
    let mut partial = 0;
    for dir in common::fixture_dirs() {
        let base = common::expected(&dir).prompt;
        let boost = [3, 17, 40, 77, 90];
        for (seed, boosted) in [(1, &[][..]), (2, &boost[..])] {
            let model = with_draft(&dir, seed, boosted, ModelOptions::default());
            for (len, k, adaptive) in [
                (1, 3, true),
                (2, 1, false),
                (5, 4, false),
                (13, 8, false),
                (base.len(), 5, true),
                (40, 2, false),
            ] {
                let spec = SpecOptions { max_k: k, adaptive };
                let report = check_greedy(&model, &prompt_of(&base, len), &greedy(33), &spec);
                for (a, n) in report.kept_hist.iter().enumerate() {
                    hist[a] += n;
                    if a > 0 && a < k {
                        partial += n;
                    }
                }
            }
        }
    }
    assert!(hist[0] > 0, "no round refused its first draft: {hist:?}");
    assert!(
        partial > 0,
        "no round kept some but not all drafts: {hist:?}"
    );
    assert!(
        hist[8] + hist[4] + hist[5] > 0,
        "no deep round kept all: {hist:?}"
    );
}

/// Prefill in parts (the draft one row behind the trunk in each), and an eos that ends the
/// generation inside a round: still plain greedy's tokens.
#[test]
fn greedy_speculative_in_prefill_parts_and_to_an_eos() {
    let dir = common::repo().join("models/tiny-qwen4exp");
    let base = common::expected(&dir).prompt;
    for chunk in [1, 3, 7] {
        let options = ModelOptions {
            prefill_chunk: Some(chunk),
            ..Default::default()
        };
        let model = with_draft(&dir, 3, &[3, 17, 40], options);
        check_greedy(&model, &base, &greedy(20), &SpecOptions::default());
    }
    // eos (id 2) among the favoured tokens, so that a round emits it with tokens after it.
    let model = with_draft(&dir, 3, &[2, 17, 40], ModelOptions::default());
    let opts = GenerateOptions {
        stop_on_eos: true,
        ..greedy(60)
    };
    let mut stopped = false;
    for len in [3, 9, 16] {
        let prompt = prompt_of(&base, len);
        let plain = model.session().generate(&prompt, &opts).unwrap();
        stopped |= plain.len() < 60;
        let spec = SpecOptions {
            max_k: 6,
            adaptive: false,
        };
        check_greedy(&model, &prompt, &opts, &spec);
    }
    assert!(stopped, "no generation reached an eos");
}

/// The shipped demo model with a head (`models/tiny-qwen4exp-mtp`) loads its head from disk and
/// decodes speculatively to plain greedy's tokens.
#[test]
fn the_demo_model_with_a_head_decodes_speculatively() {
    let dir = common::repo().join("models/tiny-qwen4exp-mtp");
    let model = Model::load(&dir, ModelOptions::default()).unwrap();
    model.draft.require().unwrap();
    let report = check_greedy(
        &model,
        &[4, 5, 6, 7, 4, 8],
        &greedy(24),
        &SpecOptions::default(),
    );
    assert!(report.rounds > 0 && report.drafted > 0, "{report}");
}

/// Refused before anything runs, the session untouched: no head, K out of range, a session that
/// already holds tokens, a generation past the context.
#[test]
fn speculative_refusals_name_the_cause() {
    let plain_dir = common::repo().join("models/tiny-qwen4exp");
    let model = Model::load(&plain_dir, ModelOptions::default()).unwrap();
    let err = model
        .session()
        .generate_speculative(&[4, 5], &greedy(4), &SpecOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("--speculative: speculative decoding is unavailable: the checkpoint holds no MTP draft head"),
        "{err}"
    );
    let model = with_draft(
        &plain_dir,
        1,
        &[],
        ModelOptions {
            context_capacity: Some(8),
            ..Default::default()
        },
    );
    let mut s = model.session();
    for k in [0, 17] {
        let spec = SpecOptions {
            max_k: k,
            adaptive: true,
        };
        let err = s
            .generate_speculative(&[4, 5], &greedy(4), &spec)
            .unwrap_err()
            .to_string();
        assert_eq!(err, format!("--spec-k {k}: a round drafts 1 to 16 tokens"));
    }
    let exact = Model::load(
        &common::repo().join("models/tiny-qwen4exp-mtp"),
        ModelOptions {
            verify_exact: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut e = exact.session();
    let spec = |max_k| SpecOptions {
        max_k,
        adaptive: true,
    };
    let err = e
        .generate_speculative(&[4, 5], &greedy(4), &spec(8))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "--spec-k 8 with --verify-exact: verify steps of up to 8 rows take the one-token \
         steps' kernels, so a round drafts at most 7 tokens"
    );
    assert_eq!(e.position(), 0);
    let (got, _) = e
        .generate_speculative(&[4, 5], &greedy(4), &spec(7))
        .unwrap();
    assert_eq!(got.len(), 4);
    let err = s
        .generate_speculative(&[4, 5, 6], &greedy(7), &SpecOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("--max-new-tokens 7: 3 prompt tokens"),
        "{err}"
    );
    assert_eq!(s.position(), 0);
    s.prefill(&[4, 5], LogitsMode::Last).unwrap();
    let err = s
        .generate_speculative(&[6], &greedy(2), &SpecOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("starts from an empty session (this one holds 2)"),
        "{err}"
    );
    assert_eq!(s.position(), 2);
    // Exactly full: 3 prompt tokens and 6 new ones fit a context of 8, drafts included.
    let mut s = model.session();
    let (got, _) = s
        .generate_speculative(&[4, 5, 6], &greedy(6), &SpecOptions::default())
        .unwrap();
    assert_eq!(
        got,
        model.session().generate(&[4, 5, 6], &greedy(6)).unwrap()
    );
}

/// The same seed gives the same sampled tokens; the first sampled tokens after the prompt are
/// distributed as plain sampling's: for each first token, the second's frequencies over many
/// seeds against the trunk's exact distribution given it (a G-test), and likewise the third's
/// given the first two where enough runs share them.
#[test]
fn sampled_speculative_decoding_is_distributed_as_plain_sampling() {
    let dir = common::repo().join("models/tiny-qwen4exp");
    let model = with_draft(&dir, 4, &[3, 17, 40, 77], ModelOptions::default());
    let prompt = [10, 232, 31, 42];
    let sampling = |seed| Sampling::Sample {
        temperature: 1.0,
        top_k: Some(4),
        top_p: None,
        seed,
    };
    let opts = |seed| GenerateOptions {
        max_new_tokens: 3,
        sampling: sampling(seed),
        stop_on_eos: false,
    };
    let spec = SpecOptions {
        max_k: 2,
        adaptive: false,
    };
    let run = |seed| {
        model
            .session()
            .generate_speculative(&prompt, &opts(seed), &spec)
            .unwrap()
    };
    assert_eq!(run(11).0, run(11).0);
    // The trunk's own distribution after a prefix (what plain sampling draws from).
    let exact = |prefix: &[u32]| {
        let mut ids = prompt.to_vec();
        ids.extend(prefix);
        let logits = model.session().prefill(&ids, LogitsMode::Last).unwrap();
        Sampler::new(sampling(0))
            .unwrap()
            .distribution(logits.last())
            .unwrap()
    };
    let runs = 600;
    let mut samples = Vec::new();
    let (mut kept, mut drafted) = (0, 0);
    for seed in 0..runs {
        let (tokens, report) = run(seed);
        kept += report.accepted;
        drafted += report.drafted;
        samples.push(tokens);
    }
    assert!(
        kept > drafted / 5 && kept < drafted * 9 / 10,
        "drafts kept {kept} of {drafted}: both outcomes should be common"
    );
    let mut tested = 0;
    for depth in 1..=2 {
        let mut groups = std::collections::BTreeMap::<Vec<u32>, Vec<u32>>::new();
        for s in &samples {
            groups
                .entry(s[..depth].to_vec())
                .or_default()
                .push(s[depth]);
        }
        for (prefix, next) in groups.into_iter().filter(|(_, v)| v.len() >= 60) {
            let p = exact(&prefix);
            let (g, df) = g_statistic(&p, &next);
            // The 1e-4 upper quantile of chi-square with df <= 3 is below 21.2.
            assert!(
                g < 21.2,
                "after {prefix:?}: G = {g:.1} with {df} degrees of freedom, {} runs, p {p:?}",
                next.len()
            );
            tested += 1;
        }
    }
    assert!(tested >= 4, "only {tested} prefixes had enough runs");
}

/// The G statistic of `seen` against `p` (ids outside `p` make it infinite), and its degrees
/// of freedom.
fn g_statistic(p: &[(u32, f64)], seen: &[u32]) -> (f64, usize) {
    let n = seen.len() as f64;
    let mut g = 0.0;
    for &id in seen {
        if !p.iter().any(|(t, _)| *t == id) {
            return (f64::INFINITY, p.len() - 1);
        }
    }
    for &(id, pi) in p {
        let o = seen.iter().filter(|&&t| t == id).count() as f64;
        if o > 0.0 {
            g += 2.0 * o * (o / (n * pi)).ln();
        }
    }
    (g, p.len() - 1)
}

/// The draft's input fusion as the spec writes it (mtp-spec-seams-graphs.md §A.3), computed
/// here in plain loops: `ev = fc_embedding · rms(e)(1 + w)`, one RMS over all `C·H` values of
/// the trunk's state, `fc_hidden` on each stream, `h_s = f_s + ev`; and the program's other
/// export, `carrier`, is the state its exit mixer reads (the row's final planes), of the same
/// width as the trunk's `hidden`.
#[test]
fn the_draft_fuses_embedding_and_trunk_state_as_specified() {
    use graphrun::exec::cpu::{self, Val};
    use graphrun::exec::SessionState;
    use graphrun::runtime::model::ProgramKey;
    let model = Model::load(
        &common::repo().join("models/tiny-qwen4exp-mtp"),
        ModelOptions::default(),
    )
    .unwrap();
    let (h, c) = (model.plan.hidden_size, model.plan.hc.count);
    let program = model
        .program_for(ProgramKey::draft(2, LogitsMode::Last))
        .unwrap();
    let tokens = [4i64, 9];
    let hidden: Vec<f32> = (0..2 * c * h)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect();
    let mut state = SessionState::default();
    let got = cpu::run_values_with(
        &program,
        &model.weights,
        &mut state,
        &tokens,
        &[("hidden", &hidden)],
        &["fuse.h"],
    )
    .unwrap();
    let Val::F32 { data: fused, .. } = &got["fuse.h"] else {
        panic!()
    };
    let w = |n: &str| model.weights.get(n).unwrap().data.clone();
    let eps = model.plan.rms_norm_eps;
    let rms = |x: &[f32], w: &[f32]| -> Vec<f32> {
        let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt();
        x.iter().zip(w).map(|(v, w)| v * inv * (1.0 + w)).collect()
    };
    let matvec = |m: &[f32], x: &[f32]| -> Vec<f32> {
        m.chunks(x.len())
            .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let embed = w("model.embed_tokens.weight");
    let mut worst = 0.0f32;
    for (r, &t) in tokens.iter().enumerate() {
        let e = &embed[t as usize * h..(t as usize + 1) * h];
        let ev = matvec(
            &w("mtp.fc_embedding.weight"),
            &rms(e, &w("mtp.pre_fc_norm_embedding.weight")),
        );
        let hn = rms(
            &hidden[r * c * h..(r + 1) * c * h],
            &w("mtp.pre_fc_norm_hidden.weight"),
        );
        for s in 0..c {
            let f = matvec(&w("mtp.fc_hidden.weight"), &hn[s * h..(s + 1) * h]);
            for i in 0..h {
                let want = f[i] + ev[i];
                let g = fused[r * c * h + s * h + i];
                worst = worst.max((g - want).abs() / want.abs().max(1.0));
            }
        }
    }
    assert!(worst < 1e-5, "fused rows differ from the spec's by {worst}");
    let mut state = SessionState::default();
    let out = cpu::run_step(
        &program,
        &model.weights,
        &mut state,
        &tokens,
        &[("hidden", &hidden)],
    )
    .unwrap();
    assert_eq!(out.export("carrier").unwrap().len(), 2 * c * h);
    assert_eq!(out.rows, 1);
    assert_eq!(state.position, 2);
}
