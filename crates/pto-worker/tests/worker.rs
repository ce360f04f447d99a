//! Worker tests. The Worker forks, and forking needs a single-threaded process, so this target
//! has `harness = false` and runs every test on the main thread (libtest-mimic, one thread).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};
use pto_comm::{BufferSpec, CommContext, SignalOp, WindowSpec};
use pto_core::{CoreKind, DType, KernelError, KernelRegistry, TaskArgs};
use pto_worker::{Worker, WorkerBuilder, WorkerError};

mod common;
use common::builder;

fn no_residue() -> Result<(), Failed> {
    let me = std::process::id();
    let left: Vec<_> = pto_shm::sweep::list()
        .into_iter()
        .filter(|s| s.name.starts_with(&format!("/pto.{me}.")))
        .collect();
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("segments left behind: {left:?}").into())
    }
}

fn chips_run_programs_and_a_sub_worker_checks_them() -> Result<(), Failed> {
    let w = builder(3).init()?;
    common::programs_a_sub_worker_and_a_group(&w).map_err(|e| e.to_string())?;
    w.close();
    no_residue()
}

fn a_failing_bootstrap_names_the_chip_and_leaves_nothing() -> Result<(), Failed> {
    let t = Instant::now();
    let r = builder(3)
        .on_bootstrap(|rank| {
            if rank == 1 {
                Err("no device here".into())
            } else {
                Ok(())
            }
        })
        .init();
    match r {
        Err(WorkerError::Boot { who, message, .. }) => {
            assert_eq!(who, "chip 1");
            assert!(message.contains("no device here"), "{message}");
        }
        other => return Err(format!("expected a bootstrap error, got {other:?}").into()),
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    no_residue()
}

fn failures_are_named_and_poison_dependents() -> Result<(), Failed> {
    let w = builder(2).init()?;
    let x = w.tensor(&[4], DType::F32)?;
    let v = w.tensor(&[1], DType::I32)?;
    let (x2, v2) = (x.clone(), v.clone());
    let err = w
        .run(move |h| {
            let t = h.submit_chip(1, "boom", TaskArgs::new().output_existing(&x2))?;
            h.submit_sub(
                "check_sum",
                TaskArgs::new()
                    .input(&x2)
                    .input(&x2)
                    .input(&x2)
                    .output_existing(&v2)
                    .after(t.task),
            )?;
            Ok(())
        })
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("chip 1") && msg.contains("chip kernel failed on purpose"),
        "{msg}"
    );
    // The report leads with chip 1's failure and keeps the host run's error (what it
    // poisoned).
    let report = err.failures().ok_or("no per-chip report")?;
    assert_eq!(report.root.who, "chip 1");
    assert_eq!(report.root.kind, pto_worker::FailKind::Task);
    assert!(
        matches!(
            &report.host,
            Some(pto_core::RunError::TaskFailed { poisoned: 1, .. })
        ),
        "{err:?}"
    );
    assert_eq!(
        v.read::<i32>()?,
        vec![0],
        "the dependent sub-worker task must not run"
    );
    // A sub-worker panic is named too, and the Worker stays usable.
    let err = w
        .run(|h| h.submit_sub("panic", TaskArgs::new()).map(|_| ()))
        .unwrap_err();
    assert!(
        err.to_string().contains("sub-worker 0") && err.to_string().contains("failed on purpose"),
        "{err}"
    );
    let unknown = w
        .run(|h| h.submit_chip(5, "add", TaskArgs::new()).map(|_| ()))
        .unwrap_err();
    assert!(
        unknown.to_string().contains("chip 5 does not exist"),
        "{unknown}"
    );
    let not_shared = pto_core::Tensor::zeros(&[4], DType::F32)?;
    let err = w
        .run(move |h| {
            h.submit_chip(0, "ring", TaskArgs::new().no_dep(&not_shared))
                .map(|_| ())
        })
        .unwrap_err();
    assert!(err.to_string().contains("not in shared memory"), "{err}");
    w.run(|_| Ok(()))?;
    drop((x, v));
    w.close();
    no_residue()
}

