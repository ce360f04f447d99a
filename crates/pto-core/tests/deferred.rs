//! Deferred completion: tasks that complete after their kernel returned, when registered
//! conditions hold or posted tokens arrive.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pto_core::{
    Chip, CompletionToken, CoreKind, Counter, DType, KernelError, KernelRegistry, OrchError,
    Program, RunError, RunOptions, TaskArgs, Tensor,
};

/// Kernels over a shared table of counters (scalar 0 selects the counter).
fn kernels(counters: Arc<Vec<Counter>>) -> KernelRegistry {
    let mut k = KernelRegistry::new();
    let c = counters.clone();
    // Deferred: completes when counter[s0] >= s1. Writes a token tensor (t0) at once.
    k.register("wait_counter", CoreKind::Aiv, move |ctx| {
        let (i, v) = (ctx.scalar::<u64>(0)? as usize, ctx.scalar::<u64>(1)?);
        ctx.output::<i32>(0)?.fill(1);
        ctx.defer(c[i].at_least(v))
    })
    .unwrap();
    let c = counters.clone();
    // counter[s0] += 1 after sleeping s1 ms.
    k.register("bump", CoreKind::Aiv, move |ctx| {
        std::thread::sleep(Duration::from_millis(ctx.scalar::<u64>(1)?));
        c[ctx.scalar::<u64>(0)? as usize].add(1);
        Ok(())
    })
    .unwrap();
    let c = counters;
    // Consumer: checks counter[s0] >= 1 when it runs (it must run after its waiter), then
    // t1 = t0 + 10.
    k.register("consume", CoreKind::Aiv, move |ctx| {
        let i = ctx.scalar::<u64>(0)? as usize;
        if c[i].get() < 1 {
            return Err(KernelError::msg(format!(
                "consumer {i} ran before its condition held"
            )));
        }
        let v = ctx.input::<i32>(0)?.to_vec();
        ctx.output::<i32>(1)?
            .assign(&v.iter().map(|x| x + 10).collect::<Vec<_>>())?;
        Ok(())
    })
    .unwrap();
    k
}

fn counters(n: usize) -> Arc<Vec<Counter>> {
    Arc::new((0..n).map(|_| Counter::new()).collect())
}

#[test]
fn one_core_runs_producer_waiter_and_consumer() {
    let cs = counters(1);
    // One logical core and one thread: the waiter must not hold the core, or the producer that
    // satisfies it could never run.
    let chip = Chip::builder()
        .aic_cores(0)
        .aiv_cores(1)
        .threads(1)
        .build()
        .unwrap();
    let out = Tensor::zeros(&[2], DType::I32).unwrap();
    let o = out.clone();
    let report = chip
        .run(&Program::new("p", kernels(cs.clone()), move |orch| {
            let tok = orch
                .submit(
                    "wait_counter",
                    TaskArgs::new()
                        .output(&[2], DType::I32)
                        .scalar(0u64)
                        .scalar(1u64)
                        .deferred(),
                )?
                .out(0)?;
            orch.submit("bump", TaskArgs::new().scalar(0u64).scalar(20u64))?;
            orch.submit(
                "consume",
                TaskArgs::new().input(&tok).output_existing(&o).scalar(0u64),
            )?;
            Ok(())
        }))
        .unwrap();
    assert_eq!(out.read::<i32>().unwrap(), vec![11, 11]);
    assert_eq!(report.stats.deferred, 1);
}

#[test]
fn many_concurrent_deferred_tasks_release_their_consumers_in_order() {
    const N: usize = 200;
    let cs = counters(N);
    let chip = Chip::builder()
        .aic_cores(1)
        .aiv_cores(4)
        .threads(2)
        .build()
        .unwrap();
    let outs = Tensor::zeros(&[N], DType::I32).unwrap();
    let o = outs.clone();
    let cs2 = cs.clone();
    // A thread satisfies the conditions in reverse order while the run is going.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        for c in cs2.iter().rev() {
            c.add(1);
            std::thread::sleep(Duration::from_micros(50));
        }
    });
    chip.run(&Program::new("many", kernels(cs.clone()), move |orch| {
        for i in 0..N {
            let tok = orch
                .submit(
                    "wait_counter",
                    TaskArgs::new()
                        .output(&[1], DType::I32)
                        .scalar(i as u64)
                        .scalar(1u64)
                        .deferred(),
                )?
                .out(0)?;
            let cell = o.view(&[1], &[i])?;
            orch.submit(
                "consume",
                TaskArgs::new()
                    .input(&tok)
                    .output_existing(&cell)
                    .scalar(i as u64),
            )?;
        }
        Ok(())
    }))
    .unwrap();
    releaser.join().unwrap();
    assert_eq!(outs.read::<i32>().unwrap(), vec![11; N]);
}

