//! The `pto` command under bad input and faults, the way users meet them: every bad argument
//! and `PTO_*` value is a usage error (exit 2) that names it; `--json` prints one object whatever
//! happens; a stopped or killed chip is named as the root cause (exit 3) in time; SIGINT,
//! SIGTERM and SIGHUP end every child and remove every segment (exit 130/143/129); a chip that
//! dies while the host prepares inputs ends the run at once; a FIFO named like a segment is
//! skipped; what a SIGKILLed run left is removed by its janitor, or swept by the next run; no argument vector panics.
//!
//! Tests that put files in /dev/shm run in a private /dev/shm (a tmpfs in a private mount
//! namespace) when the test runs as root, so they cannot disturb other runs.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;

mod common;
use serde_json::Value;

const PTO: &str = env!("CARGO_BIN_EXE_pto");

struct Out {
    code: Option<i32>,
    out: String,
    err: String,
    took: Duration,
}

/// Runs a command to its end (killed after 60 s: a hang is a failure, not a stuck test).
fn finish(mut child: Child, started: Instant) -> Out {
    let (mut o, mut e) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = o.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = e.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("pto hung for 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    Out {
        code: status.code(),
        out: to.join().unwrap(),
        err: te.join().unwrap(),
        took,
    }
}

fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut c = Command::new(PTO);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn pto(args: &[&str], env: &[(&str, &str)]) -> Out {
    let t = Instant::now();
    finish(spawn(args, env), t)
}

fn json(o: &Out) -> Value {
    let lines: Vec<&str> = o.out.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one JSON object expected:\n{}\n{}",
        o.out,
        o.err
    );
    serde_json::from_str(lines[0]).unwrap()
}

/// The chip processes of `pid` (its children but its segments' janitor).
fn children_of(pid: u32) -> Vec<u32> {
    common::children_of(pid)
        .into_iter()
        .filter(|&p| !common::cmdline(p).iter().any(|a| a == "pto-janitor"))
        .collect()
}

use common::alive;

/// Waits until none of `pids` runs, at most `limit`; true when they all ended.
fn all_end_within(pids: &[u32], limit: Duration) -> bool {
    let t = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn segments_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("pto.{p}."))))
        .collect()
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
        .unwrap();
}

/// `pto run allreduce_distributed --ranks 3 --size SIZE` plus `extra`, once its 3 chips are
/// up: the child, when it started, its pid and its chips' pids.
fn allreduce_run(size: &str, extra: &[&str]) -> (Child, Instant, u32, Vec<u32>) {
    let t = Instant::now();
    let mut args = vec![
        "run",
        "allreduce_distributed",
        "--ranks",
        "3",
        "--size",
        size,
    ];
    args.extend_from_slice(extra);
    let child = spawn(&args, &[]);
    let parent = child.id();
    let kids = wait_children(parent, 3);
    (child, t, parent, kids)
}

