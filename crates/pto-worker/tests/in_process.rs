//! A Worker whose children are threads of this process (`WorkerBuilder::in_process`): the same
//! programs, groups, sub-workers and failures as with forked children, in a process that already
//! has threads (libtest's). One test function runs the scenarios in turn, so that its check for
//! segments left behind sees no other test's.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use pto_comm::{BufferSpec, CommContext, SignalOp, WindowSpec};
use pto_core::{CoreKind, DType, KernelError, KernelRegistry, TaskArgs};
use pto_worker::{Worker, WorkerBuilder, WorkerError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn kernels() -> KernelRegistry {
    let mut k = KernelRegistry::new();
    k.register("add", CoreKind::Aiv, |ctx| {
        let (a, b) = (ctx.input::<f32>(0)?.to_vec(), ctx.input::<f32>(1)?.to_vec());
        ctx.output::<f32>(2)?
            .assign(&a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>())?;
        Ok(())
    })
    .unwrap();
    k.register("boom", CoreKind::Aiv, |_| {
        Err(KernelError::msg("chip kernel failed on purpose"))
    })
    .unwrap();
    // Ring barrier through the window, as in tests/worker.rs: every chip must run at once.
    k.register("ring", CoreKind::Aiv, |ctx| {
        let c = ctx
            .ext::<CommContext>()
            .ok_or_else(|| KernelError::msg("no comm"))?;
        let w = c.window(0).map_err(|e| KernelError::msg(e.to_string()))?;
        let next = (w.rank() + 1) % w.ranks();
        w.notify(next, 0, 1, SignalOp::Add)
            .map_err(|e| KernelError::msg(e.to_string()))?;
        w.wait_until(0, 1)
            .map_err(|e| KernelError::msg(e.to_string()))?;
        let r = w.rank() as i64;
        ctx.output::<i64>(0)?.set(&[r as usize], r + 1)?;
        Ok(())
    })
    .unwrap();
    k.register("nap", CoreKind::Aiv, |_| {
        std::thread::sleep(Duration::from_millis(1500));
        Ok(())
    })
    .unwrap();
    k
}

fn builder(chips: usize) -> WorkerBuilder {
    Worker::builder()
        .chips(chips)
        .cores(1, 2)
        .sub_workers(1)
        .in_process()
        .timeout(Duration::from_secs(20))
        .window(WindowSpec::for_buffers(vec![BufferSpec::new(
            "signal",
            DType::U32,
            16,
        )]))
        .program("add", kernels(), |o, call| {
            let (a, b, out) = (call.tensor(0)?, call.tensor(1)?, call.tensor(2)?);
            o.submit(
                "add",
                TaskArgs::new().input(a).input(b).output_existing(out),
            )
            .map(|_| ())
        })
        .program("boom", kernels(), |o, _| {
            o.submit("boom", TaskArgs::new()).map(|_| ())
        })
        .program("ring", kernels(), |o, call| {
            o.submit("ring", TaskArgs::new().no_dep(call.tensor(0)?))
                .map(|_| ())
        })
        .program("nap", kernels(), |o, _| {
            o.submit("nap", TaskArgs::new()).map(|_| ())
        })
        .sub("check_sum", |call| {
            let t = |i: usize| call.tensors[i].0.read::<f32>().map_err(|e| e.to_string());
            let (a, b, out) = (t(0)?, t(1)?, t(2)?);
            let ok = a.iter().zip(&b).zip(&out).all(|((x, y), z)| x + y == *z);
            call.tensors[3]
                .0
                .write(&[i32::from(ok)])
                .map_err(|e| e.to_string())
        })
}

/// This process's segments (every Worker here is in this process).
fn segments() -> Vec<String> {
    let me = std::process::id();
    pto_shm::sweep::list()
        .into_iter()
        .filter(|s| s.name.starts_with(&format!("/pto.{me}.")))
        .map(|s| s.name)
        .collect()
}

fn programs_groups_and_a_sub_worker_run_on_threads() -> TestResult {
    let w = builder(3).init()?;
    assert_eq!(w.child_pid(0), None, "a chip is a thread, not a process");
    let n = 8;
    let mut ts = Vec::new();
    for c in 0..3 {
        let a = w.tensor(&[n], DType::F32)?;
        let b = w.tensor(&[n], DType::F32)?;
        a.write(&(0..n).map(|i| (i + 100 * c) as f32).collect::<Vec<_>>())?;
        b.write(&vec![0.5f32; n])?;
        ts.push((
            a,
            b,
            w.tensor(&[n], DType::F32)?,
            w.tensor(&[1], DType::I32)?,
        ));
    }
    let t2 = ts.clone();
    let report = w.run(move |h| {
        for (c, (a, b, out, v)) in t2.iter().enumerate() {
            h.submit_chip(
                c,
                "add",
                TaskArgs::new().input(a).input(b).output_existing(out),
            )?;
            h.submit_sub(
                "check_sum",
                TaskArgs::new()
                    .input(a)
                    .input(b)
                    .input(out)
                    .output_existing(v),
            )?;
        }
        Ok(())
    })?;
    assert_eq!(report.stats.tasks, 6);
    for (c, (a, b, out, v)) in ts.iter().enumerate() {
        let want: Vec<f32> = a
            .read::<f32>()?
            .iter()
            .zip(b.read::<f32>()?)
            .map(|(x, y)| x + y)
            .collect();
        assert_eq!(out.read::<f32>()?, want, "chip {c}");
        assert_eq!(v.read::<i32>()?, vec![1], "sub-worker verdict for chip {c}");
    }
    // A group through the window: it deadlocks unless the three chip threads run at once.
    let seen = w.tensor(&[3], DType::I64)?;
    let s2 = seen.clone();
    w.run(move |h| {
        h.submit_group(&[0, 1, 2], "ring", TaskArgs::new().no_dep(&s2))
            .map(|_| ())
    })?;
    assert_eq!(seen.read::<i64>()?, vec![1, 2, 3]);
    // A failure names its chip, and the Worker stays usable.
    let err = w
        .run(|h| h.submit_chip(1, "boom", TaskArgs::new()).map(|_| ()))
        .unwrap_err();
    assert!(
        err.to_string().contains("chip 1") && err.to_string().contains("failed on purpose"),
        "{err}"
    );
    w.run(|_| Ok(()))?;
    drop((ts, seen));
    w.close();
    Ok(())
}

fn an_abort_ends_a_run_at_once_and_close_waits_for_the_threads() -> TestResult {
    let w = std::sync::Arc::new(builder(2).init()?);
    let w2 = w.clone();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        w2.abort("stopped by the test");
    });
    let t = Instant::now();
    let err = w
        .run(|h| h.submit_chip(0, "nap", TaskArgs::new()).map(|_| ()))
        .unwrap_err();
    aborter.join().unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(1400),
        "took {:?}",
        t.elapsed()
    );
    assert!(err.to_string().contains("stopped by the test"), "{err}");
    let again = w.run(|_| Ok(())).unwrap_err();
    assert!(matches!(again, WorkerError::Broken(_)), "{again}");
    // The napping chip thread returns within its nap; close waits for it.
    std::sync::Arc::try_unwrap(w).ok().unwrap().close();
    Ok(())
}

fn child_workers_are_refused() -> TestResult {
    let err = Worker::builder()
        .chips(1)
        .in_process()
        .child_worker(|| Worker::builder().chips(1))
        .init()
        .unwrap_err();
    assert!(err.to_string().contains("in_process"), "{err}");
    Ok(())
}

#[test]
fn in_process_children() -> TestResult {
    programs_groups_and_a_sub_worker_run_on_threads()?;
    an_abort_ends_a_run_at_once_and_close_waits_for_the_threads()?;
    child_workers_are_refused()?;
    let left = segments();
    assert!(left.is_empty(), "segments left behind: {left:?}");
    Ok(())
}
