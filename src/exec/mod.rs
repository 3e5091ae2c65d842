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

/// The values a step is given beside its tokens, by import name: `[tokens, width]` f32 each
/// (`Program::imports`).
pub type Imports<'a> = &'a [(&'a str, &'a [f32])];

/// What [`Executor::step_with`] gives back: the logits `[rows, vocab]` and the program's exports
/// (`Program::exports`, every row of each), in the program's order.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    pub logits: Vec<f32>,
    pub rows: usize,
    pub exports: Vec<(String, Vec<f32>)>,
}

/// What [`Executor::step_with_greedy`] gives back: each logits row's greedy choice (or its
/// first NaN), and the program's exports.
#[derive(Debug, Clone, PartialEq)]
pub struct GreedyRows {
    pub chosen: Vec<std::result::Result<u32, BadLogit>>,
    pub exports: Vec<(String, Vec<f32>)>,
}

impl GreedyRows {
    pub fn export(&self, name: &str) -> Option<&[f32]> {
        export(&self.exports, name)
    }
}

impl StepOutput {
    /// The export `name`.
    pub fn export(&self, name: &str) -> Option<&[f32]> {
        export(&self.exports, name)
    }
}

/// The export `name` of a step's `exports`.
pub fn export<'e>(exports: &'e [(String, Vec<f32>)], name: &str) -> Option<&'e [f32]> {
    exports
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

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

    /// As [`Executor::step`] for a program with imports and exports (the speculative trunk's
    /// steps and the MTP draft's): `imports` by name, the exports returned. This default runs
    /// programs without either.
    fn step_with(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: Imports,
    ) -> Result<StepOutput> {
        if !program.imports.is_empty() || !program.exports.is_empty() || !imports.is_empty() {
            return Err(crate::error::Error::Input(
                "this executor runs no program with imports or exports (speculative decoding \
                 runs on the CPU executor only so far)"
                    .into(),
            ));
        }
        let (logits, rows) = self.step(program, tokens)?;
        Ok(StepOutput {
            logits,
            rows,
            exports: Vec::new(),
        })
    }

    /// As [`Executor::step_with`], but returns each logits row's greedy choice (as
    /// [`Executor::step_greedy`] makes it for the last row) instead of the logits. This
    /// default chooses on the host; an executor may choose where the logits are.
    fn step_with_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: Imports,
    ) -> Result<GreedyRows> {
        let out = self.step_with(program, tokens, imports)?;
        let vocab = out.logits.len() / out.rows.max(1);
        let chosen = out
            .logits
            .chunks(vocab.max(1))
            .map(|row| check_logits(row, false).map(|()| argmax(row)))
            .collect();
        Ok(GreedyRows {
            chosen,
            exports: out.exports,
        })
    }

    /// Marks the current state as the one [`Executor::rewind`] returns to (a speculative round's
    /// start), forgetting any earlier mark.
    fn checkpoint(&mut self) -> Result<()> {
        Err(crate::error::Error::Input(
            "this executor keeps no checkpoints (speculative decoding runs on the CPU executor \
             only so far)"
                .into(),
        ))
    }

    /// Returns the state towards `position`, between the last checkpoint's position and the
    /// current one, and says where it got: `position` itself, or the checkpoint's where the
    /// executor keeps no per-row states (the caller then reruns the tokens between).
    fn rewind(&mut self, position: usize) -> Result<usize> {
        let _ = position;
        self.checkpoint().map(|()| self.position())
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
    fn step_with(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: Imports,
    ) -> Result<StepOutput> {
        (**self).step_with(program, tokens, imports)
    }
    fn step_with_greedy(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: Imports,
    ) -> Result<GreedyRows> {
        (**self).step_with_greedy(program, tokens, imports)
    }
    fn checkpoint(&mut self) -> Result<()> {
        (**self).checkpoint()
    }
    fn rewind(&mut self, position: usize) -> Result<usize> {
        (**self).rewind(position)
    }
    fn graph_replays(&self) -> usize {
        (**self).graph_replays()
    }
}
