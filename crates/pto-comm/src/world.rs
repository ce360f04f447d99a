//! The world: the control segment every rank maps, the rank table, the abort word, and the
//! provider that creates and opens the segments of domains and windows.
//!
//! Layout of the world segment (after the 256-byte [`pto_shm::Header`]):
//!
//! | offset | what |
//! |---|---|
//! | 256 | abort word: 0, or the aborting world rank + 1 |
//! | 320 | world barrier ([`pto_shm::barrier::Barrier`], 128 bytes) |
//! | 448 | abort message (256 bytes, written before the abort word) |
//! | 704 | pair-barrier flags: two 64-byte lines `{arrivals: u32, sleepers: u32}` |
//! | 832 | rank table: per rank `{pid: u32, state: u32, start: u64}` |
//!
//! See `docs/design/comm-windows.md`.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use pto_shm::barrier::Barrier;
use pto_shm::process::ProcessId;
use pto_shm::segment_kind;
use pto_shm::{HeaderInit, Segment, ShmError, HEADER_LEN};

use crate::mapping::Mapping;
use crate::{Backend, CommError, MAX_RANKS};

pub(crate) const OFF_ABORT: usize = 256;
pub(crate) const OFF_BARRIER: usize = 320;
pub(crate) const OFF_ABORT_MSG: usize = 448;
pub(crate) const ABORT_MSG_LEN: usize = 256;
/// Two flag lines (for a two-rank communicator's barrier), 64 bytes each.
pub(crate) const OFF_PAIR: usize = 704;
pub(crate) const OFF_RANKS: usize = 832;
const _: () =
    assert!(OFF_BARRIER.is_multiple_of(64) && OFF_BARRIER + Barrier::SIZE <= OFF_ABORT_MSG);
pub(crate) const RANK_SLOT: usize = 16;

/// A rank's state in the table.
pub(crate) const NOT_JOINED: u32 = 0;
pub(crate) const RUNNING: u32 = 1;
pub(crate) const EXITED: u32 = 2;
pub(crate) const FAILED: u32 = 3;

pub(crate) fn world_len(n: usize) -> usize {
    OFF_RANKS + n * RANK_SLOT
}

/// Process-local registry of anonymous segments: the `local` backend's `/dev/shm`.
#[derive(Default)]
pub(crate) struct LocalRegistry {
    map: Mutex<HashMap<String, Arc<Segment>>>,
    cv: Condvar,
}

pub(crate) enum Provider {
    Local(LocalRegistry),
    Shm,
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    /// An MPI job: the world communicator (domains and windows are MPI allocations).
    Mpi(Arc<crate::mpi::MpiComm>),
}

/// Everything the ranks of one world share.
pub(crate) struct World {
    pub(crate) seg: Mapping,
    pub(crate) size: usize,
    pub(crate) provider: Provider,
    /// Prefix of the names of this world's domain and window segments.
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
}

impl World {
    pub(crate) fn backend(&self) -> Backend {
        match self.provider {
            Provider::Local(_) => Backend::Local,
            Provider::Shm => Backend::Shm,
            Provider::Mpi(_) => Backend::Mpi,
        }
    }

    /// The MPI world communicator, on the mpi backend.
    pub(crate) fn mpi(&self) -> Option<&Arc<crate::mpi::MpiComm>> {
        match &self.provider {
            Provider::Mpi(m) => Some(m),
            _ => None,
        }
    }

    fn slot(&self, rank: usize) -> (&AtomicU32, &AtomicU32, &AtomicU64) {
        let off = OFF_RANKS + rank * RANK_SLOT;
        (
            self.seg.atomic_u32(off),
            self.seg.atomic_u32(off + 4),
            self.seg.atomic_u64(off + 8),
        )
    }

    pub(crate) fn barrier(&self) -> &Barrier {
        // SAFETY: the world segment holds a zero-initialised `Barrier` (16 bytes of atomics,
        // 4-aligned) at OFF_BARRIER, inside its length; it is only accessed atomically.
        unsafe { &*self.seg.as_ptr().add(OFF_BARRIER).cast::<Barrier>() }
    }

