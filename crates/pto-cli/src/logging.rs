//! Log output: `tracing` events of every pto crate, filtered by `-v`/`-q`, else `PTO_LOG`,
//! else `RUST_LOG`, else warnings only; written to stderr one line per event.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

use crate::exit::Usage;

static QUIET: AtomicBool = AtomicBool::new(false);

/// Installs the subscriber.
///
/// # Errors
///
/// `PTO_LOG` set to a filter that does not parse (a usage error). An unparsable `RUST_LOG`
/// (which other programs read too) only draws a warning.
pub fn init(verbose: u8, quiet: bool) -> anyhow::Result<()> {
    QUIET.store(quiet, Ordering::Relaxed);
    let mut warning = None;
    let filter = if quiet {
        Targets::new().with_default(LevelFilter::ERROR)
    } else if verbose > 0 {
        let level = match verbose {
            1 => LevelFilter::INFO,
            2 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        };
        Targets::new().with_default(level)
    } else if let Some(v) = pto::config::text("PTO_LOG")? {
        plain_targets(&v).and_then(|()| Targets::from_str(&v).map_err(|e| e.to_string())).map_err(|e| {
            Usage(format!(
                "PTO_LOG={v:?} is not a log filter ({e}): use error, warn, info, debug, trace, or target=level lists such as pto_worker=debug,warn"
            ))
        })?
    } else {
        match std::env::var("RUST_LOG") {
            Ok(v) if !v.trim().is_empty() => plain_targets(&v)
                .and_then(|()| Targets::from_str(&v).map_err(|e| e.to_string()))
                .unwrap_or_else(|e| {
                    warning = Some(format!(
                    "RUST_LOG={v:?} is not a filter pto understands ({e}); logging warnings only"
                ));
                    Targets::new().with_default(LevelFilter::WARN)
                }),
            _ => Targets::new().with_default(LevelFilter::WARN),
        }
    };
    use std::io::IsTerminal;
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second install (a test calling main twice) is not an error worth stopping for.
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    Ok(())
}

/// Refuses directives whose target is not a Rust path (`Targets` takes `garbage[[[` as a
/// target no event has, which would silently log nothing).
fn plain_targets(filter: &str) -> Result<(), String> {
    for d in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let target = d.split('=').next().unwrap_or("");
        if target.is_empty()
            || !target
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(format!("{d:?} is not target=level"));
        }
    }
    Ok(())
}

/// Prints a note on stderr (one write) unless `-q` was given.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn note(msg: impl std::fmt::Display) {
    if !QUIET.load(Ordering::Relaxed) {
        pto_shm::eprint_line!("pto: note: {msg}");
    }
}
