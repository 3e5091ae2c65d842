//! Row gathers: the token embedding and the PLE n-gram table lookup.

use super::elementwise;

/// For each id of each row of `ids [rows, n]`, the table row `[d]`, concatenated → `[rows, n*d]`.
/// Ids were range-checked by the caller (tokens) or are in range by construction (n-gram ids).
pub fn gather(ids: &[i64], table: &[f32], d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(ids.len() * d);
    for &id in ids {
        let start = id as usize * d;
        out.extend_from_slice(&table[start..start + d]);
    }
    out
}

/// `gather` then `elementwise::repeat_streams` (`Op::EmbedStreams`): each of the `rows` rows of
/// gathered values `[n*d]` copied into every one of `streams` streams → `[rows, streams*n*d]`.
pub fn gather_streams(
    ids: &[i64],
    table: &[f32],
    d: usize,
    rows: usize,
    streams: usize,
) -> Vec<f32> {
    elementwise::repeat_streams(&gather(ids, table, d), rows, streams)
}
