//! The TensorMap's own unit tests (the engine's tests exercise it through submits).

use proptest::prelude::*;

use super::{Liveness, Probe, TensorMap};
use crate::dtype::DType;
use crate::engine::TaskRef;
use crate::geometry::Region;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// The one-pass probe agrees with the region's own byte range and contiguity test.
    #[test]
    fn probe_matches_the_region(
        offset in 0usize..50,
        dims in proptest::collection::vec((0usize..4, 1usize..30), 1..=5),
        wide in any::<bool>(),
        row_major in any::<bool>(),
    ) {
        let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
        let dtype = if wide { DType::F64 } else { DType::I16 };
        let r = if row_major {
            Region::contiguous(dtype, offset, &shape)
        } else {
            let strides: Vec<usize> = dims.iter().map(|d| d.1).collect();
            Region::checked(dtype, offset, &shape, &strides).unwrap()
        };
        let p = Probe::of(&r);
        prop_assert_eq!((p.start, p.end), r.byte_range());
        prop_assert_eq!(p.contig, r.is_contiguous());
    }
}

/// An access of a random sequence: buffer, element offset, length, write; then how many of the
/// tasks so far retire (normally, or failed when `fail`) before the next one.
type Step = (u64, usize, usize, bool, usize, bool);

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        (
            0u64..3,
            0usize..12,
            0usize..5,
            any::<bool>(),
            0usize..3,
            any::<bool>(),
        ),
        1..80,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Through tiled and general buffers, covering and partial writes, retired and failed
    /// tasks, and sweeps: every needed dependency is found and none is invented, and the
    /// live-entry count that triggers sweeps matches the entries actually held.
    #[test]
    fn dependencies_and_entry_count_match_a_model(steps in steps(), tiled in any::<bool>()) {
        // Half the cases keep to four tiles of four elements per buffer (and some empty
        // accesses), so that buffers stay tiled and tiles are read and written again.
        let steps: Vec<Step> = if tiled {
            steps
                .iter()
                .map(|&(b, off, len, w, r, f)| (b, off / 4 * 4, if len == 0 { 0 } else { 4 }, w, r, f))
                .collect()
        } else {
            steps
        };
        let mut m = TensorMap::default();
        // Task `i`'s fate: None while live, Some(failed) once retired.
        let mut fate: Vec<Option<bool>> = Vec::new();
        // The first step that saw task `i` retired.
        let mut seen_retired: Vec<usize> = Vec::new();
        let mut retired = 0;
        for (n, &(buf, off, len, write, retire, fail)) in steps.iter().enumerate() {
            let r = Region::contiguous(DType::F32, off, &[len]);
            let me = TaskRef { slot: n as u32, id: n as u64 };
            fate.push(None);
            let live = |x: TaskRef| match fate[x.id as usize] {
                None => Liveness::Live,
                Some(true) => Liveness::RetiredFailed,
                Some(false) => Liveness::Retired,
            };
            let mut deps: Vec<TaskRef> = Vec::new();
            m.access(buf, &r, &Probe::of(&r), write, me, live, &mut deps);
            prop_assert_eq!(m.entries, m.len());
            // Against a model of every earlier access of the same buffer: each dependency
            // overlaps this access (with a write on one side) and did not retire normally;
            // and the last writer of each byte, and for a write every reader since that
            // writer, is among them unless it retired normally. A write may leave out a live
            // last writer when a live reader since it is among them: that reader depends on
            // the writer, so the edge to the writer would be redundant.
            let bytes = |o: usize, l: usize| (o * 4)..((o + l) * 4);
            let here = bytes(off, len);
            let not_retired = |id: usize| fate[id] != Some(false);
            let mut must = std::collections::BTreeSet::new();
            for b in here.clone() {
                let mut readers = Vec::new();
                for (id, &(pb, po, pl, pw, _, _)) in steps[..n].iter().enumerate() {
                    if pb == buf && bytes(po, pl).contains(&b) {
                        if pw {
                            readers.clear();
                            readers.push((id, true));
                        } else {
                            readers.push((id, false));
                        }
                    }
                }
                let live_reader =
                    write && readers.iter().any(|&(id, w)| !w && fate[id].is_none());
                for (id, w) in readers {
                    let implied = w && live_reader && fate[id].is_none();
                    if (w || write) && not_retired(id) && !implied {
                        must.insert(id);
                    }
                }
            }
            for d in &deps {
                let (pb, po, pl, pw, _, _) = steps[d.id as usize];
                let p = bytes(po, pl);
                prop_assert!(d.id < me.id, "task {} depends on task {}", n, d.id);
                prop_assert!(pb == buf && p.start < here.end && here.start < p.end,
                    "task {} depends on task {}, which it does not overlap", n, d.id);
                prop_assert!(pw || write, "read {} depends on read {}", n, d.id);
                prop_assert!(not_retired(d.id as usize), "task {} depends on retired {}", n, d.id);
            }
            // A task that failed keeps poisoning: every later access that conflicts with it
            // depends on it, unless a write covered its bytes while it was still live.
            for (id, &(pb, po, pl, pw, _, _)) in steps[..n].iter().enumerate() {
                let p = bytes(po, pl);
                if fate[id] != Some(true) || pb != buf || !(pw || write) || p.is_empty() || here.is_empty()
                    || p.end <= here.start || here.end <= p.start {
                    continue;
                }
                let covered = steps[id + 1..n].iter().enumerate().any(|(k, w)| {
                    let (m, wr) = (id + 1 + k, bytes(w.1, w.2));
                    w.0 == buf && w.3 && wr.start <= p.start && p.end <= wr.end
                        && m < seen_retired[id]
                });
                if !covered {
                    must.insert(id);
                }
            }
            for id in must {
                prop_assert!(deps.iter().any(|d| d.id == id as u64),
                    "task {} misses its dependency on task {} (deps {:?})", n, id, deps);
            }
            for _ in 0..retire {
                if retired < n {
                    fate[retired] = Some(fail && retired % 3 == 0);
                    seen_retired.push(n + 1);
                    retired += 1;
                }
            }
            if n % 16 == 15 {
                let live = |x: TaskRef| match fate[x.id as usize] {
                    None => Liveness::Live,
                    Some(true) => Liveness::RetiredFailed,
                    Some(false) => Liveness::Retired,
                };
                m.sweep(live);
                prop_assert_eq!(m.entries, m.len());
            }
        }
    }
}

