//! A CPU kept for the orchestrating thread: one core thread stays parked while it submits.
//!
//! When a chip's core threads alone fill every CPU, the orchestrating thread is one thread too
//! many: while it submits, a core thread that has run out of work spins beside it and the
//! kernel's scheduler shares two CPUs among three runnable threads, so the thread every task
//! goes through loses a third of its time. The chip therefore *reserves* its last core thread:
//! while the orchestrating thread is *busy* (running the program between its waits), that
//! thread runs only what it already holds and parks instead of looking for more; when the
//! orchestrating thread waits (for ring space, for a tensor's producers, for the end of the
//! run), it *releases* the reserve and the reserved thread works like any other until the
//! orchestrating thread is busy again. An OpenMP team does the same: `OMP_NUM_THREADS=2` is the
//! master that creates tasks plus one worker, and the master runs tasks only at a `taskwait`.
//!
//! No release is lost. The reserved thread counts itself in `parked`, issues a `SeqCst` fence
//! and parks only if it then still reads `busy == 1` (the futex compares the word too); the
//! orchestrating thread stores `busy = 0`, issues a `SeqCst` fence and reads `parked`. Of the
//! two fences one comes first: either the orchestrating thread sees the parked thread and
//! wakes it, or the parked thread sees the release and does not sleep. Modelled with loom in
//! `tests/loom.rs`.
//!
//! Nothing waits on the reserve alone: the reserved thread's park has a deadline
//! ([`Reserve::park`]'s `timeout`), after which it runs ready work anyway when nothing moved
//! meanwhile (the orchestrating thread blocked outside the engine, or the other core threads
//! stuck in kernels that wait for a queued task). See `docs/design/chip-scheduler.md`.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::sync::{fence, AtomicU32, Ordering, Park};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Reserve {
    /// 1 while the orchestrating thread is busy: the reserved thread keeps out. The word the
    /// reserved thread parks on. Written only at the orchestrating thread's waits.
    busy: CachePadded<AtomicU32>,
    /// Reserved threads parked (or about to park) now.
    parked: CachePadded<AtomicU32>,
}

impl Reserve {
    /// The orchestrating thread is busy again (it starts the program, or a wait ended).
    /// Orchestrating thread only.
    pub fn hold(&self) {
        self.busy.store(1, Ordering::SeqCst);
    }

    /// The orchestrating thread waits (or the run ends): the reserved thread may work. It is
    /// woken only when `wanted` says there is work for it (a parked reserved thread that is
    /// not woken still sees the release when its park's deadline passes). Orchestrating
    /// thread (or shutdown) only.
    pub fn release(&self, wanted: impl Fn() -> bool) {
        // Only the orchestrating thread stores to `busy`: its own last store.
        if self.busy.load(Ordering::Relaxed) == 0 {
            return;
        }
        self.busy.store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 && wanted() {
            self.busy.unpark_all();
        }
    }

    /// Shutdown: releases the reserved thread and wakes it whether or not work waits, so that
    /// it sees the shutdown now rather than when its park's deadline passes (a chip's drop
    /// would otherwise wait up to that deadline to join it).
    pub fn release_now(&self) {
        self.busy.store(0, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            self.busy.unpark_all();
        }
    }

    /// True while the orchestrating thread is busy (the reserved thread should keep out).
    pub fn is_held(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 1
    }

    /// The reserved thread: parks while the orchestrating thread is busy, at most `timeout`.
    /// True when it was released.
    pub fn park(&self, timeout: Duration) -> bool {
        self.parked.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if self.busy.load(Ordering::SeqCst) == 1 {
            self.busy.park(1, timeout);
        }
        self.parked.fetch_sub(1, Ordering::SeqCst);
        !self.is_held()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    /// At shutdown the reserved thread is woken even when no work waits (a release without
    /// work wakes no one, by design): joining it must not wait for its park's deadline.
    #[test]
    fn release_now_wakes_a_parked_reserved_thread() {
        let r = Arc::new(Reserve::default());
        r.hold();
        let parked = {
            let r = r.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                let released = r.park(Duration::from_secs(60));
                (released, t.elapsed())
            })
        };
        while r.parked.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // Give it time to sleep in the futex (the test passes either way).
        std::thread::sleep(Duration::from_millis(20));
        r.release(|| false);
        r.release_now();
        let (released, waited) = parked.join().unwrap();
        assert!(released);
        assert!(waited < Duration::from_secs(30), "woken after {waited:?}");
    }
}
