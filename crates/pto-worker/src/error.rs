//! The Worker's error: what failed (a child, a wait, the arguments, the OS layer, a run),
//! naming the chip or sub-worker, and the kind of failure ([`Fault`]).

use pto_comm::CommError;
use pto_core::RunError;
use pto_shm::{Fault, ShmError};

use crate::failure::RunFailure;

/// Errors of the Worker, naming the chip or sub-worker, task and message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The process has threads; forking now would be unsafe.
    #[error("a Worker must be created before any thread starts (this process has {threads}); see the pto-worker docs")]
    NotSingleThreaded {
        /// Threads found.
        threads: usize,
    },
    /// A chip failed to come up.
    #[error("bring-up failed: {message}")]
    Boot {
        /// The chip (the root cause).
        who: String,
        /// Every failure, the root cause first.
        message: String,
        /// The failures one by one.
        report: Box<RunFailure>,
    },
    /// A child process died.
    #[error("{who} (pid {pid}) died")]
    ChildDied {
        /// The chip or sub-worker.
        who: String,
        /// Its pid.
        pid: u32,
    },
    /// A wait passed its deadline.
    #[error("timeout: {0}")]
    Timeout(String),
    /// A frame or result in shared memory was invalid.
    #[error("corrupt mailbox data: {0}")]
    Corrupt(String),
    /// Bad arguments.
    #[error("{0}")]
    Args(String),
    /// The host run failed (a chip's task, a sub-worker, or the host orchestration).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The Worker cannot run any more.
    #[error("the Worker is unusable: {0}")]
    Broken(String),
    /// Forking failed.
    #[error("fork: {0}")]
    Fork(std::io::Error),
    /// The OS layer failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// Communication failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Children failed (a run, or bring-up): every failure, the root cause first.
    #[error("{0}")]
    Failed(Box<RunFailure>),
}

impl WorkerError {
    /// The kind of failure.
    pub fn fault(&self) -> Fault {
        match self {
            WorkerError::NotSingleThreaded { .. } | WorkerError::Args(_) => Fault::Usage,
            WorkerError::Fork(_) => Fault::Environment,
            WorkerError::Shm(e) => e.fault(),
            WorkerError::Comm(e) => e.fault(),
            WorkerError::Run(e) => e.fault(),
            _ => Fault::Runtime,
        }
    }

    /// The per-child failures, when this error has them.
    pub fn failures(&self) -> Option<&RunFailure> {
        match self {
            WorkerError::Failed(f) => Some(f),
            WorkerError::Boot { report, .. } => Some(report),
            _ => None,
        }
    }
}
