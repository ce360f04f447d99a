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

mod chip;
mod collectives_ex;
pub mod dist;
mod notify;
pub mod programs;
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
    /// An argument the example does not accept.
    #[error("{0}")]
    Args(String),
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
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            size: None,
            trace: false,
            cores: (2, 4),
            backend: Backend::Shm,
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
}

/// Every example.
pub const EXAMPLES: &[Example] = &[
    Example {
        name: "vector_pipeline",
        about: "one chip: c = a + b (SPMD), d = 0.5 c, s = sum(d); golden computed in Rust",
        run: chip::vector_pipeline,
        ranks: None,
        worker: None,
    },
    Example {
        name: "ffn_chip",
        about: "one chip: y = relu(x w1) w2 with SPMD matmuls on AIC and relu on AIV; checked against a sequential reference",
        run: chip::ffn_chip,
        ranks: None,
        worker: None,
    },
    Example {
        name: "deferred_notify",
        about: "rank r writes partial[r] = r + 1 into rank r+1's mailbox and notifies it; a deferred wait gates the consumer: result[r] = partial[r-1]",
        run: dist::needs_ranks,
        ranks: Some(notify::deferred_notify),
        worker: Some(worker_examples::deferred_notify_worker),
    },
    Example {
        name: "async_notify",
        about: "producer out = 2 in, then notify the next rank; a deferred wait; consumer result = out + 1",
        run: dist::needs_ranks,
        ranks: Some(notify::async_notify),
        worker: Some(worker_examples::async_notify_worker),
    },
    Example {
        name: "allreduce_distributed",
        about: "the four-phase allreduce kernel on the window (stage in, signal barrier, reduce from every peer, stage out); out[i] = n i + 100 n(n-1)/2",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::allreduce_distributed),
        worker: Some(worker_examples::allreduce_distributed_worker),
    },
    Example {
        name: "allgather",
        about: "allgather of in[r][i] = i + 100 r; out[r C + i] = 100 r + i",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::allgather),
        worker: Some(worker_examples::allgather_worker),
    },
    Example {
        name: "reduce_scatter",
        about: "reduce-scatter sum; rank r gets out[j] = n (rC + j) + 100 n(n-1)/2",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::reduce_scatter),
        worker: Some(worker_examples::reduce_scatter_worker),
    },
    Example {
        name: "broadcast",
        about: "broadcast from rank 0; out[i] = i on every rank",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::broadcast),
        worker: Some(worker_examples::broadcast_worker),
    },
    Example {
        name: "all_to_all",
        about: "all-to-all; out[s C + j] = 1000 s + 100 r + j",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::all_to_all),
        worker: Some(worker_examples::all_to_all_worker),
    },
    Example {
        name: "ffn_tp_parallel",
        about: "tensor-parallel FFN: x_r w_r on an AIC core, then an allreduce sum on an AIV core; y = sum_r x_r w_r",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::ffn_tp_parallel),
        worker: Some(worker_examples::ffn_tp_parallel_worker),
    },
    Example {
        name: "domain_rank_map",
        about: "collectives over domains (even ranks; the last two, last first): dense ranks follow the list, sums over members only, a clear error outside",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::domain_rank_map),
        worker: Some(worker_examples::domain_rank_map_worker),
    },
    Example {
        name: "dual_domain_overlap",
        about: "one chip in two domains (left [0,1], right [1,2]): an allreduce per domain, then an affine per (domain, chip)",
        run: dist::needs_ranks,
        ranks: Some(collectives_ex::dual_domain_overlap),
        worker: Some(worker_examples::dual_domain_overlap_worker),
    },
    Example {
        name: "multi_chip_dispatch",
        about: "through the host Worker: every chip runs vector_add on its own inputs and a sub-worker checks out = a + b",
        run: dist::needs_ranks,
        ranks: None,
        worker: Some(worker_examples::multi_chip_dispatch),
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
