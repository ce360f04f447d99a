//! Failure and stress behaviour with ranks as processes: a rank killed with SIGKILL, a rank
//! that panics or exits, an abort, stale and mismatched segments, and the barrier stress test
//! (100 000 barriers on 4 processes, and on 8 processes sharing 2 CPUs).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pto_comm::shm::{self, ShmWorld};
use pto_comm::{CommError, SignalOp, WindowSpec};

const MODE: &str = "PTO_TEST_MODE";

fn spawn_world(mode: &str, n: usize) -> ShmWorld {
    let mut world = ShmWorld::create(n).unwrap();
    let exe = std::env::current_exe().unwrap();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--exact",
            "rank_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(MODE, mode)
        .env("PTO_WAIT_TIMEOUT_MS", "30000")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        world.spawn(r, cmd).unwrap();
    }
    world
}

fn statuses(world: &mut ShmWorld, timeout: Duration) -> Vec<(usize, Option<i32>)> {
    world
        .wait(timeout)
        .unwrap()
        .into_iter()
        .map(|(r, s)| (r, s.code()))
        .collect()
}

#[test]
fn a_killed_rank_is_named_by_its_peers_within_a_second() {
    let mut world = spawn_world("wait_for_rank2", 3);
    // Once every rank has joined (ranks 0 and 1 then enter the barrier; rank 2 only sleeps),
    // kill rank 2.
    assert!(
        world.wait_joined(Duration::from_secs(20)),
        "ranks did not join"
    );
    std::thread::sleep(Duration::from_millis(50));
    world.kill(2).unwrap();
    let killed = Instant::now();
    // Do not reap rank 2 for a second: the survivors must notice a zombie on their own.
    std::thread::sleep(Duration::from_millis(1000));
    let st = statuses(&mut world, Duration::from_secs(10));
    assert!(
        killed.elapsed() < Duration::from_millis(1500),
        "survivors took {:?}",
        killed.elapsed()
    );
    for (r, code) in st {
        match r {
            // Exit code 0 means the rank saw PeerDied { rank: 2 } (checked in the child).
            0 | 1 => assert_eq!(code, Some(0), "rank {r}"),
            _ => assert_eq!(code, None, "rank 2 was killed by a signal"),
        }
    }
}

/// 256 ranks on 2 CPUs: every survivor names the killed rank within a second of the kill,
/// learning it from the launcher's reaping loop ([`ShmWorld::wait`] supervises), not from
/// 255 × 255 `/proc` reads.
#[test]
fn a_killed_rank_among_256_is_named_by_every_peer_within_a_second() {
    let n = 256;
    let notice = std::env::temp_dir().join(format!("pto-notice-{}", std::process::id()));
    std::fs::write(&notice, b"").unwrap();
    std::env::set_var("PTO_TEST_NOTICE", &notice);
    let mut world = spawn_world("wait_for_rank2_timed", n);
    assert!(
        world.wait_joined(Duration::from_secs(60)),
        "ranks did not join"
    );
    std::thread::sleep(Duration::from_millis(100));
    let killed = pto_shm::process::monotonic_ns();
    world.kill(2).unwrap();
    let st = statuses(&mut world, Duration::from_secs(30));
    for (r, code) in &st {
        if *r != 2 {
            assert_eq!(*code, Some(0), "rank {r} did not name rank 2");
        }
    }
    let text = std::fs::read_to_string(&notice).unwrap();
    let _ = std::fs::remove_file(&notice);
    let times: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(times.len(), n - 1, "every survivor noticed");
    let last = times.iter().max().unwrap().saturating_sub(killed);
    eprintln!(
        "the last of {} survivors noticed {} ms after the kill",
        n - 1,
        last / 1_000_000
    );
    assert!(
        last < 1_000_000_000,
        "the last survivor noticed after {} ms",
        last / 1_000_000
    );
}

