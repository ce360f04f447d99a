//! The TensorMap: which live tasks touch which bytes of which buffer.
//!
//! Keyed by buffer id. A buffer starts *tiled*: while every access to it is a contiguous byte
//! range that is either identical to or disjoint from every other range it holds entries for
//! (the tiles of a tiled program, one tensor updated again and again), each range is one
//! [`Tile`] (found by [`Tiles::find`]), and an access depends only on its own tile's writer and
//! readers (no search, no overlap test). The first access that breaks this (a
//! partial overlap, or a layout with gaps) turns the buffer *general*: its tiles become
//! entries ordered by their first byte so that an
//! overlap query visits only entries that start within `max_len` bytes before the probe.
//! Entries leave when a later writer covers them, lazily when a query meets an entry whose
//! task has retired, and in batches: once the map holds twice the entries it held after the
//! last sweep, the orchestrating thread drops every entry of a retired task in one pass (so a
//! task's retirement costs no per-entry search). Entries of a task that failed stay (they
//! poison later readers). See `docs/design/dependency-engine.md`.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::TaskRef;
use crate::geometry::{overlap, Overlap, Region};

mod tiles;

use tiles::{Found, TileRegion, Tiles};

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

#[derive(Debug)]
struct BufIndex {
    /// `Some` while the buffer is tiled (then `sides` are empty).
    tiles: Option<Tiles>,
    /// A general buffer's entries: `[readers, writers]`.
    sides: [Side; 2],
}

impl Default for BufIndex {
    fn default() -> BufIndex {
        BufIndex {
            tiles: Some(Tiles::default()),
            sides: Default::default(),
        }
    }
}

impl BufIndex {
    fn is_empty(&self) -> bool {
        match &self.tiles {
            Some(t) => t.len() == 0,
            None => self.sides.iter().all(Side::is_empty),
        }
    }

    /// Empties an index whose entries are all gone (their regions freed), keeping its memory;
    /// it starts tiled again.
    fn reset(&mut self) {
        match &mut self.tiles {
            Some(t) => t.clear(),
            None => self.tiles = Some(Tiles::default()),
        }
        for side in &mut self.sides {
            side.entries.clear();
            side.dead = 0;
            side.max_len = 0;
        }
    }

    /// Bounds the memory an emptied index keeps.
    fn trim(&mut self) {
        if let Some(t) = &mut self.tiles {
            t.trim(KEEP);
        }
        for side in &mut self.sides {
            side.entries.shrink_to(KEEP);
        }
    }

    /// Turns a tiled buffer general: every task of every tile becomes an entry.
    fn make_general(&mut self, pool: &mut RegionPool, seq: &mut u64) {
        let Some(tiles) = self.tiles.take() else {
            return;
        };
        // In address order, so that the sides are sorted as they are built.
        for &(_, _, i) in &tiles.order {
            let t = &tiles.tiles[i as usize];
            let region = t.region.get(t.start, t.end, pool);
            let (writers, readers) = tiles.tasks(i as usize);
            for (write, list) in [(false, readers), (true, &writers[..])] {
                let side = &mut self.sides[usize::from(write)];
                for &task in list {
                    *seq += 1;
                    side.max_len = side.max_len.max(t.end - t.start);
                    side.entries.push_back(Entry {
                        start: t.start,
                        end: t.end,
                        seq: *seq,
                        task,
                        contig: true,
                        dead: false,
                        region: pool.put(&region),
                    });
                }
            }
        }
        for t in &tiles.tiles {
            t.region.free(&mut pool.free);
        }
    }

