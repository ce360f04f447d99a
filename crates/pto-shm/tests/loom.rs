//! Loom models of the barrier, of the signal (notify / wait) protocol and of the completion
//! queue, run on the crate's real `Barrier`, `wait_until`, `wake` and `CompletionQueue` (under
//! `cfg(loom)` the `sync` shim supplies loom atomics and a futex model whose `park` blocks until
//! `unpark_all`, so a lost wake-up is a deadlock the model reports).
//!
//! Run with `scripts/loom.sh`:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p pto-shm --test loom --release`.
//! `LOOM_MAX_PREEMPTIONS` overrides each model's preemption bound.

#![cfg(loom)]
// Tests may unwrap (clippy.toml); the models' helpers are not `#[test]` functions.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicUsize;
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use pto_shm::barrier::Barrier;
use pto_shm::ring::{Completion, HeapQueue};
use pto_shm::sync::{AtomicU32, Ordering};
use pto_shm::wait::{wait_until, wake};

/// A deadline no model execution reaches (loom executions are not timed).
fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// Runs `f` under loom with at most `bound` preemptions per execution (`None`: exhaustive;
/// `LOOM_MAX_PREEMPTIONS` overrides it) and prints how long the model took. The bounds keep
/// each model to seconds on two cores; the unbounded 2-thread, 1-round barrier model and the
/// 1-producer signal model are exhaustive.
fn check(name: &str, bound: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = bound;
    }
    let t = Instant::now();
    b.check(f);
    println!(
        "loom model {name}: ok in {:.2} s (preemption bound {:?})",
        t.elapsed().as_secs_f64(),
        b.preemption_bound
    );
}

/// `n` threads run `rounds` back-to-back barrier rounds. Before each wait a thread counts its
/// arrival (a `Relaxed` counter, so only the barrier orders it); after the wait of round `r`
/// it must see all `(r + 1) * n` arrivals of rounds `0..=r` and at most the `n - 1` early
/// arrivals of others for round `r + 1`. A fast thread that re-entered and corrupted `count`
/// would release a round early (too few arrivals seen) or strand a waiter (a deadlock).
fn barrier_model(n: usize, rounds: usize) {
    let b = Arc::new(Barrier::new());
    let arrivals = Arc::new(AtomicUsize::new(0));
    let run = move |b: Arc<Barrier>, arrivals: Arc<AtomicUsize>| {
        for r in 0..rounds {
            arrivals.fetch_add(1, Ordering::Relaxed);
            b.wait(n as u32, far(), || Ok::<(), ()>(())).unwrap();
            let seen = arrivals.load(Ordering::Relaxed);
            assert!(
                seen >= (r + 1) * n,
                "round {r}: left the barrier having seen {seen} arrivals"
            );
            assert!(seen < (r + 2) * n, "round {r}: saw {seen} arrivals");
        }
    };
    let hs: Vec<_> = (1..n)
        .map(|_| {
            let (b, arrivals) = (b.clone(), arrivals.clone());
            thread::spawn(move || run(b, arrivals))
        })
        .collect();
    run(b.clone(), arrivals.clone());
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(b.phase() as usize, rounds);
    assert_eq!(arrivals.load(Ordering::Relaxed), rounds * n);
}

#[test]
fn barrier_two_threads_one_round_exhaustive() {
    check("barrier 2 threads x 1 round", None, || barrier_model(2, 1));
}

#[test]
fn barrier_two_threads_three_rounds() {
    check("barrier 2 threads x 3 rounds", Some(5), || {
        barrier_model(2, 3)
    });
}

#[test]
fn barrier_three_threads_one_round() {
    check("barrier 3 threads x 1 round", Some(4), || {
        barrier_model(3, 1)
    });
}

#[test]
fn barrier_three_threads_two_rounds() {
    check("barrier 3 threads x 2 rounds", Some(3), || {
        barrier_model(3, 2)
    });
}

/// The window's readiness test for a signal: the word reached `value` (wrapping).
fn reached(value: u32) -> impl FnMut(u32) -> bool {
    move |v| (v.wrapping_sub(value) as i32) >= 0
}

/// A signal word and its sleepers count, as in a window.
struct Signal {
    word: AtomicU32,
    sleepers: AtomicU32,
}

impl Signal {
    fn new(start: u32) -> Signal {
        Signal {
            word: AtomicU32::new(start),
            sleepers: AtomicU32::new(0),
        }
    }

    /// `Window::notify` with `SignalOp::Add`.
    fn notify_add(&self, value: u32) {
        self.word.fetch_add(value, Ordering::SeqCst);
        wake(&self.word, &self.sleepers);
    }

    /// `Window::wait_until_deadline`.
    fn wait(&self, value: u32) {
        wait_until(&self.word, &self.sleepers, reached(value), far(), || {
            Ok::<(), ()>(())
        })
        .unwrap();
    }
}

/// One producer writes a plain (non-atomic) payload, then notifies; the consumer waits for the
/// signal and reads the payload. Loom reports a data race on the payload if the wait does not
/// acquire the notify, and a deadlock if the consumer parks and misses the wake-up.
#[test]
fn signal_publishes_the_payload() {
    check("signal 1 producer", None, || {
        let sig = Arc::new(Signal::new(0));
        let payload = Arc::new(UnsafeCell::new(0u64));
        let h = {
            let (sig, payload) = (sig.clone(), payload.clone());
            thread::spawn(move || {
                // SAFETY: the consumer reads the payload only after the notify below.
                payload.with_mut(|p| unsafe { *p = 42 });
                sig.notify_add(1);
            })
        };
        sig.wait(1);
        // SAFETY: the producer wrote it before the notify that the wait acquired.
        let v = payload.with(|p| unsafe { *p });
        assert_eq!(v, 42);
        h.join().unwrap();
    });
}

