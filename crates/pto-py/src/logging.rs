//! pto's log: the `tracing` events of every crate go to stderr, filtered by `PTO_LOG` (or else
//! `RUST_LOG`, with the same directive syntax: `info`, `pto_worker=debug,warn`, ...), at level
//! `warn` by default. Installed once, when the module is imported.

use std::ffi::CString;
use std::io::IsTerminal;
use std::sync::Once;

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use tracing_subscriber::EnvFilter;

/// The filter used when neither variable is set (or the one set does not parse).
pub(crate) const DEFAULT_FILTER: &str = "warn";

/// The variable that chooses the filter and its value: `PTO_LOG`, else `RUST_LOG` (empty values
/// count as unset).
fn chosen() -> Option<(&'static str, String)> {
    ["PTO_LOG", "RUST_LOG"].into_iter().find_map(|var| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (var, v))
    })
}

/// Installs the subscriber (once per process; a subscriber someone else installed first is
/// kept). A filter that does not parse is reported once, as a Python `RuntimeWarning`, and the
/// default is used.
pub(crate) fn init(py: Python<'_>) {
    static ONCE: Once = Once::new();
    let mut problem = None;
    ONCE.call_once(|| {
        let filter = match chosen() {
            None => EnvFilter::new(DEFAULT_FILTER),
            Some((var, spec)) => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
                problem = Some(format!(
                    "pto: ignoring {var}={}, which is not a valid log filter ({e}); \
                     logging at the default level '{DEFAULT_FILTER}'",
                    crate::args::repr(&spec)
                ));
                EnvFilter::new(DEFAULT_FILTER)
            }),
        };
        let installed = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
            .is_ok();
        tracing::debug!(
            version = env!("CARGO_PKG_VERSION"),
            installed,
            "pto native module loaded"
        );
    });
    if let Some(msg) = problem {
        let warned = CString::new(msg.replace('\0', " "))
            .map_err(|e| e.to_string())
            .and_then(|c| {
                PyErr::warn(py, py.get_type::<PyRuntimeWarning>().as_any(), &c, 1)
                    .map_err(|e| e.to_string())
            });
        // Warnings turned into errors (`-W error`) must not make the import fail.
        if warned.is_err() {
            eprintln!("{msg}");
        }
    }
}
