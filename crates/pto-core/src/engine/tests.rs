//! Engine-level tests that drive the engine directly from this thread (no core threads): the
//! orchestrator submits, and `drain` runs every ready block here.

use super::execute::Job;
use super::submit::{Blocked, Orchestrator, RingConfig};
use super::*;
use crate::args::{ArgMode, TaskArgs};
use crate::error::OrchError;
use crate::kernel::Kernel;
use crate::tensor::Tensor;
use crate::{CoreKind, DType, KernelRegistry};

fn engine(aic: u32, aiv: u32, window: usize) -> Arc<Engine> {
    Arc::new(Engine::new(EngineConfig {
        aic,
        aiv,
        threads: 1,
        max_slots: NUM_RINGS * window + 64,
        spin: Duration::ZERO,
        wait: Duration::from_secs(5),
        sender: crate::deferred::CompletionSender::new(Arc::new(pto_shm::ring::HeapQueue::new(64))),
        ext: None,
        hold: false,
        reserve: false,
    }))
}

fn orch(e: &Arc<Engine>, window: usize, heap: usize) -> Orchestrator {
    e.nonce.store(7, Ordering::Relaxed);
    Orchestrator::new(
        e.clone(),
        RingConfig {
            window,
            heap_bytes: heap,
            alloc: None,
        },
        7,
    )
}

fn kernel() -> Arc<Kernel> {
    let mut r = KernelRegistry::new();
    r.register("k", CoreKind::Aiv, |_| Ok(())).unwrap();
    r.lookup("k").unwrap().clone()
}

fn submit(o: &mut Orchestrator, mut args: TaskArgs) -> u64 {
    let k = kernel();
    let plan = o.plan(Some(&k), &args).unwrap();
    let at = o.place(&plan).ok().unwrap();
    o.commit(&plan, &mut args, at).unwrap().0.get()
}

/// Takes every ready block without running it yet.
fn take_all(e: &Engine) -> Vec<Job> {
    // What the orchestrating thread does before it waits: publish what it staged.
    e.publish_orch();
    let mut rot = 0;
    let mut v = Vec::new();
    while let Some(j) = e.find_work(&mut rot, &mut None) {
        v.push(j);
    }
    v
}

/// Runs one taken block to completion on this thread; queues whatever it made ready.
fn run(e: &Engine, j: Job) -> u64 {
    let id = e.slab.get(j.slot).id.load(Ordering::Relaxed);
    let mut streak = super::execute::IMMEDIATE_LIMIT;
    // The streak is spent: consumers are queued, not run here.
    assert!(e.run_block(0, j, &mut streak).is_none());
    e.cores.release(j.core);
    id
}

/// Runs every ready block to completion, in dispatch order; returns the task order.
fn drain(e: &Engine) -> Vec<u64> {
    let mut order = Vec::new();
    loop {
        let jobs = take_all(e);
        if jobs.is_empty() {
            return order;
        }
        for j in jobs {
            order.push(run(e, j));
        }
    }
}

fn live(o: &Orchestrator) -> usize {
    o.live_tasks()
}

/// Runs on this thread (as core thread 0) every block that is ready, and the consumers they make
/// ready, keeping a core across blocks as a core thread does.
fn run_ready(e: &Engine, rot: &mut usize, streak: &mut u32) {
    // What the orchestrating thread does before it waits: publish what it staged.
    e.publish_orch();
    let mut held = None;
    let mut next = e.find_work(rot, &mut held);
    while let Some(j) = next {
        next = e.run_block(0, j, streak);
        if next.is_none() {
            held = Some(j.core);
            next = e.find_work(rot, &mut held);
        }
    }
    if let Some(c) = held.take() {
        e.cores.release(c);
    }
}

#[test]
fn entries_leave_the_tensormap_when_tasks_retire() {
    let e = engine(1, 2, 64);
    let mut o = orch(&e, 64, 1 << 16);
    let t = Tensor::zeros(&[8], DType::F32).unwrap();
    o.begin_scope(false).unwrap();
    for _ in 0..5 {
        submit(&mut o, TaskArgs::new().input(&t));
        submit(&mut o, TaskArgs::new().inout(t.view(&[4], &[2]).unwrap()));
    }
    assert!(o.tmap_len() > 0);
    assert_eq!(drain(&e).len(), 10);
    o.end_scope();
    assert_eq!(o.tmap_len(), 0);
    assert_eq!(live(&o), 0);
    assert_eq!(e.finished_total(), 10);
    o.close();
}

