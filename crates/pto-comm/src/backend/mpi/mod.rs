//! The MPI library as a backend (cargo feature `mpi`): communicators ([`MpiComm`]: barriers,
//! agreements, sub-communicators, window allocation, collectives), RMA windows (`rma.rs`), the
//! library's calls (`ffi.rs`) and the watchdog of blocking calls (`watchdog.rs`). Starting the
//! job and the public API are `crate::launch::mpi`'s. `node.rs` (the hierarchical allreduce)
//! adds methods to [`MpiComm`], which holds the node hierarchy it builds: the one pair of files
//! in pto-comm that refer to each other, a type and its extension. Design notes:
//! `docs/design/mpi-backend.md`.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi_sys as sys;
use pto_core::DType;

use super::mapping::Mapping;
use crate::error::CommError;
use crate::reduce::ReduceOp;

mod ffi;
mod node;
pub(crate) mod rma;
mod watchdog;

pub use node::ENV_NODE_RANKS;

pub(crate) use ffi::{abort_job, reduces};
use ffi::{datatype, in_place, int, lock, ok, op_handle, ByteExchangeFn, Finalizer, MpiMemory, H};

/// Chooses the window mode: `shared` or `rma` (default: `shared` when all ranks share a node).
pub const ENV_WINDOWS: &str = "PTO_MPI_WINDOWS";

/// How windows are allocated and accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `MPI_Win_allocate_shared`: direct access, one node only.
    Shared,
    /// `MPI_Win_allocate` with RMA calls: any number of nodes.
    Rma,
}

static STARTED: AtomicBool = AtomicBool::new(false);

/// A communicator of the MPI job.
pub(crate) struct MpiComm {
    comm: H<sys::MPI_Comm>,
    /// This rank in the world (for errors).
    world_rank: usize,
    mode: Mode,
    fin: Arc<Finalizer>,
    /// This communicator's nodes, for hierarchical allreduces (built on first use).
    hier: std::sync::OnceLock<Option<Box<node::Hierarchy>>>,
}

impl MpiComm {
    /// A communicator derived from this one (same rank, mode and MPI lifetime).
    fn derived(&self, c: sys::MPI_Comm) -> MpiComm {
        MpiComm {
            comm: H(c),
            world_rank: self.world_rank,
            mode: self.mode,
            fin: self.fin.clone(),
            hier: std::sync::OnceLock::new(),
        }
    }

    /// True when every member maps every member's memory (shared windows, one node).
    pub(crate) fn peers_mapped(&self) -> bool {
        self.mode == Mode::Shared
    }

    pub(super) fn ok(&self, rc: c_int, call: &'static str) -> Result<(), CommError> {
        ok(rc, self.world_rank, call)
    }

    /// Completes `req` before `deadline`, or ends the job (MPI cannot cancel a collective).
    fn complete(
        &self,
        mut req: sys::MPI_Request,
        what: &str,
        deadline: Instant,
    ) -> Result<(), CommError> {
        // Every `MPI_Test` also drives the operation, so polling stays frequent while it is
        // young; after that it naps 50 µs between tests (ranks may outnumber cores). Liveness
        // is MPI's business: the launcher ends the job when a rank dies.
        let done = pto_shm::wait::bounded(
            deadline,
            pto_shm::wait::Pause::Backoff {
                nap: Duration::from_micros(50),
            },
            || {
                let mut flag: c_int = 0;
                let mpi = lock();
                // SAFETY: `req` is an active request of this process; status is ignored.
                let rc = unsafe { sys::MPI_Test(&mut req, &mut flag, sys::RSMPI_STATUS_IGNORE) };
                drop(mpi);
                self.ok(rc, "MPI_Test")?;
                Ok((flag != 0).then_some(()))
            },
            || Ok(()),
        );
        match done {
            Ok(()) => Ok(()),
            Err(pto_shm::wait::WaitError::Check(e)) => Err(e),
            Err(pto_shm::wait::WaitError::Timeout { .. }) => abort_job(
                self.world_rank,
                &format!("{what} did not complete before the deadline (PTO_WAIT_TIMEOUT_MS)"),
            ),
        }
    }

