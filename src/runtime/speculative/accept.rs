//! Which drafted tokens a round keeps. Greedy: the drafts that agree with the trunk's argmax,
//! in order, then the trunk's own token. Sampled: speculative rejection sampling (Leviathan et
//! al. 2023, Chen et al. 2023): a draft `x` drawn from the draft's distribution `q` is kept with
//! probability `min(1, p(x) / q(x))`, where `p` is what plain sampling would draw from at that
//! row; the first one refused is replaced by a draw from the residual `max(p - q, 0)`
//! normalised. Every emitted token is then distributed exactly as plain sampling's.

use crate::runtime::sampling::Dist;

/// The probability of `id` under `d` (0 where `d` leaves it out).
pub fn prob(d: &[(u32, f64)], id: u32) -> f64 {
    d.iter().find(|(t, _)| *t == id).map_or(0.0, |(_, p)| *p)
}

/// How many of `drafts` agree with `targets` (the trunk's greedy choices after each row), in
/// order: the first disagreement ends the run.
pub fn greedy_accepts(drafts: &[u32], targets: &[u32]) -> usize {
    drafts
        .iter()
        .zip(targets)
        .take_while(|(d, t)| d == t)
        .count()
}

/// What happens to one drafted token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The draft stands.
    Keep,
    /// Refused: this token, drawn from the residual, is emitted instead and ends the round.
    Replace(u32),
}

/// The verdict on draft `x`, drawn from `q`, where plain sampling draws from `p`; `u` decides
/// the keep (a uniform in [0, 1)), `v` the residual draw (another one), so that the caller's
/// seeded stream makes the round reproducible.
pub fn judge(p: &[(u32, f64)], q: &[(u32, f64)], x: u32, u: f64, v: f64) -> Verdict {
    let (px, qx) = (prob(p, x), prob(q, x));
    // q(x) > 0, since x was drawn from q; u < p/q keeps x with probability min(1, p/q).
    if qx > 0.0 && u * qx < px {
        return Verdict::Keep;
    }
    Verdict::Replace(draw(&residual(p, q), v))
}

/// `max(p - q, 0)` normalised, over `p`'s ids (where `p` is 0, so is the residual). When it is
/// empty (`q` covers `p` everywhere: then `p == q` and no draw is refused but by rounding), `p`.
pub fn residual(p: &[(u32, f64)], q: &[(u32, f64)]) -> Dist {
    let mut r: Dist = p
        .iter()
        .map(|&(id, pi)| (id, (pi - prob(q, id)).max(0.0)))
        .filter(|(_, w)| *w > 0.0)
        .collect();
    let total: f64 = r.iter().map(|(_, w)| w).sum();
    if total <= 0.0 {
        return p.to_vec();
    }
    for (_, w) in &mut r {
        *w /= total;
    }
    r
}

/// The id of `d` that uniform `v` falls on (cumulative order of `d`).
pub fn draw(d: &[(u32, f64)], v: f64) -> u32 {
    let mut acc = 0.0;
    for &(id, p) in d {
        acc += p;
        if v < acc {
            return id;
        }
    }
    d.last().map_or(0, |(id, _)| *id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn greedy_keeps_the_agreeing_prefix() {
        assert_eq!(greedy_accepts(&[1, 2, 3], &[1, 2, 4, 9]), 2);
        assert_eq!(greedy_accepts(&[1, 2, 3], &[1, 2, 3, 9]), 3);
        assert_eq!(greedy_accepts(&[5, 2, 3], &[1, 2, 3, 9]), 0);
        assert_eq!(greedy_accepts(&[], &[7]), 0);
    }

    /// Draw x from q, judge it: the emitted token's frequencies match p (not q), for
    /// distributions that overlap partly, where q puts mass p has none of, and where p has
    /// ids q lacks. Each frequency within 5 standard errors of p's probability.
    #[test]
    fn rejection_sampling_emits_the_target_distribution() {
        let cases: [(Dist, Dist); 3] = [
            (
                vec![(0, 0.5), (1, 0.3), (2, 0.2)],
                vec![(1, 0.6), (0, 0.2), (2, 0.2)],
            ),
            (vec![(3, 0.7), (4, 0.3)], vec![(5, 0.5), (3, 0.3), (4, 0.2)]),
            (vec![(0, 0.4), (1, 0.4), (2, 0.2)], vec![(0, 1.0)]),
        ];
        let n = 200_000;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for (p, q) in cases {
            let mut counts = std::collections::BTreeMap::<u32, usize>::new();
            for _ in 0..n {
                let x = draw(&q, rng.random());
                let out = match judge(&p, &q, x, rng.random(), rng.random()) {
                    Verdict::Keep => x,
                    Verdict::Replace(y) => y,
                };
                *counts.entry(out).or_default() += 1;
            }
            for id in counts.keys() {
                assert!(
                    prob(&p, *id) > 0.0,
                    "emitted {id}, outside p {p:?} (q {q:?})"
                );
            }
            for &(id, pi) in &p {
                let f = counts.get(&id).copied().unwrap_or(0) as f64 / n as f64;
                let se = (pi * (1.0 - pi) / n as f64).sqrt();
                assert!(
                    (f - pi).abs() < 5.0 * se,
                    "id {id}: frequency {f} vs p {pi} (q {q:?})"
                );
            }
        }
    }

    /// The residual is p minus q where positive, normalised; q = p leaves p itself.
    #[test]
    fn residual_is_the_positive_part_normalised() {
        let p = vec![(0, 0.5), (1, 0.3), (2, 0.2)];
        let q = vec![(1, 0.6), (0, 0.2), (2, 0.2)];
        let r = residual(&p, &q);
        assert_eq!(r, vec![(0, 1.0)]);
        assert_eq!(residual(&p, &p), p);
        // A kept draft needs u below p/q: with q(x) = 0.6 and p(x) = 0.3, u = 0.49 keeps it
        // and u = 0.51 does not.
        assert_eq!(judge(&p, &q, 1, 0.49, 0.0), Verdict::Keep);
        assert_eq!(judge(&p, &q, 1, 0.51, 0.0), Verdict::Replace(0));
    }
}