/// Retired tasks' entries leave in sweeps, not one by one: a long run over ever new regions
/// keeps the map within a bound (twice what the last sweep left, at least the sweep floor)
/// and the dependencies right.
#[test]
fn the_tensormap_stays_bounded_over_a_long_run_of_disjoint_writes() {
    let e = engine(1, 2, 256);
    let mut o = orch(&e, 256, 1 << 16);
    let n = 20_000;
    let t = Tensor::zeros(&[n], DType::F32).unwrap();
    let mut most = 0;
    for i in 0..n {
        o.begin_scope(false).unwrap();
        let w = submit(
            &mut o,
            TaskArgs::new().output_existing(t.view(&[1], &[i]).unwrap()),
        );
        let r = submit(&mut o, TaskArgs::new().input(t.view(&[1], &[i]).unwrap()));
        // The reader of element i depends on its writer only.
        assert_eq!(o.deps_of(r), vec![w]);
        assert_eq!(drain(&e).len(), 2);
        o.end_scope();
        most = most.max(o.tmap_entries());
    }
    assert!(most <= 2 * 4096, "the map grew to {most} entries");
    assert_eq!(o.tmap_len(), 0);
    o.close();
}

#[test]
fn a_covering_writer_replaces_older_entries_and_retirement_keeps_it() {
    let e = engine(1, 2, 64);
    let mut o = orch(&e, 64, 1 << 16);
    let t = Tensor::zeros(&[8], DType::F32).unwrap();
    o.begin_scope(false).unwrap();
    let a = submit(
        &mut o,
        TaskArgs::new().output_existing(t.view(&[4], &[0]).unwrap()),
    );
    let b = submit(&mut o, TaskArgs::new().output_existing(&t));
    // b covers a: a's entry is gone, b's stays.
    assert_eq!(o.tmap_len(), 1);
    assert_eq!(drain(&e), vec![a, b]);
    o.end_scope();
    // Both retired: nothing left.
    assert_eq!(o.tmap_len(), 0);
    // A new writer in a new scope, then a reader depends only on it.
    o.begin_scope(false).unwrap();
    let c = submit(&mut o, TaskArgs::new().output_existing(&t));
    let r = submit(&mut o, TaskArgs::new().input(t.view(&[2], &[1]).unwrap()));
    assert_eq!(o.deps_of(r), vec![c]);
    assert_eq!(drain(&e), vec![c, r]);
    o.end_scope();
    o.close();
}

#[test]
fn readers_are_ordered_before_a_later_writer() {
    let e = engine(1, 2, 64);
    let mut o = orch(&e, 64, 1 << 16);
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    let r1 = submit(&mut o, TaskArgs::new().input(&t));
    let r2 = submit(&mut o, TaskArgs::new().input(&t));
    let w = submit(&mut o, TaskArgs::new().output_existing(&t));
    let mut deps = o.deps_of(w);
    deps.sort_unstable();
    assert_eq!(deps, vec![r1, r2]);
    // Readers do not depend on each other.
    assert!(o.deps_of(r2).is_empty());
    drain(&e);
    o.end_scope();
    o.close();
}

#[test]
fn a_ring_full_of_an_open_scope_is_a_deadlock_not_a_wait() {
    let e = engine(1, 1, 4);
    let mut o = orch(&e, 4, 1024);
    o.begin_scope(false).unwrap();
    for _ in 0..3 {
        submit(&mut o, TaskArgs::new());
    }
    drain(&e);
    let k = kernel();
    let plan = o.plan(Some(&k), &TaskArgs::new()).unwrap();
    assert!(matches!(
        o.place(&plan),
        Err(Blocked::Never(OrchError::ScopeDeadlock { depth: 1, .. }))
    ));
    o.end_scope();
    // Once the scope ended, the finished tasks retired and there is room.
    assert!(o.place(&plan).is_ok());
    o.end_scope();
    o.close();
}

#[test]
fn an_edge_to_a_producer_that_finishes_meanwhile_is_not_lost() {
    // A consumer submitted while its producer runs gets an edge; one submitted after the
    // producer finished gets none but is ready at once; both run exactly once.
    let e = engine(1, 2, 64);
    let mut o = orch(&e, 64, 1 << 16);
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    let p = submit(&mut o, TaskArgs::new().output_existing(&t));
    let jobs = take_all(&e);
    assert_eq!(jobs.len(), 1);
    let c1 = submit(&mut o, TaskArgs::new().input(&t));
    assert!(take_all(&e).is_empty(), "c1 must wait for p");
    assert_eq!(run(&e, jobs[0]), p);
    let c2 = submit(&mut o, TaskArgs::new().input(&t));
    let mut order = drain(&e);
    order.sort_unstable();
    assert_eq!(order, vec![c1, c2]);
    o.end_scope();
    o.close();
}

