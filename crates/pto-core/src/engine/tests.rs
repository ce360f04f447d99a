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

/// Every two tasks whose accesses conflict (overlapping elements, one of them a write) must be
/// ordered: the later one depends on the earlier one, directly or through other tasks, or the
/// earlier one had finished when the later one was submitted. Checked on random programs over
/// strided, transposed and sliced views, with tasks finishing in random orders between
/// submissions (so the TensorMap meets live, finished and retired entries).
mod ordering {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const N: usize = 16;

    #[derive(Clone, Debug)]
    enum View {
        Flat(usize, usize, usize),
        Box2(usize, usize, usize, usize, bool),
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A task over a view: read (IN), update (INOUT) or overwrite (OUTPUT_EXISTING).
        Task(View, ArgMode),
        /// Finish up to `n` running or ready tasks, picked by `seed`.
        Finish(usize, u64),
        Open,
        Close,
    }

    fn arb_view() -> impl Strategy<Value = View> {
        prop_oneof![
            (0..N, 0..=N, 1usize..4).prop_map(|(a, b, s)| View::Flat(a.min(b), a.max(b), s)),
            (0usize..4, 0usize..=4, 0usize..4, 0usize..=4, any::<bool>())
                .prop_map(|(a, b, c, d, t)| View::Box2(a.min(b), a.max(b), c.min(d), c.max(d), t)),
        ]
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        let mode = prop_oneof![
            Just(ArgMode::In),
            Just(ArgMode::InOut),
            Just(ArgMode::OutputExisting)
        ];
        prop_oneof![
            6 => (arb_view(), mode).prop_map(|(v, m)| Step::Task(v, m)),
            3 => (1usize..4, any::<u64>()).prop_map(|(n, s)| Step::Finish(n, s)),
            1 => Just(Step::Open),
            1 => Just(Step::Close),
        ]
    }

    fn make(base: &Tensor, v: &View) -> Tensor {
        match *v {
            View::Flat(s, e, step) => base.slice(0, s, e, step).unwrap(),
            View::Box2(r0, r1, c0, c1, t) => {
                let b = base
                    .reshape(&[4, 4])
                    .unwrap()
                    .view(&[r1 - r0, c1 - c0], &[r0, c0])
                    .unwrap();
                if t {
                    b.transpose(0, 1).unwrap()
                } else {
                    b
                }
            }
        }
    }

    fn elements(t: &Tensor) -> BTreeSet<usize> {
        let (shape, strides) = (t.shape(), t.strides());
        let total: usize = shape.iter().product();
        (0..total)
            .map(|flat| {
                let (mut rem, mut off) = (flat, t.region().offset());
                for d in (0..shape.len()).rev() {
                    off += (rem % shape[d]) * strides[d];
                    rem /= shape[d];
                }
                off
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn conflicting_tasks_are_always_ordered(steps in prop::collection::vec(arb_step(), 1..60)) {
            let mut d = Dag::new(1, 4, RingConfig { window: 16, heap_bytes: 1 << 12, alloc: None }, None);
            let base = Tensor::zeros(&[N], DType::I64).unwrap();
            // Per task: its elements, whether it writes, its direct predecessors (deps, and every
            // task already finished when it was submitted).
            let mut tasks: Vec<(BTreeSet<usize>, bool, BTreeSet<u64>)> = Vec::new();
            let mut finished: BTreeSet<u64> = BTreeSet::new();
            let mut held: Vec<Job> = Vec::new();
            let mut depth = 0;
            for step in &steps {
                match step {
                    Step::Task(v, mode) => {
                        let t = make(&base, v);
                        let args = match mode {
                            ArgMode::In => TaskArgs::new().input(&t),
                            ArgMode::InOut => TaskArgs::new().inout(&t),
                            _ => TaskArgs::new().output_existing(&t),
                        };
                        let plan = d.plan(Some(kernel()), args).unwrap();
                        let at = loop {
                            match d.place(&plan) {
                                Ok(at) => break Some(at),
                                Err(Blocked::Never(_)) => break None,
                                Err(Blocked::Wait(_)) => {
                                    // Finish everything in flight to make room.
                                    while let Some(j) = d.next_job() { held.push(j); }
                                    if held.is_empty() { break None; }
                                    for j in held.drain(..) {
                                        d.finish_block(&j, Ok(()), None, Registrations::default());
                                        finished.insert(j.task);
                                    }
                                }
                            }
                        };
                        let Some(at) = at else { continue };
                        let (id, _) = d.commit(plan, at).unwrap();
                        let mut preds: BTreeSet<u64> = d.nodes[&id.get()].deps.iter().copied().collect();
                        preds.extend(finished.iter().copied());
                        tasks.push((elements(&t), *mode != ArgMode::In, preds));
                    }
                    Step::Finish(n, seed) => {
                        while let Some(j) = d.next_job() { held.push(j); }
                        let mut s = *seed;
                        for _ in 0..*n {
                            if held.is_empty() { break; }
                            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                            let j = held.swap_remove((s >> 33) as usize % held.len());
                            d.finish_block(&j, Ok(()), None, Registrations::default());
                            finished.insert(j.task);
                        }
                    }
                    Step::Open => { d.begin_scope(false).unwrap(); depth += 1; }
                    Step::Close if depth > 0 => { d.end_scope(); depth -= 1; }
                    Step::Close => {}
                }
            }
            // Transitive closure of "ordered before", in submission order (ids are dense here).
            let mut before: Vec<BTreeSet<u64>> = Vec::new();
            for (_, _, preds) in &tasks {
                let mut all = preds.clone();
                for p in preds {
                    all.extend(before[*p as usize].iter().copied());
                }
                before.push(all);
            }
            for j in 0..tasks.len() {
                for i in 0..j {
                    let (ei, wi, _) = &tasks[i];
                    let (ej, wj, _) = &tasks[j];
                    if (*wi || *wj) && !ei.is_disjoint(ej) {
                        prop_assert!(
                            before[j].contains(&(i as u64)),
                            "task {j} conflicts with task {i} but is not ordered after it"
                        );
                    }
                }
            }
        }
    }
}
