//! Mixture of experts: the router and the routed SwiGLU experts.

use rayon::prelude::*;

use super::{dot, silu};

/// Softmax over each row of `logits [T, E]`, then the `k` largest probabilities (ties: lower
/// expert id first), renormalised to sum 1 when `normalize`. Returns ids and weights `[T, k]`.
pub fn route(logits: &[f32], experts: usize, k: usize, normalize: bool) -> (Vec<i64>, Vec<f32>) {
    route_with_exp(logits, experts, k, normalize, f32::exp)
}

/// [`route`] with the given exp (the GPU tests pass the device's, to check its kernel bit for
/// bit).
pub fn route_with_exp(
    logits: &[f32],
    experts: usize,
    k: usize,
    normalize: bool,
    exp: impl Fn(f32) -> f32,
) -> (Vec<i64>, Vec<f32>) {
    let mut ids = Vec::new();
    let mut weights = Vec::new();
    for row in logits.chunks(experts) {
        let probs = softmax_with_exp(row, &exp);
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let total: f32 = chosen.iter().map(|&e| probs[e]).sum();
        for &e in chosen {
            ids.push(e as i64);
            weights.push(if normalize {
                probs[e] / total
            } else {
                probs[e]
            });
        }
    }
    (ids, weights)
}

/// The router's softmax of one row of logits with the given exp: exp(l - max) over the exps'
/// [`softmax_sum`] (the max ignores NaN, as f32::max does).
pub fn softmax_with_exp(row: &[f32], exp: impl Fn(f32) -> f32) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row.iter().map(|&l| exp(l - max)).collect();
    let sum = softmax_sum(&exps);
    exps.iter().map(|e| e / sum).collect()
}

/// The softmax's sum of the exps, in the order this reference fixes (torch's own order is its
/// kernels' business; any order is within a few ulps): chunks of 32 experts in id order, each
/// summed by halving, then the chunk sums by halving. It is the order a GPU warp forms with
/// butterfly shuffles, so the device's router (kernels/moe.cu) gives these bits in a few steps
/// instead of one add at a time.
pub fn softmax_sum(exps: &[f32]) -> f32 {
    let chunk_sums: Vec<f32> = exps.chunks(32).map(halving_sum).collect();
    halving_sum(&chunk_sums)
}

/// Sum by halving: padded with zeros to a power of two, `v[i] += v[i + n/2]` for the lower half,
/// then again on it, until one value is left (the padding adds exact zeros).
fn halving_sum(values: &[f32]) -> f32 {
    let mut v = values.to_vec();
    v.resize(values.len().next_power_of_two(), 0.0);
    while v.len() > 1 {
        let half = v.len() / 2;
        for i in 0..half {
            v[i] += v[i + half];
        }
        v.truncate(half);
    }
    v.first().copied().unwrap_or(0.0)
}

pub struct ExpertBank<'a> {
    /// `[E, 2I, H]`: per expert, I gate rows then I up rows.
    pub gate_up: &'a [f32],
    /// `[E, H, I]`.
    pub down: &'a [f32],
    pub hidden: usize,
    pub intermediate: usize,
}

impl ExpertBank<'_> {
    /// `down_e · (silu(G) * U)` for one token.
    fn expert(&self, e: usize, x: &[f32]) -> Vec<f32> {
        let (h, i) = (self.hidden, self.intermediate);
        let gu = &self.gate_up[e * 2 * i * h..(e + 1) * 2 * i * h];
        let act: Vec<f32> = (0..i)
            .map(|r| {
                silu(dot(x, &gu[r * h..(r + 1) * h])) * dot(x, &gu[(i + r) * h..(i + r + 1) * h])
            })
            .collect();
        let down = &self.down[e * h * i..(e + 1) * h * i];
        (0..h)
            .map(|r| dot(&act, &down[r * i..(r + 1) * i]))
            .collect()
    }
}

/// Reference: token by token, slots in routing order, `Σ_j w_j · expert_j(x)`.
pub fn token_major(
    x: &[f32],
    ids: &[i64],
    w: &[f32],
    tokens: usize,
    k: usize,
    bank: &ExpertBank,
) -> Vec<f32> {
    let h = bank.hidden;
    let mut out = vec![0.0f32; tokens * h];
    out.par_chunks_mut(h).enumerate().for_each(|(t, o)| {
        let xt = &x[t * h..(t + 1) * h];
        for j in 0..k {
            let y = bank.expert(ids[t * k + j] as usize, xt);
            for (oc, yc) in o.iter_mut().zip(&y) {
                *oc += w[t * k + j] * yc;
            }
        }
    });
    out
}

/// Many tokens: each expert runs once over all the tokens routed to it (its weights are read
/// once), then every token sums its slots in routing order, exactly as `token_major` does.
pub fn expert_major(
    x: &[f32],
    ids: &[i64],
    w: &[f32],
    tokens: usize,
    k: usize,
    bank: &ExpertBank,
) -> Vec<f32> {
    let h = bank.hidden;
    let experts = bank.gate_up.len() / (2 * bank.intermediate * h);
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts];
    for (slot, &e) in ids.iter().enumerate() {
        by_expert[e as usize].push(slot);
    }
    let results: Vec<Vec<(usize, Vec<f32>)>> = by_expert
        .par_iter()
        .enumerate()
        .map(|(e, slots)| {
            slots
                .iter()
                .map(|&slot| (slot, bank.expert(e, &x[(slot / k) * h..(slot / k + 1) * h])))
                .collect()
        })
        .collect();
    let mut per_slot: Vec<Vec<f32>> = vec![Vec::new(); tokens * k];
    for (slot, y) in results.into_iter().flatten() {
        per_slot[slot] = y;
    }
    let mut out = vec![0.0f32; tokens * h];
    for t in 0..tokens {
        for j in 0..k {
            for (oc, yc) in out[t * h..(t + 1) * h].iter_mut().zip(&per_slot[t * k + j]) {
                *oc += w[t * k + j] * yc;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The halving order is the sum's definition: 1 and 31 halves of its ulp sum to 1 one add at
    /// a time (each add rounds back to 1), but the halves meet one another first by halving.
    #[test]
    fn softmax_sum_adds_by_halving() {
        let half_ulp = 2f32.powi(-24);
        let mut v = vec![half_ulp; 32];
        v[0] = 1.0;
        assert_eq!(v.iter().sum::<f32>(), 1.0);
        assert_eq!(softmax_sum(&v), 1.0 + 15.0 * 2f32.powi(-23));
        // Chunks of 32, then their sums: the second chunk's 1 meets the first chunk's sum last.
        let mut w = v.clone();
        w.extend(std::iter::repeat_n(0.0, 31));
        w.push(1.0);
        assert_eq!(softmax_sum(&w), 2.0 + 16.0 * 2f32.powi(-23));
        // Zero padding (a partial chunk, a chunk count not a power of two) adds nothing.
        assert_eq!(softmax_sum(&[0.5, 0.25, 0.125]), 0.875);
        assert_eq!(softmax_sum(&[]), 0.0);
    }
}
