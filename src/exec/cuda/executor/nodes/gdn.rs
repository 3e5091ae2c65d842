//! Gated DeltaNet: the causal conv, the gates, and the recurrence alone or fused with its
//! norm and its conv.

use super::*;
use crate::exec::cuda::device::Buf;
use crate::exec::cuda::launch::{gdn, layout};
use crate::ops::gdn::GdnShape;

pub(super) fn launch(
    cx: &Launch,
    a: &NodeArgs,
    states: &mut [DevState],
) -> Result<Vec<DVal>, CudaError> {
    let rows = a.rows();
    let y = match &a.node.op {
        Op::CausalConv {
            kernel,
            dilation,
            silu,
        } => {
            let how =
                gdn::ConvKernel::from_variant(a.variant()).ok_or_else(|| a.unknown_variant())?;
            let window = f32_state(&mut states[0]);
            let w = a.vector(0)?;
            gdn::causal_conv(
                cx,
                a.f32(0),
                window,
                w,
                rows,
                *kernel,
                *dilation,
                *silu,
                how,
            )?
        }
        Op::GdnGates => {
            let heads = a.width(0);
            let (beta, g) = gdn::gdn_gates(
                cx,
                a.f32(0),
                a.f32(1),
                a.vector(0)?,
                a.vector(1)?,
                rows,
                heads,
            )?;
            return Ok(vec![DVal::F32(beta), DVal::F32(g)]);
        }
        Op::GdnRecurrence { .. } | Op::GdnGatedRecurrence { .. } => {
            let shape = GdnShape::of(&a.node.op).expect("a recurrence op");
            let gates = match a.node.op {
                Op::GdnRecurrence { .. } => gdn::GdnGates::Given {
                    beta: a.f32(1),
                    g: a.f32(2),
                },
                _ => gdn::GdnGates::Raw {
                    b: a.f32(1),
                    a: a.f32(2),
                    a_log: a.vector(0)?,
                    dt_bias: a.vector(1)?,
                },
            };
            let layout =
                gdn::GdnLayout::from_variant(a.variant()).ok_or_else(|| a.unknown_variant())?;
            let st = f32_state(&mut states[0]);
            gdn::gdn_recurrence_with(cx, a.f32(0), gates, st, rows, &shape, layout)?
        }
        Op::GdnNormedRecurrence { value_dim, .. } => {
            let shape = GdnShape::of(&a.node.op).expect("a recurrence op");
            let n = Normed::of(a, 0, *value_dim)?;
            let st = f32_state(&mut states[0]);
            match a.variant() {
                "fused" => gdn::gdn_normed_recurrence(
                    cx,
                    a.f32(0),
                    n.b,
                    n.a,
                    n.a_log,
                    n.dt_bias,
                    n.z,
                    n.norm_w,
                    st,
                    rows,
                    &shape,
                    a.sigmoid_gate(),
                    a.eps(),
                )?,
                "reference" => unfused_normed_recurrence(cx, a, a.f32(0), &n, st, &shape)?,
                _ => return Err(a.unknown_variant()),
            }
        }
        Op::GdnConvNormedRecurrence {
            value_dim, kernel, ..
        } => {
            let shape = GdnShape::of(&a.node.op).expect("a recurrence op");
            let conv_w = a.vector(0)?;
            let n = Normed::of(a, 1, *value_dim)?;
            // The states in the fused node's order: the conv's window, then the recurrence's.
            let [window, st] = states else {
                unreachable!("the fused node carries the conv's and the recurrence's states")
            };
            let (window, st) = (f32_state(window), f32_state(st));
            let qkv = a.f32(0);
            match a.variant() {
                "fused" => gdn::gdn_conv_normed_recurrence(
                    cx,
                    qkv,
                    conv_w,
                    window,
                    n.b,
                    n.a,
                    n.a_log,
                    n.dt_bias,
                    n.z,
                    n.norm_w,
                    st,
                    rows,
                    &shape,
                    *kernel,
                    a.sigmoid_gate(),
                    a.eps(),
                )?,
                "reference" => {
                    // The convolution (an intermediate: in scratch), then the unfused normed
                    // recurrence.
                    let x = cx.intermediate(|| {
                        let how = gdn::ConvKernel::Reference;
                        gdn::causal_conv(cx, qkv, window, conv_w, rows, *kernel, 1, true, how)
                    })?;
                    unfused_normed_recurrence(cx, a, &x, &n, st, &shape)?
                }
                _ => return Err(a.unknown_variant()),
            }
        }
        _ => unreachable!("dispatched by op family"),
    };
    Ok(vec![DVal::F32(y)])
}

/// The inputs and weights of a normed recurrence besides its qkv and state.
struct Normed<'a> {
    b: &'a CudaSlice<f32>,
    a: &'a CudaSlice<f32>,
    z: &'a CudaSlice<f32>,
    a_log: &'a CudaSlice<f32>,
    dt_bias: &'a CudaSlice<f32>,
    norm_w: &'a CudaSlice<f32>,
    value_dim: usize,
}

impl<'a> Normed<'a> {
    /// Inputs 1-3 (`b`, `a`, `z`) and, from weight `first` on, `A_log`, `dt_bias` and the norm's
    /// weight (the fused conv's weight comes before them).
    fn of(args: &NodeArgs<'a>, first: usize, value_dim: usize) -> Result<Normed<'a>, CudaError> {
        Ok(Normed {
            b: args.f32(1),
            a: args.f32(2),
            z: args.f32(3),
            a_log: args.vector(first)?,
            dt_bias: args.vector(first + 1)?,
            norm_w: args.vector(first + 2)?,
            value_dim,
        })
    }
}

/// A normed recurrence's `reference` variant: the gated recurrence in its block layout (an
/// intermediate: in scratch), then the gated RMS norm.
fn unfused_normed_recurrence(
    cx: &Launch,
    args: &NodeArgs,
    qkv: &CudaSlice<f32>,
    n: &Normed,
    st: &mut CudaSlice<f32>,
    shape: &GdnShape,
) -> Result<Buf<f32>, CudaError> {
    let gates = gdn::GdnGates::Raw {
        b: n.b,
        a: n.a,
        a_log: n.a_log,
        dt_bias: n.dt_bias,
    };
    let (rows, block) = (args.rows(), gdn::GdnLayout::Block);
    let o = cx.intermediate(|| gdn::gdn_recurrence_with(cx, qkv, gates, st, rows, shape, block))?;
    let sigmoid = args.sigmoid_gate();
    layout::gated_rms_norm(cx, &o, n.z, n.norm_w, n.value_dim, sigmoid, args.eps())
}
