//! The TensorMap: which live tasks touch which bytes of which buffer.
//!
//! Keyed by buffer id; within a buffer, entries are ordered by their first byte so that an
//! overlap query visits only entries that start within `max_len` bytes before the probe.
//! Entries leave when a later writer covers them, lazily when a query meets an entry whose
//! task has retired, and in batches: once the map holds twice the entries it held after the
//! last sweep, the orchestrating thread drops every entry of a retired task in one pass (so a
//! task's retirement costs no per-entry search). Entries of a task that failed stay (they
//! poison later readers). See `docs/design/dependency-engine.md`.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::TaskRef;
use crate::geometry::{overlap, Overlap, Region};

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// First byte: with `seq`, the sort key.
    start: usize,
    /// One past the last byte.
    end: usize,
    /// Insertion sequence (unique).
    seq: u64,
    task: TaskRef,
    /// The region's elements fill `[start, end)` without gaps: two such entries compare as
    /// byte ranges, without looking at `region`.
    contig: bool,
    /// Removed: skipped by lookups, dropped when the side is compacted.
    dead: bool,
    /// The region, in the map's region pool: read only when the byte ranges cannot answer
    /// (a layout that is not contiguous), so entries stay small and cheap to shift.
    region: u32,
}

impl Entry {
    fn key(&self) -> (usize, u64) {
        (self.start, self.seq)
    }
}

/// The entries of one buffer's readers or writers, sorted by first byte. A deque: tasks are
/// mostly inserted in address order and retired oldest first, so both ends are cheap, and an
/// emptied side keeps its memory (a chain on one tensor allocates nothing per task). Removal
/// marks an entry dead (no shifting of the entries behind it); dead entries are dropped from
/// the ends at once and from the middle when they are at least half of the side.
#[derive(Default, Debug)]
struct Side {
    entries: VecDeque<Entry>,
    max_len: usize,
    dead: usize,
}

impl Side {
    /// Index of the first entry whose key is not below `k`. Searched from the back first
    /// (galloping, then a binary search in the last gap): programs mostly touch addresses at
    /// or past the newest entries, and a binary search over a large side misses the cache at
    /// every step.
    fn lower_bound(&self, k: (usize, u64)) -> usize {
        let n = self.entries.len();
        let (mut hi, mut step) = (n, 1);
        while hi > 0 {
            let i = hi.saturating_sub(step);
            if self.entries[i].key() < k {
                // The answer lies in (i, hi].
                let (mut lo, mut up) = (i + 1, hi);
                while lo < up {
                    let mid = lo + (up - lo) / 2;
                    if self.entries[mid].key() < k {
                        lo = mid + 1;
                    } else {
                        up = mid;
                    }
                }
                return lo;
            }
            hi = i;
            step *= 2;
        }
        0
    }

    fn is_empty(&self) -> bool {
        self.entries.len() == self.dead
    }

    /// Drops dead entries from both ends, and from everywhere once they are half the side;
    /// their regions go back to the pool's free list.
    fn tidy(&mut self, free: &mut Vec<u32>) {
        if self.dead == 0 {
            return;
        }
        while self.entries.front().is_some_and(|e| e.dead) {
            if let Some(e) = self.entries.pop_front() {
                free.push(e.region);
            }
            self.dead -= 1;
        }
        while self.entries.back().is_some_and(|e| e.dead) {
            if let Some(e) = self.entries.pop_back() {
                free.push(e.region);
            }
            self.dead -= 1;
        }
        if self.dead >= 8 && self.dead * 2 >= self.entries.len() {
            self.entries.retain(|e| {
                if e.dead {
                    free.push(e.region);
                }
                !e.dead
            });
            self.dead = 0;
        }
    }
}

#[derive(Default, Debug)]
struct BufIndex {
    /// `[readers, writers]`.
    sides: [Side; 2],
}

impl BufIndex {
    fn is_empty(&self) -> bool {
        self.sides.iter().all(Side::is_empty)
    }

    /// The lookup of one access (see [`TensorMap::lookup`]); returns how many entries it
    /// removed.
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &mut self,
        pool: &mut RegionPool,
        region: &Region,
        probe: &Probe,
        write: bool,
        mut live: impl FnMut(TaskRef) -> Liveness,
        deps: &mut SmallVec<[TaskRef; 8]>,
    ) -> usize {
        let (s, e, contig) = (probe.start, probe.end, probe.contig);
        let mut removed = 0;
        // A read looks at writers only; a write at both.
        for side in &mut self.sides[usize::from(!write)..] {
            if side.is_empty() {
                continue;
            }
            // A small side is scanned whole: cheaper than searching it.
            let first = if side.entries.len() <= 8 {
                0
            } else {
                side.lower_bound((s.saturating_sub(side.max_len), 0))
            };
            let mut killed = 0;
            for ent in side.entries.range_mut(first..) {
                if ent.start >= e {
                    break;
                }
                if ent.dead || ent.end <= s || ent.start == ent.end {
                    continue;
                }
                let state = live(ent.task);
                if state == Liveness::Retired {
                    ent.dead = true;
                    killed += 1;
                    continue;
                }
                let o = if contig && ent.contig {
                    // Both fill their byte ranges, which intersect.
                    if s <= ent.start && ent.end <= e {
                        Overlap::Covers
                    } else {
                        Overlap::Partial
                    }
                } else {
                    overlap(region, pool.get(ent.region))
                };
                if o != Overlap::Disjoint {
                    deps.push(ent.task);
                    if write && o == Overlap::Covers && state == Liveness::Live {
                        ent.dead = true;
                        killed += 1;
                    }
                }
            }
            if killed > 0 {
                side.dead += killed;
                removed += killed;
                side.tidy(&mut pool.free);
            }
        }
        removed
    }
}