    /// Claims `rank`'s slot for this process.
    pub(crate) fn join(&self, rank: usize) -> Result<(), CommError> {
        let me = ProcessId::current();
        let (pid, state, start) = self.slot(rank);
        match state.compare_exchange(NOT_JOINED, RUNNING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                tracing::debug!(
                    rank,
                    size = self.size,
                    backend = self.backend().name(),
                    "joined the world"
                );
                start.store(me.start, Ordering::Relaxed);
                pid.store(me.pid, Ordering::Release);
                Ok(())
            }
            Err(_) => Err(CommError::AlreadyJoined {
                rank,
                pid: pid.load(Ordering::Acquire),
            }),
        }
    }

    /// Marks `rank` exited (cleanly) or failed.
    pub(crate) fn leave(&self, rank: usize, failed: bool) {
        let (_, state, _) = self.slot(rank);
        state.store(if failed { FAILED } else { EXITED }, Ordering::Release);
    }

    /// True once `rank` has joined (its slot is no longer free).
    pub(crate) fn joined(&self, rank: usize) -> bool {
        rank < self.size && self.slot(rank).1.load(Ordering::Acquire) != NOT_JOINED
    }

    /// Marks `rank` failed from outside (a launcher that reaped it).
    pub(crate) fn mark_failed(&self, rank: usize) {
        if rank < self.size {
            let (_, state, _) = self.slot(rank);
            let _ = state.compare_exchange(RUNNING, FAILED, Ordering::AcqRel, Ordering::Acquire);
            let _ = state.compare_exchange(NOT_JOINED, FAILED, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Raises an abort (first one wins) and records its message.
    pub(crate) fn abort(&self, rank: usize, message: &str) {
        let word = self.seg.atomic_u32(OFF_ABORT);
        if word.load(Ordering::Acquire) != 0 {
            return;
        }
        let bytes = message.as_bytes();
        let n = bytes.len().min(ABORT_MSG_LEN - 1);
        // SAFETY: the message area is ABORT_MSG_LEN bytes inside the segment; concurrent
        // aborters may interleave their bytes, but readers only read it after the abort word
        // is set and treat it as lossy UTF-8, so any bytes are acceptable.
        unsafe {
            let p = self.seg.as_ptr().add(OFF_ABORT_MSG);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, n);
            p.add(n).write(0);
        }
        let _ = word.compare_exchange(0, rank as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
        if self.mpi().is_some() {
            // Peers may be on other nodes and inside MPI calls: end the job.
            crate::mpi::abort_job(rank, message);
        }
        self.barrier().poke();
    }

    fn aborted(&self) -> Option<CommError> {
        let w = self.seg.atomic_u32(OFF_ABORT).load(Ordering::Acquire);
        if w == 0 {
            return None;
        }
        let mut buf = [0u8; ABORT_MSG_LEN];
        // SAFETY: reading the message area (inside the segment) after the abort word; racing
        // writers can only make the text garbled, never out of bounds.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.seg.as_ptr().add(OFF_ABORT_MSG),
                buf.as_mut_ptr(),
                ABORT_MSG_LEN,
            );
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(ABORT_MSG_LEN);
        Some(CommError::Aborted {
            rank: (w - 1) as usize,
            message: String::from_utf8_lossy(&buf[..end]).into_owned(),
        })
    }

    /// The cheap part of [`World::check`]: the abort word only (no system call), for the
    /// start of every collective.
    pub(crate) fn check_abort(&self) -> Result<(), CommError> {
        match self.aborted() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Errors when the world was aborted or one of `peers` (world ranks) is dead, failed or
    /// gone. Ranks that have not joined yet are assumed to be starting. Reads `/proc` for
    /// every running peer on the shm backend: waits call it every few milliseconds, not on
    /// every operation.
    pub(crate) fn check(&self, me: usize, peers: &[u32]) -> Result<(), CommError> {
        if let Some(e) = self.aborted() {
            return Err(e);
        }
        // Processes on this host (shm, or MPI with shared windows) have pids to watch; an MPI
        // launcher ends the job itself when a rank dies.
        let shm = match &self.provider {
            Provider::Shm => true,
            Provider::Mpi(m) => m.mode() == crate::mpi::Mode::Shared,
            Provider::Local(_) => false,
        };
        // A dead or failed peer is the cause; a peer that exited may only have reacted to it,
        // so it is reported only when no peer is dead or failed.
        let mut exited = None;
        for &p in peers {
            let p = p as usize;
            if p == me {
                continue;
            }
            let (pid, state, start) = self.slot(p);
            match state.load(Ordering::Acquire) {
                FAILED => {
                    return Err(CommError::PeerGone {
                        rank: p,
                        how: "failed",
                    })
                }
                EXITED => exited = exited.or(Some(p)),
                RUNNING if shm => {
                    let id = ProcessId {
                        pid: pid.load(Ordering::Acquire),
                        start: start.load(Ordering::Relaxed),
                    };
                    if id.pid != 0 && !id.is_alive() {
                        return Err(CommError::PeerDied {
                            rank: p,
                            pid: id.pid,
                        });
                    }
                }
                _ => {}
            }
        }
        match exited {
            Some(rank) => Err(CommError::PeerGone {
                rank,
                how: "exited",
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Creates a child segment (domain control or window).
    pub(crate) fn create(
        &self,
        name: &str,
        len: usize,
        init: HeaderInit,
    ) -> Result<Arc<Segment>, CommError> {
        match &self.provider {
            Provider::Shm | Provider::Mpi(_) => Ok(Arc::new(Segment::create(name, len, init)?)),
            Provider::Local(reg) => {
                let seg = Arc::new(Segment::anonymous(name, len, init)?);
                reg.map.lock().insert(name.to_string(), seg.clone());
                reg.cv.notify_all();
                Ok(seg)
            }
        }
    }

    /// Opens a child segment created by `creator` (a world rank), watching its liveness.
    pub(crate) fn open(
        &self,
        name: &str,
        me: usize,
        creator: u32,
        deadline: Instant,
    ) -> Result<Arc<Segment>, CommError> {
        let start = Instant::now();
        loop {
            self.check(me, &[creator])?;
            let slice = (Instant::now() + Duration::from_millis(50)).min(deadline);
            let got = match &self.provider {
                Provider::Shm | Provider::Mpi(_) => match Segment::open(name, slice) {
                    Ok(s) => Some(Arc::new(s)),
                    Err(ShmError::Timeout { .. }) => None,
                    Err(e) => return Err(e.into()),
                },
                Provider::Local(reg) => {
                    let mut map = reg.map.lock();
                    if let Some(s) = map.get(name) {
                        Some(s.clone())
                    } else {
                        reg.cv.wait_until(&mut map, slice);
                        map.get(name).cloned()
                    }
                }
            };
            if let Some(s) = got {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    what: format!("opening segment {name} created by rank {creator}"),
                    rank: me,
                    waited: start.elapsed(),
                });
            }
        }
    }

    /// Forgets a child segment this process created (local backend bookkeeping).
    pub(crate) fn forget(&self, name: &str) {
        if let Provider::Local(reg) = &self.provider {
            reg.map.lock().remove(name);
        }
    }
}

/// A world has 1 to `MAX_RANKS` ranks.
fn check_size(size: usize) -> Result<(), CommError> {
    if size == 0 || size > MAX_RANKS {
        return Err(CommError::BadSize {
            size,
            max: MAX_RANKS,
        });
    }
    Ok(())
}

/// Creates a world control segment for `size` ranks.
pub(crate) fn create_world(
    size: usize,
    provider: Provider,
    timeout: Duration,
) -> Result<World, CommError> {
    check_size(size)?;
    let init = HeaderInit {
        kind: segment_kind::WORLD,
        nranks: size as u32,
        ..HeaderInit::default()
    };
    let len = world_len(size).max(HEADER_LEN);
    let (seg, prefix) = match provider {
        Provider::Shm | Provider::Mpi(_) => {
            let name = Segment::fresh_name("world");
            let prefix = name.trim_end_matches(".world").to_string();
            (Segment::create(&name, len, init)?, prefix)
        }
        Provider::Local(_) => {
            let prefix = format!("local.{:016x}", pto_shm::nonce());
            (
                Segment::anonymous(&format!("{prefix}.world"), len, init)?,
                prefix,
            )
        }
    };
    Ok(World {
        seg: Mapping::from(Arc::new(seg)),
        size,
        provider,
        prefix,
        timeout,
    })
}

/// Opens the world segment `name` as rank `rank` of `size`.
pub(crate) fn open_world(
    name: &str,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<World, CommError> {
    check_size(size)?;
    if rank >= size {
        return Err(CommError::BadRank { rank, size });
    }
    let seg = Segment::open(name, Instant::now() + timeout)?;
    let h = seg.header();
    if h.kind != segment_kind::WORLD {
        return Err(CommError::Mismatch {
            what: "segment kind",
            theirs: u64::from(h.kind),
            source_desc: name.to_string(),
            ours: u64::from(segment_kind::WORLD),
        });
    }
    if h.nranks as usize != size {
        return Err(CommError::Mismatch {
            what: "rank count",
            theirs: u64::from(h.nranks),
            source_desc: format!("world segment {name}"),
            ours: size as u64,
        });
    }
    if seg.len() < world_len(size) {
        return Err(CommError::Mismatch {
            what: "world segment size",
            theirs: seg.len() as u64,
            source_desc: name.to_string(),
            ours: world_len(size) as u64,
        });
    }
    let prefix = name.trim_end_matches(".world").to_string();
    Ok(World {
        seg: Mapping::from(Arc::new(seg)),
        size,
        provider: Provider::Shm,
        prefix,
        timeout,
    })
}