/// Waits until `pid` has `n` children (a Worker forked its chips), at most 10 s; fails at once
/// if `pid` ended first (it refused the run: see its output).
fn wait_children(pid: u32, n: usize) -> Vec<u32> {
    let t = Instant::now();
    loop {
        let c = children_of(pid);
        if c.len() >= n {
            return c;
        }
        assert!(alive(pid), "{pid} ended before it had {n} children");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no {n} children of {pid}: {c:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn bad_arguments_and_variables_are_usage_errors_that_name_them() {
    // (arguments, environment, what the message must name)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        (&["run", "allgather", "--ranks", "0"], &[], "--ranks"),
        (&["run", "allgather", "--ranks", "100000"], &[], "--ranks"),
        (&["run", "allgather", "--ranks", "-3"], &[], "-3"),
        (&["run", "allgather", "--size", "0"], &[], "--size"),
        (
            &["run", "allgather", "--size", "99999999999999999999999"],
            &[],
            "--size",
        ),
        (
            &["run", "allgather", "--size", "1000000000000"],
            &[],
            "--size",
        ),
        (&["run", "ffn_tp_parallel", "--aic", "0"], &[], "AIC"),
        (
            &["run", "allgather", "--aic", "0", "--aiv", "0"],
            &[],
            "AIV",
        ),
        (&["run", "allgather", "--aiv", "5000"], &[], "--aiv"),
        (
            &["run", "allgather", "--backend", "pigeon"],
            &[],
            "--backend",
        ),
        (&["run", "no_such_example"], &[], "no example named"),
        (
            &["run", "allgather"],
            &[("PTO_WAIT_TIMEOUT_MS", "abc")],
            "PTO_WAIT_TIMEOUT_MS",
        ),
        (
            &["run", "allgather"],
            &[("PTO_WAIT_TIMEOUT_MS", "0")],
            "PTO_WAIT_TIMEOUT_MS",
        ),
        (
            &["run", "allgather"],
            &[("PTO_SPIN_US", "99999999999")],
            "PTO_SPIN_US",
        ),
        (
            &["run", "allgather"],
            &[("PTO_THREADS", "-1")],
            "PTO_THREADS",
        ),
        (
            &["run", "allgather"],
            &[("PTO_RING_HEAP_BYTES", "12")],
            "PTO_RING_HEAP_BYTES",
        ),
        (
            &["run", "allgather"],
            &[("PTO_MPI_WINDOWS", "fast")],
            "PTO_MPI_WINDOWS",
        ),
        (&["run", "allgather"], &[("PTO_LOG", "pto=loud")], "PTO_LOG"),
        (
            &["list"],
            &[("PTO_LOG", "garbage[[["), ("RUST_LOG", "")],
            "PTO_LOG",
        ),
        (&["bench", "plugin"], &[], "--plugin"),
        (&["bench", "dag", "--reps", "0"], &[], "--reps"),
        (&["bench", "dag", "--tasks", "0"], &[], "--tasks"),
        // A missing anchor is refused before the benchmark runs.
        (
            &["bench", "dag", "--omp-anchor", "/nonexistent/omp_deps"],
            &[],
            "/nonexistent/omp_deps",
        ),
        (
            &["env"],
            &[("PTO_STALL_TIMEOUT_MS", "soon")],
            "PTO_STALL_TIMEOUT_MS",
        ),
        (&["frobnicate"], &[], "frobnicate"),
    ];
    for (args, env, names) in cases {
        let o = pto(args, env);
        assert_eq!(o.code, Some(2), "{args:?} {env:?}: {}\n{}", o.out, o.err);
        assert!(
            o.err.contains(names),
            "{args:?} {env:?} does not name {names}: {}",
            o.err
        );
        assert!(!o.err.contains("panicked"), "{}", o.err);
    }
    // With --json, one object on stdout whatever the error.
    for (args, env) in [
        (vec!["run", "allgather", "--ranks", "0", "--json"], vec![]),
        (
            vec!["run", "allgather", "--json"],
            vec![("PTO_SPIN_US", "x")],
        ),
        (vec!["run", "nope", "--json"], vec![]),
        (
            vec!["run", "allgather", "--size", "1000000000000", "--json"],
            vec![],
        ),
        // Refused before the command starts: the logging filter, a global flag first, --json
        // before the example, an output file whose folder does not exist.
        (
            vec!["run", "allgather", "--json"],
            vec![("PTO_LOG", "pto=loud")],
        ),
        (
            vec!["-v", "run", "allgather", "--ranks", "0", "--json"],
            vec![],
        ),
        (vec!["run", "--json", "allgather", "--ranks", "0"], vec![]),
        (
            vec![
                "run",
                "allgather",
                "--trace",
                "/nonexistent/t.json",
                "--json",
            ],
            vec![],
        ),
        (vec!["check", "allgather", "--ranks", "0", "--json"], vec![]),
    ] {
        let o = pto(&args, &env);
        assert_eq!(o.code, Some(2), "{args:?}");
        let v = json(&o);
        assert_eq!(v["passed"], false);
        assert_eq!(v["exit_code"], 2);
        assert_eq!(v["error"]["kind"], "usage");
        assert!(v["error"]["message"].as_str().unwrap().len() > 10, "{v}");
        if args.contains(&"allgather") {
            assert_eq!(v["example"], "allgather", "{v}");
        }
        for key in ["ranks", "backend", "wall_ms", "tasks"] {
            assert!(v.get(key).is_some(), "{args:?}: no {key} in {v}");
        }
        for key in ["root_cause", "ranks"] {
            assert!(
                v["error"].get(key).is_some(),
                "{args:?}: no error.{key} in {v}"
            );
        }
    }
}

/// Children of `pid` as soon as there are `n` (polled every 50 µs), or `None` when `pid` is
/// gone first (it finished before they could be seen).
fn catch_children(pid: u32, n: usize) -> Option<Vec<u32>> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        let c = children_of(pid);
        if c.len() >= n {
            return Some(c);
        }
        if !alive(pid) {
            return None;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    None
}

#[test]
fn a_stopped_chip_is_the_root_cause_within_the_deadline() {
    // Freeze pto as soon as its chips exist, stop chip 1, then let pto go on: from then on it
    // needs chip 1 (in bring-up or in its one short task). A run fast enough to finish before
    // it could be frozen does not count: try again.
    for _attempt in 0..30 {
        let t = Instant::now();
        let child = spawn(
            &[
                "run",
                "allreduce_distributed",
                "--ranks",
                "3",
                "--size",
                "200000",
                "--json",
            ],
            &[("PTO_WAIT_TIMEOUT_MS", "1500")],
        );
        let parent = child.id();
        let Some(kids) = catch_children(parent, 3) else {
            let _ = finish(child, t);
            continue;
        };
        signal(parent, rustix::process::Signal::STOP);
        if children_of(parent).len() < 3 {
            // Too late: the run was over.
            signal(parent, rustix::process::Signal::CONT);
            let _ = finish(child, t);
            continue;
        }
        signal(kids[1], rustix::process::Signal::STOP);
        std::thread::sleep(Duration::from_millis(20));
        signal(parent, rustix::process::Signal::CONT);
        let resumed = Instant::now();
        let o = finish(child, t);
        let took = resumed.elapsed();
        if o.code == Some(0) {
            // Chip 1 had already done its part when it stopped.
            continue;
        }
        assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
        // Reported within the wait deadline plus a second.
        assert!(took < Duration::from_millis(2500), "took {took:?}");
        let v = json(&o);
        let root = &v["error"]["root_cause"];
        assert_eq!(root["pid"], kids[1], "{v}");
        assert_eq!(root["state"], "stopped", "{v}");
        assert_eq!(v["error"]["kind"], "runtime");
        assert!(!v["error"]["ranks"].as_array().unwrap().is_empty(), "{v}");
        assert!(
            all_end_within(&kids[1..2], Duration::from_secs(2)),
            "the stopped chip was left behind"
        );
        assert!(segments_of(&[&[parent], kids.as_slice()].concat()).is_empty());
        return;
    }
    panic!("could not stop a chip before the run ended in 30 attempts");
}

#[test]
fn a_killed_chip_is_named_with_its_signal() {
    let (child, t, parent, kids) = allreduce_run("4000000", &[]);
    std::thread::sleep(Duration::from_millis(150));
    signal(kids[2], rustix::process::Signal::KILL);
    let o = finish(child, t);
    assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
    assert!(
        o.out.contains(&format!(
            "root cause: chip 2 (pid {}) was killed by signal 9 (SIGKILL)",
            kids[2]
        )),
        "{}",
        o.out
    );
    assert!(o.took < Duration::from_secs(10));
    assert!(all_end_within(&kids, Duration::from_secs(2)), "chips left");
    assert!(segments_of(&[&[parent], kids.as_slice()].concat()).is_empty());
}

#[test]
fn a_chip_that_dies_while_inputs_are_prepared_ends_the_run_at_once() {
    // A large size: the host spends a second or more writing inputs after the chips are up
    // (10 000 000 elements need about 1.8 GiB, which a small machine's /dev/shm holds).
    let t = Instant::now();
    let child = spawn(
        &[
            "run",
            "allreduce_distributed",
            "--ranks",
            "2",
            "--size",
            "10000000",
            "--json",
        ],
        &[],
    );
    let parent = child.id();
    let kids = wait_children(parent, 2);
    std::thread::sleep(Duration::from_millis(30));
    let killed = Instant::now();
    signal(kids[0], rustix::process::Signal::KILL);
    let o = finish(child, t);
    assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "took {:?}",
        killed.elapsed()
    );
    let v = json(&o);
    assert_eq!(v["error"]["root_cause"]["pid"], kids[0], "{v}");
    assert_eq!(v["error"]["root_cause"]["exit"]["signal"], 9, "{v}");
    assert!(all_end_within(&kids, Duration::from_secs(2)), "chips left");
    assert!(segments_of(&[&[parent], kids.as_slice()].concat()).is_empty());
}

#[test]
fn signals_end_every_child_remove_every_segment_and_exit_128_plus_the_signal() {
    for (sig, code) in [
        (rustix::process::Signal::INT, 130),
        (rustix::process::Signal::TERM, 143),
        (rustix::process::Signal::HUP, 129),
    ] {
        let (child, t, parent, kids) = allreduce_run("8000000", &["--json"]);
        std::thread::sleep(Duration::from_millis(100));
        let sent = Instant::now();
        signal(parent, sig);
        let o = finish(child, t);
        assert_eq!(o.code, Some(code), "{sig:?}: {}\n{}", o.out, o.err);
        // `--json` prints its one object even so.
        let v = json(&o);
        assert_eq!(v["exit_code"], code, "{sig:?}: {v}");
        assert_eq!(v["error"]["kind"], "signal", "{sig:?}: {v}");
        assert!(
            sent.elapsed() < Duration::from_secs(2),
            "{sig:?} took {:?}",
            sent.elapsed()
        );
        // Every child is gone within 2 s of the signal.
        assert!(
            all_end_within(&kids, Duration::from_secs(2).saturating_sub(sent.elapsed())),
            "{sig:?}: children left"
        );
        let left = segments_of(&[&[parent], kids.as_slice()].concat());
        assert!(left.is_empty(), "{sig:?}: segments left: {left:?}");
    }
}

#[test]
fn a_sigkilled_run_leaves_no_segment() {
    // Nothing runs in a process killed with SIGKILL: its janitor removes its segments once it
    // and its children have ended, without waiting for the next run.
    let (child, t, parent, kids) = allreduce_run("8000000", &[]);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !segments_of(&[parent]).is_empty(),
        "the run made no segment to leave"
    );
    let sent = Instant::now();
    signal(parent, rustix::process::Signal::KILL);
    let o = finish(child, t);
    assert_eq!(o.code, None, "{}\n{}", o.out, o.err);
    let everyone = [&[parent], kids.as_slice()].concat();
    while !segments_of(&everyone).is_empty() && sent.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let left = segments_of(&everyone);
    assert!(left.is_empty(), "segments left 5 s after SIGKILL: {left:?}");
    // The chips die with their parent (the janitor's cleanup can come while a chip is still
    // between closing its files and becoming a zombie, so they are waited for).
    assert!(
        all_end_within(&kids, Duration::from_secs(5)),
        "chips outlived a SIGKILLed pto: {kids:?}"
    );
}

