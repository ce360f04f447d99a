//! The tiles of a tiled buffer (see the parent module): each distinct contiguous byte range
//! one [`Tile`] holding its last writer (its readers beside it), found without a search. See
//! `docs/design/dependency-engine.md`.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::{Liveness, RegionPool};
use crate::dtype::DType;
use crate::engine::TaskRef;
use crate::geometry::Region;

/// One tile of a tiled buffer: its bytes, its region, and its last writer, all a tile needs
/// while it is written once (a fan's outputs) or updated in place (a chain); readers and
/// writers that failed live in a [`TileExtra`] beside it, so that a tile stays a few words
/// (cheap to create, to visit in a sweep and to move when the sweep drops its neighbours).
#[derive(Debug)]
pub(super) struct Tile {
    pub(super) start: usize,
    pub(super) end: usize,
    /// The tile's region (for overlap tests of host lookups with gaps, and for turning the
    /// buffer general).
    pub(super) region: TileRegion,
    /// The index of the tile's [`TileExtra`] in [`Tiles::extras`], or [`NO_EXTRA`].
    extra: u32,
    /// The last writer, or [`NO_TASK`].
    writer: TaskRef,
}

/// A tile's readers since its last write, and the writers before it that failed (they keep
/// poisoning every later access).
#[derive(Debug, Default)]
pub(super) struct TileExtra {
    failed: SmallVec<[TaskRef; 1]>,
    readers: SmallVec<[TaskRef; 3]>,
    /// Retired readers are dropped when `readers` reaches this length (a tile read by many
    /// tasks between two writes, as a fan's source).
    prune_at: usize,
}

impl TileExtra {
    /// The next prune comes when the readers left now have doubled.
    fn next_prune(&mut self) {
        self.prune_at = (2 * self.readers.len()).max(MIN_PRUNE);
    }
}

/// [`Tile::extra`] of a tile with no readers and no failed writers.
const NO_EXTRA: u32 = u32::MAX;

/// [`Tile::writer`] of a tile with no writer.
const NO_TASK: TaskRef = TaskRef {
    slot: u32::MAX,
    id: u64::MAX,
};

/// Where a tile's region is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TileRegion {
    /// A one-dimensional run of elements of this dtype over the tile's bytes, rebuilt from
    /// them (most tiles: a fan over the elements of a vector adds one per task, and then
    /// neither a region is copied into the pool nor its slot freed).
    Run(DType),
    /// Any other region: its index in the map's pool.
    Pooled(u32),
}

impl TileRegion {
    /// How a tile over bytes `[s, e)` keeps `region`: as a run when rebuilding it gives the
    /// same region exactly, else in `pool`.
    pub(super) fn keep(region: &Region, s: usize, e: usize, pool: &mut RegionPool) -> TileRegion {
        let d = region.dtype();
        // The tile's bytes are this region's, so a run's offset and length follow from them.
        if region.is_run() {
            debug_assert_eq!(run(d, s, e), *region);
            TileRegion::Run(d)
        } else {
            TileRegion::Pooled(pool.put(region))
        }
    }

    /// The region of a tile over bytes `[s, e)`.
    pub(super) fn get(self, s: usize, e: usize, pool: &RegionPool) -> Region {
        match self {
            TileRegion::Run(d) => run(d, s, e),
            TileRegion::Pooled(i) => *pool.get(i),
        }
    }

    /// Gives a pooled region's slot back.
    pub(super) fn free(self, free: &mut Vec<u32>) {
        if let TileRegion::Pooled(i) = self {
            free.push(i);
        }
    }
}

/// The one-dimensional contiguous region of dtype `d` over bytes `[s, e)`.
fn run(d: DType, s: usize, e: usize) -> Region {
    let sz = d.size();
    Region::contiguous(d, s / sz, &[(e - s) / sz])
}

/// The least reader count at which a tile prunes its retired readers.
const MIN_PRUNE: usize = 8;

