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
//!   faster ([`crate::MPI_NATIVE_BYTES`]; see `docs/BENCHMARKS.md`).
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

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi_sys as ffi;
use parking_lot::{Mutex, ReentrantMutex, ReentrantMutexGuard};
use pto_core::DType;

use crate::comm::{Comm, RankGuard};
use crate::mapping::{Mapping, Memory};
use crate::world::{world_len, Provider, World};
use crate::{CommError, ReduceOp, MAX_RANKS};

/// Chooses the window mode: `shared` or `rma` (default: `shared` when all ranks share a node).
pub const ENV_WINDOWS: &str = "PTO_MPI_WINDOWS";

/// True when this process looks like a rank of an MPI job (Open MPI, MPICH or a PMI launcher
/// set its variables).
pub fn detected() -> bool {
    crate::mpi_launcher().is_some()
}

/// How windows are allocated and accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `MPI_Win_allocate_shared`: direct access, one node only.
    Shared,
    /// `MPI_Win_allocate` with RMA calls: any number of nodes.
    Rma,
}

/// A raw MPI handle (a pointer in Open MPI) that may cross threads.
#[derive(Clone, Copy)]
struct H<T>(T);
// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED (checked in `init`) and every call is
// made under `MPI_LOCK`, so a handle may be used from any thread.
unsafe impl<T> Send for H<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for H<T> {}

/// Calls `MPI_Finalize` when the last handle on MPI state goes.
struct Finalizer;

impl Drop for Finalizer {
    fn drop(&mut self) {
        let _mpi = lock();
        // SAFETY: MPI was initialised by `init`; every window, communicator and piece of MPI
        // memory holds an `Arc<Finalizer>`, so nothing uses MPI after this.
        unsafe {
            ffi::MPI_Finalize();
        }
    }
}

static STARTED: AtomicBool = AtomicBool::new(false);

/// One thread at a time calls MPI (`MPI_THREAD_SERIALIZED`): Open MPI's one-sided component
/// over TCP (`osc pt2pt`) does not support `MPI_THREAD_MULTIPLE`, and chip cores call window
/// operations from several threads. Reentrant, because some operations are built of others;
/// waits take it per poll, never across a wait.
static MPI_LOCK: ReentrantMutex<()> = ReentrantMutex::new(());

fn lock() -> ReentrantMutexGuard<'static, ()> {
    MPI_LOCK.lock()
}

fn error_text(code: c_int) -> String {
    let _mpi = lock();
    let mut buf = [0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_ERROR_STRING (256 in Open MPI and MPICH).
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return format!("MPI error code {code}");
    }
    String::from_utf8_lossy(&buf[..(len.max(0) as usize).min(buf.len())]).into_owned()
}

fn ok(rc: c_int, rank: usize, call: &'static str) -> Result<(), CommError> {
    if rc == 0 {
        Ok(())
    } else {
        let message = error_text(rc);
        tracing::warn!(rank, call, code = rc, message, "MPI call failed");
        Err(CommError::Mpi {
            rank,
            call,
            code: rc,
            message,
        })
    }
}

/// Prints `message` naming `rank` and ends the whole job.
pub(crate) fn abort_job(rank: usize, message: &str) -> ! {
    pto_shm::eprint_line!("pto: rank {rank} aborts the MPI job: {message}");
    // SAFETY: MPI_Abort is callable at any time after MPI_Init; it does not return.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1);
    }
    std::process::abort()
}

