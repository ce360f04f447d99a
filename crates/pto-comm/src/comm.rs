//! Communicators: a rank's view of a world or of a domain (a subset of ranks, dense 0..n).

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use pto_shm::barrier::Barrier;
use pto_shm::segment_kind;
use pto_shm::wait::WaitError;
use pto_shm::{HeaderInit, Segment};

use crate::mapping::Mapping;
use crate::window::{Window, WindowSpec};
use crate::world::World;
use crate::{Backend, CommError};

/// Per-rank state shared by every communicator of that rank: marks the rank exited (or failed,
/// when dropped during a panic) once the last handle goes.
pub(crate) struct RankGuard {
    pub(crate) world: Arc<World>,
    pub(crate) rank: usize,
    /// Per member list, how many domains this rank has created over it (names must agree).
    domain_seq: Mutex<HashMap<Vec<u32>, u64>>,
}

impl RankGuard {
    pub(crate) fn new(world: Arc<World>, rank: usize) -> RankGuard {
        RankGuard {
            world,
            rank,
            domain_seq: Mutex::new(HashMap::new()),
        }
    }
}

impl Drop for RankGuard {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            self.world
                .abort(self.rank, &format!("rank {} panicked", self.rank));
        }
        self.world.leave(self.rank, failed);
    }
}

pub(crate) struct CommInner {
    pub(crate) guard: Arc<RankGuard>,
    /// World ranks of the members, by dense rank.
    pub(crate) members: Vec<u32>,
    /// This rank's dense rank.
    pub(crate) rank: usize,
    /// Where this communicator's barrier lives (the world segment, or the domain's).
    ctrl: Mapping,
    barrier_off: usize,
    /// Offset of the two pair-barrier flag lines in `ctrl` (used when the size is 2).
    pair_off: usize,
    /// Barriers this rank has passed in this communicator (the pair barrier's epoch).
    epoch: std::sync::atomic::AtomicU32,
    /// Names of segments derived from this communicator start with this key.
    pub(crate) key: String,
    window_seq: Mutex<u64>,
    /// The MPI communicator (mpi backend).
    pub(crate) mpi: Option<Arc<crate::mpi::MpiComm>>,
}

/// A rank's communicator: its rank and size, a barrier, domains, and symmetric windows.
///
/// Cloning is cheap and shares the communicator. Collective calls (`barrier`, `domain`,
/// `alloc_window`) must be made by every member, in the same order.
#[derive(Clone)]
pub struct Comm {
    pub(crate) inner: Arc<CommInner>,
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("world_rank", &self.world_rank())
            .field("backend", &self.backend())
            .finish()
    }
}

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

