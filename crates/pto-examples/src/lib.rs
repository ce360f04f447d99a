//! # pto-examples
//!
//! Each example is a library function that builds its inputs, runs them through pto and checks
//! the result against a golden computed independently (in plain Rust, sequentially). The CLI's
//! `pto run <name>` and the tests call the same functions.
//!
//! ```
//! let ex = pto_examples::find("vector_pipeline").unwrap();
//! let outcome = (ex.run)(&pto_examples::RunArgs::default())?;
//! assert!(outcome.passed, "{}", outcome.detail);
//! # Ok::<(), pto_examples::ExampleError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::time::Duration;

use pto_comm::{Backend, CommError};
use pto_core::{OrchError, RunError, TensorError};
use serde_json::Value;

pub mod check;
mod chip;
mod collectives;
pub mod dist;
mod notify;
pub mod plugin;
pub mod programs;
pub mod scale;
mod worker_examples;

pub use dist::{RankFn, RankOutcome};

/// Errors that stop an example before it can check its golden.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// The run failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// Building the inputs or reading results failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The orchestration failed outside a run.
    #[error(transparent)]
    Orch(#[from] OrchError),
    /// Communication failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A kernel could not be registered.
    #[error(transparent)]
    Registry(#[from] pto_core::RegistryError),
    /// The host Worker failed (bring-up, a chip, a run): its error keeps every chip's
    /// failure, the root cause first.
    #[error(transparent)]
    Worker(#[from] pto_worker::WorkerError),
    /// A C plugin could not be loaded or its program failed.
    #[error(transparent)]
    Plugin(#[from] pto_plugin::PluginError),
    /// An argument the example does not accept.
    #[error("{0}")]
    Args(String),
}

impl ExampleError {
    /// The kind of failure (what `pto run`'s exit code says).
    pub fn fault(&self) -> pto_core::Fault {
        use pto_core::Fault;
        match self {
            ExampleError::Run(e) => e.fault(),
            ExampleError::Comm(e) => e.fault(),
            ExampleError::Worker(e) => e.fault(),
            ExampleError::Plugin(e) => e.fault(),
            ExampleError::Args(_) | ExampleError::Registry(_) => Fault::Usage,
            ExampleError::Tensor(_) | ExampleError::Orch(_) => Fault::Runtime,
        }
    }
}

/// Options of one example run.
#[derive(Clone, Debug)]
pub struct RunArgs {
    /// Problem size (the example's own unit; `None` for its default).
    pub size: Option<usize>,
    /// Record a trace.
    pub trace: bool,
    /// Logical cores per chip (AIC, AIV).
    pub cores: (u32, u32),
    /// Where the ranks run (for distributed examples).
    pub backend: Backend,
    /// Called when a chip process dies while no run is in progress (on processes: see
    /// `WorkerBuilder::on_child_exit`).
    pub on_child_exit: Option<ExitHook>,
}

/// A hook called with a child's failure (`pto run` reports it and exits at once).
#[derive(Clone)]
pub struct ExitHook(pub std::sync::Arc<dyn Fn(&pto_worker::ChildFailure) + Send + Sync>);

impl std::fmt::Debug for ExitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExitHook")
    }
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            size: None,
            trace: false,
            cores: (2, 4),
            backend: Backend::Shm,
            on_child_exit: None,
        }
    }
}

/// What an example run found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// True when every value matched the golden.
    pub passed: bool,
    /// What was checked, or the first mismatch.
    pub detail: String,
    /// Wall time of the run(s).
    pub wall: Duration,
    /// Tasks run.
    pub tasks: u64,
    /// Chrome trace events of every chip (empty unless a trace was asked for).
    pub events: Vec<Value>,
    /// Every rank's own verdict, when the ranks checked their parts themselves (threads, MPI);
    /// empty when the golden was checked in one place.
    pub ranks: Vec<RankStatus>,
}

/// How one rank's part of a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankState {
    /// Its part matched the golden.
    Passed,
    /// Its part did not match the golden.
    Mismatch,
    /// It failed on its own (a kernel's error, a bad argument).
    Failed,
    /// It failed because another rank died, failed or aborted first.
    Consequence,
    /// It failed because a wait on the others ran out.
    TimedOut,
}

/// One rank's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankStatus {
    /// The rank.
    pub rank: usize,
    /// How its part ended.
    pub state: RankState,
    /// What it checked, or its first mismatch, or its error.
    pub detail: String,
}

/// A whole example run through a host Worker with the given number of chips.
pub type WorkerExampleFn = fn(&RunArgs, usize) -> Result<Outcome, ExampleError>;

/// One example.
#[derive(Clone, Copy, Debug)]
pub struct Example {
    /// Its name, as `pto run` takes it.
    pub name: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// Runs it on one chip and checks the golden (single-chip examples).
    pub run: fn(&RunArgs) -> Result<Outcome, ExampleError>,
    /// The rank body, for distributed examples (run through [`dist::run`]).
    pub ranks: Option<RankFn>,
    /// The whole example through a host Worker with this many chips (run in a
    /// single-threaded process: the Worker forks).
    pub worker: Option<WorkerExampleFn>,
    /// The logical cores it needs on every chip.
    pub needs: Needs,
    /// How its memory grows with `--size` and the rank count.
    pub footprint: Footprint,
    /// Its `--size` when none is given.
    pub default_size: usize,
}

