//! `pto run <example>`: checks every argument before anything starts, runs the example, and
//! reports one verdict (text, or one JSON object with `--json`, also on failure) whose exit code
//! says what happened (see `crate::exit`).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use pto_comm::Backend;
use pto_examples::{ExitHook, Outcome, RankState};
use pto_worker::{ChildExit, ChildFailure, FailKind, RunFailure, WorkerError};
use serde_json::{json, Value};

use crate::cli::RunArgs;
use crate::exit::{self, Usage};

/// What `execute` ended with.
enum Flow {
    /// A verdict to report.
    Report(Outcome),
    /// Nothing more to report here (an MPI rank: rank 0 printed the job's report itself; or the
    /// launcher of an MPI job whose rank 0 reported): exit with this code.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Exit(ExitCode),
}

pub fn run(a: &RunArgs) -> anyhow::Result<ExitCode> {
    let rep = Reporter {
        example: a.example.clone(),
        ranks: a.ranks.unwrap_or(1),
        backend: a.backend.backend().name(),
        json: a.json,
        trace: a.trace.clone(),
    };
    if rep.json {
        exit::json_on_signal(&rep.example, Some(rep.ranks), rep.backend);
    }
    Ok(match execute(a, &rep) {
        Ok(Flow::Report(o)) => rep.outcome(&o),
        Ok(Flow::Exit(code)) => code,
        Err(e) => rep.error(&e),
    })
}

fn execute(a: &RunArgs, rep: &Reporter) -> anyhow::Result<Flow> {
    check_output_paths(a)?;
    if let Some(path) = &a.plugin {
        return execute_plugin(a, rep, path);
    }
    let Some(ex) = pto_examples::find(&a.example) else {
        let names: Vec<&str> = pto_examples::EXAMPLES.iter().map(|e| e.name).collect();
        return Err(Usage(format!(
            "no example named {:?}; the examples are: {}",
            a.example,
            names.join(", ")
        ))
        .into());
    };
    pto::config::check_all()?;
    let args = run_args(a)?;
    if args.backend == Backend::Mpi {
        return mpi::run(
            a,
            rep,
            |n| ex.check_args(&args, n),
            |comm| pto_examples::dist::run_on(ex, comm, &args),
        );
    }
    ex.check_args(&args, rep.ranks)
        .map_err(|e| Usage(e.to_string()))?;
    let args = prepare_local(rep, args);
    let o = with_progress(a, rep, &a.example, || {
        pto_examples::dist::run(ex, &args, rep.ranks)
    })?;
    write_trace(a, &o)?;
    Ok(Flow::Report(o))
}

/// `pto run --plugin LIB PROGRAM`: loads the plugin and runs its program on every rank.
fn execute_plugin(a: &RunArgs, rep: &Reporter, path: &std::path::Path) -> anyhow::Result<Flow> {
    pto::config::check_all()?;
    let plugin = pto_plugin::Plugin::load(path)?;
    if !plugin.has_program(&a.example) {
        let names: Vec<&str> = plugin.programs().collect();
        return Err(Usage(format!(
            "plugin {} has no program {:?}; its programs are: {}",
            plugin.path(),
            a.example,
            if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(", ")
            }
        ))
        .into());
    }
    let args = run_args(a)?;
    if args.backend == Backend::Mpi {
        let (p, name) = (&plugin, a.example.as_str());
        return mpi::run(
            a,
            rep,
            |_| Ok(()),
            |comm| pto_examples::plugin::run_on(p, name, comm, &args),
        );
    }
    let args = prepare_local(rep, args);
    let o = with_progress(a, rep, &a.example, || {
        pto_examples::plugin::run(&plugin, &a.example, &args, rep.ranks)
    })?;
    write_trace(a, &o)?;
    Ok(Flow::Report(o))
}

/// The run's options from the command line, after refusing a non-MPI backend under an MPI
/// launcher.
fn run_args(a: &RunArgs) -> anyhow::Result<pto_examples::RunArgs> {
    let backend = a.backend.backend();
    if backend != Backend::Mpi {
        if let Some((var, value)) = pto_comm::mpi_launcher() {
            return Err(Usage(format!(
                "this pto was started by an MPI launcher ({var}={value}) but --backend is {}: \
                 every rank would run a separate job of its own. Use --backend mpi, or run pto \
                 without mpirun (it starts its ranks itself)",
                backend.name()
            ))
            .into());
        }
    }
    Ok(pto_examples::RunArgs {
        size: a.chip.size,
        trace: a.trace.is_some() || a.dag.is_some(),
        cores: (a.chip.aic, a.chip.aiv),
        backend,
        on_child_exit: None,
    })
}

