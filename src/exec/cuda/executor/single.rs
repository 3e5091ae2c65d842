//! One node run alone, its inputs and states given and returned as the CPU executor holds them:
//! how the parity loop over the kernel registry (tests/gpu_parity.rs) checks every CUDA variant
//! against the CPU reference, through the same node launchers a step uses.

use super::*;
use crate::exec::cpu::Val;
use crate::exec::state::StateBuf;
use crate::ir::Node;
use crate::ops::indexer::RowSel;

/// Runs `node` (a node of `program`, whose variant and kernels may have been changed) once on
/// the device at position `start`, with `Append` states preallocated to `capacity` rows; returns
/// its outputs and its states after the launch. The node launches exactly the kernels it names.
#[allow(clippy::too_many_arguments)]
pub fn run_node(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    node: &Node,
    inputs: &[Val],
    states: &[StateBuf],
    start: usize,
    capacity: usize,
) -> Result<(Vec<Val>, Vec<StateBuf>), CudaError> {
    let shape = |name: &str| {
        program
            .value(name)
            .map(ValueShape::of)
            .ok_or_else(|| CudaError::Shape {
                kernel: node.op.kind().into(),
                msg: format!("value `{name}` is not declared"),
            })
    };
    let shapes = node
        .inputs
        .iter()
        .map(|i| shape(i))
        .collect::<Result<Vec<_>, _>>()?;
    let values = inputs
        .iter()
        .zip(&shapes)
        .map(|(v, s)| upload_value(gpu, v, s))
        .collect::<Result<Vec<_>, _>>()?;
    let on_host = crate::registry::cuda::runs_on_host(&node.kernels);
    let mut bufs = states
        .iter()
        .map(|s| match (on_host, s) {
            (true, StateBuf::Tokens(v)) => Ok(DevState::HostTokens(v.clone())),
            _ => upload_state(gpu, s, capacity),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let step = gpu.upload(&[start as i64], "the step position")?;
    // A node that starts on the host: its host step, as a step runs it before its graphs.
    let host_rows = match (on_host, inputs.first(), bufs.first_mut()) {
        (true, Some(Val::I64 { data: tokens, .. }), Some(DevState::HostTokens(history))) => {
            let table = weights.host_table(&node.weights[0])?;
            let rows = host_steps::gather(program, node, table, tokens, history)?;
            Some(gpu.upload(&rows, "the host step's rows")?)
        }
        (true, ..) => {
            return Err(CudaError::Shape {
                kernel: node.op.kind().into(),
                msg: format!(
                    "node `{}`: a host step needs tokens and a history",
                    node.name
                ),
            })
        }
        _ => None,
    };
    let args = nodes::NodeArgs {
        program,
        weights,
        node,
        inputs: values.iter().collect(),
        shapes: &shapes,
        step: &step,
        cap: capacity,
        host_rows: host_rows.as_ref(),
    };
    let cx = Launch::for_node(gpu, &node.name, &node.kernels);
    let out = nodes::launch(&cx, &args, &mut bufs)?;
    cx.finish()?;
    gpu.sync(&format!(
        "node `{}` ({})",
        node.name,
        node.kernels.join(", ")
    ))?;
    let outputs = node
        .outputs
        .iter()
        .zip(&out)
        .map(|(name, v)| download_value(gpu, v, &shape(name)?))
        .collect::<Result<Vec<_>, _>>()?;
    let states = states
        .iter()
        .zip(&bufs)
        .map(|(before, buf)| download_state(gpu, before, buf))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((outputs, states))
}

fn upload_value(gpu: &Gpu, v: &Val, shape: &ValueShape) -> Result<DVal, CudaError> {
    Ok(match v {
        Val::F32 { data, .. } => DVal::F32(Buf::owned(gpu.upload(data, "an input")?)),
        Val::I64 { data, .. } => DVal::I64(Buf::owned(gpu.upload(data, "an input")?)),
        Val::Sel(rows) => {
            let keep = (shape.bytes / 4 / shape.rows.max(1)).saturating_sub(2);
            DVal::Sel(Buf::owned(
                gpu.upload(&encode_selection(rows, keep), "a selection")?,
            ))
        }
    })
}

/// A selection in the device's format (docs/pipeline.md): a row is `visible`, `count` (-1 when
/// dense) and `keep` block ids ascending (-1 padding).
fn encode_selection(rows: &[RowSel], keep: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(rows.len() * (2 + keep));
    for r in rows {
        match r {
            RowSel::Dense { visible } => {
                out.extend([*visible as i32, -1]);
                out.extend(std::iter::repeat_n(-1, keep));
            }
            RowSel::Sparse {
                visible, blocks, ..
            } => {
                out.extend([*visible as i32, blocks.len() as i32]);
                out.extend(blocks.iter().map(|&b| b as i32));
                out.extend(std::iter::repeat_n(-1, keep.saturating_sub(blocks.len())));
            }
        }
    }
    out
}

fn download_value(gpu: &Gpu, v: &DVal, shape: &ValueShape) -> Result<Val, CudaError> {
    Ok(match v {
        DVal::F32(buf) => Val::F32 {
            rows: shape.rows,
            data: gpu.download(buf, "an output")?,
        },
        DVal::I64(buf) => Val::I64 {
            rows: shape.rows,
            data: gpu.download(buf, "an output")?,
        },
        DVal::Sel(buf) => {
            let raw = gpu.download(buf, "a selection")?;
            let per_row = raw.len() / shape.rows.max(1);
            Val::Sel(raw.chunks(per_row.max(1)).map(decode_row).collect())
        }
    })
}

/// A device selection row as the CPU holds it (the block size is not in the row: 0).
fn decode_row(r: &[i32]) -> RowSel {
    let visible = r[0].max(0) as usize;
    if r[1] < 0 {
        RowSel::Dense { visible }
    } else {
        RowSel::Sparse {
            visible,
            blocks: r[2..2 + r[1] as usize]
                .iter()
                .map(|&b| b as usize)
                .collect(),
            block: 0,
        }
    }
}

fn upload_state(gpu: &Gpu, s: &StateBuf, capacity: usize) -> Result<DevState, CudaError> {
    Ok(match s {
        StateBuf::Fixed(v) => DevState::F32(gpu.upload(v, "a state")?),
        StateBuf::Rows { width, data } => {
            let mut padded = data.clone();
            padded.resize(capacity * width, 0.0);
            DevState::F32(gpu.upload(&padded, "a state")?)
        }
        StateBuf::Tokens(v) => DevState::I64(gpu.upload(v, "a state")?),
    })
}

/// The state after the launch in the CPU's form (of `reference`'s kind); an `Append` state comes
/// back at its whole capacity.
fn download_state(gpu: &Gpu, reference: &StateBuf, buf: &DevState) -> Result<StateBuf, CudaError> {
    Ok(match (reference, buf) {
        (StateBuf::Fixed(_), DevState::F32(b)) => StateBuf::Fixed(gpu.download(b, "a state")?),
        (StateBuf::Rows { width, .. }, DevState::F32(b)) => StateBuf::Rows {
            width: *width,
            data: gpu.download(b, "a state")?,
        },
        (StateBuf::Tokens(_), DevState::I64(b)) => StateBuf::Tokens(gpu.download(b, "a state")?),
        (StateBuf::Tokens(_), DevState::HostTokens(v)) => StateBuf::Tokens(v.clone()),
        _ => unreachable!("uploaded from the same kinds"),
    })
}
