//! The backend boundary: the one place where pto-comm's protocols meet the ways ranks reach
//! each other. Everything above it (the world, communicators, windows, signals, collectives)
//! is written once; every window, signal and barrier operation of every backend passes
//! through the three types here, so that a checker can observe them at one place:
//!
//! | type | what it answers |
//! |---|---|
//! | [`Transport`] | where a world's ranks run ([`Backend`]) and where its named segments come from |
//! | [`CommIo`] | how a communicator's members meet: barrier words they share, or a library communicator |
//! | [`WindowIo`] | how a window reaches a peer's part: loads and stores on mapped memory, or RMA calls |
//!
//! This module imports nothing above it (only the error type and the reduction vocabulary,
//! which sit below everything). Its files:
//!
//! | file | what it holds |
//! |---|---|
//! | `direct.rs` | [`direct::PeerMemory`]: reading a peer's private buffer where it is (single-copy collectives) |
//! | `mapping.rs` | [`mapping::Mapping`]: memory every member maps, with checked accessors |
//! | `mapped.rs` | barriers and window operations on mapped memory |
//! | `queue.rs` | a completion queue in a shared segment |
//! | `mpi/` | the MPI library: calls (`ffi.rs`), RMA windows (`rma.rs`), the watchdog of blocking calls (`watchdog.rs`) |
//! | `mpi_off.rs` | value-less stand-ins for `mpi/` when the `mpi` feature is off |
//!
//! `unsafe` code of pto-comm lives here only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use pto_core::{DType, ExternalMemory};
use pto_shm::wait::WaitError;
use pto_shm::{HeaderInit, Segment, ShmError};

use crate::error::CommError;

pub(crate) mod direct;
pub(crate) mod mapped;
pub(crate) mod mapping;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
#[cfg(not(feature = "mpi"))]
pub(crate) mod mpi_off;
#[cfg(not(feature = "mpi"))]
pub(crate) use mpi_off as mpi;
pub(crate) mod queue;

use mapped::{MappedComm, MappedWindow};
use mapping::Mapping;
use mpi::rma::RmaWin;
use mpi::MpiComm;

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

/// A communication library's own communicator: its barrier, agreement and collectives serve
/// a communicator's when peers cannot (or should not) be reached through mapped memory.
pub(crate) type Library = MpiComm;

/// True when the library reduces `d` itself (others are gathered and combined by pto).
pub(crate) fn library_reduces(d: DType) -> bool {
    mpi::reduces(d)
}

/// A wait that ended without its condition, as a [`CommError`] naming `what` and `rank`.
pub(crate) fn wait_err(
    what: impl FnOnce() -> String,
    rank: usize,
) -> impl FnOnce(WaitError<CommError>) -> CommError {
    move |e| match e {
        WaitError::Check(e) => {
            tracing::debug!(rank, error = %e, "wait ended by a peer's failure");
            e
        }
        WaitError::Timeout { waited } => {
            let what = what();
            tracing::debug!(rank, what, ?waited, "wait deadline passed");
            CommError::Timeout { what, rank, waited }
        }
    }
}

/// Process-local registry of anonymous segments: the `local` backend's `/dev/shm`.
#[derive(Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<String, Arc<Segment>>>,
    cv: Condvar,
}

/// Where a world's ranks run, with what that needs.
pub(crate) enum Transport {
    /// Threads of this process: segments are anonymous mappings found in a registry.
    Local(Registry),
    /// Processes on one host: named POSIX shared-memory segments.
    Shm,
    /// The processes of an MPI job: the world's library communicator.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Mpi(Arc<Library>),
}

impl Transport {
    pub(crate) fn backend(&self) -> Backend {
        match self {
            Transport::Local(_) => Backend::Local,
            Transport::Shm => Backend::Shm,
            Transport::Mpi(_) => Backend::Mpi,
        }
    }

