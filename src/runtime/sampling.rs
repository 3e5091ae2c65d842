//! Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p
//! from a seeded ChaCha8 stream (the same seed gives the same tokens on every machine).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// The largest logit; the lowest id on ties.
    Greedy,
    Sample {
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        seed: u64,
    },
}

impl Sampling {
    pub fn validate(&self) -> Result<()> {
        if let Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } = self
        {
            if !(temperature.is_finite() && *temperature > 0.0) {
                return Err(Error::Input(format!("--temperature {temperature}: must be a finite number > 0 (use --greedy for argmax)")));
            }
            if *top_k == Some(0) {
                return Err(Error::Input("--top-k 0: must be at least 1".into()));
            }
            if let Some(p) = top_p {
                if !(*p > 0.0 && *p <= 1.0) {
                    return Err(Error::Input(format!("--top-p {p}: must be in (0, 1]")));
                }
            }
        }
        Ok(())
    }
}

/// A sampler holds its random stream, so successive draws continue it.
pub struct Sampler {
    sampling: Sampling,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(sampling: Sampling) -> Result<Sampler> {
        sampling.validate()?;
        let seed = match &sampling {
            Sampling::Sample { seed, .. } => *seed,
            Sampling::Greedy => 0,
        };
        Ok(Sampler {
            sampling,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    /// The next token from `logits`; an error names the first logit no choice can be made
    /// from: NaN (which `argmax` would pass over, or stop at at index 0), or, when sampling,
    /// +inf (its softmax is NaN).
    pub fn next(&mut self, logits: &[f32]) -> Result<u32, BadLogit> {
        match self.sampling {
            Sampling::Greedy => {
                check_logits(logits, false)?;
                Ok(argmax(logits))
            }
            Sampling::Sample { .. } => {
                let candidates = self.distribution(logits)?;
                Ok(self.draw(&candidates))
            }
        }
    }

    /// What [`Sampler::next`] draws from: the candidate tokens with their probabilities
    /// (summing to 1), largest first; greedy: the argmax with probability 1.
    pub fn distribution(&self, logits: &[f32]) -> Result<Dist, BadLogit> {
        match self.sampling {
            Sampling::Greedy => {
                check_logits(logits, false)?;
                Ok(vec![(argmax(logits), 1.0)])
            }
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
                ..
            } => {
                check_logits(logits, true)?;
                Ok(filter(logits, temperature, top_k, top_p))
            }
        }
    }

    /// A token drawn from `dist` (one uniform of the stream).
    pub fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let r = self.uniform();
        let mut acc = 0.0f64;
        for &(id, p) in dist {
            acc += p;
            if r < acc {
                return id;
            }
        }
        dist.last().map(|c| c.0).unwrap_or(0)
    }

    /// The stream's next uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    pub fn sampling(&self) -> &Sampling {
        &self.sampling
    }
}

/// A distribution over token ids: the ids with a probability, largest first, summing to 1.
pub type Dist = Vec<(u32, f64)>;

/// A logit no token can be chosen from: `token` is its index in the row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BadLogit {
    pub token: usize,
    pub value: f32,
}