/// Between polls of an MPI request: spin briefly, then yield (every `MPI_Test` also drives the
/// operation, so polling must stay frequent while it is moving), and sleep 50 µs only once the
/// wait has lasted 2 ms (a peer is busy elsewhere): ranks may outnumber cores.
fn backoff(round: &mut u32, since: Instant) {
    *round += 1;
    if *round < 64 {
        std::hint::spin_loop();
    } else if since.elapsed() < Duration::from_millis(2) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

fn int(n: usize, rank: usize, call: &'static str) -> Result<c_int, CommError> {
    c_int::try_from(n).map_err(|_| CommError::Mpi {
        rank,
        call,
        code: -1,
        message: format!("{n} elements do not fit MPI's int count"),
    })
}

/// A communicator of the MPI job.
pub(crate) struct MpiComm {
    comm: H<ffi::MPI_Comm>,
    /// This rank in the world (for errors).
    world_rank: usize,
    mode: Mode,
    fin: Arc<Finalizer>,
}

impl MpiComm {
    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    fn ok(&self, rc: c_int, call: &'static str) -> Result<(), CommError> {
        ok(rc, self.world_rank, call)
    }

    /// Completes `req` before `deadline`, or ends the job (MPI cannot cancel a collective).
    fn complete(
        &self,
        mut req: ffi::MPI_Request,
        what: &str,
        deadline: Instant,
    ) -> Result<(), CommError> {
        let mut round = 0;
        let since = Instant::now();
        loop {
            let mut flag: c_int = 0;
            let mpi = lock();
            // SAFETY: `req` is an active request of this process; status is ignored.
            let rc = unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            drop(mpi);
            self.ok(rc, "MPI_Test")?;
            if flag != 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                abort_job(
                    self.world_rank,
                    &format!("{what} did not complete before the deadline (PTO_WAIT_TIMEOUT_MS)"),
                );
            }
            backoff(&mut round, since);
        }
    }

    /// `MPI_Ibarrier`, completed before `deadline`.
    pub(crate) fn barrier(&self, deadline: Instant) -> Result<(), CommError> {
        // SAFETY: a zeroed request handle is overwritten by the call.
        let mut req: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: the communicator is valid while `self` lives.
        let rc = unsafe {
            let _mpi = lock();
            ffi::MPI_Ibarrier(self.comm.0, &mut req)
        };
        self.ok(rc, "MPI_Ibarrier")?;
        self.complete(req, "MPI barrier", deadline)
    }

    /// The smallest and largest `v` over the members.
    pub(crate) fn min_max(&self, v: u64, deadline: Instant) -> Result<(u64, u64), CommError> {
        let send = [v, !v];
        let mut recv = [0u64; 2];
        // SAFETY: zeroed request overwritten by the call.
        let mut req: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: both buffers hold 2 u64 and live until `complete` returns.
        let rc = unsafe {
            let _mpi = lock();
            ffi::MPI_Iallreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                2,
                ffi::RSMPI_UINT64_T,
                ffi::RSMPI_MAX,
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
            let mut wg: ffi::MPI_Group = std::mem::zeroed();
            self.ok(
                ffi::MPI_Comm_group(ffi::RSMPI_COMM_WORLD, &mut wg),
                "MPI_Comm_group",
            )?;
            let mut g: ffi::MPI_Group = std::mem::zeroed();
            let rc = ffi::MPI_Group_incl(wg, ranks.len() as c_int, ranks.as_ptr(), &mut g);
            ffi::MPI_Group_free(&mut wg);
            self.ok(rc, "MPI_Group_incl")?;
            let mut c: ffi::MPI_Comm = std::mem::zeroed();
            let rc = ffi::MPI_Comm_create_group(
                ffi::RSMPI_COMM_WORLD,
                g,
                (tag % 32_768) as c_int,
                &mut c,
            );
            ffi::MPI_Group_free(&mut g);
            self.ok(rc, "MPI_Comm_create_group")?;
            self.ok(
                ffi::MPI_Comm_set_errhandler(c, ffi::RSMPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler",
            )?;
            Ok(MpiComm {
                comm: H(c),
                world_rank: self.world_rank,
                mode: self.mode,
                fin: self.fin.clone(),
            })
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
            let mut win: ffi::MPI_Win = std::mem::zeroed();
            self.ok(
                ffi::MPI_Win_allocate_shared(
                    mine as ffi::MPI_Aint,
                    1,
                    ffi::RSMPI_INFO_NULL,
                    self.comm.0,
                    (&mut p as *mut *mut u8).cast(),
                    &mut win,
                ),
                "MPI_Win_allocate_shared",
            )?;
            self.ok(
                ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN),
                "MPI_Win_set_errhandler",
            )?;
            let mut size: ffi::MPI_Aint = 0;
            let mut disp: c_int = 0;
            let mut q: *mut u8 = std::ptr::null_mut();
            self.ok(
                ffi::MPI_Win_shared_query(
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

    /// An RMA window of `len` bytes per member, zeroed, locked for passive access.
    pub(crate) fn win_allocate(
        self: &Arc<Self>,
        name: String,
        len: usize,
        deadline: Instant,
    ) -> Result<(Mapping, RmaWin), CommError> {
        // SAFETY: out-parameters written by the calls; the memory is owned by MPI until
        // MPI_Finalize (see `shared_alloc`).
        let (base, win, pad) = unsafe {
            let _mpi = lock();
            let mut p: *mut u8 = std::ptr::null_mut();
            let mut win: ffi::MPI_Win = std::mem::zeroed();
            self.ok(
                ffi::MPI_Win_allocate(
                    (len + 64) as ffi::MPI_Aint,
                    1,
                    ffi::RSMPI_INFO_NULL,
                    self.comm.0,
                    (&mut p as *mut *mut u8).cast(),
                    &mut win,
                ),
                "MPI_Win_allocate",
            )?;
            self.ok(
                ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN),
                "MPI_Win_set_errhandler",
            )?;
            // MPI memory need not be 64-aligned (osc pt2pt mallocs it): each member's part
            // starts at its first 64-aligned byte, and the members exchange these pads.
            let pad = p.align_offset(64);
            let p = p.add(pad);
            std::ptr::write_bytes(p, 0, len);
            self.ok(ffi::MPI_Win_lock_all(0, win), "MPI_Win_lock_all")?;
            (p, win, pad)
        };
        let mut pads = vec![0u8; self.size()?];
        // The exchange also serves as the barrier after zeroing.
        self.allgather(&[pad as u8], &mut pads, deadline)?;
        let region = Mapping::new(Arc::new(MpiMemory {
            base: H(base),
            len,
            name,
            _fin: self.fin.clone(),
        }));
        Ok((
            region,
            RmaWin {
                win: H(win),
                me: self.rank()?,
                pads: pads.into_iter().map(usize::from).collect(),
                comm: self.clone(),
            },
        ))
    }

    fn rank(&self) -> Result<usize, CommError> {
        let mut r: c_int = 0;
        let _mpi = lock();
        // SAFETY: the communicator is valid while `self` lives.
        let rc = unsafe { ffi::MPI_Comm_rank(self.comm.0, &mut r) };
        self.ok(rc, "MPI_Comm_rank")?;
        Ok(r as usize)
    }

    fn size(&self) -> Result<usize, CommError> {
        let mut n: c_int = 0;
        let _mpi = lock();
        // SAFETY: the communicator is valid while `self` lives.
        let rc = unsafe { ffi::MPI_Comm_size(self.comm.0, &mut n) };
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
        *WATCH.lock() = Some((deadline, self.world_rank, call));
        let rc = f();
        *WATCH.lock() = None;
        self.ok(rc, call)
    }

    /// `MPI_Allreduce` of the elements of `dtype` (f32, f64, i32 or i64) in `data`, in place.
    pub(crate) fn allreduce(
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
            unsafe { ffi::MPI_Allreduce(send, data.as_mut_ptr().cast(), count, ty, op, comm) }
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
                    ffi::RSMPI_UINT8_T,
                    out.as_mut_ptr().cast(),
                    count,
                    ffi::RSMPI_UINT8_T,
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
            ffi::MPI_Allgather,
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
                ffi::MPI_Bcast(
                    data.as_mut_ptr().cast(),
                    count,
                    ffi::RSMPI_UINT8_T,
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
            ffi::MPI_Alltoall,
            send,
            out,
            block,
            deadline,
        )
    }
}

/// `MPI_IN_PLACE`, which rsmpi does not export: its value is fixed by each library's ABI
/// (`(void *) 1` in Open MPI, `(void *) -1` in MPICH and its derivatives), so it is chosen by
/// the library `MPI_Get_library_version` names; `None` (copy instead) for any other.
fn in_place() -> Option<*const c_void> {
    static KIND: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let v = *KIND.get_or_init(|| {
        let mut buf = vec![0u8; 8192];
        let mut len: c_int = 0;
        let _mpi = lock();
        // SAFETY: the buffer is larger than MPI_MAX_LIBRARY_VERSION_STRING (8192 at most in
        // the libraries we know; the call writes at most that many bytes).
        let rc = unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
        if rc != 0 {
            return None;
        }
        let text =
            String::from_utf8_lossy(&buf[..(len.max(0) as usize).min(buf.len())]).into_owned();
        if text.contains("Open MPI") {
            Some(1)
        } else if text.contains("MPICH")
            || text.contains("Intel(R) MPI")
            || text.contains("MVAPICH")
        {
            Some(usize::MAX)
        } else {
            None
        }
    });
    v.map(|a| a as *const c_void)
}

/// `MPI_Allgather` and `MPI_Alltoall`: send buffer, count, type, receive buffer, count, type,
/// communicator.
type ByteExchangeFn = unsafe extern "C" fn(
    *const c_void,
    c_int,
    ffi::MPI_Datatype,
    *mut c_void,
    c_int,
    ffi::MPI_Datatype,
    ffi::MPI_Comm,
) -> c_int;

/// The blocking MPI call in progress, if any: its deadline, the caller's rank and the call.
/// Calls are serialized by `MPI_LOCK`, so there is at most one.
static WATCH: Mutex<Option<(Instant, usize, &'static str)>> = Mutex::new(None);

/// Starts the thread that ends the job when a blocking MPI call passes its deadline.
fn start_watchdog() -> Result<(), CommError> {
    std::thread::Builder::new()
        .name("pto-mpi-watchdog".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_millis(20));
            let late = match *WATCH.lock() {
                Some((deadline, rank, call)) if Instant::now() > deadline => Some((rank, call)),
                _ => None,
            };
            if let Some((rank, call)) = late {
                abort_job(
                    rank,
                    &format!("{call} did not complete before the deadline (PTO_WAIT_TIMEOUT_MS)"),
                );
            }
        })
        .map(|_| ())
        .map_err(|e| CommError::Env(format!("cannot start the MPI watchdog thread: {e}")))
}

fn datatype(d: DType, rank: usize) -> Result<(ffi::MPI_Datatype, usize), CommError> {
    // SAFETY: reading MPI's predefined datatype handles (initialised statics).
    let ty = unsafe {
        match d {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            _ => {
                return Err(CommError::Mpi {
                    rank,
                    call: "datatype",
                    code: -1,
                    message: format!("MPI has no predefined datatype for {d}"),
                })
            }
        }
    };
    Ok((ty, d.size()))
}

/// True when MPI reduces `d` natively.
pub(crate) fn native_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::I32 | DType::I64)
}

