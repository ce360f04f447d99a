//! Running an example on many ranks: threads (`local`) or processes (`shm`).
//!
//! Every rank runs the example's rank body with its communicator and checks its own part of
//! the golden; the launcher gathers the verdicts. Processes report through small JSON files in
//! a directory the launcher owns (and removes), and their traces are merged into one Chrome
//! trace: one process per chip, one thread per core, one clock.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pto_comm::shm::ShmWorld;
use pto_comm::{Backend, Comm};
use serde_json::{json, Value};

use crate::{Example, ExampleError, Outcome, RunArgs};

/// One rank's verdict.
#[derive(Clone, Debug, Default)]
pub struct RankOutcome {
    /// True when this rank's part matched the golden.
    pub passed: bool,
    /// What was checked, or the first mismatch.
    pub detail: String,
    /// Tasks this rank's chip ran.
    pub tasks: u64,
    /// This rank's chip trace as Chrome trace events (empty unless asked for).
    pub events: Vec<Value>,
}

/// A rank body: runs on every rank.
pub type RankFn = fn(&Comm, &RunArgs) -> Result<RankOutcome, ExampleError>;

fn gather(
    ex: &Example,
    n: usize,
    outcomes: Vec<Result<RankOutcome, String>>,
    wall: Duration,
) -> Outcome {
    let mut passed = outcomes.len() == n;
    let mut detail = None;
    let mut tasks = 0;
    let mut events = Vec::new();
    for (r, o) in outcomes.into_iter().enumerate() {
        match o {
            Ok(o) => {
                tasks += o.tasks;
                if !o.passed {
                    passed = false;
                    detail.get_or_insert(format!("rank {r}: {}", o.detail));
                }
                events.extend(o.events);
            }
            Err(e) => {
                passed = false;
                detail.get_or_insert(format!("rank {r}: {e}"));
            }
        }
    }
    Outcome {
        passed,
        detail: detail.unwrap_or_else(|| format!("all {n} ranks match the golden of {}", ex.name)),
        wall,
        tasks,
        events,
    }
}

/// Runs a rank example on `n` threads.
///
/// # Errors
///
/// A bad rank count.
pub fn run_local(
    ex: &Example,
    body: RankFn,
    args: &RunArgs,
    n: usize,
) -> Result<Outcome, ExampleError> {
    let t = Instant::now();
    let results = pto_comm::local::run(n, |comm| body(&comm, args).map_err(|e| e.to_string()))?;
    let outcomes = results.into_iter().map(|r| r.and_then(|x| x)).collect();
    Ok(gather(ex, n, outcomes, t.elapsed()))
}

/// Environment carrying the run arguments to rank processes.
const ENV_OUT: &str = "PTO_EXAMPLE_OUT";
const ENV_ARGS: &str = "PTO_EXAMPLE_ARGS";

