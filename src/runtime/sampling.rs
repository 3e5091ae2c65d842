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

    pub fn next(&mut self, logits: &[f32]) -> u32 {
        match self.sampling.clone() {
            Sampling::Greedy => argmax(logits),
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
                ..
            } => {
                let candidates = filter(logits, temperature, top_k, top_p);
                let r: f64 = self.rng.random::<f64>();
                let mut acc = 0.0f64;
                for &(id, p) in &candidates {
                    acc += p;
                    if r < acc {
                        return id;
                    }
                }
                candidates.last().map(|c| c.0).unwrap_or(0)
            }
        }
    }
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

/// The candidate tokens with their probabilities (summing to 1), largest first.
fn filter(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
) -> Vec<(u32, f64)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if let Some(k) = top_k {
        order.truncate(k.min(order.len()));
    }
    let max = logits[order[0]] as f64 / temperature as f64;
    let exps: Vec<f64> = order
        .iter()
        .map(|&i| (logits[i] as f64 / temperature as f64 - max).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    let mut probs: Vec<(u32, f64)> = order
        .iter()
        .zip(&exps)
        .map(|(&i, e)| (i as u32, e / sum))
        .collect();
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
            assert_eq!(s.next(&logits), 1);
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
            (0..32).map(|_| s.next(&logits)).collect::<Vec<_>>()
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
