//! The context of one launch: what a launcher may use besides the device. The executor makes one
//! per node, holding that node's planned output slots, the kernels its program names, which of
//! its inputs are ready before the node ahead of it finishes, the step's scratch buffer and
//! whether launches overlap (programmatic dependent launch). Tests and benches make plain ones
//! ([`Launch::new`]). The device itself ([`Gpu`]) keeps nothing of a launch, so two launches
//! never see each other's queues.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ops::Deref;

use cudarc::driver::{sys, CudaFunction, DeviceRepr};

use super::device::{Buf, Gpu, ReadyInputs};
use super::error::CudaError;
use super::launcher::KernelLaunch;

/// An arena slot: its device address and its size in bytes.
pub type Slot = (sys::CUdeviceptr, usize);

/// One launch's context; derefs to the device for its stream, its info and its allocations.
pub struct Launch<'g> {
    gpu: &'g Gpu,
    /// The node being launched (timeline labels and errors); empty for a plain launch.
    node: &'g str,
    /// Arena slots for the node's outputs, in output order: [`Launch::output`] hands them out.
    slots: RefCell<VecDeque<Slot>>,
    /// The node's kernels and which of them were launched; `None`: any kernel may be launched.
    expected: Option<Expected<'g>>,
    /// Which of the node's inputs may be read before the wait ([`Launch::take_ready_inputs`]).
    ready: Cell<ReadyInputs>,
    /// Whether launches carry the programmatic-dependent-launch attribute (`launcher`).
    programmatic: bool,
    scratch: RefCell<Scratch>,
}

/// A node's kernels (`Node::kernels`) and which of them its launcher has asked for.
struct Expected<'g> {
    named: &'g [String],
    used: RefCell<Vec<bool>>,
}

/// Kernel temporaries: bump-allocated from the step's scratch buffer when one is given (a
/// temporary never outlives its node's launch, and the stream orders the next node's use after
/// this one's kernels), else allocated on the stream. `asked` measures what the launch needs, so
/// that the executor can size the buffer after a step's first (eager) run.
#[derive(Default)]
struct Scratch {
    pool: Option<Slot>,
    used: usize,
    asked: usize,
    peak: usize,
}

/// What a finished launch leaves for the executor to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// Planned output slots no output took (0 when every planned output was made).
    pub untaken_slots: usize,
    /// The most scratch the launch held at once, in bytes.
    pub scratch_peak: usize,
}

impl<'g> Deref for Launch<'g> {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        self.gpu
    }
}

impl<'g> Launch<'g> {
    /// A plain launch: outputs freshly allocated, any kernel, every kernel waiting for the one
    /// ahead of it, temporaries allocated on the stream.
    pub fn new(gpu: &'g Gpu) -> Launch<'g> {
        Launch {
            gpu,
            node: "",
            slots: RefCell::new(VecDeque::new()),
            expected: None,
            ready: Cell::new(ReadyInputs::NONE),
            programmatic: false,
            scratch: RefCell::new(Scratch::default()),
        }
    }

    /// The launch of `node`, which may launch only `kernels`, and each of them.
    pub fn for_node(gpu: &'g Gpu, node: &'g str, kernels: &'g [String]) -> Launch<'g> {
        Launch {
            node,
            expected: Some(Expected {
                named: kernels,
                used: RefCell::new(vec![false; kernels.len()]),
            }),
            ..Launch::new(gpu)
        }
    }

    /// A plain launch whose kernels the timeline labels as `node`'s.
    pub fn labelled(gpu: &'g Gpu, node: &'g str) -> Launch<'g> {
        Launch {
            node,
            ..Launch::new(gpu)
        }
    }

    /// The outputs go to these arena slots, in order.
    pub fn with_slots(self, slots: &[Slot]) -> Launch<'g> {
        self.set_slots(slots);
        self
    }