/// A chip killed while it runs a task, with more queued behind it: every one of them fails at
/// once, naming the chip and the signal; nothing hangs.
fn a_killed_chip_is_reported_and_the_worker_says_it_is_unusable() -> Result<(), Failed> {
    let w = builder(2).init()?;
    let pid = w.child_pid(1).unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        pto_shm::process::kill(pid);
    });
    let t = Instant::now();
    let err = w
        .run(|h| {
            for _ in 0..5 {
                h.submit_chip(1, "sleep", TaskArgs::new())?;
            }
            Ok(())
        })
        .unwrap_err();
    killer.join().unwrap();
    assert!(
        w.debug_peak_in_flight(1).unwrap() > 1,
        "no frame was queued"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(
        err.to_string().contains("chip 1")
            && err.to_string().contains("killed by signal 9 (SIGKILL)"),
        "{err}"
    );
    let again = w.run(|_| Ok(())).unwrap_err();
    assert!(matches!(again, WorkerError::Broken(_)), "{again}");
    let t = Instant::now();
    w.close();
    assert!(t.elapsed() < Duration::from_secs(5));
    no_residue()
}

/// Independent chip tasks queue on their chips (several frames in flight per chip, each chip
/// serving them in order) and every result arrives: each output is checked.
fn chip_tasks_queue_on_their_chips_and_every_result_arrives() -> Result<(), Failed> {
    let w = builder(2).init()?;
    let n = 48;
    let mut io = Vec::new();
    for i in 0..n {
        let (a, b, out) = (
            w.tensor(&[4], DType::F32)?,
            w.tensor(&[4], DType::F32)?,
            w.tensor(&[4], DType::F32)?,
        );
        a.write(&[i as f32; 4])?;
        b.write(&[1.0f32, 2.0, 3.0, 4.0])?;
        io.push((a, b, out));
    }
    let args: Vec<_> = io.clone();
    for _ in 0..3 {
        let args = args.clone();
        w.run(move |h| {
            for (i, (a, b, out)) in args.iter().enumerate() {
                h.submit_chip(
                    i % 2,
                    "add",
                    TaskArgs::new().input(a).input(b).output_existing(out),
                )?;
            }
            Ok(())
        })?;
    }
    for (i, (_, _, out)) in io.iter().enumerate() {
        let f = i as f32;
        assert_eq!(
            out.read::<f32>()?,
            vec![f + 1.0, f + 2.0, f + 3.0, f + 4.0],
            "task {i}"
        );
    }
    let peak = w.debug_peak_in_flight(0).unwrap();
    assert!(peak > 1, "chip 0 never had a frame queued (peak {peak})");
    drop((io, args));
    w.close();
    no_residue()
}

/// A chip silent past the Worker's timeout with frames queued (in its mailbox lanes and, past
/// them, on the host): it is named, stopped, and every queued task fails within about the
/// timeout (not the timeout once per queued frame).
fn a_silent_chip_with_frames_queued_is_stopped_after_one_timeout() -> Result<(), Failed> {
    let w = builder(2).timeout(Duration::from_secs(1)).init()?;
    let t = Instant::now();
    let err = w
        .run(|h| {
            // More than the chip's eight lanes: four wait on the host.
            for _ in 0..12 {
                h.submit_chip(0, "sleep", TaskArgs::new())?;
            }
            Ok(())
        })
        .unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "took {:?}",
        t.elapsed()
    );
    let report = err.failures().ok_or("no per-chip report")?;
    assert_eq!(report.root.who, "chip 0");
    assert_eq!(report.root.kind, pto_worker::FailKind::NoAnswer, "{err}");
    let again = w.run(|_| Ok(())).unwrap_err();
    assert!(matches!(again, WorkerError::Broken(_)), "{again}");
    w.close();
    no_residue()
}

