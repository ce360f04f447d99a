//! The `mpi` backend (cargo feature `mpi`): ranks are the processes of an MPI job, started by
//! `mpirun -n N prog`, on one host or many.
//!
//! Every rank calls [`init`] and gets the world [`Comm`]. Windows are MPI-3 RMA windows:
//!
//! * **rma** windows (`MPI_Win_allocate`, passive target with `MPI_Win_lock_all`): put and get
//!   are `MPI_Put` / `MPI_Get`; atomics are `MPI_Fetch_and_op`, `MPI_Compare_and_swap` and
//!   `MPI_Accumulate`; a notify flushes this rank's earlier operations, then updates the signal
//!   atomically (`MPI_Accumulate` with `MPI_SUM`, or a compare-and-swap loop for a store); waits
//!   poll the signal with `MPI_Fetch_and_op` (which also drives MPI's progress), then
//!   `MPI_Win_sync` before the data is read. Collectives are MPI's own (`MPI_Allreduce`, ...).
//! * **shared** windows (`MPI_Win_allocate_shared`, when every rank is on one node): every rank
//!   maps every rank's part, so the same direct loads, stores and parking waits as the shm
//!   backend run, and collectives are pto's own, except mid-size allreduces where MPI's is
//!   faster ([`crate::LIBRARY_ALLREDUCE_BYTES`]; see `docs/BENCHMARKS.md`).
//!
//! The mode is `shared` when all ranks share a node and `rma` otherwise; `PTO_MPI_WINDOWS=rma`
//! forces RMA windows on one node (to test that path). Barriers are `MPI_Ibarrier` completed
//! under the usual deadline. MPI errors are returned (`MPI_ERRORS_RETURN`) and become
//! [`CommError::Mpi`] naming the rank and the call. A rank that aborts ([`Comm::abort`], or a
//! panic) prints its message and calls `MPI_Abort`, which ends the whole job; a wait that
//! passes its deadline inside an MPI collective does the same, since MPI cannot cancel one.
//! Design notes: `docs/design/mpi-backend.md`.
//!
//! ```no_run
//! // Under `mpirun -n 2 prog`:
//! let comm = pto_comm::mpi::init()?;
//! let w = comm.alloc_window(&pto_comm::WindowSpec::new(64))?;
//! let peer = (comm.rank() + 1) % comm.size();
//! w.put_slice(peer, 8, &[comm.rank() as u64])?;
//! w.notify(peer, 0, 1, pto_comm::SignalOp::Add)?;
//! w.wait_until(0, 1)?;
//! # Ok::<(), pto_comm::CommError>(())
//! ```

use std::sync::Arc;

use crate::backend::{mpi, Transport};
use crate::comm::{Comm, RankGuard};
use crate::error::CommError;
use crate::world::{create_world, env_timeout, MAX_RANKS};

pub use crate::backend::mpi::{ENV_NODE_RANKS, ENV_WINDOWS};

/// True when this process looks like a rank of an MPI job (Open MPI, MPICH or a PMI launcher
/// set its variables).
pub fn detected() -> bool {
    super::mpi_launcher().is_some()
}

/// Starts MPI (once per process, with `MPI_THREAD_SERIALIZED`: pto serializes its MPI calls)
/// and returns the world communicator of this rank. Call it from every rank of a job started
/// by `mpirun`.
///
/// # Errors
///
/// MPI was already started by this process, the library lacks `MPI_THREAD_SERIALIZED`, more
/// than [`MAX_RANKS`] ranks, `PTO_MPI_WINDOWS=shared` on several nodes, or an MPI error.
pub fn init() -> Result<Comm, CommError> {
    let (world_comm, rank, size) = mpi::start()?;
    if size > MAX_RANKS {
        return Err(CommError::BadSize {
            size,
            max: MAX_RANKS,
        });
    }
    let world = Arc::new(create_world(
        size,
        Transport::Mpi(world_comm),
        rank,
        env_timeout()?,
    )?);
    world.join(rank)?;
    Ok(Comm::world(Arc::new(RankGuard::new(world, rank))))
}

/// MPI's own blocking `MPI_Allreduce` (f32 sum) over `comm`'s ranks: the baseline that
/// `pto bench allreduce --backend mpi` compares pto's collectives with, in the same job.
///
/// # Errors
///
/// `comm` is not of the mpi backend, `recv` is not as long as `send`, or an MPI error.
pub fn baseline_allreduce_f32(
    comm: &Comm,
    send: &[f32],
    recv: &mut [f32],
) -> Result<(), CommError> {
    let Some(m) = comm.inner.io.library() else {
        return Err(CommError::Env(
            "baseline_allreduce_f32 needs a communicator of the mpi backend".into(),
        ));
    };
    m.baseline_allreduce_f32(send, recv)
}