#[test]
#[ignore = "timing probe, run by hand in release mode"]
fn probe_engine_cost() {
    let e = engine(1, 2, 4096);
    let mut o = orch(&e, 4096, 1 << 20);
    let t = Tensor::zeros(&[1], DType::I64).unwrap();
    let k = kernel();
    let n = 200_000;
    let start = std::time::Instant::now();
    let mut i = 0;
    let mut rot = 0;
    let mut streak = 0;
    while i < n {
        o.begin_scope(false).unwrap();
        for _ in 0..1024 {
            let mut args = TaskArgs::new().inout(&t);
            let plan = o.plan(Some(&k), &args).unwrap();
            let at = o.place(&plan).ok().unwrap();
            o.commit(&plan, &mut args, at).unwrap();
            run_ready(&e, &mut rot, &mut streak);
            i += 1;
        }
        o.end_scope();
    }
    eprintln!(
        "engine: {:.0} ns/task",
        start.elapsed().as_secs_f64() * 1e9 / n as f64
    );
    o.close();
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
            let e = engine(1, 4, 16);
            let mut d = orch(&e, 16, 1 << 12);
            let base = Tensor::zeros(&[N], DType::I64).unwrap();
            // Per task: its elements, whether it writes, its direct predecessors (deps, and every
            // task already finished when it was submitted).
            let mut tasks: Vec<(BTreeSet<usize>, bool, BTreeSet<u64>)> = Vec::new();
            let mut finished: BTreeSet<u64> = BTreeSet::new();
            let mut held: Vec<Job> = Vec::new();
            let mut ids: Vec<u64> = Vec::new();
            let mut depth = 0;
            for step in &steps {
                match step {
                    Step::Task(v, mode) => {
                        let t = make(&base, v);
                        let mut args = match mode {
                            ArgMode::In => TaskArgs::new().input(&t),
                            ArgMode::InOut => TaskArgs::new().inout(&t),
                            _ => TaskArgs::new().output_existing(&t),
                        };
                        let k = kernel();
                        let plan = d.plan(Some(&k), &args).unwrap();
                        let at = loop {
                            match d.place(&plan) {
                                Ok(at) => break Some(at),
                                Err(Blocked::Never(_)) => break None,
                                Err(Blocked::Wait(_)) => {
                                    // Finish everything in flight to make room.
                                    held.extend(take_all(&e));
                                    if held.is_empty() { break None; }
                                    for j in held.drain(..) {
                                        finished.insert(run(&e, j));
                                    }
                                }
                            }
                        };
                        let Some(at) = at else { continue };
                        let (id, _) = d.commit(&plan, &mut args, at).unwrap();
                        ids.push(id.get());
                        let mut preds: BTreeSet<u64> = d.deps_of(id.get()).into_iter().collect();
                        preds.extend(finished.iter().copied());
                        tasks.push((elements(&t), *mode != ArgMode::In, preds));
                    }
                    Step::Finish(n, seed) => {
                        held.extend(take_all(&e));
                        let mut s = *seed;
                        for _ in 0..*n {
                            if held.is_empty() { break; }
                            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                            let j = held.swap_remove((s >> 33) as usize % held.len());
                            finished.insert(run(&e, j));
                        }
                    }
                    Step::Open => { d.begin_scope(false).unwrap(); depth += 1; }
                    Step::Close if depth > 0 => { d.end_scope(); depth -= 1; }
                    Step::Close => {}
                }
            }
            // Finish what is left, so the run ends cleanly.
            loop {
                held.extend(take_all(&e));
                if held.is_empty() { break; }
                for j in held.drain(..) { run(&e, j); }
            }
            while d.depth() > 0 { d.end_scope(); }
            d.end_scope();
            d.close();
            let _ = ids;
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

#[test]
#[ignore = "prints sizes"]
fn print_sizes() {
    eprintln!(
        "Tensor {} TensorArg {} Region {} Body {} Slot {} Payload {} TaskArgs {} Scalar {}",
        std::mem::size_of::<Tensor>(),
        std::mem::size_of::<crate::args::TensorArg>(),
        std::mem::size_of::<crate::tensor::Region>(),
        std::mem::size_of::<super::slab::Body>(),
        std::mem::size_of::<super::slab::Slot>(),
        std::mem::size_of::<crate::kernel::Payload>(),
        std::mem::size_of::<TaskArgs>(),
        std::mem::size_of::<crate::args::Scalar>(),
    );
}

/// Split of the engine's cost on one thread, for the three patterns of `pto bench dag` (chain:
/// one INOUT cell; fan: read one cell, write the next cell of a long buffer; diamond: read two
/// cells of the layer before, write one of this layer, layers of 8): submitting 1024 tasks (no
/// core thread touches anything meanwhile), then running them. What `pto bench dag` measures
/// beyond the submit cost is the price of handing tasks between CPUs. Prints; run by hand with
/// `cargo test --release -p pto-core --lib probe_submit_vs_run_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn probe_submit_vs_run_cost() {
    for pattern in ["chain", "fan", "diamond"] {
        let e = engine(1, 2, 4096);
        let mut o = orch(&e, 4096, 1 << 20);
        let cell = Tensor::zeros(&[1], DType::I64).unwrap();
        let cells = Tensor::zeros(&[1 << 20], DType::I64).unwrap();
        let layers = Tensor::zeros(&[2, 8], DType::I64).unwrap();
        let k = kernel();
        let (mut sub, mut run, mut n) = (0f64, 0f64, 0usize);
        let (mut rot, mut streak, mut j) = (0, 0, 0usize);
        for _ in 0..200 {
            o.begin_scope(false).unwrap();
            let t0 = std::time::Instant::now();
            for _ in 0..1024 {
                let mut args = match pattern {
                    "chain" => TaskArgs::new().inout(&cell),
                    "fan" => {
                        let v = cells.view(&[1], &[j]).unwrap();
                        TaskArgs::new().input(&cell).output_existing(&v)
                    }
                    _ => {
                        let (layer, c) = (j / 8, j % 8);
                        let (src, dst) = ((layer + 1) % 2, layer % 2);
                        let a = layers.view(&[1, 1], &[src, c]).unwrap();
                        let b = layers.view(&[1, 1], &[src, (c + 1) % 8]).unwrap();
                        let out = layers.view(&[1, 1], &[dst, c]).unwrap();
                        TaskArgs::new().input(&a).input(&b).output_existing(&out)
                    }
                };
                j += 1;
                let plan = o.plan(Some(&k), &args).unwrap();
                let at = o.place(&plan).ok().unwrap();
                o.commit(&plan, &mut args, at).unwrap();
            }
            let t1 = std::time::Instant::now();
            run_ready(&e, &mut rot, &mut streak);
            o.end_scope();
            let t2 = std::time::Instant::now();
            sub += (t1 - t0).as_secs_f64();
            run += (t2 - t1).as_secs_f64();
            n += 1024;
        }
        eprintln!(
            "{pattern}: submit {:.0} ns/task, run + reclaim {:.0} ns/task",
            sub * 1e9 / n as f64,
            run * 1e9 / n as f64
        );
        o.close();
    }
}

