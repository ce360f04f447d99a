//! The one task the orchestrating thread may hold back instead of queueing it (when it runs
//! tasks itself, `ChipBuilder::orchestrator_runs_tasks`): a single atomic word that every
//! party empties with a swap, so a held task is taken exactly once, by the orchestrating thread
//! (to run it, or to queue it when it holds the next one or is about to wait) or by a core
//! thread about to park (to queue it). Modelled with loom in `tests/loom.rs`. See
//! `docs/design/chip-scheduler.md`.

use super::sync::{AtomicU32, Ordering};

const NONE: u32 = u32::MAX;

/// See the module docs.
#[derive(Debug)]
pub struct Held(AtomicU32);

impl Default for Held {
    fn default() -> Self {
        Held(AtomicU32::new(NONE))
    }
}

impl Held {
    /// Holds `slot` (ready, its body installed); returns the task held before, which the
    /// caller must queue.
    pub fn put(&self, slot: u32) -> Option<u32> {
        let prev = self.0.swap(slot, Ordering::AcqRel);
        (prev != NONE).then_some(prev)
    }

    /// Takes the held task, if any: the caller runs or queues it.
    pub fn take(&self) -> Option<u32> {
        if self.0.load(Ordering::Acquire) == NONE {
            return None;
        }
        let h = self.0.swap(NONE, Ordering::AcqRel);
        (h != NONE).then_some(h)
    }

    /// True while a task is held.
    pub fn is_some(&self) -> bool {
        self.0.load(Ordering::Acquire) != NONE
    }
}
