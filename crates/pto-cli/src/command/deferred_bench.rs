//! `pto bench deferred`: how fast a deferred task's consumer starts once its condition holds,
//! and how many completions per second one producer pushes through the completion queue.
//! Baselines in the same run: a condition-variable wake-up, and a crossbeam-free
//! `Mutex<VecDeque>` channel.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use pto::core::{Completion, Counter, HeapQueue};
use pto::prelude::*;
use pto_shm::process::monotonic_ns;
use serde_json::json;

use crate::cli::BenchArgs;

use super::stats::{median, percentile};

/// Latencies (µs) from "condition set" to "consumer kernel started", one per pair.
fn condition_latency(pairs: usize, threads: usize) -> anyhow::Result<Vec<f64>> {
    let counters: Arc<Vec<Counter>> = Arc::new((0..pairs).map(|_| Counter::new()).collect());
    let set_at: Arc<Vec<AtomicU64>> = Arc::new((0..pairs).map(|_| AtomicU64::new(0)).collect());
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..pairs).map(|_| AtomicU64::new(0)).collect());
    let mut k = KernelRegistry::new();
    let c = counters.clone();
    k.register("wait", CoreKind::Aiv, move |ctx| {
        let i = ctx.scalar::<u64>(0)? as usize;
        ctx.output::<i32>(0)?.fill(1);
        ctx.defer(c[i].at_least(1))
    })?;
    let s = started.clone();
    k.register("consume", CoreKind::Aiv, move |ctx| {
        let t = monotonic_ns();
        ctx.input::<i32>(0)?;
        s[ctx.scalar::<u64>(0)? as usize].store(t, Ordering::Release);
        ctx.output::<i32>(1)?.fill(1);
        Ok(())
    })?;
    let chip = Chip::builder()
        .aic_cores(1)
        .aiv_cores(2)
        .threads(threads)
        .build()?;
    let (c2, set2, st2) = (counters.clone(), set_at.clone(), started.clone());
    let releaser = std::thread::spawn(move || {
        for i in 0..pairs {
            // Wait for the previous consumer, then give the waiter time to register.
            let deadline = Instant::now() + Duration::from_secs(10);
            while i > 0 && st2[i - 1].load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(30) {
                std::hint::spin_loop();
            }
            set2[i].store(monotonic_ns(), Ordering::Release);
            c2[i].add(1);
        }
    });
    chip.run(&Program::new("latency", k, move |o| {
        // At most two pairs outstanding (deferred wait lists are short in real programs).
        let mut prev: Option<Tensor> = None;
        for i in 0..pairs {
            let tok = o
                .submit(
                    "wait",
                    TaskArgs::new()
                        .output(&[1], DType::I32)
                        .scalar(i as u64)
                        .deferred(),
                )?
                .out(0)?;
            let done = o
                .submit(
                    "consume",
                    TaskArgs::new()
                        .input(&tok)
                        .output(&[1], DType::I32)
                        .scalar(i as u64),
                )?
                .out(0)?;
            if let Some(p) = prev.replace(done) {
                o.read::<i32>(&p)?;
            }
        }
        Ok(())
    }))?;
    if releaser.join().is_err() {
        bail!("releaser thread panicked");
    }
    Ok((0..pairs)
        .map(|i| {
            let (a, b) = (
                set_at[i].load(Ordering::Acquire),
                started[i].load(Ordering::Acquire),
            );
            b.saturating_sub(a) as f64 / 1e3
        })
        .collect())
}

/// Baseline: a condition variable wake-up, measured the same way.
fn condvar_latency(rounds: usize) -> Vec<f64> {
    let pair = Arc::new((Mutex::new(0usize), Condvar::new()));
    let set_at = Arc::new(AtomicU64::new(0));
    let (p2, s2) = (pair.clone(), set_at.clone());
    let waiter = std::thread::spawn(move || {
        let mut out = Vec::with_capacity(rounds);
        let (m, cv) = &*p2;
        for i in 1..=rounds {
            let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
            while *g < i {
                g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            out.push(monotonic_ns().saturating_sub(s2.load(Ordering::Acquire)) as f64 / 1e3);
        }
        out
    });
    for i in 1..=rounds {
        std::thread::sleep(Duration::from_micros(50));
        let (m, cv) = &*pair;
        set_at.store(monotonic_ns(), Ordering::Release);
        *m.lock().unwrap_or_else(|e| e.into_inner()) = i;
        cv.notify_one();
    }
    waiter.join().unwrap_or_default()
}

/// Completions per second with one producer thread and one consumer thread.
fn queue_throughput(n: u64) -> f64 {
    let q = Arc::new(HeapQueue::new(4096));
    let q2 = q.clone();
    let t = Instant::now();
    let producer = std::thread::spawn(move || {
        for i in 0..n {
            while q2
                .queue()
                .post(Completion {
                    token: i,
                    status: 0,
                })
                .is_err()
            {
                std::hint::spin_loop();
            }
        }
    });
    let mut got = 0;
    while got < n {
        if q.queue().pop().is_some() {
            got += 1;
        } else {
            std::hint::spin_loop();
        }
    }
    let _ = producer.join();
    n as f64 / t.elapsed().as_secs_f64()
}

/// Baseline: the same traffic through a `Mutex<VecDeque>`.
fn mutex_throughput(n: u64) -> f64 {
    let q = Arc::new(Mutex::new(VecDeque::with_capacity(4096)));
    let q2 = q.clone();
    let t = Instant::now();
    let producer = std::thread::spawn(move || {
        for i in 0..n {
            loop {
                let mut g = q2.lock().unwrap_or_else(|e| e.into_inner());
                if g.len() < 4096 {
                    g.push_back(i);
                    break;
                }
            }
        }
    });
    let mut got = 0;
    while got < n {
        if q.lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .is_some()
        {
            got += 1;
        }
    }
    let _ = producer.join();
    n as f64 / t.elapsed().as_secs_f64()
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<ExitCode> {
    let cpus = std::thread::available_parallelism().map_or(2, usize::from);
    let threads = a.threads.unwrap_or(cpus);
    let pairs = a.tasks.clamp(100, 8000);
    condition_latency(100, threads)?; // warm-up
    let lat = condition_latency(pairs, threads)?;
    let cv = condvar_latency(pairs.min(2000));
    let (med, p90) = (median(lat.clone()), percentile(&lat, 90.0));
    let cv_med = median(cv);
    let n = 10_000_000u64;
    let q = median((0..a.reps.max(1)).map(|_| queue_throughput(n)).collect());
    let m = median(
        (0..a.reps.max(1))
            .map(|_| mutex_throughput(n / 4))
            .collect(),
    );
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let lines = [
        json!({"bench": "deferred_latency", "pairs": pairs, "threads": threads,
               "median_us": r3(med), "p90_us": r3(p90),
               "condvar_wake_median_us": r3(cv_med), "ratio_vs_condvar": r3(med / cv_med)}),
        json!({"bench": "completion_queue", "producers": 1, "completions": n,
               "per_sec": q.round(), "mutex_deque_per_sec": m.round(), "ratio_vs_mutex": r3(q / m)}),
    ];
    for l in lines {
        super::print_line(a.json, &l)?;
    }
    Ok(ExitCode::SUCCESS)
}