#[test]
fn a_token_posted_by_another_thread_completes_the_task() {
    let mut k = KernelRegistry::new();
    let posted_at = Arc::new(Mutex::new(None::<Instant>));
    let p = posted_at.clone();
    k.register("async_op", CoreKind::Aiv, move |ctx| {
        let token = ctx.defer_token()?;
        let sender = ctx.completion_sender();
        let p = p.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            *p.lock() = Some(Instant::now());
            sender.post(token).unwrap();
        });
        ctx.output::<i32>(0)?.fill(5);
        Ok(())
    })
    .unwrap();
    let seen = Arc::new(Mutex::new(None::<Instant>));
    let s = seen.clone();
    k.register("after", CoreKind::Aiv, move |ctx| {
        *s.lock() = Some(Instant::now());
        let v = ctx.input::<i32>(0)?.to_vec();
        ctx.output::<i32>(1)?.assign(&v)?;
        Ok(())
    })
    .unwrap();
    // Posting its own token before registering it (an "early" completion) also counts.
    k.register("early", CoreKind::Aiv, |ctx| {
        let sender = ctx.completion_sender();
        sender.post(ctx.completion_token()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        ctx.defer_token()?;
        Ok(())
    })
    .unwrap();
    let out = Tensor::zeros(&[3], DType::I32).unwrap();
    let o = out.clone();
    let report = Chip::builder()
        .build()
        .unwrap()
        .run_with(
            &Program::new("tok", k, move |orch| {
                let t = orch
                    .submit(
                        "async_op",
                        TaskArgs::new().output(&[3], DType::I32).deferred(),
                    )?
                    .out(0)?;
                orch.submit("after", TaskArgs::new().input(&t).output_existing(&o))?;
                orch.submit("early", TaskArgs::new().deferred())?;
                Ok(())
            }),
            RunOptions { trace: true },
        )
        .unwrap();
    assert_eq!(out.read::<i32>().unwrap(), vec![5; 3]);
    assert!(seen.lock().unwrap() >= posted_at.lock().unwrap());
    // The deferred task's span covers its kernel's and ends at its real completion.
    let trace = report.trace.unwrap();
    let kernel = trace
        .events
        .iter()
        .find(|e| &*e.kernel == "async_op" && !e.deferred)
        .unwrap();
    let whole = trace
        .events
        .iter()
        .find(|e| &*e.kernel == "async_op" && e.deferred)
        .unwrap();
    assert!(whole.start_us <= kernel.start_us && whole.end_us >= kernel.end_us);
    assert!(
        whole.end_us - whole.start_us >= 25_000.0,
        "span {} us",
        whole.end_us - whole.start_us
    );
    let after = trace.events.iter().find(|e| &*e.kernel == "after").unwrap();
    assert!(after.start_us >= whole.end_us);
    assert_eq!(report.stats.deferred, 2);
}

