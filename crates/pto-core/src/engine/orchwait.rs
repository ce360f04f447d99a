//! Where the orchestrating thread waits: for ring space or the end of a run (a count of
//! finished tasks), or for one task (a read waits for a tensor's producers).
//!
//! Completions wake it only when what it waits for has happened: a serial chain costs one
//! wake-up per batch, not one per task, and a read is not woken by the completions of other
//! tasks (a futex wake-up on the finishing core thread's way to its next task, and on a busy
//! machine a preemption of it).
//!
//! No wake-up is lost. The waiter reads the futex word, publishes what it waits for, issues a
//! `SeqCst` fence and re-reads the finished count before it parks; a finishing thread
//! increments the count, issues a `SeqCst` fence and reads what the waiter waits for. Of the
//! two fences one comes first: either the finisher sees the waiter and bumps the word (the
//! park returns at once), or the waiter's re-read sees the increment and it does not park. Modelled with
//! loom in `tests/loom.rs`. See `docs/design/chip-scheduler.md`.

use std::time::Duration;

use super::sync::{fence, AtomicU32, AtomicU64, Ordering, Park};

/// See the module docs.
#[derive(Debug)]
pub struct OrchWait {
    word: AtomicU32,
    /// Wake once the finished count reaches this; `u64::MAX` while it does not wait for one.
    wake_at: AtomicU64,
    /// Wake when the task with this id plus one finishes; 0 while it does not wait for one.
    wake_task: AtomicU64,
}

impl Default for OrchWait {
    fn default() -> Self {
        OrchWait {
            word: AtomicU32::new(0),
            wake_at: AtomicU64::new(u64::MAX),
            wake_task: AtomicU64::new(0),
        }
    }
}

impl OrchWait {
    fn wake(&self) {
        self.word.fetch_add(1, Ordering::Release);
        self.word.unpark_all();
    }

    /// Parks until `finished()` reaches `at`, `timeout` passes, or [`OrchWait::poke`].
    pub fn park_until(&self, at: u64, finished: impl Fn() -> u64, timeout: Duration) {
        let seen = self.word.load(Ordering::Acquire);
        self.wake_at.store(at, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if finished() < at {
            self.word.park(seen, timeout);
        }
        self.wake_at.store(u64::MAX, Ordering::SeqCst);
    }

    /// Parks until the task `id` finishes, `timeout` passes, or any task has finished since
    /// `finished()` was `before` (the caller then looks again).
    pub fn park_for_task(
        &self,
        id: u64,
        before: u64,
        finished: impl Fn() -> u64,
        timeout: Duration,
    ) {
        let seen = self.word.load(Ordering::Acquire);
        self.wake_task.store(id + 1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if finished() == before {
            self.word.park(seen, timeout);
        }
        self.wake_task.store(0, Ordering::SeqCst);
    }

    /// After a finishing thread counted task `id` (a `SeqCst` increment that `finished()`
    /// sums): wakes the orchestrating thread if it waits for that task or that count.
    pub fn finished(&self, id: u64, finished: impl Fn() -> u64) {
        fence(Ordering::SeqCst);
        let at = self.wake_at.load(Ordering::SeqCst);
        if (at != u64::MAX && finished() >= at) || self.wake_task.load(Ordering::SeqCst) == id + 1 {
            self.wake();
        }
    }

    /// The cores ran out of work: wakes the orchestrating thread if it waits for a count (ring
    /// space, the end of a run), so that it refills them now. Reads do not refill anything.
    pub fn poke(&self) {
        fence(Ordering::SeqCst);
        if self.wake_at.load(Ordering::SeqCst) != u64::MAX {
            self.wake();
        }
    }
}
