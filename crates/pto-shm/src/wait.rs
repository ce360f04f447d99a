//! The waiting loop every blocking operation uses.
//!
//! Spin briefly (cheap when the peer is about to arrive), then park on the word in short slices
//! (so that many ranks on few CPUs make progress and nobody burns a core), checking between
//! slices the deadline and a caller-supplied liveness check (dead peer, raised abort). The
//! waker publishes its change with `SeqCst` and wakes only when the `sleepers` count says
//! someone parked; the sleeper registers in `sleepers` with `SeqCst` before re-checking the
//! word, so one of the two always sees the other (the store-buffer pattern).

use std::time::{Duration, Instant};

use crate::sync::{fence, AtomicU32, Ordering, Park};

/// Most spin iterations before the first park (each 32nd yields the CPU).
#[cfg(not(loom))]
pub const SPIN: u32 = 1 << 16;
/// Spins before the first park (one check under loom, where spinning only grows the model).
#[cfg(loom)]
pub const SPIN: u32 = 1;
/// Longest time spent spinning (and yielding) before the first park: long enough that a peer
/// arriving within a few scheduler time slices is caught without a futex round trip, short
/// enough that a long wait costs no CPU.
pub const SPIN_FOR: Duration = Duration::from_micros(50);
/// The first park's length; each later park of the same wait is twice as long, up to
/// [`MAX_SLICE`]. Bounds how late a deadline or a failure is noticed.
pub const SLICE: Duration = Duration::from_millis(10);
/// The longest park: long waits (many ranks on few CPUs waiting for the last ones to start)
/// wake 10 times a second, not 100 (docs/design/scale.md).
pub const MAX_SLICE: Duration = Duration::from_millis(100);
/// How often the liveness check runs while parked.
pub const CHECK_EVERY: Duration = Duration::from_millis(20);

/// Why a wait ended without its condition.
#[derive(Debug, PartialEq, Eq)]
pub enum WaitError<E> {
    /// The deadline passed.
    Timeout {
        /// How long it waited.
        waited: Duration,
    },
    /// The liveness check failed.
    Check(E),
}

/// How a wait passes the time between looks, once its spin is over.
#[derive(Clone, Copy, Debug)]
pub enum Pause<'a> {
    /// Park on `word`, registered in `sleepers`: whoever changes what the wait looks at bumps
    /// `word` with `SeqCst` and then calls [`wake`].
    Futex {
        /// The word a waker changes.
        word: &'a AtomicU32,
        /// How many waiters are parked on it.
        sleepers: &'a AtomicU32,
    },
    /// Nothing wakes the waiter (it polls through a library call that also drives the
    /// operation's progress): yield while the wait is young, then sleep `nap` between looks.
    Backoff {
        /// The sleep between looks once the wait has lasted [`BACKOFF_YIELD_FOR`].
        nap: Duration,
    },
}

/// How long a [`Pause::Backoff`] wait yields between looks before it starts to sleep.
pub const BACKOFF_YIELD_FOR: Duration = Duration::from_millis(2);