fn op_handle(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: reading MPI's predefined operation handles.
    unsafe {
        match op {
            ReduceOp::Sum => ffi::RSMPI_SUM,
            ReduceOp::Max => ffi::RSMPI_MAX,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Prod => ffi::RSMPI_PROD,
        }
    }
}

/// Memory an MPI window owns (freed by `MPI_Finalize`, which waits for this handle).
struct MpiMemory {
    base: H<*mut u8>,
    len: usize,
    name: String,
    _fin: Arc<Finalizer>,
}

// SAFETY: `base` is the 64-aligned start of `len` bytes of MPI window memory, valid until
// MPI_Finalize, which cannot run while this value holds its `Arc<Finalizer>`.
unsafe impl Memory for MpiMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.base.0
    }
    fn len(&self) -> usize {
        self.len
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// A passive-target RMA window (locked with `MPI_Win_lock_all` for its whole life).
pub(crate) struct RmaWin {
    win: H<ffi::MPI_Win>,
    /// This rank in the window's communicator.
    me: usize,
    /// Per member, where its part starts in its MPI allocation (64-byte alignment).
    pads: Vec<usize>,
    comm: Arc<MpiComm>,
}

impl RmaWin {
    pub(crate) fn comm(&self) -> &Arc<MpiComm> {
        &self.comm
    }

    fn ok(&self, rc: c_int, call: &'static str) -> Result<(), CommError> {
        self.comm.ok(rc, call)
    }

    fn flush(&self, rank: usize) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: the window is locked (lock_all) for its whole life.
        let rc = unsafe { ffi::MPI_Win_flush(rank as c_int, self.win.0) };
        self.ok(rc, "MPI_Win_flush")
    }

    /// Completes every operation this rank issued, at every target, then syncs the local
    /// copy (`MPI_Win_flush_all` + `MPI_Win_sync`).
    pub(crate) fn quiet(&self) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: as in `flush`.
        unsafe {
            self.ok(ffi::MPI_Win_flush_all(self.win.0), "MPI_Win_flush_all")?;
            self.ok(ffi::MPI_Win_sync(self.win.0), "MPI_Win_sync")
        }
    }

    /// Makes data that peers put before a signal this rank observed visible to local loads.
    pub(crate) fn sync(&self) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: as in `flush`.
        self.ok(unsafe { ffi::MPI_Win_sync(self.win.0) }, "MPI_Win_sync")
    }

    /// Runs `op(start, n, displacement)` over `len` bytes at `(rank, offset)` in pieces of at
    /// most 1 GiB (MPI counts are ints), then `complete(rank)` after each piece.
    fn chunked(
        &self,
        rank: usize,
        offset: usize,
        len: usize,
        call: &'static str,
        mut op: impl FnMut(usize, c_int, ffi::MPI_Aint) -> c_int,
        complete: impl Fn(usize) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        const PIECE: usize = 1 << 30;
        let _mpi = lock();
        let mut start = 0;
        while start < len {
            let n = (len - start).min(PIECE);
            let disp = (self.pads[rank] + offset + start) as ffi::MPI_Aint;
            self.ok(op(start, n as c_int, disp), call)?;
            complete(rank)?;
            start += n;
        }
        Ok(())
    }

    /// `MPI_Put` of `src` to `(rank, offset)`, complete at the origin on return.
    pub(crate) fn put(&self, rank: usize, offset: usize, src: &[u8]) -> Result<(), CommError> {
        let win = self.win.0;
        let put = |start: usize, n: c_int, disp: ffi::MPI_Aint| {
            // SAFETY: `start + n <= src.len()`; the target range is inside the window (checked
            // by the caller); `src` stays borrowed until flush_local completes the transfer.
            unsafe {
                ffi::MPI_Put(
                    src.as_ptr().add(start).cast(),
                    n,
                    ffi::RSMPI_UINT8_T,
                    rank as c_int,
                    disp,
                    n,
                    ffi::RSMPI_UINT8_T,
                    win,
                )
            }
        };
        self.chunked(rank, offset, src.len(), "MPI_Put", put, |r| {
            // SAFETY: as in `flush`.
            let rc = unsafe { ffi::MPI_Win_flush_local(r as c_int, win) };
            self.ok(rc, "MPI_Win_flush_local")
        })
    }

    /// `MPI_Get` of `dst.len()` bytes from `(rank, offset)`, complete on return.
    pub(crate) fn get(&self, rank: usize, offset: usize, dst: &mut [u8]) -> Result<(), CommError> {
        if rank == self.me {
            self.sync()?;
        }
        let (win, len, base) = (self.win.0, dst.len(), dst.as_mut_ptr());
        let get = |start: usize, n: c_int, disp: ffi::MPI_Aint| {
            // SAFETY: `start + n <= dst.len()`; `dst` is exclusively borrowed until the flush;
            // the source range is inside the window (checked by the caller).
            unsafe {
                ffi::MPI_Get(
                    base.add(start).cast(),
                    n,
                    ffi::RSMPI_UINT8_T,
                    rank as c_int,
                    disp,
                    n,
                    ffi::RSMPI_UINT8_T,
                    win,
                )
            }
        };
        self.chunked(rank, offset, len, "MPI_Get", get, |r| self.flush(r))
    }

    fn fetch_op<T: bytemuck::Pod + Default>(
        &self,
        rank: usize,
        offset: usize,
        v: T,
        ty: ffi::MPI_Datatype,
        op: ffi::MPI_Op,
    ) -> Result<T, CommError> {
        let _mpi = lock();
        let mut old = T::default();
        // SAFETY: `offset` is aligned and inside the window (checked by the caller); both
        // buffers live until the flush.
        let rc = unsafe {
            ffi::MPI_Fetch_and_op(
                (&v as *const T).cast::<c_void>(),
                (&mut old as *mut T).cast::<c_void>(),
                ty,
                rank as c_int,
                (self.pads[rank] + offset) as ffi::MPI_Aint,
                op,
                self.win.0,
            )
        };
        self.ok(rc, "MPI_Fetch_and_op")?;
        self.flush(rank)?;
        Ok(old)
    }

    /// Atomic fetch-and-add of a `u32`.
    pub(crate) fn fetch_add_u32(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
    ) -> Result<u32, CommError> {
        // SAFETY: predefined handles.
        let (ty, op) = unsafe { (ffi::RSMPI_UINT32_T, ffi::RSMPI_SUM) };
        self.fetch_op(rank, offset, v, ty, op)
    }

    /// Atomic fetch-and-add of a `u64`.
    pub(crate) fn fetch_add_u64(
        &self,
        rank: usize,
        offset: usize,
        v: u64,
    ) -> Result<u64, CommError> {
        // SAFETY: predefined handles.
        let (ty, op) = unsafe { (ffi::RSMPI_UINT64_T, ffi::RSMPI_SUM) };
        self.fetch_op(rank, offset, v, ty, op)
    }

    /// Atomic store of a `u32` (compare-and-swap until it lands); returns the old value.
    fn swap_u32(&self, rank: usize, offset: usize, v: u32) -> Result<u32, CommError> {
        let _mpi = lock();
        let mut cur = self.fetch_add_u32(rank, offset, 0)?;
        loop {
            let mut got: u32 = 0;
            // SAFETY: as in `fetch_op`.
            let rc = unsafe {
                ffi::MPI_Compare_and_swap(
                    (&v as *const u32).cast(),
                    (&cur as *const u32).cast(),
                    (&mut got as *mut u32).cast(),
                    ffi::RSMPI_UINT32_T,
                    rank as c_int,
                    (self.pads[rank] + offset) as ffi::MPI_Aint,
                    self.win.0,
                )
            };
            self.ok(rc, "MPI_Compare_and_swap")?;
            self.flush(rank)?;
            if got == cur {
                return Ok(got);
            }
            cur = got;
        }
    }

    /// A notify: completes this rank's earlier operations everywhere, then updates the signal.
    pub(crate) fn notify(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
        add: bool,
    ) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: as in `flush`.
        let rc = unsafe { ffi::MPI_Win_flush_all(self.win.0) };
        self.ok(rc, "MPI_Win_flush_all")?;
        if add {
            self.accumulate_u32(rank, offset, v)?;
        } else {
            self.swap_u32(rank, offset, v)?;
        }
        Ok(())
    }

    /// `MPI_Accumulate` (`MPI_SUM`) of a `u32`: an atomic add whose old value is not needed,
    /// complete at the target on return.
    pub(crate) fn accumulate_u32(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
    ) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: `offset` is 4-aligned and inside the window (checked by the caller); `v`
        // lives until the flush; predefined handles.
        let rc = unsafe {
            ffi::MPI_Accumulate(
                (&v as *const u32).cast(),
                1,
                ffi::RSMPI_UINT32_T,
                rank as c_int,
                (self.pads[rank] + offset) as ffi::MPI_Aint,
                1,
                ffi::RSMPI_UINT32_T,
                ffi::RSMPI_SUM,
                self.win.0,
            )
        };
        self.ok(rc, "MPI_Accumulate")?;
        self.flush(rank)
    }
}

