//! The routed experts: the router's top-k and the experts' gate/up, SiLU and down.

use super::*;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::launch::{moe, moe_nvfp4, moe_nvfp4_persistent, moe_nvfp4_union};

/// A routed-experts launcher over NVFP4 banks (`launch::moe_nvfp4`, `launch::moe_nvfp4_union`,
/// `launch::moe_nvfp4_persistent`).
type Nvfp4Form = fn(
    &Launch,
    &CudaSlice<f32>,
    &CudaSlice<i64>,
    &CudaSlice<f32>,
    &moe_nvfp4::DeviceNvfp4,
    &moe_nvfp4::DeviceNvfp4,
    [usize; 4],
) -> Result<Buf<f32>, CudaError>;

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
            let nvfp4_form: Option<Nvfp4Form> = match a.variant() {
                "nvfp4_token_major" => Some(moe_nvfp4::moe_experts_nvfp4_token_major),
                "nvfp4_expert_major_mma" => Some(moe_nvfp4::moe_experts_nvfp4_expert_major),
                "nvfp4_union_mma" => Some(moe_nvfp4_union::moe_experts_nvfp4_union),
                "nvfp4_union_persistent" => {
                    Some(moe_nvfp4_persistent::moe_experts_nvfp4_persistent)
                }
                _ => None,
            };
            if let Some(form) = nvfp4_form {
                let (gate_up, down) = (a.nvfp4(0)?, a.nvfp4(1)?);
                let y = form(cx, x, ids, ws, gate_up, down, dims)?;
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
