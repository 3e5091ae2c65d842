//! The shape rules' refusals and results, op by op.

use super::*;

/// Stream counts from a graph file that overflow the width are errors, not a panic.
#[test]
fn huge_stream_counts_are_errors() {
    let op = Op::RepeatStreams {
        streams: usize::MAX,
    };
    let err = infer(&op, &[(ValueType::F32, 2)], &[]).unwrap_err();
    assert!(err.contains("overflow"), "{err}");
    let op = Op::EmbedStreams {
        streams: usize::MAX,
    };
    let err = infer(&op, &[(ValueType::I64, 1)], &[vec![10, 4]]).unwrap_err();
    assert!(err.contains("overflow"), "{err}");
    let ok = Op::RepeatStreams { streams: 4 };
    assert_eq!(
        infer(&ok, &[(ValueType::F32, 2)], &[]),
        Ok(vec![(ValueType::F32, 8)])
    );
}

/// Dimensions whose products overflow a width (a graph file may give any literal) are
/// errors naming the product and its factors, not a panic or a wrapped width.
#[test]
fn huge_dimensions_are_errors_naming_the_product() {
    use ValueType::{Selection, F32, I64};
    let huge = 1usize << 62;
    let overflow = |op: &Op<usize>, inputs: &[Io], weights: &[Vec<usize>], want: &str| {
        let err = infer(op, inputs, weights).unwrap_err();
        assert!(
            err.contains(want) && err.contains("overflows"),
            "{op:?}: {err}"
        );
    };
    let sel = (Selection, 0);
    let attention = |heads, kv_heads, head_dim| Op::Attention {
        heads,
        kv_heads,
        head_dim,
        block: 2,
    };
    let (q, kv) = ((F32, 32), (F32, 16));
    overflow(
        &attention(huge, 1, 8),
        &[q, kv, kv, sel],
        &[],
        &format!("heads * head_dim = {huge} * 8"),
    );
    overflow(
        &attention(4, huge, 8),
        &[q, kv, kv, sel],
        &[],
        &format!("kv_heads * head_dim = {huge} * 8"),
    );
    let gdn = Op::GdnRecurrence {
        key_heads: 1,
        value_heads: 1,
        key_dim: 1 << 63,
        value_dim: 1,
    };
    overflow(
        &gdn,
        &[(F32, 8), (F32, 1), (F32, 1)],
        &[],
        &format!("2 * key_heads * key_dim = 2 * 1 * {}", 1usize << 63),
    );
    let qk = Op::IndexerSelectQk {
        heads: usize::MAX,
        head_dim: 8,
        rotary_dim: 4,
        budget: 4,
        block: 2,
    };
    overflow(&qk, &[(F32, 8)], &[vec![8], vec![8]], "heads + 1");
    let ids = Op::PleNgramIds {
        ngram: 3,
        heads_per_ngram: 1 << 63,
        table: 0,
    };
    overflow(
        &ids,
        &[(I64, 1)],
        &[],
        &format!("(ngram - 1) * heads_per_ngram = 2 * {}", 1usize << 63),
    );
    let experts = Op::MoeExperts {
        experts: 4,
        intermediate: 1 << 63,
    };
    overflow(
        &experts,
        &[(F32, 8), (I64, 2), (F32, 2)],
        &[vec![4, 8, 8], vec![4, 8, 4]],
        "2 * intermediate",
    );
    overflow(
        &Op::Embed,
        &[(I64, huge)],
        &[vec![10, 8]],
        "ids * table width",
    );
    let norm = Op::RmsNorm {
        group: 8,
        unit_offset: false,
    };
    overflow(
        &norm,
        &[(F32, 8)],
        &[vec![huge, 8]],
        "the weight's elements",
    );
    // Products that fit are inferred as before.
    assert_eq!(
        infer(&attention(4, 2, 8), &[q, kv, kv, sel], &[]),
        Ok(vec![(F32, 32)])
    );
    let fits = Op::PleNgramIds {
        ngram: 3,
        heads_per_ngram: 4,
        table: 0,
    };
    assert_eq!(infer(&fits, &[(I64, 1)], &[]), Ok(vec![(I64, 8)]));
}

