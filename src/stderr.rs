//! Lines on stderr that never panic: `eprintln!` panics when stderr is a pipe whose reader is
//! gone.

use std::fmt::Display;
use std::io::{self, Write};

/// Writes `text` and a newline to stderr. A failed write (a broken pipe, a closed descriptor) is
/// dropped: stderr is where failures are reported, so one there has nowhere else to go.
pub fn line(text: impl Display) {
    let _ = writeln!(io::stderr().lock(), "{text}");
}
