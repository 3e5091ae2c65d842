//! The matrix products: `Linear`, `StreamLinear`, `LinearGroup`, `SwigluLinear`, `LinearHcWrite`,
//! `MoeSharedWrite`.

use super::*;
use crate::exec::cuda::launch::linear::{self, GroupKernel, MmaTile, OneToken};
use crate::exec::cuda::launch::linear_few::{self, FewTile};
use crate::exec::cuda::launch::{self as kernels, layout};

pub(super) fn launch(cx: &Launch, a: &NodeArgs) -> Result<Vec<DVal>, CudaError> {
    let rows = a.rows();
    let one_token = |v: &str| OneToken::from_variant(v).ok_or_else(|| a.unknown_variant());
    Ok(match &a.node.op {
        Op::Linear => {
            let (x, m) = (a.f32(0), a.matrix(0)?);
            let (k, n) = (a.width(0), a.weight_rows(0));
            vec![DVal::F32(match a.variant() {
                "rows" => kernels::linear_rows(cx, x, m, rows, k, n)?,
                "tiled" => kernels::linear_tiled(cx, x, m, rows, k, n)?,
                "mma" => linear::linear_mma_with(cx, x, m, rows, k, n, MmaTile::T64)?,
                "mma_wide" => linear::linear_mma_with(cx, x, m, rows, k, n, MmaTile::Wide)?,
                few if few.starts_with("few_") => {
                    let tile = FewTile::from_variant(few).ok_or_else(|| a.unknown_variant())?;
                    linear_few::linear_few(cx, x, m, rows, k, tile)?
                }
                one => linear::linear_one_token(cx, x, m, k, n, one_token(one)?)?,
            })]
        }
        Op::StreamLinear { streams } => {
            // The streams of a row are contiguous: a linear over rows x streams rows.
            let (x, m, rows) = (a.f32(0), a.matrix(0)?, rows * streams);
            let (k, n) = (a.width(0) / streams, a.weight_rows(0));
            vec![DVal::F32(match a.variant() {
                "rows" => kernels::linear_rows(cx, x, m, rows, k, n)?,
                "tiled" => kernels::linear_tiled(cx, x, m, rows, k, n)?,
                _ => return Err(a.unknown_variant()),
            })]
        }
        Op::LinearGroup { .. } => {
            let ms = (0..a.node.weights.len())
                .map(|i| a.matrix(i))
                .collect::<Result<Vec<_>, _>>()?;
            let how = GroupKernel::from_variant(a.variant()).ok_or_else(|| a.unknown_variant())?;
            linear::linear_group(cx, a.f32(0), &ms, rows, how)?
                .into_iter()
                .map(DVal::F32)
                .collect()
        }
        Op::SwigluLinear => {
            let (wg, wu) = (a.matrix(0)?, a.matrix(1)?);
            let (k, n) = (a.width(0), a.weight_rows(0));
            let block = a.block_form()?;
            vec![DVal::F32(layout::swiglu(
                cx,
                a.f32(0),
                wg,
                wu,
                rows,
                k,
                n,
                block,
            )?)]
        }
        Op::LinearHcWrite { streams } => {
            let (h, inj, x, m) = (a.f32(0), a.f32(1), a.f32(2), a.matrix(0)?);
            let write = |one| kernels::linear_hc_write(cx, h, inj, x, m, rows, *streams, one);
            vec![DVal::F32(match a.variant() {
                "reference" => write(None)?,
                few if few.starts_with("few_") => {
                    let tile = FewTile::from_variant(few).ok_or_else(|| a.unknown_variant())?;
                    linear_few::linear_hc_write_few(cx, h, inj, x, m, rows, *streams, tile)?
                }
                one => write(Some(one_token(one)?))?,
            })]
        }
        Op::MoeSharedWrite { streams } => vec![DVal::F32(linear::moe_shared_write(
            cx,
            a.f32(0),
            a.f32(1),
            a.f32(2),
            a.f32(3),
            a.f32(4),
            a.matrix(0)?,
            a.vector(1)?,
            rows,
            *streams,
        )?)],
        _ => unreachable!("dispatched by op family"),
    })
}