    /// The memory of a new world of `len` bytes, and the prefix of its segments' names.
    /// `rank` creates it on library transports (every rank calls this there); elsewhere the
    /// launcher does, once.
    pub(crate) fn world_memory(
        &self,
        len: usize,
        init: HeaderInit,
        rank: usize,
        deadline: Instant,
    ) -> Result<(Mapping, String), CommError> {
        match self {
            Transport::Shm => {
                let name = Segment::fresh_name("world");
                let prefix = name.trim_end_matches(".world").to_string();
                let seg = Segment::create(&name, len, init)?;
                Ok((Mapping::from(Arc::new(seg)), prefix))
            }
            Transport::Local(_) => {
                let prefix = format!("local.{:016x}", pto_shm::nonce());
                let seg = Segment::anonymous(&format!("{prefix}.world"), len, init)?;
                Ok((Mapping::from(Arc::new(seg)), prefix))
            }
            Transport::Mpi(m) => Ok((m.world_memory(len, rank, deadline)?, "mpi".into())),
        }
    }

    /// True when peers are processes of this host whose pids can be watched.
    pub(crate) fn watches_pids(&self) -> bool {
        match self {
            Transport::Shm => true,
            Transport::Mpi(m) => m.peers_mapped(),
            Transport::Local(_) => false,
        }
    }

    /// How a communicator's members (`(world rank, pid)` in comm rank order) reach each
    /// other's private memory: threads read it, processes of this host read it with
    /// cross-memory attach where the kernel allows it (and `PTO_SINGLE_COPY` is not `0`).
    /// Every member calls it before any peer reads (it may allow peers to read this process).
    pub(crate) fn peer_memory(&self, members: Vec<(usize, u32)>) -> direct::PeerMemory {
        if std::env::var("PTO_SINGLE_COPY").is_ok_and(|v| v.trim() == "0") {
            return direct::PeerMemory::None;
        }
        match self {
            Transport::Local(_) => direct::PeerMemory::Threads,
            Transport::Shm => {
                if pto_shm::cma::allow_peer_readers().is_ok() && pto_shm::cma::available() {
                    direct::PeerMemory::Processes(members)
                } else {
                    direct::PeerMemory::None
                }
            }
            Transport::Mpi(_) => direct::PeerMemory::None,
        }
    }

    /// After an abort was raised: a library job is ended at once (peers may be on other nodes,
    /// inside library calls that no abort word reaches).
    pub(crate) fn on_abort(&self, rank: usize, message: &str) {
        if let Transport::Mpi(_) = self {
            mpi::abort_job(rank, message);
        }
    }

    /// The world communicator's means of meeting: barrier words in the world's control area,
    /// or the library communicator.
    pub(crate) fn world_io(&self, ctrl: Mapping, barrier_off: usize, pair_off: usize) -> CommIo {
        match self {
            Transport::Mpi(m) => CommIo::Library(m.clone()),
            _ => CommIo::Mapped(MappedComm::new(ctrl, barrier_off, pair_off)),
        }
    }

    /// Creates a named child segment (domain control or window).
    pub(crate) fn create(
        &self,
        name: &str,
        len: usize,
        init: HeaderInit,
    ) -> Result<Arc<Segment>, CommError> {
        match self {
            Transport::Shm | Transport::Mpi(_) => Ok(Arc::new(Segment::create(name, len, init)?)),
            Transport::Local(reg) => {
                let seg = Arc::new(Segment::anonymous(name, len, init)?);
                reg.map.lock().insert(name.to_string(), seg.clone());
                reg.cv.notify_all();
                Ok(seg)
            }
        }
    }

