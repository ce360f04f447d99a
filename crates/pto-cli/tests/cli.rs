//! The `pto` command end to end: list, run (text and JSON, a golden mismatch impossible to fake:
//! the exit code follows the check), bad input, and clean.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn pto(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pto"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn list_names_every_example() {
    let (code, out, _) = pto(&["list"]);
    assert_eq!(code, 0);
    for ex in [
        "ffn_tp_parallel",
        "allreduce_distributed",
        "deferred_notify",
        "multi_chip_dispatch",
    ] {
        assert!(out.contains(ex), "{ex} missing from {out}");
    }
}

#[test]
fn run_prints_json_and_exits_zero_on_a_match() {
    let (code, out, err) = pto(&["run", "allreduce_distributed", "--ranks", "3", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["example"], "allreduce_distributed");
    assert_eq!(v["ranks"], 3);
    assert_eq!(v["backend"], "shm");
    assert_eq!(v["passed"], true);
    assert!(v["wall_ms"].as_f64().unwrap() > 0.0);
    let (code, out, _) = pto(&[
        "run",
        "ffn_tp_parallel",
        "--ranks",
        "2",
        "--backend",
        "local",
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("PASSED"), "{out}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (code, _, err) = pto(&["run", "no_such_example"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no example named") && err.contains("ffn_tp_parallel"),
        "{err}"
    );
    let (code, _, err) = pto(&["run", "allgather", "--ranks", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--ranks"), "{err}");
    let (code, _, err) = pto(&["run", "allgather", "--backend", "carrier-pigeon"]);
    assert_eq!(code, 2);
    assert!(err.contains("possible values: shm, local, mpi"), "{err}");
    // A single-chip example on several ranks is refused, not silently run once.
    let (code, out, err) = pto(&["run", "vector_pipeline", "--ranks", "2", "--json"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("\"passed\":false") && err.contains("--ranks must be 1"),
        "{err}"
    );
}

#[test]
fn clean_lists_and_removes_stale_segments_only() {
    // A segment whose creator is dead: named after a reaped child's pid.
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let name = format!("pto.{pid}.00000000deadbeef.clitest");
    std::fs::write(format!("/dev/shm/{name}"), b"").unwrap();
    // A live one: ours.
    let live = pto_shm::Segment::create(
        &pto_shm::Segment::fresh_name("clilive"),
        pto_shm::HEADER_LEN,
        pto_shm::HeaderInit::default(),
    )
    .unwrap();
    let (code, out, _) = pto(&["clean", "--dry-run"]);
    assert_eq!(code, 0);
    let line = out
        .lines()
        .find(|l| l.contains(&name))
        .expect("stale segment listed");
    assert!(
        line.contains("stale") && !line.contains("removed"),
        "{line}"
    );
    assert!(std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    let (code, out, _) = pto(&["clean"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.contains(&name) && l.contains("removed")),
        "{out}"
    );
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    let live_line = out
        .lines()
        .find(|l| l.contains(&live.name()[1..]))
        .expect("live segment listed");
    assert!(
        live_line.contains("live") && !live_line.contains("removed"),
        "{live_line}"
    );
    assert!(std::path::Path::new(&format!("/dev/shm/{}", &live.name()[1..])).exists());
}
