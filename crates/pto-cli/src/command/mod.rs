//! One module per verb.

mod anchor;
mod bench;
mod check;
mod clean;
pub(crate) mod coll_bench;
mod comm_bench;
mod deferred_bench;
#[cfg(feature = "mpi")]
mod mpi_launch;
mod plugin_bench;
mod run;
mod scale_bench;
mod stats;
mod worker_bench;

use std::process::ExitCode;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(a) => run::run(&a),
        Command::Check(a) => check::check(&a),
        Command::List(a) => {
            match &a.plugin {
                None => {
                    for e in pto_examples::EXAMPLES {
                        outln!("{:<24} {}", e.name, e.about);
                    }
                }
                Some(path) => {
                    let p = pto_plugin::Plugin::load(path)?;
                    outln!(
                        "plugin {} (ABI version {})",
                        p.path(),
                        pto_plugin::ABI_VERSION
                    );
                    for name in p.programs() {
                        outln!("program {name}");
                    }
                    for (name, kind) in p.kernels() {
                        outln!("kernel  {name:<24} {kind}");
                    }
                    for b in p.buffers() {
                        outln!(
                            "buffer  {:<24} {} x {} ({} bytes)",
                            b.name,
                            b.count,
                            b.dtype,
                            b.bytes
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::IncludeDir(a) => {
            let dir = if a.simpler {
                pto_simpler::include_dir().map_err(|e| {
                    crate::exit::Environment(format!(
                        "writing pto's simpler headers to a cache folder: {e}"
                    ))
                })?
            } else {
                pto_plugin::include_dir().map_err(|e| {
                    crate::exit::Environment(format!("writing pto.h to a cache folder: {e}"))
                })?
            };
            outln!("{}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(a) => bench::bench(&a),
        Command::Clean(a) => clean::clean(&a),
        Command::Rank { job } => match job.as_str() {
            "bench-comm" => comm_bench::rank_main(false),
            "bench-allreduce" => comm_bench::rank_main(true),
            "bench-coll" => comm_bench::coll_rank_main(),
            other => Err(crate::exit::Usage(format!("unknown rank job {other:?}")).into()),
        },
        Command::Env => {
            for v in pto::config::VARS {
                let cur = std::env::var(v.name).unwrap_or_else(|_| "(unset)".into());
                outln!(
                    "{:<22} {:<10} default {:<10} {}; {}",
                    v.name,
                    cur,
                    v.default,
                    v.doc,
                    v.allowed()
                );
            }
            // A bad value is reported (exit 2) after the list, so the list still shows it.
            pto::config::check_all()?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints one benchmark line: the JSON object with `--json`, else its `key:value` pairs.
pub fn print_line(json: bool, v: &serde_json::Value) -> anyhow::Result<()> {
    if json {
        outln!("{v}");
    } else {
        outln!(
            "{}",
            v.to_string()
                .replace(['{', '}', '"'], "")
                .replace(',', "  ")
        );
    }
    Ok(())
}