/// The tiles of a tiled buffer: pairwise disjoint, non-empty, contiguous byte ranges.
#[derive(Debug)]
pub(super) struct Tiles {
    pub(super) tiles: Vec<Tile>,
    /// First byte -> index in `tiles`, for the tiles accessed again (a tile enters at its
    /// second access: a program that writes each tile once pays no hash insert).
    pub(super) by_start: FxHashMap<usize, u32>,
    /// `(start, end, index in tiles)` of every tile, sorted by first byte: to find a tile not
    /// in `by_start`, to check that a new range is disjoint from the others, and to find the
    /// tiles a host lookup overlaps.
    pub(super) order: Vec<(usize, usize, u32)>,
    /// The tile accessed last, looked at first (a chain on one tensor).
    pub(super) last: usize,
    /// A direct-mapped cache in front of `by_start`: slot [`near_slot`]`(start)` holds the
    /// index of a tile recently found with that first byte. Entries are checked, never
    /// invalidated: first bytes are unique among tiles, so an index whose tile starts at the
    /// byte asked for is right however old it is.
    pub(super) near: [u32; NEAR],
    /// The tiles' [`TileExtra`]s, by index; those listed in `free_extras` belong to no tile
    /// (emptied, their memory kept).
    extras: Vec<TileExtra>,
    free_extras: Vec<u32>,
    /// Scratch of a sweep: each tile's new index (so that `order` is renumbered in place,
    /// without a sort).
    remap: Vec<u32>,
}

impl Default for Tiles {
    fn default() -> Tiles {
        Tiles {
            tiles: Vec::new(),
            by_start: FxHashMap::default(),
            order: Vec::new(),
            last: 0,
            near: [0; NEAR],
            extras: Vec::new(),
            free_extras: Vec::new(),
            remap: Vec::new(),
        }
    }
}

/// Slots of [`Tiles::near`].
const NEAR: usize = 64;

