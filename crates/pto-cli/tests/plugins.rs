//! C plugins through the command line, built with `cc` against `pto include-dir` as a user
//! builds them: the example ring program on 1, 2, 4 and 8 ranks of the shm and local backends
//! (the MPI backend: `tests/mpi.rs`), every kind of bad plugin refused by name, kernels and
//! programs that fail in each way a user's can, every call of the header checked in a kernel,
//! `pto_plugin_teardown` (which process calls it), and a plugin written in C++.

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

#[test]
fn every_call_of_the_header_checks_out_on_1_2_and_4_ranks_of_shm_and_local() {
    // `calls` uses pto_barrier, pto_orch_rank/nranks, pto_tensor_count/dtype/shape,
    // pto_scalar_f32/i32/u32/u64, pto_arg_no_dep, the f32/i32/u32/u64 scalar arguments, and
    // an AIC and a MIX kernel; its kernels check every result (pto_fail on a mismatch) and the
    // program checks what they wrote.
    let p = build_plugin("crates/pto-cli/tests/plugins/cases.c", &[]);
    for backend in ["shm", "local"] {
        for n in [1, 2, 4] {
            let o = run(
                &p.path,
                &format!("calls --ranks {n} --backend {backend} --json"),
            );
            assert_eq!(o.code, Some(0), "calls {backend} {n}: {}\n{}", o.out, o.err);
            let v: serde_json::Value = serde_json::from_str(o.out.trim()).unwrap();
            assert_eq!(v["passed"], true, "{}", o.out);
            assert_eq!(v["ranks"], n);
        }
    }
    // The AIC and MIX kernels need their cores: without AIC cores, submitting fails by name.
    let o = run(&p.path, "calls --ranks 2 --backend local --aic 0");
    assert_eq!(o.code, Some(3), "{}\n{}", o.out, o.err);
    assert!(
        o.out.contains("\"calls_aic\" needs a") && o.out.contains("AIC core"),
        "{}",
        o.out
    );
}

/// The marker files `teardown.c` left in `dir`: (kind, pid, lines) sorted.
fn markers(dir: &std::path::Path) -> Vec<(String, u32, usize)> {
    let mut m: Vec<(String, u32, usize)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let (kind, pid) = name.split_once('.').unwrap();
            let lines = std::fs::read_to_string(e.path()).unwrap().lines().count();
            (kind.to_string(), pid.parse().unwrap(), lines)
        })
        .collect();
    m.sort();
    m
}

#[test]
fn teardown_runs_once_in_the_process_that_loaded_the_plugin_not_in_the_chips() {
    let p = build_plugin("crates/pto-cli/tests/plugins/teardown.c", &[]);
    let dir = p.path.with_file_name("markers");
    for backend in ["local", "shm"] {
        // A passing run and a failing one (exit 3) alike.
        for (program, code) in [("touch", 0), ("touch_fails", 3)] {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            // `exec`: the shell's pid is pto's.
            let o = in_private_shm(&format!(
                "echo \"pid $$\"; export PTO_TEST_MARKER_DIR='{}' PTO_WAIT_TIMEOUT_MS=20000; \
                 exec \"$PTO\" run --plugin '{}' {program} --ranks 3 --backend {backend}",
                dir.display(),
                p.path.display()
            ));
            assert_eq!(
                o.code,
                Some(code),
                "{program} {backend}: {}\n{}",
                o.out,
                o.err
            );
            let pto: u32 = o
                .out
                .lines()
                .find_map(|l| l.strip_prefix("pid "))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let m = markers(&dir);
            let teardowns: Vec<_> = m.iter().filter(|x| x.0 == "teardown").collect();
            let kernels: Vec<u32> = m.iter().filter(|x| x.0 == "kernel").map(|x| x.1).collect();
            // Once, by the pto process, after its run.
            assert_eq!(
                teardowns,
                [&("teardown".to_string(), pto, 1)],
                "{program} {backend}: {m:?} (pto is {pto})"
            );
            if backend == "local" {
                // Threads: every rank's kernel ran in the pto process.
                assert_eq!(kernels, [pto], "{m:?}");
            } else {
                // Processes: each chip ran its rank's kernel and exited without a teardown
                // (when a run fails, a chip may be stopped before its kernel ran).
                let ran = kernels.len();
                assert!(ran == 3 || (code != 0 && ran >= 1), "{m:?}");
                assert!(!kernels.contains(&pto), "{m:?} (pto is {pto})");
            }
        }
    }
    // `pto list` loads the plugin too, and unloads it: one teardown, no kernel.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = in_private_shm(&format!(
        "PTO_TEST_MARKER_DIR='{}' \"$PTO\" list --plugin '{}'",
        dir.display(),
        p.path.display()
    ));
    assert_eq!(o.code, Some(0), "{}", o.err);
    let m = markers(&dir);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!((m[0].0.as_str(), m[0].2), ("teardown", 1), "{m:?}");
}

/// A folder removed when it drops.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_plugin_written_in_cpp_builds_with_cxx_and_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let inc = std::process::Command::new(env!("CARGO_BIN_EXE_pto"))
        .arg("include-dir")
        .output()
        .unwrap();
    assert!(inc.status.success());
    let inc = String::from_utf8(inc.stdout).unwrap().trim().to_string();
    let dir = TempDir(std::env::temp_dir().join(format!("pto-plugin-cpp-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let lib = dir.0.join("libhello.so");
    let out = std::process::Command::new("c++")
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            "-shared",
            "-fPIC",
        ])
        .arg(format!("-I{inc}"))
        .arg(root.join("crates/pto-cli/tests/plugins/hello.cpp"))
        .arg("-o")
        .arg(&lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "c++ hello.cpp: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for backend in ["local", "shm"] {
        let o = run(&lib, &format!("hello --ranks 2 --backend {backend} --json"));
        assert_eq!(o.code, Some(0), "{backend}: {}\n{}", o.out, o.err);
        let v: serde_json::Value = serde_json::from_str(o.out.trim()).unwrap();
        assert_eq!(v["passed"], true, "{}", o.out);
    }
}

#[test]
fn a_rank_whose_kernel_stalls_is_the_root_cause_not_the_rank_that_waited_for_it() {
    // Rank 0 waits for rank 1 at the end of its run and times out first; rank 1's kernel never
    // finishes and its chip's stall detector fails the run later. Rank 1 is the root cause.
    let p = build_plugin("crates/pto-cli/tests/plugins/cases.c", &[]);
    for backend in ["local", "shm"] {
        let o = in_private_shm(&format!(
            "PTO_WAIT_TIMEOUT_MS=1000 PTO_STALL_TIMEOUT_MS=2000 \"$PTO\" run --plugin '{}' stall --ranks 2 --backend {backend} --json",
            p.path.display()
        ));
        assert_eq!(o.code, Some(3), "{backend}: {}\n{}", o.out, o.err);
        let v: serde_json::Value = serde_json::from_str(o.out.trim())
            .unwrap_or_else(|e| panic!("{backend}: {e}: {}\n{}", o.out, o.err));
        let root = &v["error"]["root_cause"];
        assert_eq!(root["rank"], 1, "{backend}: {v}");
        // On threads the chip's stall detector says it; on processes the host's deadline on
        // the chip that stopped answering.
        assert!(
            root["message"]
                .as_str()
                .is_some_and(|m| m.contains("stall"))
                || root["state"] == "no_answer",
            "{backend}: {v}"
        );
    }
}
