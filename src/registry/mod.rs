//! The kernel registry: for every op kind and executor, the variants the schedule may choose
//! from, each naming the kernels it launches (as `kernels/*.cu` names them, or the CPU
//! reference's function) and declaring what those kernels accept.
//!
//! Rules (`graphs/rules.ron`) choose a variant per node by the node's facts ([`NodeFacts`]) and
//! the device's ([`DeviceFacts`]); `passes::schedule` then asks the variant whether its kernels
//! accept the node (a refusal is a lowering error naming the node and the rule) and records the
//! kernels on the node. Executors launch what the node names; nothing here runs anything.

pub mod cpu;
pub mod cuda;
pub mod facts;

pub use facts::{
    node_rows, reads_ple_table, DeviceFacts, NodeFacts, Placement, StorageFormats, WeightFormat,
};

use crate::ir::Device;

/// Whether a variant's kernels take a node: `Err` says which limit the node passes.
pub type Accepts = fn(&NodeFacts, &DeviceFacts) -> Result<(), String>;
/// The kernels a variant launches for a node, in launch order.
pub type Kernels = fn(&NodeFacts, &DeviceFacts) -> Vec<String>;

/// One way to compute an op on one executor.
pub struct Variant {
    /// The op kind (`Op::kind`).
    pub op: &'static str,
    /// The name rules use (`variant: "rows1_stream"`).
    pub name: &'static str,
    pub doc: &'static str,
    pub accepts: Accepts,
    pub kernels: Kernels,
}

impl std::fmt::Debug for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.op, self.name)
    }
}

/// Every variant of `device`, grouped by op kind; within a kind, the first is the default
/// (what a node no rule matches gets).
pub fn all(device: Device) -> &'static [&'static [Variant]] {
    match device {
        Device::Cpu => cpu::VARIANTS,
        Device::Cuda => cuda::VARIANTS,
    }
}

/// The variants of op kind `op` on `device`, the default first; empty for unknown kinds.
pub fn variants(device: Device, op: &str) -> &'static [Variant] {
    all(device)
        .iter()
        .copied()
        .find(|family| family.first().is_some_and(|v| v.op == op))
        .unwrap_or(&[])
}

/// The variant `name` of `op` on `device`.
pub fn find(device: Device, op: &str, name: &str) -> Option<&'static Variant> {
    variants(device, op).iter().find(|v| v.name == name)
}

/// The variant names of `op` on `device`, for messages.
pub fn names(device: Device, op: &str) -> Vec<&'static str> {
    variants(device, op).iter().map(|v| v.name).collect()
}

/// Accepts any node.
pub fn any(_: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    Ok(())
}

/// Accepts one-token steps only.
pub fn one_token(f: &NodeFacts, _: &DeviceFacts) -> Result<(), String> {
    if f.tokens == 1 {
        Ok(())
    } else {
        Err(format!("{} tokens: a one-token kernel", f.tokens))
    }
}

/// `Err(msg)` unless `ok`.
pub fn require(ok: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(msg())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_kind_has_a_default_variant_on_both_executors() {
        for device in [Device::Cpu, Device::Cuda] {
            for kind in crate::ir::op::KINDS {
                assert!(
                    !variants(device, kind).is_empty(),
                    "{device}: op `{kind}` has no variant"
                );
            }
            for family in all(device) {
                let op = family[0].op;
                assert!(
                    crate::ir::op::KINDS.contains(&op),
                    "{device}: unknown op `{op}`"
                );
                assert!(
                    family.iter().all(|v| v.op == op),
                    "{device}: `{op}` mixes kinds"
                );
                for (i, v) in family.iter().enumerate() {
                    assert!(
                        family[..i].iter().all(|u| u.name != v.name),
                        "{device}: `{op}` names variant `{}` twice",
                        v.name
                    );
                }
            }
        }
    }
}