/// The slot of first byte `s` in [`Tiles::near`] (a multiplicative hash's top bits).
fn near_slot(s: usize) -> usize {
    ((s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
}

/// Where a tiled buffer's access goes.
pub(super) enum Found {
    /// The tile at this index has exactly the access's range.
    Tile(usize),
    /// A new range, disjoint from every tile: insert it at this index of `order`.
    New(usize),
    /// A partial overlap: the buffer must turn general.
    Clash,
}

impl Tiles {
    /// Where an access of bytes `[s, e)` goes: the tile accessed last, then a new range past
    /// every tile (an append), then the `near` cache, then the hash map, then a binary search of
    /// `order` (which puts a tile found there into the hash map, and checks a new range against
    /// its neighbours).
    pub(super) fn find(&mut self, s: usize, e: usize) -> Found {
        let tile = |i: usize, end: usize| {
            if end == e {
                Found::Tile(i)
            } else {
                Found::Clash
            }
        };
        if let Some(t) = self.tiles.get(self.last).filter(|t| t.start == s) {
            return tile(self.last, t.end);
        }
        // A new range past every tile (a program walking forward through a buffer).
        match self.order.last() {
            None => return Found::New(0),
            Some(&(_, last_end, _)) if last_end <= s => return Found::New(self.order.len()),
            _ => {}
        }
        let slot = near_slot(s);
        let near = self.near[slot] as usize;
        if let Some(t) = self.tiles.get(near).filter(|t| t.start == s) {
            return tile(near, t.end);
        }
        if let Some(&i) = self.by_start.get(&s) {
            self.near[slot] = i;
            return tile(i as usize, self.tiles[i as usize].end);
        }
        let at = self.order.partition_point(|&(ts, _, _)| ts < s);
        if let Some(&(ts, te, i)) = self.order.get(at).filter(|o| o.0 == s) {
            // A tile's second access: from now on it is found by hash.
            self.by_start.insert(ts, i);
            self.near[slot] = i;
            return tile(i as usize, te);
        }
        let prev_ok = at == 0 || self.order[at - 1].1 <= s;
        let next_ok = self.order.get(at).is_none_or(|&(ts, _, _)| e <= ts);
        if prev_ok && next_ok {
            Found::New(at)
        } else {
            Found::Clash
        }
    }

    pub(super) fn insert(&mut self, at: usize, s: usize, e: usize, region: TileRegion) -> usize {
        let i = self.tiles.len();
        self.tiles.push(Tile {
            start: s,
            end: e,
            region,
            extra: NO_EXTRA,
            writer: NO_TASK,
        });
        self.order.insert(at, (s, e, i as u32));
        i
    }

    /// Tile `i`'s extra, given one (a recycled one when at hand) if it has none.
    fn extra_mut(&mut self, i: usize) -> &mut TileExtra {
        let mut x = self.tiles[i].extra;
        if x == NO_EXTRA {
            x = match self.free_extras.pop() {
                Some(x) => x,
                None => {
                    self.extras.push(TileExtra {
                        prune_at: MIN_PRUNE,
                        ..TileExtra::default()
                    });
                    // Tiles are far fewer than u32::MAX.
                    (self.extras.len() - 1) as u32
                }
            };
            self.tiles[i].extra = x;
        }
        &mut self.extras[x as usize]
    }

    /// Tile `i`'s entries: its writers (the last one and those that failed) and its readers.
    pub(super) fn tasks(&self, i: usize) -> (SmallVec<[TaskRef; 2]>, &[TaskRef]) {
        let t = &self.tiles[i];
        let mut writers = SmallVec::new();
        let mut readers: &[TaskRef] = &[];
        if let Some(x) = self.extras.get(t.extra as usize) {
            writers.extend_from_slice(&x.failed);
            readers = &x.readers;
        }
        if t.writer != NO_TASK {
            writers.push(t.writer);
        }
        (writers, readers)
    }

    /// How many entries tile `i` holds.
    pub(super) fn entries(&self, i: usize) -> usize {
        let t = &self.tiles[i];
        let x = self
            .extras
            .get(t.extra as usize)
            .map_or(0, |x| x.failed.len() + x.readers.len());
        usize::from(t.writer != NO_TASK) + x
    }

    /// Every tile's entries.
    pub(super) fn len(&self) -> usize {
        (0..self.tiles.len()).map(|i| self.entries(i)).sum()
    }

    /// Forgets every tile, keeping the memory (up to `keep` tiles' worth once trimmed).
    pub(super) fn clear(&mut self) {
        self.tiles.clear();
        self.by_start.clear();
        self.order.clear();
        self.extras.clear();
        self.free_extras.clear();
    }

    /// Bounds the memory an emptied set of tiles keeps.
    pub(super) fn trim(&mut self, keep: usize) {
        self.tiles.shrink_to(keep);
        self.order.shrink_to(keep);
        self.by_start.shrink_to(keep);
        self.extras.shrink_to(keep);
        self.free_extras.shrink_to(keep);
        self.remap.shrink_to(keep);
    }

    /// The dependencies of a lookup that overlaps tile `i` (a read's: its writers; a write's:
    /// its readers too), nothing removed.
    pub(super) fn deps(
        &self,
        i: usize,
        write: bool,
        mut live: impl FnMut(TaskRef) -> Liveness,
        deps: &mut Vec<TaskRef>,
    ) {
        let (writers, readers) = self.tasks(i);
        let readers = if write { readers } else { &[] };
        for &x in writers.iter().chain(readers) {
            if live(x) != Liveness::Retired {
                deps.push(x);
            }
        }
    }

    /// An access to exactly tile `i`: a read depends on the writers, a write on the writers
    /// and readers (which it covers: the live ones leave). Returns the entries removed.
    pub(super) fn access(
        &mut self,
        i: usize,
        write: bool,
        task: TaskRef,
        mut live: impl FnMut(TaskRef) -> Liveness,
        deps: &mut Vec<TaskRef>,
    ) -> usize {
        let t = &mut self.tiles[i];
        let w = t.writer;
        let mut removed = 0;
        if write {
            t.writer = task;
            // Every entry is a dependency unless retired; none stays unless it failed (it
            // poisons every later access).
            let mut failed = false;
            // The writer's edge, unless a live reader of this tile makes it redundant (below).
            let mut writer_dep = false;
            if w != NO_TASK {
                removed += 1;
                match live(w) {
                    Liveness::Retired => {}
                    Liveness::Live => writer_dep = true,
                    Liveness::RetiredFailed => {
                        deps.push(w);
                        failed = true;
                    }
                }
            }
            let Some(x) = self.extras.get_mut(t.extra as usize) else {
                if writer_dep {
                    deps.push(w);
                }
                if failed {
                    self.extra_mut(i).failed.push(w);
                    removed -= 1;
                }
                return removed;
            };
            let mut others = false;
            let mut live_reader = false;
            let n_failed = x.failed.len();
            for (k, &y) in x.failed.iter().chain(&x.readers).enumerate() {
                removed += 1;
                match live(y) {
                    Liveness::Retired => {}
                    Liveness::Live => {
                        deps.push(y);
                        live_reader |= k >= n_failed;
                    }
                    Liveness::RetiredFailed => {
                        deps.push(y);
                        others = true;
                    }
                }
            }
            // Every reader listed here read the tile after `w` wrote it, so it finishes after
            // `w` (an edge was wired, or `w` had finished when it was submitted) and is
            // poisoned if `w` fails: with one of them live, an edge to it orders this write
            // after `w` too, and the edge to `w` would be redundant (transitive). One locked
            // append fewer per write-after-read (a diamond's task: three edges, not four).
            if writer_dep && !live_reader {
                deps.push(w);
            }
            if others {
                x.failed.retain(|y| live(*y) == Liveness::RetiredFailed);
                x.readers.retain(|y| live(*y) == Liveness::RetiredFailed);
                removed -= x.failed.len() + x.readers.len();
            } else {
                x.failed.clear();
                x.readers.clear();
            }
            if failed {
                x.failed.push(w);
                removed -= 1;
            }
            return removed;
        }
        // A read. A retired writer leaves; the others are dependencies.
        if w != NO_TASK {
            if live(w) == Liveness::Retired {
                t.writer = NO_TASK;
                removed += 1;
            } else {
                deps.push(w);
            }
        }
        let x = self.extra_mut(i);
        if !x.failed.is_empty() {
            for &y in &x.failed {
                if live(y) != Liveness::Retired {
                    deps.push(y);
                }
            }
            let before = x.failed.len();
            x.failed.retain(|y| live(*y) != Liveness::Retired);
            removed += before - x.failed.len();
        }
        if x.readers.len() >= x.prune_at {
            let before = x.readers.len();
            x.readers.retain(|y| live(*y) != Liveness::Retired);
            removed += before - x.readers.len();
            x.next_prune();
        }
        x.readers.push(task);
        // The new entry is counted by the caller.
        removed
    }

    /// Drops every entry of a task that retired normally, then every tile left empty (its
    /// pooled region back to `free`); returns the entries left. `order` keeps its order: its
    /// indices are renumbered, not sorted again.
    pub(super) fn sweep(
        &mut self,
        mut live: impl FnMut(TaskRef) -> Liveness,
        free: &mut Vec<u32>,
    ) -> usize {
        let mut left = 0;
        let mut emptied = 0;
        for t in &mut self.tiles {
            // Most tiles hold one writer and nothing else: no extra to visit.
            if t.writer != NO_TASK && live(t.writer) == Liveness::Retired {
                t.writer = NO_TASK;
            }
            let mut n = usize::from(t.writer != NO_TASK);
            if let Some(x) = self.extras.get_mut(t.extra as usize) {
                if !x.failed.is_empty() {
                    x.failed.retain(|y| live(*y) != Liveness::Retired);
                }
                if !x.readers.is_empty() {
                    x.readers.retain(|y| live(*y) != Liveness::Retired);
                }
                x.next_prune();
                n += x.failed.len() + x.readers.len();
            }
            left += n;
            emptied += usize::from(n == 0);
        }
        if emptied == 0 {
            return left;
        }
        let Tiles {
            tiles,
            by_start,
            order,
            extras,
            free_extras,
            remap,
            ..
        } = self;
        remap.clear();
        let mut kept = 0u32;
        tiles.retain(|t| {
            let x = extras.get(t.extra as usize);
            let empty = t.writer == NO_TASK
                && x.is_none_or(|x| x.failed.is_empty() && x.readers.is_empty());
            if empty {
                t.region.free(free);
                if x.is_some() {
                    free_extras.push(t.extra);
                }
                remap.push(u32::MAX);
            } else {
                remap.push(kept);
                kept += 1;
            }
            !empty
        });
        order.retain_mut(|o| {
            o.2 = remap[o.2 as usize];
            o.2 != u32::MAX
        });
        by_start.clear();
        left
    }
}
