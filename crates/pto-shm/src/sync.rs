//! The atomics shim: std atomics normally, loom's under `cfg(loom)`, so that the barrier and
//! signal protocols can be model-checked.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub use loom::sync::Mutex;
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
/// A mutex (loom's under `cfg(loom)`, whose `lock` returns a `Result` like std's).
#[cfg(not(loom))]
pub use std::sync::Mutex;

/// Parking primitives the protocols need from a 32-bit word.
pub trait Park {
    /// Sleeps while the word equals `expected`, at most `slice` (it may return early).
    fn park(&self, expected: u32, slice: std::time::Duration);
    /// Wakes every sleeper on the word.
    fn unpark_all(&self);
    /// Wakes one sleeper on the word (any one: callers park on a word only when every sleeper
    /// on it is as good as any other).
    fn unpark_one(&self);
}

/// [`Park`] for a word that only the threads of one process use (a chip engine's sleepers):
/// private futexes, cheaper than shared ones. Under loom, the same model as [`Park`].
pub trait ParkLocal {
    /// Sleeps while the word equals `expected`, at most `slice` (it may return early).
    fn park(&self, expected: u32, slice: std::time::Duration);
    /// Wakes every sleeper on the word.
    fn unpark_all(&self);
    /// Wakes one sleeper on the word.
    fn unpark_one(&self);
}

#[cfg(not(loom))]
impl ParkLocal for AtomicU32 {
    fn park(&self, expected: u32, slice: std::time::Duration) {
        crate::futex::wait_private(self, expected, Some(slice));
    }
    fn unpark_all(&self) {
        crate::futex::wake_private(self, i32::MAX as u32);
    }
    fn unpark_one(&self) {
        crate::futex::wake_private(self, 1);
    }
}

#[cfg(loom)]
impl ParkLocal for AtomicU32 {
    fn park(&self, expected: u32, slice: std::time::Duration) {
        Park::park(self, expected, slice);
    }
    fn unpark_all(&self) {
        Park::unpark_all(self);
    }
    fn unpark_one(&self) {
        Park::unpark_one(self);
    }
}

#[cfg(not(loom))]
impl Park for AtomicU32 {
    fn park(&self, expected: u32, slice: std::time::Duration) {
        crate::futex::wait(self, expected, Some(slice));
    }
    fn unpark_all(&self) {
        crate::futex::wake_all(self);
    }
    fn unpark_one(&self) {
        crate::futex::wake(self, 1);
    }
}

/// Under loom, parking is a model of a futex: `park` checks the word under one lock and sleeps
/// on a condition variable until an `unpark_all`, with no timeout. A wake-up lost by the
/// `sleepers` handshake in [`crate::wait`] therefore shows up as a deadlock in the model,
/// where the real futex's time slice would only hide it as latency.
#[cfg(loom)]
impl Park for AtomicU32 {
    fn park(&self, expected: u32, _slice: std::time::Duration) {
        let (lock, cv) = &*loom_futex::QUEUE;
        let guard = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The kernel compares the word with `expected` under its hash-bucket lock, so a wake
        // that comes after the change either finds this sleeper queued or is seen here.
        if self.load(Ordering::Relaxed) == expected {
            drop(
                cv.wait(guard)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
    }
    fn unpark_all(&self) {
        let (lock, cv) = &*loom_futex::QUEUE;
        let _guard = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cv.notify_all();
    }
    /// One wait queue serves every word in the model, so waking "one" could pick a sleeper of
    /// another word: wake them all (a spurious wake-up, which callers tolerate).
    fn unpark_one(&self) {
        Park::unpark_all(self);
    }
}

#[cfg(loom)]
mod loom_futex {
    use loom::sync::{Condvar, Mutex};

    loom::lazy_static! {
        /// One wait queue for every word (a wake-up meant for another word is spurious, which
        /// callers tolerate), recreated for each loom execution.
        pub(super) static ref QUEUE: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }
}

/// Asks the CPU to bring the cache line holding `p` into this core's cache for writing, without
/// waiting for it: the engine calls it a little before it stores into memory another core
/// touched last (a task node about to be reused), so that its later stores, and the locked
/// instruction after them that waits for them, do not stall for the line. A hint only: it never
/// faults and changes nothing observable; on other architectures it does nothing.
#[inline(always)]
pub fn prefetch_write<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: PREFETCHW only moves a cache line; it reads no value into a register, writes no
    // memory and never faults, even on an invalid address (CPUs without it execute it as a
    // NOP), so any pointer is fine.
    unsafe {
        std::arch::asm!(
            "prefetchw byte ptr [{0}]",
            in(reg) p,
            options(nostack, readonly, preserves_flags)
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}
