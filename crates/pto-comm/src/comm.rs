//! Communicators: a rank's view of a world or of a domain (a subset of ranks, dense 0..n).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pto_shm::segment_kind;
use pto_shm::{HeaderInit, Segment};

use crate::backend::mapped::MappedComm;
use crate::backend::mapping::Mapping;
use crate::backend::{wait_err, Backend, CommIo};
use crate::error::{Cause, CommError};
use crate::world::{World, OFF_BARRIER, OFF_PAIR};

/// Layout of a domain's control segment: barrier, pair-barrier flags, member list.
const DOM_BARRIER: usize = 256;
const DOM_PAIR: usize = 384;
const DOM_MEMBERS: usize = 512;

/// Per-rank state shared by every communicator of that rank: marks the rank exited (or failed,
/// when dropped during a panic) once the last handle goes.
pub(crate) struct RankGuard {
    pub(crate) world: Arc<World>,
    pub(crate) rank: usize,
    /// Per member list, how many domains this rank has created over it (names must agree).
    domain_seq: Mutex<HashMap<Vec<u32>, u64>>,
    /// Whether this rank has left the world (at most once: a departure is counted).
    left: AtomicBool,
}

impl RankGuard {
    pub(crate) fn new(world: Arc<World>, rank: usize) -> RankGuard {
        RankGuard {
            world,
            rank,
            domain_seq: Mutex::new(HashMap::new()),
            left: AtomicBool::new(false),
        }
    }

    /// Marks the rank exited (or failed), once.
    fn leave(&self, failed: bool) {
        if !self.left.swap(true, Ordering::AcqRel) {
            self.world.leave(self.rank, failed);
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
        self.leave(failed);
    }
}

pub(crate) struct CommInner {
    pub(crate) guard: Arc<RankGuard>,
    /// World ranks of the members, by dense rank.
    pub(crate) members: Vec<u32>,
    /// This rank's dense rank.
    pub(crate) rank: usize,
    /// How the members meet (the backend boundary).
    pub(crate) io: CommIo,
    /// Names of segments derived from this communicator start with this key.
    pub(crate) key: String,
    pub(crate) window_seq: Mutex<u64>,
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
                io: w.transport.world_io(w.seg.clone(), OFF_BARRIER, OFF_PAIR),
                key: w.prefix.clone(),
                window_seq: Mutex::new(0),
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

    /// [`Comm::check`] for a wait that `awaiting` ends: a member that exited cleanly fails it
    /// only when it was needed (see [`crate::world::Awaiting`]).
    pub(crate) fn check_awaiting(&self, awaiting: crate::world::Awaiting) -> Result<(), CommError> {
        self.world_ref()
            .check_awaiting(self.world_rank(), &self.inner.members, awaiting)
    }

    /// Whose failure a failure on this rank (with `message`) is: another rank's when
    /// [`Comm::check`] finds one aborted (not by this rank), dead, failed or gone; nobody's in
    /// particular when the message is a wait that ran out; else this rank's own. A report
    /// leads with the failures that are not consequences.
    pub fn cause_of(&self, message: &str) -> Cause {
        match self.check() {
            Err(CommError::Aborted { rank, .. }) if rank == self.world_rank() => {}
            Err(_) => return Cause::Peer,
            Ok(()) => {}
        }
        if message.contains("timed out after") {
            Cause::Timeout
        } else {
            Cause::Own
        }
    }

    /// Raises an abort: every rank's blocked and future operations fail with
    /// [`CommError::Aborted`] naming this rank and `message`.
    pub fn abort(&self, message: &str) {
        tracing::warn!(rank = self.world_rank(), message, "aborting the world");
        self.world_ref().abort(self.world_rank(), message);
    }

    /// Says that this rank is done with the world: peers that still wait for it fail at once
    /// with [`CommError::PeerGone`] ("rank R exited") instead of waiting for their deadline.
    /// The last handle's drop does the same; call it before a process ends without running
    /// destructors (`_exit`, a forked child). Later calls do nothing; this rank must not start
    /// another collective or wait afterwards.
    pub fn leave(&self) {
        self.inner.guard.leave(false);
    }