/// `pto ARGS` in a private /dev/shm of `size` bytes (`64k`, `1m`), printing `left: N` (the
/// segments left behind) after it; `None` (said on stderr) where no private /dev/shm can be made.
fn in_small_shm(size: &str, args: &str) -> Option<common::ShOut> {
    let o = common::in_private_shm(&format!(
        "mount -o remount,size={size} /dev/shm && \"$PTO\" {args}; rc=$?; echo left: $(ls /dev/shm | wc -l); exit $rc"
    ));
    if o.err.contains("no private mount namespace") {
        eprintln!("SKIPPED: no private /dev/shm here");
        return None;
    }
    Some(o)
}

#[test]
fn no_space_in_dev_shm_is_an_environment_error_that_leaves_nothing() {
    // A private /dev/shm of 64 KiB: the first mailbox segment does not fit.
    let Some(o) = in_small_shm("64k", "run allreduce_distributed --ranks 2 --json") else {
        return;
    };
    assert_eq!(o.code, Some(4), "{}\n{}", o.out, o.err);
    assert!(o.err.contains("no space in /dev/shm"), "{}", o.err);
    let v: Value = serde_json::from_str(o.out.lines().next().unwrap_or("")).unwrap_or(Value::Null);
    assert_eq!(v["error"]["kind"], "environment", "{}", o.out);
    assert!(o.out.contains("left: 0"), "segments left: {}", o.out);
}

