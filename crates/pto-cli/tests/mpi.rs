//! `pto run <example> --backend mpi` end to end (cargo feature `mpi`): every distributed
//! example under `mpirun -n 2` and `-n 4` (started by pto itself), with shared windows and with
//! RMA windows, each checked against its golden by every rank and reported once by rank 0.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn pto(args: &[&str], windows: &str) -> (i32, String, String) {
    common::pto_with(
        args,
        &[
            ("PTO_MPI_WINDOWS", windows),
            ("PTO_WAIT_TIMEOUT_MS", "20000"),
        ],
    )
}

/// One distributed example under `mpirun -n 2` and `-n 4`, checked by rank 0's one report.
fn one_example(name: &str, windows: &str) {
    for n in [2, 4] {
        let n_s = n.to_string();
        let (code, out, err) = pto(
            &["run", name, "--backend", "mpi", "--ranks", &n_s, "--json"],
            windows,
        );
        assert_eq!(code, 0, "{name} on {n} ranks ({windows}): {out}\n{err}");
        // Rank 0 alone reports.
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{name} on {n}: {out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["passed"], true, "{out}");
        assert_eq!(v["backend"], "mpi");
        assert_eq!(v["ranks"], n);
    }
}

/// A test per distributed example and window kind: each runs four MPI jobs, which on a loaded
/// 2-CPU machine take up to half a minute (all examples in one test took 117 s there).
macro_rules! every_distributed_example {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn on_2_and_4_ranks_shared_windows() {
                    super::one_example(stringify!($name), "shared");
                }

                #[test]
                fn on_2_and_4_ranks_rma_windows() {
                    super::one_example(stringify!($name), "rma");
                }
            }
        )*

        const LISTED: &[&str] = &[$(stringify!($name)),*];
    };
}

every_distributed_example!(
    deferred_notify,
    async_notify,
    allreduce_distributed,
    allgather,
    reduce_scatter,
    broadcast,
    all_to_all,
    ffn_tp_parallel,
    domain_rank_map,
    dual_domain_overlap,
);

#[test]
fn every_distributed_example_has_its_mpi_tests() {
    let mut want: Vec<&str> = pto_examples::EXAMPLES
        .iter()
        .filter(|e| e.ranks.is_some())
        .map(|e| e.name)
        .collect();
    let mut have = LISTED.to_vec();
    want.sort_unstable();
    have.sort_unstable();
    assert_eq!(
        have, want,
        "list every distributed example in every_distributed_example!"
    );
}

#[test]
fn a_rank_count_that_disagrees_with_mpirun_is_an_error() {
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(env!("CARGO_BIN_EXE_pto"))
        .args(["run", "ffn_tp_parallel", "--backend", "mpi", "--ranks", "3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--ranks 3, but mpirun started 2 ranks"),
        "{err}"
    );
}

#[test]
fn text_output_names_the_backend_and_the_golden() {
    let (code, out, err) = pto(
        &[
            "run",
            "allreduce_distributed",
            "--backend",
            "mpi",
            "--ranks",
            "2",
        ],
        "shared",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("allreduce_distributed on 2 rank(s) (mpi): PASSED")
            && out.contains("all 2 ranks match the golden"),
        "{out}"
    );
}