    /// A barrier named `name` of this communicator, as the checker sees it (nothing when no
    /// checker runs).
    pub(crate) fn join_point(&self, name: &str, what: &str) -> crate::check::join::Join {
        self.make_join(name, what, false)
    }

    /// A collective of this communicator: one joining point, its internals not recorded.
    pub(crate) fn collective_join(&self, what: &str) -> crate::check::join::Join {
        self.make_join(&self.inner.key, what, true)
    }

    fn make_join(&self, name: &str, what: &str, quiet: bool) -> crate::check::join::Join {
        let members = || {
            (0..self.size())
                .map(|i| self.world_rank_of(i).unwrap_or(i))
                .collect()
        };
        crate::check::join::Join::make(self.world_rank(), self.rank(), members, name, what, quiet)
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
        let join = self.join_point(&self.inner.key, "barrier");
        let w = self.world_ref();
        w.check_abort().inspect_err(|e| join.failed(e))?;
        let _posted = self.post_wait(crate::world::Waiting::Barrier {
            members: self.size() as u32,
        });
        self.inner
            .io
            .barrier(self.rank(), self.size(), w.deadline(), || self.check())
            .map_err(wait_err(
                || format!("barrier of {} ranks", self.size()),
                self.world_rank(),
            ))
            .map_err(|e| self.with_wait_for_graph(e))
            .inspect_err(|e| join.failed(e))
    }

    /// Posts what this rank waits on to the world's wait board until the guard drops.
    pub(crate) fn post_wait(&self, w: crate::world::Waiting) -> PostedWait<'_> {
        let world = self.world_ref();
        world.post_wait(self.world_rank(), Some(w));
        PostedWait {
            world,
            rank: self.world_rank(),
        }
    }

    /// A deadline's error with the wait-for graph of every rank appended.
    pub(crate) fn with_wait_for_graph(&self, mut e: CommError) -> CommError {
        if let CommError::Timeout { what, .. } = &mut e {
            what.push_str("; ");
            what.push_str(&self.world_ref().wait_for_graph());
        }
        e
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
        let hash = hash_members(&list);
        let name = format!("{}.d{hash:x}-{seq}", w.prefix);
        let n = list.len();
        if let Some(io) = self.inner.io.subgroup(&list, hash ^ seq)? {
            return self.library_domain(io, list, rank, name);
        }
        let len = DOM_MEMBERS + 4 * n;
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
                seg.atomic_u32(DOM_MEMBERS + 4 * i)
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
                io: CommIo::Mapped(MappedComm::new(ctrl.clone(), DOM_BARRIER, DOM_PAIR)),
                key: name.clone(),
                window_seq: Mutex::new(0),
            }),
        };
        // Everyone joined (the creator's list is published before its barrier arrival).
        dom.barrier()?;
        for (i, &m) in list.iter().enumerate() {
            let theirs = ctrl
                .atomic_u32(DOM_MEMBERS + 4 * i)
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

    /// A domain over a library communicator (`io`, created by the members only): the members
    /// agree on the list through it.
    fn library_domain(
        &self,
        io: CommIo,
        list: Vec<u32>,
        rank: usize,
        name: String,
    ) -> Result<Comm, CommError> {
        let w = self.world_ref();
        if let Some((lo, hi)) = io.agree(hash_members(&list), w.deadline())? {
            if lo != hi {
                return Err(CommError::BadDomain {
                    members: list.iter().map(|&r| r as usize).collect(),
                    why: "the members passed different lists".into(),
                });
            }
        }
        Ok(Comm {
            inner: Arc::new(CommInner {
                guard: self.inner.guard.clone(),
                members: list,
                rank,
                io,
                key: name,
                window_seq: Mutex::new(0),
            }),
        })
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

/// Clears a rank's wait-board entry when dropped.
pub(crate) struct PostedWait<'a> {
    world: &'a crate::world::World,
    rank: usize,
}

impl Drop for PostedWait<'_> {
    fn drop(&mut self) {
        self.world.post_wait(self.rank, None);
    }
}
