//! Cross-process futex wait and wake on a 32-bit word in shared memory.
//!
//! The words live in `MAP_SHARED` mappings, so the futexes are *shared* (not
//! `FUTEX_PRIVATE_FLAG`): a wake in one process reaches a sleeper in another. Words that only
//! the threads of one process use (a chip engine's sleepers) take the `*_private` variants:
//! the kernel then keys the futex by address alone, without looking up the page (a
//! `get_user_pages` per call for a shared futex).

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex;

/// Sleeps while `*word == expected`, for at most `timeout` (forever for `None`). Returns
/// early on a wake, a value change, a signal, or a spurious wake-up; callers re-check their
/// condition in a loop.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    wait_with(word, futex::Flags::empty(), expected, timeout);
}

fn wait_with(word: &AtomicU32, flags: futex::Flags, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|d| rustix::time::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    // Errors (EAGAIN when the value already changed, ETIMEDOUT, EINTR) all mean "re-check".
    let _ = futex::wait(word, flags, expected, ts.as_ref());
}

/// Wakes up to `n` sleepers on `word`.
pub fn wake(word: &AtomicU32, n: u32) -> usize {
    futex::wake(word, futex::Flags::empty(), n).unwrap_or(0)
}

/// Wakes every sleeper on `word`.
pub fn wake_all(word: &AtomicU32) -> usize {
    wake(word, i32::MAX as u32)
}

/// [`wait`] on a word that only this process's threads use (`FUTEX_PRIVATE_FLAG`): a wake
/// must come from [`wake_private`] in this process.
pub fn wait_private(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    wait_with(word, futex::Flags::PRIVATE, expected, timeout);
}

/// Wakes up to `n` sleepers of [`wait_private`] on `word`.
pub fn wake_private(word: &AtomicU32, n: u32) -> usize {
    futex::wake(word, futex::Flags::PRIVATE, n).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_times_out_and_wake_wakes() {
        let w = Arc::new(AtomicU32::new(0));
        let t = Instant::now();
        wait(&w, 0, Some(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(15));
        // A value that already differs returns at once.
        let t = Instant::now();
        wait(&w, 1, Some(Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(1));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Some(Duration::from_secs(5)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::Release);
        wake_all(&w);
        h.join().unwrap();
    }

    #[test]
    fn private_wait_times_out_and_private_wake_wakes() {
        let w = Arc::new(AtomicU32::new(0));
        let t = Instant::now();
        wait_private(&w, 0, Some(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(15));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                wait_private(&w2, 0, Some(Duration::from_secs(5)));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::Release);
        let t = Instant::now();
        // A private wake finds the private sleeper (the join would otherwise take 5 s).
        while !h.is_finished() {
            wake_private(&w, 1);
            std::thread::sleep(Duration::from_millis(1));
        }
        h.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(4));
    }
}
