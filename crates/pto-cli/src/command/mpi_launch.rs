//! Starting a `pto` command as the ranks of an MPI job (`--backend mpi` outside `mpirun`).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::ExitCode;

use anyhow::Context;

use crate::exit::Environment;
use crate::logging::note;

/// The launcher: `PTO_MPIRUN`, else `MPIEXEC`, else `mpirun`; split on spaces, so it may carry
/// options (`PTO_MPIRUN="mpirun --mca btl self,vader"`).
fn launcher() -> anyhow::Result<Vec<String>> {
    let text = match pto::config::text("PTO_MPIRUN")? {
        Some(v) => v,
        None => std::env::var("MPIEXEC")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "mpirun".into()),
    };
    Ok(text.split_whitespace().map(str::to_string).collect())
}

/// Runs this same command again as `n` ranks under the MPI launcher, in a process group of its
/// own (a signal to `pto` stops the launcher and every rank; see `pto_shm::cleanup`). With Open
/// MPI, running as root and more ranks than CPUs need permission: pto gives it through the
/// environment when it is needed, and says so. Exits with the launcher's code.
pub fn relaunch(n: usize) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let argv = launcher()?;
    let (prog, opts) = argv
        .split_first()
        .ok_or_else(|| Environment("PTO_MPIRUN is empty".into()))?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(opts)
        .args(["-n", &n.to_string()])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .process_group(0);
    let root = rustix::process::getuid().is_root();
    if root && std::env::var_os("OMPI_ALLOW_RUN_AS_ROOT").is_none() {
        note("running as root: setting OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for Open MPI");
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if n > cpus && std::env::var_os("OMPI_MCA_rmaps_base_oversubscribe").is_none() {
        note(format!(
            "{n} ranks on {cpus} CPUs: setting OMPI_MCA_rmaps_base_oversubscribe=1 for Open MPI"
        ));
        cmd.env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    }
    tracing::info!(launcher = prog, ranks = n, "starting the MPI job");
    pto_shm::cleanup::install();
    let mut child = pto_shm::cleanup::spawn_registered(&mut cmd, true).map_err(|e| {
        Environment(format!(
            "cannot start the MPI launcher {prog:?}: {e} (install Open MPI, see the README, or set PTO_MPIRUN)"
        ))
    })?;
    let st = child.wait().context("waiting for the MPI launcher")?;
    pto_shm::cleanup::forget(child.id());
    Ok(match (st.code(), st.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(crate::exit::RUNTIME)),
        (None, Some(s)) => ExitCode::from(u8::try_from(128 + s).unwrap_or(crate::exit::RUNTIME)),
        _ => ExitCode::from(crate::exit::RUNTIME),
    })
}
