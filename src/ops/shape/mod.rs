//! Shape rules: for each op, the output types and widths from its inputs and weight shapes.
//! Lowering uses them to size every value; `validate` re-checks a finished program with them, so a
//! fusion or a hand-edited template that breaks a shape is caught before anything runs.

use crate::ir::{Op, ValueType};

type Io = (ValueType, usize);

fn expect_inputs(inputs: &[Io], n: usize) -> Result<(), String> {
    if inputs.len() != n {
        return Err(format!("expects {n} input(s), got {}", inputs.len()));
    }
    Ok(())
}

fn expect_weights(weights: &[Vec<usize>], n: usize) -> Result<(), String> {
    if weights.len() != n {
        return Err(format!("expects {n} weight(s), got {}", weights.len()));
    }
    Ok(())
}

fn f32_input(io: Io, what: &str) -> Result<usize, String> {
    match io.0 {
        ValueType::F32 => Ok(io.1),
        t => Err(format!("{what} must be f32, is {t:?}")),
    }
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

/// The product of `factors`, or an error naming it by `what` (the op's words for it). Dimensions
/// come from graph files, where any literal is allowed, so a product may not fit a `usize`.
fn product(what: &str, factors: &[usize]) -> Result<usize, String> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| {
            let values: Vec<String> = factors.iter().map(|f| f.to_string()).collect();
            format!("{what} = {} overflows a width", values.join(" * "))
        })
}

/// `a + b`, or an error naming the sum by `what`.
fn sum(what: &str, a: usize, b: usize) -> Result<usize, String> {
    a.checked_add(b)
        .ok_or_else(|| format!("{what} = {a} + {b} overflows a width"))
}

/// A divisor that is no dimension (zero) is an error naming it, not a division by zero.
fn divisor(what: &str, d: usize) -> Result<usize, String> {
    check(d > 0, || format!("{what} must be positive"))?;
    Ok(d)
}