/// Two producers each write their own payload slot and add 1 to a signal that starts just
/// below the `u32` wrap; the consumer waits for the second add (which wraps the word to 0)
/// and must see both payloads.
#[test]
fn signal_counts_two_producers_across_the_wrap() {
    check("signal 2 producers, wrapping", Some(4), || {
        let sig = Arc::new(Signal::new(u32::MAX - 1));
        let slots = Arc::new([UnsafeCell::new(0u64), UnsafeCell::new(0u64)]);
        let hs: Vec<_> = (0..2)
            .map(|i| {
                let (sig, slots) = (sig.clone(), slots.clone());
                thread::spawn(move || {
                    // SAFETY: each producer writes only its slot, read after both notifies.
                    slots[i].with_mut(|p| unsafe { *p = 10 + i as u64 });
                    sig.notify_add(1);
                })
            })
            .collect();
        sig.wait(0);
        for (i, slot) in slots.iter().enumerate() {
            // SAFETY: both producers wrote before their notifies, which the wait acquired.
            let v = slot.with(|p| unsafe { *p });
            assert_eq!(v, 10 + i as u64);
        }
        for h in hs {
            h.join().unwrap();
        }
    });
}

/// The consumer's count of completions popped, which a producer that found the queue full
/// twice in a row sleeps on.
struct Pops {
    count: Mutex<u64>,
    cv: Condvar,
}

/// `producers.len()` producer threads post completions into a queue of `capacity` entries
/// (producer `p` posts tokens `(p + 1) << 8 | i` for `i < producers[p]`, with status
/// `token + 1`; neither is ever 0, the value of a slot that was never written);
/// the main thread pops until it has all of them. Every completion must arrive exactly once,
/// with the status written alongside its token, and each producer's completions in the order
/// it posted them. A payload read before its `seq` is published, or a slot freed before its
/// payload is read, shows up as a wrong, torn or missing completion.
///
/// A producer that gets `QueueFull` yields and retries; if that retry fails too, it sleeps
/// until the consumer pops again (the count it read before the retry, under the lock, covers
/// every pop whose slot that retry could see freed, so the wake-up cannot be lost). Only the
/// consumer spins without bound: loom's scheduler can alternate forever between two threads
/// that yield while waiting on a third (tokio-rs/loom#53), which a producer spinning on a full
/// queue and the consumer spinning on the slot that same producer's peer has claimed but not
/// yet published would do. The sleep orders only completed pops before the retry, so a pop
/// racing a post into the slot it frees is still explored by the posts that did not sleep.
fn queue_model(capacity: usize, producers: &'static [u64]) {
    let h = Arc::new(HeapQueue::new(capacity));
    assert_eq!(h.queue().capacity(), capacity);
    let pops = Arc::new(Pops {
        count: Mutex::new(0),
        cv: Condvar::new(),
    });
    let hs: Vec<_> = producers
        .iter()
        .enumerate()
        .map(|(p, &n)| {
            let (h, pops) = (h.clone(), pops.clone());
            thread::spawn(move || {
                for i in 0..n {
                    let token = (p as u64 + 1) << 8 | i;
                    let c = Completion {
                        token,
                        status: token + 1,
                    };
                    let mut seen = None;
                    while let Err(e) = h.queue().post(c) {
                        assert_eq!(e.token, token);
                        assert_eq!(e.capacity, capacity as u64);
                        if let Some(seen) = seen.take() {
                            let mut n = pops.count.lock().unwrap();
                            while *n == seen {
                                n = pops.cv.wait(n).unwrap();
                            }
                        } else {
                            thread::yield_now();
                            seen = Some(*pops.count.lock().unwrap());
                        }
                    }
                }
            })
        })
        .collect();
    let total: u64 = producers.iter().sum();
    let mut next = vec![0u64; producers.len()];
    let mut got = 0;
    while got < total {
        let Some(c) = h.queue().pop() else {
            thread::yield_now();
            continue;
        };
        let (p, i) = ((c.token >> 8) as usize, c.token & 0xff);
        let p = p.wrapping_sub(1);
        assert!(p < producers.len(), "unknown token {:#x}", c.token);
        assert_eq!(
            i, next[p],
            "producer {p}: completion {i} lost, duplicated or out of order"
        );
        assert_eq!(c.status, c.token + 1, "torn completion {c:?}");
        next[p] += 1;
        got += 1;
        *pops.count.lock().unwrap() += 1;
        pops.cv.notify_all();
    }
    for h in hs {
        h.join().unwrap();
    }
    assert!(
        h.queue().pop().is_none(),
        "a completion beyond those posted"
    );
    assert!(h.queue().is_empty());
}

#[test]
fn queue_two_producers_one_each_exhaustive() {
    check("queue 2 producers x 1, capacity 2", None, || {
        queue_model(2, &[1, 1])
    });
}

#[test]
fn queue_two_producers_fill_and_wrap() {
    // Three completions into two slots: a producer can find the queue full, and one slot is
    // reused on its second lap.
    check("queue 2 producers x (2, 1), capacity 2", Some(3), || {
        queue_model(2, &[2, 1])
    });
}

#[test]
fn queue_two_producers_two_each() {
    check("queue 2 producers x 2, capacity 2", Some(3), || {
        queue_model(2, &[2, 2])
    });
}