/// The first NaN of `logits` (and, with `finite`, the first +inf): no choice can be made from
/// them. -inf is a masked token and stays allowed.
pub fn check_logits(logits: &[f32], finite: bool) -> Result<(), BadLogit> {
    let bad = |v: f32| v.is_nan() || (finite && v == f32::INFINITY);
    // Blocks first (a test over a block vectorises), then the token in the first bad block.
    let Some(block) = logits
        .chunks(BLOCK)
        .position(|b| b.iter().fold(false, |any, &v| any | bad(v)))
    else {
        return Ok(());
    };
    let token = block * BLOCK
        + logits[block * BLOCK..]
            .iter()
            .position(|&v| bad(v))
            .expect("the block holds a bad logit");
    Err(BadLogit {
        token,
        value: logits[token],
    })
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The first `k` token ids in the order of their logits, largest first, the lower id first on
/// ties: the full order's first `k`. For a few (`HEAP_MAX`), one pass keeps the best `k` in a
/// heap whose top is the worst kept, so that most tokens cost one comparison; otherwise
/// selection over every id (a chat's vocabulary is 150-250k tokens, whose full sort costs the
/// host milliseconds a token).
fn ranked(logits: &[f32], k: usize) -> Vec<usize> {
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    if k <= HEAP_MAX && k < logits.len() {
        let mut kept: std::collections::BinaryHeap<Ranked> = (0..k)
            .map(|id| Ranked {
                logit: logits[id],
                id,
            })
            .collect();
        // A later id ranks first only with a larger logit (ties go to the lower id, kept). A
        // block of logits whose largest is below the worst kept has none (`f32::max` over a
        // block: a comparison that vectorises; >= also lets +0 past a kept -0).
        let mut worst = kept.peek().map_or(f32::INFINITY, |r| r.logit);
        let mut id = k;
        for block in logits[k..].chunks(BLOCK) {
            let largest = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if largest >= worst {
                for (j, &logit) in block.iter().enumerate() {
                    if logit.total_cmp(&worst).is_gt() {
                        kept.pop();
                        kept.push(Ranked { logit, id: id + j });
                        worst = kept.peek().map_or(f32::INFINITY, |r| r.logit);
                    }
                }
            }
            id += block.len();
        }
        let mut order: Vec<usize> = kept.into_iter().map(|r| r.id).collect();
        order.sort_by(by_logit);
        return order;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_logit);
        order.truncate(k);
    }
    order.sort_by(by_logit);
    order
}

/// Most ids `ranked` keeps in a heap rather than selecting over the whole vocabulary, and the
/// logits it tests against the worst kept at once.
const HEAP_MAX: usize = 4096;
const BLOCK: usize = 64;