    /// `MPI_Ibarrier`, completed before `deadline`.
    pub(crate) fn barrier(&self, deadline: Instant) -> Result<(), CommError> {
        // SAFETY: a zeroed request handle is overwritten by the call.
        let mut req: sys::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: the communicator is valid while `self` lives.
        let rc = unsafe {
            let _mpi = lock();
            sys::MPI_Ibarrier(self.comm.0, &mut req)
        };
        self.ok(rc, "MPI_Ibarrier")?;
        self.complete(req, "MPI barrier", deadline)
    }

    /// The smallest and largest `v` over the members.
    pub(crate) fn min_max(&self, v: u64, deadline: Instant) -> Result<(u64, u64), CommError> {
        let send = [v, !v];
        let mut recv = [0u64; 2];
        // SAFETY: zeroed request overwritten by the call.
        let mut req: sys::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: both buffers hold 2 u64 and live until `complete` returns.
        let rc = unsafe {
            let _mpi = lock();
            sys::MPI_Iallreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                2,
                sys::RSMPI_UINT64_T,
                sys::RSMPI_MAX,
                self.comm.0,
                &mut req,
            )
        };
        self.ok(rc, "MPI_Iallreduce")?;
        self.complete(req, "MPI_Iallreduce (agreement)", deadline)?;
        Ok((!recv[1], recv[0]))
    }

    /// A communicator over `members` (world ranks); only they call it.
    pub(crate) fn create_group(&self, members: &[u32], tag: u64) -> Result<MpiComm, CommError> {
        let ranks: Vec<c_int> = members.iter().map(|&m| m as c_int).collect();
        let _mpi = lock();
        // SAFETY: the out-parameters are written by the calls; `ranks` lives across them; the
        // groups are freed after use.
        unsafe {
            let mut wg: sys::MPI_Group = std::mem::zeroed();
            self.ok(
                sys::MPI_Comm_group(sys::RSMPI_COMM_WORLD, &mut wg),
                "MPI_Comm_group",
            )?;
            let mut g: sys::MPI_Group = std::mem::zeroed();
            let rc = sys::MPI_Group_incl(wg, ranks.len() as c_int, ranks.as_ptr(), &mut g);
            sys::MPI_Group_free(&mut wg);
            self.ok(rc, "MPI_Group_incl")?;
            let mut c: sys::MPI_Comm = std::mem::zeroed();
            let rc = sys::MPI_Comm_create_group(
                sys::RSMPI_COMM_WORLD,
                g,
                (tag % 32_768) as c_int,
                &mut c,
            );
            sys::MPI_Group_free(&mut g);
            self.ok(rc, "MPI_Comm_create_group")?;
            self.ok(
                sys::MPI_Comm_set_errhandler(c, sys::RSMPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler",
            )?;
            Ok(self.derived(c))
        }
    }

    /// Memory every member maps: `len` bytes allocated by member 0 with
    /// `MPI_Win_allocate_shared`, zeroed by it before the barrier this returns after.
    pub(crate) fn shared_alloc(
        &self,
        name: String,
        len: usize,
        rank: usize,
        deadline: Instant,
    ) -> Result<Mapping, CommError> {
        let mine = if rank == 0 { len + 64 } else { 0 };
        // SAFETY: out-parameters written by the calls; the window stays allocated until
        // MPI_Finalize (windows are not freed earlier: freeing is collective and drops are not).
        let base = unsafe {
            let _mpi = lock();
            let mut p: *mut u8 = std::ptr::null_mut();
            let mut win: sys::MPI_Win = std::mem::zeroed();
            self.ok(
                sys::MPI_Win_allocate_shared(
                    mine as sys::MPI_Aint,
                    1,
                    sys::RSMPI_INFO_NULL,
                    self.comm.0,
                    (&mut p as *mut *mut u8).cast(),
                    &mut win,
                ),
                "MPI_Win_allocate_shared",
            )?;
            self.ok(
                sys::MPI_Win_set_errhandler(win, sys::RSMPI_ERRORS_RETURN),
                "MPI_Win_set_errhandler",
            )?;
            let mut size: sys::MPI_Aint = 0;
            let mut disp: c_int = 0;
            let mut q: *mut u8 = std::ptr::null_mut();
            self.ok(
                sys::MPI_Win_shared_query(
                    win,
                    0,
                    &mut size,
                    &mut disp,
                    (&mut q as *mut *mut u8).cast(),
                ),
                "MPI_Win_shared_query",
            )?;
            if (size as usize) < len + 64 || q.is_null() {
                return Err(CommError::Mpi {
                    rank: self.world_rank,
                    call: "MPI_Win_shared_query",
                    code: -1,
                    message: format!("rank 0's shared part has {size} bytes, {len} needed"),
                });
            }
            let base = q.add(q.align_offset(64));
            if rank == 0 {
                std::ptr::write_bytes(base, 0, len);
            }
            base
        };
        self.barrier(deadline)?;
        Ok(Mapping::new(Arc::new(MpiMemory {
            base: H(base),
            len,
            name,
            _fin: self.fin.clone(),
        })))
    }

    pub(super) fn rank(&self) -> Result<usize, CommError> {
        let mut r: c_int = 0;
        let _mpi = lock();
        // SAFETY: the communicator is valid while `self` lives.
        let rc = unsafe { sys::MPI_Comm_rank(self.comm.0, &mut r) };
        self.ok(rc, "MPI_Comm_rank")?;
        Ok(r as usize)
    }

    pub(super) fn size(&self) -> Result<usize, CommError> {
        let mut n: c_int = 0;
        let _mpi = lock();
        // SAFETY: the communicator is valid while `self` lives.
        let rc = unsafe { sys::MPI_Comm_size(self.comm.0, &mut n) };
        self.ok(rc, "MPI_Comm_size")?;
        Ok(n as usize)
    }

    /// Runs a blocking MPI collective with the watchdog armed: if it has not returned by
    /// `deadline`, the watchdog ends the job naming this rank and `call` (a blocking call
    /// cannot be abandoned). Blocking collectives are used because Open MPI's nonblocking
    /// ones (libnbc) measured 2.3-4.9x slower from 256 KiB up on this machine.
    fn blocking(
        &self,
        call: &'static str,
        deadline: Instant,
        f: impl FnOnce() -> c_int,
    ) -> Result<(), CommError> {
        let _mpi = lock();
        let rc = watchdog::watched(deadline, self.world_rank, call, f);
        self.ok(rc, call)
    }

    /// Allreduce of the elements of `dtype` (f32, f64, i32 or i64) in `data`, in place:
    /// hierarchical (node shared memory, then the nodes' leaders) when the members span
    /// several nodes and some node holds several of them, else `MPI_Allreduce`.
    pub(crate) fn allreduce(
        &self,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        deadline: Instant,
    ) -> Result<(), CommError> {
        match self.hierarchy(deadline)? {
            Some(h) => h.allreduce(data, dtype, op, deadline),
            None => self.allreduce_flat(data, dtype, op, deadline),
        }
    }

    /// `MPI_Allreduce` of the elements of `dtype` (f32, f64, i32 or i64) in `data`, in place.
    pub(crate) fn allreduce_flat(
        &self,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        deadline: Instant,
    ) -> Result<(), CommError> {
        let (ty, size) = datatype(dtype, self.world_rank)?;
        let count = int(data.len() / size, self.world_rank, "MPI_Allreduce")?;
        // In place where the library's MPI_IN_PLACE is known; else from a copy.
        let copy;
        let send: *const c_void = match in_place() {
            Some(p) => p,
            None => {
                copy = data.to_vec();
                copy.as_ptr().cast()
            }
        };
        let op = op_handle(op);
        let comm = self.comm.0;
        self.blocking("MPI_Allreduce", deadline, || {
            // SAFETY: `data` (and `copy`, when used) hold `count` elements and outlive the
            // blocking call; `send` is MPI_IN_PLACE or `copy`.
            unsafe { sys::MPI_Allreduce(send, data.as_mut_ptr().cast(), count, ty, op, comm) }
        })
    }

    /// `MPI_Allgather` or `MPI_Alltoall` (same signature) of `count` bytes per rank from
    /// `send` into `out`.
    fn byte_exchange(
        &self,
        call: &'static str,
        f: ByteExchangeFn,
        send: &[u8],
        out: &mut [u8],
        count: usize,
        deadline: Instant,
    ) -> Result<(), CommError> {
        let count = int(count, self.world_rank, call)?;
        let comm = self.comm.0;
        self.blocking(call, deadline, || {
            // SAFETY: the caller sized `send` and `out` for `count` bytes per rank; both
            // outlive the blocking call; `f` is an MPI function of this signature.
            unsafe {
                f(
                    send.as_ptr().cast(),
                    count,
                    sys::RSMPI_UINT8_T,
                    out.as_mut_ptr().cast(),
                    count,
                    sys::RSMPI_UINT8_T,
                    comm,
                )
            }
        })
    }

    /// `MPI_Allgather` of `mine.len()` bytes per rank into `out`.
    pub(crate) fn allgather(
        &self,
        mine: &[u8],
        out: &mut [u8],
        deadline: Instant,
    ) -> Result<(), CommError> {
        self.byte_exchange(
            "MPI_Allgather",
            sys::MPI_Allgather,
            mine,
            out,
            mine.len(),
            deadline,
        )
    }

    /// `MPI_Bcast` of `data` from `root`.
    pub(crate) fn broadcast(
        &self,
        data: &mut [u8],
        root: usize,
        deadline: Instant,
    ) -> Result<(), CommError> {
        let count = int(data.len(), self.world_rank, "MPI_Bcast")?;
        let comm = self.comm.0;
        self.blocking("MPI_Bcast", deadline, || {
            // SAFETY: `data` outlives the blocking call.
            unsafe {
                sys::MPI_Bcast(
                    data.as_mut_ptr().cast(),
                    count,
                    sys::RSMPI_UINT8_T,
                    root as c_int,
                    comm,
                )
            }
        })
    }

    /// `MPI_Alltoall` of `block` bytes per pair.
    pub(crate) fn all_to_all(
        &self,
        send: &[u8],
        out: &mut [u8],
        block: usize,
        deadline: Instant,
    ) -> Result<(), CommError> {
        self.byte_exchange(
            "MPI_Alltoall",
            sys::MPI_Alltoall,
            send,
            out,
            block,
            deadline,
        )
    }
}

