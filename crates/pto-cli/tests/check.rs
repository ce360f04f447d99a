//! `pto check`'s report as JSON: stale-signal warnings (the races: `tests/plugins.rs`).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{build_plugin, in_private_shm};

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
