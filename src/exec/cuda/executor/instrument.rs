//! How a CUDA executor's steps launch beyond what their program says, for debugging and
//! measurement, and what the measurements found.

use std::collections::{BTreeMap, HashMap};

use super::GraphKey;

/// Debugging and measurement settings of one [`CudaExecutor`](super::CudaExecutor), with the
/// measurements they collect. The executor owns it, not the sequence's state: a user sets
/// `sync_each_node` and `launch_twice` through `runtime::ModelOptions`, `graphrun bench` turns
/// the measurements on and reads them back here. A measurement is on while its field is `Some`.
#[derive(Debug, Clone)]
pub struct Instrumentation {
    /// Synchronise after every node of an eager step, so that a kernel fault is reported with the
    /// node and kernel that caused it (steps then run eagerly; slow, for debugging).
    pub sync_each_node: bool,
    /// Op kinds whose nodes are launched twice, the second time into the same outputs and
    /// states: a step's time then grows by those nodes' marginal cost inside a replayed graph
    /// (`graphrun bench --launch-twice`). For measurement only: where the arena gives a node's
    /// output the slot of one of its dead inputs, the second launch reads its own output, and a
    /// stateful node advances its state twice (a recurrence steps twice, a cache row is written
    /// again), so results may be wrong. Captured graphs are captured again when it changes.
    pub launch_twice: Vec<String>,
    /// Launch kernels with programmatic dependent launch (`exec::cuda::launcher`) on devices
    /// that have it (on by default; the same bits either way); off for profiled and node-by-node
    /// synchronised steps, whose per-node events and waits separate the kernels anyway. Captured
    /// graphs hold their launches' attributes, so they are captured again when it changes.
    pub programmatic_launch: bool,
    /// Eager steps time every node with device events and add its time here, by node name:
    /// (steps timed, seconds). The step is queued behind a spinning kernel, so the events time
    /// the kernels back to back (as in a graph replay), not the host's launch rate. Steps then
    /// run eagerly.
    pub profile: Option<BTreeMap<String, (usize, f64)>>,
    /// Replayed steps time each segment's graph with device events: per segment index,
    /// (replays timed, milliseconds in all).
    pub segment_ms: Option<Vec<(usize, f64)>>,
    /// Replayed steps time their host side here ([`HostTimes`]).
    pub host_times: Option<HostTimes>,
    /// The step timeline's records (`CudaExecutor::start_trace`).
    pub trace: TraceLog,
}

impl Default for Instrumentation {
    fn default() -> Self {
        Instrumentation {
            sync_each_node: false,
            launch_twice: Vec::new(),
            programmatic_launch: true,
            profile: None,
            segment_ms: None,
            host_times: None,
            trace: TraceLog::default(),
        }
    }
}

impl Instrumentation {
    /// Stops the profile and returns it: (node name, steps timed, seconds in all), slowest
    /// first; empty when it was off.
    pub fn take_profile(&mut self) -> Vec<(String, usize, f64)> {
        let mut rows: Vec<(String, usize, f64)> = self
            .profile
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, (n, t))| (k, n, t))
            .collect();
        rows.sort_by(|a, b| b.2.total_cmp(&a.2));
        rows
    }

    /// Whether steps must launch eagerly, node by node.
    pub(super) fn eager_only(&self) -> bool {
        self.sync_each_node || self.profile.is_some()
    }
}

/// Where the host's time goes in replayed steps (seconds in all over `steps`): from entering a
/// step until its graphs are launched (the step's small uploads and the launch calls), then
/// waiting for the device, then downloading the logits. What a caller measures beyond their sum
/// is outside the executor (the session, the caller's own work).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostTimes {
    pub steps: usize,
    pub submit: f64,
    /// Of `submit`, the host steps of nodes that start on the host (the PLE table's ids and
    /// gather and their upload, where the table is kept on the host).
    pub host_steps: f64,
    pub wait: f64,
    pub download: f64,
}

/// With the step timeline on (`Gpu::enable_trace`): the labels of each captured graph's
/// launches, in order, and, while tracing, the replays traced (all of one step shape).
#[derive(Debug, Clone, Default)]
pub struct TraceLog {
    pub(super) labels: HashMap<GraphKey, Vec<String>>,
    pub(super) traced: Option<(Option<GraphKey>, usize)>,
}