/// Starts MPI (once per process, with `MPI_THREAD_SERIALIZED`: pto serializes its MPI calls)
/// and the watchdog; returns the world communicator, this rank and the rank count.
///
/// # Errors
///
/// MPI was already started by this process, the library lacks `MPI_THREAD_SERIALIZED`,
/// `PTO_MPI_WINDOWS=shared` on several nodes, or an MPI error.
pub(crate) fn start() -> Result<(Arc<MpiComm>, usize, usize), CommError> {
    if STARTED.swap(true, Ordering::SeqCst) {
        return Err(CommError::Env(
            "MPI was already started in this process (pto_comm::mpi::init runs once)".into(),
        ));
    }
    let _mpi = lock();
    let mut provided: c_int = 0;
    // SAFETY: reading a predefined constant.
    let serialized = unsafe { sys::RSMPI_THREAD_SERIALIZED } as c_int;
    // SAFETY: first and only MPI_Init_thread of this process (guarded above); MPI accepts
    // null argc/argv.
    let rc = unsafe {
        sys::MPI_Init_thread(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            serialized,
            &mut provided,
        )
    };
    ok(rc, 0, "MPI_Init_thread")?;
    let fin = Arc::new(Finalizer);
    let (mut rank, mut size, mut local): (c_int, c_int, c_int) = (0, 0, 0);
    // SAFETY: MPI is initialised; out-parameters are written by the calls.
    unsafe {
        sys::MPI_Comm_set_errhandler(sys::RSMPI_COMM_WORLD, sys::RSMPI_ERRORS_RETURN);
        ok(
            sys::MPI_Comm_rank(sys::RSMPI_COMM_WORLD, &mut rank),
            0,
            "MPI_Comm_rank",
        )?;
        ok(
            sys::MPI_Comm_size(sys::RSMPI_COMM_WORLD, &mut size),
            rank as usize,
            "MPI_Comm_size",
        )?;
        let mut node: sys::MPI_Comm = std::mem::zeroed();
        ok(
            sys::MPI_Comm_split_type(
                sys::RSMPI_COMM_WORLD,
                sys::RSMPI_COMM_TYPE_SHARED as c_int,
                0,
                sys::RSMPI_INFO_NULL,
                &mut node,
            ),
            rank as usize,
            "MPI_Comm_split_type",
        )?;
        ok(
            sys::MPI_Comm_size(node, &mut local),
            rank as usize,
            "MPI_Comm_size",
        )?;
        sys::MPI_Comm_free(&mut node);
    }
    let (rank, size) = (rank as usize, size as usize);
    if provided < serialized {
        return Err(CommError::Env(format!(
            "rank {rank}: the MPI library does not provide MPI_THREAD_SERIALIZED (got level {provided})"
        )));
    }
    let one_node = local as usize == size;
    let mode = match std::env::var(ENV_WINDOWS).ok().as_deref() {
        None | Some("") => {
            if one_node {
                Mode::Shared
            } else {
                Mode::Rma
            }
        }
        Some("rma") => Mode::Rma,
        Some("shared") if one_node => Mode::Shared,
        Some("shared") => {
            return Err(CommError::Env(format!(
                "rank {rank}: {ENV_WINDOWS}=shared but the {size} ranks span several nodes"
            )))
        }
        Some(other) => {
            return Err(CommError::Env(format!(
                "rank {rank}: {ENV_WINDOWS}={other:?}: use shared or rma"
            )))
        }
    };
    watchdog::start()?;
    let world = Arc::new(MpiComm {
        // SAFETY: reading the predefined world handle.
        comm: H(unsafe { sys::RSMPI_COMM_WORLD }),
        world_rank: rank,
        mode,
        fin,
        hier: std::sync::OnceLock::new(),
    });
    Ok((world, rank, size))
}

