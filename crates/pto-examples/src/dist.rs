//! Running an example on many ranks: on processes through the host Worker (each example's
//! Worker form, `worker_examples.rs`), or on threads, where every rank runs the example's rank
//! body with its communicator and its own chip and checks its part of the golden, and the
//! verdicts and traces are gathered here.

use std::time::{Duration, Instant};

use pto_comm::{Backend, Comm};
use serde_json::Value;

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

/// Runs `ex` on `n` ranks: on processes (`shm`) through the host Worker, on threads (`local`)
/// with each rank's body; a single-chip example on its one chip.
///
/// # Errors
///
/// A rank count the example cannot use, or what the run reports.
pub fn run(ex: &Example, args: &RunArgs, n: usize) -> Result<Outcome, ExampleError> {
    match (args.backend, ex.worker, ex.ranks) {
        (_, None, None) => {
            if n != 1 {
                return Err(ExampleError::Args(format!(
                    "{} runs on one chip; --ranks must be 1",
                    ex.name
                )));
            }
            (ex.run)(args)
        }
        (Backend::Shm, Some(worker), _) => worker(args, n),
        (Backend::Local, _, Some(body)) => run_local(ex, body, args, n),
        (Backend::Local, Some(_), None) => Err(ExampleError::Args(format!(
            "{} runs its chips as processes: use --backend shm",
            ex.name
        ))),
        (Backend::Shm, None, Some(_)) => Err(ExampleError::Args(format!(
            "{} has no process form: use --backend local",
            ex.name
        ))),
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