    /// Temporaries come from this buffer while it has room.
    pub fn with_scratch_pool(self, pool: Option<Slot>) -> Launch<'g> {
        self.scratch.borrow_mut().pool = pool;
        self
    }

    /// These inputs are complete before the node ahead has finished.
    pub fn with_ready_inputs(self, ready: ReadyInputs) -> Launch<'g> {
        self.ready.set(ready);
        self
    }

    /// Launches may start before the kernel ahead of them has finished (programmatic dependent
    /// launch). Needs sm_90: asked on an older device, it stays off.
    pub fn with_programmatic_launch(mut self, on: bool) -> Launch<'g> {
        self.programmatic = on && self.gpu.info.compute_capability.0 >= 9;
        self
    }

    pub fn programmatic_launch(&self) -> bool {
        self.programmatic
    }

    /// Replaces the output slots still to be handed out; returns how many were left untaken.
    pub fn set_slots(&self, slots: &[Slot]) -> usize {
        let mut q = self.slots.borrow_mut();
        let left = q.len();
        q.clear();
        q.extend(slots.iter().copied());
        left
    }

    /// Sets which inputs the next kernel may read before its wait.
    pub fn set_ready_inputs(&self, ready: ReadyInputs) {
        self.ready.set(ready);
    }

    /// For the first kernel a node launches: which of the node's inputs it may read before its
    /// wait (`wait_for_producers_unless` in kernels/common.cuh). Taking it clears it, so a node's
    /// later kernels (which read the first one's results) always wait first.
    pub fn take_ready_inputs(&self) -> ReadyInputs {
        self.ready.replace(ReadyInputs::NONE)
    }

    /// Marks `kernel` as launched, refusing one the node does not name.
    pub fn note_kernel(&self, kernel: &str) -> Result<(), CudaError> {
        let Some(e) = &self.expected else {
            return Ok(());
        };
        // A kernel named n times (a group's parts) must be launched n times.
        let mut used = e.used.borrow_mut();
        let named = |i: &usize| e.named[*i] == kernel;
        let first_unused = (0..e.named.len()).filter(named).find(|&i| !used[i]);
        match first_unused.or_else(|| (0..e.named.len()).find(named)) {
            Some(i) => {
                used[i] = true;
                Ok(())
            }
            None => Err(CudaError::Unnamed {
                node: self.node.to_string(),
                kernel: kernel.to_string(),
                named: e.named.join(", "),
            }),
        }
    }

    /// Kernel `name` of `kernels/<file>` (loaded on first use), if this launch may launch it.
    pub fn function(&self, file: &str, name: &str) -> Result<CudaFunction, CudaError> {
        self.note_kernel(name)?;
        self.gpu.function(file, name)
    }

    /// A launch of kernel `f` on the device's stream (arguments with `.arg`, then `.launch`).
    pub fn launch_builder<'a>(&'a self, f: &'a CudaFunction) -> KernelLaunch<'a> {
        KernelLaunch::new(self.gpu, f, self.programmatic, self.node)
    }

    /// An output of `len` elements: the next planned slot (its size must be the planned one),
    /// else a temporary. Not zeroed: every kernel writes all of its output.
    pub fn output<T: DeviceRepr>(&self, len: usize, what: &str) -> Result<Buf<T>, CudaError> {
        let slot = self.slots.borrow_mut().pop_front();
        let bytes = len * std::mem::size_of::<T>();
        match slot {
            Some((ptr, planned)) if planned == bytes => {
                // SAFETY: the executor's arena holds `planned` bytes at `ptr` for the whole step.
                Ok(unsafe { Buf::aliased(&self.gpu.stream, ptr, len) })
            }
            Some((_, planned)) => Err(CudaError::Shape {
                kernel: what.to_string(),
                msg: format!(
                    "the arena plan has {planned} bytes for this output, the kernel writes {bytes}"
                ),
            }),
            None => self.scratch(len, what),
        }
    }

    /// A temporary of `len` elements: from the scratch buffer while it has room, else allocated
    /// on the stream (inside a captured graph, a graph allocation). Not zeroed.
    pub fn scratch<T: DeviceRepr>(&self, len: usize, what: &str) -> Result<Buf<T>, CudaError> {
        let bytes = (len.max(1) * std::mem::size_of::<T>()).next_multiple_of(256);
        {
            let mut sc = self.scratch.borrow_mut();
            sc.asked += bytes;
            sc.peak = sc.peak.max(sc.asked);
            if let Some((base, size)) = sc.pool {
                if sc.used + bytes <= size {
                    let ptr = base + sc.used as u64;
                    sc.used += bytes;
                    // SAFETY: the executor keeps the pool allocated while its step's graphs
                    // exist, and nothing else uses these bytes during this launch.
                    return Ok(unsafe { Buf::aliased(&self.gpu.stream, ptr, len) });
                }
            }
        }
        // SAFETY: the memory is uninitialised; every caller's kernel writes what it later reads.
        unsafe { self.gpu.stream.alloc::<T>(len.max(1)) }
            .map(|s| Buf::owned(s))
            .map_err(|e| {
                CudaError::driver(
                    format!("allocating {what}"),
                    Some(len * std::mem::size_of::<T>()),
                    e,
                )
            })
    }

    /// Temporaries come from this buffer from now on (or are allocated, with `None`).
    pub fn set_scratch_pool(&self, pool: Option<Slot>) {
        *self.scratch.borrow_mut() = Scratch {
            pool,
            ..Scratch::default()
        };
    }

    /// Starts the temporaries over at the beginning of the scratch buffer (for a bench that
    /// launches one shape many times in one context; the stream orders the reuse).
    pub fn reset_scratch(&self) {
        let mut sc = self.scratch.borrow_mut();
        sc.used = 0;
        sc.asked = 0;
    }

    /// Runs `f`, the launches of a node's intermediate value (a fallback that makes the node's
    /// output in several launches), with the output slots held back: what `f` makes comes from
    /// scratch, and the slots go to the launches after it, which make the node's outputs.
    pub fn intermediate<R>(&self, f: impl FnOnce() -> R) -> R {
        let held = std::mem::take(&mut *self.slots.borrow_mut());
        let result = f();
        *self.slots.borrow_mut() = held;
        result
    }

    /// Ends the launch: an error if the node named a kernel its launcher did not launch.
    pub fn finish(self) -> Result<Finished, CudaError> {
        let finished = Finished {
            untaken_slots: self.slots.borrow().len(),
            scratch_peak: self.scratch.borrow().peak,
        };
        if let Some(e) = &self.expected {
            if let Some(i) = e.used.borrow().iter().position(|u| !u) {
                return Err(CudaError::Unlaunched {
                    node: self.node.to_string(),
                    kernel: e.named[i].clone(),
                });
            }
        }
        Ok(finished)
    }
}