/// An access's byte range and layout, computed once for its lookup and its insert.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe {
    start: usize,
    end: usize,
    contig: bool,
}

impl Probe {
    pub(crate) fn of(region: &Region) -> Probe {
        let (start, end) = region.byte_range();
        Probe {
            start,
            end,
            contig: region.is_contiguous(),
        }
    }
}

/// What a query learns about an entry's task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// The task is live: a dependency.
    Live,
    /// The task retired after failing: a dependency that poisons.
    RetiredFailed,
    /// The task retired normally: the entry is stale.
    Retired,
}

/// The regions of the map's entries, by index; indices of removed entries are reused.
#[derive(Default, Debug)]
struct RegionPool {
    regions: Vec<Region>,
    free: Vec<u32>,
}

impl RegionPool {
    fn get(&self, i: u32) -> &Region {
        &self.regions[i as usize]
    }

    fn put(&mut self, r: &Region) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.regions[i as usize] = *r;
                i
            }
            None => {
                self.regions.push(*r);
                // Entries are bounded by the live tasks' arguments: far below u32::MAX.
                (self.regions.len() - 1) as u32
            }
        }
    }
}

#[derive(Default, Debug)]
pub(crate) struct TensorMap {
    bufs: FxHashMap<u64, BufIndex>,
    pool: RegionPool,
    seq: u64,
    /// Entries not dead.
    entries: usize,
    /// Sweep when `entries` reaches it.
    sweep_at: usize,
}

/// The least number of entries before a sweep.
const SWEEP_MIN: usize = 4096;

impl TensorMap {
    /// Finds the tasks an access of `region` of `buffer` depends on and pushes them to `deps`.
    /// A write depends on every overlapping entry; a read only on overlapping writes. A write
    /// removes the entries it covers, and every query removes the stale entries it meets.
    pub(crate) fn lookup(
        &mut self,
        buffer: u64,
        region: &Region,
        probe: &Probe,
        write: bool,
        live: impl FnMut(TaskRef) -> Liveness,
        deps: &mut SmallVec<[TaskRef; 8]>,
    ) {
        if probe.start == probe.end {
            return;
        }
        if let Some(idx) = self.bufs.get_mut(&buffer) {
            self.entries -= idx.scan(&mut self.pool, region, probe, write, live, deps);
        }
    }

    /// A task's access: [`TensorMap::lookup`], then records that `task` reads or writes
    /// `region` of `buffer` (one probe of the map for both).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn access(
        &mut self,
        buffer: u64,
        region: &Region,
        probe: &Probe,
        write: bool,
        task: TaskRef,
        live: impl FnMut(TaskRef) -> Liveness,
        deps: &mut SmallVec<[TaskRef; 8]>,
    ) {
        let idx = self.bufs.entry(buffer).or_default();
        if probe.start != probe.end {
            self.entries -= idx.scan(&mut self.pool, region, probe, write, live, deps);
        }
        self.seq += 1;
        self.entries += 1;
        let side = &mut idx.sides[usize::from(write)];
        side.max_len = side.max_len.max(probe.end - probe.start);
        let ent = Entry {
            start: probe.start,
            end: probe.end,
            seq: self.seq,
            task,
            contig: probe.contig,
            dead: false,
            region: self.pool.put(region),
        };
        // Usually past the last entry (increasing addresses, increasing sequence).
        if side.entries.back().is_none_or(|b| b.key() < ent.key()) {
            side.entries.push_back(ent);
        } else {
            let i = side.lower_bound(ent.key());
            side.entries.insert(i, ent);
        }
    }

    /// True once the map has grown enough since the last sweep that one is due.
    pub(crate) fn needs_sweep(&self) -> bool {
        self.entries >= self.sweep_at.max(SWEEP_MIN)
    }

    /// Drops every entry whose task retired (normally): one pass over the map. Buffers left
    /// without entries are forgotten.
    pub(crate) fn sweep(&mut self, mut live: impl FnMut(TaskRef) -> Liveness) {
        let mut left = 0;
        let free = &mut self.pool.free;
        self.bufs.retain(|_, idx| {
            for side in &mut idx.sides {
                side.entries.retain(|e| {
                    let keep = !e.dead && live(e.task) != Liveness::Retired;
                    if !keep {
                        free.push(e.region);
                    }
                    keep
                });
                side.dead = 0;
                left += side.entries.len();
            }
            !idx.is_empty()
        });
        self.entries = left;
        self.sweep_at = 2 * left;
    }

    /// Number of entries (for tests and statistics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bufs
            .values()
            .flat_map(|b| &b.sides)
            .map(|s| s.entries.len() - s.dead)
            .sum()
    }
}
