//! Errors of the communication layer, each naming the rank, peer, window or segment involved.

use std::time::Duration;

use pto_shm::ShmError;

/// A communication error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A communicator size of 0 or above [`crate::MAX_RANKS`].
    #[error("invalid communicator size {size}: must be 1 to {max}")]
    BadSize {
        /// The size asked for.
        size: usize,
        /// The maximum.
        max: usize,
    },
    /// A rank at or above the size.
    #[error("rank {rank} is out of range for a communicator of {size} ranks")]
    BadRank {
        /// The rank.
        rank: usize,
        /// The size.
        size: usize,
    },
    /// A domain's member list is invalid or does not contain the caller.
    #[error("invalid domain {members:?}: {why}")]
    BadDomain {
        /// The member list (world ranks).
        members: Vec<usize>,
        /// What is wrong.
        why: String,
    },
    /// A window size of 0, or one too large.
    #[error("invalid window size {bytes}: {why}")]
    BadWindow {
        /// The size asked for.
        bytes: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// Named buffers that do not fit their window, or a bad buffer spec.
    #[error("buffer {name:?}: {why}")]
    BadBuffer {
        /// The buffer.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// An access past the end of a named buffer.
    #[error("{len} bytes at offset {offset} of buffer {name:?} do not fit its {bytes} bytes")]
    OutsideBuffer {
        /// The buffer.
        name: String,
        /// Offset in the buffer.
        offset: u64,
        /// Length.
        len: u64,
        /// The buffer's size.
        bytes: usize,
    },
    /// An access past the end of a window.
    #[error(
        "{op} of {len} bytes at offset {offset} on rank {rank} is outside the {size}-byte window"
    )]
    OutOfBounds {
        /// The operation.
        op: &'static str,
        /// Target rank.
        rank: usize,
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Window size.
        size: usize,
    },
    /// An atomic or signal at an offset not aligned to its size.
    #[error("{op} at offset {offset} is not {align}-byte aligned")]
    Misaligned {
        /// The operation.
        op: &'static str,
        /// Offset.
        offset: usize,
        /// Required alignment.
        align: usize,
    },
    /// Peers disagree on a collective's parameters.
    #[error("peers disagree on {what}: {theirs} (from {source_desc}) versus {ours} on this rank")]
    Mismatch {
        /// What differs.
        what: &'static str,
        /// The value the creator used.
        theirs: u64,
        /// Who set it.
        source_desc: String,
        /// This rank's value.
        ours: u64,
    },
    /// The ranks of a collective call passed different arguments (every rank gets it).
    #[error(
        "{what}: the ranks passed different arguments ({each}); every rank must pass the same"
    )]
    Disagree {
        /// The call.
        what: &'static str,
        /// What each rank passed, in rank order.
        each: String,
    },
    /// A peer died (killed or crashed) while this rank waited for it.
    #[error("rank {rank} (pid {pid}) died")]
    PeerDied {
        /// The dead rank (world rank).
        rank: usize,
        /// Its pid.
        pid: u32,
    },
    /// A peer failed (panicked) or exited while this rank waited for it.
    #[error("rank {rank} {how}")]
    PeerGone {
        /// The rank (world rank).
        rank: usize,
        /// "failed" or "exited".
        how: &'static str,
    },
    /// A rank raised an abort.
    #[error("aborted by rank {rank}: {message}")]
    Aborted {
        /// Who raised it (world rank).
        rank: usize,
        /// Why.
        message: String,
    },
    /// A wait passed its deadline.
    #[error(
        "{what} on rank {rank} timed out after {waited:?} (set PTO_WAIT_TIMEOUT_MS to wait longer)"
    )]
    Timeout {
        /// What was waited for.
        what: String,
        /// The waiting rank.
        rank: usize,
        /// How long.
        waited: Duration,
    },
    /// A rank slot was already taken (two processes claimed one rank).
    #[error("rank {rank} already joined (pid {pid})")]
    AlreadyJoined {
        /// The rank.
        rank: usize,
        /// The pid that holds it.
        pid: u32,
    },
    /// An MPI call failed (`mpi` backend).
    #[error("rank {rank}: {call} failed: {message} (MPI error {code})")]
    Mpi {
        /// World rank of the caller.
        rank: usize,
        /// The MPI function.
        call: &'static str,
        /// MPI's error code.
        code: i32,
        /// MPI's error string.
        message: String,
    },
    /// A direct pointer was asked of a window whose peers are not mapped (MPI RMA windows).
    #[error("rank {rank}'s part of this window is not mapped here ({why})")]
    NotMapped {
        /// The peer.
        rank: usize,
        /// Why.
        why: &'static str,
    },
    /// The environment does not describe a rank (for `Comm::from_env`).
    #[error("environment: {0}")]
    Env(String),
    /// The OS layer failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// Reading or writing a peer's memory directly (the single-copy collectives) failed.
    #[error("reaching rank {rank}'s memory (pid {pid}) directly failed: {source} (PTO_SINGLE_COPY=0 turns the single-copy path off)")]
    PeerRead {
        /// The peer.
        rank: usize,
        /// Its process.
        pid: u32,
        /// The system call's error.
        source: std::io::Error,
    },
    /// Starting a rank failed.
    #[error("launching rank {rank}: {source}")]
    Launch {
        /// The rank.
        rank: usize,
        /// The error.
        source: std::io::Error,
    },
}

impl CommError {
    /// The kind of failure.
    pub fn fault(&self) -> pto_shm::Fault {
        use pto_shm::Fault;
        match self {
            CommError::BadSize { .. }
            | CommError::BadRank { .. }
            | CommError::BadDomain { .. }
            | CommError::BadWindow { .. }
            | CommError::BadBuffer { .. }
            | CommError::OutOfBounds { .. }
            | CommError::Misaligned { .. }
            | CommError::Env(_) => Fault::Usage,
            CommError::Shm(e) => e.fault(),
            CommError::Launch { .. } => Fault::Environment,
            _ => Fault::Runtime,
        }
    }

    /// Whose failure this is: this rank's own, another rank's (it died, failed, left or
    /// aborted), or nobody's in particular (a wait on others ran out).
    pub fn cause(&self) -> Cause {
        match self {
            CommError::PeerDied { .. } | CommError::PeerGone { .. } | CommError::Aborted { .. } => {
                Cause::Peer
            }
            // A segment whose creator died is that rank's failure, not this one's.
            CommError::Shm(ShmError::Stale { .. }) => Cause::Peer,
            CommError::Timeout { .. } | CommError::Shm(ShmError::Timeout { .. }) => Cause::Timeout,
            _ => Cause::Own,
        }
    }
}

/// Whose failure a rank's error is, for a report that leads with the root cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The rank failed on its own (a kernel's error, a bad argument): a root cause.
    Own,
    /// Another rank died, failed, left or aborted first: a consequence.
    Peer,
    /// A wait on other ranks ran out: a consequence of whoever did not arrive, and the root
    /// cause only when nobody else failed.
    Timeout,
}