    /// Opens the named child segment if it exists by `until`.
    pub(crate) fn open(
        &self,
        name: &str,
        until: Instant,
    ) -> Result<Option<Arc<Segment>>, CommError> {
        match self {
            Transport::Shm | Transport::Mpi(_) => match Segment::open(name, until) {
                Ok(s) => Ok(Some(Arc::new(s))),
                Err(ShmError::Timeout { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Transport::Local(reg) => {
                let mut map = reg.map.lock();
                if let Some(s) = map.get(name) {
                    return Ok(Some(s.clone()));
                }
                reg.cv.wait_until(&mut map, until);
                Ok(map.get(name).cloned())
            }
        }
    }

    /// Forgets a child segment this process created (the registry's reference).
    pub(crate) fn forget(&self, name: &str) {
        if let Transport::Local(reg) = self {
            reg.map.lock().remove(name);
        }
    }
}

/// How a communicator's members meet.
pub(crate) enum CommIo {
    /// Barrier words in memory every member maps.
    Mapped(MappedComm),
    /// A library communicator: barriers, agreements and (some) collectives are its calls.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Library(Arc<Library>),
}

impl CommIo {
    /// Waits until all `n` members arrived.
    pub(crate) fn barrier(
        &self,
        me: usize,
        n: usize,
        deadline: Instant,
        check: impl FnMut() -> Result<(), CommError>,
    ) -> Result<(), WaitError<CommError>> {
        match self {
            CommIo::Mapped(m) => m.barrier(me, n, deadline, check),
            CommIo::Library(l) => l.barrier(deadline).map_err(WaitError::Check),
        }
    }

    /// The library communicator, when there is one.
    pub(crate) fn library(&self) -> Option<&Arc<Library>> {
        match self {
            CommIo::Mapped(_) => None,
            CommIo::Library(l) => Some(l),
        }
    }

    /// On a library communicator: the smallest and largest `v` over the members (`None` on
    /// mapped ones, whose protocols compare values in shared memory).
    pub(crate) fn agree(&self, v: u64, deadline: Instant) -> Result<Option<(u64, u64)>, CommError> {
        match self {
            CommIo::Mapped(_) => Ok(None),
            CommIo::Library(l) => l.min_max(v, deadline).map(Some),
        }
    }

    /// On a library communicator: a library communicator over `members` (world ranks; only
    /// they call this), `None` on mapped ones.
    pub(crate) fn subgroup(&self, members: &[u32], tag: u64) -> Result<Option<CommIo>, CommError> {
        match self {
            CommIo::Mapped(_) => Ok(None),
            CommIo::Library(l) => Ok(Some(CommIo::Library(Arc::new(
                l.create_group(members, tag)?,
            )))),
        }
    }

    /// On a library communicator: a window of `stride` bytes per member (`len` bytes in all
    /// when peers are mapped), zeroed on every member before this returns; `None` on mapped
    /// communicators (the caller creates a segment).
    pub(crate) fn library_window(
        &self,
        name: String,
        stride: usize,
        size: usize,
        len: usize,
        rank: usize,
        deadline: Instant,
    ) -> Result<Option<WindowIo>, CommError> {
        let CommIo::Library(l) = self else {
            return Ok(None);
        };
        if l.peers_mapped() {
            let seg = l.shared_alloc(name, len, rank, deadline)?;
            Ok(Some(WindowIo::Mapped(MappedWindow::new(seg, stride, size))))
        } else {
            Ok(Some(WindowIo::Rma(l.win_allocate(name, stride, deadline)?)))
        }
    }
}

/// How a window reaches a peer's part. Ranks and ranges are checked by the caller.
pub(crate) enum WindowIo {
    /// Every part is mapped here: loads, stores and atomic instructions.
    Mapped(MappedWindow),
    /// Parts are reached through RMA calls; only this rank's own part is mapped.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Rma(RmaWin),
}

impl WindowIo {
    /// A mapped window over `seg`.
    pub(crate) fn mapped(seg: Mapping, stride: usize, size: usize) -> WindowIo {
        WindowIo::Mapped(MappedWindow::new(seg, stride, size))
    }

    /// Bytes a mapped window of `n` parts of `stride` bytes needs, if it fits in memory.
    pub(crate) fn mapped_bytes(stride: usize, n: usize) -> Option<usize> {
        MappedWindow::bytes_for(stride, n)
    }

    /// Zeroes `rank`'s part of a mapped window (RMA windows are zeroed at allocation).
    pub(crate) fn zero(&self, rank: usize) {
        if let WindowIo::Mapped(m) = self {
            m.zero(rank);
        }
    }

    pub(crate) fn put(&self, rank: usize, offset: usize, src: &[u8]) -> Result<(), CommError> {
        match self {
            WindowIo::Mapped(m) => {
                m.put(rank, offset, src);
                Ok(())
            }
            WindowIo::Rma(r) => r.put(rank, offset, src),
        }
    }

    pub(crate) fn get(&self, rank: usize, offset: usize, dst: &mut [u8]) -> Result<(), CommError> {
        match self {
            WindowIo::Mapped(m) => {
                m.get(rank, offset, dst);
                Ok(())
            }
            WindowIo::Rma(r) => r.get(rank, offset, dst),
        }
    }

    pub(crate) fn fetch_add_u32(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
    ) -> Result<u32, CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.fetch_add_u32(rank, offset, v)),
            WindowIo::Rma(r) => r.fetch_add_u32(rank, offset, v),
        }
    }

