//! Lines about failures, written so that they survive concurrent writers.
//!
//! Several processes (the ranks of a job, a Worker's children) often share one stderr. Rust's
//! `eprintln!` writes a formatted line in pieces, one `write` per piece, so another process's
//! line can land in the middle of it. [`line()`] formats first and writes once: a line shorter
//! than the pipe buffer (4 KiB) arrives whole.

use std::io::Write;

/// Writes `msg` and a newline to stderr with one `write` call (errors writing are ignored: the
/// reporter has nowhere else to report them).
pub fn line(msg: impl std::fmt::Display) {
    let mut s = msg.to_string();
    s.push('\n');
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

/// [`line()`] with `format!` arguments.
#[macro_export]
macro_rules! eprint_line {
    ($($arg:tt)*) => {
        $crate::report::line(::std::format_args!($($arg)*))
    };
}
