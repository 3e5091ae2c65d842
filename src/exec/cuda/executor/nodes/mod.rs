//! One node's launch: [`NodeArgs`] resolves what the node reads (its inputs by place, its
//! weights, its rows and widths as `memplan` planned them), and [`launch`] hands it to the
//! launcher of its op family, which launches the kernels its program names.

mod attention;
mod elementwise;
mod embed;
mod gdn;
mod layout;
mod linear;
mod moe;

use cudarc::driver::CudaSlice;

use crate::exec::cuda::context::Launch;
use crate::exec::cuda::device::ReadyInputs;
use crate::exec::cuda::error::CudaError;
use crate::exec::cuda::launch::{moe_nvfp4::DeviceNvfp4, DeviceMatrix};
use crate::ir::{GateActivation, Node, Op, Program};

use super::{DVal, DevState, DeviceWeights, ValueShape};

/// What one node's launcher reads: the node, its program and weights, its inputs (by their place
/// in `node.inputs`) with their planned shapes, and the step's position and cache capacity.
pub(super) struct NodeArgs<'a> {
    pub program: &'a Program,
    pub weights: &'a DeviceWeights,
    pub node: &'a Node,
    pub inputs: Vec<&'a DVal>,
    pub shapes: &'a [ValueShape],
    /// The step's start position on the device (kernels read it: graphs replay unchanged).
    pub step: &'a CudaSlice<i64>,
    /// Rows each `Append` state holds.
    pub cap: usize,
    /// What the node's host step left for it (nodes that start on the host).
    pub host_rows: Option<&'a CudaSlice<f32>>,
}

impl<'a> NodeArgs<'a> {
    /// The rows the node is launched over (those of its first input).
    pub fn rows(&self) -> usize {
        self.shapes.first().map_or(self.program.tokens, |s| s.rows)
    }

    /// The row width of input `i`, as planned.
    pub fn width(&self, i: usize) -> usize {
        self.shapes[i].width
    }

    /// The blocks each row of selection input `i` keeps (`i32 [rows, 2 + keep]`).
    pub fn kept_blocks(&self, i: usize) -> usize {
        let s = self.shapes[i];
        (s.bytes / 4 / s.rows.max(1)).saturating_sub(2)
    }

    pub fn f32(&self, i: usize) -> &'a CudaSlice<f32> {
        match self.inputs[i] {
            DVal::F32(buf) => buf,
            _ => unreachable!("validated programs feed f32 where f32 is expected"),
        }
    }

    pub fn i64(&self, i: usize) -> &'a CudaSlice<i64> {
        match self.inputs[i] {
            DVal::I64(buf) => buf,
            _ => unreachable!("validated programs feed i64 where i64 is expected"),
        }
    }

    pub fn selection(&self, i: usize) -> &'a CudaSlice<i32> {
        match self.inputs[i] {
            DVal::Sel(buf) => buf,
            _ => unreachable!("validated programs feed a selection where one is expected"),
        }
    }

    /// Weight `i` of the node, a matrix.
    pub fn matrix(&self, i: usize) -> Result<&'a DeviceMatrix, CudaError> {
        self.weights.matrix(&self.node.weights[i])
    }

    /// Weight `i` of the node, an NVFP4 bank.
    pub fn nvfp4(&self, i: usize) -> Result<&'a DeviceNvfp4, CudaError> {
        self.weights.nvfp4(&self.node.weights[i])
    }

    /// Weight `i` of the node, a vector.
    pub fn vector(&self, i: usize) -> Result<&'a CudaSlice<f32>, CudaError> {
        self.weights.vector(&self.node.weights[i])
    }

    /// The declared shape of weight `i` (checked against the checkpoint when it was loaded).
    pub fn weight_shape(&self, i: usize) -> &'a [usize] {
        let name = &self.node.weights[i];
        self.program
            .weights
            .iter()
            .find(|w| &w.name == name)
            .map_or(&[][..], |w| &w.shape[..])
    }

    /// Rows of weight `i` (a matrix's `n`).
    pub fn weight_rows(&self, i: usize) -> usize {
        self.weight_shape(i).first().copied().unwrap_or(0)
    }

    /// The row width of gathered table `i` (its declared `[rows, d]`).
    pub fn table_width(&self, i: usize) -> usize {
        self.weight_shape(i).get(1).copied().unwrap_or(1)
    }

    pub fn eps(&self) -> f32 {
        self.program.consts.rms_norm_eps
    }

    /// The step's rotary embedding: the base, and the offset its rows are rotated past their
    /// cache rows (`Consts::rope_offset`).
    pub fn rotary(&self) -> crate::exec::cuda::launch::attention::Rotary {
        crate::exec::cuda::launch::attention::Rotary {
            theta: self.program.consts.rope_theta,
            offset: self.program.consts.rope_offset as i64,
        }
    }

    /// Whether the model's output gates are sigmoids (else SiLU).
    pub fn sigmoid_gate(&self) -> bool {
        self.program.consts.gate_activation == GateActivation::Sigmoid
    }

    /// The variant the schedule chose (`registry` lists each op's).
    pub fn variant(&self) -> &'a str {
        &self.node.variant
    }

    /// The error for a variant this executor does not have.
    pub fn unknown_variant(&self) -> CudaError {
        CudaError::Shape {
            kernel: self.node.kernels.join(", "),
            msg: format!(
                "node `{}`: the CUDA executor has no variant `{}` of {}",
                self.node.name,
                self.node.variant,
                self.node.op.kind()
            ),
        }
    }

    /// Whether the variant is the block form (`block`) or the reference one, for the ops that
    /// have those two.
    pub fn block_form(&self) -> Result<bool, CudaError> {
        match self.variant() {
            "block" => Ok(true),
            "reference" => Ok(false),
            _ => Err(self.unknown_variant()),
        }
    }
}