/// Before a run on this host: signals end every chip and remove every segment, stale segments
/// go, and a chip that dies while no run is in progress ends the command with the report.
fn prepare_local(rep: &Reporter, args: pto_examples::RunArgs) -> pto_examples::RunArgs {
    // A signal now ends every chip and removes every segment (exit 128 + signal).
    pto_shm::cleanup::install();
    // What a run killed with SIGKILL left behind (its creator is dead) goes now.
    let swept = pto_shm::sweep::sweep_stale();
    if !swept.removed.is_empty() {
        let bytes: u64 = swept.removed.iter().map(|s| s.bytes).sum();
        tracing::info!(
            segments = swept.removed.len(),
            bytes,
            "removed segments left by runs that died"
        );
    }
    let hook_rep = rep.clone();
    pto_examples::RunArgs {
        on_child_exit: Some(ExitHook(Arc::new(move |f: &ChildFailure| {
            let code = hook_rep.child_death(f);
            pto_shm::cleanup::terminate(i32::from(code))
        }))),
        ..args
    }
}

/// Runs `f` with a progress line on a terminal (quiet when output goes to a file or a pipe).
fn with_progress<T>(a: &RunArgs, rep: &Reporter, name: &str, f: impl FnOnce() -> T) -> T {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal() && !a.json;
    if tty {
        eprint!("running {name} on {} rank(s)...", rep.ranks);
    }
    let r = f();
    if tty {
        eprint!("\r\x1b[2K");
    }
    r
}

/// `--trace` and `--dag` are refused before the run when their folder does not exist (not
/// after a long run has been done for nothing).
fn check_output_paths(a: &RunArgs) -> anyhow::Result<()> {
    for (flag, path) in [("--trace", &a.trace), ("--dag", &a.dag)] {
        let Some(path) = path else { continue };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() {
            return Err(Usage(format!(
                "{flag} {}: the folder {} does not exist",
                path.display(),
                dir.display()
            ))
            .into());
        }
        if path.is_dir() {
            return Err(Usage(format!("{flag} {}: is a folder", path.display())).into());
        }
    }
    Ok(())
}

/// Writes every chip's trace events as one Chrome trace, and the task graph as Graphviz dot.
fn write_trace(a: &RunArgs, o: &Outcome) -> anyhow::Result<()> {
    if let Some(path) = &a.trace {
        let mut events = o.events.clone();
        events.extend(pto_core::trace::Trace::signal_flows(&o.events));
        let doc = json!({ "traceEvents": events, "displayTimeUnit": "ns" });
        std::fs::write(path, doc.to_string())
            .with_context(|| format!("writing the trace to {}", path.display()))?;
    }
    if let Some(path) = &a.dag {
        std::fs::write(path, dag_dot(&o.events))
            .with_context(|| format!("writing the task graph to {}", path.display()))?;
    }
    Ok(())
}

/// The task graph of a run's trace events in Graphviz dot: one cluster per chip (trace
/// process), a node per task (its kernel), an edge per dependency.
fn dag_dot(events: &[Value]) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut tasks: BTreeMap<u64, BTreeMap<u64, (String, Vec<u64>)>> = BTreeMap::new();
    for e in events {
        let Some(pid) = e["pid"].as_u64() else {
            continue;
        };
        if e["ph"] == "M" && e["name"] == "process_name" {
            names.insert(pid, e["args"]["name"].as_str().unwrap_or("").to_string());
        }
        if e["ph"] != "X" || e["cat"] != "task" {
            continue;
        }
        let (Some(task), Some(kernel)) = (e["args"]["task"].as_u64(), e["name"].as_str()) else {
            continue;
        };
        let deps = e["args"]["deps"]
            .as_array()
            .map(|d| d.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        tasks
            .entry(pid)
            .or_default()
            .entry(task)
            .or_insert((kernel.to_string(), deps));
    }
    let mut s = String::from("digraph pto {\n  rankdir=LR;\n  node [shape=box];\n");
    for (pid, ts) in &tasks {
        let label = names
            .get(pid)
            .cloned()
            .unwrap_or_else(|| format!("process {pid}"));
        let _ = writeln!(s, "  subgraph cluster_{pid} {{\n    label={label:?};");
        for (t, (k, _)) in ts {
            let _ = writeln!(s, "    p{pid}_t{t} [label={:?}];", format!("#{t} {k}"));
        }
        for (t, (_, deps)) in ts {
            for d in deps {
                let _ = writeln!(s, "    p{pid}_t{d} -> p{pid}_t{t};");
            }
        }
        s.push_str("  }\n");
    }
    s.push_str("}\n");
    s
}

