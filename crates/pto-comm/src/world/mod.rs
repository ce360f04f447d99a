//! The world: the control segment every rank maps, the rank table, the abort word, and the
//! transport that creates and opens the segments of domains and windows.
//!
//! Layout of the world segment (after the 256-byte [`pto_shm::Header`]):
//!
//! | offset | what |
//! |---|---|
//! | 256 | abort word: 0, or the aborting world rank + 1 |
//! | 260 | supervised: 1 when the launcher publishes its ranks' deaths here (no `/proc` reads) |
//! | 264 | departures: how many ranks left the running state (exited, failed, died) |
//! | 268 | first loss: 0, or the world rank + 1 of the first rank that died or failed |
//! | 320 | world barrier ([`pto_shm::barrier::Barrier`], 128 bytes) |
//! | 448 | abort message (256 bytes, written before the abort word) |
//! | 704 | pair-barrier flags: two 64-byte lines `{arrivals: u32, sleepers: u32}` |
//! | 832 | rank table: per rank `{pid: u32, state: u32, start: u64}` |
//! | after it, 64-aligned | wait board: per rank `{kind: u32, value: u32, window: u64, offset: u64, since_ms: u64}`, what the rank waits on now (the wait-for graph a timeout reports) |
//!
//! See `docs/design/comm-windows.md`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pto_shm::barrier::Barrier;
use pto_shm::process::ProcessId;
use pto_shm::segment_kind;
use pto_shm::{HeaderInit, Segment, HEADER_LEN};

use crate::backend::mapping::Mapping;
use crate::backend::{Backend, Transport};
use crate::error::CommError;

mod board;

/// The most ranks a communicator may have.
pub const MAX_RANKS: usize = 1024;

/// `PTO_WAIT_TIMEOUT_MS` (or its default), as a [`CommError::Env`] when it is set wrong.
pub(crate) fn env_timeout() -> Result<Duration, CommError> {
    pto_core::config::Settings::from_env()
        .map(|s| s.wait_timeout)
        .map_err(|e| CommError::Env(e.to_string()))
}

pub(crate) const OFF_ABORT: usize = 256;
pub(crate) const OFF_SUPERVISED: usize = 260;
pub(crate) const OFF_DEPARTURES: usize = 264;
pub(crate) const OFF_FIRST_LOSS: usize = 268;
pub(crate) const OFF_BARRIER: usize = 320;
pub(crate) const OFF_ABORT_MSG: usize = 448;
pub(crate) const ABORT_MSG_LEN: usize = 256;
/// Two flag lines (for a two-rank communicator's barrier), 64 bytes each.
pub(crate) const OFF_PAIR: usize = 704;
pub(crate) const OFF_RANKS: usize = 832;
const _: () =
    assert!(OFF_BARRIER.is_multiple_of(64) && OFF_BARRIER + Barrier::SIZE <= OFF_ABORT_MSG);
pub(crate) const RANK_SLOT: usize = 16;

/// Who can end a wait, which decides whether a peer that exited cleanly (it does nothing
/// more, but may have done its part before it left) fails it. A dead or failed peer fails
/// every wait; a wait whose condition came true before the exit still succeeds (one more look).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Awaiting {
    /// Every peer (a barrier): any exit.
    Every,
    /// One peer, a world rank (a collective's flag from a known peer): that peer's exit only.
    Rank(u32),
    /// Whichever peer raises a signal (a program's own wait): only when no peer that could
    /// still raise it is left running or starting.
    Anyone,
}

/// A rank's state in the table.
pub(crate) const NOT_JOINED: u32 = 0;
pub(crate) const RUNNING: u32 = 1;
pub(crate) const EXITED: u32 = 2;
pub(crate) const FAILED: u32 = 3;
/// Ended without leaving: killed, crashed (seen by its launcher or by a peer).
pub(crate) const DIED: u32 = 4;

/// How many running peers' `/proc` entries an unsupervised wait reads per liveness check
/// (rotating through them): a check costs O(1), not O(ranks).
const PROBES_PER_CHECK: usize = 8;

