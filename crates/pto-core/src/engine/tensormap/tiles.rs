//! The tiles of a tiled buffer (see the parent module): each distinct contiguous byte range
//! one [`Tile`] holding its last writer and the readers since, found without a search.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::{Liveness, RegionPool};
use crate::dtype::DType;
use crate::engine::TaskRef;
use crate::geometry::Region;

/// The tasks that access one tile of a tiled buffer: the writers (the last one, plus writers
/// that failed, which keep poisoning) and the readers since the last write.
#[derive(Debug)]
pub(super) struct Tile {
    pub(super) start: usize,
    pub(super) end: usize,
    /// The tile's region (for overlap tests of host lookups with gaps, and for turning the
    /// buffer general).
    pub(super) region: TileRegion,
    pub(super) writers: SmallVec<[TaskRef; 1]>,
    pub(super) readers: SmallVec<[TaskRef; 3]>,
    /// Retired readers are dropped when `readers` reaches this length (a tile read by many
    /// tasks between two writes, as a fan's source).
    pub(super) prune_at: usize,
}

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
pub(super) const MIN_PRUNE: usize = 8;

impl Tile {
    /// The next prune comes when the readers left now have doubled.
    pub(super) fn next_prune(&mut self) {
        self.prune_at = (2 * self.readers.len()).max(MIN_PRUNE);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.writers.is_empty() && self.readers.is_empty()
    }
}

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
}

impl Default for Tiles {
    fn default() -> Tiles {
        Tiles {
            tiles: Vec::new(),
            by_start: FxHashMap::default(),
            order: Vec::new(),
            last: 0,
            near: [0; NEAR],
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
            writers: SmallVec::new(),
            readers: SmallVec::new(),
            prune_at: MIN_PRUNE,
        });
        self.order.insert(at, (s, e, i as u32));
        i
    }
}

/// A tiled buffer's access to exactly tile `t`: a read depends on the writers, a write on the
/// writers and readers (which it covers: the live ones leave). Returns the entries removed.
pub(super) fn tile_access(
    t: &mut Tile,
    write: bool,
    task: TaskRef,
    mut live: impl FnMut(TaskRef) -> Liveness,
    deps: &mut SmallVec<[TaskRef; 8]>,
) -> usize {
    // Counted as they go (the common paths take no length of a small vector).
    let mut removed = 0;
    if write {
        // Every entry is a dependency unless retired; none stays unless it failed (it
        // poisons every later access).
        let mut failed = false;
        for &x in t.writers.iter().chain(&t.readers) {
            removed += 1;
            match live(x) {
                Liveness::Retired => {}
                Liveness::Live => deps.push(x),
                Liveness::RetiredFailed => {
                    deps.push(x);
                    failed = true;
                }
            }
        }
        if failed {
            t.writers.retain(|x| live(*x) == Liveness::RetiredFailed);
            t.readers.retain(|x| live(*x) == Liveness::RetiredFailed);
            removed -= t.writers.len() + t.readers.len();
        } else {
            t.writers.clear();
            t.readers.clear();
        }
        t.writers.push(task);
    } else {
        // A retired writer leaves; the others are dependencies.
        let mut retired = false;
        for &x in &t.writers {
            if live(x) == Liveness::Retired {
                retired = true;
            } else {
                deps.push(x);
            }
        }
        if retired {
            let before = t.writers.len();
            t.writers.retain(|x| live(*x) != Liveness::Retired);
            removed += before - t.writers.len();
        }
        if t.readers.len() >= t.prune_at {
            let before = t.readers.len();
            t.readers.retain(|x| live(*x) != Liveness::Retired);
            removed += before - t.readers.len();
            t.next_prune();
        }
        t.readers.push(task);
    }
    // The new entry is counted by the caller.
    removed
}