/// The core kinds an example submits to (a chip without them cannot run it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Needs {
    /// At least one AIC core.
    pub aic: bool,
    /// At least one AIV core.
    pub aiv: bool,
}

const AIV: Needs = Needs {
    aic: false,
    aiv: true,
};
const AIC_AIV: Needs = Needs {
    aic: true,
    aiv: true,
};

/// An upper estimate of an example's memory: `bytes × size^size_power × ranks^rank_power`
/// (inputs, outputs, windows, host copies and goldens), used to refuse a size the machine
/// cannot hold before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes per unit.
    pub bytes: u64,
    /// How `--size` enters (1: linear, 2: a square matrix).
    pub size_power: u32,
    /// How the rank count enters (1: per rank, 2: every rank holds every rank's part).
    pub rank_power: u32,
}

const fn fp(bytes: u64, size_power: u32, rank_power: u32) -> Footprint {
    Footprint {
        bytes,
        size_power,
        rank_power,
    }
}

/// The largest `--size` accepted by any example (sizes must also fit the machine's memory).
pub const MAX_SIZE: usize = 1 << 40;

impl Example {
    /// An upper estimate of the bytes a run with `size` on `ranks` ranks needs (`None` when it
    /// overflows any integer).
    pub fn bytes_needed(&self, size: usize, ranks: usize) -> Option<u128> {
        let f = self.footprint;
        let s = (size as u128).checked_pow(f.size_power)?;
        let r = (ranks.max(1) as u128).checked_pow(f.rank_power)?;
        u128::from(f.bytes).checked_mul(s)?.checked_mul(r)
    }

    /// Checks a run's arguments before anything is allocated: a size of at least 1 that the
    /// machine's memory (and, on processes, `/dev/shm`) can hold, and the cores the example
    /// submits to.
    ///
    /// # Errors
    ///
    /// [`ExampleError::Args`] naming the argument and what it may be.
    pub fn check_args(&self, args: &RunArgs, ranks: usize) -> Result<(), ExampleError> {
        let size = args.size.unwrap_or(self.default_size);
        if size == 0 || size > MAX_SIZE {
            return Err(ExampleError::Args(format!(
                "--size {size} is out of range: {} takes 1 to {MAX_SIZE}",
                self.name
            )));
        }
        let (aic, aiv) = args.cores;
        if (self.needs.aic && aic == 0) || (self.needs.aiv && aiv == 0) || aic + aiv == 0 {
            return Err(ExampleError::Args(format!(
                "{} needs {} on every chip (got --aic {aic} --aiv {aiv})",
                self.name,
                match (self.needs.aic, self.needs.aiv) {
                    (true, true) => "at least one AIC and one AIV core",
                    (true, false) => "at least one AIC core",
                    _ => "at least one AIV core",
                }
            )));
        }
        let need = self.bytes_needed(size, ranks);
        let mem = pto_shm::process::mem_available();
        let shm = (args.backend == Backend::Shm && (self.worker.is_some() || self.ranks.is_some()))
            .then(pto_shm::shm_free)
            .flatten();
        let have = [mem, shm].into_iter().flatten().min();
        if let Some(have) = have {
            if need.is_none_or(|n| n > u128::from(have)) {
                let gib = |b: u128| b as f64 / f64::from(1u32 << 30);
                return Err(ExampleError::Args(format!(
                    "--size {size} on {ranks} rank(s) needs about {} of memory, and this machine has {:.1} GiB available{}: use a smaller --size",
                    need.map_or_else(|| "more than any machine has".to_string(), |n| format!("{:.1} GiB", gib(n))),
                    gib(u128::from(have)),
                    if shm == Some(have) { " in /dev/shm" } else { "" }
                )));
            }
        }
        Ok(())
    }
}

