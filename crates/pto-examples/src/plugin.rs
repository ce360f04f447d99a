//! Running a C plugin's program (`pto_plugin`) on every backend, the way the examples run:
//! on processes (`shm`) through the host Worker, on threads (`local`) with each rank's own
//! chip, and as one rank of an MPI job ([`run_on`]). A plugin program has no golden here: it
//! passes when every rank's program finished without a failed task (its kernels check their
//! results and call `pto_fail`).

use std::time::Instant;

use pto_comm::{Backend, Comm};
use pto_core::TaskArgs;
use pto_plugin::Plugin;

use crate::dist::{run_local_with, run_on_with, RankOutcome};
use crate::{ExampleError, Outcome, RunArgs};

fn check(plugin: &Plugin, program: &str, args: &RunArgs, n: usize) -> Result<(), ExampleError> {
    if !plugin.has_program(program) {
        // The error that names the plugin and its programs.
        plugin.orchestration(program).map(drop)?;
    }
    // Kernel names that clash with the built-ins are refused once, before any rank starts.
    plugin.registry()?;
    if n == 0 || n > pto_comm::MAX_RANKS {
        return Err(ExampleError::Args(format!(
            "--ranks {n}: 1 to {}",
            pto_comm::MAX_RANKS
        )));
    }
    let (aic, aiv) = args.cores;
    for (k, kind) in plugin.kernels() {
        let ok = match kind {
            pto_core::CoreKind::Aic => aic > 0,
            pto_core::CoreKind::Aiv => aiv > 0,
            pto_core::CoreKind::Mix => aic > 0 && aiv > 0,
        };
        if !ok {
            tracing::warn!(kernel = k, %kind, aic, aiv, "a plugin kernel has no core to run on: a task of it will fail");
        }
    }
    Ok(())
}

fn rank_body(
    plugin: &Plugin,
    program: &str,
    args: &RunArgs,
    comm: &Comm,
) -> Result<RankOutcome, ExampleError> {
    let report = plugin.run_on(program, comm, args.cores, args.trace)?;
    Ok(RankOutcome {
        passed: true,
        detail: format!("program {program} finished without a failed task"),
        tasks: report.stats.tasks,
        events: report.trace.map(|t| t.chrome_events()).unwrap_or_default(),
    })
}

/// Runs plugin program `program` on `n` ranks of `args.backend` (`shm` or `local`).
///
/// # Errors
///
/// An unknown program, a bad rank count, the MPI backend (use [`run_on`] under `mpirun`), or
/// the run's failure (on processes, the Worker's error names every chip's failure).
pub fn run(
    plugin: &Plugin,
    program: &str,
    args: &RunArgs,
    n: usize,
) -> Result<Outcome, ExampleError> {
    check(plugin, program, args, n)?;
    match args.backend {
        Backend::Local => run_local_with(
            program,
            &|comm: &Comm| rank_body(plugin, program, args, comm),
            n,
        )
        .map(|o| verdict(o, program, n)),
        Backend::Shm => on_worker(plugin, program, args, n),
        Backend::Mpi => Err(ExampleError::Args(format!(
            "{program} on MPI runs one rank per process: start it under mpirun and call \
             pto_examples::plugin::run_on (`pto run --plugin ... --backend mpi` does)"
        ))),
    }
}

/// Runs plugin program `program` as this rank of `comm` and exchanges the verdicts.
///
/// # Collective
///
/// Every rank of `comm` calls it.
///
/// # Errors
///
/// An unknown program, or a communication error in the exchange.
pub fn run_on(
    plugin: &Plugin,
    program: &str,
    comm: &Comm,
    args: &RunArgs,
) -> Result<Outcome, ExampleError> {
    check(plugin, program, args, comm.size())?;
    run_on_with(
        program,
        |c| rank_body(plugin, program, args, c),
        comm,
        args.trace,
    )
    .map(|o| verdict(o, program, comm.size()))
}

/// A passing outcome says what passing means for a plugin program (there is no golden).
fn verdict(mut o: Outcome, program: &str, n: usize) -> Outcome {
    if o.passed {
        o.detail = format!("all {n} rank(s) finished program {program} without a failed task");
    }
    o
}

/// One process per chip: the Worker gets the plugin's window and its program (with the
/// built-in kernels and the plugin's), and starts it on every chip as one group.
fn on_worker(
    plugin: &Plugin,
    program: &str,
    args: &RunArgs,
    n: usize,
) -> Result<Outcome, ExampleError> {
    let t = Instant::now();
    let orch = plugin.orchestration(program)?;
    let mut b = crate::worker_examples::worker(args)
        .chips(n)
        .cores(args.cores.0, args.cores.1)
        .program(program, plugin.registry()?, move |o, _call| orch(o));
    if let Some(spec) = plugin.window_spec() {
        b = b.window(spec);
    }
    let w = b.init()?;
    let all: Vec<usize> = (0..n).collect();
    let name = program.to_string();
    let report = w.run_with(
        move |h| h.submit_group(&all, &name, TaskArgs::new()).map(|_| ()),
        args.trace,
    );
    let tasks = report.as_ref().map(|r| r.host.stats.tasks).unwrap_or(0);
    let report = report?;
    w.close();
    Ok(Outcome {
        passed: true,
        detail: format!("{n} chip(s): program {program} finished without a failed task"),
        wall: t.elapsed(),
        tasks,
        events: report.trace_events,
        ranks: Vec::new(),
    })
}