#[test]
fn no_space_for_a_mailbox_lane_fails_the_chip_task_cleanly() {
    // A private /dev/shm of 1 MiB: the Worker starts (each mailbox slot's first page is
    // reserved at init), but a lane's frame and result pages (324 KiB) are reserved before its
    // first frame, and they do not all fit: the chip task fails naming its chip and the cause,
    // never a SIGBUS, and nothing is left behind.
    let Some(o) = in_small_shm("1m", "run multi_chip_dispatch --ranks 4") else {
        return;
    };
    assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
    assert!(o.err.contains("no space in /dev/shm"), "{}", o.err);
    assert!(
        o.err.contains("kernel \"chip\"") || o.err.contains("kernel \"sub\""),
        "{}",
        o.err
    );
    assert!(o.out.contains("left: 0"), "segments left: {}", o.out);
}

#[test]
fn a_fifo_named_like_a_segment_hangs_nothing() {
    let name = format!("pto.{}.00000000feedf00d.fifo", std::process::id());
    let o = common::in_private_shm(&format!(
        "mkfifo /dev/shm/{name} && \"$PTO\" clean && \"$PTO\" run allreduce_distributed --ranks 2; rc=$?; rm -f /dev/shm/{name}; exit $rc"
    ));
    assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
    assert!(
        o.err.contains("not a regular file"),
        "no warning: {}",
        o.err
    );
    assert!(o.out.contains("PASSED"), "{}", o.out);
    assert!(o.took < Duration::from_secs(20));
}