/// Launches the kernels of one node in its launch context `cx`; `states` are the node's
/// states, in its declared order.
pub(super) fn launch(
    cx: &Launch,
    args: &NodeArgs,
    states: &mut [DevState],
) -> Result<Vec<DVal>, CudaError> {
    use Op::*;
    match &args.node.op {
        Linear
        | LinearGroup { .. }
        | StreamLinear { .. }
        | SwigluLinear
        | LinearHcWrite { .. }
        | MoeSharedWrite { .. } => linear::launch(cx, args),
        RepeatStreams { .. }
        | HcRead { .. }
        | HcWrite { .. }
        | HcMix { .. }
        | HcInject { .. }
        | StreamMean { .. }
        | GatedStreamMean { .. }
        | Slice { .. }
        | LastRow
        | SplitQGate { .. } => layout::launch(cx, args),
        RmsNorm { .. }
        | GatedRmsNorm { .. }
        | DivBy { .. }
        | MulBy { .. }
        | Silu
        | Sigmoid
        | Mul
        | Add
        | SigmoidMul
        | SigmoidGatedAdd => elementwise::launch(cx, args),
        Embed
        | EmbedStreams { .. }
        | PleNgramIds { .. }
        | PleEmbed { .. }
        | PleGate { .. }
        | PleMix { .. } => embed::launch(cx, args, states),
        CausalConv { .. }
        | GdnGates
        | GdnRecurrence { .. }
        | GdnGatedRecurrence { .. }
        | GdnNormedRecurrence { .. }
        | GdnConvNormedRecurrence { .. } => gdn::launch(cx, args, states),
        Rope { .. }
        | NormRope { .. }
        | IndexerSelect { .. }
        | IndexerSelectQk { .. }
        | Attention { .. }
        | GatedAttention { .. } => attention::launch(cx, args, states),
        MoeRouter { .. } | MoeExperts { .. } => moe::launch(cx, args),
    }
}

/// The inputs of `node` that its kernels may read before the node launched just before it
/// (`previous`) has finished: those that are not `previous`'s outputs, since under programmatic
/// launch every kernel that wrote them has finished by the time `node` starts
/// (`wait_for_producers_unless` in kernels/common.cuh). The graph files' node order decides how
/// often this holds (graphs/qwen4exp/moe.ron puts the shared expert between the router and the
/// routed experts so that both run ahead).
pub(super) fn ready_after(node: &Node, previous: &Node) -> ReadyInputs {
    if releases_early(previous) {
        return ReadyInputs::NONE;
    }
    ReadyInputs(
        node.inputs
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, i)| !previous.outputs.contains(i))
            .fold(0, |m, (k, _)| m | 1 << k),
    )
}

/// Whether a kernel of `node` lets the next node launch before it has waited for its own
/// producers (`release_dependents_early`, kernels/common.cuh): the causal conv's decode kernel, so
/// that the GDN recurrence after it starts loading its state while the input projection drains.
/// The node after it may then start while the node two back still runs: nothing of its inputs is
/// ready before its wait.
fn releases_early(node: &Node) -> bool {
    matches!(node.op, Op::CausalConv { .. })
}

/// A state of the kinds the templates declare for it.
fn f32_state(buf: &mut DevState) -> &mut CudaSlice<f32> {
    match buf {
        DevState::F32(b) => b,
        _ => unreachable!("state kinds follow the templates"),
    }
}

fn i64_state(buf: &mut DevState) -> &mut CudaSlice<i64> {
    match buf {
        DevState::I64(b) => b,
        _ => unreachable!("state kinds follow the templates"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Device, LogitsMode, Phase};
    use crate::lower::{lower, GraphSet, LowerOptions};
    use crate::plan::ModelPlan;

    /// graphs/qwen4exp/moe.ron orders the MoE block so that, in a CUDA decode step, the shared
    /// expert's gate/up runs ahead of the router, the routed experts ahead of the shared expert,
    /// and the block's end takes the shared expert's down rows ahead of the routed experts (whose
    /// output it reads after its wait). A reordering that loses this shows up here.
    #[test]
    fn the_moe_block_runs_ahead_in_a_decode_step() {
        let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/configs/qwen3.8-flash-next.json");
        let plan = ModelPlan::from_file(&config).unwrap();
        let opts = LowerOptions {
            device: Device::Cuda,
            ..LowerOptions::new(Phase::Decode, 1, LogitsMode::Last)
        };
        let program = lower(&plan, &GraphSet::embedded().unwrap(), &opts)
            .unwrap()
            .program;
        let nodes = &program.nodes;
        let mut checked = 0;
        for (i, node) in nodes.iter().enumerate().skip(1) {
            let ready = ready_after(node, &nodes[i - 1]);
            let ok = match node.op.kind() {
                "swiglu_linear" => ready.all(&[0]),
                "moe_experts" => ready.all(&[0, 1, 2]),
                "moe_shared_write" => ready.all(&[2, 3]) && !ready.all(&[4]),
                _ => continue,
            };
            assert!(
                ok,
                "{} ({}) after {}: {ready:?}",
                node.name,
                node.op.kind(),
                nodes[i - 1].name
            );
            checked += 1;
        }
        assert_eq!(checked, 3 * plan.layers.len(), "one of each a layer");
    }
}
