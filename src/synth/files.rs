//! The files of a synthetic checkpoint being written: tensors arrive in their [`Layout`] order,
//! a piece (or a hole) at a time; each file is created with its header when its first tensor
//! arrives and finished (synced, renamed into place) when the next file's does.

use std::collections::BTreeMap;
use std::path::Path;

use crate::checkpoint::{self, SafetensorsWriter, TensorHeader};
use crate::error::Result;
use crate::progress::Progress;

use super::layout::Layout;

pub(super) struct Files<'l, 'a> {
    dir: &'l Path,
    layout: &'l Layout<'a>,
    /// The file each tensor goes to.
    file_of: Vec<usize>,
    /// The open file: its index and writer.
    open: Option<(usize, SafetensorsWriter)>,
    /// Files finished so far.
    done: usize,
    progress: Progress,
}

impl<'l, 'a> Files<'l, 'a> {
    pub fn new(dir: &'l Path, layout: &'l Layout<'a>, progress: Progress) -> Files<'l, 'a> {
        let mut file_of = vec![0; layout.tensors.len()];
        for (f, range) in layout.files.iter().enumerate() {
            file_of[range.clone()].fill(f);
        }
        Files {
            dir,
            layout,
            file_of,
            open: None,
            done: 0,
            progress,
        }
    }

    /// The name of file `f`.
    fn name(&self, f: usize) -> String {
        let count = self.layout.files.len();
        if count == 1 {
            checkpoint::SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", f + 1, count)
        }
    }

    /// The writer of file `f`, finishing the files before it (files come in order).
    fn file(&mut self, f: usize) -> Result<&mut SafetensorsWriter> {
        while self.open.as_ref().map(|(i, _)| *i) != Some(f) {
            if let Some((_, w)) = self.open.take() {
                w.finish()?;
                self.done += 1;
            }
            let next = self.done;
            assert!(next <= f, "tensors arrive in file order");
            let headers: Vec<TensorHeader> = self.layout.tensors[self.layout.files[next].clone()]
                .iter()
                .map(|t| TensorHeader {
                    name: t.name.clone(),
                    dtype: t.dtype.clone(),
                    shape: t.shape.clone(),
                    len: t.len,
                })
                .collect();
            let path = self.dir.join(self.name(next));
            self.open = Some((next, SafetensorsWriter::create(&path, &headers, None)?));
        }
        Ok(&mut self.open.as_mut().expect("opened above").1)
    }

    /// Writes `bytes` into tensor `t`, `offset` bytes into its data.
    pub fn put(&mut self, t: usize, offset: usize, bytes: &[u8]) -> Result<()> {
        debug_assert!(!self.layout.tensors[t].hole);
        let first = self.layout.files[self.file_of[t]].start;
        self.file(self.file_of[t])?
            .write(t - first, offset as u64, bytes)?;
        self.progress.inc(bytes.len() as u64);
        Ok(())
    }

    /// Leaves tensor `t` unwritten: a hole of zeros.
    pub fn hole(&mut self, t: usize) -> Result<()> {
        self.file(self.file_of[t])?;
        self.progress.inc(self.layout.tensors[t].len as u64);
        Ok(())
    }

    /// Finishes every file (creating any not reached, e.g. of no tensor at all) and writes the
    /// index when there are several.
    pub fn finish(mut self) -> Result<()> {
        let last = self.layout.files.len() - 1;
        self.file(last)?;
        let (_, w) = self.open.take().expect("opened above");
        w.finish()?;
        self.progress.finish();
        let index = self.dir.join(checkpoint::INDEX_FILE);
        if last == 0 {
            // A stale index from an earlier run would shadow the single file.
            if index.exists() {
                std::fs::remove_file(&index).map_err(|e| crate::error::Error::Io {
                    path: index.display().to_string(),
                    msg: format!("cannot remove a stale index: {e}"),
                })?;
            }
            return Ok(());
        }
        let mut weight_map = BTreeMap::new();
        for (f, range) in self.layout.files.iter().enumerate() {
            let name = self.name(f);
            for t in &self.layout.tensors[range.clone()] {
                weight_map.insert(t.name.clone(), name.clone());
            }
        }
        checkpoint::write_index(&index, &weight_map, self.layout.total_bytes())?;
        Ok(())
    }
}
