//! The TensorMap: which live tasks touch which bytes of which buffer.
//!
//! Keyed by buffer id; within a buffer, entries are ordered by their first byte so that an
//! overlap query visits only entries that start within `max_len` bytes before the probe.
//! Entries are removed when their task retires (by exact key, so a newer producer of the same
//! bytes is never dropped), when a later writer covers them, or lazily when a query meets an
//! entry whose task has retired. See `docs/design/dependency-engine.md`.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::tensor::{overlap, Overlap, Region};

#[derive(Clone, Copy, Debug)]
struct Entry {
    task: u64,
    region: Region,
}

/// The entries of one buffer, readers and writers apart: a read only has to look at writers,
/// so many concurrent readers of one tensor cost nothing to later readers.
#[derive(Default, Debug)]
struct Side {
    entries: BTreeMap<(usize, u64), Entry>,
    max_len: usize,
}

#[derive(Default, Debug)]
struct BufIndex {
    /// `[readers, writers]`.
    sides: [Side; 2],
}

impl BufIndex {
    fn is_empty(&self) -> bool {
        self.sides.iter().all(|s| s.entries.is_empty())
    }
}

/// A key that finds one entry again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EntryKey {
    buffer: u64,
    write: bool,
    start: usize,
    seq: u64,
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

#[derive(Default, Debug)]
pub(crate) struct TensorMap {
    bufs: FxHashMap<u64, BufIndex>,
    seq: u64,
}

impl TensorMap {
    /// Finds the tasks an access of `region` of `buffer` depends on and pushes them to `deps`.
    /// A write depends on every overlapping entry; a read only on overlapping writes. A write
    /// removes the entries it covers, and every query removes the stale entries it meets.
    pub(crate) fn lookup(
        &mut self,
        buffer: u64,
        region: &Region,
        write: bool,
        mut live: impl FnMut(u64) -> Liveness,
        deps: &mut impl Extend<u64>,
    ) {
        let Some(idx) = self.bufs.get_mut(&buffer) else {
            return;
        };
        let (s, e) = region.byte_range();
        if s == e {
            return;
        }
        // A read looks at writers only; a write at both.
        for side in &mut idx.sides[usize::from(!write)..] {
            let lo = s.saturating_sub(side.max_len);
            let mut dead: smallvec::SmallVec<[(usize, u64); 8]> = smallvec::SmallVec::new();
            for (key, ent) in side.entries.range((lo, 0)..(e, 0)) {
                let state = live(ent.task);
                if state == Liveness::Retired {
                    dead.push(*key);
                    continue;
                }
                match overlap(region, &ent.region) {
                    Overlap::Disjoint => {}
                    o => {
                        deps.extend(Some(ent.task));
                        if write && o == Overlap::Covers && state == Liveness::Live {
                            dead.push(*key);
                        }
                    }
                }
            }
            for k in dead {
                side.entries.remove(&k);
            }
        }
        if idx.is_empty() {
            self.bufs.remove(&buffer);
        }
    }

    /// Records that `task` reads or writes `region` of `buffer`.
    pub(crate) fn insert(
        &mut self,
        buffer: u64,
        region: &Region,
        write: bool,
        task: u64,
    ) -> EntryKey {
        let (s, e) = region.byte_range();
        self.seq += 1;
        let side = &mut self.bufs.entry(buffer).or_default().sides[usize::from(write)];
        side.max_len = side.max_len.max(e - s);
        side.entries.insert(
            (s, self.seq),
            Entry {
                task,
                region: *region,
            },
        );
        EntryKey {
            buffer,
            write,
            start: s,
            seq: self.seq,
        }
    }

    /// Removes one entry (if still present).
    pub(crate) fn remove(&mut self, key: EntryKey) {
        if let Some(idx) = self.bufs.get_mut(&key.buffer) {
            idx.sides[usize::from(key.write)]
                .entries
                .remove(&(key.start, key.seq));
            if idx.is_empty() {
                self.bufs.remove(&key.buffer);
            }
        }
    }

    /// Number of entries (for tests and statistics).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bufs
            .values()
            .flat_map(|b| &b.sides)
            .map(|s| s.entries.len())
            .sum()
    }
}
