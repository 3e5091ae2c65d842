//! Row-wise and element-wise ops: the norms, scalings, activations and gated sums.

use super::*;
use crate::exec::cuda::launch::{self as kernels, layout};

pub(super) fn launch(cx: &Launch, a: &NodeArgs) -> Result<Vec<DVal>, CudaError> {
    let rows = a.rows();
    let y = match &a.node.op {
        Op::RmsNorm { group, unit_offset } => {
            kernels::rms_norm(cx, a.f32(0), a.vector(0)?, *group, *unit_offset, a.eps())?
        }
        Op::GatedRmsNorm { head_dim } => layout::gated_rms_norm(
            cx,
            a.f32(0),
            a.f32(1),
            a.vector(0)?,
            *head_dim,
            a.sigmoid_gate(),
            a.eps(),
        )?,
        Op::DivBy { by } => kernels::scalar(cx, "div_by", a.f32(0), *by as f32)?,
        Op::MulBy { by } => kernels::scalar(cx, "mul_by", a.f32(0), *by as f32)?,
        Op::Silu | Op::Sigmoid => kernels::unary(cx, a.node.op.kind(), a.f32(0))?,
        Op::Mul => kernels::mul(cx, a.f32(0), a.f32(1), rows)?,
        Op::Add => kernels::add(cx, a.f32(0), a.f32(1))?,
        Op::SigmoidMul => kernels::sigmoid_mul(cx, a.f32(0), a.f32(1), rows)?,
        Op::SigmoidGatedAdd => {
            layout::sigmoid_gated_add(cx, a.f32(0), a.vector(0)?, a.f32(1), a.f32(2), rows)?
        }
        _ => unreachable!("dispatched by op family"),
    };
    Ok(vec![DVal::F32(y)])
}
