//! `pto run <example>`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use pto_comm::Backend;
use pto_examples::{Example, ExampleError, Outcome};
use serde_json::json;

use crate::cli::RunArgs;

pub fn run(a: &RunArgs) -> anyhow::Result<ExitCode> {
    let Some(ex) = pto_examples::find(&a.example) else {
        let names: Vec<&str> = pto_examples::EXAMPLES.iter().map(|e| e.name).collect();
        bail!(
            "no example named {:?}; the examples are: {}",
            a.example,
            names.join(", ")
        );
    };
    let Some(backend) = Backend::from_name(&a.backend) else {
        bail!("unknown backend {:?}: use shm, local or mpi", a.backend);
    };
    let ranks = a.ranks.unwrap_or(1);
    if ranks == 0 || ranks > pto_comm::MAX_RANKS {
        bail!("--ranks must be 1 to {}", pto_comm::MAX_RANKS);
    }
    let args = pto_examples::RunArgs {
        size: a.size,
        trace: a.trace.is_some(),
        cores: (a.aic, a.aiv),
        backend,
    };
    if backend == Backend::Mpi {
        return mpi::run(ex, a, &args);
    }
    // Progress on a terminal only: quiet when output goes to a file or a pipe.
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal() && !a.json;
    if tty {
        eprint!("running {} on {} rank(s)...", ex.name, ranks);
    }
    let result = pto_examples::dist::run(ex, &args, ranks);
    if tty {
        eprint!("\r\x1b[2K");
    }
    if let (Some(path), Ok(o)) = (&a.trace, &result) {
        write_trace(path, o)?;
    }
    let backend_name = if ex.ranks.is_some() || ex.worker.is_some() {
        backend.name()
    } else {
        "local"
    };
    Ok(report(ex, a, ranks, backend_name, &result))
}

/// Writes every chip's trace events as one Chrome trace.
fn write_trace(path: &std::path::Path, o: &Outcome) -> anyhow::Result<()> {
    let doc = json!({ "traceEvents": o.events, "displayTimeUnit": "ns" });
    std::fs::write(path, doc.to_string())
        .with_context(|| format!("writing the trace to {}", path.display()))
}

/// Prints the verdict (text or one JSON object); exit code 0 only on a match.
fn report(
    ex: &Example,
    a: &RunArgs,
    ranks: usize,
    backend_name: &str,
    result: &Result<Outcome, ExampleError>,
) -> ExitCode {
    let (passed, detail, wall_ms, tasks) = match result {
        Ok(o) => (
            o.passed,
            o.detail.clone(),
            o.wall.as_secs_f64() * 1e3,
            o.tasks,
        ),
        Err(e) => (false, format!("error: {e}"), 0.0, 0),
    };
    if a.json {
        println!(
            "{}",
            json!({
                "example": ex.name, "ranks": ranks, "backend": backend_name,
                "passed": passed, "wall_ms": (wall_ms * 1000.0).round() / 1000.0,
            })
        );
        if !passed {
            eprintln!("{}: {detail}", ex.name);
        }
    } else {
        let verdict = if passed { "PASSED" } else { "FAILED" };
        println!(
            "{} on {} rank(s) ({backend_name}): {verdict} ({tasks} tasks, {wall_ms:.2} ms): {detail}",
            ex.name, ranks
        );
        if let Some(p) = &a.trace {
            println!("trace written to {}", p.display());
        }
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(not(feature = "mpi"))]
mod mpi {
    use super::*;

    pub fn run(_: &Example, _: &RunArgs, _: &pto_examples::RunArgs) -> anyhow::Result<ExitCode> {
        bail!(
            "this pto was built without MPI: build it with \
             `cargo build --release -p pto-cli --features mpi` (needs Open MPI, see the README)"
        )
    }
}

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;

    /// Under `mpirun`, this process is one rank: run its part, exchange the verdicts, and
    /// report on rank 0. Outside `mpirun`, start `mpirun -n <ranks>` on this same command.
    pub fn run(
        ex: &Example,
        a: &RunArgs,
        args: &pto_examples::RunArgs,
    ) -> anyhow::Result<ExitCode> {
        if !pto_comm::mpi::detected() {
            return crate::command::mpi_launch::relaunch(a.ranks.unwrap_or(1));
        }
        let comm = pto_comm::mpi::init().context("starting MPI")?;
        if let Some(n) = a.ranks.filter(|&n| n != comm.size()) {
            bail!(
                "--ranks {n}, but mpirun started {} ranks (rank {})",
                comm.size(),
                comm.rank()
            );
        }
        let result = pto_examples::dist::run_on(ex, &comm, args);
        if comm.rank() == 0 {
            if let (Some(path), Ok(o)) = (&a.trace, &result) {
                write_trace(path, o)?;
            }
            return Ok(report(ex, a, comm.size(), "mpi", &result));
        }
        Ok(match result {
            Ok(o) if o.passed => ExitCode::SUCCESS,
            Ok(_) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("pto: rank {}: {e}", comm.rank());
                ExitCode::FAILURE
            }
        })
    }
}
