//! A Worker whose children are threads of this process (`WorkerBuilder::in_process`): the same
//! programs, groups, sub-workers and failures as with forked children (`tests/common`), in a
//! process that already has threads (libtest's). One test function runs the scenarios in turn,
//! so that its check for segments left behind sees no other test's.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use pto_core::{CoreKind, KernelRegistry, TaskArgs};
use pto_worker::{Worker, WorkerBuilder, WorkerError};

mod common;
use common::Failed;

fn builder(chips: usize) -> WorkerBuilder {
    let mut nap = KernelRegistry::new();
    nap.register("nap", CoreKind::Aiv, |_| {
        std::thread::sleep(Duration::from_millis(1500));
        Ok(())
    })
    .unwrap();
    common::builder(chips)
        .in_process()
        .program("nap", nap, |o, _| {
            o.submit("nap", TaskArgs::new()).map(|_| ())
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

fn programs_groups_and_a_sub_worker_run_on_threads() -> Result<(), Failed> {
    let w = builder(3).init()?;
    assert_eq!(w.child_pid(0), None, "a chip is a thread, not a process");
    common::programs_a_sub_worker_and_a_group(&w)?;
    // A failure names its chip, and the Worker stays usable.
    let err = w
        .run(|h| h.submit_chip(1, "boom", TaskArgs::new()).map(|_| ()))
        .unwrap_err();
    assert!(
        err.to_string().contains("chip 1") && err.to_string().contains("failed on purpose"),
        "{err}"
    );
    w.run(|_| Ok(()))?;
    w.close();
    Ok(())
}

fn an_abort_ends_a_run_at_once_and_close_waits_for_the_threads() -> Result<(), Failed> {
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

fn child_workers_are_refused() -> Result<(), Failed> {
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
fn in_process_children() -> Result<(), Failed> {
    programs_groups_and_a_sub_worker_run_on_threads()?;
    an_abort_ends_a_run_at_once_and_close_waits_for_the_threads()?;
    child_workers_are_refused()?;
    let left = segments();
    assert!(left.is_empty(), "segments left behind: {left:?}");
    Ok(())
}