#[test]
fn the_next_run_sweeps_what_a_killed_run_left() {
    // A run killed with SIGKILL can clean nothing; its segments name a dead creator.
    let mut dead = Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    let name = format!("pto.{pid}.00000000deadbeef.world");
    let o = common::in_private_shm(&format!(
        "head -c 4096 /dev/zero > /dev/shm/{name} && \"$PTO\" run allreduce_distributed --ranks 2 && test ! -e /dev/shm/{name}"
    ));
    assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
}

#[test]
fn clean_run_by_another_user_goes_on_past_what_it_may_not_remove() {
    if !rustix::process::getuid().is_root()
        || Command::new("setpriv").arg("--help").output().is_err()
    {
        eprintln!("SKIPPED: needs root and setpriv to act as another user");
        return;
    }
    let mut dead = Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    let (a, b) = (
        format!("pto.{pid}.00000000000000a1.x"),
        format!("pto.{pid}.00000000000000b2.x"),
    );
    // Root's stale segments in a sticky /dev/shm: another user may list them, not remove them.
    let o = common::in_private_shm(&format!(
        "chmod 1777 /dev/shm && : > /dev/shm/{a} && : > /dev/shm/{b} && chmod 600 /dev/shm/{a} /dev/shm/{b} && \
         setpriv --reuid=65534 --regid=65534 --clear-groups \"$PTO\" clean; rc=$?; ls /dev/shm; exit $rc"
    ));
    assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
    assert!(
        o.err.contains(&a) && o.err.contains(&b),
        "both named: {}",
        o.err
    );
    assert!(o.out.contains("2 could not be removed"), "{}", o.out);
}

