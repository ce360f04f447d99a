//! # pto-comm: symmetric windows, signals and barriers across ranks
//!
//! Ranks share *windows*: the same number of bytes on every rank, addressed by
//! `(rank, offset)`. A rank writes into a peer's window ([`Window::put`]), reads from it
//! ([`Window::get`]), updates it atomically ([`Window::fetch_add_u64`]) and synchronizes with
//! *signals*: a `u32` in a window that peers [`Window::notify`] and its owner
//! [`Window::wait_until`] reaches a value. Barriers, domains (subsets of ranks with dense ranks)
//! and named buffers complete the picture.
//!
//! Two backends run the same protocols over the same memory layout ([`Backend`]):
//! * `local`: ranks are threads of one process ([`local::run`], [`local::comms`]);
//! * `shm`: ranks are processes on one host over POSIX shared memory ([`shm::ShmWorld`],
//!   [`shm::from_env`]);
//! * `mpi` (cargo feature `mpi`): ranks are the processes of an MPI job, on one host or many
//!   (`mpi::init`), with MPI-3 RMA windows.
//!
//! ```
//! use pto_comm::{local, SignalOp, WindowSpec};
//! // Each rank sends its rank to its right neighbour and signals it.
//! let got = local::run(3, |comm| {
//!     let w = comm.alloc_window(&WindowSpec::new(64))?;
//!     let (me, n) = (comm.rank(), comm.size());
//!     w.put_slice(( me + 1) % n, 8, &[me as u64])?;
//!     w.notify((me + 1) % n, 0, 1, SignalOp::Add)?;
//!     w.wait_until(0, 1)?;
//!     Ok::<u64, pto_comm::CommError>(w.get_vec::<u64>(me, 8, 1)?[0])
//! })?;
//! let got: Vec<u64> = got.into_iter().map(|r| r.unwrap().unwrap()).collect();
//! assert_eq!(got, vec![2, 0, 1]);
//! # Ok::<(), pto_comm::CommError>(())
//! ```
//!
//! Every wait has a deadline (`PTO_WAIT_TIMEOUT_MS`), parks after a short spin, and fails
//! early, naming the rank, when a peer dies, panics or exits, or when a rank raises
//! [`Comm::abort`]. Design notes: `docs/design/comm-windows.md`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod collective;
mod comm;
pub mod conformance;
mod context;
mod error;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(not(feature = "mpi"))]
mod mpi_off;
#[cfg(not(feature = "mpi"))]
use mpi_off as mpi;
mod mapping;
mod queue;
pub mod shm;
mod window;
mod world;

pub use collective::{
    Algorithm, Collectives, ReduceOp, Reducible, MESH_MAX_BYTES, MPI_NATIVE_BYTES,
};
pub use comm::Comm;
pub use context::CommContext;
pub use error::{Cause, CommError};
pub use queue::SharedQueue;
pub use window::{
    BufferRef, BufferSpec, RemoteRef, SignalCondition, SignalOp, Window, WindowSpec, MAX_WINDOW,
    WINDOW_ALIGN,
};

/// The most ranks a communicator may have.
pub const MAX_RANKS: usize = 1024;

/// The variable an MPI launcher (Open MPI, MPICH or a PMI launcher) set when this process is
/// a rank of an MPI job, with its value; `None` otherwise. Available without the `mpi` feature,
/// so that a build without MPI can say it was started by `mpirun`.
pub fn mpi_launcher() -> Option<(&'static str, String)> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .into_iter()
    .find_map(|k| std::env::var(k).ok().map(|v| (k, v)))
}

/// `PTO_WAIT_TIMEOUT_MS` (or its default), as a [`CommError::Env`] when it is set wrong.
pub(crate) fn env_timeout() -> Result<std::time::Duration, CommError> {
    pto_core::config::Settings::from_env()
        .map(|s| s.wait_timeout)
        .map_err(|e| CommError::Env(e.to_string()))
}

/// Where ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Threads of one process.
    Local,
    /// Processes on one host over POSIX shared memory.
    Shm,
    /// The processes of an MPI job, on one host or many (cargo feature `mpi`).
    Mpi,
}

impl Backend {
    /// `"local"`, `"shm"` or `"mpi"`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Shm => "shm",
            Backend::Mpi => "mpi",
        }
    }

    /// Parses a name as printed by [`Backend::name`].
    pub fn from_name(s: &str) -> Option<Backend> {
        match s {
            "local" => Some(Backend::Local),
            "shm" => Some(Backend::Shm),
            "mpi" => Some(Backend::Mpi),
            _ => None,
        }
    }
}
