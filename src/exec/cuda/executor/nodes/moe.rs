//! The routed experts: the router's top-k and the experts' gate/up, SiLU and down.

use super::*;
use crate::exec::cuda::launch::{moe, moe_nvfp4};

pub(super) fn launch(cx: &Launch, a: &NodeArgs) -> Result<Vec<DVal>, CudaError> {
    let rows = a.rows();
    match &a.node.op {
        Op::MoeRouter { top_k } => {
            let form =
                moe::RouterKernel::from_variant(a.variant()).ok_or_else(|| a.unknown_variant())?;
            let experts = a.width(0);
            let norm = a.program.consts.norm_topk_prob;
            let (ids, ws) = moe::moe_router(cx, a.f32(0), rows, experts, *top_k, norm, form)?;
            Ok(vec![DVal::I64(ids), DVal::F32(ws)])
        }
        Op::MoeExperts { intermediate, .. } => {
            let (x, ids, ws) = (a.f32(0), a.i64(1), a.f32(2));
            let (k, hidden) = (a.width(1), a.width(0));
            let dims = [rows, k, hidden, *intermediate];
            if let v @ ("nvfp4_token_major" | "nvfp4_expert_major_mma") = a.variant() {
                let (gate_up, down) = (a.nvfp4(0)?, a.nvfp4(1)?);
                let y = if v == "nvfp4_token_major" {
                    moe_nvfp4::moe_experts_nvfp4_token_major(cx, x, ids, ws, gate_up, down, dims)?
                } else {
                    moe_nvfp4::moe_experts_nvfp4_expert_major(cx, x, ids, ws, gate_up, down, dims)?
                };
                return Ok(vec![DVal::F32(y)]);
            }
            let (gate_up, down) = (a.matrix(0)?, a.matrix(1)?);
            let y = match a.variant() {
                v @ ("token_major" | "token_major_rows") => moe::moe_experts_with_down(
                    cx,
                    x,
                    ids,
                    ws,
                    gate_up,
                    down,
                    [rows, k, hidden, *intermediate],
                    v == "token_major_rows",
                )?,
                v @ ("expert_major" | "expert_major_mma") => moe::moe_experts_expert_major(
                    cx,
                    x,
                    ids,
                    ws,
                    gate_up,
                    down,
                    rows,
                    k,
                    hidden,
                    *intermediate,
                    v == "expert_major_mma",
                )?,
                _ => return Err(a.unknown_variant()),
            };
            Ok(vec![DVal::F32(y)])
        }
        _ => unreachable!("dispatched by op family"),
    }
}
