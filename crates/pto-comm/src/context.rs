//! What kernels receive: the rank's communicator and windows.

use std::sync::Arc;

use crate::collective::Collectives;
use crate::comm::Comm;
use crate::error::CommError;
use crate::window::Window;

/// A rank's communication context, handed to a chip as its extension so that every kernel can
/// reach it through `KernelCtx::ext::<CommContext>()`.
#[derive(Clone, Debug)]
pub struct CommContext {
    comm: Comm,
    windows: Vec<Window>,
    coll: Option<Arc<Collectives>>,
}

impl CommContext {
    /// A context over `comm` with no window yet.
    pub fn new(comm: Comm) -> CommContext {
        CommContext {
            comm,
            windows: Vec::new(),
            coll: None,
        }
    }

    /// Adds a window (the first added is window 0).
    pub fn with_window(mut self, w: Window) -> CommContext {
        self.windows.push(w);
        self
    }

    /// Adds collectives (kernels call them through [`CommContext::collectives`]).
    pub fn with_collectives(mut self, c: Collectives) -> CommContext {
        self.coll = Some(Arc::new(c));
        self
    }

    /// The collectives, when the context has them.
    ///
    /// # Errors
    ///
    /// [`CommError::BadWindow`] when it has none.
    pub fn collectives(&self) -> Result<&Collectives, CommError> {
        self.coll.as_deref().ok_or(CommError::BadWindow {
            bytes: 0,
            why: "this context has no collectives (CommContext::with_collectives)",
        })
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
