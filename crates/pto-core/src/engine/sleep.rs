//! How idle threads sleep without losing a wake-up, and without a wake-up per task.
//!
//! A thread with nothing to run is *searching*: it looks at the ready queues, spinning for a
//! short while. Then it registers as a sleeper and parks on the `epoch` word. Whoever makes
//! work visible calls [`Sleep::notify`], which wakes one sleeper only when no thread is
//! searching: a searching thread will find the work itself, so a steady stream of tasks to an
//! awake thread costs no wake-up at all (the rule Tokio's and Go's schedulers use).
//!
//! No wake-up is lost. The sleeper increments `sleepers`, stops counting as searching, issues a
//! fence and only then looks at the queues a last time; the notifier makes the work visible,
//! issues a fence and only then reads the counters. Of two such fenced sequences one comes
//! first, so either the sleeper's last look sees the work, or the notifier sees the sleeper
//! (and no searcher) and bumps `epoch`, which the sleeper's futex wait compares against the
//! value it read before registering. Modelled with loom in `tests/loom.rs` (the model's futex
//! has no timeout, so a lost wake-up is a deadlock there).
//!
//! The two fences are the halves of an [`AsymmetricFence`]: the notifier, which runs for every
//! task found ready, issues the light half (a compiler fence when the kernel offers expedited
//! `membarrier`), and the sleeper, a thread that found nothing to do and is about to park,
//! the heavy half (the system call, which makes the notifier's CPU execute the full fence on
//! its behalf). Loom checks the protocol with two `SeqCst` fences; the pairing of the halves
//! is the kernel's guarantee. See `docs/design/chip-scheduler.md`.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::sync::{AsymmetricFence, AtomicU32, Ordering, Park};

/// See the module docs. Each counter has its own cache line: `searching` changes every time a
/// core thread runs out of work and finds more, `sleepers` only when one parks, and
/// [`Sleep::notify`] (once per published task) reads `sleepers` first, so that while no thread
/// sleeps it reads a line nobody writes instead of one the core threads write for every task.
#[derive(Debug, Default)]
pub struct Sleep {
    epoch: CachePadded<AtomicU32>,
    sleepers: CachePadded<AtomicU32>,
    searching: CachePadded<AtomicU32>,
    /// Light half for the notifiers, heavy half for the sleepers.
    fence: AsymmetricFence,
}

/// The longest a sleeper parks when its heavy fence failed (then a notifier may miss it, and
/// the work waits at most this long for it).
const UNORDERED_PARK: Duration = Duration::from_millis(1);

impl Sleep {
    /// After making work visible: wakes one sleeper when no thread is searching.
    pub fn notify(&self) {
        self.fence.light();
        // (Both loads follow the fence; which comes first does not matter to the argument.)
        if self.sleepers.load(Ordering::SeqCst) > 0 && self.searching.load(Ordering::SeqCst) == 0 {
            self.epoch.fetch_add(1, Ordering::SeqCst);
            self.epoch.unpark_one();
        }
    }

    /// After staging work that only a searching thread's last look before it parks finds
    /// (`Spmc::stage`): true when a thread is registered as a sleeper, so the work must be
    /// published now. The fence pairs with the one in [`Sleep::sleep`]: either this load sees
    /// the sleeper, or the sleeper's last look sees the staged work. (The light half: see the
    /// module docs.)
    pub fn any_sleeper(&self) -> bool {
        self.fence.light();
        self.sleepers.load(Ordering::SeqCst) > 0
    }

    /// Wakes every sleeper (shutdown, the end of a run).
    pub fn notify_all(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.epoch.unpark_all();
    }

    /// This thread starts looking for work.
    pub fn begin_search(&self) {
        self.searching.fetch_add(1, Ordering::SeqCst);
    }

    /// This thread found work and stops searching. True when it was the only searcher: if more
    /// work is queued, it should [`Sleep::notify`] so that another thread takes it.
    pub fn end_search(&self) -> bool {
        self.searching.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// A searching thread found nothing: parks until notified or `timeout` passes, unless
    /// `has_work` finds work after it registered as a sleeper. It is searching again when this
    /// returns.
    pub fn sleep(&self, has_work: impl Fn() -> bool, timeout: Duration) {
        let e = self.epoch.load(Ordering::SeqCst);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        self.searching.fetch_sub(1, Ordering::SeqCst);
        let ordered = self.fence.heavy();
        if !has_work() {
            self.epoch.park(
                e,
                if ordered {
                    timeout
                } else {
                    timeout.min(UNORDERED_PARK)
                },
            );
        }
        self.searching.fetch_add(1, Ordering::SeqCst);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Threads parked now (for tests and statistics).
    pub fn sleepers(&self) -> u32 {
        self.sleepers.load(Ordering::Relaxed)
    }
}
