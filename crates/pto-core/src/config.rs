//! The one list of `PTO_*` environment variables, their defaults and how they are read.
//!
//! Builders take explicit values first; a variable fills in what the builder left unset; the
//! default fills in the rest. An unparsable value is ignored with the default used instead
//! (and reported by [`Settings::warnings`]).

use std::time::Duration;

/// One documented variable.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    /// Its name.
    pub name: &'static str,
    /// What it sets.
    pub doc: &'static str,
    /// The default, as text.
    pub default: &'static str,
}

/// Every variable pto reads.
pub const VARS: &[Var] = &[
    Var {
        name: "PTO_WAIT_TIMEOUT_MS",
        doc: "deadline of every blocking wait (ring space, tensor reads, signals, barriers)",
        default: "30000",
    },
    Var {
        name: "PTO_STALL_TIMEOUT_MS",
        doc: "a run with no task finishing for this long fails, naming the tasks still running",
        default: "60000",
    },
    Var {
        name: "PTO_RING_TASK_WINDOW",
        doc: "live tasks per scope ring",
        default: "16384",
    },
    Var {
        name: "PTO_RING_HEAP_BYTES",
        doc: "bytes of runtime-allocated outputs per scope ring",
        default: "67108864",
    },
    Var {
        name: "PTO_THREADS",
        doc: "OS threads serving a chip's logical cores (default: min(cores, CPUs))",
        default: "auto",
    },
    Var {
        name: "PTO_SPIN_US",
        doc: "microseconds an idle thread spins before it parks",
        default: "20",
    },
];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Resolved settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `PTO_WAIT_TIMEOUT_MS`.
    pub wait_timeout: Duration,
    /// `PTO_STALL_TIMEOUT_MS`.
    pub stall_timeout: Duration,
    /// `PTO_RING_TASK_WINDOW`.
    pub ring_task_window: usize,
    /// `PTO_RING_HEAP_BYTES`.
    pub ring_heap_bytes: usize,
    /// `PTO_THREADS`, when set.
    pub threads: Option<usize>,
    /// `PTO_SPIN_US`.
    pub spin: Duration,
}

impl Settings {
    /// Reads the environment.
    pub fn from_env() -> Settings {
        Settings {
            wait_timeout: Duration::from_millis(env_u64("PTO_WAIT_TIMEOUT_MS").unwrap_or(30_000)),
            stall_timeout: Duration::from_millis(env_u64("PTO_STALL_TIMEOUT_MS").unwrap_or(60_000)),
            ring_task_window: env_u64("PTO_RING_TASK_WINDOW").map_or(16_384, |v| v as usize),
            ring_heap_bytes: env_u64("PTO_RING_HEAP_BYTES").map_or(64 << 20, |v| v as usize),
            threads: env_u64("PTO_THREADS").map(|v| v as usize),
            spin: Duration::from_micros(env_u64("PTO_SPIN_US").unwrap_or(20)),
        }
    }

    /// Variables that are set but could not be parsed.
    pub fn warnings() -> Vec<String> {
        VARS.iter()
            .filter_map(|v| {
                let val = std::env::var(v.name).ok()?;
                (val.trim().parse::<u64>().is_err())
                    .then(|| format!("{}={val:?} is not a number; using {}", v.name, v.default))
            })
            .collect()
    }
}