/// Bytes of one rank's wait-board entry.
pub(crate) const WAIT_SLOT: usize = 32;
const WAIT_NONE: u32 = 0;
const WAIT_SIGNAL: u32 = 1;
const WAIT_BARRIER: u32 = 2;

fn off_waits(n: usize) -> usize {
    (OFF_RANKS + n * RANK_SLOT).next_multiple_of(64)
}

fn world_len(n: usize) -> usize {
    off_waits(n) + n * WAIT_SLOT
}

/// What a rank waits on, as its wait-board entry says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// A signal of window number `window` (its allocation sequence) at `offset`, `>= value`.
    Signal {
        window: u64,
        offset: u64,
        value: u32,
    },
    /// A barrier of `members` ranks.
    Barrier { members: u32 },
}

/// Everything the ranks of one world share.
pub(crate) struct World {
    pub(crate) seg: Mapping,
    pub(crate) size: usize,
    pub(crate) transport: Transport,
    /// Prefix of the names of this world's domain and window segments.
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    /// Where this process's next `/proc` probes start in a peer list (unsupervised worlds).
    pub(crate) probe: std::sync::atomic::AtomicUsize,
}

impl World {
    pub(crate) fn backend(&self) -> Backend {
        self.transport.backend()
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
        self.seg.barrier(OFF_BARRIER)
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

    /// The pid of world rank `rank` once it joined (0 before).
    pub(crate) fn pid(&self, rank: usize) -> u32 {
        self.slot(rank).0.load(Ordering::Acquire)
    }

    /// Marks `rank` exited (cleanly) or failed.
    pub(crate) fn leave(&self, rank: usize, failed: bool) {
        let (_, state, _) = self.slot(rank);
        state.store(if failed { FAILED } else { EXITED }, Ordering::Release);
        if failed {
            self.lost(rank);
        }
        self.departed();
    }

    /// Records `rank` as the first rank lost (died or failed), unless one was recorded before:
    /// every waiter then names it, not a peer that left because of it.
    fn lost(&self, rank: usize) {
        let _ = self.seg.atomic_u32(OFF_FIRST_LOSS).compare_exchange(
            0,
            rank as u32 + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Counts a departure (after the slot's state changed) and wakes the world barrier's
    /// waiters; every other wait sees it at its next liveness check.
    fn departed(&self) {
        self.seg
            .atomic_u32(OFF_DEPARTURES)
            .fetch_add(1, Ordering::AcqRel);
        self.barrier().poke();
    }

    /// Says that the launcher publishes its ranks' deaths ([`World::mark_died`]): waits stop
    /// reading `/proc`.
    pub(crate) fn set_supervised(&self) {
        self.seg
            .atomic_u32(OFF_SUPERVISED)
            .store(1, Ordering::Release);
    }

    /// Marks `rank` dead (it ended without leaving: a launcher that saw it end, or a peer that
    /// found it gone). Returns whether this call changed it.
    pub(crate) fn mark_died(&self, rank: usize, pid: u32) -> bool {
        if rank >= self.size {
            return false;
        }
        let (p, state, _) = self.slot(rank);
        let won = [RUNNING, NOT_JOINED].into_iter().any(|from| {
            state
                .compare_exchange(from, DIED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        if won {
            if p.load(Ordering::Acquire) == 0 {
                p.store(pid, Ordering::Release);
            }
            self.lost(rank);
            self.departed();
        }
        won
    }

    /// True once `rank` has joined (its slot is no longer free).
    pub(crate) fn joined(&self, rank: usize) -> bool {
        rank < self.size && self.slot(rank).1.load(Ordering::Acquire) != NOT_JOINED
    }

    /// Marks `rank` failed from outside (a launcher that reaped it).
    pub(crate) fn mark_failed(&self, rank: usize) {
        if rank < self.size {
            let (_, state, _) = self.slot(rank);
            let a = state.compare_exchange(RUNNING, FAILED, Ordering::AcqRel, Ordering::Acquire);
            let b = state.compare_exchange(NOT_JOINED, FAILED, Ordering::AcqRel, Ordering::Acquire);
            if a.is_ok() || b.is_ok() {
                self.lost(rank);
                self.departed();
            }
        }
    }

    /// Raises an abort (first one wins) and records its message.
    pub(crate) fn abort(&self, rank: usize, message: &str) {
        let word = self.seg.atomic_u32(OFF_ABORT);
        if word.load(Ordering::Acquire) != 0 {
            return;
        }
        // Concurrent aborters may interleave their bytes, but readers only read the message
        // after the abort word is set and treat it as lossy UTF-8: any bytes are acceptable.
        let bytes = message.as_bytes();
        let n = bytes.len().min(ABORT_MSG_LEN - 1);
        let mut text = [0u8; ABORT_MSG_LEN];
        text[..n].copy_from_slice(&bytes[..n]);
        self.seg.write_bytes(OFF_ABORT_MSG, &text[..=n]);
        let _ = word.compare_exchange(0, rank as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
        self.transport.on_abort(rank, message);
        self.barrier().poke();
    }

    fn aborted(&self) -> Option<CommError> {
        let w = self.seg.atomic_u32(OFF_ABORT).load(Ordering::Acquire);
        if w == 0 {
            return None;
        }
        // Racing writers can only make the text garbled.
        let mut buf = [0u8; ABORT_MSG_LEN];
        self.seg.read_bytes(OFF_ABORT_MSG, &mut buf);
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
    /// gone. Ranks that have not joined yet are assumed to be starting.
    ///
    /// O(1) while nobody has left: the abort word and the departures count. After a departure,
    /// the states of `peers` (memory reads). On the shm backend without a supervising launcher,
    /// also the `/proc` entries of a few running peers, rotating through them from one check
    /// to the next ([`PROBES_PER_CHECK`]); a peer found dead is marked so for everyone. Waits
    /// call it every few milliseconds, not on every operation. See `docs/design/scale.md`.
    pub(crate) fn check(&self, me: usize, peers: &[u32]) -> Result<(), CommError> {
        self.check_awaiting(me, peers, Awaiting::Every)
    }

    /// [`World::check`] for a wait that only `awaiting` can end: a peer that exited cleanly
    /// does nothing more, so its exit fails the wait only when it was needed (see
    /// [`Awaiting`]); a dead or failed peer always does.
    pub(crate) fn check_awaiting(
        &self,
        me: usize,
        peers: &[u32],
        awaiting: Awaiting,
    ) -> Result<(), CommError> {
        if let Some(e) = self.aborted() {
            return Err(e);
        }
        if self.seg.atomic_u32(OFF_DEPARTURES).load(Ordering::Acquire) != 0 {
            self.check_states(me, peers, awaiting)?;
        }
        // Processes on this host have pids to watch; a library's launcher ends the job itself
        // when a rank dies.
        if self.transport.watches_pids()
            && self.seg.atomic_u32(OFF_SUPERVISED).load(Ordering::Acquire) == 0
            && !peers.is_empty()
        {
            let start = self.probe.fetch_add(PROBES_PER_CHECK, Ordering::Relaxed);
            for k in 0..PROBES_PER_CHECK.min(peers.len()) {
                let p = peers[(start + k) % peers.len()] as usize;
                if p == me {
                    continue;
                }
                let (pid, state, st) = self.slot(p);
                if state.load(Ordering::Acquire) != RUNNING {
                    continue;
                }
                let id = ProcessId {
                    pid: pid.load(Ordering::Acquire),
                    start: st.load(Ordering::Relaxed),
                };
                if id.pid != 0 && !id.is_alive() {
                    // The peer may have left cleanly between the state read above and the
                    // probe (its process then ends): only a peer still running is marked dead.
                    // Either way its state now says what happened, and a rank lost earlier (the
                    // root cause this peer may have reacted to) is named first.
                    self.mark_died(p, id.pid);
                    return self.check_states(me, peers, awaiting);
                }
            }
        }
        Ok(())
    }

    /// The states of `peers`: a dead or failed peer is the cause; a peer that exited may only
    /// have reacted to it, so it is reported only when no peer is dead or failed. When some
    /// peer has gone and another rank was lost first (a wait on tree neighbours sees only them),
    /// that first loss is named: it is the root cause, the neighbour its consequence.
    fn check_states(&self, me: usize, peers: &[u32], awaiting: Awaiting) -> Result<(), CommError> {
        match self.peer_state(me, peers, awaiting) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.first_loss(me).unwrap_or(e)),
        }
    }

    /// The first rank lost (died or failed) as an error, if any other than `me`.
    fn first_loss(&self, me: usize) -> Option<CommError> {
        let first = self.seg.atomic_u32(OFF_FIRST_LOSS).load(Ordering::Acquire);
        let rank = (first as usize)
            .checked_sub(1)
            .filter(|&r| r != me && r < self.size)?;
        let (pid, state, _) = self.slot(rank);
        match state.load(Ordering::Acquire) {
            DIED => Some(CommError::PeerDied {
                rank,
                pid: pid.load(Ordering::Acquire),
            }),
            FAILED => Some(CommError::PeerGone {
                rank,
                how: "failed",
            }),
            _ => None,
        }
    }

    fn peer_state(&self, me: usize, peers: &[u32], awaiting: Awaiting) -> Result<(), CommError> {
        let mut exited = None;
        let mut running = false;
        for &p in peers {
            let p = p as usize;
            if p == me {
                continue;
            }
            let (pid, state, _) = self.slot(p);
            match state.load(Ordering::Acquire) {
                FAILED => {
                    return Err(CommError::PeerGone {
                        rank: p,
                        how: "failed",
                    })
                }
                DIED => {
                    return Err(CommError::PeerDied {
                        rank: p,
                        pid: pid.load(Ordering::Acquire),
                    })
                }
                EXITED => {
                    let needed = match awaiting {
                        Awaiting::Every | Awaiting::Anyone => true,
                        Awaiting::Rank(r) => r as usize == p,
                    };
                    if needed {
                        exited = exited.or(Some(p));
                    }
                }
                _ => running = true,
            }
        }
        match exited {
            // Anyone still running may yet raise what is awaited.
            Some(_) if awaiting == Awaiting::Anyone && running => Ok(()),
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
        self.transport.create(name, len, init)
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
            if let Some(s) = self.transport.open(name, slice)? {
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
        self.transport.forget(name);
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

/// Creates the world of `size` ranks over `transport` (on a library transport, `rank` is this
/// process's rank and every rank calls it; elsewhere the launcher does, once).
pub(crate) fn create_world(
    size: usize,
    transport: Transport,
    rank: usize,
    timeout: Duration,
) -> Result<World, CommError> {
    check_size(size)?;
    let init = HeaderInit {
        kind: segment_kind::WORLD,
        nranks: size as u32,
        ..HeaderInit::default()
    };
    let len = world_len(size).max(HEADER_LEN);
    let (seg, prefix) = transport.world_memory(len, init, rank, Instant::now() + timeout)?;
    Ok(World {
        seg,
        size,
        transport,
        prefix,
        timeout,
        probe: std::sync::atomic::AtomicUsize::new(0),
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
        transport: Transport::Shm,
        prefix,
        timeout,
        probe: std::sync::atomic::AtomicUsize::new(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A world of `n` ranks on threads, every rank joined.
    fn local_world(n: usize) -> Result<World, CommError> {
        let w = create_world(
            n,
            Transport::Local(Default::default()),
            0,
            Duration::from_secs(5),
        )?;
        for r in 0..n {
            w.join(r)?;
        }
        Ok(w)
    }

    /// A rank that waits only on neighbours (a tree) names the first rank lost, not the
    /// neighbour that left because of it.
    #[test]
    fn a_wait_names_the_first_rank_lost_not_the_neighbour_that_left_after_it(
    ) -> Result<(), CommError> {
        let w = local_world(6)?;
        assert!(w.check(0, &[1, 2]).is_ok());
        w.mark_died(4, 4242);
        w.leave(1, false);
        match w.check(0, &[1, 2]) {
            Err(CommError::PeerDied { rank: 4, .. }) => {}
            other => panic!("expected rank 4 named, got {other:?}"),
        }
        // A later failure does not replace the first loss.
        w.mark_failed(5);
        assert!(matches!(
            w.check(0, &[1]),
            Err(CommError::PeerDied { rank: 4, .. })
        ));
        // The lost rank itself is told about its neighbour, not about itself.
        assert!(matches!(
            w.check(4, &[1]),
            Err(CommError::PeerGone { rank: 1, .. })
        ));
        Ok(())
    }

    /// A peer that exited cleanly fails a barrier, a wait on its own flag, and a wait on a
    /// signal only once nobody who could raise it is running; a failed peer fails them all.
    #[test]
    fn an_exit_fails_only_the_waits_that_needed_the_rank() -> Result<(), CommError> {
        let w = local_world(4)?;
        let all = [0, 1, 2, 3];
        w.leave(1, false);
        let gone = |r: Result<(), CommError>| {
            matches!(
                r,
                Err(CommError::PeerGone {
                    rank: 1,
                    how: "exited"
                })
            )
        };
        assert!(gone(w.check(0, &all)));
        assert!(gone(w.check_awaiting(0, &all, Awaiting::Every)));
        assert!(gone(w.check_awaiting(0, &all, Awaiting::Rank(1))));
        assert!(w.check_awaiting(0, &all, Awaiting::Rank(2)).is_ok());
        // Ranks 2 and 3 still run: either may raise the signal.
        assert!(w.check_awaiting(0, &all, Awaiting::Anyone).is_ok());
        w.leave(2, false);
        assert!(w.check_awaiting(0, &all, Awaiting::Anyone).is_ok());
        w.leave(3, false);
        assert!(gone(w.check_awaiting(0, &all, Awaiting::Anyone)));
        // The waiting rank itself does not count as someone who could raise it.
        assert!(gone(w.check_awaiting(0, &[0, 1], Awaiting::Anyone)));
        Ok(())
    }

    /// A failed peer fails every kind of wait, whoever it waits on.
    #[test]
    fn a_failure_fails_every_wait() -> Result<(), CommError> {
        let w = local_world(3)?;
        w.mark_failed(2);
        for a in [Awaiting::Every, Awaiting::Rank(1), Awaiting::Anyone] {
            assert!(
                matches!(
                    w.check_awaiting(0, &[0, 1, 2], a),
                    Err(CommError::PeerGone {
                        rank: 2,
                        how: "failed"
                    })
                ),
                "{a:?}"
            );
        }
        Ok(())
    }

    /// A peer found gone by the `/proc` probe after an earlier loss is not named in place of
    /// the rank lost first: it may only have reacted to that loss (left, then ended, between
    /// the state read and the probe). Seen as a flaky 256-rank kill test before the fix.
    #[test]
    fn a_probe_that_finds_a_peer_gone_names_the_first_rank_lost() -> Result<(), CommError> {
        let w = create_world(3, Transport::Shm, 0, Duration::from_secs(5))?;
        for r in 0..3 {
            w.join(r)?;
        }
        // Rank 1's slot holds a process that has ended (a reaped child's pid).
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn `true`");
        child.wait().expect("reap `true`");
        w.slot(1).0.store(child.id(), Ordering::Release);
        w.mark_died(2, 4242);
        match w.check(0, &[1]) {
            Err(CommError::PeerDied { rank: 2, .. }) => {}
            other => panic!("expected rank 2 named, got {other:?}"),
        }
        // Rank 1 was still running by its slot: the probe marked it dead for everyone.
        assert_eq!(w.slot(1).1.load(Ordering::Acquire), DIED);
        Ok(())
    }
}