    pub(crate) fn fetch_add_u64(
        &self,
        rank: usize,
        offset: usize,
        v: u64,
    ) -> Result<u64, CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.fetch_add_u64(rank, offset, v)),
            WindowIo::Rma(r) => r.fetch_add_u64(rank, offset, v),
        }
    }

    pub(crate) fn load_u32(&self, rank: usize, offset: usize) -> Result<u32, CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.load_u32(rank, offset)),
            WindowIo::Rma(r) => r.fetch_add_u32(rank, offset, 0),
        }
    }

    pub(crate) fn load_u64(&self, rank: usize, offset: usize) -> Result<u64, CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.load_u64(rank, offset)),
            WindowIo::Rma(r) => r.fetch_add_u64(rank, offset, 0),
        }
    }

    /// Adds (`add`) or stores `v` into the signal at `(rank, offset)`, after everything this
    /// rank wrote before, and wakes the target if it waits.
    pub(crate) fn notify(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
        add: bool,
    ) -> Result<(), CommError> {
        match self {
            WindowIo::Mapped(m) => {
                m.notify(rank, offset, v, add);
                Ok(())
            }
            WindowIo::Rma(r) => r.notify(rank, offset, v, add),
        }
    }

    /// Waits until this rank's (`me`) signal at `offset` satisfies `reached`; returns its
    /// value then, with the data put before it visible.
    pub(crate) fn wait(
        &self,
        me: usize,
        offset: usize,
        reached: impl Fn(u32) -> bool,
        deadline: Instant,
        check: impl FnMut() -> Result<(), CommError>,
    ) -> Result<u32, WaitError<CommError>> {
        match self {
            WindowIo::Mapped(m) => m.wait(me, offset, reached, deadline, check),
            WindowIo::Rma(r) => pto_shm::wait::bounded(
                deadline,
                // Polling drives the library's progress: look often, nap briefly.
                pto_shm::wait::Pause::Backoff {
                    nap: Duration::from_micros(20),
                },
                || {
                    let v = r.fetch_add_u32(me, offset, 0)?;
                    if reached(v) {
                        r.sync()?;
                        return Ok(Some(v));
                    }
                    Ok(None)
                },
                check,
            ),
        }
    }

    /// One look at the signal at `(rank, offset)`: its value once `reached` holds (with the
    /// data put before it visible), else `None`.
    pub(crate) fn poll(
        &self,
        rank: usize,
        offset: usize,
        reached: impl Fn(u32) -> bool,
    ) -> Result<Option<u32>, CommError> {
        let v = self.load_u32(rank, offset)?;
        if !reached(v) {
            return Ok(None);
        }
        if let WindowIo::Rma(r) = self {
            r.sync()?;
        }
        Ok(Some(v))
    }

    /// Completes every operation this rank issued (visible to every peer), then a full fence.
    /// An RMA window that cannot complete them ends the job naming `world_rank`: operations
    /// may be lost, so the program cannot go on correctly.
    pub(crate) fn quiet(&self, world_rank: usize) {
        if let WindowIo::Rma(r) = self {
            if let Err(e) = r.quiet() {
                mpi::abort_job(world_rank, &e.to_string());
            }
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// The window's own barrier words (mapped windows of mapped communicators).
    pub(crate) fn barrier(
        &self,
        n: usize,
        deadline: Instant,
        check: impl FnMut() -> Result<(), CommError>,
    ) -> Result<(), WaitError<CommError>> {
        match self {
            WindowIo::Mapped(m) => m.barrier(n, deadline, check),
            WindowIo::Rma(r) => r.comm().barrier(deadline).map_err(WaitError::Check),
        }
    }

    /// A pointer to `rank`'s part (`me` is this rank): every part of a mapped window, only
    /// this rank's own of an RMA window.
    pub(crate) fn peer_ptr(&self, rank: usize, me: usize) -> Result<*mut u8, CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.peer_ptr(rank)),
            WindowIo::Rma(r) if rank == me => Ok(r.local().as_ptr()),
            WindowIo::Rma(_) => Err(CommError::NotMapped {
                rank,
                why: "an RMA window: use put and get",
            }),
        }
    }

    /// `len` elements of `T` at `offset` in `rank`'s part (`me` is this rank), read in place:
    /// any part of a mapped window, only this rank's own of an RMA window. Only for the
    /// collectives' epoch protocol, which guarantees that nobody writes the area meanwhile
    /// (see [`MappedWindow::area`]).
    pub(crate) fn area<T: bytemuck::Pod>(
        &self,
        rank: usize,
        me: usize,
        offset: usize,
        len: usize,
    ) -> Result<&[T], CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.area(rank, offset, len)),
            WindowIo::Rma(r) if rank == me => Ok(mapped::slice(r.local(), offset, len)),
            WindowIo::Rma(_) => Err(CommError::NotMapped {
                rank,
                why: "an RMA window: use put and get",
            }),
        }
    }

    /// [`WindowIo::area`], writable: only for areas no other rank reads or writes during the
    /// call (each rank owns its share of an in-window allreduce; see
    /// [`MappedWindow::area_mut`]).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn area_mut<T: bytemuck::Pod>(
        &self,
        rank: usize,
        me: usize,
        offset: usize,
        len: usize,
    ) -> Result<&mut [T], CommError> {
        match self {
            WindowIo::Mapped(m) => Ok(m.area_mut(rank, offset, len)),
            WindowIo::Rma(r) if rank == me => Ok(mapped::slice_mut(r.local(), offset, len)),
            WindowIo::Rma(_) => Err(CommError::NotMapped {
                rank,
                why: "an RMA window: use put and get",
            }),
        }
    }

    /// This rank's (`me`) part, lendable to pto-core as a buffer.
    pub(crate) fn local_memory(&self, me: usize, size: usize) -> Box<dyn ExternalMemory> {
        match self {
            WindowIo::Mapped(m) => m.local_memory(me),
            WindowIo::Rma(r) => Box::new(mapped::LocalPart {
                seg: r.local().clone(),
                offset: 0,
                len: size,
            }),
        }
    }

    /// The library communicator whose collectives serve this window's, when peers' parts are
    /// not mapped (RMA windows).
    pub(crate) fn library(&self) -> Option<&Arc<Library>> {
        match self {
            WindowIo::Mapped(_) => None,
            WindowIo::Rma(r) => Some(r.comm()),
        }
    }
}