/// Prints verdicts: a text report, or one JSON object.
#[derive(Clone)]
struct Reporter {
    example: String,
    ranks: usize,
    backend: &'static str,
    json: bool,
    trace: Option<std::path::PathBuf>,
}

fn state_word(s: RankState) -> &'static str {
    match s {
        RankState::Passed => "passed",
        RankState::Mismatch => "mismatch",
        RankState::Failed => "failed",
        RankState::Consequence => "consequence",
        RankState::TimedOut => "timed_out",
    }
}

fn child_json(f: &ChildFailure, chips: usize, root: bool) -> Value {
    let rank = f
        .who
        .strip_prefix("chip ")
        .and_then(|r| r.parse::<usize>().ok())
        .filter(|&r| r < chips);
    let (state, exit) = match &f.kind {
        FailKind::Task => ("failed", Value::Null),
        FailKind::Consequence => ("consequence", Value::Null),
        FailKind::TimedOut => ("timed_out", Value::Null),
        FailKind::Stopped => ("stopped", Value::Null),
        FailKind::NoAnswer => ("no_answer", Value::Null),
        FailKind::Died(ChildExit::Code(c)) => ("died", json!({ "code": c })),
        FailKind::Died(ChildExit::Signal(s)) => (
            "died",
            json!({ "signal": s, "name": pto_worker::signal_name(*s) }),
        ),
        FailKind::Died(ChildExit::Unknown) => ("died", Value::Null),
    };
    json!({
        "rank": rank, "who": f.who, "pid": f.pid, "state": state, "exit": exit,
        "message": f.message, "root_cause": root,
    })
}

/// `writeln!` into a report's `String` (which cannot fail).
macro_rules! wln {
    ($out:expr, $($t:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($t)*);
    }};
}

/// Writes a report to standard output. A failed write makes a passing run's exit code the
/// write's (141, quietly, when the reader of a pipe left; 4 with a message otherwise); a failed
/// run keeps its own.
fn write_report(code: u8, text: &str) -> u8 {
    use std::io::Write as _;
    // A signal ending the process already prints its own object (`--json`).
    let Some(_report) = pto_shm::cleanup::FinalReport::begin() else {
        return code;
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => code,
        Err(e) => {
            let e = exit::stdout_failed(e);
            if code != 0 {
                code
            } else if e.is::<exit::StdoutClosed>() {
                exit::STDOUT_CLOSED
            } else {
                pto_shm::eprint_line!("pto: {e:#}");
                exit::code_of(&e)
            }
        }
    }
}

/// The exit code of a finished run: 0 passed, 1 a wrong result (some rank's part did not match
/// its golden and none failed), 3 a rank that failed, timed out or failed because of another.
pub(super) fn verdict_code(o: &Outcome) -> u8 {
    let failed = o.ranks.iter().any(|r| {
        matches!(
            r.state,
            RankState::Failed | RankState::Consequence | RankState::TimedOut
        )
    });
    if o.passed {
        0
    } else if failed {
        exit::RUNTIME
    } else {
        exit::WRONG_RESULT
    }
}

impl Reporter {
    fn head(&self, verdict: &str) -> String {
        format!(
            "{} on {} rank(s) ({}): {verdict}",
            self.example, self.ranks, self.backend
        )
    }

