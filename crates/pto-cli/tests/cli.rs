//! The `pto` command end to end: list, run (text and JSON, a golden mismatch impossible to fake:
//! the exit code follows the check), bad input, and clean.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

mod common;

fn pto(args: &[&str]) -> (i32, String, String) {
    common::pto_with(args, &[])
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
    // In a private /dev/shm: a concurrent `pto run` sweeps stale segments too.
    // A segment whose creator is dead (named after a reaped child's pid), and a live one
    // (named after pid 1, which lives as long as the machine).
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let stale = format!("pto.{pid}.00000000deadbeef.clitest");
    let live = "pto.1.00000000000000aa.clilive";
    let o = common::in_private_shm(&format!(
        ": > /dev/shm/{stale} && : > /dev/shm/{live} && \
         echo DRY && \"$PTO\" clean --dry-run && test -e /dev/shm/{stale} && \
         echo REAL && \"$PTO\" clean && test ! -e /dev/shm/{stale} && test -e /dev/shm/{live}"
    ));
    assert_eq!(o.code, Some(0), "{}\n{}", o.out, o.err);
    let (dry, real) = o.out.split_once("REAL").unwrap();
    let line = dry
        .lines()
        .find(|l| l.contains(&stale))
        .expect("stale segment listed");
    assert!(
        line.contains("stale") && !line.contains("removed"),
        "{line}"
    );
    assert!(
        real.lines()
            .any(|l| l.contains(&stale) && l.contains("removed")),
        "{real}"
    );
    let live_line = real
        .lines()
        .find(|l| l.contains(live))
        .expect("live segment listed");
    assert!(
        live_line.contains("live") && !live_line.contains("removed"),
        "{live_line}"
    );
}

