//! C plugins through the command line, built with `cc` against `pto include-dir` as a user
//! builds them: the example ring program on 1, 2, 4 and 8 ranks of the shm and local backends
//! (the MPI backend: `tests/mpi.rs`), every kind of bad plugin refused by name, and kernels
//! and programs that fail in each way a user's can.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{build_plugin, in_private_shm, ShOut};

fn run(plugin: &std::path::Path, args: &str) -> ShOut {
    in_private_shm(&format!(
        "PTO_WAIT_TIMEOUT_MS=20000 \"$PTO\" run --plugin '{}' {args}",
        plugin.display()
    ))
}

#[test]
fn include_dir_holds_the_header() {
    let o = in_private_shm("cat \"$(\"$PTO\" include-dir)/pto.h\"");
    assert_eq!(o.code, Some(0), "{}", o.err);
    assert!(o.out.contains("#define PTO_ABI_VERSION 1u"), "{}", o.out);
    assert!(o.out.contains("pto_plugin_register"));
}

#[test]
fn the_ring_example_passes_on_every_rank_count_of_shm_and_local() {
    let p = build_plugin("examples/plugin/ring.c", &[]);
    for backend in ["shm", "local"] {
        for n in [1, 2, 4, 8] {
            for program in ["ring", "ring_blocking"] {
                let o = run(
                    &p.path,
                    &format!("{program} --ranks {n} --backend {backend} --json"),
                );
                assert_eq!(
                    o.code,
                    Some(0),
                    "{program} {backend} {n}: {}\n{}",
                    o.out,
                    o.err
                );
                let v: serde_json::Value = serde_json::from_str(o.out.trim()).unwrap();
                assert_eq!(v["passed"], true, "{}", o.out);
                assert_eq!(v["ranks"], n);
            }
        }
    }
}

#[test]
fn list_shows_what_a_plugin_registers() {
    let p = build_plugin("examples/plugin/ring.c", &[]);
    let o = in_private_shm(&format!("\"$PTO\" list --plugin '{}'", p.path.display()));
    assert_eq!(o.code, Some(0), "{}", o.err);
    for want in [
        "program ring",
        "program ring_blocking",
        "ring_send",
        "AIV",
        "inbox",
        "256 x f32",
    ] {
        assert!(o.out.contains(want), "{want}: {}", o.out);
    }
}

#[test]
fn bad_plugins_are_refused_with_the_file_and_the_cause() {
    let cases = [
        (
            "NO_REGISTER",
            "required symbol pto_plugin_register is missing",
        ),
        ("ABI_MISMATCH", "pto_plugin_abi_version returns 999"),
        ("DUPLICATE_KERNEL", "kernel \"twice\" is registered twice"),
        (
            "BUILTIN_NAME",
            "kernel \"vector_add\" is already registered",
        ),
        ("BUFFER_TWICE", "buffer \"b\" is declared twice"),
        ("REGISTER_FAILS", "pto_plugin_register failed (returned 7)"),
    ];
    for (define, want) in cases {
        let p = build_plugin("crates/pto-cli/tests/plugins/bad.c", &[define]);
        for backend in ["shm", "local"] {
            let o = run(&p.path, &format!("prog --ranks 2 --backend {backend}"));
            assert_eq!(o.code, Some(2), "{define}: {}\n{}", o.out, o.err);
            assert!(o.err.contains(want), "{define}: {}", o.err);
            assert!(
                o.err.contains(&p.path.display().to_string()),
                "{define}: {}",
                o.err
            );
        }
    }
    // Not a shared library; no such file; no such program.
    let p = build_plugin("examples/plugin/ring.c", &[]);
    let junk = p.path.with_file_name("libjunk.so");
    std::fs::write(&junk, "not a library").unwrap();
    let o = run(&junk, "ring --ranks 2");
    assert_eq!(o.code, Some(2), "{}", o.err);
    assert!(o.err.contains("cannot load it"), "{}", o.err);
    let missing = p.path.with_file_name("libmissing.so");
    let o = run(&missing, "ring --ranks 2");
    assert_eq!(o.code, Some(2), "{}", o.err);
    assert!(
        o.err.contains("libmissing.so") && o.err.contains("No such file"),
        "{}",
        o.err
    );
    let o = run(&p.path, "nope --ranks 2");
    assert_eq!(o.code, Some(2), "{}", o.err);
    assert!(
        o.err.contains("no program \"nope\"") && o.err.contains("ring, ring_blocking"),
        "{}",
        o.err
    );
}