    /// A tiled buffer's lookup of a range that may span several tiles (or have gaps): the
    /// dependencies only, nothing removed.
    fn scan_tiles(
        tiles: &Tiles,
        pool: &RegionPool,
        region: &Region,
        probe: &Probe,
        write: bool,
        mut live: impl FnMut(TaskRef) -> Liveness,
        deps: &mut Vec<TaskRef>,
    ) {
        let (s, e) = (probe.start, probe.end);
        let first = tiles.order.partition_point(|&(_, te, _)| te <= s);
        for &(ts, _, i) in &tiles.order[first..] {
            if ts >= e {
                break;
            }
            let t = &tiles.tiles[i as usize];
            if !probe.contig
                && overlap(region, &t.region.get(t.start, t.end, pool)) == Overlap::Disjoint
            {
                continue;
            }
            tiles.deps(i as usize, write, &mut live, deps);
        }
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
        deps: &mut Vec<TaskRef>,
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
    /// [`Region::byte_range`] and [`Region::is_contiguous`] in one pass over the dimensions
    /// (one per tensor argument of every task).
    #[inline(always)]
    pub(crate) fn of(region: &Region) -> Probe {
        if region.ndims == 1 {
            // One dimension (most views of a tiled program's vectors): no loop, no call.
            let sz = region.dtype().size();
            let (n, st) = (region.dim(0), region.stride(0));
            let start = region.offset * sz;
            let end = if n == 0 {
                start
            } else {
                (region.offset + (n - 1) * st + 1) * sz
            };
            return Probe {
                start,
                end,
                contig: n == 1 || st == 1,
            };
        }
        Probe::of_dims(region)
    }

    /// [`Probe::of`] of a region of several dimensions.
    fn of_dims(region: &Region) -> Probe {
        let sz = region.dtype().size();
        if region.ndims == 2 {
            // Two dimensions (tiles of a matrix): the loop below, unrolled.
            let ([n0, n1, ..], [s0, s1, ..]) = (region.shape, region.strides);
            let (n0, n1, s0, s1) = (n0 as usize, n1 as usize, s0 as usize, s1 as usize);
            let start = region.offset * sz;
            let end = if n0 == 0 || n1 == 0 {
                start
            } else {
                (region.offset + (n0 - 1) * s0 + (n1 - 1) * s1 + 1) * sz
            };
            return Probe {
                start,
                end,
                contig: (n1 == 1 || s1 == 1) && (n0 == 1 || s0 == n1),
            };
        }
        // Innermost first: contiguous while each stride is the product of the inner extents.
        let (mut ext, mut acc, mut contig, mut empty) = (0usize, 1usize, true, false);
        for (n, st) in region.dims().rev() {
            if n == 0 {
                empty = true;
            } else {
                ext += (n - 1) * st;
            }
            if n != 1 && st != acc {
                contig = false;
            }
            acc *= n;
        }
        let start = region.offset() * sz;
        let end = if empty {
            start
        } else {
            (region.offset() + ext + 1) * sz
        };
        Probe { start, end, contig }
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
    /// Buffer id -> its index's place in `indexes`.
    bufs: FxHashMap<u64, u32>,
    /// The buffers' indexes; the places listed in `vacant` belong to no buffer (emptied, up
    /// to [`SPARE`] of them keeping their memory for the next buffers: a buffer whose tasks
    /// all retire by a sweep comes back at its next access).
    indexes: Vec<BufIndex>,
    vacant: Vec<u32>,
    /// `(buffer id, place)` of the two buffers accessed last, looked at before the hash map
    /// (a task's arguments mostly name the buffers the task before named).
    recent: [Option<(u64, u32)>; 2],
    /// Which entry of `recent` was hit (or filled) last.
    hit: usize,
    pool: RegionPool,
    seq: u64,
    /// Entries not dead.
    entries: usize,
    /// Sweep when `entries` reaches it.
    sweep_at: usize,
}

/// Emptied buffer indexes kept for reuse.
const SPARE: usize = 4;

/// Entries (tiles, regions) whose memory an emptied index or pool keeps between runs.
const KEEP: usize = 8192;

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
        deps: &mut Vec<TaskRef>,
    ) {
        if probe.start == probe.end {
            return;
        }
        if let Some(i) = self.find(buffer) {
            let idx = &mut self.indexes[i];
            match &idx.tiles {
                Some(tiles) => {
                    BufIndex::scan_tiles(tiles, &self.pool, region, probe, write, live, deps);
                }
                None => {
                    self.entries -= idx.scan(&mut self.pool, region, probe, write, live, deps);
                }
            }
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
        deps: &mut Vec<TaskRef>,
    ) {
        let i = self.place(buffer);
        let idx = &mut self.indexes[i];
        if let Some(tiles) = &mut idx.tiles {
            if probe.start == probe.end {
                // Touches no byte: no dependency and no entry.
                return;
            }
            let found = if probe.contig {
                tiles.find(probe.start, probe.end)
            } else {
                Found::Clash
            };
            let i = match found {
                Found::Tile(i) => Some(i),
                Found::New(at) => {
                    let r = TileRegion::keep(region, probe.start, probe.end, &mut self.pool);
                    Some(tiles.insert(at, probe.start, probe.end, r))
                }
                Found::Clash => None,
            };
            if let Some(i) = i {
                tiles.last = i;
                self.entries -= tiles.access(i, write, task, live, deps);
                self.entries += 1;
                return;
            }
            idx.make_general(&mut self.pool, &mut self.seq);
        }
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

    /// Puts `(buffer, place)` in the recent entry not hit last.
    #[inline]
    fn remember(&mut self, buffer: u64, i: u32) {
        let victim = 1 - self.hit;
        self.recent[victim] = Some((buffer, i));
        self.hit = victim;
    }

    /// The place of `buffer`'s index, if it has one.
    #[inline]
    fn find(&mut self, buffer: u64) -> Option<usize> {
        // A hit moves nothing (a task alternating between two buffers writes no cache); a miss
        // replaces the entry not hit last.
        match self.recent {
            [Some((b, i)), _] if b == buffer => {
                self.hit = 0;
                Some(i as usize)
            }
            [_, Some((b, i))] if b == buffer => {
                self.hit = 1;
                Some(i as usize)
            }
            _ => {
                let i = *self.bufs.get(&buffer)?;
                self.remember(buffer, i);
                Some(i as usize)
            }
        }
    }

    /// The place of `buffer`'s index, given one (a vacant place) if it has none.
    #[inline]
    fn place(&mut self, buffer: u64) -> usize {
        if let Some(i) = self.find(buffer) {
            return i;
        }
        let i = match self.vacant.pop() {
            Some(i) => i,
            None => {
                self.indexes.push(BufIndex::default());
                // Buffers with live entries are far fewer than u32::MAX.
                (self.indexes.len() - 1) as u32
            }
        };
        self.bufs.insert(buffer, i);
        self.remember(buffer, i);
        i as usize
    }

    /// Forgets every entry (a run's end: its tasks' references mean nothing to the next run),
    /// keeping some memory for the next run: the indexes of up to [`SPARE`] buffers, each
    /// trimmed to [`KEEP`] entries, and the region pool.
    pub(crate) fn clear(&mut self) {
        self.bufs.clear();
        self.recent = [None; 2];
        self.vacant.clear();
        self.indexes.truncate(SPARE);
        for (i, idx) in self.indexes.iter_mut().enumerate() {
            idx.reset();
            idx.trim();
            self.vacant.push(i as u32);
        }
        self.pool.regions.clear();
        self.pool.regions.shrink_to(KEEP);
        self.pool.free.clear();
        self.pool.free.shrink_to(KEEP);
        self.seq = 0;
        self.entries = 0;
        self.sweep_at = 0;
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
        let (indexes, vacant) = (&mut self.indexes, &mut self.vacant);
        // An emptied index's place becomes vacant, keeping its memory while few do.
        let mut keep = |idx: &mut BufIndex, i: u32, kept: bool| {
            if !kept {
                if vacant.len() < SPARE {
                    idx.reset();
                } else {
                    *idx = BufIndex::default();
                }
                vacant.push(i);
            }
            kept
        };
        self.recent = [None; 2];
        self.bufs.retain(|_, &mut i| {
            let idx = &mut indexes[i as usize];
            if let Some(tiles) = &mut idx.tiles {
                left += tiles.sweep(&mut live, free);
                let kept = !tiles.tiles.is_empty();
                return keep(idx, i, kept);
            }
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
            let kept = !idx.is_empty();
            keep(idx, i, kept)
        });
        self.entries = left;
        self.sweep_at = 2 * left;
    }

    /// Number of entries (for tests and statistics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bufs
            .values()
            .map(|&i| {
                let b = &self.indexes[i as usize];
                match &b.tiles {
                    Some(t) => t.len(),
                    None => b.sides.iter().map(|s| s.entries.len() - s.dead).sum(),
                }
            })
            .sum::<usize>()
    }
}

#[cfg(test)]
mod tests;