#[test]
fn run_writes_the_task_graph_and_a_trace_with_dependency_arrows() {
    let dir = std::env::temp_dir().join(format!("pto-dag-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (dot, trace) = (dir.join("g.dot"), dir.join("t.json"));
    let (code, out, err) = pto(&[
        "run",
        "deferred_notify",
        "--ranks",
        "2",
        "--backend",
        "local",
        "--dag",
        dot.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let g = std::fs::read_to_string(&dot).unwrap();
    assert!(g.starts_with("digraph pto {"), "{g}");
    assert!(
        g.contains("label=\"rank 1 / chip\"") && g.contains("notify_wait\"]"),
        "{g}"
    );
    assert!(g.contains("p1_t1 -> p1_t2;"), "{g}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let evs = doc["traceEvents"].as_array().unwrap();
    let flows = |name: &str, ph: &str| {
        evs.iter()
            .filter(|e| e["ph"] == ph && e["name"] == name)
            .count()
    };
    // consume after notify_wait on each rank; each rank's notify to the wait it released.
    assert_eq!((flows("dependency", "s"), flows("dependency", "f")), (2, 2));
    assert_eq!((flows("signal", "s"), flows("signal", "f")), (2, 2));
    let waits = evs.iter().filter(|e| e["ph"] == "i" && e["name"] == "wait");
    for w in waits {
        let s = evs
            .iter()
            .find(|e| e["ph"] == "s" && e["name"] == "signal" && e["pid"] != w["pid"]);
        assert!(s.is_some(), "no arrow into {w}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pto bench <collective> --check` with rank 1 made to corrupt one element of its result
/// (the test hook `PTO_BENCH_INJECT_WRONG`): exit code, stdout and stderr.
fn bench_with_a_wrong_element(op: &str, backend: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "bench",
        op,
        "--backend",
        backend,
        "--ranks",
        "3",
        "-b",
        "64",
        "-e",
        "512",
        "-f",
        "8",
        "--iters",
        "2",
        "--warmup",
        "1",
    ];
    args.extend_from_slice(extra);
    common::pto_with(&args, &[("PTO_BENCH_INJECT_WRONG", "1")])
}

#[test]
fn bench_check_exits_one_on_a_wrong_element_and_zero_without_the_check() {
    for backend in ["local", "shm"] {
        for op in [
            "allreduce",
            "allgather",
            "reduce-scatter",
            "broadcast",
            "all-to-all",
        ] {
            let (code, out, err) = bench_with_a_wrong_element(op, backend, &["--check", "--json"]);
            assert_eq!(
                code, 1,
                "{op} {backend}: a wrong result exits 1\n{out}\n{err}"
            );
            let rows: Vec<serde_json::Value> = out
                .lines()
                .skip(1)
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(rows.len(), 2, "64 and 512 bytes: {out}");
            // One element of rank 1's result per size, counted once.
            for r in &rows {
                assert_eq!(r["wrong"], 1, "{op} {backend}: {r}");
            }
            assert!(err.contains("wrong result"), "{op} {backend}: {err}");
        }
        // The table ends with nccl-tests' verdict line.
        let (code, out, err) = bench_with_a_wrong_element("allreduce", backend, &["--check"]);
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(out.contains("# Out of bounds values : 2 FAILED"), "{out}");
        // Unchecked, the same run has no verdict to give: it exits 0.
        let (code, out, err) = bench_with_a_wrong_element("allreduce", backend, &[]);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(!out.contains("Out of bounds"), "{out}");
    }
    // A correct checked run says OK.
    let (code, out, err) = pto(&[
        "bench",
        "allgather",
        "--backend",
        "local",
        "--ranks",
        "2",
        "-b",
        "64",
        "-e",
        "64",
        "--iters",
        "1",
        "--check",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
}

#[test]
fn bench_of_every_collective_checks_every_result_and_reports_nccl_fields() {
    for backend in ["local", "shm"] {
        for op in [
            "allreduce",
            "allgather",
            "reduce-scatter",
            "broadcast",
            "all-to-all",
        ] {
            let (code, out, err) = pto(&[
                "bench",
                op,
                "--backend",
                backend,
                "--ranks",
                "3",
                "-b",
                "8",
                "-e",
                "1048576",
                "-f",
                "32",
                "--iters",
                "2",
                "--warmup",
                "1",
                "--check",
                "--json",
            ]);
            assert_eq!(code, 0, "{op} {backend}: {out}\n{err}");
            let lines: Vec<serde_json::Value> = out
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(lines[0]["bench"], "header", "{out}");
            assert_eq!(lines[0]["ranks"], 3);
            assert_eq!(lines[0]["backend"], backend);
            let rows = &lines[1..];
            assert_eq!(
                rows.len(),
                4,
                "8 B to 1 MiB by 32: 8, 256, 8192, 262144: {out}"
            );
            for r in rows {
                assert_eq!(r["wrong"], 0, "{op} {backend}: {r}");
                for k in [
                    "bytes",
                    "count",
                    "dtype",
                    "algorithm",
                    "time_min_us",
                    "time_avg_us",
                    "time_max_us",
                    "algbw_gbps",
                    "busbw_gbps",
                ] {
                    assert!(!r[k].is_null(), "{k} missing in {r}");
                }
                assert!(r["time_min_us"].as_f64() <= r["time_max_us"].as_f64());
            }
        }
    }
    // Other dtypes and reductions are checked too.
    for (dtype, rop) in [
        ("float16", "max"),
        ("int64", "prod"),
        ("float64", "min"),
        ("bfloat16", "sum"),
    ] {
        let (code, out, err) = pto(&[
            "bench",
            "allreduce",
            "--backend",
            "local",
            "--ranks",
            "4",
            "-e",
            "4096",
            "--iters",
            "1",
            "--warmup",
            "0",
            "--check",
            "--json",
            "--dtype",
            dtype,
            "--reduce-op",
            rop,
        ]);
        assert_eq!(code, 0, "{dtype} {rop}: {out}\n{err}");
        assert!(
            out.lines().skip(1).all(|l| l.contains("\"wrong\":0")),
            "{out}"
        );
    }
    let (code, _, err) = pto(&["bench", "allreduce", "--dtype", "complex"]);
    assert_eq!(code, 2, "{err}");
}

/// `bench dag --omp-anchor` runs the anchor once per repetition with the task count and prints
/// each pattern's ratio to the anchor's figure (a stand-in anchor with known figures; the
/// diamond has a ratio only when the anchor measures it), and a failing anchor is an error.
#[test]
fn bench_dag_divides_by_the_anchor_it_runs() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("pto-anchor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p.to_string_lossy().into_owned()
    };
    let all = script(
        "all",
        r#"echo "threads=$OMP_NUM_THREADS tasks=$1 chain_ns_per_task=1000 fan_ns_per_task=2000 diamond_ns_per_task=4000""#,
    );
    let two = script(
        "two",
        r#"echo "threads=2 tasks=$1 chain_ns_per_task=1000 fan_ns_per_task=2000""#,
    );
    let broken = script("broken", "echo 'no team' >&2; exit 1");
    let run = |anchor: &str| {
        pto(&[
            "bench",
            "dag",
            "--tasks",
            "300",
            "--reps",
            "1",
            "--pattern",
            "chain,fan,diamond",
            "--json",
            "--omp-anchor",
            anchor,
        ])
    };
    let lines = |out: &str| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (code, out, err) = run(&all);
    assert_eq!(code, 0, "{err}");
    let got = lines(&out);
    assert_eq!(got.len(), 3, "{out}");
    for (line, base) in got.iter().zip([1000.0, 2000.0, 4000.0]) {
        assert_eq!(line["openmp_ns_per_task"].as_f64(), Some(base), "{line}");
        let ns = line["ns_per_task"].as_f64().unwrap();
        let ratio = line["ratio_vs_openmp"].as_f64().unwrap();
        assert!((ratio - ns / base).abs() < 0.001, "{line}");
    }
    let (code, out, err) = run(&two);
    assert_eq!(code, 0, "{err}");
    let got = lines(&out);
    assert_eq!(got[1]["openmp_ns_per_task"].as_f64(), Some(2000.0));
    assert!(got[2].get("openmp_ns_per_task").is_none(), "{out}");
    let (code, _, err) = run(&broken);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no team"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn include_dir_simpler_names_the_simpler_headers() {
    let (code, out, err) = pto(&["include-dir", "--simpler"]);
    assert_eq!(code, 0, "{err}");
    let dir = std::path::PathBuf::from(out.trim());
    for h in [
        "tensor.h",
        "intrinsic.h",
        "pto_orchestration_api.h",
        "pto_async_kernel_api.h",
        "platform_comm/comm_context.h",
    ] {
        assert!(dir.join(h).is_file(), "{} has no {h}", dir.display());
    }
    let (code, out, _) = pto(&["include-dir"]);
    assert_eq!(code, 0);
    assert!(std::path::Path::new(out.trim()).join("pto.h").is_file());
}
