//! The token tables: `Embed`, `EmbedStreams`, and the PLE n-gram embedding (`PleNgramIds`,
//! `PleEmbed`, `PleGate`, `PleMix`).

use super::*;
use crate::exec::cuda::launch::{self as kernels, layout, moe, ple, NgramHash};

pub(super) fn launch(
    cx: &Launch,
    a: &NodeArgs,
    states: &mut [DevState],
) -> Result<Vec<DVal>, CudaError> {
    let rows = a.rows();
    Ok(match &a.node.op {
        Op::Embed => {
            let y = kernels::embed(cx, a.i64(0), a.matrix(0)?, a.table_width(0))?;
            vec![DVal::F32(y)]
        }
        Op::EmbedStreams { streams } => {
            let (table, d) = (a.matrix(0)?, a.table_width(0));
            vec![DVal::F32(kernels::embed_streams(
                cx,
                a.i64(0),
                rows,
                table,
                d,
                *streams,
            )?)]
        }
        Op::PleNgramIds { .. } => {
            let hash = ngram_hash(a)?;
            let ids = moe::ple_ngram_ids(cx, a.i64(0), i64_state(&mut states[0]), &hash)?;
            vec![DVal::I64(ids)]
        }
        Op::PleEmbed { .. } if a.variant() == "host_gather" => {
            // The ids and rows were made on the host before the step (`host_steps`).
            let rows_in = a.host_rows.ok_or_else(|| CudaError::Shape {
                kernel: "host_ple_embed_gather".into(),
                msg: format!("node `{}`: its host step left no rows", a.node.name),
            })?;
            let mut y = cx.output::<f32>(rows_in.len(), "ple_embed")?;
            cx.note_kernel("host_ple_embed_gather")?;
            cx.note_kernel("cuMemcpyHtoD")?;
            cx.note_kernel("cuMemcpyDtoD")?;
            cx.stream
                .memcpy_dtod(rows_in, &mut *y)
                .map_err(|e| CudaError::driver("copying the gathered PLE rows", None, e))?;
            vec![DVal::F32(y)]
        }
        Op::PleEmbed { .. } => {
            let hash = ngram_hash(a)?;
            let (table, d) = (a.matrix(0)?, a.table_width(0));
            let history = i64_state(&mut states[0]);
            vec![DVal::F32(kernels::ple_embed(
                cx,
                a.i64(0),
                history,
                &hash,
                table,
                d,
            )?)]
        }
        Op::PleGate { streams } => vec![DVal::F32(layout::ple_gate(
            cx,
            a.f32(0),
            a.f32(1),
            a.f32(2),
            rows,
            *streams,
        )?)],
        Op::PleMix {
            streams,
            kernel,
            dilation,
        } => {
            let shape = ple::PleMixShape {
                rows,
                streams: *streams,
                kernel: *kernel,
                dilation: *dilation,
            };
            let (nk, nq, nc) = (a.vector(0)?, a.vector(1)?, a.vector(2)?);
            let conv_w = a.vector(3)?;
            let window = f32_state(&mut states[0]);
            vec![DVal::F32(ple::ple_mix(
                cx,
                a.f32(0),
                a.f32(1),
                a.f32(2),
                nk,
                nq,
                nc,
                conv_w,
                window,
                shape,
                a.eps(),
            )?)]
        }
        _ => unreachable!("dispatched by op family"),
    })
}

/// The n-gram hashing of a PLE ids node: its order and heads, the program's eos and the node's
/// hash table on the device.
fn ngram_hash<'w>(a: &NodeArgs<'w>) -> Result<NgramHash<'w>, CudaError> {
    let (Op::PleNgramIds {
        ngram,
        heads_per_ngram,
        table,
    }
    | Op::PleEmbed {
        ngram,
        heads_per_ngram,
        table,
    }) = a.node.op
    else {
        unreachable!("called for the n-gram ops")
    };
    let [multipliers, sizes, offsets] =
        a.weights.ple.get(table).ok_or_else(|| CudaError::Shape {
            kernel: a.node.op.kind().into(),
            msg: format!(
                "node `{}` names PLE hash table {table}, which the program lacks",
                a.node.name
            ),
        })?;
    Ok(NgramHash {
        eos: a.program.consts.ple_eos.unwrap_or(0),
        ngram,
        heads_per_ngram,
        multipliers,
        sizes,
        offsets,
    })
}
