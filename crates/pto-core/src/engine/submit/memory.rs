//! The orchestrating thread's collections ([`RunMemory`]), which a run leaves to the next one on
//! the same engine, emptied (free slots, per-slot state, TensorMap, rings with their heaps, scope
//! lists, maps), so that a run starts without allocating. See `docs/design/dependency-engine.md`.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{Aux, Orchestrator, RingConfig, Scope};
use crate::buffer::Buffer;
use crate::engine::ring::Ring;
use crate::engine::tensormap::TensorMap;
use crate::engine::{Engine, RunStats, TaskRef, NUM_RINGS};

/// The orchestrating thread's collections: memory it keeps from one run to the next (a run
/// hands them to the engine emptied, with no task in the rings). A run then starts without
/// allocating: its slots, per-slot state, TensorMap, ring queues and ring heaps, scope lists
/// and maps are the last run's (the Worker runs one small program per chip task, where they
/// cost as much as the task).
#[derive(Default)]
pub(crate) struct RunMemory {
    pub(super) tmap: TensorMap,
    pub(super) free: Vec<u32>,
    pub(super) aux: Vec<Aux>,
    /// The nodes that may hold their last task's kernel (each once; see `Aux::kept`): at the
    /// end of a run the free ones let go of it, without a walk over every node.
    pub(super) kept: Vec<u32>,
    /// The rings; left for the next run empty with their heaps, or not at all after a
    /// stalled run (its tasks may still write them).
    pub(super) rings: Vec<Ring>,
    /// Emptied task lists of ended scopes, reused by the next ones.
    pub(super) spare_scopes: Vec<Vec<TaskRef>>,
    pub(super) retired_failed: FxHashMap<u64, u64>,
    /// Buffers this run claimed: its tasks use them without registering borrows.
    pub(super) owned: Vec<Buffer>,
    /// The scope stack.
    pub(super) scopes: Vec<Scope>,
    /// Deferred tasks a reclaim retired, to leave the engine's map of them in one batch.
    pub(super) retired_deferred: Vec<u64>,
    /// A commit's working lists (its producers, the ids it names, the producers it wires),
    /// emptied and reused by every commit: no inline-or-heap check at each push, as a
    /// `SmallVec`'s costs.
    pub(super) scratch: Scratch,
}

/// See [`RunMemory::scratch`].
#[derive(Default)]
pub(crate) struct Scratch {
    pub(super) deps: Vec<TaskRef>,
    pub(super) explicit: Vec<u64>,
    pub(super) wire: Vec<u32>,
}

impl Orchestrator {
    /// The orchestrating thread's state for a new run, made from what the last run left.
    pub(crate) fn new(engine: Arc<Engine>, rings: RingConfig, nonce: u64) -> Orchestrator {
        let mut mem = engine.leftovers.lock().take().unwrap_or_default();
        // The last run's rings keep their queues' memory and their heaps (a run with outputs
        // then maps no new heap); a ring of another size is made anew.
        let fits = mem.rings.len() == NUM_RINGS
            && mem
                .rings
                .iter()
                .all(|r| r.fits(rings.window, rings.heap_bytes));
        if !fits {
            mem.rings = (0..NUM_RINGS)
                .map(|_| Ring::new(rings.window, rings.heap_bytes))
                .collect();
        }
        let tasks = mem.spare_scopes.pop().unwrap_or_default();
        mem.scopes.push(Scope {
            manual: false,
            tasks,
        });
        Orchestrator {
            engine,
            next_id: 0,
            mem,
            next_slot: None,
            rings_cfg: rings,
            nonce,
            since_publish: 0,
            stats: RunStats::default(),
        }
    }

    /// At the end of a run (every task reclaimed, or a stalled run's left): hands this run's
    /// memory, emptied, to the engine for the next run.
    pub(super) fn leave_leftovers(self) {
        let Orchestrator {
            engine, mut mem, ..
        } = self;
        let m = &mut *mem;
        m.tmap.clear();
        m.retired_failed.clear();
        // A stalled run's tasks may still write their rings' heaps: those are not reused.
        if m.rings.iter().any(|r| !r.live.is_empty()) {
            m.rings.clear();
        } else {
            for r in &mut m.rings {
                r.reset();
            }
        }
        for mut sc in m.scopes.drain(..) {
            sc.tasks.clear();
            m.spare_scopes.push(sc.tasks);
        }
        // The box itself goes back: nothing is copied or allocated.
        *engine.leftovers.lock() = Some(mem);
    }
}
