//! `examples/own-crate`: a crate outside the workspace that depends on pto by path, registers
//! its own kernels and a distributed program, and runs it on 4 ranks. Built and run here with
//! cargo, as its README says, sharing this workspace's target folder.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn the_own_crate_example_builds_and_passes_on_4_ranks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--manifest-path"])
        .arg(root.join("examples/own-crate/Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        .env("PTO_WAIT_TIMEOUT_MS", "30000")
        .output()
        .expect("running cargo");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        so.contains("own-crate: 4 ranks, every out = 2 x[r-1] + 1"),
        "{so}\n{se}"
    );
}
