//! The per-layer embedding (PLE) fields and the n-gram tables they define.

use crate::plan::error::PlanError;
use crate::plan::fields::{as_usize, Fields};
use crate::plan::{ple_tables, PlePlan};

use super::{cap, size};

/// The most n-gram heads over all PLE layers: each needs a prime to be searched for.
const MAX_PLE_HEADS: usize = 4096;

pub(super) fn ple(
    t: &Fields,
    num_layers: usize,
    vocab_size: usize,
    hidden_size: usize,
) -> Result<Option<PlePlan>, PlanError> {
    let mut layer_ids = Vec::new();
    for (i, value) in t.list("ple_layer_ids")?.into_iter().flatten().enumerate() {
        let name = format!("ple_layer_ids[{i}]");
        let id = as_usize(value)
            .ok_or_else(|| t.wrong_type(&t.path(&name), value, "a one-indexed layer id"))?;
        if id == 0 || id > num_layers {
            return Err(t.invalid(
                &name,
                id,
                format!("PLE layer ids are one-indexed and must lie in [1, num_hidden_layers = {num_layers}]"),
            ));
        }
        layer_ids.push(id);
    }
    // HF keeps a sorted set; the table order (and each layer's hash seed) follows it.
    layer_ids.sort_unstable();
    layer_ids.dedup();

    // Read (and type-check) every PLE field even when PLE is off; HF checks values only when on.
    let embed_dim = t.usize("ple_embed_dim")?.unwrap_or(hidden_size);
    let conv_kernel = t.usize("ple_conv_kernel_size")?.unwrap_or(4);
    let ngram_size = t.usize("ngram_size")?.unwrap_or(3);
    let heads_per_ngram = t.usize("heads_per_ngram")?.unwrap_or(8);
    let vocab_base = t.u64("ngram_vocab_size_base")?.unwrap_or(20_000_000);
    let divisible_by = t.u64("make_ngram_vocab_size_divisible_by")?.unwrap_or(128);
    let seed = t.u64_bits("seed")?.unwrap_or(1234);
    let split_parts = t.usize("split_ngram_parts")?.unwrap_or(512);
    if layer_ids.is_empty() {
        return Ok(None);
    }

    // nH = (n-1)*hpn heads: hpn per n-gram order 2..=n.
    let num_heads = ngram_size.saturating_sub(1).saturating_mul(heads_per_ngram);
    if num_heads == 0 {
        let (name, value) = if ngram_size < 2 {
            ("ngram_size", ngram_size)
        } else {
            ("heads_per_ngram", heads_per_ngram)
        };
        return Err(t.invalid(
            name,
            value,
            format!("Qwen4Exp requires nH = (ngram_size - 1) * heads_per_ngram > 0 when ple_layer_ids is set (ngram_size = {ngram_size}, heads_per_ngram = {heads_per_ngram})"),
        ));
    }
    let total_heads = num_heads.saturating_mul(layer_ids.len());
    if total_heads > MAX_PLE_HEADS {
        return Err(t.invalid(
            "heads_per_ngram",
            heads_per_ngram,
            format!("{} PLE layers x nH {num_heads} = {total_heads} n-gram heads is implausibly many (limit {MAX_PLE_HEADS})", layer_ids.len()),
        ));
    }
    if embed_dim == 0 {
        return Err(t.invalid("ple_embed_dim", 0, "Qwen4Exp requires ple_embed_dim > 0"));
    }
    cap(t, "ple_embed_dim", embed_dim)?;
    if !embed_dim.is_multiple_of(num_heads) {
        return Err(t.invalid(
            "ple_embed_dim",
            embed_dim,
            format!("must be divisible by nH = (ngram_size - 1) * heads_per_ngram = {num_heads}"),
        ));
    }
    let conv_kernel = size(t, "ple_conv_kernel_size", conv_kernel)?;
    let split_parts = size(t, "split_ngram_parts", split_parts)?;
    for (name, value) in [
        ("ngram_vocab_size_base", vocab_base),
        ("make_ngram_vocab_size_divisible_by", divisible_by),
    ] {
        if value == 0 {
            return Err(t.invalid(name, 0, format!("Qwen4Exp requires {name} > 0")));
        }
    }

    // PLE layer k uses primes k*nH .. (k+1)*nH - 1 counted from the base.
    let primes = ple_tables::primes_from(vocab_base, total_heads).ok_or_else(|| {
        t.invalid(
            "ngram_vocab_size_base",
            vocab_base,
            "the n-gram head sizes (primes from this base) would exceed the int64 range",
        )
    })?;
    let tables = layer_ids
        .iter()
        .zip(primes.chunks(num_heads))
        .enumerate()
        .map(|(ple_index, (&id, sizes))| {
            let multipliers =
                ple_tables::layer_multipliers(vocab_size, ngram_size, ple_index, seed);
            ple_tables::layer_tables(id - 1, sizes, divisible_by, multipliers).ok_or_else(|| {
                t.invalid(
                    "make_ngram_vocab_size_divisible_by",
                    divisible_by,
                    "the padded n-gram table row count would exceed the int64 range",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    Ok(Some(PlePlan {
        layer_ids,
        embed_dim,
        conv_kernel,
        ngram_size,
        heads_per_ngram,
        num_heads,
        head_dim: embed_dim / num_heads,
        vocab_base,
        divisible_by,
        seed,
        split_parts,
        tables,
    }))
}