    /// Prints a finished run's verdict: 0 on a match, 1 on a mismatch, 3 when a rank failed.
    fn outcome(&self, o: &Outcome) -> ExitCode {
        let code = verdict_code(o);
        let mut out = String::new();
        let wall_ms = (o.wall.as_secs_f64() * 1e6).round() / 1e3;
        if self.json {
            // The root cause leads, as the outcome's detail does: the first rank that failed
            // on its own, else timed out, else failed because of another, else mismatched.
            let root = [
                RankState::Failed,
                RankState::TimedOut,
                RankState::Consequence,
                RankState::Mismatch,
            ]
            .iter()
            .find_map(|s| o.ranks.iter().find(|r| r.state == *s))
            .map(|r| r.rank);
            let entry = |r: &pto_examples::RankStatus| {
                json!({
                    "rank": r.rank, "who": format!("rank {}", r.rank),
                    // Ranks that ran in this process (threads) or reported through it.
                    "pid": std::process::id(), "state": state_word(r.state), "exit": Value::Null,
                    "message": r.detail, "root_cause": Some(r.rank) == root,
                })
            };
            let ranks: Vec<Value> = o.ranks.iter().map(entry).collect();
            let root_cause = root
                .and_then(|k| o.ranks.iter().find(|r| r.rank == k))
                .map_or(Value::Null, entry);
            let error = (!o.passed).then(|| {
                json!({
                    "kind": exit::kind(code), "message": o.detail,
                    "root_cause": root_cause, "ranks": ranks,
                })
            });
            wln!(
                out,
                "{}",
                json!({
                    "example": self.example, "ranks": self.ranks, "backend": self.backend,
                    "passed": o.passed, "wall_ms": wall_ms, "tasks": o.tasks,
                    "exit_code": code, "error": error,
                })
            );
            if !o.passed {
                pto_shm::eprint_line!("pto: {}: {}", self.example, o.detail);
            }
        } else {
            let verdict = match code {
                0 => "PASSED".to_string(),
                exit::WRONG_RESULT => "FAILED (wrong result)".to_string(),
                _ => format!("FAILED (runtime failure, exit {code})"),
            };
            wln!(
                out,
                "{} ({} tasks, {wall_ms:.2} ms): {}",
                self.head(&verdict),
                o.tasks,
                o.detail
            );
            if !o.passed {
                for r in o.ranks.iter().filter(|r| r.state != RankState::Passed) {
                    wln!(
                        out,
                        "  rank {} {}: {}",
                        r.rank,
                        state_word(r.state),
                        r.detail
                    );
                }
            }
            if let (Some(p), true) = (&self.trace, o.passed) {
                wln!(out, "trace written to {}", p.display());
            }
        }
        exit::code(write_report(code, &out))
    }

    /// Prints a run that ended in an error; the exit code comes from the error's kind.
    fn error(&self, e: &anyhow::Error) -> ExitCode {
        let code = exit::code_of(e);
        let failure = e
            .chain()
            .find_map(|c| c.downcast_ref::<pto_examples::ExampleError>())
            .and_then(|x| match x {
                pto_examples::ExampleError::Worker(w) => w.failures(),
                _ => None,
            })
            .or_else(|| {
                e.chain()
                    .find_map(|c| c.downcast_ref::<WorkerError>())
                    .and_then(WorkerError::failures)
            });
        exit::code(self.print_error(code, &format!("{e:#}"), failure))
    }

    /// Prints a failed run's report; the exit code (`code`, or the failed write's).
    fn print_error(&self, code: u8, message: &str, failure: Option<&RunFailure>) -> u8 {
        let mut out = String::new();
        if self.json {
            let (root, ranks) = match failure {
                Some(f) => (
                    child_json(&f.root, self.ranks, true),
                    f.all()
                        .enumerate()
                        .map(|(i, c)| child_json(c, self.ranks, i == 0))
                        .collect(),
                ),
                None => (Value::Null, Vec::new()),
            };
            wln!(
                out,
                "{}",
                json!({
                    "example": self.example, "ranks": self.ranks, "backend": self.backend,
                    "passed": false, "wall_ms": Value::Null, "tasks": Value::Null,
                    "exit_code": code,
                    "error": {
                        "kind": exit::kind(code), "message": message,
                        "root_cause": root, "ranks": ranks,
                    },
                })
            );
            pto_shm::eprint_line!("pto: {message}");
        } else {
            let what = match code {
                exit::USAGE => "usage error",
                exit::ENVIRONMENT => "environment",
                _ => "runtime failure",
            };
            match failure {
                Some(f) => {
                    let mut text = format!(
                        "{}\n  root cause: {}",
                        self.head(&format!("FAILED ({what}, exit {code})")),
                        f.root
                    );
                    for o in &f.others {
                        text.push_str(&format!("\n  then: {o}"));
                    }
                    if let Some(h) = &f.host {
                        text.push_str(&format!("\n  host run: {h}"));
                    }
                    wln!(out, "{text}");
                }
                None if code != exit::USAGE => {
                    wln!(
                        out,
                        "{}: {message}",
                        self.head(&format!("FAILED ({what}, exit {code})"))
                    );
                }
                None => {}
            }
            // The report is on stdout; the error in one line on stderr too.
            pto_shm::eprint_line!("pto: {message}");
        }
        write_report(code, &out)
    }

    /// A chip died between runs (the watcher's hook): report it; the caller exits 3.
    fn child_death(&self, f: &ChildFailure) -> u8 {
        let report = RunFailure::from_failures(vec![f.clone()]);
        self.print_error(exit::RUNTIME, &f.to_string(), report.as_ref())
    }
}

