//! `graphrun bench --speculative`: what a speculative round costs at the real geometry on a CUDA
//! device, with random weights (the draft head included): a plain decode step, verify steps of
//! 2..=`max_rows` rows (the trunk with its hidden rows exported, every row's logits), a one-row
//! draft step and a draft catch-up of each length, a checkpoint and a rewind; then the tokens/s
//! that follow from them at given acceptances, K chosen as the best for each (modelled: random
//! weights make the head's real acceptance meaningless). Measured figures and modelled ones are
//! reported apart.

use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::exec::cuda::Gpu;
use crate::exec::Executor;
use crate::ir::LogitsMode;
use crate::runtime::model::ProgramKey;
use crate::runtime::{Model, ModelOptions};

pub struct SpecBenchOptions {
    /// CUDA (random weights made on the device) or the CPU reference (random weights in
    /// memory: for small configs).
    pub on_cpu: bool,
    pub layers: Option<usize>,
    pub experts: crate::registry::WeightFormat,
    /// The context the steps are timed at.
    pub context: usize,
    /// Timed repetitions of each step.
    pub steps: usize,
    /// The longest verify step (K + 1 rows).
    pub max_rows: usize,
    /// Acceptances to model tokens/s at.
    pub acceptances: Vec<f64>,
    pub ple_vocab_base: Option<u64>,
    pub seed: u64,
    pub schedule: super::Schedule,
}

/// One verify step's length and time.
#[derive(Debug, Serialize)]
pub struct VerifyRow {
    pub rows: usize,
    pub ms: f64,
    /// Over one plain decode step.
    pub ratio_to_decode: f64,
    /// A draft catch-up of as many rows.
    pub draft_ms: f64,
}

/// Tokens/s at one acceptance, the best K, beside plain decode.
#[derive(Debug, Serialize)]
pub struct ModelledRow {
    pub acceptance: f64,
    pub best_k: usize,
    pub tokens_per_round: f64,
    pub ms_per_round: f64,
    pub tokens_per_s: f64,
    pub speedup: f64,
}

#[derive(Debug, Serialize)]
pub struct SpecBenchReport {
    pub device: String,
    /// The graphs, rules and fusions (`Schedule::summary`).
    pub schedule: String,
    pub layers: usize,
    pub experts: String,
    pub context: usize,
    /// Measured.
    pub decode_ms: f64,
    pub draft_step_ms: f64,
    pub checkpoint_ms: f64,
    pub rewind_ms: f64,
    pub verify: Vec<VerifyRow>,
    /// The least-squares line verify(t) = a + b t over the verify rows.
    pub verify_fit: (f64, f64),
    /// Modelled from the measured figures.
    pub modelled: Vec<ModelledRow>,
}

impl std::fmt::Display for SpecBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "speculative bench: {}, {} layers, {} experts, context {}; {}",
            self.device, self.layers, self.experts, self.context, self.schedule
        )?;
        writeln!(
            f,
            "measured: plain decode {:.3} ms, draft step {:.3} ms, checkpoint {:.3} ms, rewind {:.3} ms",
            self.decode_ms, self.draft_step_ms, self.checkpoint_ms, self.rewind_ms
        )?;
        for v in &self.verify {
            writeln!(
                f,
                "measured: verify {} rows {:.3} ms ({:.2}x decode), draft catch-up of {} rows {:.3} ms",
                v.rows, v.ms, v.ratio_to_decode, v.rows, v.draft_ms
            )?;
        }
        writeln!(
            f,
            "fit: verify(t) = {:.3} + {:.3} t ms",
            self.verify_fit.0, self.verify_fit.1
        )?;
        for m in &self.modelled {
            writeln!(
                f,
                "modelled: acceptance {:.2}: K {} -> {:.2} tokens a round in {:.3} ms: {:.1} tokens/s, {:.2}x plain decode ({:.1} tokens/s)",
                m.acceptance,
                m.best_k,
                m.tokens_per_round,
                m.ms_per_round,
                m.tokens_per_s,
                m.speedup,
                1e3 / self.decode_ms
            )?;
        }
        Ok(())
    }
}

fn ms_since(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e3 / n as f64
}

