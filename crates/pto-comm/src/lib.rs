//! # pto-comm: symmetric windows, signals and barriers across ranks
//!
//! Ranks share *windows*: the same number of bytes on every rank, addressed by
//! `(rank, offset)`. A rank writes into a peer's window ([`Window::put`]), reads from it
//! ([`Window::get`]), updates it atomically ([`Window::fetch_add_u64`]) and synchronizes with
//! *signals*: a `u32` in a window that peers [`Window::notify`] and its owner
//! [`Window::wait_until`] reaches a value. Barriers, domains (subsets of ranks with dense ranks)
//! and named buffers complete the picture.
//!
//! Three backends run the same protocols ([`Backend`]):
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
//!
//! # Layers
//!
//! Dependencies point down; no two modules import each other.
//!
//! | layer | modules |
//! |---|---|
//! | launchers | `launch/` ([`local`], [`shm`], `mpi`): start ranks, hand each its world [`Comm`] |
//! | protocols | `conformance`, `context`, `collective/`, `signal`, `window/`, `comm`, `world`: written once, name no backend |
//! | backend boundary | `backend/`: [`Backend`], and the types every operation passes through (mapped memory, the MPI library); the only `unsafe` code |
//! | vocabulary | `error`, `reduce` |

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod backend;
pub mod check;
mod collective;
mod comm;
pub mod conformance;
mod context;
mod error;
mod launch;
mod reduce;
mod signal;
mod window;
mod world;

pub use backend::queue::SharedQueue;
pub use backend::Backend;
pub use collective::{
    Algorithm, Collectives, LIBRARY_ALLREDUCE_BYTES, MESH_MAX_BYTES, SINGLE_COPY_MIN_BYTES,
    TREE_FANOUT, TREE_MIN_RANKS,
};
pub use comm::Comm;
pub use context::CommContext;
pub use error::{Cause, CommError};
pub use launch::*;
pub use reduce::{ReduceOp, Reducible};
pub use signal::{SignalCondition, SignalOp};
pub use window::{BufferRef, BufferSpec, RemoteRef, Window, WindowSpec, MAX_WINDOW, WINDOW_ALIGN};
pub use world::MAX_RANKS;
