//! Executors run lowered programs. `cpu` is the reference: plain f32 math from `crate::ops`,
//! parallel across cores where it pays. `cuda` runs the same programs on NVIDIA GPUs. Both
//! implement [`Executor`], the one interface the runtime drives a sequence through.

pub mod cpu;
mod cpu_executor;
pub mod cuda;
pub mod state;

pub use cpu_executor::CpuExecutor;
pub use state::SessionState;

use crate::error::Result;
use crate::ir::Program;
use crate::runtime::sampling::{argmax, check_logits, BadLogit};

/// One sequence on an executor: it runs the steps of lowered programs over the state it keeps
/// between them (caches, recurrent states, the position). `runtime::Session` drives a sequence
/// only through this trait, so another way of running one (the ranks of a tensor-parallel
/// group, a slot of a batched decode) is another implementation, not a branch in the session.
///
/// The caller checks the tokens (ids in the vocabulary, the context within
/// [`Executor::capacity`]) before a step; an error is then the executor's own failure.
pub trait Executor {
    /// Tokens processed so far (the next token's position).
    fn position(&self) -> usize;

    /// The most tokens the state holds where it is preallocated; `None` where it grows.
    fn capacity(&self) -> Option<usize>;

    /// Runs one step of `program` over `tokens`, advancing the position by their count; returns
    /// the logits `[rows, vocab]` and their row count.
    fn step(&mut self, program: &Program, tokens: &[i64]) -> Result<(Vec<f32>, usize)>;

    /// As [`Executor::step`], but returns only the greedy choice for the last row: the first
    /// index of its largest logit (`sampling::argmax`), or its first NaN. This default chooses
    /// from the logits on the host; an executor may choose where they are.
    fn step_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
    ) -> Result<std::result::Result<u32, BadLogit>> {
        let (data, rows) = self.step(program, tokens)?;
        let row = &data[data.len() - data.len() / rows.max(1)..];
        Ok(check_logits(row, false).map(|()| argmax(row)))
    }

    /// Steps that replayed captured launches (CUDA graphs); 0 where nothing is captured.
    fn graph_replays(&self) -> usize {
        0
    }
}

// Forwards every method, so that a boxed executor keeps its own `step_greedy`.
impl<E: Executor + ?Sized> Executor for Box<E> {
    fn position(&self) -> usize {
        (**self).position()
    }
    fn capacity(&self) -> Option<usize> {
        (**self).capacity()
    }
    fn step(&mut self, program: &Program, tokens: &[i64]) -> Result<(Vec<f32>, usize)> {
        (**self).step(program, tokens)
    }
    fn step_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
    ) -> Result<std::result::Result<u32, BadLogit>> {
        (**self).step_greedy(program, tokens)
    }
    fn graph_replays(&self) -> usize {
        (**self).graph_replays()
    }
}
