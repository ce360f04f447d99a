//! A sense-reversing barrier in shared memory.
//!
//! Each participant snapshots `phase` *before* it arrives, then increments `count`. The last
//! arriver resets `count` to 0 and only then advances `phase`; everyone else waits for `phase`
//! to move. A fast participant that leaves and re-enters at once has necessarily seen the new
//! phase, so it also sees `count == 0` and snapshots the new phase: a re-entry cannot corrupt
//! the count (the race raised in the seed's review). Waiters park (see [`crate::wait`]).
//! Design note: `docs/design/barrier.md`; model-checked with loom in `tests/loom.rs`.

use std::time::Instant;

use crate::sync::{AtomicU32, Ordering};
use crate::wait::{wait_until, wake, WaitError};

/// The barrier's words. `#[repr(C)]`, all zero initially, valid in shared memory. The arrival
/// count and the phase live on separate cache lines, so arrivals do not disturb the waiters
/// spinning on the phase. [`Barrier::SIZE`] bytes, 64-aligned.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Barrier {
    count: AtomicU32,
    _pad0: [u32; 15],
    phase: AtomicU32,
    sleepers: AtomicU32,
    _pad1: [u32; 14],
}

impl Barrier {
    /// Bytes a barrier occupies in a shared layout.
    pub const SIZE: usize = 128;

    /// A zeroed barrier (for heap-allocated use; in shared memory zeroed bytes are one).
    pub fn new() -> Barrier {
        Barrier::default()
    }

    /// Arrives and waits for all `n` participants. After an error the barrier's count includes
    /// this participant's arrival, so the group must not use it again (the caller aborts).
    ///
    /// # Errors
    ///
    /// A timeout or the check's error.
    pub fn wait<E>(
        &self,
        n: u32,
        deadline: Instant,
        check: impl FnMut() -> Result<(), E>,
    ) -> Result<(), WaitError<E>> {
        let phase = self.phase.load(Ordering::Acquire);
        let arrived = self.count.fetch_add(1, Ordering::AcqRel) + 1;
        if arrived >= n {
            self.count.store(0, Ordering::Relaxed);
            self.phase.fetch_add(1, Ordering::SeqCst);
            wake(&self.phase, &self.sleepers);
            return Ok(());
        }
        wait_until(&self.phase, &self.sleepers, |v| v != phase, deadline, check)
    }

    /// Completed barrier rounds (wraps).
    pub fn phase(&self) -> u32 {
        self.phase.load(Ordering::Acquire)
    }

    /// Wakes every waiter so that it re-runs its check (used to deliver an abort).
    pub fn poke(&self) {
        wake(&self.phase, &self.sleepers);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn back_to_back_rounds_with_a_per_phase_check() {
        const N: u32 = 4;
        const ROUNDS: u32 = 5000;
        // 5 000 rounds take 0.1 s idle, but each waits for the scheduler to wake the parked
        // threads: beside a CPU hog on each CPU a round took up to 3 ms. After 10 s thread 0
        // publishes a last round two ahead, before its next wait; every thread reads it after
        // its waits, so all stop at the same round.
        let b = Arc::new(Barrier::new());
        let seen = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let last = Arc::new(std::sync::atomic::AtomicU32::new(ROUNDS));
        let started = Instant::now();
        let hs: Vec<_> = (0..N)
            .map(|t| {
                let (b, seen, last) = (b.clone(), seen.clone(), last.clone());
                std::thread::spawn(move || {
                    let mut r = 0;
                    while r < last.load(Ordering::SeqCst) {
                        if t == 0
                            && started.elapsed() > Duration::from_secs(10)
                            && last.load(Ordering::SeqCst) == ROUNDS
                        {
                            last.store((r + 2).min(ROUNDS), Ordering::SeqCst);
                        }
                        seen.fetch_add(1, Ordering::SeqCst);
                        let deadline = Instant::now() + Duration::from_secs(20);
                        b.wait(N, deadline, || Ok::<(), ()>(())).unwrap();
                        // Everyone arrived for round r, nobody for round r + 1 yet... is not
                        // guaranteed (fast ranks re-enter), but at least (r + 1) * N arrivals.
                        assert!(seen.load(Ordering::SeqCst) >= (r + 1) * N);
                        b.wait(N, deadline, || Ok::<(), ()>(())).unwrap();
                        assert!(seen.load(Ordering::SeqCst) <= (r + 1) * N + N);
                        r += 1;
                    }
                    r
                })
            })
            .collect();
        let rounds: Vec<u32> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(rounds.iter().all(|&r| r == rounds[0]), "{rounds:?}");
        assert!(rounds[0] >= 500, "only {} rounds in 10 s", rounds[0]);
        assert_eq!(b.phase(), 2 * rounds[0]);
    }

    #[test]
    fn a_missing_participant_times_out_or_fails_the_check() {
        let b = Barrier::new();
        let r = b.wait(2, Instant::now() + Duration::from_millis(30), || {
            Ok::<(), ()>(())
        });
        assert!(matches!(r, Err(WaitError::Timeout { .. })));
        let b = Barrier::new();
        let r = b.wait(2, Instant::now() + Duration::from_secs(5), || {
            Err("rank 1 died")
        });
        assert_eq!(r, Err(WaitError::Check("rank 1 died")));
    }
}
