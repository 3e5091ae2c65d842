//! A sequence on the CPU reference executor, behind the runtime's [`Executor`] interface.

use super::cpu;
use super::state::SessionState;
use super::{Executor, Imports, StepOutput};
use crate::error::{Error, Result};
use crate::ir::Program;
use crate::weights::Weights;

/// One sequence on the CPU: the model's weights and the sequence's state.
pub struct CpuExecutor<'w> {
    weights: &'w Weights,
    state: SessionState,
    /// The state at the last checkpoint (`Executor::checkpoint`): a rewind restores it whole,
    /// since the CPU reference computes each row alike whatever the step's length, rerunning
    /// the rows after it gives the state a rewind to any later position would.
    checkpoint: Option<SessionState>,
}

impl<'w> CpuExecutor<'w> {
    pub fn new(weights: &'w Weights) -> Self {
        CpuExecutor {
            weights,
            state: SessionState::default(),
            checkpoint: None,
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

    fn step_with(
        &mut self,
        program: &Program,
        tokens: &[i64],
        imports: Imports,
    ) -> Result<StepOutput> {
        Ok(cpu::run_step(
            program,
            self.weights,
            &mut self.state,
            tokens,
            imports,
        )?)
    }

    fn checkpoint(&mut self) -> Result<()> {
        self.checkpoint = Some(self.state.clone());
        Ok(())
    }

    fn rewind(&mut self, position: usize) -> Result<usize> {
        let mark = self.checkpoint.as_ref().map(|c| c.position);
        match mark {
            Some(m) if (m..=self.state.position).contains(&position) => {
                if position != self.state.position {
                    self.state = self.checkpoint.clone().expect("checked above");
                }
                Ok(self.state.position)
            }
            _ => Err(Error::Input(format!(
                "rewind to position {position}: the checkpoint is at {}, the sequence at {}",
                mark.map_or("none".to_string(), |m| m.to_string()),
                self.state.position
            ))),
        }
    }
}