#[test]
fn a_write_after_live_readers_depends_on_them_not_on_the_writer_they_follow() {
    let e = engine(1, 2, 64);
    let mut o = orch(&e, 64, 1 << 16);
    let t = Tensor::zeros(&[4], DType::F32).unwrap();
    let w = submit(&mut o, TaskArgs::new().output_existing(&t));
    let r = submit(&mut o, TaskArgs::new().input(&t));
    assert_eq!(o.deps_of(r), vec![w]);
    // r follows w, so w2 -> r orders w2 after w too: no edge to w.
    let w2 = submit(&mut o, TaskArgs::new().output_existing(&t));
    assert_eq!(o.deps_of(w2), vec![r]);
    // With no reader in between, a write depends on the writer before it.
    let w3 = submit(&mut o, TaskArgs::new().output_existing(&t));
    assert_eq!(o.deps_of(w3), vec![w2]);
    assert_eq!(drain(&e), vec![w, r, w2, w3]);
    o.close();
}

#[test]
fn a_diamond_task_depends_on_three_tasks_of_the_layer_before() {
    // The layers of `pto bench dag --pattern diamond`: task (l, c) reads columns c and c + 1
    // of layer l - 1's row and writes column c of its own row (rows alternate).
    const W: usize = 8;
    let e = engine(1, 2, 256);
    let mut o = orch(&e, 256, 1 << 16);
    let t = Tensor::zeros(&[2, W], DType::F32).unwrap();
    let mut ids = Vec::new();
    for j in 0..4 * W {
        let (l, c) = (j / W, j % W);
        let (src, dst) = ((l + 1) % 2, l % 2);
        let args = TaskArgs::new()
            .input(t.view(&[1, 1], &[src, c]).unwrap())
            .input(t.view(&[1, 1], &[src, (c + 1) % W]).unwrap())
            .output_existing(t.view(&[1, 1], &[dst, c]).unwrap());
        ids.push(submit(&mut o, args));
    }
    // Layer 3, column 2: reads (layer 2, columns 2 and 3); its cell was read by layer 2's
    // columns 1 and 2 since layer 1's column 2 wrote it (implied through them).
    let mut deps = o.deps_of(ids[3 * W + 2]);
    deps.sort_unstable();
    assert_eq!(deps, vec![ids[2 * W + 1], ids[2 * W + 2], ids[2 * W + 3]]);
    drain(&e);
    o.close();
}