/// Starts MPI (once per process, with `MPI_THREAD_SERIALIZED`: pto serializes its MPI calls) and returns the world
/// communicator of this rank. Call it from every rank of a job started by `mpirun`.
///
/// # Errors
///
/// MPI was already started by this process, the library lacks `MPI_THREAD_SERIALIZED`, more
/// than [`MAX_RANKS`] ranks, `PTO_MPI_WINDOWS=shared` on several nodes, or an MPI error.
pub fn init() -> Result<Comm, CommError> {
    if STARTED.swap(true, Ordering::SeqCst) {
        return Err(CommError::Env(
            "MPI was already started in this process (pto_comm::mpi::init runs once)".into(),
        ));
    }
    let _mpi = lock();
    let mut provided: c_int = 0;
    // SAFETY: reading a predefined constant.
    let serialized = unsafe { ffi::RSMPI_THREAD_SERIALIZED } as c_int;
    // SAFETY: first and only MPI_Init_thread of this process (guarded above); MPI accepts
    // null argc/argv.
    let rc = unsafe {
        ffi::MPI_Init_thread(
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
        ffi::MPI_Comm_set_errhandler(ffi::RSMPI_COMM_WORLD, ffi::RSMPI_ERRORS_RETURN);
        ok(
            ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank),
            0,
            "MPI_Comm_rank",
        )?;
        ok(
            ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size),
            rank as usize,
            "MPI_Comm_size",
        )?;
        let mut node: ffi::MPI_Comm = std::mem::zeroed();
        ok(
            ffi::MPI_Comm_split_type(
                ffi::RSMPI_COMM_WORLD,
                ffi::RSMPI_COMM_TYPE_SHARED as c_int,
                0,
                ffi::RSMPI_INFO_NULL,
                &mut node,
            ),
            rank as usize,
            "MPI_Comm_split_type",
        )?;
        ok(
            ffi::MPI_Comm_size(node, &mut local),
            rank as usize,
            "MPI_Comm_size",
        )?;
        ffi::MPI_Comm_free(&mut node);
    }
    let (rank, size) = (rank as usize, size as usize);
    if provided < serialized {
        return Err(CommError::Env(format!(
            "rank {rank}: the MPI library does not provide MPI_THREAD_SERIALIZED (got level {provided})"
        )));
    }
    if size > MAX_RANKS {
        return Err(CommError::BadSize {
            size,
            max: MAX_RANKS,
        });
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
    start_watchdog()?;
    let world_comm = Arc::new(MpiComm {
        // SAFETY: reading the predefined world handle.
        comm: H(unsafe { ffi::RSMPI_COMM_WORLD }),
        world_rank: rank,
        mode,
        fin,
    });
    let timeout = crate::env_timeout()?;
    let deadline = Instant::now() + timeout;
    let len = world_len(size).max(pto_shm::HEADER_LEN);
    let seg = match mode {
        Mode::Shared => world_comm.shared_alloc("mpi.world".into(), len, rank, deadline)?,
        // Nothing of the world is shared across nodes: the control words are this rank's own
        // (barriers and aborts go through MPI).
        Mode::Rma => Mapping::from(Arc::new(pto_shm::Segment::anonymous(
            "mpi.world",
            len,
            pto_shm::HeaderInit::default(),
        )?)),
    };
    let world = Arc::new(World {
        seg,
        size,
        provider: Provider::Mpi(world_comm),
        prefix: "mpi".into(),
        timeout,
    });
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
    let Some(m) = &comm.inner.mpi else {
        return Err(CommError::Env(
            "baseline_allreduce_f32 needs a communicator of the mpi backend".into(),
        ));
    };
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
        ffi::MPI_Allreduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            count,
            ffi::RSMPI_FLOAT,
            ffi::RSMPI_SUM,
            m.comm.0,
        )
    };
    m.ok(rc, "MPI_Allreduce")
}
