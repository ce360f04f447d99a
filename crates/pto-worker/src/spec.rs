//! What a Worker is made of and what its calls receive: the arguments of a chip program
//! ([`ChipCall`]) and of a sub-worker closure ([`SubCall`]), the closure types, and the
//! [`Spec`] every child inherits across the fork.
//!
//! Nothing here names `Worker` or `WorkerBuilder` (they are built from this module): a child
//! Worker (L4) and the closures it runs are kept erased ([`Nested`], [`NestedInit`],
//! [`NestedFn`]); the crate root wraps the typed ones when they are registered.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use pto_comm::{CommContext, WindowSpec};
use pto_core::{KernelRegistry, Orch, OrchError, Scalar, Tensor};

use crate::failure::ChildFailure;
use crate::frame::TensorDesc;

/// What a chip program receives besides the orchestration API.
#[derive(Debug)]
pub struct ChipCall {
    /// The task's tensors (views of host shared memory), in argument order.
    pub tensors: Vec<(Tensor, pto_core::ArgMode)>,
    /// The task's scalars.
    pub scalars: Vec<Scalar>,
    /// This chip's rank.
    pub rank: usize,
    /// Number of chips.
    pub size: usize,
    /// The chip's communicator and window (when the Worker has a comm configuration).
    pub comm: Option<CommContext>,
}

impl ChipCall {
    /// Tensor argument `i`.
    ///
    /// # Errors
    ///
    /// [`OrchError::Other`] when there is none.
    pub fn tensor(&self, i: usize) -> Result<&Tensor, OrchError> {
        self.tensors
            .get(i)
            .map(|t| &t.0)
            .ok_or_else(|| OrchError::msg(format!("chip program has no tensor argument {i}")))
    }
}

/// What a sub-worker closure receives.
#[derive(Debug)]
pub struct SubCall {
    /// The task's tensors, in argument order.
    pub tensors: Vec<(Tensor, pto_core::ArgMode)>,
    /// The task's scalars.
    pub scalars: Vec<Scalar>,
}

/// A chip program's orchestration.
pub type ChipFn = dyn Fn(&mut Orch<'_>, &ChipCall) -> Result<(), OrchError> + Send + Sync;
/// A sub-worker closure.
pub type SubFn = dyn Fn(&SubCall) -> Result<(), String> + Send + Sync;
/// A hook each chip runs during bring-up, with its rank.
pub(crate) type BootHook = dyn Fn(usize) -> Result<(), String> + Send + Sync;
/// Runs a chip child's whole life (the function it is given, which never returns) inside
/// something of the embedder's: the Python package releases the interpreter's lock there, so
/// that the chip's threads can run Python kernels.
pub type ChipMain = dyn Fn(Box<dyn FnOnce() + Send + '_>) + Send + Sync;

/// A child Worker (L4) as the process that runs it holds it: the `Worker` its factory built,
/// erased (see the module docs).
pub(crate) type Nested = Box<dyn Any>;
/// Builds a child Worker (L4) in its own process, after the fork: the crate root wraps each
/// factory given to `WorkerBuilder::child_worker`. The error is the message.
pub(crate) type NestedInit = dyn Fn() -> Result<Nested, String> + Send + Sync;
/// A closure run on a child Worker (L4), taking that Worker erased: the crate root wraps each
/// closure given to `WorkerBuilder::worker_fn` (a `WorkerFn`).
pub(crate) type NestedFn = dyn Fn(&dyn Any, &SubCall) -> Result<(), String> + Send + Sync;

/// Everything a child needs; built before the fork, so children have it too.
pub(crate) struct Spec {
    pub(crate) chips: usize,
    pub(crate) cores: (u32, u32),
    /// OS threads serving each chip's cores (default: `PTO_THREADS`, else the chip's choice).
    pub(crate) threads: Option<usize>,
    pub(crate) subs: usize,
    pub(crate) window: Option<WindowSpec>,
    pub(crate) comm: bool,
    pub(crate) programs: Vec<(String, Arc<KernelRegistry>, Arc<ChipFn>)>,
    pub(crate) subs_fns: Vec<(String, Arc<SubFn>)>,
    pub(crate) boot_hook: Option<Arc<BootHook>>,
    pub(crate) chip_main: Option<Arc<ChipMain>>,
    pub(crate) thread_main: Option<Arc<pto_core::ThreadMain>>,
    pub(crate) timeout: Duration,
    /// Child Workers (L4): how to build each.
    pub(crate) workers: Vec<Arc<NestedInit>>,
    pub(crate) worker_fns: Vec<(String, Arc<NestedFn>)>,
    /// Host staging: window buffer name and one host tensor per chip.
    pub(crate) staging: Vec<(String, Vec<TensorDesc>)>,
    /// Staging capacity of each chip's collectives, when it has them.
    pub(crate) collectives: Option<usize>,
    /// True when `timeout` was set explicitly (else `PTO_WAIT_TIMEOUT_MS` at init).
    pub(crate) timeout_set: bool,
    /// Children are threads of this process instead of forked processes.
    pub(crate) in_process: bool,
}

/// What the watcher calls when a child dies outside a run.
pub(crate) type ExitHook = dyn Fn(&ChildFailure) + Send + Sync;