#[test]
fn under_an_mpi_launcher_without_backend_mpi_it_says_so() {
    let o = pto(
        &["run", "ffn_tp_parallel", "--ranks", "2"],
        &[("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "0")],
    );
    assert_eq!(o.code, Some(2), "{}", o.err);
    assert!(o.err.contains("--backend mpi"), "{}", o.err);
}

#[test]
fn a_bring_up_past_its_deadline_says_so_and_what_to_raise() {
    // 128 chip processes cannot come up within a millisecond.
    let o = pto(
        &["run", "allreduce_distributed", "--ranks", "128", "--json"],
        &[("PTO_WAIT_TIMEOUT_MS", "1")],
    );
    assert_eq!(o.code, Some(3), "{}", o.err);
    assert!(o.err.contains("raise PTO_WAIT_TIMEOUT_MS"), "{}", o.err);
    assert!(o.err.lines().count() <= 2, "a short report: {}", o.err);
    let v = json(&o);
    assert_eq!(v["error"]["kind"], "runtime", "{v}");
    assert!(v["error"]["root_cause"].is_object(), "{v}");
}

#[test]
fn logging_is_quiet_by_default_and_follows_pto_log_and_v() {
    let quiet = pto(&["run", "allreduce_distributed", "--ranks", "2"], &[]);
    assert_eq!(quiet.code, Some(0));
    assert!(quiet.err.is_empty(), "{}", quiet.err);
    let debug = pto(
        &["run", "allreduce_distributed", "--ranks", "2"],
        &[("PTO_LOG", "debug")],
    );
    assert!(debug.err.contains("segment created"), "{}", debug.err);
    assert!(debug.err.contains("child forked"), "{}", debug.err);
    let v = pto(
        &["-vv", "run", "allreduce_distributed", "--ranks", "2"],
        &[],
    );
    assert!(v.err.contains("segment unlinked"), "{}", v.err);
    let q = pto(
        &["-q", "run", "allreduce_distributed", "--ranks", "2"],
        &[("PTO_LOG", "debug")],
    );
    assert_eq!(q.code, Some(0));
    assert!(q.err.is_empty(), "-q wins over PTO_LOG: {}", q.err);
    let rust_log = pto(
        &["run", "allreduce_distributed", "--ranks", "2"],
        &[("RUST_LOG", "pto_worker=debug")],
    );
    assert!(
        rust_log.err.contains("child forked") && !rust_log.err.contains("segment created"),
        "{}",
        rust_log.err
    );
}

fn arb_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "run",
            "check",
            "bench",
            "list",
            "env",
            "clean",
            "include-dir",
            "dag",
            "comm",
            "worker",
            "allreduce",
            "broadcast",
            "scale",
            "-b",
            "-e",
            "1G",
            "4K",
            "--iters",
            "--algorithm",
            "tree",
            "--schedules",
            "--seed",
            "--plugin",
            "--dag",
            "--max-ranks",
            "allgather",
            "ffn_tp_parallel",
            "vector_pipeline",
            "--ranks",
            "--size",
            "--aic",
            "--aiv",
            "--backend",
            "--json",
            "--trace",
            "--reps",
            "--tasks",
            "--threads",
            "--dry-run",
            "-v",
            "-q",
            "--help",
            "shm",
            "local",
            "mpi",
            "0",
            "1",
            "-1",
            "3",
            "18446744073709551616",
            "99999999999",
            "",
            "--",
            "=",
            "--ranks=0",
            "\u{1F600}",
            "/dev/null",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// No argument vector makes `pto` panic or hang, and every exit code is a documented one.
    #[test]
    fn no_argument_vector_panics(args in prop::collection::vec(arb_arg(), 0..6)) {
        // Keep generated runs short: a valid run must stay small.
        let mut v: Vec<&str> = args.iter().map(String::as_str).collect();
        if v.contains(&"bench") {
            v.extend(["--tasks", "100", "--reps", "1"]);
        }
        let o = pto(&v, &[("PTO_WAIT_TIMEOUT_MS", "5000")]);
        prop_assert!(!o.err.contains("panicked"), "{:?}: {}", v, o.err);
        prop_assert!(matches!(o.code, Some(0..=5)), "{:?}: {:?} {}", v, o.code, o.err);
    }
}

#[test]
fn a_full_or_closed_standard_output_ends_the_command_without_a_panic() {
    // A full disk: an environment error that says so.
    for args in [
        &["env"][..],
        &["list"],
        &["run", "allreduce_distributed", "--ranks", "2"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(PTO)
            .args(args)
            .stdout(full)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {err}");
        assert!(err.contains("No space left"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A reader that left: quiet, 128 + SIGPIPE as a shell expects.
    for args in [
        &["env"][..],
        &["run", "allreduce_distributed", "--ranks", "2"],
    ] {
        // The reader is gone before pto starts: closing it after the spawn raced with pto's
        // writes (a short output fits the pipe, and a loaded machine let pto finish first).
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let c = Command::new(PTO)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_signal_ends_a_benchmark_anchor_and_what_it_started() {
    // An anchor that hangs (a script whose child sleeps) ends with pto.
    let script = std::env::temp_dir().join(format!("pto-hanging-anchor-{}.sh", std::process::id()));
    std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let t = Instant::now();
    let child = spawn(
        &[
            "bench",
            "dag",
            "--tasks",
            "10",
            "--reps",
            "1",
            "--omp-anchor",
            script.to_str().unwrap(),
        ],
        &[],
    );
    let parent = child.id();
    let anchor = wait_children(parent, 1);
    let sleeper = wait_children(anchor[0], 1);
    signal(parent, rustix::process::Signal::TERM);
    let o = finish(child, t);
    let _ = std::fs::remove_file(&script);
    assert_eq!(o.code, Some(143), "{}\n{}", o.out, o.err);
    let everyone = [anchor, sleeper].concat();
    assert!(
        all_end_within(&everyone, Duration::from_secs(2)),
        "the anchor outlived pto: {everyone:?}"
    );
}