fn hash_members(m: &[u32]) -> u64 {
    // FNV-1a: stable across processes (unlike the std hasher).
    m.iter()
        .flat_map(|r| r.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

impl Comm {
    pub(crate) fn world(guard: Arc<RankGuard>) -> Comm {
        let w = guard.world.clone();
        let size = w.size;
        let rank = guard.rank;
        Comm {
            inner: Arc::new(CommInner {
                members: (0..size as u32).collect(),
                rank,
                ctrl: w.seg.clone(),
                barrier_off: crate::world::OFF_BARRIER,
                pair_off: crate::world::OFF_PAIR,
                epoch: std::sync::atomic::AtomicU32::new(0),
                key: w.prefix.clone(),
                window_seq: Mutex::new(0),
                mpi: w.mpi().cloned(),
                guard,
            }),
        }
    }

    pub(crate) fn world_ref(&self) -> &World {
        &self.inner.guard.world
    }

    /// This rank's (dense) rank in the communicator.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.inner.members.len()
    }

    /// This rank's rank in the world.
    pub fn world_rank(&self) -> usize {
        self.inner.guard.rank
    }

    /// World ranks of the members, by dense rank.
    pub fn members(&self) -> Vec<usize> {
        self.inner.members.iter().map(|&r| r as usize).collect()
    }

    /// The world rank of dense rank `r`.
    ///
    /// # Errors
    ///
    /// [`CommError::BadRank`].
    pub fn world_rank_of(&self, r: usize) -> Result<usize, CommError> {
        self.inner
            .members
            .get(r)
            .map(|&w| w as usize)
            .ok_or(CommError::BadRank {
                rank: r,
                size: self.size(),
            })
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.world_ref().backend()
    }

    /// Errors when the world was aborted or a member is dead or gone.
    ///
    /// # Errors
    ///
    /// [`CommError::Aborted`], [`CommError::PeerDied`] or [`CommError::PeerGone`].
    pub fn check(&self) -> Result<(), CommError> {
        self.world_ref()
            .check(self.world_rank(), &self.inner.members)
    }

    /// Whose failure a failure on this rank (with `message`) is: another rank's when
    /// [`Comm::check`] finds one aborted (not by this rank), dead, failed or gone; nobody's in
    /// particular when the message is a wait that ran out; else this rank's own. A report
    /// leads with the failures that are not consequences.
    pub fn cause_of(&self, message: &str) -> crate::Cause {
        match self.check() {
            Err(CommError::Aborted { rank, .. }) if rank == self.world_rank() => {}
            Err(_) => return crate::Cause::Peer,
            Ok(()) => {}
        }
        if message.contains("timed out after") {
            crate::Cause::Timeout
        } else {
            crate::Cause::Own
        }
    }

    /// Raises an abort: every rank's blocked and future operations fail with
    /// [`CommError::Aborted`] naming this rank and `message`.
    pub fn abort(&self, message: &str) {
        tracing::warn!(rank = self.world_rank(), message, "aborting the world");
        self.world_ref().abort(self.world_rank(), message);
    }

    fn barrier_words(&self) -> &Barrier {
        // SAFETY: `barrier_off` is the offset of a zero-initialised `Barrier` inside `ctrl`
        // (the world or domain layout), 4-aligned; it is only accessed atomically.
        unsafe {
            &*self
                .inner
                .ctrl
                .as_ptr()
                .add(self.inner.barrier_off)
                .cast::<Barrier>()
        }
    }

    /// Waits until every member has called `barrier`.
    ///
    /// # Collective
    ///
    /// Every member calls it.
    ///
    /// # Errors
    ///
    /// A dead or failed member (named), an abort, or the deadline (`PTO_WAIT_TIMEOUT_MS`).
    /// After an error the communicator must not be used for collectives again.
    pub fn barrier(&self) -> Result<(), CommError> {
        let w = self.world_ref();
        w.check_abort()?;
        if let Some(m) = &self.inner.mpi {
            return m.barrier(w.deadline());
        }
        if self.size() == 2 {
            return self.pair_barrier();
        }
        self.barrier_words()
            .wait(self.size() as u32, w.deadline(), || self.check())
            .map_err(wait_err(
                || format!("barrier of {} ranks", self.size()),
                self.world_rank(),
            ))
    }

    /// Two ranks: each adds one to the other's arrival counter and waits until its own reaches
    /// the number of barriers it has entered. One cache-line transfer each way, in parallel,
    /// instead of the central barrier's three in sequence. Counters only grow, so a fast rank
    /// re-entering at once is harmless.
    fn pair_barrier(&self) -> Result<(), CommError> {
        let epoch = self
            .inner
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1);
        let me = self.rank();
        let line = |r: usize| self.inner.pair_off + 64 * r;
        let (theirs, their_sleepers) = (
            self.inner.ctrl.atomic_u32(line(1 - me)),
            self.inner.ctrl.atomic_u32(line(1 - me) + 4),
        );
        theirs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        pto_shm::wait::wake(theirs, their_sleepers);
        let (mine, my_sleepers) = (
            self.inner.ctrl.atomic_u32(line(me)),
            self.inner.ctrl.atomic_u32(line(me) + 4),
        );
        pto_shm::wait::wait_until(
            mine,
            my_sleepers,
            |v| (v.wrapping_sub(epoch) as i32) >= 0,
            self.world_ref().deadline(),
            || self.check(),
        )
        .map_err(wait_err(
            || "barrier of 2 ranks".to_string(),
            self.world_rank(),
        ))
    }

    /// A communicator over a subset of the world: `members` lists world ranks, and a member's
    /// dense rank in the domain is its position in the list.
    ///
    /// # Collective
    ///
    /// Every listed member calls it with the same list; others do not.
    ///
    /// # Errors
    ///
    /// An empty list, a duplicate, a rank outside the world, a caller that is not listed, or
    /// members that passed different lists; and the failures of a barrier.
    pub fn domain(&self, members: &[usize]) -> Result<Comm, CommError> {
        let w = self.world_ref();
        let me = self.world_rank();
        let bad = |why: String| CommError::BadDomain {
            members: members.to_vec(),
            why,
        };
        if members.is_empty() {
            return Err(bad("no members".into()));
        }
        let mut seen = vec![false; w.size];
        for &m in members {
            if m >= w.size {
                return Err(bad(format!("rank {m} is not in the world of {}", w.size)));
            }
            if std::mem::replace(&mut seen[m], true) {
                return Err(bad(format!("rank {m} is listed twice")));
            }
        }
        let Some(rank) = members.iter().position(|&m| m == me) else {
            return Err(bad(format!("rank {me} is not a member")));
        };
        let list: Vec<u32> = members.iter().map(|&m| m as u32).collect();
        let seq = {
            let mut s = self.inner.guard.domain_seq.lock();
            let e = s.entry(list.clone()).or_insert(0);
            *e += 1;
            *e
        };
        let name = format!("{}.d{:x}-{seq}", w.prefix, hash_members(&list));
        let n = list.len();
        // Domain control: barrier at 256, pair-barrier flags at 384, member list at 512.
        let len = 512 + 4 * n;
        if let Some(wm) = w.mpi() {
            return self.mpi_domain(wm, list, rank, seq, name, len);
        }
        let ctrl = if rank == 0 {
            let seg = w.create(
                &name,
                len,
                HeaderInit {
                    kind: segment_kind::DOMAIN,
                    nranks: n as u32,
                    generation: seq,
                    ..HeaderInit::default()
                },
            )?;
            for (i, &m) in list.iter().enumerate() {
                seg.atomic_u32(512 + 4 * i)
                    .store(m, std::sync::atomic::Ordering::Release);
            }
            Mapping::from(seg)
        } else {
            let seg = w.open(&name, me, list[0], w.deadline())?;
            let h = seg.header();
            if h.nranks as usize != n || seg.len() < len {
                return Err(CommError::Mismatch {
                    what: "domain size",
                    theirs: u64::from(h.nranks),
                    source_desc: format!("rank {}", list[0]),
                    ours: n as u64,
                });
            }
            Mapping::from(seg)
        };
        let dom = Comm {
            inner: Arc::new(CommInner {
                guard: self.inner.guard.clone(),
                members: list.clone(),
                rank,
                ctrl,
                barrier_off: 256,
                pair_off: 384,
                epoch: std::sync::atomic::AtomicU32::new(0),
                key: name.clone(),
                window_seq: Mutex::new(0),
                mpi: None,
            }),
        };
        // Everyone joined (the creator's list is published before its barrier arrival).
        dom.barrier()?;
        for (i, &m) in list.iter().enumerate() {
            let theirs = dom
                .inner
                .ctrl
                .atomic_u32(512 + 4 * i)
                .load(std::sync::atomic::Ordering::Acquire);
            if theirs != m {
                return Err(CommError::Mismatch {
                    what: "domain member list entry",
                    theirs: u64::from(theirs),
                    source_desc: format!("rank {} (dense rank {i})", list[0]),
                    ours: u64::from(m),
                });
            }
        }
        if rank == 0 {
            w.forget(&name);
        }
        Ok(dom)
    }

    /// A domain of an MPI job: an MPI communicator over the members
    /// (`MPI_Comm_create_group`, called by the members only); its control words are shared
    /// memory on one node and this rank's own otherwise (its barrier is MPI's).
    fn mpi_domain(
        &self,
        wm: &crate::mpi::MpiComm,
        list: Vec<u32>,
        rank: usize,
        seq: u64,
        name: String,
        len: usize,
    ) -> Result<Comm, CommError> {
        let w = self.world_ref();
        let hash = hash_members(&list);
        let m = Arc::new(wm.create_group(&list, hash ^ seq)?);
        let (lo, hi) = m.min_max(hash, w.deadline())?;
        if lo != hi {
            return Err(CommError::BadDomain {
                members: list.iter().map(|&r| r as usize).collect(),
                why: "the members passed different lists".into(),
            });
        }
        let ctrl = match m.mode() {
            crate::mpi::Mode::Shared => m.shared_alloc(name.clone(), len, rank, w.deadline())?,
            crate::mpi::Mode::Rma => Mapping::from(Arc::new(Segment::anonymous(
                &name,
                len,
                HeaderInit::default(),
            )?)),
        };
        Ok(Comm {
            inner: Arc::new(CommInner {
                guard: self.inner.guard.clone(),
                members: list,
                rank,
                ctrl,
                barrier_off: 256,
                pair_off: 384,
                epoch: std::sync::atomic::AtomicU32::new(0),
                key: name,
                window_seq: Mutex::new(0),
                mpi: Some(m),
            }),
        })
    }

    /// Allocates a symmetric window: `spec.bytes` on every member, zeroed, with its named
    /// buffers carved in order. Returns after every member's window is zeroed (so no peer's
    /// first signal can be wiped).
    ///
    /// # Collective
    ///
    /// Every member calls it with the same size.
    ///
    /// # Errors
    ///
    /// A size of 0 or too large, buffers that do not fit, members that disagree on the size or
    /// rank count (the error names both values), no space in `/dev/shm`, and the failures of a
    /// barrier.
    pub fn alloc_window(&self, spec: &WindowSpec) -> Result<Window, CommError> {
        let seq = {
            let mut s = self.inner.window_seq.lock();
            *s += 1;
            *s
        };
        let w = Window::allocate(self, spec, seq);
        match &w {
            Ok(_) => tracing::debug!(
                rank = self.rank(),
                bytes = spec.bytes,
                seq,
                "window allocated"
            ),
            Err(e) => {
                tracing::debug!(rank = self.rank(), bytes = spec.bytes, error = %e, "window allocation failed")
            }
        }
        w
    }

    pub(crate) fn create_or_open(
        &self,
        name: &str,
        len: usize,
        init: HeaderInit,
    ) -> Result<Arc<Segment>, CommError> {
        let w = self.world_ref();
        if self.rank() == 0 {
            w.create(name, len, init)
        } else {
            w.open(name, self.world_rank(), self.inner.members[0], w.deadline())
        }
    }

    pub(crate) fn forget(&self, name: &str) {
        if self.rank() == 0 {
            self.world_ref().forget(name);
        }
    }

    /// The deadline a wait started now should use (`PTO_WAIT_TIMEOUT_MS` by default).
    pub fn deadline(&self) -> std::time::Instant {
        self.world_ref().deadline()
    }
}
