//! The one list of `PTO_*` environment variables, their defaults, allowed ranges and how they
//! are read.
//!
//! Builders take explicit values first; a variable fills in what the builder left unset; the
//! default fills in the rest. A variable that is set but unparsable or out of its range is an
//! error ([`ConfigError`], naming the variable, its value and what is allowed), never silently
//! ignored: a user who set `PTO_WAIT_TIMEOUT_MS=30s` must learn that it did not take.
//!
//! ```
//! let s = pto_core::config::Settings::from_env()?;
//! assert!(s.wait_timeout.as_millis() > 0);
//! // Every variable, its range and its default (what `pto env` prints):
//! for v in pto_core::config::VARS {
//!     assert!(v.name.starts_with("PTO_"));
//! }
//! # Ok::<(), pto_core::config::ConfigError>(())
//! ```

use std::time::Duration;

/// The form of a variable's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An integer in `min..=max`.
    Int {
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// One of a list of words.
    Word(&'static [&'static str]),
    /// Free text (a command, a filter): checked by its reader.
    Text,
}

/// One documented variable.
#[derive(Clone, Copy, Debug)]
pub struct Var {
    /// Its name.
    pub name: &'static str,
    /// What it sets.
    pub doc: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// What values it takes.
    pub kind: Kind,
}

const DAY_MS: u64 = 86_400_000;

/// Every variable pto reads.
pub const VARS: &[Var] = &[
    Var {
        name: "PTO_WAIT_TIMEOUT_MS",
        doc: "deadline of every blocking wait (ring space, tensor reads, signals, barriers, bring-up)",
        default: "30000",
        kind: Kind::Int { min: 1, max: DAY_MS },
    },
    Var {
        name: "PTO_STALL_TIMEOUT_MS",
        doc: "a run with no task finishing for this long fails, naming the tasks still running",
        default: "60000",
        kind: Kind::Int { min: 1, max: DAY_MS },
    },
    Var {
        name: "PTO_RING_TASK_WINDOW",
        doc: "live tasks per scope ring",
        default: "16384",
        kind: Kind::Int {
            min: 4,
            max: 1 << 24,
        },
    },
    Var {
        name: "PTO_RING_HEAP_BYTES",
        doc: "bytes of runtime-allocated outputs per scope ring",
        default: "67108864",
        kind: Kind::Int {
            min: 4096,
            max: 1 << 40,
        },
    },
    Var {
        name: "PTO_THREADS",
        doc: "OS threads serving a chip's logical cores (default: min(cores, CPUs))",
        default: "auto",
        kind: Kind::Int { min: 1, max: 1024 },
    },
    Var {
        name: "PTO_SPIN_US",
        doc: "microseconds an idle thread spins before it parks",
        default: "20",
        kind: Kind::Int {
            min: 0,
            max: 100_000,
        },
    },
    Var {
        name: "PTO_ORCH_CPU",
        doc: "keep a CPU for the orchestrating thread: a chip's last core thread stays parked while it submits (default: on when the core threads fill every CPU)",
        default: "auto",
        kind: Kind::Word(&["on", "off"]),
    },
    Var {
        name: "PTO_MPI_WINDOWS",
        doc: "MPI backend windows: shared (MPI_Win_allocate_shared, one node) or rma (MPI-3 RMA)",
        default: "auto",
        kind: Kind::Word(&["shared", "rma"]),
    },
    Var {
        name: "PTO_MPI_NODE_RANKS",
        doc: "MPI backend: group ranks into nodes of this many consecutive ranks for hierarchical collectives (default: the real nodes)",
        default: "auto",
        kind: Kind::Int { min: 1, max: 1 << 20 },
    },
    Var {
        name: "PTO_MPIRUN",
        doc: "the MPI launcher `pto run --backend mpi` starts (else $MPIEXEC, else mpirun)",
        default: "mpirun",
        kind: Kind::Text,
    },
    Var {
        name: "PTO_LOG",
        doc: "log filter (as RUST_LOG, which it overrides): error, warn, info, debug, trace, or target=level lists",
        default: "warn",
        kind: Kind::Text,
    },
];

/// A `PTO_*` variable that is set to something pto cannot use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} is not valid: it must be {allowed}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What it takes.
    pub allowed: String,
}

