//! What a run leaves for the next one on the same engine: the orchestrating thread's memory
//! (free slots, per-slot state, TensorMap, rings with their heaps, scope lists, maps), emptied,
//! so that a run starts without allocating. See `docs/design/dependency-engine.md`.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{Aux, Orchestrator, RingConfig, Scope};
use crate::buffer::Buffer;
use crate::engine::ring::Ring;
use crate::engine::tensormap::TensorMap;
use crate::engine::{Engine, RunStats, TaskRef, NUM_RINGS};

/// What a run's orchestrating thread leaves for the next run on the same engine: memory, no
/// state (every collection is empty, the rings hold no task). A run then starts without
/// allocating: its slots, per-slot state, TensorMap, ring queues and ring heaps, scope lists
/// and maps are the last run's (the Worker runs one small program per chip task, where they
/// cost as much as the task).
#[derive(Default)]
pub(crate) struct Leftovers {
    tmap: TensorMap,
    free: Vec<u32>,
    aux: Vec<Aux>,
    kept: Vec<u32>,
    /// Empty rings, with their heaps; none after a stalled run (its tasks may still write).
    rings: Vec<Ring>,
    spare_scopes: Vec<Vec<TaskRef>>,
    retired_failed: FxHashMap<u64, u64>,
    owned: Vec<Buffer>,
    /// The scope stack's own memory (empty).
    scopes: Vec<Scope>,
}

impl Orchestrator {
    /// The orchestrating thread's state for a new run, made from what the last run left.
    pub(crate) fn new(engine: Arc<Engine>, rings: RingConfig, nonce: u64) -> Orchestrator {
        let Leftovers {
            tmap,
            free,
            aux,
            kept,
            rings: old_rings,
            mut spare_scopes,
            retired_failed,
            owned,
            mut scopes,
        } = engine
            .leftovers
            .lock()
            .take()
            .map(|l| *l)
            .unwrap_or_default();
        // The last run's rings keep their queues' memory and their heaps (a run with outputs
        // then maps no new heap); a ring of another size is made anew.
        let rings_now = if old_rings.len() == NUM_RINGS
            && old_rings
                .iter()
                .all(|r| r.fits(rings.window, rings.heap_bytes))
        {
            old_rings
        } else {
            (0..NUM_RINGS)
                .map(|_| Ring::new(rings.window, rings.heap_bytes))
                .collect()
        };
        scopes.push(Scope {
            manual: false,
            tasks: spare_scopes.pop().unwrap_or_default(),
        });
        Orchestrator {
            engine,
            next_id: 0,
            tmap,
            rings: rings_now,
            scopes,
            spare_scopes,
            retired_failed,
            aux,
            free,
            kept,
            next_slot: None,
            owned,
            rings_cfg: rings,
            nonce,
            since_publish: 0,
            stats: RunStats::default(),
        }
    }

    /// At the end of a run (every task reclaimed, or a stalled run's left): hands this run's
    /// memory, emptied, to the engine for the next run.
    pub(super) fn leave_leftovers(&mut self) {
        // The next run starts with empty collections that keep this one's memory.
        self.tmap.clear();
        self.retired_failed.clear();
        // A stalled run's tasks may still write their rings' heaps: those are not reused.
        let stalled = self.rings.iter().any(|r| !r.live.is_empty());
        let mut rings = std::mem::take(&mut self.rings);
        if stalled {
            rings.clear();
        } else {
            for r in &mut rings {
                r.reset();
            }
        }
        let mut spare_scopes = std::mem::take(&mut self.spare_scopes);
        let mut scopes = std::mem::take(&mut self.scopes);
        for mut sc in scopes.drain(..) {
            sc.tasks.clear();
            spare_scopes.push(sc.tasks);
        }
        *self.engine.leftovers.lock() = Some(Box::new(Leftovers {
            tmap: std::mem::take(&mut self.tmap),
            free: std::mem::take(&mut self.free),
            aux: std::mem::take(&mut self.aux),
            kept: std::mem::take(&mut self.kept),
            rings,
            spare_scopes,
            retired_failed: std::mem::take(&mut self.retired_failed),
            owned: std::mem::take(&mut self.owned),
            scopes,
        }));
    }
}
