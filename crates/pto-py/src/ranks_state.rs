//! What the ranks of one `run_ranks` share: whether the run still goes on (a `Comm` or
//! `Window` used after it returned, or after Ctrl-C, is refused), and the order of failures.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

use crate::errors::{pto_err, Kind};

/// What the ranks of one `run_ranks` share: whether it still runs, and the order of failures.
#[derive(Debug)]
pub(crate) struct Ranks {
    /// [`RUNNING`], [`INTERRUPTED`] or [`ENDED`].
    pub(crate) state: AtomicU8,
    /// Order of failures (the first to fail is the one raised).
    pub(crate) seq: AtomicUsize,
}

impl Ranks {
    /// Refuses calls once `run_ranks` has returned or was interrupted.
    pub(crate) fn usable(&self) -> PyResult<()> {
        match self.state.load(Ordering::Acquire) {
            RUNNING => Ok(()),
            INTERRUPTED => Err(PyKeyboardInterrupt::new_err("run_ranks was interrupted")),
            _ => Err(pto_err(
                Kind::Comm,
                "this Comm's run_ranks has returned: use it only inside the rank function",
            )),
        }
    }
}

pub(crate) const RUNNING: u8 = 0;
pub(crate) const INTERRUPTED: u8 = 1;
pub(crate) const ENDED: u8 = 2;