/// A zero where an op divides a width (streams, head_dim) is an error, not a division by
/// zero.
#[test]
fn zero_divisors_are_errors() {
    use ValueType::F32;
    let positive = |op: Op<usize>, inputs: &[Io], weights: &[Vec<usize>], name: &str| {
        let err = infer(&op, inputs, weights).unwrap_err();
        assert_eq!(err, format!("{name} must be positive"), "{op:?}");
    };
    positive(Op::StreamMean { streams: 0 }, &[(F32, 8)], &[], "streams");
    positive(
        Op::HcMix { streams: 0 },
        &[(F32, 8)],
        &[vec![2, 8], vec![8, 2]],
        "streams",
    );
    positive(
        Op::GatedRmsNorm { head_dim: 0 },
        &[(F32, 8), (F32, 8)],
        &[vec![0]],
        "head_dim",
    );
    let rope = Op::Rope {
        head_dim: 0,
        rotary_dim: 0,
    };
    positive(rope, &[(F32, 8)], &[], "head_dim");
    assert_eq!(
        infer(&Op::StreamMean { streams: 4 }, &[(F32, 8)], &[]),
        Ok(vec![(F32, 2)])
    );
}

/// The normed recurrence's rule is the gated recurrence's, then the output norm's: `o`'s
/// width out, and either part's mismatch refused.
#[test]
fn normed_recurrence_checks_both_parts() {
    use ValueType::F32;
    let op = Op::GdnNormedRecurrence {
        key_heads: 2,
        value_heads: 4,
        key_dim: 8,
        value_dim: 6,
    };
    let qkv = (F32, 2 * 2 * 8 + 4 * 6);
    let (b, a, z) = ((F32, 4), (F32, 4), (F32, 4 * 6));
    let weights = vec![vec![4], vec![4], vec![6]];
    assert_eq!(infer(&op, &[qkv, b, a, z], &weights), Ok(vec![(F32, 24)]));
    // z of another width, a norm weight of another length, a short qkv, a missing input.
    assert!(infer(&op, &[qkv, b, a, (F32, 23)], &weights).is_err());
    let wrong_norm = vec![vec![4], vec![4], vec![24]];
    assert!(infer(&op, &[qkv, b, a, z], &wrong_norm).is_err());
    assert!(infer(&op, &[(F32, 55), b, a, z], &weights).is_err());
    assert!(infer(&op, &[qkv, b, a], &weights).is_err());
    assert!(infer(&op, &[qkv, b, a, z], &weights[..2]).is_err());
}

/// The gated attention's rule is the unfused chain's: the output is q's width, and a wrong
/// qg, k, v, selection or norm weight is refused, naming the part.
#[test]
fn gated_attention_checks_every_part() {
    use ValueType::{Selection, F32};
    let op = Op::GatedAttention {
        heads: 6,
        kv_heads: 2,
        head_dim: 8,
        rotary_dim: 4,
        block: 2,
    };
    let (qg, k, v, sel) = ((F32, 6 * 2 * 8), (F32, 16), (F32, 16), (Selection, 0));
    let weights = vec![vec![8], vec![8]];
    assert_eq!(infer(&op, &[qg, k, v, sel], &weights), Ok(vec![(F32, 48)]));
    // Per-row norm weights, as NormRope takes them.
    let per_row = vec![vec![48], vec![16]];
    assert_eq!(infer(&op, &[qg, k, v, sel], &per_row), Ok(vec![(F32, 48)]));
    let err = |inputs: &[Io], weights: &[Vec<usize>]| infer(&op, inputs, weights).unwrap_err();
    // qg without its gates, k or v of another width, no selection.
    assert!(err(&[(F32, 48), k, v, sel], &weights).starts_with("qg: "));
    assert!(err(&[qg, (F32, 24), v, sel], &weights).starts_with("attention: "));
    assert!(err(&[qg, k, (F32, 8), sel], &weights).starts_with("attention: "));
    assert!(err(&[qg, k, v, (F32, 0)], &weights).starts_with("attention: "));
    // A norm weight of neither length, q's and k's.
    assert!(err(&[qg, k, v, sel], &[vec![7], vec![8]]).starts_with("q: "));
    assert!(err(&[qg, k, v, sel], &[vec![8], vec![48]]).starts_with("k: "));
    // An odd rotary_dim, heads that are no multiple of the kv heads.
    let odd = Op::GatedAttention {
        heads: 6,
        kv_heads: 2,
        head_dim: 8,
        rotary_dim: 3,
        block: 2,
    };
    assert!(infer(&odd, &[qg, k, v, sel], &weights).is_err());
    let ragged = Op::GatedAttention {
        heads: 6,
        kv_heads: 4,
        head_dim: 8,
        rotary_dim: 4,
        block: 2,
    };
    let k4 = (F32, 32);
    assert!(infer(&ragged, &[qg, k4, k4, sel], &weights).is_err());
    // A missing input or weight.
    assert!(infer(&op, &[qg, k, v], &weights).is_err());
    assert!(infer(&op, &[qg, k, v, sel], &weights[..1]).is_err());
}