/// The bounded wait every blocking operation uses, whatever the backend: `look` until it
/// returns a value, spinning briefly first, then pausing as `pause` says; `check` runs every
/// [`CHECK_EVERY`] and at the deadline (a dead peer, a raised abort end the wait at once).
///
/// # Errors
///
/// [`WaitError::Timeout`] when the deadline passes, or the error of `look` or `check`.
pub fn bounded<R, E>(
    deadline: Instant,
    pause: Pause<'_>,
    mut look: impl FnMut() -> Result<Option<R>, E>,
    mut check: impl FnMut() -> Result<(), E>,
) -> Result<R, WaitError<E>> {
    let spins = match pause {
        Pause::Futex { .. } => SPIN,
        Pause::Backoff { .. } => 64,
    };
    let mut spin_start = None;
    for i in 0..spins {
        if let Some(r) = look().map_err(WaitError::Check)? {
            return Ok(r);
        }
        if i % 32 == 31 {
            // Yield: with more ranks than CPUs this lets the peer we wait for run.
            std::thread::yield_now();
            let t = *spin_start.get_or_insert_with(Instant::now);
            if t.elapsed() >= SPIN_FOR {
                break;
            }
        } else {
            std::hint::spin_loop();
        }
    }
    let start = Instant::now();
    let mut last_check = start;
    let mut slice = SLICE;
    loop {
        if let Some(r) = look().map_err(WaitError::Check)? {
            return Ok(r);
        }
        let now = Instant::now();
        if now.duration_since(last_check) >= CHECK_EVERY || now >= deadline {
            if let Err(e) = check() {
                // The peer may have done what we wait for just before it exited (or failed):
                // its state is published after its last write, so one more look sees it.
                if let Some(r) = look().map_err(WaitError::Check)? {
                    return Ok(r);
                }
                return Err(WaitError::Check(e));
            }
            last_check = now;
        }
        if now >= deadline {
            return Err(WaitError::Timeout {
                waited: now.duration_since(start),
            });
        }
        match pause {
            Pause::Futex { word, sleepers } => {
                sleepers.fetch_add(1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                // Read the word before the last look: a change after it makes the park return.
                let v = word.load(Ordering::SeqCst);
                let done = look();
                if let Ok(None) = done {
                    word.park(v, slice.min(deadline - now));
                    slice = (slice * 2).min(MAX_SLICE);
                }
                sleepers.fetch_sub(1, Ordering::SeqCst);
                if let Some(r) = done.map_err(WaitError::Check)? {
                    return Ok(r);
                }
            }
            Pause::Backoff { nap } => {
                if now.duration_since(start) < BACKOFF_YIELD_FOR {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(nap.min(deadline - now));
                }
            }
        }
    }
}

/// Waits until `ready(word)` holds, the deadline passes, or `check` fails: [`bounded`] with
/// [`Pause::Futex`] on `word`.
///
/// # Errors
///
/// [`WaitError::Timeout`] or the check's error.
pub fn wait_until<E>(
    word: &AtomicU32,
    sleepers: &AtomicU32,
    mut ready: impl FnMut(u32) -> bool,
    deadline: Instant,
    check: impl FnMut() -> Result<(), E>,
) -> Result<(), WaitError<E>> {
    bounded(
        deadline,
        Pause::Futex { word, sleepers },
        || Ok(ready(word.load(Ordering::Acquire)).then_some(())),
        check,
    )
}

/// After changing `word` (with `SeqCst`), wakes its sleepers if there are any.
pub fn wake(word: &AtomicU32, sleepers: &AtomicU32) {
    fence(Ordering::SeqCst);
    if sleepers.load(Ordering::SeqCst) > 0 {
        word.unpark_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A peer that raises the flag and exits between a look and the liveness check: the wait
    /// succeeds (the flag was set before the exit was published), it does not report the exit.
    #[test]
    fn a_peer_that_finished_its_part_before_exiting_is_not_an_error() {
        let raised = Cell::new(false);
        let r: Result<u32, WaitError<&str>> = bounded(
            Instant::now() + Duration::from_secs(5),
            Pause::Backoff {
                nap: Duration::from_micros(10),
            },
            || Ok(raised.get().then_some(7)),
            || {
                raised.set(true);
                Err("peer exited")
            },
        );
        assert_eq!(r.ok(), Some(7));
    }

    /// A check that fails with nothing to see is the error.
    #[test]
    fn a_failed_check_with_nothing_done_is_the_error() {
        let r: Result<(), WaitError<&str>> = bounded(
            Instant::now() + Duration::from_secs(5),
            Pause::Backoff {
                nap: Duration::from_micros(10),
            },
            || Ok(None),
            || Err("peer exited"),
        );
        assert!(matches!(r, Err(WaitError::Check("peer exited"))));
    }
}
