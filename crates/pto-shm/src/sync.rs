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

/// A store-load fence split in two halves, for a handshake in which one side runs all the time
/// and the other rarely (a thread that makes work visible and one about to sleep, see
/// `pto-core`'s engine): the frequent side calls [`AsymmetricFence::light`], the rare side
/// [`AsymmetricFence::heavy`], and the pair orders like two `SeqCst` fences: of "store A; light;
/// load B" and "store B; heavy; load A", at least one load sees the other side's store.
///
/// On Linux with `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` the light half is only a
/// compiler fence and the heavy half is the system call, which makes every other running
/// thread of the process execute a full memory barrier before it returns (the scheme of
/// liburcu and Folly's `asymmetricHeavyBarrier`). A full fence on the frequent side waits for
/// every store this CPU has pending, typically to lines another CPU holds: on a 2-CPU VM it
/// was a fifth of the engine's submit time while the CPUs were far apart. Without the system
/// call (another OS, a seccomp filter, loom) both halves are `SeqCst` fences.
///
/// Registration is per process, so a value made before a `fork` must not be used in the
/// child (there `heavy` reports that it could not order the pair); make one where the threads
/// that use it are started.
///
/// ```
/// use pto_shm::sync::{AsymmetricFence, AtomicU32, Ordering};
/// let (work, sleepers) = (AtomicU32::new(0), AtomicU32::new(0));
/// let f = AsymmetricFence::new();
/// // The frequent side: publish, then look for a sleeper.
/// work.store(1, Ordering::Relaxed);
/// f.light();
/// let wake_someone = sleepers.load(Ordering::Relaxed) > 0;
/// // The rare side (another thread, about to park): register, then look for work.
/// sleepers.store(1, Ordering::Relaxed);
/// let ordered = f.heavy();
/// assert!(ordered && work.load(Ordering::Relaxed) == 1 && !wake_someone);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct AsymmetricFence {
    expedited: bool,
}

impl AsymmetricFence {
    /// Registers the process for expedited private `membarrier` when the kernel offers it,
    /// else falls back to symmetric fences.
    pub fn new() -> AsymmetricFence {
        AsymmetricFence {
            expedited: register_membarrier(),
        }
    }

    /// Two `SeqCst` fences (what loom models, and the fallback).
    pub fn symmetric() -> AsymmetricFence {
        AsymmetricFence { expedited: false }
    }

    /// True when the halves are a compiler fence and `membarrier`.
    pub fn is_expedited(&self) -> bool {
        self.expedited
    }

