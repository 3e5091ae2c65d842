//! The device memory plan: before anything is placed on a device, what the model will take there
//! (its weights as the device keeps them, one sequence's caches for the context, the workspace of
//! a decode step and of a prefill chunk) against what the device has free, and where the PLE
//! n-gram table goes: on the device when everything fits, else on the host. A model that does
//! not fit is refused here with the figures, not by an allocation failing halfway through a load.

use crate::error::{Error, Result};
use crate::registry::Placement;

/// Device memory kept back from the plan: the kernels' modules, the allocator's rounding and the
/// scratch of kernels the plan does not count (all far smaller than this).
pub const RESERVE_BYTES: usize = 1 << 30;

/// What a model takes on one device, by part, and where its n-gram table goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryPlan {
    /// The weights as the device keeps them, the n-gram table excluded.
    pub weights: usize,
    /// What the n-gram table takes where it is kept (0 for a model without one).
    pub table: usize,
    pub ple_table: Placement,
    /// One sequence's caches and states for `capacity` tokens.
    pub caches: usize,
    pub capacity: usize,
    /// The step arenas and scratch of decode and of prefill chunks.
    pub workspace: usize,
    /// What the device had free when planned.
    pub free: usize,
}

/// The figures a plan is made from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Needs {
    pub weights: usize,
    pub table: usize,
    pub caches: usize,
    pub capacity: usize,
    pub workspace: usize,
}

impl MemoryPlan {
    /// Places the n-gram table as `choice` says (`None`: on the device when everything fits
    /// there beside [`RESERVE_BYTES`], else on the host), refusing a plan that does not fit.
    pub fn make(needs: Needs, free: usize, choice: Option<Placement>) -> Result<MemoryPlan> {
        let plan = |ple_table| MemoryPlan {
            weights: needs.weights,
            table: needs.table,
            ple_table,
            caches: needs.caches,
            capacity: needs.capacity,
            workspace: needs.workspace,
            free,
        };
        let (on_device, on_host) = (plan(Placement::Device), plan(Placement::Host));
        let chosen = match choice {
            Some(Placement::Device) => on_device,
            Some(Placement::Host) => on_host,
            None if on_device.fits() || needs.table == 0 => on_device,
            None => on_host,
        };
        if chosen.fits() {
            return Ok(chosen);
        }
        let hint = if chosen.ple_table == Placement::Device && needs.table > 0 && on_host.fits() {
            "; --ple-table host keeps the n-gram table in host memory, which fits".to_string()
        } else {
            format!(
                "; a smaller --context takes less (the caches are {:.2} GB for {} tokens)",
                gb(needs.caches),
                needs.capacity
            )
        };
        Err(Error::Input(format!(
            "the model does not fit the device: {chosen}{hint}"
        )))
    }

    /// Bytes the plan puts on the device.
    pub fn device_bytes(&self) -> usize {
        let table = match self.ple_table {
            Placement::Device => self.table,
            Placement::Host => 0,
        };
        self.weights + table + self.caches + self.workspace
    }

    pub fn fits(&self) -> bool {
        self.device_bytes() + RESERVE_BYTES <= self.free
    }
}

fn gb(bytes: usize) -> f64 {
    bytes as f64 / 1e9
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "weights {:.2} GB", gb(self.weights))?;
        if self.table > 0 {
            write!(
                f,
                ", n-gram table {:.2} GB on the {}",
                gb(self.table),
                self.ple_table
            )?;
        }
        write!(
            f,
            ", caches {:.2} GB for {} tokens, workspace {:.2} GB: {:.2} GB on the device \
             (+{:.2} GB kept back) of {:.2} GB free",
            gb(self.caches),
            self.capacity,
            gb(self.workspace),
            gb(self.device_bytes()),
            gb(RESERVE_BYTES),
            gb(self.free)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: usize = 1_000_000_000;

    fn needs(table: usize) -> Needs {
        Needs {
            weights: 78 * GB,
            table,
            caches: 2 * GB,
            capacity: 8192,
            workspace: GB,
        }
    }

    #[test]
    fn the_table_goes_on_the_device_only_when_everything_fits_there() {
        let free = 141 * GB;
        let small = MemoryPlan::make(needs(GB), free, None).unwrap();
        assert_eq!(small.ple_table, Placement::Device);
        assert_eq!(small.device_bytes(), 82 * GB);
        let release = MemoryPlan::make(needs(102 * GB), free, None).unwrap();
        assert_eq!(release.ple_table, Placement::Host);
        assert_eq!(release.device_bytes(), 81 * GB);
        let text = release.to_string();
        assert!(
            text.contains("n-gram table 102.00 GB on the host"),
            "{text}"
        );
        // Asked for, the host keeps even a table that would fit.
        let host = MemoryPlan::make(needs(GB), free, Some(Placement::Host)).unwrap();
        assert_eq!(host.ple_table, Placement::Host);
    }

    #[test]
    fn a_plan_that_does_not_fit_is_refused_with_the_figures_and_a_way_out() {
        let free = 141 * GB;
        let err = MemoryPlan::make(needs(102 * GB), free, Some(Placement::Device))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not fit")
                && err.contains("n-gram table 102.00 GB on the device")
                && err.contains("of 141.00 GB free")
                && err.contains("--ple-table host"),
            "{err}"
        );
        let err = MemoryPlan::make(needs(0), 80 * GB, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a smaller --context"), "{err}");
        // Exactly the reserve short: refused; at the reserve: placed.
        let need = needs(0);
        let total = need.weights + need.caches + need.workspace + RESERVE_BYTES;
        assert!(MemoryPlan::make(need, total - 1, None).is_err());
        assert!(MemoryPlan::make(need, total, None).is_ok());
    }
}
