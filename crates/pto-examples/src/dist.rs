//! Running an example on many ranks: on processes through the host Worker (each example's
//! Worker form, `worker_examples.rs`), or on threads, where every rank runs the example's rank
//! body with its communicator and its own chip and checks its part of the golden, and the
//! verdicts and traces are gathered here.

use std::time::{Duration, Instant};

use pto_comm::{Backend, Cause, Comm};
use serde_json::Value;

use crate::{Example, ExampleError, Outcome, RankState, RankStatus, RunArgs};

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

/// What a rank's body returned: its verdict, or its error and whose failure it is.
type RankResult = Result<RankOutcome, (Cause, String)>;

/// Every rank's verdict in one outcome. The detail leads with the root cause: the first rank
/// that failed on its own (else the first that failed at all), then the first mismatch.
fn gather(name: &str, n: usize, outcomes: Vec<RankResult>, wall: Duration) -> Outcome {
    let mut tasks = 0;
    let mut events = Vec::new();
    let mut ranks = Vec::with_capacity(n);
    for (r, o) in outcomes.into_iter().enumerate() {
        let (state, detail) = match o {
            Ok(o) => {
                tasks += o.tasks;
                events.extend(o.events);
                let state = if o.passed {
                    RankState::Passed
                } else {
                    RankState::Mismatch
                };
                (state, o.detail)
            }
            Err((Cause::Own, e)) => (RankState::Failed, e),
            Err((Cause::Peer, e)) => (RankState::Consequence, e),
            Err((Cause::Timeout, e)) => (RankState::TimedOut, e),
        };
        ranks.push(RankStatus {
            rank: r,
            state,
            detail,
        });
    }
    let lead = [
        RankState::Failed,
        RankState::TimedOut,
        RankState::Consequence,
        RankState::Mismatch,
    ]
    .iter()
    .find_map(|s| ranks.iter().find(|r| r.state == *s));
    let passed = ranks.len() == n && lead.is_none();
    let detail = match lead {
        Some(r) => format!("rank {}: {}", r.rank, r.detail),
        None if ranks.len() == n => format!("all {n} ranks match the golden of {name}"),
        None => format!("{} of {n} ranks reported", ranks.len()),
    };
    Outcome {
        passed,
        detail,
        wall,
        tasks,
        events,
        ranks,
    }
}

/// A rank body's error, with whose failure it is (judged by the communicator).
fn rank_error(comm: &Comm, e: &ExampleError) -> (Cause, String) {
    let text = e.to_string();
    let cause = match e {
        ExampleError::Comm(c) if c.cause() != Cause::Own => c.cause(),
        _ if own_failure(e) => Cause::Own,
        _ => comm.cause_of(&text),
    };
    (cause, text)
}

/// A failure that is this rank's own whatever happened elsewhere (a peer's wait may have timed
/// out on it first): one of its kernels did not finish (a stall), or failed with an error that
/// names no peer, deadline or abort.
fn own_failure(e: &ExampleError) -> bool {
    let run = match e {
        ExampleError::Run(r) | ExampleError::Plugin(pto_plugin::PluginError::Run(r)) => r,
        _ => return false,
    };
    match run {
        pto_core::RunError::Stalled { .. } => true,
        pto_core::RunError::TaskFailed { failure, .. } => {
            let m = &failure.message;
            ![
                "aborted by rank",
                "died",
                "exited",
                "failed",
                "timed out after",
                "has left",
            ]
            .iter()
            .any(|w| m.contains(w))
        }
        _ => false,
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
    run_local_with(ex.name, &|comm: &Comm| body(comm, args), n)
}

/// Runs `body` as every rank of `n` threads and gathers their verdicts under `name`.
///
/// # Errors
///
/// A bad rank count.
pub fn run_local_with(
    name: &str,
    body: &(dyn Fn(&Comm) -> Result<RankOutcome, ExampleError> + Sync),
    n: usize,
) -> Result<Outcome, ExampleError> {
    let t = Instant::now();
    let results = pto_comm::local::run(n, |comm| body(&comm).map_err(|e| rank_error(&comm, &e)))?;
    let outcomes = results
        .into_iter()
        .map(|r| r.map_err(|panic| (Cause::Own, panic)).and_then(|x| x))
        .collect();
    Ok(gather(name, n, outcomes, t.elapsed()))
}

/// Runs `ex` on `n` ranks: on processes (`shm`) through the host Worker, on threads (`local`)
/// with each rank's body; a single-chip example on its one chip.
///
/// # Errors
///
/// A rank count the example cannot use, or what the run reports.
pub fn run(ex: &Example, args: &RunArgs, n: usize) -> Result<Outcome, ExampleError> {
    ex.check_args(args, n)?;
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
        (Backend::Mpi, _, _) => Err(ExampleError::Args(format!(
            "{} on MPI runs one rank per process: start it under mpirun and call \
             pto_examples::dist::run_on with each rank's communicator (`pto run --backend mpi` does)",
            ex.name
        ))),
    }
}

