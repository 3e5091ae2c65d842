//! The host steps of a step: nodes whose kernels start on the host
//! (`registry::cuda::runs_on_host`) compute there before the step's graphs launch, from the
//! step's tokens (which the host holds) and state kept on the host, and leave their result in a
//! device buffer of the step; their kernels in the graph copy it into place. Graph replay of
//! every other node is untouched: what the host writes is at a fixed address.
//!
//! One such node exists: `ple_embed`'s `host_gather`, the PLE n-gram ids hashed
//! (`ops::ple::ngram_ids`, the CPU reference's own function) and their rows gathered from a
//! table in host memory (`weights::HostTable`), for a table too large for the device.

use super::*;
use crate::weights::HostTable;

/// Runs the host step of each node of `program` that has one, for a step over `tokens`, into
/// `io`'s host buffers. A refused step (an id outside the table, a non-finite row) leaves the
/// host states as they were.
pub(super) fn run(
    gpu: &Gpu,
    program: &Program,
    weights: &DeviceWeights,
    states: &mut HashMap<String, DevState>,
    io: &mut StepIo,
    tokens: &[i64],
) -> Result<(), CudaError> {
    for (index, node) in program.nodes.iter().enumerate() {
        if !crate::registry::cuda::runs_on_host(&node.kernels) {
            continue;
        }
        let Some(DevState::HostTokens(history)) =
            node.states.first().and_then(|s| states.get_mut(s))
        else {
            return Err(refused(
                node,
                "its token history is not kept on the host".into(),
            ));
        };
        let table = weights.host_table(&node.weights[0])?;
        let mut next = history.clone();
        let rows = gather(program, node, table, tokens, &mut next)?;
        let buf = io
            .host_rows
            .get_mut(&index)
            .ok_or_else(|| refused(node, "the step has no buffer for its rows".into()))?;
        if rows.len() != buf.len() {
            return Err(refused(
                node,
                format!(
                    "{} values gathered for a buffer of {}",
                    rows.len(),
                    buf.len()
                ),
            ));
        }
        gpu.stream
            .memcpy_htod(&rows, buf)
            .map_err(|e| CudaError::driver("uploading the gathered PLE rows", None, e))?;
        *history = next;
    }
    Ok(())
}

/// The rows `node` (a `PleEmbed`) gathers for `tokens`: `[tokens, heads·width]`, `history`
/// advanced as the ids' reference advances it.
pub(super) fn gather(
    program: &Program,
    node: &crate::ir::Node,
    table: &HostTable,
    tokens: &[i64],
    history: &mut [i64],
) -> Result<Vec<f32>, CudaError> {
    let crate::ir::Op::PleEmbed {
        ngram,
        heads_per_ngram,
        table: hash,
    } = node.op
    else {
        return Err(refused(
            node,
            format!("op `{}` has no host step", node.op.kind()),
        ));
    };
    if node.inputs.first() != Some(&program.input) {
        return Err(refused(
            node,
            "a host step reads the step's tokens only".into(),
        ));
    }
    let ids = crate::ops::ple::program_ngram_ids(
        &program.consts,
        hash,
        tokens,
        history,
        ngram,
        heads_per_ngram,
    )
    .map_err(|msg| refused(node, msg))?;
    let mut rows = Vec::with_capacity(ids.len() * table.width);
    table
        .gather(&ids, &mut rows)
        .map_err(|msg| refused(node, msg))?;
    Ok(rows)
}

fn refused(node: &crate::ir::Node, msg: String) -> CudaError {
    CudaError::Shape {
        kernel: format!("host_ple_embed_gather (node `{}`)", node.name),
        msg,
    }
}