fn var(name: &str) -> &'static Var {
    let v = VARS.iter().find(|v| v.name == name);
    debug_assert!(v.is_some(), "{name} is not in config::VARS");
    v.unwrap_or(&VARS[0])
}

impl Var {
    /// What the variable takes, in words.
    pub fn allowed(&self) -> String {
        match self.kind {
            Kind::Int { min, max } => format!("an integer from {min} to {max}"),
            Kind::Word(words) => format!("one of {}", words.join(", ")),
            Kind::Text => "text".into(),
        }
    }

    /// Checks a value of this variable.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the variable, the value and what is allowed.
    pub fn check(&self, value: &str) -> Result<(), ConfigError> {
        let v = value.trim();
        let ok = match self.kind {
            Kind::Int { min, max } => v.parse::<u64>().is_ok_and(|n| (min..=max).contains(&n)),
            Kind::Word(words) => words.contains(&v),
            Kind::Text => !v.is_empty(),
        };
        if ok {
            Ok(())
        } else {
            Err(ConfigError {
                var: self.name,
                value: value.to_string(),
                allowed: self.allowed(),
            })
        }
    }

    /// The variable's value from the environment, checked: `None` when unset (or empty).
    ///
    /// # Errors
    ///
    /// A value that is set and not valid.
    pub fn get(&self) -> Result<Option<String>, ConfigError> {
        match std::env::var(self.name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => self.check(&v).map(|()| Some(v.trim().to_string())),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(ConfigError {
                var: self.name,
                value: v.to_string_lossy().into_owned(),
                allowed: self.allowed(),
            }),
        }
    }
}

/// The checked value of integer variable `name`, if set.
///
/// # Errors
///
/// A value that is set and not valid.
pub fn int(name: &str) -> Result<Option<u64>, ConfigError> {
    let v = var(name);
    Ok(v.get()?.and_then(|s| s.parse().ok()))
}

/// The checked value of word or text variable `name`, if set.
///
/// # Errors
///
/// A value that is set and not valid.
pub fn text(name: &str) -> Result<Option<String>, ConfigError> {
    var(name).get()
}

/// Checks every variable in [`VARS`]; the first bad one is the error.
///
/// # Errors
///
/// A variable that is set and not valid.
pub fn check_all() -> Result<(), ConfigError> {
    VARS.iter().try_for_each(|v| v.get().map(|_| ()))
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
    /// `PTO_ORCH_CPU`, when set.
    pub orch_cpu: Option<bool>,
}

impl Settings {
    /// Reads the environment.
    ///
    /// # Errors
    ///
    /// A variable that is set and unparsable or out of its range.
    pub fn from_env() -> Result<Settings, ConfigError> {
        Ok(Settings {
            wait_timeout: Duration::from_millis(int("PTO_WAIT_TIMEOUT_MS")?.unwrap_or(30_000)),
            stall_timeout: Duration::from_millis(int("PTO_STALL_TIMEOUT_MS")?.unwrap_or(60_000)),
            ring_task_window: int("PTO_RING_TASK_WINDOW")?.map_or(16_384, |v| v as usize),
            ring_heap_bytes: int("PTO_RING_HEAP_BYTES")?.map_or(64 << 20, |v| v as usize),
            threads: int("PTO_THREADS")?.map(|v| v as usize),
            spin: Duration::from_micros(int("PTO_SPIN_US")?.unwrap_or(20)),
            orch_cpu: text("PTO_ORCH_CPU")?.map(|v| v == "on"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_against_their_ranges() {
        let wait = var("PTO_WAIT_TIMEOUT_MS");
        assert!(wait.check("1500").is_ok());
        for bad in ["abc", "-1", "0", "1.5", "30s", "99999999999999999999"] {
            let e = wait.check(bad).unwrap_err();
            assert_eq!(e.var, "PTO_WAIT_TIMEOUT_MS");
            assert!(e.to_string().contains("from 1 to 86400000"), "{e}");
        }
        assert!(var("PTO_SPIN_US").check("0").is_ok());
        assert!(var("PTO_SPIN_US").check("100000000").is_err());
        assert!(var("PTO_MPI_WINDOWS").check("rma").is_ok());
        assert!(var("PTO_MPI_WINDOWS")
            .check("fast")
            .unwrap_err()
            .to_string()
            .contains("one of shared, rma"));
    }
}
