//! Starting ranks: the launchers of each backend, on top of everything else. Each gives every
//! rank its world [`crate::Comm`].
//!
//! | module | ranks are |
//! |---|---|
//! | [`local`] | threads of this process |
//! | [`shm`] | processes on this host, over POSIX shared memory |
//! | `mpi` (cargo feature `mpi`) | the processes of an MPI job, on one host or many |

pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shm;

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
