//! The static tables of the PLE n-gram embedding (spec §3.4), computed exactly as HF does:
//! per-head table sizes (consecutive primes from `ngram_vocab_size_base`), their offsets into the
//! one concatenated embedding table, the padded row count, and the per-order hash multipliers.
//!
//! HF saves the three int64 buffers in checkpoints; computing them here lets the checkpoint loader
//! compare, and lets the embedding table's row count be known before any weight is read.

use super::PleTables;

/// The splitmix64 / golden-ratio increment.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// One splitmix64 step as HF writes it: all math modulo 2^64.
pub(super) fn splitmix64(v: u64) -> u64 {
    let mut z = v.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `_build_layer_multipliers(vocab_size, ngram_size, ple_layer_index, seed)`: one odd multiplier
/// per n-gram position. They are bounded so that `token * mult < 2^63` for every token id, which
/// keeps HF's int64 hashing free of overflow.
pub(super) fn layer_multipliers(
    vocab_size: usize,
    ngram_size: usize,
    ple_layer_index: usize,
    seed: u64,
) -> Vec<i64> {
    let multiplier_max = (i64::MAX as u64) / (vocab_size.max(1) as u64);
    let half = (multiplier_max / 2).max(1);
    let base = seed.wrapping_add(10007u64.wrapping_mul(ple_layer_index as u64));
    (0..ngram_size as u64)
        .map(|j| {
            let hash = splitmix64(base.wrapping_add(GOLDEN.wrapping_mul(j + 1)));
            // < 2*half + 1 <= multiplier_max < 2^63, so the cast is exact.
            (2 * (hash % half) + 1) as i64
        })
        .collect()
}

/// The first `count` primes `>= base`, in order: `_find_nth_prime_after(base - 1, k)` for
/// k = 1..=count. `None` if they would run past `i64::MAX` (HF stores them as int64).
pub(super) fn primes_from(base: u64, count: usize) -> Option<Vec<u64>> {
    let mut primes = Vec::with_capacity(count);
    let mut candidate = base;
    while primes.len() < count {
        if candidate > i64::MAX as u64 {
            return None;
        }
        if is_prime(candidate) {
            primes.push(candidate);
        }
        candidate += 1; // cannot overflow: candidate <= i64::MAX here
    }
    Some(primes)
}

/// The tables of one PLE layer from its head sizes. `None` if the total row count overflows
/// int64 (only for absurd configs).
pub(super) fn layer_tables(
    layer: usize,
    head_sizes: &[u64],
    divisible_by: u64,
    multipliers: Vec<i64>,
) -> Option<PleTables> {
    let mut offsets = Vec::with_capacity(head_sizes.len());
    let mut total: u64 = 0;
    for &size in head_sizes {
        offsets.push(i64::try_from(total).ok()?);
        total = total.checked_add(size)?;
    }
    // The embedding has `ceil(total / divisor) * divisor` rows; the tail rows are never hashed to.
    let padded = total.div_ceil(divisible_by).checked_mul(divisible_by)?;
    i64::try_from(padded).ok()?;
    Some(PleTables {
        layer,
        multipliers,
        head_sizes: head_sizes
            .iter()
            .map(|&s| i64::try_from(s).ok())
            .collect::<Option<Vec<i64>>>()?,
        head_offsets: offsets,
        padded_rows: usize::try_from(padded).ok()?,
    })
}

/// Deterministic primality for any u64: trial division by the small primes, then Miller–Rabin
/// with the first twelve prime bases, which has no false positives below 3.3e24.
pub(super) fn is_prime(n: u64) -> bool {
    const SMALL: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    for p in SMALL {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    // n - 1 = d * 2^s with d odd.
    let s = (n - 1).trailing_zeros();
    let d = (n - 1) >> s;
    'witness: for a in SMALL {
        let mut x = pow_mod(a, d, n);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul_mod(x, x, n);
            if x == n - 1 {
                continue 'witness;
            }
        }
        return false;
    }
    true
}

fn mul_mod(a: u64, b: u64, m: u64) -> u64 {
    ((a as u128 * b as u128) % m as u128) as u64
}