    /// The frequent side's half.
    #[inline]
    pub fn light(&self) {
        if self.expedited {
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    /// The rare side's half. Returns false in the one case it cannot order the pair: the
    /// system call failed after the registration succeeded (not seen in practice; the caller
    /// then bounds what a missed store can cost, for example by parking with a timeout).
    pub fn heavy(&self) -> bool {
        if self.expedited {
            // The system call also orders the caller (the kernel fences on entry and exit).
            return expedited_barrier();
        }
        fence(Ordering::SeqCst);
        true
    }
}

impl Default for AsymmetricFence {
    fn default() -> AsymmetricFence {
        AsymmetricFence::new()
    }
}

#[cfg(all(target_os = "linux", not(loom)))]
fn register_membarrier() -> bool {
    use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};
    membarrier_query().contains_command(MembarrierCommand::PrivateExpedited)
        && membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
        // The first barrier proves the registration took (a filter could allow one command
        // and refuse the other).
        && membarrier(MembarrierCommand::PrivateExpedited).is_ok()
}

#[cfg(not(all(target_os = "linux", not(loom))))]
fn register_membarrier() -> bool {
    false
}

#[cfg(all(target_os = "linux", not(loom)))]
fn expedited_barrier() -> bool {
    rustix::thread::membarrier(rustix::thread::MembarrierCommand::PrivateExpedited).is_ok()
}

#[cfg(not(all(target_os = "linux", not(loom))))]
fn expedited_barrier() -> bool {
    false
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The store-buffering litmus test: "store X; light; load Y" against "store Y; heavy;
    /// load X", both threads released at once by spinning on a round counter. With two
    /// compiler fences x86 lets both loads miss the stores (each store still in its CPU's
    /// store buffer) in some rounds (`the_litmus_test_catches_missing_fences`); the halves
    /// must never allow it.
    #[test]
    fn the_halves_order_store_buffering() {
        let f = AsymmetricFence::new();
        assert_eq!(litmus(move || f.light(), move || f.heavy(), 20_000), 0);
    }

    /// The control: with only compiler fences some rounds let both loads miss. Timing
    /// dependent (both threads must run at once), so not part of the suite: run it with
    /// `cargo test -p pto-shm -- --ignored` to see that the litmus test can fail.
    #[test]
    #[ignore]
    fn the_litmus_test_catches_missing_fences() {
        let compiler_fence = || std::sync::atomic::compiler_fence(Ordering::SeqCst);
        let missed = litmus(
            compiler_fence,
            move || {
                compiler_fence();
                true
            },
            200_000,
        );
        assert!(missed > 0, "no round reordered");
    }

    /// Runs up to `rounds` store-buffering rounds, for at most two seconds (on a loaded
    /// machine the two threads do not always run at once, and a round may wait for the other
    /// to be scheduled); returns in how many both loads missed (rounds whose heavy half
    /// reported failure are not counted).
    fn litmus(light: impl Fn(), heavy: impl Fn() -> bool + Send + 'static, rounds: u32) -> u32 {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        use std::time::{Duration, Instant};
        /// `go` value that tells the other side to leave.
        const STOP: u32 = u32::MAX;
        // Spins until `cond` holds, yielding now and then so that the other side gets a CPU;
        // false after a minute (the other side is gone).
        fn spin_until(cond: impl Fn() -> bool) -> bool {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut i = 0u32;
            while !cond() {
                i = i.wrapping_add(1);
                if i.is_multiple_of(256) {
                    if Instant::now() > deadline {
                        return false;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            true
        }
        // x, y, the round both threads wait for, the round the heavy side finished, and
        // whether it missed x.
        let x = Arc::new(AtomicU32::new(0));
        let y = Arc::new(AtomicU32::new(0));
        let go = Arc::new(AtomicU32::new(0));
        let done = Arc::new(AtomicU32::new(0));
        let missed = Arc::new(AtomicBool::new(false));
        let budget = Instant::now() + Duration::from_secs(2);
        let other = {
            let (x, y, go, done, missed) = (
                x.clone(),
                y.clone(),
                go.clone(),
                done.clone(),
                missed.clone(),
            );
            std::thread::spawn(move || {
                for r in 1..=rounds {
                    let started = spin_until(
                        || matches!(go.load(Ordering::Acquire), g if g == r || g == STOP),
                    );
                    if !started || go.load(Ordering::Acquire) == STOP {
                        return;
                    }
                    y.store(r, Ordering::Relaxed);
                    let ordered = heavy();
                    let seen = x.load(Ordering::Relaxed) == r;
                    missed.store(ordered && !seen, Ordering::Relaxed);
                    done.store(r, Ordering::Release);
                }
            })
        };
        let mut both = 0;
        for r in 1..=rounds {
            if Instant::now() > budget {
                go.store(STOP, Ordering::Release);
                break;
            }
            go.store(r, Ordering::Release);
            x.store(r, Ordering::Relaxed);
            light();
            let seen = y.load(Ordering::Relaxed) == r;
            assert!(
                spin_until(|| done.load(Ordering::Acquire) == r),
                "the other side stalled"
            );
            if !seen && missed.load(Ordering::Relaxed) {
                both += 1;
            }
        }
        assert!(other.join().is_ok());
        both
    }

    #[test]
    fn the_symmetric_fallback_is_two_fences() {
        let f = AsymmetricFence::symmetric();
        assert!(!f.is_expedited());
        f.light();
        assert!(f.heavy());
    }
}