/// Runs a rank example on `n` processes made by `command(rank)` (each must end up calling
/// [`rank_main`] with the example's name).
///
/// # Errors
///
/// A bad rank count, a failure to create the world or to start a process.
pub fn run_shm(
    ex: &Example,
    args: &RunArgs,
    n: usize,
    command: &dyn Fn(usize) -> Command,
) -> Result<Outcome, ExampleError> {
    let t = Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "pto-example-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| ExampleError::Args(format!("{}: {e}", dir.display())))?;
    let result = (|| {
        let mut world = ShmWorld::create(n)?;
        let a = json!({"size": args.size, "trace": args.trace, "aic": args.cores.0, "aiv": args.cores.1});
        for r in 0..n {
            let mut cmd = command(r);
            cmd.env(ENV_OUT, &dir).env(ENV_ARGS, a.to_string());
            world.spawn(r, cmd)?;
        }
        let statuses = world.wait(Duration::from_secs(600))?;
        let outcomes = (0..n)
            .map(|r| {
                let st = statuses.iter().find(|(x, _)| *x == r).map(|(_, s)| *s);
                read_outcome(&dir, r).map_err(|e| match st {
                    Some(s) if !s.success() => format!("process exited with {s} ({e})"),
                    _ => e,
                })
            })
            .collect();
        Ok(gather(ex, n, outcomes, t.elapsed()))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn read_outcome(dir: &Path, r: usize) -> Result<RankOutcome, String> {
    let text = std::fs::read_to_string(dir.join(format!("rank{r}.json")))
        .map_err(|e| format!("no verdict: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if let Some(err) = v["error"].as_str() {
        return Err(err.to_string());
    }
    Ok(RankOutcome {
        passed: v["passed"].as_bool().unwrap_or(false),
        detail: v["detail"].as_str().unwrap_or("").to_string(),
        tasks: v["tasks"].as_u64().unwrap_or(0),
        events: v["events"].as_array().cloned().unwrap_or_default(),
    })
}

/// The body of a rank process: joins the world from the environment, runs `name`'s rank body,
/// and writes its verdict for the launcher. Returns the process exit code (0 on a match).
pub fn rank_main(name: &str) -> i32 {
    let out = std::env::var(ENV_OUT).map(PathBuf::from);
    let write = |r: usize, v: serde_json::Value| {
        if let Ok(dir) = &out {
            let _ = std::fs::write(dir.join(format!("rank{r}.json")), v.to_string());
        }
    };
    let comm = match pto_comm::shm::from_env() {
        Ok(Some(c)) => c,
        Ok(None) => {
            eprintln!("not started as a rank (no {})", pto_comm::shm::ENV_WORLD);
            return 2;
        }
        Err(e) => {
            eprintln!("joining the world: {e}");
            return 2;
        }
    };
    let r = comm.rank();
    let args: serde_json::Value = std::env::var(ENV_ARGS)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let args = RunArgs {
        size: args["size"].as_u64().map(|v| v as usize),
        trace: args["trace"].as_bool().unwrap_or(false),
        cores: (
            args["aic"].as_u64().unwrap_or(2) as u32,
            args["aiv"].as_u64().unwrap_or(4) as u32,
        ),
        backend: Backend::Shm,
    };
    let Some(body) = crate::find(name).and_then(|e| e.ranks) else {
        write(
            r,
            json!({"error": format!("no distributed example named {name:?}")}),
        );
        return 2;
    };
    match body(&comm, &args) {
        Ok(o) => {
            write(
                r,
                json!({"passed": o.passed, "detail": o.detail, "tasks": o.tasks, "events": o.events}),
            );
            i32::from(!o.passed)
        }
        Err(e) => {
            write(r, json!({"error": e.to_string()}));
            eprintln!("rank {r}: {e}");
            2
        }
    }
}

/// Runs `ex` on `n` ranks of `backend`; for shm, `command(rank)` makes each rank's process.
///
/// # Errors
///
/// As [`run_local`] and [`run_shm`].
pub fn run(
    ex: &Example,
    args: &RunArgs,
    n: usize,
    command: &dyn Fn(usize) -> Command,
) -> Result<Outcome, ExampleError> {
    // With processes (the shm backend), an example that has a Worker form runs through the
    // host Worker: one forked process per chip, host orchestration, host-side golden check.
    if let Some(w) = ex.worker {
        if args.backend == Backend::Shm {
            return w(args, n);
        }
        if ex.ranks.is_none() {
            return Err(ExampleError::Args(format!(
                "{} runs its chips as processes: use --backend shm",
                ex.name
            )));
        }
    }
    match (ex.ranks, args.backend) {
        (None, _) => {
            if n != 1 {
                return Err(ExampleError::Args(format!(
                    "{} runs on one chip; --ranks must be 1",
                    ex.name
                )));
            }
            (ex.run)(args)
        }
        (Some(body), Backend::Local) => run_local(ex, body, args, n),
        (Some(_), Backend::Shm) => run_shm(ex, args, n, command),
    }
}

/// The `run` entry of a distributed example: it needs ranks.
///
/// # Errors
///
/// Always: run it through [`run`].
pub fn needs_ranks(_: &RunArgs) -> Result<Outcome, ExampleError> {
    Err(ExampleError::Args(
        "a distributed example runs through pto_examples::dist::run".into(),
    ))
}
