//! A sequence on the CPU reference executor, behind the runtime's [`Executor`] interface.

use super::cpu;
use super::state::SessionState;
use super::Executor;
use crate::error::Result;
use crate::ir::Program;
use crate::weights::Weights;

/// One sequence on the CPU: the model's weights and the sequence's state.
pub struct CpuExecutor<'w> {
    weights: &'w Weights,
    state: SessionState,
}

impl<'w> CpuExecutor<'w> {
    pub fn new(weights: &'w Weights) -> Self {
        CpuExecutor {
            weights,
            state: SessionState::default(),
        }
    }

    /// The sequence's state.
    pub fn state(&self) -> &SessionState {
        &self.state
    }
}

impl Executor for CpuExecutor<'_> {
    fn position(&self) -> usize {
        self.state.position
    }

    fn capacity(&self) -> Option<usize> {
        None
    }

    fn step(&mut self, program: &Program, tokens: &[i64]) -> Result<(Vec<f32>, usize)> {
        Ok(cpu::run(program, self.weights, &mut self.state, tokens)?)
    }
}