fn corrupt_frames_are_errors_not_crashes() -> Result<(), Failed> {
    let w = builder(1).init()?;
    let out = w.debug_send_raw(0, b"garbage!", 8)?;
    assert_eq!(out.status, 2);
    assert!(out.message.contains("corrupt frame"), "{}", out.message);
    let out = w.debug_send_raw(0, b"", u32::MAX)?;
    assert_eq!(out.status, 2);
    assert!(out.message.contains("claims"), "{}", out.message);
    // The chip still serves real frames.
    let a = w.tensor(&[2], DType::F32)?;
    let a2 = a.clone();
    w.run(move |h| {
        h.submit_chip(
            0,
            "add",
            TaskArgs::new().input(&a2).input(&a2).output_existing(&a2),
        )
        .map(|_| ())
    })
    .map_err(|e| format!("{e}"))
    .err()
    .map_or(Ok::<(), Failed>(()), |e| {
        // `add` reads and writes the same tensor: refused as overlapping arguments.
        assert!(e.contains("overlap"), "{e}");
        Ok(())
    })?;
    drop(a);
    w.close();
    no_residue()
}

fn init_refuses_a_threaded_process() -> Result<(), Failed> {
    // The thread lives until init has answered, however long that takes.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let _ = rx.recv();
    });
    let r = builder(1).init();
    drop(tx);
    t.join().unwrap();
    match r {
        Err(WorkerError::NotSingleThreaded { threads }) if threads >= 2 => Ok(()),
        other => Err(format!("expected NotSingleThreaded, got {other:?}").into()),
    }
}

/// A program that joined its threads may build a Worker right away: a thread just joined is
/// still counted for a moment, which must not make init refuse the process (seen as a rare
/// "this process has 2" when a Worker came right after a run of ranks on threads).
fn a_thread_joined_just_before_init_is_not_counted() -> Result<(), Failed> {
    for i in 0..40 {
        std::thread::spawn(|| std::hint::black_box(1 + 1))
            .join()
            .unwrap();
        let w = Worker::builder()
            .chips(1)
            .cores(1, 1)
            .no_comm()
            .timeout(Duration::from_secs(20))
            .program("none", KernelRegistry::new(), |_, _| Ok(()))
            .init()
            .map_err(|e| format!("round {i}: {e}"))?;
        w.close();
    }
    Ok(())
}