#[test]
fn failing_kernels_and_programs_fail_their_run_with_the_cause() {
    let p = build_plugin("crates/pto-cli/tests/plugins/cases.c", &[]);
    for backend in ["shm", "local"] {
        // pto_fail: the task fails with its message; its consumer is poisoned, not run.
        let o = run(&p.path, &format!("fail --ranks 2 --backend {backend}"));
        assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
        assert!(
            o.out.contains("kernel \"boom\"") && o.out.contains("boom: value 42 is wrong"),
            "{}",
            o.out
        );
        assert!(o.out.contains("1 poisoned"), "{}", o.out);
        assert!(!o.err.contains("after_boom ran"), "{}", o.err);
        // A call's error code returned by the kernel: the task's error says which call.
        let o = run(&p.path, &format!("bad_put --ranks 2 --backend {backend}"));
        assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
        assert!(
            o.out.contains("returned -3 (out of range)") && o.out.contains("rank 99 out of range"),
            "{}",
            o.out
        );
        // A program that fails.
        let o = run(
            &p.path,
            &format!("program_fails --ranks 2 --backend {backend}"),
        );
        assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
        assert!(
            o.out.contains("program program_fails returned -2"),
            "{}",
            o.out
        );
        // Host tensors written and read back, SPMD blocks, scalars, explicit dependencies.
        let o = run(&p.path, &format!("spmd --ranks 2 --backend {backend}"));
        assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
        // Every call with bad arguments returns its code; nothing aborts.
        let o = run(&p.path, &format!("bad_calls --ranks 2 --backend {backend}"));
        assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
    }
    // A kernel that crashes its process on shm is a named dead chip.
    let o = run(&p.path, "crash --ranks 2");
    assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
    assert!(
        o.out.contains("chip 1") && o.out.contains("SIGSEGV"),
        "{}",
        o.out
    );
}

#[test]
fn pto_check_reports_a_plugins_race_and_passes_its_ordered_twin() {
    let p = build_plugin("crates/pto-cli/tests/plugins/cases.c", &[]);
    let lib = p.path.display().to_string();
    let o = in_private_shm(&format!(
        "\"$PTO\" check --plugin '{lib}' racy --ranks 2 --json"
    ));
    assert_eq!(o.code, Some(5), "{}\n{}", o.out, o.err);
    let v: serde_json::Value = serde_json::from_str(o.out.trim()).unwrap();
    let races = v["races"].as_array().unwrap();
    assert!(!races.is_empty(), "{}", o.out);
    let m = races[0]["message"].as_str().unwrap();
    assert!(
        m.contains("`buf[0..16)`") && m.contains("`exchange`"),
        "{m}"
    );
    let ring = build_plugin("examples/plugin/ring.c", &[]);
    for (program, ranks) in [("ordered", 2), ("ordered", 4), ("ring", 3)] {
        let lib = if program == "ring" {
            ring.path.display().to_string()
        } else {
            lib.clone()
        };
        let o = in_private_shm(&format!(
            "\"$PTO\" check --plugin '{lib}' {program} --ranks {ranks} --schedules 5"
        ));
        assert_eq!(o.code, Some(0), "{program}: {}\n{}", o.out, o.err);
    }
}

#[test]
fn pto_check_passes_the_examples_on_threads_and_processes() {
    for backend in ["local", "shm"] {
        for ex in [
            "deferred_notify",
            "allreduce_distributed",
            "ffn_tp_parallel",
        ] {
            let o = in_private_shm(&format!(
                "\"$PTO\" check {ex} --ranks 4 --backend {backend} --schedules 3"
            ));
            assert_eq!(o.code, Some(0), "{ex} {backend}: {}\n{}", o.out, o.err);
            assert!(o.out.contains("0 of 3 schedules failed"), "{}", o.out);
        }
    }
    // On processes too, a race is found (each process's records, replayed together).
    let p = build_plugin("crates/pto-cli/tests/plugins/cases.c", &[]);
    let o = in_private_shm(&format!(
        "\"$PTO\" check --plugin '{}' racy --ranks 3 --backend shm --json",
        p.path.display()
    ));
    assert_eq!(o.code, Some(5), "{}\n{}", o.out, o.err);
    let o = in_private_shm("\"$PTO\" check deferred_notify --ranks 2 --backend mpi");
    assert_eq!(o.code, Some(2), "{}\n{}", o.out, o.err);
    assert!(o.err.contains("--backend local or shm"), "{}", o.err);
}