fn pow_mod(mut base: u64, mut exp: u64, m: u64) -> u64 {
    let mut acc = 1 % m;
    base %= m;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = mul_mod(acc, base, m);
        }
        base = mul_mod(base, base, m);
        exp >>= 1;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_published_sequence() {
        // The first output of the reference SplitMix64 generator seeded with 0.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn is_prime_agrees_with_trial_division() {
        fn slow(n: u64) -> bool {
            n >= 2
                && (2..)
                    .take_while(|d| d * d <= n)
                    .all(|d| !n.is_multiple_of(d))
        }
        for n in 0..5000 {
            assert_eq!(is_prime(n), slow(n), "n = {n}");
        }
        for n in 20_000_000..20_000_200 {
            assert_eq!(is_prime(n), slow(n), "n = {n}");
        }
        // Strong pseudoprimes to several small bases, and the largest u64 prime.
        assert!(!is_prime(3_215_031_751));
        assert!(!is_prime(3_825_123_056_546_413_051));
        assert!(is_prime(18_446_744_073_709_551_557));
    }

    #[test]
    fn real_model_tables_match_the_spec() {
        // vocab 248320, seed 1234, n 3, hpn 8 (nH 16), base 2e7, divisor 128, PLE layer index 0.
        let mult = layer_multipliers(248_320, 3, 0, 1234);
        assert_eq!(mult, [23703573157769, 20109073645365, 8052911324071]);
        let sizes = primes_from(20_000_000, 16).unwrap();
        assert_eq!(
            sizes,
            [
                20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069, 20000077,
                20000081, 20000093, 20000107, 20000147, 20000153, 20000159, 20000161, 20000171
            ]
        );
        let tables = layer_tables(1, &sizes, 128, mult).unwrap();
        let total: i64 = tables.head_sizes.iter().sum();
        assert_eq!(total, 320_001_446);
        assert_eq!(tables.padded_rows, 320_001_536);
        assert_eq!(tables.head_offsets[0], 0);
        assert_eq!(tables.head_offsets[1], 20_000_003);
        assert_eq!(tables.head_offsets[15], total - 20_000_171);
    }

    #[test]
    fn tiny_model_tables_match_the_spec() {
        // vocab 99, seed 1234, n 3, hpn 2 (nH 4), base 31, divisor 8, PLE layer index 0.
        let mult = layer_multipliers(99, 3, 0, 1234);
        assert_eq!(
            mult,
            [73077407744147129, 4156873792259893, 23288516139688959]
        );
        let sizes = primes_from(31, 4).unwrap();
        let tables = layer_tables(0, &sizes, 8, mult).unwrap();
        assert_eq!(tables.head_sizes, [31, 37, 41, 43]);
        assert_eq!(tables.head_offsets, [0, 31, 68, 109]);
        assert_eq!(tables.padded_rows, 152);
    }

    #[test]
    fn multipliers_are_odd_and_keep_token_products_below_2_pow_63() {
        for vocab in [1usize, 2, 99, 248_320, 1 << 31] {
            for index in 0..4 {
                for m in layer_multipliers(vocab, 5, index, 1234) {
                    assert!(m > 0 && m % 2 == 1);
                    assert!((m as u128) * ((vocab - 1) as u128) < 1u128 << 63);
                }
            }
        }
        // Each PLE layer gets its own multipliers.
        assert_ne!(
            layer_multipliers(99, 3, 0, 1234),
            layer_multipliers(99, 3, 1, 1234)
        );
    }

    #[test]
    fn primes_stop_at_i64_max() {
        assert_eq!(primes_from(u64::MAX - 10, 1), None);
        // 2^63 - 25 is the largest prime below 2^63; nothing prime follows within i64.
        assert_eq!(primes_from((1 << 63) - 25, 1), Some(vec![(1 << 63) - 25]));
        assert_eq!(primes_from((1 << 63) - 25, 2), None);
        assert_eq!(primes_from(0, 3), Some(vec![2, 3, 5]));
    }

    #[test]
    fn padded_rows_overflow_is_reported_not_panicked() {
        let huge = [i64::MAX as u64, 1];
        assert_eq!(layer_tables(0, &huge, 8, vec![1]), None);
    }
}