/// A tile keeps a plain one-dimensional region as a run rebuilt from its bytes, any other in
/// the pool; either way its region reads back exactly, the lattice test of a strided lookup
/// still tells disjoint elements apart, and turning the buffer general keeps every dependency.
#[test]
fn tile_regions_read_back_exactly_and_keep_their_dependencies() {
    let mut m = TensorMap::default();
    let live = |_: TaskRef| Liveness::Live;
    let task = |n: u64| TaskRef {
        slot: n as u32,
        id: n,
    };
    // Tasks 0..4 write elements 0..4 of an i64 vector (runs); task 4 writes element 7 through a
    // stride-3 view of one element (contiguous, but not a run: pooled).
    let mut regions = Vec::new();
    for i in 0..4 {
        regions.push(Region::contiguous(DType::I64, i, &[1]));
    }
    regions.push(Region::checked(DType::I64, 7, &[1], &[3]).unwrap());
    for (n, r) in regions.iter().enumerate() {
        let mut deps: Vec<TaskRef> = Vec::new();
        m.access(7, r, &Probe::of(r), true, task(n as u64), live, &mut deps);
        assert!(deps.is_empty(), "task {n}: {deps:?}");
    }
    let (pool, tiles) = {
        let i = m.bufs[&7] as usize;
        (&m.pool, m.indexes[i].tiles.as_ref().expect("still tiled"))
    };
    assert_eq!(pool.regions.len(), 1, "only the strided element is pooled");
    for (t, r) in tiles.tiles.iter().zip(&regions) {
        assert_eq!(t.region.get(t.start, t.end, pool), *r);
    }
    // Elements 0, 3, 6 and 9: the pooled tile (element 7, same strides) is told apart by the
    // lattice, the runs only by their bytes (other strides: conservatively every run the
    // extent reaches).
    let probe = Region::checked(DType::I64, 0, &[4], &[3]).unwrap();
    let mut deps: Vec<TaskRef> = Vec::new();
    m.lookup(7, &probe, &Probe::of(&probe), false, live, &mut deps);
    let mut ids: Vec<u64> = deps.iter().map(|d| d.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2, 3]);
    // A read of elements 1..3 overlaps two tiles partly: the buffer turns general, and a
    // write of elements 0..8 then depends on every writer and that reader.
    let r = Region::contiguous(DType::I64, 1, &[2]);
    let mut deps: Vec<TaskRef> = Vec::new();
    m.access(7, &r, &Probe::of(&r), false, task(5), live, &mut deps);
    let i = m.bufs[&7] as usize;
    assert!(m.indexes[i].tiles.is_none(), "turned general");
    let mut ids: Vec<u64> = deps.iter().map(|d| d.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2]);
    let all = Region::contiguous(DType::I64, 0, &[8]);
    let mut deps: Vec<TaskRef> = Vec::new();
    m.access(7, &all, &Probe::of(&all), true, task(6), live, &mut deps);
    let mut ids: Vec<u64> = deps.iter().map(|d| d.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 5]);
}
