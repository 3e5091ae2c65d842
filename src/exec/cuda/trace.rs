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
    /// The header's word 1 holds how many records fit (the kernels read it).
    pub buffer: CudaSlice<u64>,
    /// Labels ("node kernel") of the launches since [`Tracer::log`] was started, when it was.
    pub log: Option<Vec<String>>,
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
    /// step's last launch, which no release follows). A next release earlier than this one
    /// (see [`Timeline::out_of_order`]) counts as 0.
    pub us: Option<f64>,
    /// How long block 0 waited at its wait, µs: how early the kernel was resident.
    pub waited_us: f64,
}

/// One launch of the first traced replay, as recorded (ns from that replay's first release).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LaunchRecord {
    pub label: String,
    pub grid: u64,
    pub arrived_ns: i64,
    pub released_ns: i64,
    pub sm: u32,
    pub blocks: u32,
}

/// The traced replays of one step shape.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Timeline {
    pub replays: usize,
    pub launches: Vec<LaunchTime>,
    /// Pairs of consecutive launches (over all replays) whose second was released before the
    /// first: block 0 of the first reached its wait late (after work before its wait, or
    /// scheduled after other blocks), so its release is not the step's; the pair's first
    /// launch then counts 0 and the next one the rest.
    pub out_of_order: usize,
    pub first_replay: Vec<LaunchRecord>,
}

/// The records in replays, each in launch order. A graph's kernel node keeps its grid id
/// from replay to replay (measured on the H200: one id per node, assigned in the order the
/// nodes were captured), so when there are `n` ids with `replays` records each, launch `i` is
/// the `i`-th smallest id and its records, in time order, are replays 0, 1, ...; otherwise the
/// records in release order are cut into replays of `n`.
fn by_replay(records: &[Record], n: usize, replays: usize) -> Vec<Vec<Record>> {
    let mut sorted = records.to_vec();
    sorted.sort_by_key(|r| (r.grid, r.released));
    let stable_ids = sorted
        .chunks(replays)
        .all(|c| c.iter().all(|r| r.grid == c[0].grid))
        && sorted.chunks(replays).count() == n
        && sorted
            .chunks(replays)
            .zip(sorted.chunks(replays).skip(1))
            .all(|(a, b)| a[0].grid != b[0].grid);
    if stable_ids {
        (0..replays)
            .map(|r| (0..n).map(|i| sorted[i * replays + r]).collect())
            .collect()
    } else {
        sorted.sort_by_key(|r| (r.released, r.grid));
        sorted.chunks(n).map(|c| c.to_vec()).collect()
    }
}

/// The launches of `replays` replays of a step whose captured launches are `labels`, from
/// their records. An error says why the records do not line up with the labels (a kernel whose
/// block 0 leaves before its wait, a buffer too small).
pub fn timeline(records: &[Record], labels: &[String], replays: usize) -> Result<Timeline, String> {
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
    let replay_records = by_replay(records, n, replays);
    let sorted: Vec<Record> = replay_records.concat();
    let mut t = Timeline {
        replays,
        launches: labels
            .iter()
            .enumerate()
            .map(|(i, l)| LaunchTime {
                label: l.clone(),
                blocks: sorted[i].blocks,
                us: (i + 1 < n).then_some(0.0),
                waited_us: 0.0,
            })
            .collect(),
        out_of_order: 0,
        first_replay: Vec::new(),
    };
    let t0 = sorted[0].released as i64;
    t.first_replay = sorted[..n]
        .iter()
        .zip(labels)
        .map(|(r, l)| LaunchRecord {
            label: l.clone(),
            grid: r.grid,
            arrived_ns: r.arrived as i64 - t0,
            released_ns: r.released as i64 - t0,
            sm: r.sm,
            blocks: r.blocks,
        })
        .collect();
    for replay in &replay_records {
        for (i, r) in replay.iter().enumerate() {
            if let Some(next) = replay.get(i + 1) {
                if next.released < r.released {
                    t.out_of_order += 1;
                }
                if let Some(us) = t.launches[i].us.as_mut() {
                    *us += next.released.saturating_sub(r.released) as f64 / 1e3 / replays as f64;
                }
            }
            t.launches[i].waited_us +=
                r.released.saturating_sub(r.arrived) as f64 / 1e3 / replays as f64;
        }
    }
    Ok(t)
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
        let timeline = timeline(&records, &labels, 2).unwrap();
        assert_eq!(timeline.out_of_order, 0);
        assert_eq!(timeline.first_replay[1].released_ns, 300);
        let t = timeline.launches;
        // a: 300 ns then 500 ns; b: 1600 then 400; c: the last.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(t[0].us.unwrap(), 0.4), "{t:?}");
        assert!(close(t[1].us.unwrap(), 1.0), "{t:?}");
        assert_eq!(t[2].us, None);
        assert!(close(t[0].waited_us, 0.15), "{t:?}");
        assert_eq!(t[2].label, "c k3");
    }

    #[test]
    fn a_graph_node_keeps_its_grid_id_from_replay_to_replay() {
        // Three launches (ids 7, 8, 9) replayed twice; block 0 of launch 1 was late in the
        // second replay (released after launch 2).
        let w = words(&[
            (9, 150, 300),
            (7, 0, 100),
            (8, 50, 200),
            (7, 1000, 1100),
            (8, 1050, 1400),
            (9, 1150, 1300),
        ]);
        let labels: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let t = timeline(&parse(&w), &labels, 2).unwrap();
        assert_eq!(t.out_of_order, 1);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // a: 100 then 300 ns; b: 100 then 0 (late).
        assert!(close(t.launches[0].us.unwrap(), 0.2), "{t:?}");
        assert!(close(t.launches[1].us.unwrap(), 0.05), "{t:?}");
        assert_eq!(t.first_replay[2].grid, 9);
    }

    #[test]
    fn records_that_do_not_line_up_are_an_error_and_late_releases_are_counted() {
        let labels: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let missing = parse(&words(&[(1, 0, 10), (2, 5, 20), (3, 20, 30)]));
        assert!(timeline(&missing, &labels, 2)
            .unwrap_err()
            .contains("3 records"));
        let backwards = parse(&words(&[(1, 0, 50), (2, 5, 20)]));
        let t = timeline(&backwards, &labels, 1).unwrap();
        assert_eq!((t.out_of_order, t.launches[0].us), (1, Some(0.0)));
        // A buffer that filled up: the counter ran past what fits.
        let mut full = words(&[(1, 0, 10)]);
        full[0] = 5;
        assert_eq!(parse(&full).len(), 1);
    }
}
