//! # pto-shm: the OS layer under pto's communication
//!
//! * [`Segment`]: named POSIX shared-memory segments with explicit ownership (the creator
//!   unlinks), sized with `fallocate` so a full `/dev/shm` is an error instead of a `SIGBUS`, and
//!   a validated [`Header`].
//! * [`futex`]: cross-process wait and wake on a 32-bit word, with a timeout.
//! * [`barrier`]: a sense-reversing barrier that parks and stays correct when a fast rank
//!   re-enters at once.
//! * [`wait`]: the one waiting loop every blocking operation uses (spin, then park in short
//!   slices, checking a deadline and the liveness of the peers waited for).
//! * [`cma`]: one process reading another's memory with one kernel copy (single-copy
//!   collectives).
//! * [`process`]: process identity (pid plus start time) and liveness.
//! * [`sweep`]: finds and removes segments whose creator died.
//! * [`cleanup`]: on SIGINT/SIGTERM/SIGHUP, kill registered children and remove this
//!   process's segments before exiting 128 + signal; after a `SIGKILL`, a janitor process
//!   started with the first segment removes them.
//! * [`report`]: failure lines written with one `write`, so concurrent writers never split them.
//!
//! ```
//! use std::sync::atomic::Ordering;
//! use std::time::{Duration, Instant};
//! use pto_shm::{HeaderInit, Segment, HEADER_LEN};
//!
//! // The creator owns the name (and unlinks it when dropped); a joiner validates the header.
//! let name = Segment::fresh_name("doc");
//! let owner = Segment::create(&name, HEADER_LEN + 64, HeaderInit { nranks: 2, ..HeaderInit::default() })?;
//! let joiner = Segment::open(&name, Instant::now() + Duration::from_secs(1))?;
//! assert_eq!(joiner.header().nranks, 2);
//! owner.atomic_u32(HEADER_LEN).store(7, Ordering::Release);
//! assert_eq!(joiner.atomic_u32(HEADER_LEN).load(Ordering::Acquire), 7);
//! # Ok::<(), pto_shm::ShmError>(())
//! ```
//!
//! Design notes: `docs/design/shm-segments.md` and `docs/design/barrier.md`.

#![warn(missing_docs)]

pub mod barrier;
pub mod cleanup;
pub mod cma;
pub mod futex;
mod janitor;
pub mod process;
pub mod report;
pub mod ring;
mod segment;
pub mod sweep;
pub mod sync;
pub mod wait;

pub use segment::{nonce, Header, HeaderInit, Segment, HEADER_LEN, MAGIC, VERSION};

/// Free bytes in `/dev/shm` (where every segment lives), or `None` when unknown.
pub fn shm_free() -> Option<u64> {
    let st = rustix::fs::statvfs("/dev/shm").ok()?;
    st.f_bavail.checked_mul(st.f_frsize)
}

/// The `kind` values pto writes in segment headers.
pub mod segment_kind {
    /// A communicator's world control segment.
    pub const WORLD: u32 = 1;
    /// A domain's control segment.
    pub const DOMAIN: u32 = 2;
    /// A window allocation.
    pub const WINDOW: u32 = 3;
    /// A chip's bootstrap channel or mailbox.
    pub const MAILBOX: u32 = 4;
}

use std::io;

/// Errors of the OS layer, each naming what failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A system call failed.
    #[error("{op} {name}: {source}")]
    Os {
        /// The operation.
        op: &'static str,
        /// The segment (or other object).
        name: String,
        /// The OS error.
        source: io::Error,
    },
    /// `/dev/shm` has no room for the segment.
    #[error("no space in /dev/shm for segment {name} ({bytes} bytes)")]
    NoSpace {
        /// The segment.
        name: String,
        /// Its size.
        bytes: u64,
    },
    /// A segment name that is not `/pto.` followed by letters, digits, `.`, `_` or `-`.
    #[error("invalid segment name {0:?}")]
    BadName(String),
    /// A size of zero or one that cannot be mapped.
    #[error("invalid segment size {bytes} for {name}")]
    BadSize {
        /// The segment.
        name: String,
        /// The size asked for.
        bytes: u64,
    },
    /// The segment is not a pto segment of this version.
    #[error("segment {name} is not a valid pto segment: {why}")]
    BadHeader {
        /// The segment.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The segment's creator is dead: a stale segment of a crashed run.
    #[error("segment {name} is stale: its creator (pid {pid}) is dead")]
    Stale {
        /// The segment.
        name: String,
        /// The creator's pid.
        pid: u32,
    },
    /// The segment did not appear or become ready before the deadline.
    #[error("segment {name} was not ready within {waited_ms} ms")]
    Timeout {
        /// The segment.
        name: String,
        /// How long we waited.
        waited_ms: u64,
    },
}

/// What kind of failure an error is: every pto error type can say (the `pto` command's exit
/// code comes from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The caller asked for something invalid (arguments, sizes, configuration).
    Usage,
    /// The run failed: a failed task, a dead or stopped rank, a deadline.
    Runtime,
    /// The machine cannot do it: no space in `/dev/shm`, a missing program, a refused fork.
    Environment,
}

impl ShmError {
    /// The kind of failure.
    pub fn fault(&self) -> Fault {
        match self {
            ShmError::NoSpace { .. } | ShmError::Os { .. } => Fault::Environment,
            ShmError::BadName(_) | ShmError::BadSize { .. } => Fault::Usage,
            ShmError::BadHeader { .. } | ShmError::Stale { .. } | ShmError::Timeout { .. } => {
                Fault::Runtime
            }
        }
    }
}
