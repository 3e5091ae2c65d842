//! PLE: hashed n-gram ids and the per-stream gate.

use super::{conv, elementwise, norm, sigmoid};

/// N-gram ids `[T, (n-1)*hpn]` for `tokens`, given the previous `n-1` ids in `history` (eos at the
/// start of a sequence); `history` then holds the last `n-1` ids.
///
/// `shift_k(p)` is the token k places back, or eos when that crosses the start or an earlier eos
/// (an eos ends its segment: tokens after it see only eos as history). For each order
/// `o in 2..=n`: `mix = XOR_{j<o} shift_j * mult[j]` (wrapping i64), and head h of that order gets
/// `mix mod size[h] + offset[h]`.
#[allow(clippy::too_many_arguments)] // the tables HF keeps as three buffers, plus the n-gram shape
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

/// [`ngram_ids`] with the hash table `table` and the eos of a program's constants (what the CPU
/// executor and a CUDA host step both compute); `Err` names what the program lacks.
pub fn program_ngram_ids(
    consts: &crate::ir::Consts,
    table: usize,
    tokens: &[i64],
    history: &mut [i64],
    ngram: usize,
    heads_per_ngram: usize,
) -> Result<Vec<i64>, String> {
    let t = consts
        .ple_tables
        .get(table)
        .ok_or_else(|| format!("no PLE table {table}"))?;
    let eos = consts.ple_eos.ok_or("PLE needs an eos token")?;
    if history.len() + 1 != ngram {
        return Err(format!(
            "a history of {} tokens for n-grams of {ngram}",
            history.len()
        ));
    }
    Ok(ngram_ids(
        tokens,
        history,
        eos,
        ngram,
        heads_per_ngram,
        &t.multipliers,
        &t.head_sizes,
        &t.head_offsets,
    ))
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

/// The PLE block's tail (`Op::PleMix`, fusion `ple_mix`), composed of the unfused ops so that
/// it gives their bits: `key = rms_norm(key_proj)`, `query = rms_norm(h)` (groups of H, scale
/// `1 + w`), `gv = gate(key, query, value)`, then `h + (gv + silu(causal_conv(rms_norm(gv))))`,
/// the conv dilated by `dilation` over `window` (updated as `conv::causal_conv` does).
/// `key_proj, h [tokens, streams*H]`, `value [tokens, H]`; norm weights `[streams*H]` or `[H]`,
/// `conv_w [streams*H, kernel]`.
#[allow(clippy::too_many_arguments)] // the three inputs, four weights and the state of the tail
pub fn mix(
    key_proj: &[f32],
    h: &[f32],
    value: &[f32],
    norm_key: &[f32],
    norm_query: &[f32],
    norm_conv: &[f32],
    conv_w: &[f32],
    window: &mut [f32],
    tokens: usize,
    streams: usize,
    kernel: usize,
    dilation: usize,
    eps: f32,
) -> Vec<f32> {
    let group = h.len() / tokens / streams;
    let key = norm::rms_norm(key_proj, norm_key, group, true, eps);
    let query = norm::rms_norm(h, norm_query, group, true, eps);
    let gv = gate(&key, &query, value, tokens, streams);
    let gv_norm = norm::rms_norm(&gv, norm_conv, group, true, eps);
    let y = conv::causal_conv(&gv_norm, window, conv_w, tokens, kernel, dilation, true);
    let out = elementwise::add(&gv, &y);
    elementwise::add(h, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY_MULT: [i64; 3] = [73077407744147129, 4156873792259893, 23288516139688959];
    const TINY_SIZES: [i64; 4] = [31, 37, 41, 43];
    const TINY_OFFSETS: [i64; 4] = [0, 31, 68, 109];

    fn tiny(tokens: &[i64], history: &mut [i64]) -> Vec<i64> {
        ngram_ids(
            tokens,
            history,
            2,
            3,
            2,
            &TINY_MULT,
            &TINY_SIZES,
            &TINY_OFFSETS,
        )
    }

    /// The spec's test vector (tiny config, eos 2), computed by transformers.
    #[test]
    fn tiny_reference_ids() {
        let mut history = vec![2, 2];
        let ids = tiny(&[5, 6, 2, 7, 8, 9], &mut history);
        let want = [
            [23, 58, 92, 134],
            [9, 38, 105, 121],
            [8, 49, 94, 120],
            [24, 64, 101, 118],
            [26, 58, 107, 135],
            [21, 64, 102, 140],
        ];
        assert_eq!(ids, want.concat());
        assert_eq!(history, vec![8, 9]);
    }

    /// The spec's test vector for the real config's first PLE layer (eos 248044).
    #[test]
    fn real_reference_ids() {
        let mult = [23703573157769, 20109073645365, 8052911324071];
        let sizes: Vec<i64> = vec![
            20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
            20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171,
        ];
        let offsets: Vec<i64> = sizes
            .iter()
            .scan(0, |acc, s| {
                let o = *acc;
                *acc += s;
                Some(o)
            })
            .collect();
        let mut history = vec![248044, 248044];
        let ids = ngram_ids(
            &[9707, 11, 1879, 248044, 151, 33],
            &mut history,
            248044,
            3,
            8,
            &mult,
            &sizes,
            &offsets,
        );
        assert_eq!(
            &ids[..16],
            &[
                16410909, 39682429, 55103279, 60931720, 87006904, 116506179, 131512017, 152932897,
                169641436, 182022480, 209277433, 237891023, 256841529, 277007269, 290665954,
                300984276
            ]
        );
        assert_eq!(
            &ids[5 * 16..],
            &[
                16288464, 28226466, 54197200, 66558106, 85726393, 112116249, 131701318, 144482004,
                160025094, 193880860, 208528123, 224008510, 244707387, 265765406, 286197995,
                308958866
            ]
        );
    }

    /// The mix carries its conv window across steps: a step of every row gives the bits of
    /// steps of one and of several rows (rows of a step read rows before them, dilation 2 < 6).
    #[test]
    fn mix_window_carries_across_steps() {
        let (tokens, streams, h, kernel, dilation) = (6, 2, 4, 3, 2);
        let width = streams * h;
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| (i as f32 * f).sin()).collect() };
        let (kp, hs, value) = (
            wave(tokens * width, 0.7),
            wave(tokens * width, 1.3),
            wave(tokens * h, 0.4),
        );
        let (nk, nq, nc) = (wave(width, 0.2), wave(h, 0.5), wave(width, 0.9));
        let conv_w = wave(width * kernel, 0.3);
        let past = (kernel - 1) * dilation;
        let step = |window: &mut Vec<f32>, t0: usize, t1: usize| {
            mix(
                &kp[t0 * width..t1 * width],
                &hs[t0 * width..t1 * width],
                &value[t0 * h..t1 * h],
                &nk,
                &nq,
                &nc,
                &conv_w,
                window,
                t1 - t0,
                streams,
                kernel,
                dilation,
                1e-6,
            )
        };
        let mut window = vec![0.5; past * width];
        let whole = step(&mut window, 0, tokens);
        let mut split_window = vec![0.5; past * width];
        let mut split = step(&mut split_window, 0, 1);
        split.extend(step(&mut split_window, 1, 4));
        split.extend(step(&mut split_window, 4, tokens));
        assert_eq!(split, whole);
        assert_eq!(split_window, window);
    }

    /// Feeding the tokens one chunk at a time gives the same ids as all at once.
    #[test]
    fn history_carries_across_chunks() {
        let tokens = [5, 6, 2, 7, 8, 9, 2, 2, 11, 3];
        let mut h = vec![2, 2];
        let whole = tiny(&tokens, &mut h);
        for split in 1..tokens.len() {
            let mut h = vec![2, 2];
            let mut ids = tiny(&tokens[..split], &mut h);
            ids.extend(tiny(&tokens[split..], &mut h));
            assert_eq!(ids, whole, "split at {split}");
        }
    }
}
