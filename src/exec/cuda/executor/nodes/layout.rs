//! The ops that move rows between the hyper-connection streams and the layer's width:
//! `RepeatStreams`, `HcRead`, `HcMix`, `HcInject`, `HcWrite`, `StreamMean`, `GatedStreamMean`,
//! and the column and row picks `Slice`, `SplitQGate`, `LastRow`.

use super::*;
use crate::exec::cuda::launch::layout::{self, HcReadAct};

pub(super) fn launch(cx: &Launch, a: &NodeArgs) -> Result<Vec<DVal>, CudaError> {
    let rows = a.rows();
    let one = |buf| Ok(vec![DVal::F32(buf)]);
    match &a.node.op {
        Op::RepeatStreams { streams } => one(layout::repeat_streams(cx, a.f32(0), rows, *streams)?),
        Op::HcRead { streams, inject } => {
            let gains = if *inject { Some(a.matrix(3)?) } else { None };
            let act = HcReadAct::from_variant(a.variant()).ok_or_else(|| a.unknown_variant())?;
            let (x, inj) = layout::hc_read(
                cx,
                a.f32(0),
                a.vector(0)?,
                a.matrix(1)?,
                a.matrix(2)?,
                gains,
                rows,
                *streams,
                a.eps(),
                act,
            )?;
            Ok(std::iter::once(x).chain(inj).map(DVal::F32).collect())
        }
        Op::HcMix { streams } => one(layout::hc_mix(
            cx,
            a.f32(0),
            a.matrix(0)?,
            a.matrix(1)?,
            rows,
            *streams,
            a.block_form()?,
        )?),
        Op::HcInject { streams } => one(layout::hc_inject(
            cx,
            a.f32(0),
            a.matrix(0)?,
            rows,
            *streams,
            a.block_form()?,
        )?),
        Op::HcWrite { streams } => one(layout::hc_write(
            cx,
            a.f32(0),
            a.f32(1),
            a.f32(2),
            rows,
            *streams,
        )?),
        Op::StreamMean { streams } => one(layout::stream_mean(cx, a.f32(0), rows, *streams)?),
        Op::GatedStreamMean { streams } => one(layout::gated_stream_mean(
            cx,
            a.f32(0),
            a.f32(1),
            rows,
            *streams,
        )?),
        Op::Slice { start, len } => one(layout::slice_cols(cx, a.f32(0), rows, *start, *len)?),
        Op::LastRow => one(layout::last_row(cx, a.f32(0), rows)?),
        Op::SplitQGate { heads, head_dim } => {
            let (q, g) = layout::split_q_gate(cx, a.f32(0), rows, *heads, *head_dim)?;
            Ok(vec![DVal::F32(q), DVal::F32(g)])
        }
        _ => unreachable!("dispatched by op family"),
    }
}