/// Bytes per rank in the verdict exchange of [`run_on`].
const VERDICT: usize = 512;

/// Runs `ex`'s rank body on this rank of `comm` (any backend; the MPI backend's SPMD form),
/// then exchanges every rank's verdict, so that every rank returns the same [`Outcome`] for
/// all ranks; with `args.trace`, every rank's trace events too.
///
/// # Collective
///
/// Every rank of `comm` calls it.
///
/// # Errors
///
/// An example without a rank body, or a communication error in the exchange.
pub fn run_on(ex: &Example, comm: &Comm, args: &RunArgs) -> Result<Outcome, ExampleError> {
    let Some(body) = ex.ranks else {
        return Err(ExampleError::Args(format!(
            "{} has no rank body (it runs on one chip or only through the Worker)",
            ex.name
        )));
    };
    run_on_with(ex.name, |c| body(c, args), comm, args.trace)
}

/// Runs `body` as this rank of `comm`, then exchanges every rank's verdict as [`run_on`]
/// does, under `name`; with `trace`, every rank's trace events too.
///
/// # Collective
///
/// Every rank of `comm` calls it.
///
/// # Errors
///
/// A communication error in the exchange.
pub fn run_on_with(
    name: &str,
    body: impl FnOnce(&Comm) -> Result<RankOutcome, ExampleError>,
    comm: &Comm,
    trace: bool,
) -> Result<Outcome, ExampleError> {
    let t = Instant::now();
    let mine = body(comm);
    let wall = t.elapsed();
    // One fixed-size record per rank: state (0 mismatch, 1 passed, 2 failed, 3 failed because
    // of another rank, 4 a wait ran out), tasks, detail length, detail.
    let mut rec = vec![0u8; VERDICT];
    let (state, tasks, detail) = match &mine {
        Ok(o) => (u8::from(o.passed), o.tasks, o.detail.clone()),
        Err(e) => {
            let (cause, text) = rank_error(comm, e);
            let state = match cause {
                Cause::Own => 2,
                Cause::Peer => 3,
                Cause::Timeout => 4,
            };
            (state, 0, text)
        }
    };
    let text = detail.as_bytes();
    let n = text.len().min(VERDICT - 11);
    rec[0] = state;
    rec[1..9].copy_from_slice(&tasks.to_le_bytes());
    rec[9..11].copy_from_slice(&(n as u16).to_le_bytes());
    rec[11..11 + n].copy_from_slice(&text[..n]);
    let co = pto_comm::Collectives::new(comm, VERDICT * comm.size())?;
    let mut all = vec![0u8; VERDICT * comm.size()];
    co.allgather(&rec, &mut all)?;
    let outcomes = all
        .chunks(VERDICT)
        .map(|r| {
            let len = usize::from(u16::from_le_bytes([r[9], r[10]])).min(VERDICT - 11);
            let detail = String::from_utf8_lossy(&r[11..11 + len]).into_owned();
            let mut tasks = [0u8; 8];
            tasks.copy_from_slice(&r[1..9]);
            match r[0] {
                2 => Err((Cause::Own, detail)),
                3 => Err((Cause::Peer, detail)),
                4 => Err((Cause::Timeout, detail)),
                s => Ok(RankOutcome {
                    passed: s == 1,
                    detail,
                    tasks: u64::from_le_bytes(tasks),
                    events: Vec::new(),
                }),
            }
        })
        .collect();
    let mut out = gather(name, comm.size(), outcomes, wall);
    if trace {
        let events = mine.map(|o| o.events).unwrap_or_default();
        out.events = gather_events(&co, comm.size(), events)?;
    }
    // No rank leaves (and so looks gone to the others) while a peer may still be reading its
    // part of the last exchange.
    comm.barrier()?;
    Ok(out)
}

/// Every rank's trace events, in rank order (each rank's as JSON text, padded to the longest).
fn gather_events(
    co: &pto_comm::Collectives,
    n: usize,
    events: Vec<Value>,
) -> Result<Vec<Value>, ExampleError> {
    let text = serde_json::to_vec(&events).map_err(|e| ExampleError::Args(e.to_string()))?;
    let mut lens = vec![0u64; n];
    co.allgather(&[text.len() as u64], &mut lens)?;
    let width = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut mine = text;
    mine.resize(width, b' ');
    let mut all = vec![0u8; width * n];
    co.allgather(&mine, &mut all)?;
    let mut out = Vec::new();
    for chunk in all.chunks(width.max(1)).take(n) {
        let v: Vec<Value> =
            serde_json::from_slice(chunk).map_err(|e| ExampleError::Args(e.to_string()))?;
        out.extend(v);
    }
    Ok(out)
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
