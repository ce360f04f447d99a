//! Retirement, on the orchestrating thread: finished tasks leave the front of each ring (their
//! nodes go back to the free list, their leases end, failed ones are remembered for poison),
//! the TensorMap is swept of retired tasks, and a run's end hands the nodes back to the engine.

#![allow(unsafe_code)]

use std::sync::atomic::Ordering;

use super::{liveness, Aux, Orchestrator};
use crate::engine::slab::FREE;
use crate::engine::{RunStats, TaskRef};

/// How many nodes ahead a reclaim prefetches.
const RECLAIM_AHEAD: usize = 8;

impl Orchestrator {
    /// Pops every reclaimable task (finished, its scope ended, no consumer retaining it) from
    /// the front of each ring.
    pub(crate) fn reclaim(&mut self) {
        for r in 0..self.mem.rings.len() {
            while let Some(&front) = self.mem.rings[r].live.front() {
                // Reclaiming writes each node a core thread wrote last: ask for the lines it
                // touches (shared state, the body's head and first tensor) a few nodes ahead.
                if let Some(ahead) = self.mem.rings[r].live.get(RECLAIM_AHEAD) {
                    self.engine.slab.get(ahead.slot).prefetch_lines(4);
                }
                // Then, once its head has arrived, the lines of its tensor arguments.
                if let Some(ahead) = self.mem.rings[r].live.get(RECLAIM_AHEAD / 2) {
                    // SAFETY: this is the orchestrating thread.
                    unsafe { self.engine.slab.get(ahead.slot).prefetch_args() };
                }
                if self.mem.aux[front.slot as usize].scope_open {
                    break;
                }
                let s = self.engine.slab.get(front.slot);
                if s.refs.load(Ordering::Acquire) != 0 {
                    break;
                }
                self.mem.rings[r].pop_front(front);
                let root = s.root.load(Ordering::Acquire);
                // SAFETY: `refs` is zero: the task finished and nothing retains it; only this
                // thread reclaims. Read what reclaiming empties first.
                let deferred = unsafe { s.body() }.payload.deferred;
                // SAFETY: as above.
                unsafe { s.reclaim() };
                let a = &mut self.mem.aux[front.slot as usize];
                a.live = 0;
                if let Some(l) = a.lease.take() {
                    l.reclaim();
                }
                if root != 0 {
                    // Its TensorMap entries stay: later readers of what it should have written
                    // are poisoned too. (A normal task's entries go in the next sweep.)
                    self.mem.retired_failed.insert(front.id, root - 1);
                }
                if deferred {
                    self.mem.retired_deferred.push(front.id);
                }
                self.mem.free.push(front.slot);
            }
        }
        // Deferred tasks leave the map of deferred tasks under one lock for the batch: a lock
        // per task, taken a thousand times in a row at a scope's end while the polling thread
        // tries for the same lock, held up every completion for milliseconds.
        if !self.mem.retired_deferred.is_empty() {
            let mut d = self.engine.deferred.lock();
            for id in self.mem.retired_deferred.drain(..) {
                d.tasks.remove(&id);
            }
        }
        if self.mem.tmap.needs_sweep() {
            self.sweep_tmap();
        }
    }

    /// Drops the TensorMap entries of every retired task (see `tensormap`). Only between
    /// submits: the task being committed is not installed yet and would look retired.
    pub(super) fn sweep_tmap(&mut self) {
        let (aux, retired) = (&self.mem.aux, &self.mem.retired_failed);
        self.mem.tmap.sweep(|x: TaskRef| liveness(aux, retired, x));
    }

    /// The end of a run (every task finished): reclaims every node, marks every output lease
    /// reclaimed (stale handles then error), gives back the buffers this run owned (unless it
    /// stalled), and the free nodes to the engine.
    pub(crate) fn close(mut self) -> RunStats {
        self.reclaim();
        for r in &self.mem.rings {
            self.stats.peak_ring_tasks = self.stats.peak_ring_tasks.max(r.peak_tasks);
            self.stats.peak_ring_bytes = self.stats.peak_ring_bytes.max(r.peak_bytes);
            // Tasks still live (a stalled run): their outputs are no longer valid either.
            for t in &r.live {
                if let Some(a) = self.mem.aux.get_mut(t.slot as usize) {
                    if let Some(l) = &a.lease {
                        l.reclaim();
                    }
                    // Still listed in `kept` if it was: the flag says so, or a later task in
                    // this node would list it twice.
                    *a = Aux {
                        kept: a.kept,
                        ..Aux::default()
                    };
                }
            }
        }
        // A stalled run's tasks may still run on the fast path: its buffers stay owned (later
        // runs register their borrows on them, and every borrower scans the running tasks).
        let stalled = self.mem.rings.iter().any(|r| !r.live.is_empty());
        for b in self.mem.owned.drain(..) {
            if !stalled {
                b.release_owner(self.nonce);
            }
        }
        self.mem.free.extend(self.next_slot.take());
        // Free nodes kept their last task's kernel; the run is over, so let go of them (a
        // kernel lives no longer than the runs that use it). A node still live (a stalled run)
        // keeps its kernel until a later run frees it.
        let (slab, aux) = (&self.engine.slab, &mut self.mem.aux);
        self.mem.kept.retain(|&k| {
            let s = slab.get(k);
            if s.id.load(Ordering::Acquire) != FREE {
                return true;
            }
            // SAFETY: a free node: no other thread reaches it, and this thread holds no other
            // reference to its body.
            unsafe { s.forget_kernel() };
            if let Some(a) = aux.get_mut(k as usize) {
                a.kept = false;
            }
            false
        });
        let stats = self.stats;
        self.leave_leftovers();
        stats
    }
}