fn a_worker_can_have_workers_as_children() -> Result<(), Failed> {
    // The top Worker has no chips of its own to speak of, and one child Worker with 2 chips.
    let top = Worker::builder()
        .chips(1)
        .cores(1, 1)
        .no_comm()
        .timeout(Duration::from_secs(20))
        .child_worker(|| builder(2))
        .worker_fn("add_on_inner_chips", |inner, call| {
            // t0 = a, t1 = b, t2 = out (each [2, n]): inner chip c adds row c.
            let (a, b, out) = (&call.tensors[0].0, &call.tensors[1].0, &call.tensors[2].0);
            let rows: Vec<_> = (0..2)
                .map(|c| {
                    let n = a.shape()[1];
                    let v = |t: &pto_core::Tensor| {
                        t.view(&[1, n], &[c, 0]).and_then(|r| r.reshape(&[n]))
                    };
                    Ok::<_, String>((
                        v(a).map_err(|e| e.to_string())?,
                        v(b).map_err(|e| e.to_string())?,
                        v(out).map_err(|e| e.to_string())?,
                    ))
                })
                .collect::<Result<_, _>>()?;
            inner
                .run(move |h| {
                    for (c, (a, b, o)) in rows.iter().enumerate() {
                        h.submit_chip(
                            c,
                            "add",
                            TaskArgs::new().input(a).input(b).output_existing(o),
                        )?;
                    }
                    Ok(())
                })
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .init()?;
    let n = 5;
    let a = top.tensor(&[2, n], DType::F32)?;
    let b = top.tensor(&[2, n], DType::F32)?;
    let out = top.tensor(&[2, n], DType::F32)?;
    a.write(&(0..2 * n).map(|i| i as f32).collect::<Vec<_>>())?;
    b.write(&vec![10.0f32; 2 * n])?;
    let (a2, b2, o2) = (a.clone(), b.clone(), out.clone());
    top.run(move |h| {
        h.submit_worker(
            0,
            "add_on_inner_chips",
            TaskArgs::new().input(&a2).input(&b2).output_existing(&o2),
        )
        .map(|_| ())
    })?;
    assert_eq!(
        out.read::<f32>()?,
        (0..2 * n).map(|i| i as f32 + 10.0).collect::<Vec<_>>()
    );
    let err = top
        .run(|h| {
            h.submit_worker(3, "add_on_inner_chips", TaskArgs::new())
                .map(|_| ())
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("child worker 3 does not exist"),
        "{err}"
    );
    drop((a, b, out));
    top.close();
    no_residue()
}

fn host_staging_loads_and_stores_window_buffers() -> Result<(), Failed> {
    let host: Vec<_> = (0..2)
        .map(|c| {
            let t = pto_worker::shared_tensor(&[16], DType::U32).unwrap();
            t.write(&(0..16).map(|i| c * 100 + i).collect::<Vec<u32>>())
                .unwrap();
            t
        })
        .collect();
    let w = builder(2).stage("signal", &host).init()?;
    for _ in 0..2 {
        w.run(|h| {
            for c in 0..2 {
                h.submit_chip(c, "bump_staged", TaskArgs::new())?;
            }
            Ok(())
        })?;
    }
    for (c, t) in host.iter().enumerate() {
        let want: Vec<u32> = (0..16).map(|i| c as u32 * 100 + i + 2).collect();
        assert_eq!(t.read::<u32>()?, want, "chip {c}");
    }
    w.close();
    // Wrong sizes are refused before anything forks.
    let small = pto_worker::shared_tensor(&[4], DType::U32)?;
    let r = builder(1).stage("signal", &[small]).init();
    assert!(
        matches!(&r, Err(WorkerError::Args(m)) if m.contains("64 bytes")),
        "{r:?}"
    );
    // Shapes no tensor can have are refused before a segment is made (or a size overflows).
    for (shape, want) in [
        (&[usize::MAX, 2][..], "dimension 0's size"),
        (&[1, 1 << 33][..], "dimension 1's size"),
        (&[][..], "1 to 5 dimensions"),
    ] {
        let r = pto_worker::shared_tensor(shape, DType::U32);
        assert!(
            matches!(&r, Err(WorkerError::Args(m)) if m.contains(want)),
            "{shape:?}: {r:?}"
        );
    }
    drop(host);
    no_residue()
}

/// Rank 0 puts into rank 1's `data` (and notifies its `flag` when `ordered`); rank 1 reads its
/// `data` (after waiting on its `flag` when `ordered`).
fn exchange(ctx: &pto_core::KernelCtx<'_>, ordered: bool) -> Result<(), KernelError> {
    let e = |e: pto_comm::CommError| KernelError::msg(e.to_string());
    let c = ctx
        .ext::<CommContext>()
        .ok_or_else(|| KernelError::msg("no comm"))?;
    let w = c.window(0).map_err(e)?;
    let (data, flag) = (
        w.buffer("data").map_err(e)?.offset,
        w.buffer("flag").map_err(e)?.offset,
    );
    if w.rank() == 0 {
        w.put_slice(1, data, &[1.0f32; 4]).map_err(e)?;
        if ordered {
            w.notify(1, flag, 1, SignalOp::Add).map_err(e)?;
        }
    } else if w.rank() == 1 {
        if ordered {
            w.wait_until(flag, 1).map_err(e)?;
        }
        w.get_vec::<f32>(1, data, 4).map_err(e)?;
    }
    Ok(())
}

fn checked_builder(check: bool) -> WorkerBuilder {
    let mut k = KernelRegistry::new();
    k.register("racy", CoreKind::Aiv, |ctx| exchange(ctx, false))
        .unwrap();
    k.register("ordered", CoreKind::Aiv, |ctx| exchange(ctx, true))
        .unwrap();
    let mut b = Worker::builder()
        .chips(2)
        .cores(1, 1)
        .check(check)
        .timeout(Duration::from_secs(20))
        .window(WindowSpec::for_buffers(vec![
            BufferSpec::new("data", DType::F32, 4),
            BufferSpec::new("flag", DType::U32, 1),
        ]));
    for p in ["racy", "ordered"] {
        b = b.program(p, k.clone(), move |o, _| {
            o.submit(p, TaskArgs::new()).map(|_| ())
        });
    }
    b
}

fn check_true_reports_the_race_between_chips_and_none_in_the_ordered_twin() -> Result<(), Failed> {
    for (program, races) in [("racy", 1), ("ordered", 0)] {
        let w = checked_builder(true).init()?;
        w.run(|h| {
            for c in 0..2 {
                h.submit_chip(c, program, TaskArgs::new())?;
            }
            Ok(())
        })?;
        let r = w.check_report().ok_or("no check report with check(true)")?;
        assert_eq!(r.races.len(), races, "{program}: {:?}", r.races);
        assert!(r.accesses >= 2, "{program}: {} accesses", r.accesses);
        if races == 1 {
            let text = r.races[0].to_string();
            assert!(
                text.contains("rank 0 writes `data[0..16)` of rank 1 (put in task")
                    && text.contains("rank 1 reads `data[0..16)` (get in task")
                    && text.contains("`racy`"),
                "{text}"
            );
        }
        w.close();
    }
    // Off by default: no report.
    let w = checked_builder(false).init()?;
    assert!(w.check_report().is_none());
    w.close();
    no_residue()
}

/// Run as a child process: makes a Worker, prints its children's pids, and waits to be killed.
/// Whether `pid` still runs. A child that died stays a zombie until its new parent (init, or a
/// subreaper) reaps it, which a busy machine's init may take seconds to do: it has ended.
fn alive(pid: u32) -> bool {
    pto_shm::process::state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X' | 'x'))
}

fn parent_role() {
    let w = builder(2).init().unwrap();
    let pids: Vec<String> = (0..3)
        .map(|i| w.child_pid(i).unwrap().to_string())
        .collect();
    println!("PIDS {}", pids.join(" "));
    std::thread::sleep(Duration::from_secs(60));
}

fn children_die_with_their_parent() -> Result<(), Failed> {
    let exe = std::env::current_exe()?;
    let mut parent = std::process::Command::new(exe)
        .env("PTO_WORKER_TEST_ROLE", "parent")
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut out = String::new();
    {
        use std::io::BufRead;
        let stdout = parent.stdout.take().unwrap();
        let mut r = std::io::BufReader::new(stdout);
        r.read_line(&mut out)?;
    }
    let pids: Vec<u32> = out
        .trim()
        .strip_prefix("PIDS ")
        .ok_or("the parent printed no pids")?
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    parent.kill()?;
    parent.wait()?;
    let t = Instant::now();
    while pids.iter().any(|&p| alive(p)) && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    if !left.is_empty() {
        return Err(format!("children still alive 2 s after the parent died: {left:?}").into());
    }
    // The dead parent's segments are stale now: sweep them as `pto clean` would.
    let _ = pto_shm::sweep::sweep_stale();
    Ok(())
}

fn a_chip_that_dies_between_runs_is_noticed_by_the_watcher() -> Result<(), Failed> {
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let w = builder(2)
        .on_child_exit(move |f| {
            s2.lock()
                .push((f.who.clone(), f.kind.clone(), Instant::now()))
        })
        .init()?;
    let pid = w.child_pid(1).ok_or("no chip 1")?;
    let killed = Instant::now();
    pto_shm::process::kill(pid);
    // Nobody asks chip 1 anything: the watcher alone notices, within a fraction of a second.
    while seen.lock().is_empty() && killed.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = seen.lock().clone();
    let (who, kind, at) = got.first().ok_or("the hook was not called within 2 s")?;
    assert_eq!(who, "chip 1");
    assert_eq!(
        *kind,
        pto_worker::FailKind::Died(pto_worker::ChildExit::Signal(9))
    );
    assert!(at.duration_since(killed) < Duration::from_millis(500));
    let err = w.check().unwrap_err();
    assert!(
        err.to_string().contains("chip 1") && err.to_string().contains("SIGKILL"),
        "{err}"
    );
    let t = Instant::now();
    let again = w.run(|_| Ok(())).unwrap_err();
    assert!(matches!(again, WorkerError::Broken(_)), "{again}");
    assert!(t.elapsed() < Duration::from_millis(100));
    w.close();
    no_residue()
}

fn sigterm_to_a_worker_process_ends_its_children_and_removes_its_segments() -> Result<(), Failed> {
    let exe = std::env::current_exe()?;
    let mut parent = std::process::Command::new(exe)
        .env("PTO_WORKER_TEST_ROLE", "parent")
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut out = String::new();
    {
        use std::io::BufRead;
        let stdout = parent.stdout.take().unwrap();
        let mut r = std::io::BufReader::new(stdout);
        r.read_line(&mut out)?;
    }
    let mut pids: Vec<u32> = out
        .trim()
        .strip_prefix("PIDS ")
        .ok_or("the parent printed no pids")?
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    let t = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(parent.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )?;
    let status = loop {
        if let Some(st) = parent.try_wait()? {
            break st;
        }
        if t.elapsed() > Duration::from_secs(5) {
            parent.kill()?;
            return Err("the Worker process did not end within 5 s of SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    // Within the 2 s promised for the whole exit.
    while pids.iter().any(|&p| alive(p)) && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "children still alive: {left:?}");
    pids.push(parent.id());
    let segs: Vec<String> = std::fs::read_dir("/dev/shm")?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("pto.{p}."))))
        .collect();
    assert!(segs.is_empty(), "segments left: {segs:?}");
    Ok(())
}

fn main() {
    if std::env::var("PTO_WORKER_TEST_ROLE").as_deref() == Ok("parent") {
        parent_role();
        return;
    }
    let mut args = Arguments::from_args();
    // Forking needs a single-threaded process: run every test on the main thread.
    args.test_threads = Some(1);
    let tests = vec![
        Trial::test(
            "chips_run_programs_and_a_sub_worker_checks_them",
            chips_run_programs_and_a_sub_worker_checks_them,
        ),
        Trial::test(
            "a_failing_bootstrap_names_the_chip_and_leaves_nothing",
            a_failing_bootstrap_names_the_chip_and_leaves_nothing,
        ),
        Trial::test(
            "failures_are_named_and_poison_dependents",
            failures_are_named_and_poison_dependents,
        ),
        Trial::test(
            "a_killed_chip_is_reported_and_the_worker_says_it_is_unusable",
            a_killed_chip_is_reported_and_the_worker_says_it_is_unusable,
        ),
        Trial::test(
            "chip_tasks_queue_on_their_chips_and_every_result_arrives",
            chip_tasks_queue_on_their_chips_and_every_result_arrives,
        ),
        Trial::test(
            "a_silent_chip_with_frames_queued_is_stopped_after_one_timeout",
            a_silent_chip_with_frames_queued_is_stopped_after_one_timeout,
        ),
        Trial::test(
            "corrupt_frames_are_errors_not_crashes",
            corrupt_frames_are_errors_not_crashes,
        ),
        Trial::test(
            "init_refuses_a_threaded_process",
            init_refuses_a_threaded_process,
        ),
        Trial::test(
            "a_thread_joined_just_before_init_is_not_counted",
            a_thread_joined_just_before_init_is_not_counted,
        ),
        Trial::test(
            "children_die_with_their_parent",
            children_die_with_their_parent,
        ),
        Trial::test(
            "a_worker_can_have_workers_as_children",
            a_worker_can_have_workers_as_children,
        ),
        Trial::test(
            "check_true_reports_the_race_between_chips_and_none_in_the_ordered_twin",
            check_true_reports_the_race_between_chips_and_none_in_the_ordered_twin,
        ),
        Trial::test(
            "host_staging_loads_and_stores_window_buffers",
            host_staging_loads_and_stores_window_buffers,
        ),
        Trial::test(
            "a_chip_that_dies_between_runs_is_noticed_by_the_watcher",
            a_chip_that_dies_between_runs_is_noticed_by_the_watcher,
        ),
        Trial::test(
            "sigterm_to_a_worker_process_ends_its_children_and_removes_its_segments",
            sigterm_to_a_worker_process_ends_its_children_and_removes_its_segments,
        ),
    ];
    libtest_mimic::run(&args, tests).exit();
}
