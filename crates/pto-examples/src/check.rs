//! Running an example or a plugin's program under the happens-before checker
//! ([`pto_comm::check`]): its ranks as threads of this process (the checker sees every rank's
//! clock), the run's own verdict, and the races and the wait-for graph the checker found.

use std::sync::Arc;

use pto_comm::check::{CheckReport, Checker};
use pto_comm::Backend;
use pto_plugin::Plugin;

use crate::{dist, Example, ExampleError, Outcome, RunArgs};

/// What a checked run found.
#[derive(Debug)]
pub struct Checked {
    /// The run's own verdict, or its error.
    pub run: Result<Outcome, ExampleError>,
    /// What the checker found.
    pub report: CheckReport,
}

/// The checker for a run on `args.backend` of `n` ranks: in memory for threads, in a file per
/// process (in a fresh folder, removed by [`Files`]' drop) for processes.
fn install(
    args: &RunArgs,
    n: usize,
    seed: Option<u64>,
) -> Result<(Arc<Checker>, Files), ExampleError> {
    match args.backend {
        Backend::Local => Ok((Checker::install_perturbed(n, seed), Files(None))),
        Backend::Shm => {
            let dir = std::env::temp_dir().join(format!(
                "pto-check-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).map_err(|e| {
                ExampleError::Args(format!("pto check: cannot create {}: {e}", dir.display()))
            })?;
            Ok((
                Checker::install_files(n, seed, dir.clone()),
                Files(Some(dir)),
            ))
        }
        Backend::Mpi => Err(ExampleError::Args(
            "pto check runs the ranks on this host (--backend local or shm); under MPI the \
             checker would need every host's records"
                .into(),
        )),
    }
}

static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The folder of a checked run's per-process records, removed when dropped.
struct Files(Option<std::path::PathBuf>);

impl Drop for Files {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Runs `ex` on `n` ranks under the checker: threads (`local`), or processes through the
/// Worker (`shm`). Only one checked run at a time per process (the checker is process-wide).
///
/// # Errors
///
/// A backend other than `local`, an example without a rank body, or a bad rank count.
pub fn example(ex: &Example, args: &RunArgs, n: usize) -> Result<Checked, ExampleError> {
    example_seeded(ex, args, n, None)
}

/// [`example`] on a perturbed schedule drawn from `seed` (`None`: unperturbed).
///
/// # Errors
///
/// As [`example`].
pub fn example_seeded(
    ex: &Example,
    args: &RunArgs,
    n: usize,
    seed: Option<u64>,
) -> Result<Checked, ExampleError> {
    ex.check_args(args, n)?;
    let single = ex.ranks.is_none() && ex.worker.is_none();
    if single && n != 1 {
        return Err(ExampleError::Args(format!(
            "{} runs on one chip; --ranks must be 1",
            ex.name
        )));
    }
    if args.backend == Backend::Local && !single && ex.ranks.is_none() {
        return Err(ExampleError::Args(format!(
            "{} runs only through the Worker (processes): use --backend shm",
            ex.name
        )));
    }
    let (c, _files) = install(args, n, seed)?;
    let run = if single {
        (ex.run)(args)
    } else {
        dist::run(ex, args, n)
    };
    Checker::uninstall();
    Ok(Checked {
        run,
        report: c.report(),
    })
}

/// Runs plugin program `program` on `n` ranks (threads or processes) under the checker, on a perturbed
/// schedule drawn from `seed` when given.
///
/// # Errors
///
/// A backend other than `local`, an unknown program, or a bad rank count.
pub fn plugin(
    plugin: &Plugin,
    program: &str,
    args: &RunArgs,
    n: usize,
    seed: Option<u64>,
) -> Result<Checked, ExampleError> {
    let (c, _files) = install(args, n, seed)?;
    let run = crate::plugin::run(plugin, program, args, n);
    Checker::uninstall();
    Ok(Checked {
        run,
        report: c.report(),
    })
}