impl MpiComm {
    /// The world's memory: shared by every rank (one node) or this rank's own (nothing of the
    /// world is shared across nodes: barriers and aborts go through MPI).
    pub(crate) fn world_memory(
        &self,
        len: usize,
        rank: usize,
        deadline: Instant,
    ) -> Result<Mapping, CommError> {
        match self.mode {
            Mode::Shared => self.shared_alloc("mpi.world".into(), len, rank, deadline),
            Mode::Rma => Ok(Mapping::from(Arc::new(pto_shm::Segment::anonymous(
                "mpi.world",
                len,
                pto_shm::HeaderInit::default(),
            )?))),
        }
    }

    /// MPI's own blocking `MPI_Allreduce` (f32 sum) from `send` into `recv`.
    pub(crate) fn baseline_allreduce_f32(
        &self,
        send: &[f32],
        recv: &mut [f32],
    ) -> Result<(), CommError> {
        let m = self;
        if recv.len() != send.len() {
            return Err(CommError::BadBuffer {
                name: "baseline allreduce output".into(),
                why: format!("has {} elements, the input {}", recv.len(), send.len()),
            });
        }
        let count = int(send.len(), m.world_rank, "MPI_Allreduce")?;
        let _mpi = lock();
        // SAFETY: both buffers hold `count` f32 and outlive the blocking call; the communicator
        // is valid while `comm` lives.
        let rc = unsafe {
            sys::MPI_Allreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                count,
                sys::RSMPI_FLOAT,
                sys::RSMPI_SUM,
                m.comm.0,
            )
        };
        m.ok(rc, "MPI_Allreduce")
    }
}