/// Output (type, width) per output of `op`.
pub fn infer(op: &Op<usize>, inputs: &[Io], weights: &[Vec<usize>]) -> Result<Vec<Io>, String> {
    use ValueType::*;
    let f = |w: usize| Ok(vec![(F32, w)]);
    match op {
        Op::Embed => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            check(inputs[0].0 == I64, || "ids must be i64".into())?;
            check(weights[0].len() == 2, || "table must be 2-D".into())?;
            f(product("ids * table width", &[inputs[0].1, weights[0][1]])?)
        }
        Op::RepeatStreams { streams } => {
            expect_inputs(inputs, 1)?;
            let width = f32_input(inputs[0], "input")?;
            f(width
                .checked_mul(*streams)
                .ok_or_else(|| format!("{streams} streams of width {width} overflow a width"))?)
        }
        Op::EmbedStreams { streams } => {
            let row = infer(&Op::Embed, inputs, weights)?;
            check(*streams > 0, || "streams must be > 0".into())?;
            f(row[0].1.checked_mul(*streams).ok_or_else(|| {
                format!("{streams} streams of width {} overflow a width", row[0].1)
            })?)
        }
        Op::RmsNorm { group, .. } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "input")?;
            check(*group > 0 && w % group == 0, || {
                format!("width {w} is not a multiple of group {group}")
            })?;
            let wl = product("the weight's elements", &weights[0])?;
            check(wl == w || wl == *group, || {
                format!("weight has {wl} elements, expected {w} or {group}")
            })?;
            f(w)
        }
        Op::Linear => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "input")?;
            check(weights[0].len() == 2 && weights[0][1] == w, || {
                format!(
                    "weight {:?} does not take an input of width {w}",
                    weights[0]
                )
            })?;
            f(weights[0][0])
        }
        Op::StreamLinear { streams } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "input")?;
            check(
                *streams > 0 && weights[0].len() == 2 && weights[0][1] * streams == w,
                || {
                    format!(
                        "weight {:?} on {streams} streams does not take an input of width {w}",
                        weights[0]
                    )
                },
            )?;
            f(weights[0][0] * streams)
        }
        Op::DivBy { by } | Op::MulBy { by } => {
            expect_inputs(inputs, 1)?;
            check(*by > 0, || "scalar must be positive".into())?;
            f(f32_input(inputs[0], "input")?)
        }
        Op::Silu | Op::Sigmoid | Op::LastRow => {
            expect_inputs(inputs, 1)?;
            f(f32_input(inputs[0], "input")?)
        }
        Op::Mul => {
            expect_inputs(inputs, 2)?;
            let a = f32_input(inputs[0], "first input")?;
            let b = f32_input(inputs[1], "second input")?;
            check(a == b || b == 1, || {
                format!("widths {a} and {b} do not broadcast")
            })?;
            f(a)
        }
        Op::Add => {
            expect_inputs(inputs, 2)?;
            let a = f32_input(inputs[0], "first input")?;
            let b = f32_input(inputs[1], "second input")?;
            check(a == b, || format!("widths {a} and {b} differ"))?;
            f(a)
        }
        Op::Slice { start, len } => {
            expect_inputs(inputs, 1)?;
            let w = f32_input(inputs[0], "input")?;
            // Checked: a graph file may give any start.
            check(start.checked_add(*len).is_some_and(|end| end <= w), || {
                format!(
                    "slice [{start}, {}) exceeds width {w}",
                    start.saturating_add(*len)
                )
            })?;
            f(*len)
        }
        Op::StreamMean { streams } => {
            expect_inputs(inputs, 1)?;
            let w = f32_input(inputs[0], "input")?;
            let streams = divisor("streams", *streams)?;
            check(w % streams == 0, || {
                format!("width {w} is not {streams} streams")
            })?;
            f(w / streams)
        }
        Op::HcWrite { streams } => {
            expect_inputs(inputs, 3)?;
            let h = f32_input(inputs[0], "h")?;
            let inj = f32_input(inputs[1], "inj")?;
            let y = f32_input(inputs[2], "y")?;
            let streams_y = product("streams * y", &[*streams, y])?;
            check(inj == *streams && h == streams_y, || {
                format!("h {h}, inj {inj}, y {y} do not fit {streams} streams")
            })?;
            f(h)
        }
        Op::CausalConv { kernel, .. } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "input")?;
            check(weights[0] == vec![w, 1, *kernel], || {
                format!("conv weight {:?} != [{w}, 1, {kernel}]", weights[0])
            })?;
            f(w)
        }
        Op::GdnGates => {
            expect_inputs(inputs, 2)?;
            expect_weights(weights, 2)?;
            let b = f32_input(inputs[0], "b")?;
            let a = f32_input(inputs[1], "a")?;
            let sizes = weights
                .iter()
                .map(|w| product("the weight's elements", w))
                .collect::<Result<Vec<_>, _>>()?;
            check(a == b && sizes.iter().all(|&n| n == a), || {
                "b, a, A_log and dt_bias must share the value-head count".into()
            })?;
            Ok(vec![(F32, a), (F32, a)])
        }
        Op::GdnRecurrence {
            key_heads,
            value_heads,
            key_dim,
            value_dim,
        } => {
            expect_inputs(inputs, 3)?;
            let w = f32_input(inputs[0], "qkv")?;
            let qk = product("2 * key_heads * key_dim", &[2, *key_heads, *key_dim])?;
            let v = product("value_heads * value_dim", &[*value_heads, *value_dim])?;
            let need = sum("the qkv width", qk, v)?;
            check(w == need, || format!("qkv width {w} != {need}"))?;
            check(*key_heads > 0 && value_heads % key_heads == 0, || {
                "value heads must be a multiple of key heads".into()
            })?;
            check(
                inputs[1].1 == *value_heads && inputs[2].1 == *value_heads,
                || "beta/g width must be value_heads".into(),
            )?;
            f(v)
        }
        Op::GdnGatedRecurrence { .. } => {
            // The gates' inputs and weights, then the recurrence over them.
            expect_inputs(inputs, 3)?;
            let gates = infer(&Op::GdnGates, &inputs[1..], weights)?;
            let recurrence = crate::ops::gdn::GdnShape::of(op)
                .expect("a recurrence op")
                .recurrence_op();
            infer(&recurrence, &[inputs[0], gates[0], gates[1]], &[])
        }
        Op::GdnNormedRecurrence { value_dim, .. } => {
            // The gated recurrence over the first three inputs and the first two weights, then
            // the output norm of its o with the gate z and the norm weight.
            expect_inputs(inputs, 4)?;
            expect_weights(weights, 3)?;
            let gated = crate::ops::gdn::GdnShape::of(op)
                .expect("a recurrence op")
                .gated_recurrence_op();
            let o = infer(&gated, &inputs[..3], &weights[..2])?;
            infer(
                &Op::GatedRmsNorm {
                    head_dim: *value_dim,
                },
                &[o[0], inputs[3]],
                &weights[2..],
            )
        }
        Op::GdnConvNormedRecurrence { kernel, .. } => {
            // The convolution of the raw projection (the first input, the first weight), then
            // the normed recurrence over its output with the other inputs and weights.
            expect_inputs(inputs, 4)?;
            expect_weights(weights, 4)?;
            let conv = Op::CausalConv {
                kernel: *kernel,
                dilation: 1,
                silu: true,
            };
            let x = infer(&conv, &inputs[..1], &weights[..1])?;
            let normed = crate::ops::gdn::GdnShape::of(op)
                .expect("a recurrence op")
                .normed_recurrence_op();
            infer(
                &normed,
                &[x[0], inputs[1], inputs[2], inputs[3]],
                &weights[1..],
            )
        }
        Op::GatedRmsNorm { head_dim } => {
            expect_inputs(inputs, 2)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "input")?;
            let head_dim = divisor("head_dim", *head_dim)?;
            check(inputs[1].1 == w && w % head_dim == 0, || {
                "gate width must equal input width".into()
            })?;
            check(
                product("the weight's elements", &weights[0])? == head_dim,
                || "weight must be [head_dim]".into(),
            )?;
            f(w)
        }
        Op::SplitQGate { heads, head_dim } => {
            expect_inputs(inputs, 1)?;
            let w = f32_input(inputs[0], "input")?;
            let q = product("heads * head_dim", &[*heads, *head_dim])?;
            check(Some(w) == q.checked_mul(2), || {
                format!("width {w} != 2*{heads}*{head_dim}")
            })?;
            Ok(vec![(F32, q), (F32, q)])
        }
        Op::Rope {
            head_dim,
            rotary_dim,
        } => {
            expect_inputs(inputs, 1)?;
            let w = f32_input(inputs[0], "input")?;
            divisor("head_dim", *head_dim)?;
            check(
                w % head_dim == 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                || format!("width {w}, head_dim {head_dim}, rotary_dim {rotary_dim} do not fit"),
            )?;
            f(w)
        }
        Op::NormRope {
            head_dim,
            rotary_dim,
        } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "input")?;
            check(
                *head_dim > 0 && w % head_dim == 0 && rotary_dim <= head_dim && rotary_dim % 2 == 0,
                || format!("width {w}, head_dim {head_dim}, rotary_dim {rotary_dim} do not fit"),
            )?;
            let wl = product("the norm weight's elements", &weights[0])?;
            check(wl == w || wl == *head_dim, || {
                format!("norm weight has {wl} elements, expected {w} or {head_dim}")
            })?;
            f(w)
        }
        Op::GatedStreamMean { streams } => {
            expect_inputs(inputs, 2)?;
            let a = f32_input(inputs[0], "up")?;
            let b = f32_input(inputs[1], "hn")?;
            check(a == b && *streams > 0 && a % streams == 0, || {
                format!("widths {a} and {b} are not the same {streams} streams")
            })?;
            f(a / streams)
        }
        Op::SigmoidMul => {
            expect_inputs(inputs, 2)?;
            let a = f32_input(inputs[0], "input")?;
            let b = f32_input(inputs[1], "gate")?;
            check(a == b || b == 1, || {
                format!("widths {a} and {b} do not broadcast")
            })?;
            f(a)
        }
        Op::IndexerSelect {
            heads,
            head_dim,
            rotary_dim,
            budget,
            block,
        } => {
            expect_inputs(inputs, 2)?;
            expect_weights(weights, 1)?;
            let q = product("heads * head_dim", &[*heads, *head_dim])?;
            check(inputs[0].1 == q && inputs[1].1 == *head_dim, || {
                "query/key widths".into()
            })?;
            check(
                *block > 0 && budget % block == 0 && rotary_dim <= head_dim,
                || "budget/block".into(),
            )?;
            Ok(vec![(Selection, 0)])
        }
        Op::IndexerSelectQk {
            heads,
            head_dim,
            rotary_dim,
            budget,
            block,
        } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 2)?;
            let heads1 = sum("heads + 1", *heads, 1)?;
            let qk = product("(heads + 1) * head_dim", &[heads1, *head_dim])?;
            check(inputs[0].1 == qk, || {
                "the projection's width: heads + 1 heads".into()
            })?;
            check(
                *block > 0 && budget % block == 0 && rotary_dim <= head_dim,
                || "budget/block".into(),
            )?;
            Ok(vec![(Selection, 0)])
        }
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            block,
        } => {
            expect_inputs(inputs, 4)?;
            check(*block > 0, || "block must be positive".into())?;
            let q = product("heads * head_dim", &[*heads, *head_dim])?;
            let kv = product("kv_heads * head_dim", &[*kv_heads, *head_dim])?;
            check(inputs[0].1 == q, || "q width".into())?;
            check(inputs[1].1 == kv && inputs[2].1 == kv, || {
                "k/v width".into()
            })?;
            check(*kv_heads > 0 && heads % kv_heads == 0, || {
                "heads must be a multiple of kv heads".into()
            })?;
            check(inputs[3].0 == Selection, || {
                "fourth input must be a selection".into()
            })?;
            f(q)
        }
        Op::GatedAttention {
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block,
        } => {
            // The unfused chain's rules in turn: the split of qg, the norm and RoPE of q (first
            // weight) and of k_raw (second weight), the attention, the gate.
            expect_inputs(inputs, 4)?;
            expect_weights(weights, 2)?;
            let part = |what: &'static str| move |msg: String| format!("{what}: {msg}");
            let split = Op::SplitQGate {
                heads: *heads,
                head_dim: *head_dim,
            };
            let q_gate = infer(&split, &inputs[..1], &[]).map_err(part("qg"))?;
            let norm_rope = Op::NormRope {
                head_dim: *head_dim,
                rotary_dim: *rotary_dim,
            };
            let q = infer(&norm_rope, &q_gate[..1], &weights[..1]).map_err(part("q"))?;
            let k = infer(&norm_rope, &inputs[1..2], &weights[1..]).map_err(part("k"))?;
            let attention = Op::Attention {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
                block: *block,
            };
            let attn = infer(&attention, &[q[0], k[0], inputs[2], inputs[3]], &[])
                .map_err(part("attention"))?;
            infer(&Op::SigmoidMul, &[attn[0], q_gate[1]], &[])
        }
        Op::MoeRouter { top_k } => {
            expect_inputs(inputs, 1)?;
            let e = f32_input(inputs[0], "logits")?;
            check(*top_k > 0 && *top_k <= e, || {
                format!("top_k {top_k} not in [1, {e}]")
            })?;
            Ok(vec![(I64, *top_k), (F32, *top_k)])
        }
        Op::MoeExperts {
            experts,
            intermediate,
        } => {
            expect_inputs(inputs, 3)?;
            expect_weights(weights, 2)?;
            let h = f32_input(inputs[0], "x")?;
            check(inputs[1].0 == I64 && inputs[1].1 == inputs[2].1, || {
                "ids/weights".into()
            })?;
            let gate_up = product("2 * intermediate", &[2, *intermediate])?;
            check(weights[0] == vec![*experts, gate_up, h], || {
                format!("gate_up {:?}", weights[0])
            })?;
            check(weights[1] == vec![*experts, h, *intermediate], || {
                format!("down {:?}", weights[1])
            })?;
            f(h)
        }
        Op::PleNgramIds {
            ngram,
            heads_per_ngram,
            ..
        } => {
            expect_inputs(inputs, 1)?;
            check(inputs[0].0 == I64, || "tokens must be i64".into())?;
            check(*ngram >= 2, || "ngram must be >= 2".into())?;
            let ids = product(
                "(ngram - 1) * heads_per_ngram",
                &[ngram - 1, *heads_per_ngram],
            )?;
            Ok(vec![(I64, ids)])
        }
        Op::PleEmbed {
            ngram,
            heads_per_ngram,
            table,
        } => {
            let ids = Op::PleNgramIds {
                ngram: *ngram,
                heads_per_ngram: *heads_per_ngram,
                table: *table,
            };
            let ids = infer(&ids, inputs, &[])?;
            infer(&Op::Embed, &ids, weights)
        }
        Op::PleGate { streams } => {
            expect_inputs(inputs, 3)?;
            let k = f32_input(inputs[0], "key")?;
            let q = f32_input(inputs[1], "query")?;
            let v = f32_input(inputs[2], "value")?;
            let streams_v = product("streams * value", &[*streams, v])?;
            check(k == q && k == streams_v, || {
                format!("key {k}, query {q}, value {v}")
            })?;
            f(k)
        }
        Op::PleMix {
            streams,
            kernel,
            dilation,
        } => {
            // The unfused chain's rules in turn: the key's and the query's norms (the first two
            // weights), the gate, the conv's norm (the third weight), the conv (the fourth), the
            // two sums.
            expect_inputs(inputs, 3)?;
            expect_weights(weights, 4)?;
            let part = |what: &'static str| move |msg: String| format!("{what}: {msg}");
            let width = f32_input(inputs[1], "h")?;
            check(*streams > 0 && width % streams == 0, || {
                format!("h width {width} is not {streams} streams")
            })?;
            check(*kernel > 0 && *dilation > 0, || {
                format!("kernel {kernel} and dilation {dilation} must be positive")
            })?;
            let norm = Op::RmsNorm {
                group: width / streams,
                unit_offset: true,
            };
            let key = infer(&norm, &inputs[..1], &weights[..1]).map_err(part("key"))?;
            let query = infer(&norm, &inputs[1..2], &weights[1..2]).map_err(part("query"))?;
            let gate = Op::PleGate { streams: *streams };
            let gv = infer(&gate, &[key[0], query[0], inputs[2]], &[]).map_err(part("gate"))?;
            let gv_norm = infer(&norm, &gv, &weights[2..3]).map_err(part("conv norm"))?;
            let conv = Op::CausalConv {
                kernel: *kernel,
                dilation: *dilation,
                silu: true,
            };
            let y = infer(&conv, &gv_norm, &weights[3..]).map_err(part("conv"))?;
            let out = infer(&Op::Add, &[gv[0], y[0]], &[])?;
            infer(&Op::Add, &[inputs[1], out[0]], &[])
        }
        Op::SwigluLinear => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 2)?;
            let w = f32_input(inputs[0], "input")?;
            check(
                weights[0] == weights[1] && weights[0].len() == 2 && weights[0][1] == w,
                || "gate/up".into(),
            )?;
            f(weights[0][0])
        }
        Op::HcMix { streams } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 2)?;
            let w = f32_input(inputs[0], "hn")?;
            let r = weights[0][0];
            let streams = divisor("streams", *streams)?;
            check(
                weights[0] == vec![r, w] && weights[1] == vec![w, r] && w % streams == 0,
                || "down/up".into(),
            )?;
            f(w / streams)
        }
        Op::HcRead { streams, inject } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, if *inject { 4 } else { 3 })?;
            let w = f32_input(inputs[0], "h")?;
            check(*streams > 0 && w % streams == 0, || {
                format!("width {w} is not a multiple of {streams} streams")
            })?;
            let r = weights[1].first().copied().unwrap_or(0);
            check(
                weights[0] == vec![w] || weights[0] == vec![w / streams],
                || format!("norm weight {:?}", weights[0]),
            )?;
            check(weights[1] == vec![r, w] && weights[2] == vec![w, r], || {
                "down/up".into()
            })?;
            if !*inject {
                return f(w / streams);
            }
            check(weights[3] == vec![*streams, w], || "inject weight".into())?;
            Ok(vec![(F32, w / streams), (F32, *streams)])
        }
        Op::LinearHcWrite { streams } => {
            expect_inputs(inputs, 3)?;
            expect_weights(weights, 1)?;
            let h = f32_input(inputs[0], "h")?;
            let inj = f32_input(inputs[1], "inj")?;
            let k = f32_input(inputs[2], "x")?;
            check(weights[0].len() == 2 && weights[0][1] == k, || {
                "weight [H, K]".into()
            })?;
            let hid = weights[0][0];
            let streams_hid = product("streams * y", &[*streams, hid])?;
            check(inj == *streams && h == streams_hid, || {
                format!("h {h}, inj {inj}, y {hid} do not fit {streams} streams")
            })?;
            f(h)
        }
        Op::MoeSharedWrite { streams } => {
            expect_inputs(inputs, 5)?;
            expect_weights(weights, 2)?;
            let h = f32_input(inputs[0], "h")?;
            let inj = f32_input(inputs[1], "inj")?;
            let hid = f32_input(inputs[2], "x")?;
            let inter = f32_input(inputs[3], "s")?;
            check(f32_input(inputs[4], "a")? == hid, || {
                "a and x widths".into()
            })?;
            check(weights[0] == vec![hid, inter], || {
                format!("down weight {:?}, want [{hid}, {inter}]", weights[0])
            })?;
            check(weights[1] == vec![1, hid], || "gate weight".into())?;
            let streams_hid = product("streams * y", &[*streams, hid])?;
            check(inj == *streams && h == streams_hid, || {
                format!("h {h}, inj {inj}, y {hid} do not fit {streams} streams")
            })?;
            f(h)
        }
        Op::LinearGroup { parts } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, *parts)?;
            let k = f32_input(inputs[0], "input")?;
            weights
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    check(w.len() == 2 && w[1] == k, || {
                        format!("weight {i} is {w:?}, want [N, {k}]")
                    })?;
                    Ok((F32, w[0]))
                })
                .collect()
        }
        Op::SigmoidGatedAdd => {
            expect_inputs(inputs, 3)?;
            expect_weights(weights, 1)?;
            let h = f32_input(inputs[0], "x")?;
            let d = f32_input(inputs[1], "b")?;
            check(f32_input(inputs[2], "a")? == d, || "a and b widths".into())?;
            check(weights[0] == vec![1, h], || "gate weight".into())?;
            f(d)
        }
        Op::HcInject { streams } => {
            expect_inputs(inputs, 1)?;
            expect_weights(weights, 1)?;
            let w = f32_input(inputs[0], "hn")?;
            check(weights[0] == vec![*streams, w], || "inject weight".into())?;
            f(*streams)
        }
    }
}

#[cfg(test)]
mod tests;