#[test]
fn registering_without_deferral_or_too_often_fails_the_task() {
    let mut k = KernelRegistry::new();
    k.register("not_deferred", CoreKind::Aiv, |ctx| {
        ctx.defer(Counter::new().at_least(1))
    })
    .unwrap();
    k.register("too_many", CoreKind::Aiv, |ctx| {
        let c = Counter::new();
        for _ in 0..100 {
            ctx.defer(c.at_least(0))?;
        }
        Ok(())
    })
    .unwrap();
    let chip = Chip::builder().build().unwrap();
    let err = chip
        .run(&Program::new("a", k.clone(), |o| {
            o.submit("not_deferred", TaskArgs::new()).map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string().contains("was not submitted as deferred"),
        "{err}"
    );
    let err = chip
        .run(&Program::new("b", k, |o| {
            o.submit("too_many", TaskArgs::new().deferred()).map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("more than 64 completion conditions"),
        "{err}"
    );
}

#[test]
fn a_condition_past_its_deadline_fails_the_task_and_poisons_consumers() {
    let mut k = KernelRegistry::new();
    k.register("never", CoreKind::Aiv, |ctx| {
        ctx.output::<i32>(0)?.fill(1);
        ctx.defer_until(
            Counter::new().at_least(1),
            Instant::now() + Duration::from_millis(80),
        )
    })
    .unwrap();
    k.register("use", CoreKind::Aiv, |ctx| {
        ctx.input::<i32>(0)?;
        Ok(())
    })
    .unwrap();
    let t = Instant::now();
    let err = Chip::builder()
        .build()
        .unwrap()
        .run(&Program::new("dl", k, |o| {
            let tok = o
                .submit("never", TaskArgs::new().output(&[1], DType::I32).deferred())?
                .out(0)?;
            o.submit("use", TaskArgs::new().input(&tok))?;
            Ok(())
        }))
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5));
    match &err {
        RunError::TaskFailed {
            failure, poisoned, ..
        } => {
            assert_eq!(failure.kernel, "never");
            assert!(
                failure.message.contains("counter >= 1") && failure.message.contains("deadline"),
                "{err}"
            );
            assert_eq!(*poisoned, 1);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn failed_and_stray_completions_are_errors() {
    let mut k = KernelRegistry::new();
    k.register("fails_async", CoreKind::Aiv, |ctx| {
        let t = ctx.defer_token()?;
        ctx.completion_sender().post_error(t, 7).unwrap();
        Ok(())
    })
    .unwrap();
    let chip = Chip::builder().build().unwrap();
    let err = chip
        .run(&Program::new("f", k.clone(), |o| {
            o.submit("fails_async", TaskArgs::new().deferred())
                .map(|_| ())
        }))
        .unwrap_err();
    assert!(err.to_string().contains("status 7"), "{err}");
    // A token that is never posted fails the task at its deadline.
    let mut k2 = KernelRegistry::new();
    k2.register("no_post", CoreKind::Aiv, |ctx| {
        ctx.defer_token().map(|_| ())
    })
    .unwrap();
    let short = Chip::builder()
        .wait_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let err = short
        .run(&Program::new("np", k2, |o| {
            o.submit("no_post", TaskArgs::new().deferred()).map(|_| ())
        }))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("posted 0 of 1 times before its deadline"),
        "{err}"
    );
    // A completion for a token that names no task of the run.
    let sender = chip.completion_sender();
    let err = chip
        .run(&Program::new("s", k, move |_| {
            sender
                .post(CompletionToken(0xdead_0000_0000_0001))
                .map_err(|e| OrchError::msg(e.to_string()))
        }))
        .unwrap_err();
    assert!(
        matches!(&err, RunError::Completion(m) if m.contains("names no task")),
        "{err}"
    );
}

/// One answer of a queue that answers in order: ready once `answered` passed its position.
struct Answer {
    queue: usize,
    at: u64,
    answered: Arc<AtomicU64>,
    /// Polls made while an earlier answer of the queue was still missing.
    behind: Arc<AtomicU64>,
}

impl pto_core::Condition for Answer {
    fn poll(&self) -> pto_core::Poll {
        let answered = self.answered.load(Ordering::SeqCst);
        if self.at > answered {
            self.behind.fetch_add(1, Ordering::SeqCst);
        }
        if self.at < answered {
            pto_core::Poll::Ready
        } else {
            pto_core::Poll::Pending
        }
    }
    fn describe(&self) -> String {
        format!("answer {} of queue {}", self.at, self.queue)
    }
    fn order(&self) -> Option<(usize, u64)> {
        Some((self.queue, self.at))
    }
}

/// A chip of two AIV cores on two threads.
fn two_thread_chip() -> Chip {
    Chip::builder()
        .aic_cores(0)
        .aiv_cores(2)
        .threads(2)
        .build()
        .unwrap()
}

/// `n` shared atomics at 0.
fn zeros(n: usize) -> Vec<Arc<AtomicU64>> {
    (0..n).map(|_| Arc::new(AtomicU64::new(0))).collect()
}

/// A thread that runs `first`, then answers every queue of `answered` once a millisecond, `n`
/// times.
fn answer_in_turn(
    answered: Vec<Arc<AtomicU64>>,
    n: u64,
    first: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        first();
        for _ in 0..n {
            std::thread::sleep(Duration::from_millis(1));
            for a in &answered {
                a.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
}

/// Conditions that declare an order (`Condition::order`) are polled one per queue and pass
/// while the earliest is pending: the later ones of the queue are not polled until it holds
/// (here 16 answers come 1 ms apart while the engine polls closely: polled every pass, the
/// later ones would be polled thousands of times). Registered in the reverse order, they all
/// complete too.
#[test]
fn ordered_conditions_are_polled_one_per_queue_and_all_complete() {
    const N: u64 = 16;
    let chip = two_thread_chip();
    let answered = zeros(2);
    let behind = zeros(2);
    let mut k = KernelRegistry::new();
    for (q, name) in ["in_order", "reversed"].into_iter().enumerate() {
        let (a, b) = (answered[q].clone(), behind[q].clone());
        k.register(name, CoreKind::Aiv, move |ctx| {
            let positions: Vec<u64> = if q == 0 {
                (0..N).collect()
            } else {
                (0..N).rev().collect()
            };
            for at in positions {
                ctx.defer(Answer {
                    queue: q,
                    at,
                    answered: a.clone(),
                    behind: b.clone(),
                })?;
            }
            Ok(())
        })
        .unwrap();
    }
    let answerer = answer_in_turn(answered.clone(), N, || {
        std::thread::sleep(Duration::from_millis(10))
    });
    let report = chip
        .run(&Program::new("ordered", k, |o| {
            o.submit("in_order", TaskArgs::new().deferred())?;
            o.submit("reversed", TaskArgs::new().deferred())?;
            Ok(())
        }))
        .unwrap();
    answerer.join().unwrap();
    assert_eq!(report.stats.deferred, 2);
    // At registration each condition is looked at once; after that, in registration order,
    // none behind a pending one is polled.
    let in_order = behind[0].load(Ordering::SeqCst);
    assert!(in_order <= N, "{in_order} polls behind a pending answer");
}

/// Kernel "answer": defers one [`Answer`] of queue `s0` at position `s1`, until deadline `s2` ms
/// after it runs, and counts itself in `ran`.
fn answer_kernel(
    answered: Vec<Arc<AtomicU64>>,
    behind: Arc<AtomicU64>,
    ran: Arc<AtomicU64>,
) -> KernelRegistry {
    let mut k = KernelRegistry::new();
    k.register("answer", CoreKind::Aiv, move |ctx| {
        let (queue, at) = (ctx.scalar::<u64>(0)? as usize, ctx.scalar::<u64>(1)?);
        let within = Duration::from_millis(ctx.scalar::<u64>(2)?);
        ctx.defer_until(
            Answer {
                queue,
                at,
                answered: answered[queue].clone(),
                behind: behind.clone(),
            },
            Instant::now() + within,
        )?;
        ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    k
}

/// Many tasks that each wait for one answer of a queue (a Worker's chip tasks) wait in their
/// queue's line: they all complete, submitted out of their positions' order too, and a pass
/// polls the first of each line, not the tasks behind it.
#[test]
fn tasks_waiting_for_ordered_answers_all_complete_and_are_polled_in_line() {
    const N: u64 = 32;
    let chip = two_thread_chip();
    let answered = zeros(2);
    let (behind, ran) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let k = answer_kernel(answered.clone(), behind.clone(), ran.clone());
    let b2 = behind.clone();
    let answerer = answer_in_turn(answered.clone(), N, move || {
        // Until every task registered, a line's first may be a later position than one still
        // to come (queue 1 is submitted out of order): polls of it are not counted.
        let t = Instant::now();
        while ran.load(Ordering::SeqCst) < 2 * N && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(1));
        b2.store(0, Ordering::SeqCst);
    });
    let report = chip
        .run(&Program::new("lines", k, |o| {
            for i in 0..N {
                // Queue 0 in order; queue 1 in pairs swapped (1, 0, 3, 2, ...).
                for (q, at) in [(0, i), (1, i ^ 1)] {
                    o.submit(
                        "answer",
                        TaskArgs::new()
                            .scalar(q as u64)
                            .scalar(at)
                            .scalar(10_000u64)
                            .deferred(),
                    )?;
                }
            }
            Ok(())
        }))
        .unwrap();
    answerer.join().unwrap();
    assert_eq!(report.stats.deferred, 2 * N);
    assert_eq!(report.stats.tasks, 2 * N);
    // The answers come over some 40 ms while the engine polls closely: polling every task on
    // every pass would count thousands here; polling each line's first counts none.
    let b = behind.load(Ordering::SeqCst);
    assert!(b <= N, "{b} polls behind a pending answer");
}

/// A task behind a pending one in its line still fails at its own deadline, with its own
/// condition named, long before the task ahead of it gives up.
#[test]
fn a_task_behind_a_pending_answer_fails_at_its_own_deadline() {
    let k = answer_kernel(zeros(1), zeros(1).remove(0), zeros(1).remove(0));
    let t = Instant::now();
    let err = Chip::builder()
        .build()
        .unwrap()
        .run(&Program::new("behind", k, |o| {
            // Nobody answers: the first waits 2 s, the one behind it 50 ms.
            for (at, ms) in [(0u64, 2_000u64), (1, 50)] {
                o.submit(
                    "answer",
                    TaskArgs::new()
                        .scalar(0u64)
                        .scalar(at)
                        .scalar(ms)
                        .deferred(),
                )?;
            }
            Ok(())
        }))
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10));
    match &err {
        RunError::TaskFailed {
            failure, failed, ..
        } => {
            // The first failure is the later task's: found behind the first, at its deadline.
            assert!(
                failure.message.contains("answer 1 of queue 0")
                    && failure.message.contains("deadline"),
                "{err}"
            );
            assert_eq!(*failed, 2, "{err}");
        }
        other => panic!("{other}"),
    }
}
