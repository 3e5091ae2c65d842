//! A progress bar on stderr for long writes and loads: bytes done of a total, the rate and the
//! time left. It is drawn only when stderr is a terminal (and `TERM` is not `dumb`): piped or
//! redirected, as under tests and CI, it prints nothing at all.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A count of bytes towards a known total.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar for `total` bytes, headed by `label`.
    pub fn bytes(total: u64, label: &str) -> Progress {
        // indicatif's stderr target hides itself off a terminal too; asking first keeps that
        // promise independent of the crate's version.
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:32}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}, {eta} left",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_message(label.to_string());
        Progress { bar }
    }

    /// Counts `n` more bytes done.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Ends the bar, leaving its last state on the terminal.
    pub fn finish(&self) {
        self.bar.finish();
    }

    /// Whether nothing is drawn (stderr is not a terminal).
    pub fn is_hidden(&self) -> bool {
        self.bar.is_hidden()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // Cut short by an error: leave the terminal's line clean for the message that follows.
        if !self.bar.is_finished() {
            self.bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_off_a_terminal() {
        let p = Progress::bytes(10, "test");
        p.inc(4);
        p.inc(6);
        p.finish();
        assert_eq!(p.is_hidden(), !std::io::stderr().is_terminal());
    }
}