#[cfg(not(feature = "mpi"))]
mod mpi {
    use super::*;

    pub fn run(
        _: &RunArgs,
        _: &Reporter,
        _: impl Fn(usize) -> Result<(), pto_examples::ExampleError>,
        _: impl FnOnce(&pto_comm::Comm) -> Result<Outcome, pto_examples::ExampleError>,
    ) -> anyhow::Result<Flow> {
        Err(crate::exit::no_mpi())
    }
}

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;

    /// Under `mpirun`, this process is one rank: `check` the job's size, run `body` (its part,
    /// with the verdicts exchanged), and report on rank 0. Outside `mpirun`, start
    /// `mpirun -n <ranks>` on this same command.
    ///
    /// Ranks whose part ended with a verdict wait (a barrier) until rank 0 has printed its
    /// report: `mpirun` ends the whole job as soon as one rank exits with an error code, which
    /// would otherwise cut rank 0 off before its report of a failed job. A rank whose part
    /// failed outright exits at once (its peers may be unable to meet it).
    pub fn run(
        a: &RunArgs,
        rep: &Reporter,
        check: impl Fn(usize) -> Result<(), pto_examples::ExampleError>,
        body: impl FnOnce(&pto_comm::Comm) -> Result<Outcome, pto_examples::ExampleError>,
    ) -> anyhow::Result<Flow> {
        if !pto_comm::mpi::detected() {
            check(a.ranks.unwrap_or(1)).map_err(|e| Usage(e.to_string()))?;
            return crate::command::mpi_launch::relaunch(a.ranks.unwrap_or(1)).map(Flow::Exit);
        }
        let comm = pto_comm::mpi::init().context("starting MPI")?;
        if let Some(n) = a.ranks.filter(|&n| n != comm.size()) {
            return Err(Usage(format!(
                "--ranks {n}, but mpirun started {} ranks (rank {})",
                comm.size(),
                comm.rank()
            ))
            .into());
        }
        check(comm.size()).map_err(|e| Usage(e.to_string()))?;
        let result = body(&comm);
        // A failed barrier (a peer gone meanwhile) changes nothing: this rank exits with its
        // code either way.
        let wait_for_report = || {
            let _ = comm.barrier();
        };
        if comm.rank() == 0 {
            let reported = result
                .map_err(anyhow::Error::from)
                .and_then(|o| write_trace(a, &o).map(|()| o));
            let code = match &reported {
                Ok(o) => rep.outcome(o),
                Err(e) => rep.error(e),
            };
            if reported.is_ok() {
                wait_for_report();
            }
            return Ok(Flow::Exit(code));
        }
        if result.is_ok() {
            wait_for_report();
        }
        // Rank 0 reports for everyone; the others say only how their own part went.
        Ok(Flow::Exit(match result {
            Ok(o) if o.passed => ExitCode::SUCCESS,
            Ok(o)
                if o.ranks.iter().any(|r| r.state == RankState::Mismatch)
                    && !o.ranks.iter().any(|r| {
                        matches!(
                            r.state,
                            RankState::Failed | RankState::Consequence | RankState::TimedOut
                        )
                    }) =>
            {
                exit::code(exit::WRONG_RESULT)
            }
            Ok(_) => exit::code(exit::RUNTIME),
            Err(e) => {
                pto_shm::eprint_line!("pto: rank {}: {e}", comm.rank());
                exit::code(exit::of_fault(e.fault()))
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pto_examples::RankStatus;

    fn outcome(passed: bool, states: &[RankState]) -> Outcome {
        Outcome {
            passed,
            detail: String::new(),
            wall: std::time::Duration::ZERO,
            tasks: 0,
            events: Vec::new(),
            ranks: states
                .iter()
                .enumerate()
                .map(|(rank, &state)| RankStatus {
                    rank,
                    state,
                    detail: String::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_mismatch_is_a_wrong_result_and_a_failure_is_a_runtime_failure() {
        use RankState::*;
        assert_eq!(verdict_code(&outcome(true, &[Passed, Passed])), 0);
        assert_eq!(verdict_code(&outcome(false, &[Passed, Mismatch])), 1);
        assert_eq!(verdict_code(&outcome(false, &[])), 1);
        assert_eq!(verdict_code(&outcome(false, &[Mismatch, Failed])), 3);
        assert_eq!(verdict_code(&outcome(false, &[Consequence, Passed])), 3);
        assert_eq!(verdict_code(&outcome(false, &[TimedOut])), 3);
    }
}
