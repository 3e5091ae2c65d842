//! QSA attention: the rotary embeddings, the indexer's block selection, and the sparse
//! attention over the selected cache blocks (plain, or gated with its norms and rotary fused).

use super::*;
use crate::exec::cuda::launch::attention;
use crate::ops::indexer::IndexerShape;

pub(super) fn launch(
    cx: &Launch,
    a: &NodeArgs,
    states: &mut [DevState],
) -> Result<Vec<DVal>, CudaError> {
    let (rows, step) = (a.rows(), a.step);
    let y = match &a.node.op {
        Op::Rope {
            head_dim,
            rotary_dim,
        } => attention::rope(cx, a.f32(0), rows, step, *head_dim, *rotary_dim, a.rotary())?,
        Op::NormRope {
            head_dim,
            rotary_dim,
        } => attention::norm_rope(
            cx,
            a.f32(0),
            a.vector(0)?,
            rows,
            step,
            *head_dim,
            *rotary_dim,
            a.eps(),
            a.rotary(),
        )?,
        Op::IndexerSelect { .. } | Op::IndexerSelectQk { .. } => {
            let shape = IndexerShape::of(&a.node.op).expect("an indexer op");
            let [raw, pooled] = states else {
                unreachable!("the template declares two states")
            };
            let (raw, pooled) = (f32_state(raw), f32_state(pooled));
            let (eps, theta) = (a.eps(), a.rotary());
            // The queries and keys ready, or the indexer's projection (IndexerSelectQk).
            let sel = if let Op::IndexerSelect { .. } = a.node.op {
                attention::indexer_select(
                    cx,
                    a.f32(0),
                    a.f32(1),
                    a.vector(0)?,
                    raw,
                    pooled,
                    rows,
                    step,
                    &shape,
                    a.cap,
                    eps,
                    theta,
                )?
            } else {
                attention::indexer_select_qk(
                    cx,
                    a.f32(0),
                    a.vector(0)?,
                    a.vector(1)?,
                    raw,
                    pooled,
                    rows,
                    step,
                    &shape,
                    a.cap,
                    eps,
                    theta,
                )?
            };
            return Ok(vec![DVal::Sel(sel)]);
        }
        Op::Attention {
            heads,
            kv_heads,
            head_dim,
            block,
        } => {
            let (keep, [kc, vc]) = (a.kept_blocks(3), states) else {
                unreachable!("the template declares two states")
            };
            let attend = match a.variant() {
                "split" => attention::attention_split,
                "reference" => attention::attention,
                _ => return Err(a.unknown_variant()),
            };
            attend(
                cx,
                a.f32(0),
                a.f32(1),
                a.f32(2),
                a.selection(3),
                f32_state(kc),
                f32_state(vc),
                rows,
                step,
                *heads,
                *kv_heads,
                *head_dim,
                a.cap,
                keep,
                *block,
            )?
        }
        Op::GatedAttention {
            heads,
            kv_heads,
            head_dim,
            rotary_dim,
            block,
        } => {
            // The caches are `Attention`'s, carried by the `gated_attention` fusion.
            let (keep, [kc, vc]) = (a.kept_blocks(3), states) else {
                unreachable!("the template declares two states")
            };
            let x = attention::GatedAttentionInputs {
                qg: a.f32(0),
                k_raw: a.f32(1),
                v: a.f32(2),
                sel: a.selection(3),
                q_norm: a.vector(0)?,
                k_norm: a.vector(1)?,
            };
            let shape = attention::GatedAttentionShape {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: *head_dim,
                rotary_dim: *rotary_dim,
                block: *block,
            };
            let attend = match a.variant() {
                "split" => attention::gated_attention_split,
                "reference" => attention::gated_attention,
                _ => return Err(a.unknown_variant()),
            };
            let (kc, vc) = (f32_state(kc), f32_state(vc));
            attend(
                cx,
                &x,
                kc,
                vc,
                rows,
                step,
                &shape,
                a.cap,
                keep,
                a.eps(),
                a.rotary(),
            )?
        }
        _ => unreachable!("dispatched by op family"),
    };
    Ok(vec![DVal::F32(y)])
}