#[test]
fn a_panicking_rank_aborts_its_peers() {
    let mut world = spawn_world("panic_rank1", 3);
    let t = Instant::now();
    let st = statuses(&mut world, Duration::from_secs(20));
    assert!(t.elapsed() < Duration::from_secs(10));
    for (r, code) in st {
        if r == 1 {
            assert_ne!(code, Some(0), "rank 1 panicked");
        } else {
            assert_eq!(code, Some(0), "rank {r} did not report the abort");
        }
    }
}

#[test]
fn an_abort_wakes_a_signal_waiter_and_an_exit_is_noticed() {
    let mut world = spawn_world("abort_and_exit", 3);
    for (r, code) in statuses(&mut world, Duration::from_secs(20)) {
        assert_eq!(code, Some(0), "rank {r}");
    }
}

#[test]
fn joins_are_validated() {
    let world = ShmWorld::create(2).unwrap();
    let name = world.name().to_string();
    assert!(matches!(
        shm::join(&name, 2, 2),
        Err(CommError::BadRank { rank: 2, size: 2 })
    ));
    assert!(matches!(
        shm::join(&name, 0, 0),
        Err(CommError::BadSize { size: 0, .. })
    ));
    assert!(matches!(
        shm::join(&name, 0, 5000),
        Err(CommError::BadSize { .. })
    ));
    match shm::join(&name, 0, 3) {
        Err(CommError::Mismatch {
            theirs: 2, ours: 3, ..
        }) => {}
        other => panic!("expected a rank-count mismatch, got {other:?}"),
    }
    let c0 = shm::join(&name, 0, 2).unwrap();
    assert!(matches!(
        shm::join(&name, 0, 2),
        Err(CommError::AlreadyJoined { rank: 0, .. })
    ));
    drop(c0);
    let r = shm::join_with_timeout("/pto.1.nonexistent", 0, 2, Duration::from_millis(100));
    assert!(
        matches!(r, Err(CommError::Shm(pto_shm::ShmError::Timeout { .. }))),
        "{r:?}"
    );
}

#[test]
fn a_stale_world_of_a_crashed_launcher_is_refused_and_swept() {
    // A child creates a world and dies without cleaning up. Any `pto run` on the machine
    // sweeps stale segments as it starts (its job), and may take this one before the join
    // below looks: then the attempt says nothing, and another is made.
    let exe = std::env::current_exe().unwrap();
    for attempt in 0..10 {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "rank_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(MODE, "leak_world")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let name = text
            .lines()
            .find_map(|l| l.split("WORLD ").nth(1))
            .expect("the child printed its world name")
            .to_string();
        let path = format!("/dev/shm{name}");
        match shm::join_with_timeout(&name, 0, 2, Duration::from_secs(2)) {
            Err(CommError::Shm(pto_shm::ShmError::Stale { .. })) => {}
            Err(CommError::Shm(pto_shm::ShmError::Timeout { .. }))
                if !std::path::Path::new(&path).exists() =>
            {
                eprintln!("attempt {attempt}: another process swept the stale world first");
                continue;
            }
            other => panic!("expected a stale-segment error, got {other:?}"),
        }
        let swept = pto_shm::sweep::sweep_stale();
        // Gone (a concurrent `pto run` may have swept it first).
        assert!(!std::path::Path::new(&path).exists(), "{swept:?}");
        return;
    }
    panic!("the stale world was swept by another process before every one of 10 joins");
}

#[test]
fn barrier_stress_4_processes() {
    let mut world = spawn_world("stress", 4);
    for (r, code) in statuses(&mut world, Duration::from_secs(120)) {
        assert_eq!(code, Some(0), "rank {r}");
    }
}

#[test]
fn barrier_stress_8_processes_on_2_cpus() {
    let mut world = spawn_world("stress", 8);
    for (r, code) in statuses(&mut world, Duration::from_secs(240)) {
        assert_eq!(code, Some(0), "rank {r}");
    }
}

