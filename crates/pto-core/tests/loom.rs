//! Loom models of the engine's lock-free protocols, run on the crate's real `SuccList`,
//! `Sleep`, `Held`, `OrchWait`, `Spmc`, `ReaderGate`, `Reserve` and `FastPath` (under `cfg(loom)` their atomics, mutex and futex
//! come from loom through `pto_shm::sync`; the futex model's `park` has no timeout, so a lost
//! wake-up is a deadlock the model reports). Run with `scripts/loom.sh`.

#![cfg(loom)]
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use loom::sync::atomic::{AtomicU32, AtomicU64};
use loom::sync::Arc;
use loom::thread;

use pto_core::engine::gate::ReaderGate;
use pto_core::engine::held::Held;
use pto_core::engine::orchwait::OrchWait;
use pto_core::engine::reserve::Reserve;
use pto_core::engine::sleep::Sleep;
use pto_core::engine::spmc::Spmc;
use pto_core::engine::succ::SuccList;
use pto_shm::sync::Ordering;

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

/// The orchestrator wires `consumers` consumers to one producer while another thread finishes
/// the producer. A consumer's fan-in starts at 1, for the edge about to be wired (no guard);
/// when the edge was refused, no other thread can reach the count and the orchestrator stores
/// zero and releases it, else the finishing thread takes it to zero and releases it: every
/// consumer must be released exactly once, and never before the producer finished.
fn wiring_model(consumers: usize) {
    let succ = Arc::new(SuccList::default());
    let fanin: Arc<Vec<AtomicU32>> = Arc::new((0..consumers).map(|_| AtomicU32::new(1)).collect());
    let released: Arc<Vec<AtomicU32>> =
        Arc::new((0..consumers).map(|_| AtomicU32::new(0)).collect());
    let finished = Arc::new(AtomicU32::new(0));
    let release = |released: &Vec<AtomicU32>, finished: &AtomicU32, c: usize| {
        assert_eq!(
            finished.load(Ordering::Acquire),
            1,
            "consumer {c} released early"
        );
        released[c].fetch_add(1, Ordering::Relaxed);
    };
    let finisher = {
        let (succ, fanin, released, finished) = (
            succ.clone(),
            fanin.clone(),
            released.clone(),
            finished.clone(),
        );
        thread::spawn(move || {
            finished.store(1, Ordering::Release);
            for c in succ.finish() {
                if fanin[c as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                    release(&released, &finished, c as usize);
                }
            }
        })
    };
    for c in 0..consumers {
        if succ.is_finished() || !succ.push(c as u32) {
            // The producer finished: no edge, and nobody else reaches the count (a plain
            // store, as in commit).
            assert!(succ.is_finished());
            fanin[c].store(0, Ordering::Relaxed);
            released[c].fetch_add(1, Ordering::Relaxed);
        }
        // Else the edge exists: the finishing thread releases it; nothing to do here.
    }
    finisher.join().unwrap();
    for c in 0..consumers {
        assert_eq!(released[c].load(Ordering::Relaxed), 1, "consumer {c}");
    }
}

/// One consumer of two producers, each finished by its own thread while the orchestrator wires
/// both edges without a guard: the fan-in starts at 2, the orchestrator counts off the refused
/// edges in one subtraction at the end (a plain store when both were refused), and whoever
/// takes it to zero releases it: exactly once, and only after both producers finished.
fn two_producer_model() {
    let succ: Arc<[SuccList; 2]> = Arc::new([SuccList::default(), SuccList::default()]);
    let fanin = Arc::new(AtomicU32::new(2));
    let released = Arc::new(AtomicU32::new(0));
    let finished: Arc<[AtomicU32; 2]> = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let release = |released: &AtomicU32, finished: &[AtomicU32; 2]| {
        for (p, f) in finished.iter().enumerate() {
            assert_eq!(
                f.load(Ordering::Acquire),
                1,
                "released before producer {p} finished"
            );
        }
        released.fetch_add(1, Ordering::Relaxed);
    };
    let finishers: Vec<_> = (0..2)
        .map(|p| {
            let (succ, fanin, released, finished) = (
                succ.clone(),
                fanin.clone(),
                released.clone(),
                finished.clone(),
            );
            thread::spawn(move || {
                finished[p].store(1, Ordering::Release);
                for _c in succ[p].finish() {
                    if fanin.fetch_sub(1, Ordering::AcqRel) == 1 {
                        release(&released, &finished);
                    }
                }
            })
        })
        .collect();
    let mut unwired = 0;
    for s in succ.iter() {
        if s.is_finished() || !s.push(0) {
            unwired += 1;
        }
    }
    if unwired == 2 {
        fanin.store(0, Ordering::Relaxed);
        release(&released, &finished);
    } else if unwired > 0 && fanin.fetch_sub(unwired, Ordering::AcqRel) == unwired {
        release(&released, &finished);
    }
    for h in finishers {
        h.join().unwrap();
    }
    assert_eq!(released.load(Ordering::Relaxed), 1);
}