/// Every example.
pub const EXAMPLES: &[Example] = &[
    Example {
        name: "vector_pipeline",
        about: "one chip: c = a + b (SPMD), d = 0.5 c, s = sum(d); golden computed in Rust",
        run: chip::vector_pipeline,
        ranks: None,
        worker: None,
        needs: AIV, footprint: fp(64, 1, 0),
        default_size: 4096,
    },
    Example {
        name: "ffn_chip",
        about: "one chip: y = relu(x w1) w2 with SPMD matmuls on AIC and relu on AIV; checked against a sequential reference",
        run: chip::ffn_chip,
        ranks: None,
        worker: None,
        needs: AIC_AIV, footprint: fp(16 << 10, 1, 0),
        default_size: 64,
    },
    Example {
        name: "deferred_notify",
        about: "rank r writes partial[r] = r + 1 into rank r+1's mailbox and notifies it; a deferred wait gates the consumer: result[r] = partial[r-1]",
        run: dist::needs_ranks,
        ranks: Some(notify::deferred_notify),
        worker: Some(worker_examples::deferred_notify_worker),
        needs: AIV, footprint: fp(64, 1, 1),
        default_size: 16,
    },
    Example {
        name: "async_notify",
        about: "producer out = 2 in, then notify the next rank; a deferred wait; consumer result = out + 1",
        run: dist::needs_ranks,
        ranks: Some(notify::async_notify),
        worker: Some(worker_examples::async_notify_worker),
        needs: AIV, footprint: fp(64, 1, 1),
        default_size: 64,
    },
    Example {
        name: "allreduce_distributed",
        about: "the four-phase allreduce kernel on the window (stage in, signal barrier, reduce from every peer, stage out); out[i] = n i + 100 n(n-1)/2",
        run: dist::needs_ranks,
        ranks: Some(collectives::allreduce_distributed),
        worker: Some(worker_examples::allreduce_distributed_worker),
        needs: AIV, footprint: fp(96, 1, 1),
        default_size: 256,
    },
    Example {
        name: "allgather",
        about: "allgather of in[r][i] = i + 100 r; out[r C + i] = 100 r + i",
        run: dist::needs_ranks,
        ranks: Some(collectives::allgather),
        worker: Some(worker_examples::allgather_worker),
        needs: AIV, footprint: fp(64, 1, 2),
        default_size: 64,
    },
    Example {
        name: "reduce_scatter",
        about: "reduce-scatter sum; rank r gets out[j] = n (rC + j) + 100 n(n-1)/2",
        run: dist::needs_ranks,
        ranks: Some(collectives::reduce_scatter),
        worker: Some(worker_examples::reduce_scatter_worker),
        needs: AIV, footprint: fp(64, 1, 2),
        default_size: 64,
    },
    Example {
        name: "broadcast",
        about: "broadcast from rank 0; out[i] = i on every rank",
        run: dist::needs_ranks,
        ranks: Some(collectives::broadcast),
        worker: Some(worker_examples::broadcast_worker),
        needs: AIV, footprint: fp(64, 1, 1),
        default_size: 256,
    },
    Example {
        name: "all_to_all",
        about: "all-to-all; out[s C + j] = 1000 s + 100 r + j",
        run: dist::needs_ranks,
        ranks: Some(collectives::all_to_all),
        worker: Some(worker_examples::all_to_all_worker),
        needs: AIV, footprint: fp(64, 1, 2),
        default_size: 32,
    },
    Example {
        name: "ffn_tp_parallel",
        about: "tensor-parallel FFN: x_r w_r on an AIC core, then an allreduce sum on an AIV core; y = sum_r x_r w_r",
        run: dist::needs_ranks,
        ranks: Some(collectives::ffn_tp_parallel),
        worker: Some(worker_examples::ffn_tp_parallel_worker),
        needs: AIC_AIV, footprint: fp(96, 2, 1),
        default_size: 64,
    },
    Example {
        name: "domain_rank_map",
        about: "collectives over domains (even ranks; the last two, last first): dense ranks follow the list, sums over members only, a clear error outside",
        run: dist::needs_ranks,
        ranks: Some(collectives::domain_rank_map),
        worker: Some(worker_examples::domain_rank_map_worker),
        needs: AIV, footprint: fp(96, 1, 1),
        default_size: 32,
    },
    Example {
        name: "dual_domain_overlap",
        about: "one chip in two domains (left [0,1], right [1,2]): an allreduce per domain, then an affine per (domain, chip)",
        run: dist::needs_ranks,
        ranks: Some(collectives::dual_domain_overlap),
        worker: Some(worker_examples::dual_domain_overlap_worker),
        needs: AIV, footprint: fp(96, 1, 1),
        default_size: 32,
    },
    Example {
        name: "multi_chip_dispatch",
        about: "through the host Worker: every chip runs vector_add on its own inputs and a sub-worker checks out = a + b",
        run: dist::needs_ranks,
        ranks: None,
        worker: Some(worker_examples::multi_chip_dispatch),
        needs: AIV, footprint: fp(64, 1, 1),
        default_size: 1024,
    },
];

/// The example named `name`.
pub fn find(name: &str) -> Option<&'static Example> {
    EXAMPLES.iter().find(|e| e.name == name)
}

/// Compares `got` with `want` elementwise within `tol` (absolute plus relative); the detail
/// names the first mismatch.
pub fn compare(what: &str, got: &[f64], want: &[f64], tol: f64) -> (bool, String) {
    if got.len() != want.len() {
        return (
            false,
            format!("{what}: {} values, golden has {}", got.len(), want.len()),
        );
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if (g - w).abs() > tol * (1.0 + w.abs()) || g.is_nan() != w.is_nan() {
            return (
                false,
                format!("{what}[{i}] = {g}, golden {w} (tolerance {tol})"),
            );
        }
    }
    (
        true,
        format!("{what}: {} values match the golden", got.len()),
    )
}
