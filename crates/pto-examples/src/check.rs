//! Running an example or a plugin's program under the happens-before checker
//! ([`pto_comm::check`]): its ranks as threads of this process (the checker sees every rank's
//! clock), the run's own verdict, and the races and the wait-for graph the checker found.

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

fn local_only(args: &RunArgs) -> Result<(), ExampleError> {
    if args.backend != Backend::Local {
        return Err(ExampleError::Args(format!(
            "pto check runs the ranks as threads of one process (--backend local), where the \
             checker sees every rank; --backend {} is not supported by the checker yet",
            args.backend.name()
        )));
    }
    Ok(())
}

/// Runs `ex` on `n` ranks (threads) under the checker. Only one checked run at a time per
/// process (the checker is process-wide).
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
    local_only(args)?;
    ex.check_args(args, n)?;
    let Some(body) = ex.ranks else {
        if ex.worker.is_some() {
            return Err(ExampleError::Args(format!(
                "{} runs only through the Worker (processes): the checker needs ranks as threads",
                ex.name
            )));
        }
        if n != 1 {
            return Err(ExampleError::Args(format!(
                "{} runs on one chip; --ranks must be 1",
                ex.name
            )));
        }
        let c = Checker::install_perturbed(1, seed);
        let run = (ex.run)(args);
        Checker::uninstall();
        return Ok(Checked {
            run,
            report: c.report(),
        });
    };
    let c = Checker::install_perturbed(n, seed);
    let run = dist::run_local(ex, body, args, n);
    Checker::uninstall();
    Ok(Checked {
        run,
        report: c.report(),
    })
}

/// Runs plugin program `program` on `n` ranks (threads) under the checker, on a perturbed
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
    local_only(args)?;
    let c = Checker::install_perturbed(n, seed);
    let run = crate::plugin::run(plugin, program, args, n);
    Checker::uninstall();
    Ok(Checked {
        run,
        report: c.report(),
    })
}