#[test]
fn a_trace_holds_every_ranks_chip() {
    let path = std::env::temp_dir().join(format!("pto-mpi-trace-{}.json", std::process::id()));
    let p = path.to_string_lossy().into_owned();
    let (code, out, err) = pto(
        &[
            "run",
            "ffn_tp_parallel",
            "--backend",
            "mpi",
            "--ranks",
            "2",
            "--trace",
            &p,
        ],
        "shared",
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    let events = doc["traceEvents"].as_array().unwrap();
    for rank in 0..2 {
        assert!(
            events
                .iter()
                .any(|e| e["pid"] == rank + 1 && e["name"] == "matmul"),
            "no matmul of rank {rank} in {events:?}"
        );
    }
}

#[test]
fn under_mpirun_without_backend_mpi_every_rank_says_so_and_stops() {
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(env!("CARGO_BIN_EXE_pto"))
        .args(["run", "ffn_tp_parallel"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("use --backend mpi") || err.contains("Use --backend mpi"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("PASSED"));
}

#[test]
fn a_missing_launcher_is_an_environment_error_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_pto"))
        .args(["run", "ffn_tp_parallel", "--backend", "mpi", "--ranks", "2"])
        .env("PTO_MPIRUN", "/nonexistent/mpirun --verbose")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/mpirun"), "{err}");
}

#[test]
fn mpiexec_names_the_launcher_and_the_open_mpi_settings_are_told() {
    let dir = std::env::temp_dir().join(format!("pto-mpiexec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let used = dir.join("used");
    let script = dir.join("my-mpiexec");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" > {}\nexec mpirun \"$@\"\n",
            used.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let n = (cpus + 1).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_pto"))
        .args(["run", "ffn_tp_parallel", "--backend", "mpi", "--ranks", &n])
        .env_remove("PTO_MPIRUN")
        .env_remove("OMPI_ALLOW_RUN_AS_ROOT")
        .env_remove("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
        .env_remove("OMPI_MCA_rmaps_base_oversubscribe")
        .env("MPIEXEC", &script)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let args = std::fs::read_to_string(&used).unwrap_or_default();
    assert!(
        args.starts_with(&format!("-n {n} ")),
        "MPIEXEC not used: {args:?}"
    );
    assert!(err.contains("OMPI_MCA_rmaps_base_oversubscribe=1"), "{err}");
    if rustix::process::getuid().is_root() {
        assert!(err.contains("OMPI_ALLOW_RUN_AS_ROOT=1"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sigint_sigterm_and_sighup_end_mpirun_and_every_rank() {
    use rustix::process::Signal;
    for (sig, code) in [(Signal::INT, 130), (Signal::TERM, 143), (Signal::HUP, 129)] {
        a_signal_ends_mpirun_and_every_rank(sig, code);
    }
}

fn a_signal_ends_mpirun_and_every_rank(sig: rustix::process::Signal, code: i32) {
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_pto"))
        .args([
            "run",
            "allreduce_distributed",
            "--backend",
            "mpi",
            "--ranks",
            "3",
            "--size",
            "10000000",
            "-q",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Wait until mpirun has started the ranks (three `pto` processes under it).
    let ranks = |ppid: u32| -> Vec<u32> {
        common::children_of(ppid)
            .into_iter()
            .filter(|&p| common::cmdline(p).iter().any(|a| a.contains("pto")))
            .collect()
    };
    let t = Instant::now();
    let (launcher, pids) = loop {
        // Not the janitor of pto's own segments, if it made any.
        let launcher: Option<u32> = common::children_of(pid)
            .into_iter()
            .find(|&p| !common::cmdline(p).iter().any(|a| a == "pto-janitor"));
        if let Some(m) = launcher {
            let r = ranks(m);
            if r.len() >= 3 {
                break (m, r);
            }
        }
        assert!(t.elapsed() < Duration::from_secs(20), "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(200));
    let sent = Instant::now();
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
        .unwrap();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(sent.elapsed() < Duration::from_secs(10), "pto did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(code), "{sig:?}");
    let alive = common::alive;
    while (alive(launcher) || pids.iter().any(|&p| alive(p)))
        && sent.elapsed() < Duration::from_secs(2)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive(launcher), "mpirun still runs 2 s after {sig:?}");
    let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        left.is_empty(),
        "ranks still run 2 s after {sig:?}: {left:?}"
    );
}

#[path = "common/mod.rs"]
mod common;

/// The C plugin's `program` under `mpirun` on each of `ranks`, with `windows` windows.
fn plugin_ring(program: &str, windows: &str, ranks: &[&str]) {
    let p = common::build_plugin("examples/plugin/ring.c", &[]);
    let path = p.path.display().to_string();
    for &n in ranks {
        let (code, out, err) = pto(
            &[
                "run",
                "--plugin",
                &path,
                program,
                "--backend",
                "mpi",
                "--ranks",
                n,
                "--json",
            ],
            windows,
        );
        assert_eq!(code, 0, "{program} on {n} ({windows}): {out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["passed"], true, "{out}");
    }
}

#[test]
fn a_c_plugins_ring_program_on_1_to_8_mpi_ranks_shared_windows() {
    plugin_ring("ring", "shared", &["1", "2", "4", "8"]);
}

#[test]
fn a_c_plugins_blocking_ring_program_on_1_to_8_mpi_ranks_shared_windows() {
    plugin_ring("ring_blocking", "shared", &["1", "2", "4", "8"]);
}

#[test]
fn a_c_plugins_ring_programs_on_2_and_4_mpi_ranks_rma_windows() {
    plugin_ring("ring", "rma", &["2", "4"]);
    plugin_ring("ring_blocking", "rma", &["2", "4"]);
}

#[test]
fn a_failing_c_plugin_kernel_fails_the_mpi_job() {
    // A failing kernel fails the job, named by rank 0's report.
    let f = common::build_plugin("crates/pto-cli/tests/plugins/cases.c", &[]);
    let fpath = f.path.display().to_string();
    let (code, out, err) = pto(
        &[
            "run",
            "--plugin",
            &fpath,
            "fail",
            "--backend",
            "mpi",
            "--ranks",
            "2",
        ],
        "shared",
    );
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(out.contains("boom: value 42 is wrong"), "{out}\n{err}");
}

#[test]
fn bench_check_under_mpi_exits_one_on_a_wrong_element() {
    let run = |inject: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pto"));
        c.args([
            "bench",
            "allgather",
            "--backend",
            "mpi",
            "--ranks",
            "2",
            "-b",
            "64",
            "-e",
            "64",
            "--iters",
            "2",
            "--check",
            "--json",
        ])
        .env("PTO_WAIT_TIMEOUT_MS", "20000");
        if inject {
            c.env("PTO_BENCH_INJECT_WRONG", "1");
        }
        let out = c.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(true);
    assert_eq!(code, 1, "a wrong result exits 1:\n{out}\n{err}");
    assert!(out.contains("\"wrong\":1"), "{out}");
    assert!(err.contains("wrong result"), "{err}");
    let (code, out, err) = run(false);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("\"wrong\":0"), "{out}");
}
