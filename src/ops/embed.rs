//! Row gathers: the token embedding and the PLE n-gram table lookup.

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
