//! `pto check`'s report as JSON: stale-signal warnings, and the races of the wrong programs of
//! `plugins/races.c` (window pointers, two puts into one mailbox slot, a wait on the wrong
//! signal, a staging buffer reused without a barrier) next to their fixed twins (more races:
//! `tests/plugins.rs`).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{build_plugin, in_private_shm};
use serde_json::Value;

/// `pto check --json` of `program` of `lib` on 2 ranks of `backend`: the exit code and races.
fn check_json(lib: &str, program: &str, backend: &str) -> (Option<i32>, Vec<Value>) {
    let o = in_private_shm(&format!(
        "PTO_WAIT_TIMEOUT_MS=20000 \"$PTO\" check --plugin '{lib}' {program} --ranks 2 --backend {backend} --json"
    ));
    let v: Value = serde_json::from_str(o.out.trim())
        .unwrap_or_else(|e| panic!("{program} {backend}: {e}: {}\n{}", o.out, o.err));
    assert_eq!(v["run"]["passed"], true, "{program} {backend}: {}", o.out);
    (o.code, v["races"].as_array().unwrap().clone())
}

/// An access of a race as `rank op kind buffer[lo..hi)`.
fn side(a: &Value) -> String {
    format!(
        "{} {} {} {}[{}..{})",
        a["rank"],
        a["op"].as_str().unwrap(),
        a["kind"].as_str().unwrap(),
        a["buffer"].as_str().unwrap_or("-"),
        a["range"][0],
        a["range"][1]
    )
}

/// A wrong program, its fixed twins, the race's two sides (`side`, sorted), and words its
/// message must hold.
type Case = (
    &'static str,
    &'static [&'static str],
    [&'static str; 2],
    &'static [&'static str],
);

#[test]
fn pto_check_finds_the_races_of_the_wrong_plugin_programs_and_passes_their_fixed_twins() {
    let p = build_plugin("crates/pto-cli/tests/plugins/races.c", &[]);
    let lib = p.path.display().to_string();
    let cases: [Case; 4] = [
        (
            "ptr_racy",
            &["ptr_ordered", "ptr_early"],
            ["0 window pointer write box[0..16)", "1 get read box[0..16)"],
            &[
                "`through_ptr`",
                "rank 1 does not wait on a signal that rank 0 notified after its window pointer",
            ],
        ),
        (
            "mailbox_racy",
            &["mailbox_fixed"],
            ["0 put write mailbox[0..8)", "1 put write mailbox[0..8)"],
            &[
                "rank 0 writes `mailbox[0..8)` (put in task",
                "rank 1 writes `mailbox[0..8)` of rank 0 (put in task",
            ],
        ),
        (
            "wrong_signal",
            &["right_signal"],
            ["0 put write inbox[0..16)", "1 get read inbox[0..16)"],
            &[
                "`signals`",
                "rank 1 does not wait on a signal that rank 0 notified after its put",
            ],
        ),
        (
            "staging_racy",
            &["staging_fixed"],
            ["0 put write stage[0..16)", "1 get read stage[0..16)"],
            &[
                "`staging`",
                "nor rank 0 on one that rank 1 notified after its get",
            ],
        ),
    ];
    for backend in ["local", "shm"] {
        for (wrong, fixed, sides, words) in cases {
            let (code, races) = check_json(&lib, wrong, backend);
            assert_eq!(code, Some(5), "{wrong} {backend}: {races:?}");
            assert_eq!(races.len(), 1, "{wrong} {backend}: {races:?}");
            let mut got = [side(&races[0]["first"]), side(&races[0]["second"])];
            got.sort();
            assert_eq!(got, sides.map(String::from), "{wrong} {backend}");
            let m = races[0]["message"].as_str().unwrap();
            for w in words {
                assert!(m.contains(w), "{wrong} {backend}: {m} lacks {w}");
            }
            for f in fixed {
                let (code, races) = check_json(&lib, f, backend);
                assert_eq!(code, Some(0), "{f} {backend}: {races:?}");
                assert!(races.is_empty(), "{f} {backend}: {races:?}");
            }
        }
    }
}

#[test]
fn pto_check_json_lists_a_stale_signal_as_a_warning() {
    let p = build_plugin("crates/pto-cli/tests/plugins/stale.c", &[]);
    let lib = p.path.display().to_string();
    for backend in ["local", "shm"] {
        let o = in_private_shm(&format!(
            "PTO_WAIT_TIMEOUT_MS=20000 \"$PTO\" check --plugin '{lib}' stale --ranks 2 --backend {backend} --json"
        ));
        // A warning is not a race: the run passed, and so does the check.
        assert_eq!(o.code, Some(0), "{backend}: {}\n{}", o.out, o.err);
        let v: serde_json::Value = serde_json::from_str(o.out.trim()).unwrap();
        let warnings = v["warnings"].as_array().unwrap();
        assert!(!warnings.is_empty(), "{backend}: {}", o.out);
        for w in warnings {
            let w = w.as_str().unwrap();
            assert!(
                w.contains("`flag[0]`") && w.contains("reused without being reset or raised"),
                "{backend}: {w}"
            );
        }
        assert_eq!(v["races"].as_array().unwrap().len(), 0, "{}", o.out);

        let o = in_private_shm(&format!(
            "PTO_WAIT_TIMEOUT_MS=20000 \"$PTO\" check --plugin '{lib}' raised --ranks 2 --backend {backend} --json"
        ));
        assert_eq!(o.code, Some(0), "{backend}: {}\n{}", o.out, o.err);
        let v: serde_json::Value = serde_json::from_str(o.out.trim()).unwrap();
        assert_eq!(v["warnings"], serde_json::json!([]), "{backend}: {}", o.out);
    }
    // The text report shows the same warning.
    let o = in_private_shm(&format!(
        "PTO_WAIT_TIMEOUT_MS=20000 \"$PTO\" check --plugin '{lib}' stale --ranks 2"
    ));
    assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
    assert!(o.out.contains("warning: rank "), "{}", o.out);
}

#[test]
fn a_runtime_failure_under_the_checker_exits_3_on_every_backend() {
    // A ring too small for the example's outputs fails its orchestration on every rank: a
    // runtime failure (3), as `pto run` says, not a wrong result (1).
    for backend in ["local", "shm"] {
        let o = in_private_shm(&format!(
            "PTO_RING_HEAP_BYTES=4096 \"$PTO\" check ffn_tp_parallel --ranks 2 --backend {backend} --json"
        ));
        assert_eq!(o.code, Some(3), "{backend}: {}\n{}", o.out, o.err);
        let v: Value = serde_json::from_str(o.out.trim())
            .unwrap_or_else(|e| panic!("{backend}: {e}: {}\n{}", o.out, o.err));
        assert_eq!(v["exit_code"], 3, "{backend}: {v}");
        assert_eq!(v["run"]["passed"], false, "{backend}: {v}");
    }
}

#[test]
fn a_usage_error_of_check_json_is_still_one_object() {
    let o = in_private_shm("\"$PTO\" check no_such_example --json");
    assert_eq!(o.code, Some(2), "{}\n{}", o.out, o.err);
    let v: Value =
        serde_json::from_str(o.out.trim()).unwrap_or_else(|e| panic!("{e}: {}\n{}", o.out, o.err));
    assert_eq!(v["exit_code"], 2, "{v}");
    assert_eq!(v["error"]["kind"], "usage", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no_such_example")),
        "{v}"
    );
}