#[test]
fn an_edge_is_never_added_to_a_finished_producer_nor_lost() {
    check("wiring, 2 consumers", None, || wiring_model(2));
    // Past the inline entries: the overflow vector and its lock.
    check("wiring, 6 consumers", Some(2), || wiring_model(6));
    check("wiring, 2 producers", Some(3), two_producer_model);
}

/// `producers` threads each queue `items` units of work (a counter) and notify; `workers`
/// threads search, take work, and sleep when they find none, until all work is taken. A lost
/// wake-up leaves a worker parked forever with work queued: a deadlock in the model.
fn sleep_model(workers: usize, items: u32) {
    let sleep = Arc::new(Sleep::default());
    let queue = Arc::new(AtomicU32::new(0));
    let taken = Arc::new(AtomicU32::new(0));
    let total = items;
    let take = |q: &AtomicU32| {
        let mut v = q.load(Ordering::SeqCst);
        while v > 0 {
            match q.compare_exchange(v, v - 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(x) => v = x,
            }
        }
        false
    };
    let hs: Vec<_> = (0..workers)
        .map(|_| {
            let (sleep, queue, taken) = (sleep.clone(), queue.clone(), taken.clone());
            thread::spawn(move || loop {
                if taken.load(Ordering::SeqCst) >= total {
                    sleep.notify_all();
                    return;
                }
                sleep.begin_search();
                let got = loop {
                    if take(&queue) {
                        break true;
                    }
                    if taken.load(Ordering::SeqCst) >= total {
                        break false;
                    }
                    sleep.sleep(
                        || {
                            queue.load(Ordering::SeqCst) > 0
                                || taken.load(Ordering::SeqCst) >= total
                        },
                        Duration::from_secs(3600),
                    );
                };
                if sleep.end_search() && queue.load(Ordering::SeqCst) > 0 {
                    sleep.notify();
                }
                if got && taken.fetch_add(1, Ordering::SeqCst) + 1 >= total {
                    // The last item: let the others see that all is done.
                    sleep.notify_all();
                }
            })
        })
        .collect();
    for _ in 0..items {
        queue.fetch_add(1, Ordering::SeqCst);
        sleep.notify();
    }
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(taken.load(Ordering::SeqCst), total);
}

#[test]
fn a_sleeping_thread_never_misses_work() {
    check("sleep, 1 worker, 2 items", Some(3), || sleep_model(1, 2));
    check("sleep, 2 workers, 1 item", Some(2), || sleep_model(2, 1));
}

/// The orchestrating thread waits for task 1 (a read) or for a count of finished tasks (ring
/// space) while core threads finish tasks 0 and 1 (each counts, then tells the `OrchWait`). A
/// lost wake-up leaves the orchestrator parked forever: a deadlock in the model.
fn orch_wait_model(by_task: bool) {
    let wait = Arc::new(OrchWait::default());
    let counts: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let done: Arc<[AtomicU32; 2]> = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let finishers: Vec<_> = (0..2u64)
        .map(|id| {
            let (wait, counts, done) = (wait.clone(), counts.clone(), done.clone());
            thread::spawn(move || {
                done[id as usize].store(1, Ordering::Release);
                // Each finisher's own count (one writer): a load and a store, as
                // `Engine::count_finished` raises a thread slot's count.
                let c = &counts[id as usize];
                c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
                wait.finished(id, || {
                    counts[0].load(Ordering::SeqCst) + counts[1].load(Ordering::SeqCst)
                });
            })
        })
        .collect();
    let total = || counts[0].load(Ordering::SeqCst) + counts[1].load(Ordering::SeqCst);
    let forever = Duration::from_secs(3600);
    if by_task {
        // As `Orch::wait_producers`: count, look, park for the task seen pending.
        loop {
            let before = total();
            if done[1].load(Ordering::Acquire) == 1 {
                break;
            }
            wait.park_for_task(1, before, total, forever);
        }
    } else {
        while total() < 2 {
            wait.park_until(2, total, forever);
        }
    }
    for h in finishers {
        h.join().unwrap();
    }
}

