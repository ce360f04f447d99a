//! What kernels receive: the rank's communicator and windows.

use crate::{Comm, CommError, Window};

/// A rank's communication context, handed to a chip as its extension so that every kernel can
/// reach it through `KernelCtx::ext::<CommContext>()`.
#[derive(Clone, Debug)]
pub struct CommContext {
    comm: Comm,
    windows: Vec<Window>,
}

impl CommContext {
    /// A context over `comm` with no window yet.
    pub fn new(comm: Comm) -> CommContext {
        CommContext {
            comm,
            windows: Vec::new(),
        }
    }

    /// Adds a window (the first added is window 0).
    pub fn with_window(mut self, w: Window) -> CommContext {
        self.windows.push(w);
        self
    }

    /// The communicator.
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Window `i`.
    ///
    /// # Errors
    ///
    /// [`CommError::BadWindow`] when there is no window `i`.
    pub fn window(&self, i: usize) -> Result<&Window, CommError> {
        self.windows.get(i).ok_or(CommError::BadWindow {
            bytes: 0,
            why: "no such window in this context",
        })
    }
}