/// The PLE mix's rule is the unfused tail's: h's width out, and a wrong key, value, norm
/// weight or conv weight refused, naming the part.
#[test]
fn ple_mix_checks_every_part() {
    use ValueType::{F32, I64};
    let op = Op::PleMix {
        streams: 4,
        kernel: 4,
        dilation: 3,
    };
    let (kp, h, v) = ((F32, 4 * 8), (F32, 4 * 8), (F32, 8));
    let weights = vec![vec![32], vec![32], vec![32], vec![32, 1, 4]];
    assert_eq!(infer(&op, &[kp, h, v], &weights), Ok(vec![(F32, 32)]));
    // Norm weights shared by the streams, as RmsNorm takes them.
    let shared = vec![vec![8], vec![8], vec![8], vec![32, 1, 4]];
    assert_eq!(infer(&op, &[kp, h, v], &shared), Ok(vec![(F32, 32)]));
    let err = |inputs: &[Io], weights: &[Vec<usize>]| infer(&op, inputs, weights).unwrap_err();
    // h of no whole streams, key_proj of another width, value of another width or type.
    assert!(infer(&op, &[kp, (F32, 30), v], &weights).is_err());
    assert!(err(&[(F32, 40), h, v], &weights).starts_with("key: "));
    assert!(err(&[(F32, 40), h, v], &shared).starts_with("gate: "));
    assert!(err(&[kp, h, (F32, 16)], &weights).starts_with("gate: "));
    assert!(err(&[kp, h, (I64, 8)], &weights).starts_with("gate: "));
    // Each norm weight of neither length, a conv weight of other taps or width.
    let mut bad = weights.clone();
    bad[0] = vec![7];
    assert!(err(&[kp, h, v], &bad).starts_with("key: "));
    bad = weights.clone();
    bad[1] = vec![16];
    assert!(err(&[kp, h, v], &bad).starts_with("query: "));
    bad = weights.clone();
    bad[2] = vec![9];
    assert!(err(&[kp, h, v], &bad).starts_with("conv norm: "));
    bad = weights.clone();
    bad[3] = vec![32, 1, 3];
    assert!(err(&[kp, h, v], &bad).starts_with("conv: "));
    // No taps, a missing input or weight.
    let no_taps = Op::PleMix {
        streams: 4,
        kernel: 0,
        dilation: 3,
    };
    assert!(infer(&no_taps, &[kp, h, v], &weights).is_err());
    assert!(infer(&op, &[kp, h], &weights).is_err());
    assert!(infer(&op, &[kp, h, v], &weights[..3]).is_err());
}

/// The fused convolution's rule is the convolution's over the raw projection and the conv
/// weight, then the normed recurrence's: either part's mismatch refused.
#[test]
fn conv_normed_recurrence_checks_the_conv_and_the_recurrence() {
    use ValueType::F32;
    let op = Op::GdnConvNormedRecurrence {
        key_heads: 2,
        value_heads: 4,
        key_dim: 8,
        value_dim: 6,
        kernel: 4,
    };
    let width = 2 * 2 * 8 + 4 * 6;
    let qkv = (F32, width);
    let (b, a, z) = ((F32, 4), (F32, 4), (F32, 4 * 6));
    let weights = vec![vec![width, 1, 4], vec![4], vec![4], vec![6]];
    assert_eq!(infer(&op, &[qkv, b, a, z], &weights), Ok(vec![(F32, 24)]));
    // A conv weight of other taps or of another width than qkv, a qkv and conv weight that
    // agree but do not fit the heads, z of another width, a norm weight of another length, a
    // missing weight or input.
    let taps3 = vec![vec![width, 1, 3], vec![4], vec![4], vec![6]];
    assert!(infer(&op, &[qkv, b, a, z], &taps3).is_err());
    let narrow = vec![vec![width - 1, 1, 4], vec![4], vec![4], vec![6]];
    assert!(infer(&op, &[qkv, b, a, z], &narrow).is_err());
    assert!(infer(&op, &[(F32, width - 1), b, a, z], &weights).is_err());
    assert!(infer(&op, &[(F32, width - 1), b, a, z], &narrow).is_err());
    assert!(infer(&op, &[qkv, b, a, (F32, 23)], &weights).is_err());
    let wrong_norm = vec![vec![width, 1, 4], vec![4], vec![4], vec![24]];
    assert!(infer(&op, &[qkv, b, a, z], &wrong_norm).is_err());
    assert!(infer(&op, &[qkv, b, a, z], &weights[..3]).is_err());
    assert!(infer(&op, &[qkv, b, a], &weights).is_err());
}
