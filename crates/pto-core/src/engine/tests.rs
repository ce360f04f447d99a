//! Engine-level tests that drive a `Dag` directly, without threads.

use super::*;
use crate::kernel::Registrations;
use crate::{CoreKind, DType, KernelRegistry};

fn dag() -> Dag {
    Dag::new(
        1,
        2,
        RingConfig {
            window: 64,
            heap_bytes: 1 << 16,
            alloc: None,
        },
        None,
    )
}

fn kernel() -> Arc<Kernel> {
    let mut r = KernelRegistry::new();
    r.register("k", CoreKind::Aiv, |_| Ok(())).unwrap();
    r.lookup("k").unwrap().clone()
}

fn submit(d: &mut Dag, args: TaskArgs) -> u64 {
    let plan = d.plan(Some(kernel()), args).unwrap();
    let at = d.place(&plan).ok().unwrap();
    d.commit(plan, at).unwrap().0.get()
}

/// Runs every ready block to completion, in dispatch order; returns the task order.
fn drain(d: &mut Dag) -> Vec<u64> {
    let mut order = Vec::new();
    while let Some(job) = d.next_job() {
        order.push(job.task);
        d.finish_block(&job, Ok(()), None, Registrations::default());
    }
    order
}

#[test]
fn entries_leave_the_tensormap_when_tasks_retire() {
    let mut d = dag();
    let t = Tensor::zeros(&[8], DType::F32).unwrap();
    d.begin_scope(false).unwrap();
    for _ in 0..5 {
        submit(&mut d, TaskArgs::new().input(&t));
        submit(&mut d, TaskArgs::new().inout(&t.view(&[4], &[2]).unwrap()));
    }
    assert!(d.tmap.len() > 0);
    assert_eq!(drain(&mut d).len(), 10);
    d.end_scope();
    assert_eq!(d.tmap.len(), 0);
    assert_eq!(d.nodes.len(), 0);
    assert_eq!(d.outstanding, 0);
}

#[test]
fn a_covering_writer_replaces_older_entries_and_retirement_keeps_it() {
    let mut d = dag();
    let t = Tensor::zeros(&[8], DType::F32).unwrap();
    d.begin_scope(false).unwrap();
    let a = submit(
        &mut d,
        TaskArgs::new().output_existing(&t.view(&[4], &[0]).unwrap()),
    );
    let b = submit(&mut d, TaskArgs::new().output_existing(&t));
    // b covers a: a's entry is gone, b's stays.
    assert_eq!(d.tmap.len(), 1);
    assert_eq!(drain(&mut d), vec![a, b]);
    d.end_scope();
    // Both retired: nothing left.
    assert_eq!(d.tmap.len(), 0);
    // A new writer in a new scope, then the old ones are long gone; a reader depends only on it.
    d.begin_scope(false).unwrap();
    let c = submit(&mut d, TaskArgs::new().output_existing(&t));
    let r = submit(&mut d, TaskArgs::new().input(&t.view(&[2], &[1]).unwrap()));
    assert_eq!(d.nodes[&r].deps.as_slice(), &[c]);
    assert_eq!(drain(&mut d), vec![c, r]);
}

#[test]
fn readers_are_ordered_before_a_later_writer() {
    let mut d = dag();
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    let r1 = submit(&mut d, TaskArgs::new().input(&t));
    let r2 = submit(&mut d, TaskArgs::new().input(&t));
    let w = submit(&mut d, TaskArgs::new().output_existing(&t));
    let mut deps = d.nodes[&w].deps.clone();
    deps.sort_unstable();
    assert_eq!(deps.as_slice(), &[r1, r2]);
    // Readers do not depend on each other.
    assert!(d.nodes[&r2].deps.is_empty());
}

#[test]
fn a_ring_full_of_an_open_scope_is_a_deadlock_not_a_wait() {
    let mut d = Dag::new(
        1,
        1,
        RingConfig {
            window: 4,
            heap_bytes: 1024,
            alloc: None,
        },
        None,
    );
    d.begin_scope(false).unwrap();
    for _ in 0..3 {
        submit(&mut d, TaskArgs::new());
    }
    drain(&mut d);
    let plan = d.plan(Some(kernel()), TaskArgs::new()).unwrap();
    assert!(matches!(
        d.place(&plan),
        Err(Blocked::Never(OrchError::ScopeDeadlock { depth: 1, .. }))
    ));
    d.end_scope();
    // Once the scope ended, the finished tasks retired and there is room.
    assert!(d.place(&plan).is_ok());
}

#[test]
#[ignore = "timing probe, run by hand in release mode"]
fn probe_engine_cost() {
    let mut d = Dag::new(
        1,
        2,
        RingConfig {
            window: 4096,
            heap_bytes: 1 << 20,
            alloc: None,
        },
        None,
    );
    let t = Tensor::zeros(&[1], DType::I64).unwrap();
    let k = kernel();
    let n = 200_000;
    let start = std::time::Instant::now();
    let mut i = 0;
    while i < n {
        d.begin_scope(false).unwrap();
        for _ in 0..1024 {
            let plan = d.plan(Some(k.clone()), TaskArgs::new().inout(&t)).unwrap();
            let at = d.place(&plan).ok().unwrap();
            d.commit(plan, at).unwrap();
            while let Some(job) = d.next_job() {
                d.finish_block(&job, Ok(()), None, Registrations::default());
            }
            i += 1;
        }
        d.end_scope();
    }
    eprintln!(
        "engine: {:.0} ns/task",
        start.elapsed().as_secs_f64() * 1e9 / n as f64
    );
}
