//! Exit codes, and which one an error gets.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | passed |
//! | 1 | wrong result: a golden mismatch |
//! | 2 | usage: bad arguments or `PTO_*` variables |
//! | 3 | runtime failure: a failed task, a dead or stopped rank, a deadline |
//! | 4 | environment or setup: no space in `/dev/shm`, MPI missing, a refused fork |
//! | 5 | `pto check` found a race |
//! | 128 + N | signal N ended it (SIGINT 130, SIGTERM 143, SIGHUP 129), after cleanup |
//! | 141 | standard output was closed by its reader (`pto list \| head -1`), said as SIGPIPE would |

use std::process::ExitCode;

use pto::Fault;

pub const WRONG_RESULT: u8 = 1;
pub const USAGE: u8 = 2;
pub const RUNTIME: u8 = 3;
pub const ENVIRONMENT: u8 = 4;
pub const RACE: u8 = 5;
/// 128 + SIGPIPE: standard output's reader left.
pub const STDOUT_CLOSED: u8 = 141;

/// Standard output's reader left (a broken pipe): nothing more to print, nothing to say.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct StdoutClosed;

/// The error of a failed write to standard output: a closed pipe ends the command quietly;
/// anything else (a full disk) is an environment error that says so.
pub fn stdout_failed(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        StdoutClosed.into()
    } else {
        Environment(format!("writing to standard output: {e}")).into()
    }
}

/// A failure of the caller's making, said in words (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// A failure of the machine's making (exit 4).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Environment(pub String);

/// What a build without the `mpi` feature says to `--backend mpi`.
#[cfg_attr(feature = "mpi", allow(dead_code))]
pub fn no_mpi() -> anyhow::Error {
    Environment(
        "this pto was built without MPI: build it with `cargo build --release -p pto-cli \
         --features mpi` (needs Open MPI, see the README)"
            .into(),
    )
    .into()
}

pub fn of_fault(f: Fault) -> u8 {
    match f {
        Fault::Usage => USAGE,
        Fault::Runtime => RUNTIME,
        Fault::Environment => ENVIRONMENT,
    }
}

/// The exit code of an error, from the first typed error in its chain.
pub fn code_of(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.is::<crate::command::coll_bench::WrongResult>() {
            return WRONG_RESULT;
        }
        if cause.is::<Usage>() || cause.is::<pto::config::ConfigError>() {
            return USAGE;
        }
        if cause.is::<Environment>() || cause.is::<std::io::Error>() {
            return ENVIRONMENT;
        }
        if let Some(x) = cause.downcast_ref::<pto_examples::ExampleError>() {
            return of_fault(x.fault());
        }
        if let Some(x) = cause.downcast_ref::<pto_plugin::PluginError>() {
            return of_fault(x.fault());
        }
        if let Some(x) = cause.downcast_ref::<pto_comm::CommError>() {
            return of_fault(x.fault());
        }
        if let Some(x) = cause.downcast_ref::<pto_worker::WorkerError>() {
            return of_fault(x.fault());
        }
        if let Some(x) = cause.downcast_ref::<pto_shm::ShmError>() {
            return of_fault(x.fault());
        }
        if let Some(x) = cause.downcast_ref::<pto::RunError>() {
            return of_fault(x.fault());
        }
    }
    RUNTIME
}

pub fn code(c: u8) -> ExitCode {
    ExitCode::from(c)
}

/// The word `--json` reports for an exit code.
pub fn kind(code: u8) -> &'static str {
    match code {
        0 => "passed",
        WRONG_RESULT => "wrong_result",
        USAGE => "usage",
        ENVIRONMENT => "environment",
        129.. => "signal",
        _ => "runtime",
    }
}

/// With `--json`, the one object of a run that a signal ends (printed by the signal handler
/// after its cleanup: `pto_shm::cleanup::set_last_words`).
pub fn json_on_signal(example: &str, ranks: Option<usize>, backend: &'static str) {
    let example = example.to_string();
    pto_shm::cleanup::set_last_words(move |code| {
        let what = match code {
            130 => "interrupted (SIGINT)",
            143 => "terminated (SIGTERM)",
            _ => "hung up (SIGHUP)",
        };
        format!(
            "{}\n",
            serde_json::json!({
                "example": example, "ranks": ranks, "backend": backend,
                "passed": false, "wall_ms": null, "tasks": null,
                "exit_code": code,
                "error": {
                    "kind": kind(code as u8),
                    "message": format!("{what}: children stopped, segments removed"),
                    "root_cause": null, "ranks": [],
                },
            })
        )
    });
}
