//! Who may read a task's body while it runs, and when its finishing thread has it alone.
//!
//! Besides the threads running its blocks, one kind of thread reads the body of a running task:
//! the borrow table's scan of running tasks (and a stall report), which pins the node with a
//! reference and reads the tensor arguments. The thread that finishes the task wants to write
//! the body's lines back unchanged, so that they sit modified in its cache rather than shared
//! (see `Slot::take_lines`); it may only do so while no scan reads them. One word settles it:
//! a reader pins by raising a count unless the word is closed; the finishing thread closes it
//! with one `fetch_or`, which also tells it whether a reader is inside, and opens it again
//! when it is done with the body (with a plain store when no reader was inside: none could
//! enter since, so nothing else changed the word). A reader that finds it closed skips the
//! task, which is finishing and holds no bytes any more (or, if it must read, tries again: the
//! window is a few stores long). Modelled with loom in `tests/loom.rs`. See
//! `docs/design/chip-scheduler.md`.

use super::sync::{AtomicU32, Ordering};

const CLOSED: u32 = 1 << 31;

/// See the module docs.
#[derive(Debug, Default)]
pub struct ReaderGate(AtomicU32);

impl ReaderGate {
    /// Open and empty again, for a new task in the node (orchestrating thread, while no other
    /// thread reaches the node).
    pub fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// Opens the gate the caller closed (the finishing thread, done with the body); readers
    /// inside, if any, stay counted. `alone` is what [`ReaderGate::close`] returned: with no
    /// reader inside none could enter and none can leave, so the word is `CLOSED` alone and a
    /// plain store opens it (no locked instruction on the path of every task).
    pub fn reopen(&self, alone: bool) {
        if alone {
            self.0.store(0, Ordering::Release);
        } else {
            self.0.fetch_and(!CLOSED, Ordering::Release);
        }
    }

    /// Pins the body for reading; false once the finishing thread closed it. Pair with
    /// [`ReaderGate::unpin`].
    pub fn pin(&self) -> bool {
        let mut r = self.0.load(Ordering::Acquire);
        loop {
            if r & CLOSED != 0 {
                return false;
            }
            match self
                .0
                .compare_exchange_weak(r, r + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(x) => r = x,
            }
        }
    }

    /// Ends a [`ReaderGate::pin`].
    pub fn unpin(&self) {
        self.0.fetch_sub(1, Ordering::Release);
    }

    /// Closes the gate (the finishing thread, once); true when no reader is inside, so that
    /// from here the caller alone accesses the body.
    pub fn close(&self) -> bool {
        self.0.fetch_or(CLOSED, Ordering::AcqRel) == 0
    }
}
