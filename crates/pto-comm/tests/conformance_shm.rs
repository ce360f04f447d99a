//! The conformance suite on the `shm` backend: every rank is a process (this test binary
//! re-run with the case in its environment, entering `rank_entry`).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use pto_comm::conformance::{find, CASES};
use pto_comm::shm::{self, ShmWorld};

const CASE_ENV: &str = "PTO_TEST_CASE";

/// Runs `case` on `n` processes; returns each rank's exit status and output.
fn run_case(case: &str, n: usize) -> Vec<(usize, bool, String)> {
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
        .env(CASE_ENV, case)
        .env("PTO_WAIT_TIMEOUT_MS", "20000")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        world.spawn(r, cmd).unwrap();
    }
    let st = world.wait(Duration::from_secs(60)).unwrap();
    st.into_iter()
        .map(|(r, s)| (r, s.success(), format!("{s}")))
        .collect()
}

#[test]
fn every_case_on_processes() {
    for case in CASES {
        for &n in case.ranks {
            for (rank, ok, status) in run_case(case.name, n) {
                assert!(
                    ok,
                    "case {} with {n} processes: rank {rank} exited with {status}",
                    case.name
                );
            }
        }
    }
    // The ranks created window and domain segments; none may be left behind.
    let left: Vec<_> = pto_shm::sweep::list()
        .into_iter()
        .filter(|s| s.creator.is_some_and(|c| c.pid == std::process::id()))
        .collect();
    assert!(left.is_empty(), "segments left behind: {left:?}");
}

/// Not a test on its own: the body of one rank process, run by `every_case_on_processes`.
#[test]
#[ignore = "entered by the shm conformance driver in a child process"]
fn rank_entry() {
    let Ok(name) = std::env::var(CASE_ENV) else {
        return;
    };
    let case = find(&name).expect("unknown case");
    let comm = shm::from_env().unwrap().expect("not launched as a rank");
    if let Err(msg) = (case.run)(&comm) {
        eprintln!("rank {}: {msg}", comm.rank());
        std::process::exit(1);
    }
}