/// Not a test on its own: the body of one rank process.
#[test]
#[ignore = "entered by the tests above in child processes"]
fn rank_entry() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    if mode == "leak_world" {
        let w = ShmWorld::create(2).unwrap();
        // A launcher killed together with its janitor (a process group's SIGKILL, or no
        // /bin/sh): end the janitor first, so that the segment stays.
        kill_my_janitor();
        println!("WORLD {}", w.name());
        // Exit without running destructors: the segment stays, its creator dies.
        std::process::exit(0);
    }
    let comm = shm::from_env().unwrap().expect("launched as a rank");
    let me = comm.rank();
    let fail = |msg: String| -> ! {
        eprintln!("rank {me}: {msg}");
        std::process::exit(1)
    };
    match mode.as_str() {
        "wait_for_rank2" => {
            if me == 2 {
                std::thread::sleep(Duration::from_secs(60));
                return;
            }
            match comm.barrier() {
                Err(CommError::PeerDied { rank: 2, .. })
                | Err(CommError::PeerGone { rank: 2, .. }) => {}
                other => fail(format!("expected rank 2 to be named, got {other:?}")),
            }
        }
        "wait_for_rank2_timed" => {
            if me == 2 {
                std::thread::sleep(Duration::from_secs(60));
                return;
            }
            match comm.barrier() {
                Err(CommError::PeerDied { rank: 2, .. })
                | Err(CommError::PeerGone { rank: 2, .. }) => {
                    let at = pto_shm::process::monotonic_ns();
                    let path = std::env::var("PTO_TEST_NOTICE").unwrap();
                    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
                    std::io::Write::write_all(&mut f, format!("{at}\n").as_bytes()).unwrap();
                }
                other => fail(format!("expected rank 2 to be named, got {other:?}")),
            }
        }
        "panic_rank1" => {
            comm.barrier().unwrap();
            if me == 1 {
                std::thread::sleep(Duration::from_millis(100));
                panic!("rank 1 fails on purpose");
            }
            match comm.barrier() {
                Err(CommError::Aborted { rank: 1, message }) if message.contains("panicked") => {}
                Err(CommError::PeerGone { rank: 1, .. }) => {}
                other => fail(format!("expected rank 1's failure, got {other:?}")),
            }
        }
        "abort_and_exit" => {
            let w = comm.alloc_window(&WindowSpec::new(64)).unwrap();
            match me {
                0 => {
                    std::thread::sleep(Duration::from_millis(100));
                    comm.abort("giving up on purpose");
                }
                1 => match w.wait_until(0, 1) {
                    Err(CommError::Aborted { rank: 0, message })
                        if message == "giving up on purpose" => {}
                    other => fail(format!("expected the abort, got {other:?}")),
                },
                _ => match w.wait_until(0, 1) {
                    Err(CommError::Aborted { rank: 0, .. }) => {}
                    other => fail(format!("expected the abort, got {other:?}")),
                },
            }
            // A notify after an abort still works locally (one-sided), and waits fail fast.
            w.notify(me, 0, 1, SignalOp::Add).unwrap();
        }
        "stress" => {
            // 100 000 rounds take 1-6 s on an idle machine; a loaded one gets 20 s of them.
            match pto_comm::conformance::stress_barrier(&comm, 100_000, Duration::from_secs(20)) {
                Err(m) => fail(m),
                // Under 1 000 rounds in 20 s is over 20 ms a barrier: something is wrong.
                Ok(done) if done < 1_000 => fail(format!("only {done} barrier rounds in 20 s")),
                Ok(done) => eprintln!("rank {me}: {done} barrier rounds"),
            }
        }
        other => fail(format!("unknown mode {other}")),
    }
}

/// Kills this process's segment janitor (its child `/bin/sh ... pto-janitor <pid>`) and waits
/// until it is gone.
fn kill_my_janitor() {
    let me = std::process::id().to_string();
    let t = std::time::Instant::now();
    loop {
        let mut found = false;
        for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
            let pid = e.file_name().to_string_lossy().into_owned();
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            if args.contains(&&b"pto-janitor"[..]) && args.contains(&me.as_bytes()) {
                found = true;
                if let Some(p) = pid.parse().ok().and_then(rustix::process::Pid::from_raw) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
        }
        if !found || t.elapsed() > Duration::from_secs(10) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
