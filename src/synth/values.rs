//! The seeded value stream: a weight's values are drawn one after another from one ChaCha8
//! stream, so they can be made a piece at a time, or skipped over without being made, and still
//! be the same values for a seed.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::ir::WeightInfo;

/// Standard normal by Box–Muller (deterministic for a seed): two `f64` draws, four words.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(1e-300);
    let u2: f64 = rng.random::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// The next `n` values of `w`, chosen to keep activations in a healthy range and exercise every
/// path: matrices N(0, 1/fan_in), embeddings N(0, 1), (1+w) norms N(0, 0.1), plain norms
/// 1+N(0, 0.1), A_log = ln U(1, 16), dt_bias 1+N(0, 0.1), convs N(0, 1/kernel). A value depends
/// only on the weight, not on its position, so any split of the stream gives the same values.
pub(super) fn next(w: &WeightInfo, rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let name = w.name.as_str();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let z = normal(rng);
        let v = if name.ends_with("A_log") {
            (1.0 + 15.0 * rng.random::<f32>()).ln()
        } else if name.ends_with("dt_bias") || name.ends_with("linear_attn.norm.weight") {
            1.0 + 0.1 * z
        } else if w.shape.len() == 1 {
            0.1 * z
        } else if name.ends_with("conv1d.weight") {
            z / (*w.shape.last().unwrap() as f32).sqrt()
        } else if name.ends_with("embed_tokens.weight") || name.ends_with("ngram_embedding.weight")
        {
            z
        } else {
            z / (*w.shape.last().unwrap() as f32).sqrt()
        };
        out.push(v);
    }
    out
}

/// Moves the stream past the next `n` values of `w` without making them: [`next`] draws four
/// 32-bit words a value (two `f64`), five for `A_log` (one `f32` more).
pub(super) fn skip(w: &WeightInfo, rng: &mut ChaCha8Rng, n: usize) {
    let words = if w.name.ends_with("A_log") { 5 } else { 4 };
    rng.set_word_pos(rng.get_word_pos() + words * n as u128);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::WeightClass;
    use rand::SeedableRng;

    fn weight(name: &str, shape: Vec<usize>) -> WeightInfo {
        WeightInfo {
            name: name.to_string(),
            shape,
            class: WeightClass::Float,
            optional: false,
        }
    }

    /// Skipping values leaves the stream where making them does, for every kind of value, and
    /// values made in pieces equal those made at once.
    #[test]
    fn skipping_and_pieces_keep_the_stream() {
        for w in [
            weight("model.layers.0.linear_attn.A_log", vec![8]),
            weight("model.layers.0.mlp.gate.weight", vec![4, 64]),
            weight("model.norm.weight", vec![64]),
        ] {
            for n in [0, 1, 3, 7, 16, 33] {
                let mut made = ChaCha8Rng::seed_from_u64(3);
                let mut skipped = ChaCha8Rng::seed_from_u64(3);
                // Start mid-block, as a stream does after other weights.
                next(&w, &mut made, 5);
                next(&w, &mut skipped, 5);
                next(&w, &mut made, n);
                skip(&w, &mut skipped, n);
                assert_eq!(
                    made.get_word_pos(),
                    skipped.get_word_pos(),
                    "{} {n}",
                    w.name
                );
                assert_eq!(next(&w, &mut made, 9), next(&w, &mut skipped, 9));
            }
            let mut whole = ChaCha8Rng::seed_from_u64(8);
            let mut pieces = ChaCha8Rng::seed_from_u64(8);
            let mut joined = next(&w, &mut pieces, 11);
            joined.extend(next(&w, &mut pieces, 30));
            assert_eq!(next(&w, &mut whole, 41), joined);
        }
    }
}
