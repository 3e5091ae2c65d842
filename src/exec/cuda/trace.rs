//! The timeline of replayed steps, kernel by kernel, inside the CUDA graph (`graphrun bench
//! --trace`): what node-by-node profiles cannot show (they time kernels back to back, with cold
//! caches and no overlap) and what launching a kind twice shows only with its weights hot in L2.
//!
//! Kernels built with `-DGRAPHRUN_TRACE` (`compile::TRACE_OPTION`) have block (0,0,0) record,
//! once per launch, its grid id and two `%globaltimer` readings: when it reached
//! `wait_for_producers()` and when that returned (kernels/common.cuh). In a chain of dependent
//! launches a kernel's wait returns once the kernel before it has finished, so the time from one
//! kernel's release to the next one's is what that kernel costs the step: its work after its
//! wait plus the boundary. The host keeps the order of the launches a graph captured, labelled
//! by node and kernel; a replay's records, in grid-id order, are those launches in that order.

use cudarc::driver::CudaSlice;

/// Words before the first record: [0] the records written (the kernels' counter), [1] how many
/// fit (the kernels write no record past it).
pub const HEADER_WORDS: usize = 8;
pub const RECORD_WORDS: usize = 4;

/// The device buffer the traced kernels write into and the labels of the launches being
/// captured.
pub struct Tracer {
    pub buffer: CudaSlice<u64>,
    pub capacity: usize,
    /// Labels ("node kernel") of the launches since [`Tracer::log`] was started, when it was.
    pub log: Option<Vec<String>>,
    /// The node being launched (the executor sets it).
    pub node: String,
}

/// One launch's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub grid: u64,
    /// `%globaltimer` (ns) when block 0 reached its wait, and when the wait returned.
    pub arrived: u64,
    pub released: u64,
    pub sm: u32,
    pub blocks: u32,
}

/// The records in a downloaded buffer (as many as were written and fit).
pub fn parse(words: &[u64]) -> Vec<Record> {
    let written = words.first().copied().unwrap_or(0) as usize;
    let fit = words.len().saturating_sub(HEADER_WORDS) / RECORD_WORDS;
    (0..written.min(fit))
        .map(|i| {
            let r = &words[HEADER_WORDS + RECORD_WORDS * i..HEADER_WORDS + RECORD_WORDS * (i + 1)];
            Record {
                grid: r[0],
                arrived: r[1],
                released: r[2],
                sm: (r[3] >> 32) as u32,
                blocks: r[3] as u32,
            }
        })
        .collect()
}

/// One launch of the replayed step, averaged over the replays.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LaunchTime {
    pub label: String,
    pub blocks: u32,
    /// From this kernel's release to the next one's, µs: what it costs the step (`None` for the
    /// step's last launch, which no release follows).
    pub us: Option<f64>,
    /// How long block 0 waited at its wait, µs: how early the kernel was resident.
    pub waited_us: f64,
}

/// The launches of `replays` replays of a step whose captured launches are `labels`, from
/// their records. An error says why the records do not line up with the labels (a kernel whose
/// block 0 leaves before its wait, a buffer too small, records out of order).
pub fn timeline(
    records: &[Record],
    labels: &[String],
    replays: usize,
) -> Result<Vec<LaunchTime>, String> {
    let n = labels.len();
    if n == 0 || replays == 0 {
        return Err("no traced launches".into());
    }
    if records.len() != n * replays {
        return Err(format!(
            "{} records for {replays} replays of {n} launches: a kernel whose block 0 returns \
             before its wait records nothing, and the buffer holds a limited number",
            records.len()
        ));
    }
    let mut sorted = records.to_vec();
    sorted.sort_by_key(|r| r.grid);
    let mut out: Vec<LaunchTime> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| LaunchTime {
            label: l.clone(),
            blocks: sorted[i].blocks,
            us: (i + 1 < n).then_some(0.0),
            waited_us: 0.0,
        })
        .collect();
    for replay in sorted.chunks(n) {
        for (i, r) in replay.iter().enumerate() {
            if let Some(next) = replay.get(i + 1) {
                if next.released < r.released {
                    return Err(format!(
                        "launch {} ({}) was released before launch {i} ({}): the records are \
                         not one chain",
                        i + 1,
                        labels[i + 1],
                        labels[i]
                    ));
                }
                if let Some(us) = out[i].us.as_mut() {
                    *us += (next.released - r.released) as f64 / 1e3 / replays as f64;
                }
            }
            out[i].waited_us += r.released.saturating_sub(r.arrived) as f64 / 1e3 / replays as f64;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(records: &[(u64, u64, u64)]) -> Vec<u64> {
        let mut w = vec![0u64; HEADER_WORDS];
        w[0] = records.len() as u64;
        w[1] = records.len() as u64;
        for &(g, a, r) in records {
            w.extend([g, a, r, (3u64 << 32) | 7]);
        }
        w
    }

    #[test]
    fn a_launch_costs_the_time_to_the_next_release_averaged_over_replays() {
        // Two replays of three launches, recorded out of order (the counter is shared).
        let w = words(&[
            (12, 1990, 2000),
            (10, 0, 100),
            (11, 50, 400),
            (13, 2000, 2200),
            (14, 2100, 2700),
            (15, 2500, 3100),
        ]);
        let records = parse(&w);
        assert_eq!(records.len(), 6);
        assert_eq!((records[0].sm, records[0].blocks), (3, 7));
        let labels: Vec<String> = ["a k1", "b k2", "c k3"].map(String::from).to_vec();
        let t = timeline(&records, &labels, 2).unwrap();
        // a: 300 ns then 500 ns; b: 1600 then 400; c: the last.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(t[0].us.unwrap(), 0.4), "{t:?}");
        assert!(close(t[1].us.unwrap(), 1.0), "{t:?}");
        assert_eq!(t[2].us, None);
        assert!(close(t[0].waited_us, 0.15), "{t:?}");
        assert_eq!(t[2].label, "c k3");
    }

    #[test]
    fn records_that_do_not_line_up_are_an_error() {
        let labels: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let missing = parse(&words(&[(1, 0, 10), (2, 5, 20), (3, 20, 30)]));
        assert!(timeline(&missing, &labels, 2)
            .unwrap_err()
            .contains("3 records"));
        let backwards = parse(&words(&[(1, 0, 50), (2, 5, 20)]));
        assert!(timeline(&backwards, &labels, 1)
            .unwrap_err()
            .contains("not one chain"));
        // A buffer that filled up: the counter ran past what fits.
        let mut full = words(&[(1, 0, 10)]);
        full[0] = 5;
        assert_eq!(parse(&full).len(), 1);
    }
}
