//! A table kept in host memory and read a few rows at a time: the PLE n-gram table of the real
//! release (320M rows of 160 bf16, ~102 GB) does not fit on one GPU beside the model, and a token
//! reads only 16 of its rows. The rows stay in the checkpoint's mapping (the page cache holds
//! what was read), in the stored element type; a gather widens exactly to f32 and refuses ids
//! outside the table and rows that hold NaN or infinity, naming the table and the row (the
//! load's non-finite scan skips a host table: reading all of it would cost more than the load).

use crate::checkpoint::MappedTensor;

/// How a host table stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableElement {
    F32,
    Bf16,
}

impl TableElement {
    pub fn bytes(self) -> usize {
        match self {
            TableElement::F32 => 4,
            TableElement::Bf16 => 2,
        }
    }

    /// `out.len()` values from `raw`, widened exactly.
    fn widen_into(self, raw: &[u8], out: &mut [f32]) {
        match self {
            TableElement::F32 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            TableElement::Bf16 => {
                for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
                }
            }
        }
    }
}

/// Ids a gather reads on one thread: beyond this, a prefill's rows are read by all cores (each
/// row a page of the mapping touched first, whose fault costs microseconds).
const SERIAL_IDS: usize = 2048;

/// Where a piece of the table's rows lives.
enum Backing {
    /// A checkpoint tensor's bytes in its mapped file.
    Mapped(MappedTensor),
    Owned(Vec<u8>),
    /// Zeros that take no memory until read (benchmarks: the real table's size, no file).
    Zeros(memmap2::MmapMut),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m.bytes(),
            Backing::Owned(v) => v,
            Backing::Zeros(m) => m,
        }
    }
}

/// A `[rows, width]` table on the host, possibly in pieces of whole rows (the `shard_{k}`
/// tensors of the table), read by [`HostTable::gather`].
pub struct HostTable {
    pub name: String,
    pub rows: usize,
    pub width: usize,
    pub element: TableElement,
    /// Pieces in row order, with the first row of each.
    pieces: Vec<(usize, Backing)>,
}

impl std::fmt::Debug for HostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostTable({} [{}, {}] {:?} in {} pieces)",
            self.name,
            self.rows,
            self.width,
            self.element,
            self.pieces.len()
        )
    }
}

impl HostTable {
    /// A table of checkpoint tensors (pieces of whole rows, in order), each `[rows_k, width]` of
    /// `element` as its dtype says; left in their mappings.
    pub fn mapped(
        name: &str,
        width: usize,
        element: TableElement,
        pieces: Vec<MappedTensor>,
    ) -> Result<HostTable, String> {
        let row_bytes = width * element.bytes();
        let mut table = HostTable::empty(name, width, element);
        for (k, piece) in pieces.into_iter().enumerate() {
            let len = piece.bytes().len();
            if row_bytes == 0 || len % row_bytes != 0 {
                return Err(format!(
                    "table `{name}`: piece {k} holds {len} bytes, not whole rows of {width} values"
                ));
            }
            table.push(len / row_bytes, Backing::Mapped(piece));
        }
        Ok(table)
    }

    /// A table of `values` (`[rows, width]` f32), stored as `element` (bf16 rounds to nearest
    /// even; exact for values that came from bf16).
    pub fn from_f32(name: &str, width: usize, element: TableElement, values: &[f32]) -> HostTable {
        let bytes: Vec<u8> = match element {
            TableElement::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            TableElement::Bf16 => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                .collect(),
        };
        let mut table = HostTable::empty(name, width, element);
        table.push(values.len() / width.max(1), Backing::Owned(bytes));
        table
    }

    /// A table of zeros that takes host memory only for the pages a gather touches.
    pub fn zeros(
        name: &str,
        rows: usize,
        width: usize,
        element: TableElement,
    ) -> std::io::Result<HostTable> {
        let len = (rows * width * element.bytes()).max(1);
        let map = memmap2::MmapOptions::new()
            .len(len)
            .no_reserve_swap()
            .map_anon()?;
        let mut table = HostTable::empty(name, width, element);
        table.push(rows, Backing::Zeros(map));
        Ok(table)
    }

    fn empty(name: &str, width: usize, element: TableElement) -> HostTable {
        HostTable {
            name: name.to_string(),
            rows: 0,
            width,
            element,
            pieces: Vec::new(),
        }
    }

    fn push(&mut self, rows: usize, backing: Backing) {
        self.pieces.push((self.rows, backing));
        self.rows += rows;
    }

    /// Bytes the table holds (what it would take on a device, in its element type).
    pub fn bytes(&self) -> usize {
        self.rows * self.width * self.element.bytes()
    }

    /// Appends row `id` of the table for each of `ids` to `out`, widened to f32: `[ids, width]`.
    /// An id outside the table or a row holding NaN or infinity is refused (naming the table, the
    /// id and its place in `ids`), with `out` as it was.
    pub fn gather(&self, ids: &[i64], out: &mut Vec<f32>) -> Result<(), String> {
        use rayon::prelude::*;
        let before = out.len();
        let width = self.width.max(1);
        out.resize(before + ids.len() * width, 0.0);
        let rows = out[before..].chunks_mut(width).zip(ids).enumerate();
        let result = if ids.len() <= SERIAL_IDS {
            rows.into_iter()
                .try_for_each(|(i, (row, &id))| self.read_row(i, id, row))
        } else {
            let rows: Vec<_> = rows.collect();
            // The first error in `ids`' order, whichever thread meets it.
            rows.into_par_iter()
                .map(|(i, (row, &id))| self.read_row(i, id, row).map_err(|e| (i, e)))
                .collect::<Vec<_>>()
                .into_iter()
                .filter_map(Result::err)
                .min_by_key(|(i, _)| *i)
                .map_or(Ok(()), |(_, e)| Err(e))
        };
        if result.is_err() {
            out.truncate(before);
        }
        result
    }

