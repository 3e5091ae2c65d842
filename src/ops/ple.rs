//! PLE: hashed n-gram ids and the per-stream gate.

use super::sigmoid;

/// N-gram ids `[T, (n-1)*hpn]` for `tokens`, given the previous `n-1` ids in `history` (eos at the
/// start of a sequence); `history` then holds the last `n-1` ids.
///
/// `shift_k(p)` is the token k places back, or eos when that crosses the start or an earlier eos
/// (an eos ends its segment: tokens after it see only eos as history). For each order
/// `o in 2..=n`: `mix = XOR_{j<o} shift_j * mult[j]` (wrapping i64), and head h of that order gets
/// `mix mod size[h] + offset[h]`.
pub fn ngram_ids(
    tokens: &[i64],
    history: &mut [i64],
    eos: i64,
    ngram: usize,
    heads_per_ngram: usize,
    multipliers: &[i64],
    sizes: &[i64],
    offsets: &[i64],
) -> Vec<i64> {
    let ctx = ngram - 1;
    let hist: Vec<i64> = history.iter().chain(tokens).copied().collect();
    let shift = |p: usize, k: usize| -> i64 {
        if k == 0 {
            return hist[p];
        }
        if k > p {
            return eos;
        }
        // Any eos strictly between p-k and p cuts the history.
        if hist[p - k + 1..p].contains(&eos) {
            return eos;
        }
        hist[p - k]
    };
    let mut ids = Vec::with_capacity(tokens.len() * ctx * heads_per_ngram);
    for p in ctx..hist.len() {
        let mut mix: i64 = 0;
        for order in 2..=ngram {
            if order == 2 {
                mix = shift(p, 0).wrapping_mul(multipliers[0]);
            }
            mix ^= shift(p, order - 1).wrapping_mul(multipliers[order - 1]);
            for hh in 0..heads_per_ngram {
                let h = (order - 2) * heads_per_ngram + hh;
                ids.push(mix.rem_euclid(sizes[h]) + offsets[h]);
            }
        }
    }
    history.copy_from_slice(&hist[hist.len() - ctx..]);
    ids
}

/// `gv[s] = sigmoid(ssqrt(<key_s, query_s> / sqrt(H))) * value` for each stream `s`, where
/// `ssqrt(g) = sign(g) * sqrt(max(|g|, 1e-6))`.
pub fn gate(key: &[f32], query: &[f32], value: &[f32], tokens: usize, streams: usize) -> Vec<f32> {
    let width = key.len() / tokens;
    let h = width / streams;
    let mut out = vec![0.0f32; tokens * width];
    for t in 0..tokens {
        for s in 0..streams {
            let base = t * width + s * h;
            let dotp: f32 = (0..h).map(|c| key[base + c] * query[base + c]).sum();
            let g = dotp / (h as f32).sqrt();
            let signed = if g == 0.0 {
                0.0
            } else {
                g.signum() * g.abs().max(1e-6).sqrt()
            };
            let gain = sigmoid(signed);
            for c in 0..h {
                out[base + c] = gain * value[t * h + c];
            }
        }
    }
    out
}