#[test]
fn the_orchestrating_thread_never_misses_its_wake_up() {
    check("orch wait for a task", Some(3), || orch_wait_model(true));
    check("orch wait for a count", Some(3), || orch_wait_model(false));
}

/// The orchestrating thread holds task 1, then task 2 (queueing 1), then takes what it holds
/// at the end of the run; a core thread about to park takes what is held meanwhile. Every
/// task must be queued or run exactly once.
#[test]
fn a_held_task_is_taken_exactly_once() {
    check("held", None, || {
        let held = Arc::new(Held::default());
        let seen: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(0)).collect());
        let core = {
            let (held, seen) = (held.clone(), seen.clone());
            thread::spawn(move || {
                if let Some(t) = held.take() {
                    seen[t as usize].fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        for t in [1, 2] {
            if let Some(prev) = held.put(t) {
                seen[prev as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(t) = held.take() {
            seen[t as usize].fetch_add(1, Ordering::Relaxed);
        }
        core.join().unwrap();
        assert!(!held.is_some());
        for t in [1, 2] {
            assert_eq!(seen[t].load(Ordering::Relaxed), 1, "task {t}");
        }
    });
}

/// The orchestrating thread pushes three tasks into a ring of two entries (a refused push
/// goes to the shared queue, counted here) while two core threads pop; the ring wraps, so a
/// consumer may read an entry the producer then overwrites. Every task must be taken exactly
/// once, with the value that was pushed.
#[test]
fn an_orchestrator_queue_entry_is_taken_exactly_once() {
    check("spmc, 2 consumers, wrap", Some(3), || {
        let q = Arc::new(Spmc::new(2));
        let seen: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(|_| AtomicU32::new(0)).collect());
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (q, seen) = (q.clone(), seen.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        if let Some(v) = q.pop() {
                            seen[v as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for v in 0..3u32 {
            if let Err(v) = q.push(v) {
                seen[v as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
        for c in consumers {
            c.join().unwrap();
        }
        while let Some(v) = q.pop() {
            seen[v as usize].fetch_add(1, Ordering::Relaxed);
        }
        assert!(q.is_empty());
        for v in 0..3 {
            assert_eq!(seen[v].load(Ordering::Relaxed), 1, "task {v}");
        }
    });
}

/// A scan pins a running task's body and reads it while the task's finishing thread closes
/// the gate, writes the body when no reader is inside (its lines taken back unchanged), and
/// opens the gate again. loom's cell reports a write concurrent with a read; a reader that
/// finds the gate closed must not read, and the readers' counts survive the reopening.
#[test]
fn a_finishing_thread_writes_the_body_only_with_no_reader_inside() {
    check("reader gate, 2 readers", Some(3), || {
        let gate = Arc::new(ReaderGate::default());
        let body = Arc::new(loom::cell::UnsafeCell::new(7u32));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (gate, body) = (gate.clone(), body.clone());
                thread::spawn(move || {
                    if gate.pin() {
                        // SAFETY (model): pinned, so the finisher does not write.
                        let v = body.with(|p| unsafe { *p });
                        assert_eq!(v, 7);
                        gate.unpin();
                    }
                })
            })
            .collect();
        let alone = gate.close();
        if alone {
            // SAFETY (model): no reader inside, and none can enter.
            body.with_mut(|p| unsafe { *p = 7 });
        }
        gate.reopen(alone);
        for r in readers {
            r.join().unwrap();
        }
        // Open again, with no reader counted.
        assert!(gate.pin());
        gate.unpin();
        assert!(gate.close());
    });
}

/// The orchestrating thread stages tasks in its ring without publishing them, publishing only
/// when it sees a sleeper (as `Engine::push_from_orch` does), and then goes elsewhere without
/// publishing; a core thread searches, and before it parks its last look publishes what is
/// staged. Every task must be taken exactly once, and no thread may park with a task staged
/// (the model's park has no timeout: that would deadlock).
fn staged_model(items: u32) {
    let q = Arc::new(Spmc::new(4));
    let sleep = Arc::new(Sleep::default());
    let taken = Arc::new(AtomicU32::new(0));
    let seen: Arc<Vec<AtomicU32>> = Arc::new((0..items).map(|_| AtomicU32::new(0)).collect());
    let core = {
        let (q, sleep, taken, seen) = (q.clone(), sleep.clone(), taken.clone(), seen.clone());
        thread::spawn(move || {
            sleep.begin_search();
            while taken.load(Ordering::SeqCst) < items {
                if let Some(v) = q.pop() {
                    seen[v as usize].fetch_add(1, Ordering::Relaxed);
                    taken.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                sleep.sleep(
                    || !q.is_empty() || q.publish_staged(),
                    Duration::from_secs(3600),
                );
            }
            sleep.end_search();
        })
    };
    for v in 0..items {
        assert!(q.stage(v).is_ok());
        if sleep.any_sleeper() && q.publish() {
            sleep.notify();
        }
    }
    core.join().unwrap();
    for v in 0..items as usize {
        assert_eq!(seen[v].load(Ordering::Relaxed), 1, "task {v}");
    }
    assert!(q.is_empty() && !q.has_staged());
}

#[test]
fn a_staged_task_is_never_stranded() {
    check("staged, 2 tasks", Some(3), || staged_model(2));
}

/// The orchestrating thread releases the reserve, holds it again and releases it once more
/// while the reserved thread parks until it sees each release (the model's futex has no
/// timeout, so a release the parked thread misses is a deadlock).
#[test]
fn a_released_reserve_is_never_missed() {
    check("reserve", Some(3), || {
        let r = Arc::new(Reserve::default());
        r.hold();
        let t = {
            let r = r.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    while !r.park(Duration::from_secs(3600)) {}
                }
            })
        };
        r.release(|| true);
        r.hold();
        r.release(|| true);
        t.join().unwrap();
    });
}

/// A registered borrow and an engine-ordered task on one buffer, on two threads. The task's
/// run claims the buffer, the task announces itself (its thread's `current` word), looks for
/// registered borrows and, seeing none, touches the bytes, then withdraws and its run gives the
/// buffer back; the borrower counts itself, scans the announced tasks only when a run owns the
/// buffer and, seeing no task, touches the bytes. Loom's `UnsafeCell` reports the two touches
/// if they can happen without one ordered before the other. (Loom treats `SeqCst` loads and
/// stores as acquire and release, so the announcement is followed by a `SeqCst` fence here; on
/// x86 the `SeqCst` store that announces a task is a locked exchange, a full fence.)
#[test]
fn a_registered_borrow_and_an_announced_task_never_miss() {
    use loom::cell::UnsafeCell;
    use pto_core::fastpath::FastPath;
    check("borrow fast path", None, || {
        let f = Arc::new(FastPath::default());
        let current = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(UnsafeCell::new(0u64));
        let task = {
            let (f, current, bytes) = (f.clone(), current.clone(), bytes.clone());
            thread::spawn(move || {
                // The orchestrating thread claims at submit and the task runs after it
                // (modelled in one thread).
                assert_eq!(f.claim(7), Some(true));
                current.store(1, Ordering::SeqCst);
                pto_shm::sync::fence(Ordering::SeqCst);
                if !f.any_registered() {
                    // SAFETY: loom checks that no other access is concurrent with this one.
                    bytes.with_mut(|p| unsafe { *p = 1 });
                }
                current.store(0, Ordering::SeqCst);
                f.release(7);
            })
        };
        let scan = f.register();
        if !(scan && current.load(Ordering::SeqCst) != 0) {
            // SAFETY: as above.
            let _ = bytes.with(|p| unsafe { *p });
        }
        f.unregister(1);
        task.join().unwrap();
    });
}