    /// Row `id` (the `i`th gathered) into `row`, checked.
    fn read_row(&self, i: usize, id: i64, row: &mut [f32]) -> Result<(), String> {
        let Some(r) = usize::try_from(id).ok().filter(|&r| r < self.rows) else {
            return Err(format!(
                "table `{}`: id {id} (the {i}th gathered) is outside its {} rows",
                self.name, self.rows
            ));
        };
        let row_bytes = self.width * self.element.bytes();
        // Pieces are in row order: the last one starting at or before `r` holds it.
        let k = self.pieces.partition_point(|(first, _)| *first <= r) - 1;
        let (first, backing) = &self.pieces[k];
        let at = (r - first) * row_bytes;
        self.element
            .widen_into(&backing.bytes()[at..at + row_bytes], row);
        match row.iter().find(|v| !v.is_finite()) {
            Some(bad) => Err(format!(
                "table `{}`: row {r} holds {bad} (the checkpoint's values must be finite)",
                self.name
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(rows: usize, width: usize) -> Vec<f32> {
        (0..rows * width).map(|i| i as f32 * 0.25 - 3.0).collect()
    }

    #[test]
    fn a_gather_reads_the_rows_it_names_widened_exactly() {
        let v = values(5, 3);
        for element in [TableElement::F32, TableElement::Bf16] {
            let t = HostTable::from_f32("t", 3, element, &v);
            let mut out = vec![9.0];
            t.gather(&[4, 0, 4, 2], &mut out).unwrap();
            let want: Vec<f32> = [9.0]
                .into_iter()
                .chain(
                    [4, 0, 4, 2]
                        .iter()
                        .flat_map(|&r| v[r * 3..r * 3 + 3].to_vec()),
                )
                .collect();
            assert_eq!(out, want, "{element:?}");
        }
    }

    #[test]
    fn rows_split_over_pieces_read_as_one_table() {
        let v = values(7, 2);
        let mut t = HostTable::empty("t", 2, TableElement::F32);
        for (rows, range) in [(3, 0..6), (1, 6..8), (3, 8..14)] {
            let bytes = v[range].iter().flat_map(|x| x.to_le_bytes()).collect();
            t.push(rows, Backing::Owned(bytes));
        }
        assert_eq!(t.rows, 7);
        let mut out = Vec::new();
        t.gather(&[6, 3, 2, 0, 4], &mut out).unwrap();
        let want: Vec<f32> = [6, 3, 2, 0, 4]
            .iter()
            .flat_map(|&r| v[r * 2..r * 2 + 2].to_vec())
            .collect();
        assert_eq!(out, want);
    }

    #[test]
    fn bad_ids_and_non_finite_rows_are_refused_leaving_the_output() {
        let mut v = values(4, 2);
        v[5] = f32::NAN;
        let t = HostTable::from_f32("ngram", 2, TableElement::Bf16, &v);
        let mut out = vec![1.0];
        for (ids, want) in [
            (&[0, 4][..], "id 4 (the 1th gathered) is outside its 4 rows"),
            (&[-1][..], "id -1"),
            (&[0, 2][..], "row 2 holds NaN"),
        ] {
            let err = t.gather(ids, &mut out).unwrap_err();
            assert!(err.contains("table `ngram`") && err.contains(want), "{err}");
            assert_eq!(out, vec![1.0]);
        }
    }

    #[test]
    fn a_gather_of_many_ids_reads_on_all_cores_with_the_same_result() {
        let v = values(97, 5);
        let t = HostTable::from_f32("t", 5, TableElement::Bf16, &v);
        let ids: Vec<i64> = (0..3 * SERIAL_IDS as i64).map(|i| (i * 31) % 97).collect();
        let mut out = Vec::new();
        t.gather(&ids, &mut out).unwrap();
        let mut serial = Vec::new();
        for chunk in ids.chunks(SERIAL_IDS) {
            t.gather(chunk, &mut serial).unwrap();
        }
        assert_eq!(out, serial);
        // The first bad id in order is the one named.
        let mut bad = ids.clone();
        bad[SERIAL_IDS + 7] = 97;
        bad[2 * SERIAL_IDS] = -5;
        let err = t.gather(&bad, &mut out).unwrap_err();
        assert!(
            err.contains(&format!("the {}th gathered", SERIAL_IDS + 7)),
            "{err}"
        );
        assert_eq!(out, serial, "the output as it was");
    }

    #[test]
    fn a_zero_table_of_the_release_size_maps_and_gathers_zeros() {
        let t = HostTable::zeros("ngram", 320_001_536, 160, TableElement::Bf16).unwrap();
        assert_eq!(t.bytes(), 102_400_491_520);
        let mut out = Vec::new();
        t.gather(&[0, 320_001_535, 123_456_789], &mut out).unwrap();
        assert_eq!(out, vec![0.0; 480]);
    }
}
