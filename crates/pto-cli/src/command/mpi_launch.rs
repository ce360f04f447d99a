//! Starting a `pto` command as the ranks of an MPI job (`--backend mpi` outside `mpirun`).

use std::process::ExitCode;

use anyhow::Context;

/// Runs this same command again as `n` ranks under `mpirun`. Open MPI is told through its
/// environment that running as root and more ranks than cores are fine (other MPIs ignore
/// these variables). The ranks see that they run under MPI and do their part.
pub fn relaunch(n: usize) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let st = std::process::Command::new("mpirun")
        .args(["-n", &n.to_string()])
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .status()
        .context("starting mpirun (install Open MPI: see the README)")?;
    Ok(if st.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