pub fn run(config_text: &str, origin: &str, opts: &SpecBenchOptions) -> Result<SpecBenchReport> {
    let plan = super::bench_plan(config_text, origin, opts.layers, opts.ple_vocab_base)?;
    if plan.mtp_layers == 0 {
        return Err(Error::Input(format!(
            "{origin}: the config declares no MTP draft layers (mtp_num_hidden_layers)"
        )));
    }
    if opts.max_rows < 2 || opts.max_rows > crate::runtime::speculative::MAX_K + 1 {
        return Err(Error::Input(format!(
            "--spec-rows {}: verify steps of 2 to {} rows",
            opts.max_rows,
            crate::runtime::speculative::MAX_K + 1
        )));
    }
    let steps = opts.steps.max(1);
    // The context, then every timed step's rows (each verify and draft step is rewound, the
    // decode steps are not).
    let capacity = opts.context + 4 * steps + 64;
    let options = opts.schedule.apply(ModelOptions {
        context_capacity: Some(capacity),
        prefill_chunk: Some(4096),
        ..Default::default()
    });
    let layers = plan.layers.len();
    let vocab = plan.vocab_size;
    let width = plan.hc.count * plan.hidden_size;
    let (device, model) = if opts.on_cpu {
        let weights = crate::synth::random_weights(&plan, opts.seed)?;
        let threads = rayon::current_num_threads();
        let graphs = options.graph_set()?;
        let model = Model::from_parts(plan, graphs, weights, options);
        (format!("CPU ({threads} threads)"), model)
    } else {
        let gpu = Gpu::new(0)?;
        let device = format!(
            "{} (sm_{}{})",
            gpu.info.name, gpu.info.compute_capability.0, gpu.info.compute_capability.1
        );
        let model = Model::random_on_gpu(plan, gpu, options, opts.experts, opts.seed)?;
        (device, model)
    };
    let token = |i: usize| super::token(i, vocab) as i64;

    // The trunk at the context, then plain decode steps.
    let mut trunk = model.executor();
    let mut done = 0;
    while done < opts.context {
        let n = (opts.context - done).min(4096);
        let ids: Vec<i64> = (done..done + n).map(token).collect();
        let program = model.program_for(ProgramKey::trunk(n, LogitsMode::Last))?;
        trunk.step(&program, &ids)?;
        done += n;
    }
    let decode = model.program_for(ProgramKey::trunk(1, LogitsMode::Last))?;
    for i in 0..3 {
        let _ = trunk.step_greedy(&decode, &[token(i)])?;
    }
    let t = Instant::now();
    for i in 0..steps {
        let _ = trunk.step_greedy(&decode, &[token(i + 7)])?;
    }
    let decode_ms = ms_since(t, steps);

    // Checkpoint and rewind (of one decode step), then each verify length, rewound.
    let mut checkpoint_ms = 0.0;
    let mut rewind_ms = 0.0;
    for i in 0..steps + 3 {
        let t = Instant::now();
        trunk.checkpoint()?;
        let c = t.elapsed().as_secs_f64() * 1e3;
        let at = trunk.position();
        let _ = trunk.step_greedy(&decode, &[token(i)])?;
        let t = Instant::now();
        trunk.rewind(at)?;
        let r = t.elapsed().as_secs_f64() * 1e3;
        if i >= 3 {
            checkpoint_ms += c / steps as f64;
            rewind_ms += r / steps as f64;
        }
    }
    let mut verify_ms = Vec::new();
    for rows in 2..=opts.max_rows {
        let program = model.program_for(ProgramKey::trunk(rows, LogitsMode::All).with_exports())?;
        let ids: Vec<i64> = (0..rows).map(|j| token(j + 31)).collect();
        let at = trunk.position();
        trunk.checkpoint()?;
        let mut total = 0.0;
        for i in 0..steps + 3 {
            // As a greedy round verifies: each row's choice made on the device.
            let t = Instant::now();
            trunk.step_with_greedy(&program, &ids, &[])?;
            if i >= 3 {
                total += t.elapsed().as_secs_f64() * 1e3;
            }
            trunk.rewind(at)?;
        }
        verify_ms.push((rows, total / steps as f64));
    }

    // The draft: caught up to the context, then one-row steps and catch-ups of each length.
    let mut draft = model.executor();
    let seeds = vec![0.01f32; 4096 * width];
    let mut done = 0;
    while done < opts.context {
        let n = (opts.context - done).min(4096);
        let ids: Vec<i64> = (done..done + n).map(token).collect();
        let program = model.program_for(ProgramKey::draft(n, LogitsMode::Last))?;
        draft.step_with(&program, &ids, &[("hidden", &seeds[..n * width])])?;
        done += n;
    }
    let time_draft = |draft: &mut Box<dyn Executor + '_>, rows: usize| -> Result<f64> {
        let program = model.program_for(ProgramKey::draft(rows, LogitsMode::Last))?;
        let ids: Vec<i64> = (0..rows).map(|j| token(j + 3)).collect();
        let at = draft.position();
        draft.checkpoint()?;
        let mut total = 0.0;
        for i in 0..steps + 3 {
            let t = Instant::now();
            draft.step_with(&program, &ids, &[("hidden", &seeds[..rows * width])])?;
            if i >= 3 {
                total += t.elapsed().as_secs_f64() * 1e3;
            }
            draft.rewind(at)?;
        }
        Ok(total / steps as f64)
    };
    let draft_step_ms = time_draft(&mut draft, 1)?;
    let mut verify = Vec::new();
    for &(rows, ms) in &verify_ms {
        verify.push(VerifyRow {
            rows,
            ms,
            ratio_to_decode: ms / decode_ms,
            draft_ms: time_draft(&mut draft, rows)?,
        });
    }
    let verify_fit = fit(&verify_ms);

    // A round of K drafts keeping a of them with probability acc^a (1 - acc) (all K: acc^K):
    // K - 1 chained draft steps, the verify of K + 1 rows, the two checkpoints, and unless all
    // are kept a rewind and a rerun of a + 1 rows; then the draft's catch-up of a + 1 rows.
    let verify_at = |rows: usize| {
        verify_ms
            .iter()
            .find(|v| v.0 == rows)
            .map_or(decode_ms, |v| v.1)
    };
    let catch_up = |rows: usize| {
        verify
            .iter()
            .find(|v| v.rows == rows)
            .map_or(draft_step_ms, |v| v.draft_ms)
    };
    let modelled = opts
        .acceptances
        .iter()
        .map(|&acc| {
            let best = (1..opts.max_rows)
                .map(|k| {
                    let mut tokens = 0.0;
                    let mut ms =
                        2.0 * checkpoint_ms + (k - 1) as f64 * draft_step_ms + verify_at(k + 1);
                    for a in 0..=k {
                        let p = if a < k {
                            acc.powi(a as i32) * (1.0 - acc)
                        } else {
                            acc.powi(k as i32)
                        };
                        tokens += p * (a + 1) as f64;
                        let rerun = if a < k {
                            2.0 * rewind_ms + if a == 0 { decode_ms } else { verify_at(a + 1) }
                        } else {
                            0.0
                        };
                        ms += p * (rerun + catch_up(a + 1));
                    }
                    (k, tokens, ms)
                })
                .max_by(|x, y| (x.1 / x.2).total_cmp(&(y.1 / y.2)))
                .expect("at least one K");
            let tokens_per_s = best.1 / best.2 * 1e3;
            ModelledRow {
                acceptance: acc,
                best_k: best.0,
                tokens_per_round: best.1,
                ms_per_round: best.2,
                tokens_per_s,
                speedup: tokens_per_s * decode_ms / 1e3,
            }
        })
        .collect();
    Ok(SpecBenchReport {
        device,
        schedule: opts.schedule.summary(),
        layers,
        experts: opts.experts.to_string(),
        context: opts.context,
        decode_ms,
        draft_step_ms,
        checkpoint_ms,
        rewind_ms,
        verify,
        verify_fit,
        modelled,
    })
}

/// Least squares of `ms = a + b rows`.
fn fit(points: &[(usize, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(x, y), &(r, m)| (x + r as f64, y + m));
    let (mx, my) = (sx / n, sy / n);
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(a, b), &(r, m)| {
        let dx = r as f64 - mx;
        (a + dx * (m - my), b + dx * dx)
    });
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - b * mx, b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fit_recovers_a_line() {
        let pts: Vec<(usize, f64)> = (2..=8).map(|t| (t, 1.5 + 0.25 * t as f64)).collect();
        let (a, b) = super::fit(&pts);
        assert!(
            (a - 1.5).abs() < 1e-12 && (b - 0.25).abs() < 1e-12,
            "{a} {b}"
        );
    }
}