/// A token in the ranking's order: `Less` ranks first (the larger logit, then the lower id).
struct Ranked {
    logit: f32,
    id: usize,
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Ranked {}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .logit
            .total_cmp(&self.logit)
            .then(self.id.cmp(&other.id))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The candidate tokens with their probabilities (summing to 1), largest first: the `top_k`
/// most likely, then the smallest prefix whose probability reaches `top_p`.
fn filter(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
) -> Vec<(u32, f64)> {
    let t = temperature as f64;
    // The largest logit: the ranking's first where there is one (the same value as a pass over
    // every logit).
    let top = top_k.map(|k| ranked(logits, k));
    let max = match &top {
        Some(order) if !order.is_empty() => logits[order[0]],
        _ => logits.iter().copied().fold(f32::NEG_INFINITY, f32::max),
    } as f64
        / t;
    let weight = |i: usize| (logits[i] as f64 / t - max).exp();
    let (order, sum) = match top {
        Some(order) => {
            let sum = order.iter().map(|&i| weight(i)).sum::<f64>();
            (order, sum)
        }
        None => {
            let sum = (0..logits.len()).map(weight).sum::<f64>();
            let order = match top_p {
                // The most likely first, more of them until their mass reaches `top_p`.
                Some(p) => {
                    let mut take = 256;
                    loop {
                        let order = ranked(logits, take);
                        let mass = order.iter().map(|&i| weight(i)).sum::<f64>() / sum;
                        if mass >= p as f64 || order.len() == logits.len() {
                            break order;
                        }
                        take *= 8;
                    }
                }
                None => ranked(logits, logits.len()),
            };
            (order, sum)
        }
    };
    let mut probs: Vec<(u32, f64)> = order.iter().map(|&i| (i as u32, weight(i) / sum)).collect();
    if let Some(p) = top_p {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (n, (_, q)) in probs.iter().enumerate() {
            acc += q;
            if acc >= p as f64 {
                keep = n + 1;
                break;
            }
        }
        probs.truncate(keep);
        let total: f64 = probs.iter().map(|(_, q)| q).sum();
        for (_, q) in probs.iter_mut() {
            *q /= total;
        }
    }
    probs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Selection gives the full sort's first k, ties by id, and the filtered candidates are
    /// those of the full order (a vocabulary of 150k with ties and -inf among its logits).
    #[test]
    fn ranking_by_selection_is_the_full_orders_prefix() {
        let logits: Vec<f32> = (0..150_000)
            .map(|i| match i % 997 {
                0 => f32::NEG_INFINITY,
                _ => ((i * 7919 % 1000) as f32 * 0.01).sin() * 8.0,
            })
            .collect();
        let mut full: Vec<usize> = (0..logits.len()).collect();
        full.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        for k in [1, 2, 50, 256, 3000, 150_000, 200_000] {
            assert_eq!(ranked(&logits, k), full[..k.min(full.len())], "k {k}");
        }
        for (top_k, top_p) in [
            (Some(50), Some(0.9)),
            (None, Some(0.9)),
            (None, Some(0.999)),
        ] {
            let got = filter(&logits, 0.7, top_k, top_p);
            let ids: Vec<usize> = got.iter().map(|c| c.0 as usize).collect();
            assert_eq!(ids, full[..ids.len()], "{top_k:?} {top_p:?}");
            let sum: f64 = got.iter().map(|c| c.1).sum();
            assert!((sum - 1.0).abs() < 1e-12, "{sum}");
            if let Some(k) = top_k {
                assert!(ids.len() <= k);
            }
        }
    }

    #[test]
    fn greedy_takes_lowest_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.5, 2.0, -1.0, 1.9];
        let mut s = Sampler::new(Sampling::Sample {
            temperature: 1.0,
            top_k: Some(1),
            top_p: None,
            seed: 7,
        })
        .unwrap();
        for _ in 0..20 {
            assert_eq!(s.next(&logits), Ok(1));
        }
    }

    #[test]
    fn same_seed_same_draws_and_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut s = Sampler::new(Sampling::Sample {
                temperature: 1.5,
                top_k: None,
                top_p: Some(0.95),
                seed,
            })
            .unwrap();
            (0..32)
                .map(|_| s.next(&logits).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix() {
        let probs = filter(&[0.0, (3.0f32).ln(), (6.0f32).ln()], 1.0, None, Some(0.5));
        assert_eq!(probs.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2]);
        let probs = filter(&[0.0, (3.0f32).ln(), (6.0f32).ln()], 1.0, None, Some(0.8));
        assert_eq!(probs.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 1]);
    }

    /// NaN is never a choice (argmax alone would give 0 for a row of NaN); sampling refuses
    /// +inf too; -inf is a masked token.
    #[test]
    fn nan_logits_are_errors() {
        // top-k 1: the sampled choice is the greedy one.
        let sample = Sampling::Sample {
            temperature: 1.0,
            top_k: Some(1),
            top_p: None,
            seed: 0,
        };
        let nan = f32::NAN;
        for sampling in [Sampling::Greedy, sample.clone()] {
            let mut s = Sampler::new(sampling.clone()).unwrap();
            let err = s.next(&[nan; 4]).unwrap_err();
            assert!(err.token == 0 && err.value.is_nan(), "{sampling:?}");
            let err = s.next(&[1.0, 2.0, nan, 0.5]).unwrap_err();
            assert_eq!(err.token, 2, "{sampling:?}");
            assert_eq!(
                s.next(&[f32::NEG_INFINITY, 1.0, 0.5]),
                Ok(1),
                "{sampling:?}"
            );
        }
        let inf = [1.0, f32::INFINITY, 0.5];
        assert_eq!(Sampler::new(Sampling::Greedy).unwrap().next(&inf), Ok(1));
        assert_eq!(
            Sampler::new(sample).unwrap().next(&inf),
            Err(BadLogit {
                token: 1,
                value: f32::INFINITY
            })
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        for s in [
            Sampling::Sample {
                temperature: 0.0,
                top_k: None,
                top_p: None,
                seed: 0,
            },
            Sampling::Sample {
                temperature: f32::NAN,
                top_k: None,
                top_p: None,
                seed: 0,
            },
            Sampling::Sample {
                temperature: 1.0,
                top_k: Some(0),
                top_p: None,
                seed: 0,
            },
            Sampling::Sample {
                temperature: 1.0,
                top_k: None,
                top_p: Some(1.5),
                seed: 0,
            },
        ] {
            assert!(Sampler::new(s).is_err());
        }
    }
}
