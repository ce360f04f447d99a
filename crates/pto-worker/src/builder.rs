//! Configuring a Worker: [`WorkerBuilder`] collects the chips, cores, sub-workers, window,
//! programs and closures into the [`Spec`] every child inherits, and checks it before
//! anything is forked. Starting the Worker (`WorkerBuilder::init`) and the methods that name a
//! `Worker` (child Workers, their closures) are at the crate root.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use pto_comm::WindowSpec;
use pto_core::{KernelRegistry, Orch, OrchError, Tensor};

use crate::error::WorkerError;
use crate::failure::ChildFailure;
use crate::frame::TensorDesc;
use crate::spec::{ChipCall, ExitHook, NestedFn, NestedInit, Spec, SubCall};

/// Builds a [`Worker`](crate::Worker).
pub struct WorkerBuilder {
    spec: Spec,
    on_exit: Option<Arc<ExitHook>>,
    check: bool,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("chips", &self.spec.chips)
            .field("subs", &self.spec.subs)
            .finish_non_exhaustive()
    }
}

impl Default for WorkerBuilder {
    fn default() -> Self {
        WorkerBuilder::new()
    }
}

impl WorkerBuilder {
    /// One chip, 2 AIC and 4 AIV cores, no sub-worker, the shm comm backend without a window.
    pub fn new() -> WorkerBuilder {
        WorkerBuilder {
            spec: Spec {
                chips: 1,
                cores: (2, 4),
                threads: None,
                subs: 0,
                window: None,
                comm: true,
                programs: Vec::new(),
                subs_fns: Vec::new(),
                boot_hook: None,
                chip_main: None,
                thread_main: None,
                timeout: Duration::ZERO,
                workers: Vec::new(),
                worker_fns: Vec::new(),
                staging: Vec::new(),
                collectives: None,
                timeout_set: false,
                in_process: false,
            },
            on_exit: None,
            check: false,
        }
    }

    /// Runs the chips under the happens-before checker (`pto check`'s): installed in this
    /// process before the chips are forked, every chip appends its records to its own file in a
    /// fresh folder, and [`Worker::check_report`](crate::Worker::check_report) replays them.
    /// One checked Worker at a time per process (the checker is process-wide); closing the
    /// Worker removes the checker and its folder. Off by default.
    pub fn check(mut self, on: bool) -> Self {
        self.check = on;
        self
    }

    /// Whether [`WorkerBuilder::check`] was asked for.
    pub(crate) fn checking(&self) -> bool {
        self.check
    }

    /// Called (from the Worker's watcher thread) when a child dies while no run is in progress,
    /// for example while the host prepares inputs. The Worker is unusable from then on whatever
    /// the hook does; a supervisor such as the `pto` command reports and exits at once.
    pub fn on_child_exit<F>(mut self, f: F) -> Self
    where
        F: Fn(&ChildFailure) + Send + Sync + 'static,
    {
        self.on_exit = Some(Arc::new(f));
        self
    }

    /// Number of chips (ranks).
    pub fn chips(mut self, n: usize) -> Self {
        self.spec.chips = n;
        self
    }

    /// Logical cores per chip.
    pub fn cores(mut self, aic: u32, aiv: u32) -> Self {
        self.spec.cores = (aic, aiv);
        self
    }

    /// OS threads serving each chip's logical cores (default: `PTO_THREADS`, else as many as
    /// cores and CPUs allow). A thread per logical core lets every core hold a kernel that
    /// waits for a peer inside its task, as on the device.
    pub fn threads(mut self, n: usize) -> Self {
        self.spec.threads = Some(n);
        self
    }

    /// Number of sub-workers (processes running host closures).
    pub fn sub_workers(mut self, n: usize) -> Self {
        self.spec.subs = n;
        self
    }

    /// A symmetric window for every chip (allocated at bring-up), with its named buffers.
    pub fn window(mut self, spec: WindowSpec) -> Self {
        self.spec.window = Some(spec);
        self
    }

    /// Gives every chip collectives (`CommContext::collectives` in its kernels) with `cap` bytes
    /// of staging (allocated at bring-up, collective among the chips).
    pub fn collectives(mut self, cap: usize) -> Self {
        self.spec.collectives = Some(cap);
        self
    }

    /// Without communication (chips do not join a world).
    pub fn no_comm(mut self) -> Self {
        self.spec.comm = false;
        self
    }

    /// Runs every child (chip and sub-worker) as threads of this process instead of forking it:
    /// the same protocol over the same shared memory, in one process a debugger can hold. A
    /// child that crashes then takes the whole process with it, and a child stuck in a kernel
    /// cannot be killed (an abort or close leaves its thread behind); child Workers (L4) still
    /// need a process of their own and are refused. The process may already have threads.
    pub fn in_process(mut self) -> Self {
        self.spec.in_process = true;
        self
    }

    /// Deadline of bring-up and of every task.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.spec.timeout = d;
        self.spec.timeout_set = true;
        self
    }

    /// Registers a chip program: its kernels and its orchestration.
    pub fn program<F>(mut self, name: &str, kernels: KernelRegistry, orch: F) -> Self
    where
        F: Fn(&mut Orch<'_>, &ChipCall) -> Result<(), OrchError> + Send + Sync + 'static,
    {
        self.spec
            .programs
            .push((name.to_string(), Arc::new(kernels), Arc::new(orch)));
        self
    }

    /// Registers a sub-worker closure.
    pub fn sub<F>(mut self, name: &str, f: F) -> Self
    where
        F: Fn(&SubCall) -> Result<(), String> + Send + Sync + 'static,
    {
        self.spec.subs_fns.push((name.to_string(), Arc::new(f)));
        self
    }

    /// Host staging: chip `c` loads window buffer `buffer` from `host[c]` at bring-up and stores
    /// it back into `host[c]` after each of its tasks that succeeds. The host tensors must be in
    /// shared memory ([`shared_tensor`](crate::shared_tensor)), contiguous, and exactly the buffer's size.
    ///
    /// # Errors
    ///
    /// Checked at [`WorkerBuilder::init`]: a tensor not in shared memory, not contiguous, of the
    /// wrong size, a count other than the number of chips, or no such buffer.
    pub fn stage(mut self, buffer: &str, host: &[Tensor]) -> Self {
        let descs = host
            .iter()
            .map(|t| {
                let (name, off) = t.buffer().shared_at().unwrap_or(("", 0));
                TensorDesc {
                    segment: if t.is_contiguous() {
                        name.to_string()
                    } else {
                        String::new()
                    },
                    buffer_offset: off as u64,
                    buffer_len: t.buffer().len() as u64,
                    offset: t.region().offset() as u64,
                    dtype: t.dtype(),
                    mode: pto_core::ArgMode::InOut,
                    shape: t.shape().iter().map(|&v| v as u64).collect(),
                    strides: t.strides().iter().map(|&v| v as u64).collect(),
                }
            })
            .collect();
        self.spec.staging.push((buffer.to_string(), descs));
        self
    }

    /// A hook each chip runs during bring-up, with its rank (for example to load data); an
    /// error fails the bring-up with that message.
    pub fn on_bootstrap<F>(mut self, f: F) -> Self
    where
        F: Fn(usize) -> Result<(), String> + Send + Sync + 'static,
    {
        self.spec.boot_hook = Some(Arc::new(f));
        self
    }

    /// Runs each chip child's life inside `f`: `f` gets the child's main function (which never
    /// returns) and must call it. For embedders: the Python package releases the interpreter's
    /// lock there, so that the chip's core threads may call Python kernels.
    pub fn chip_main<F>(mut self, f: F) -> Self
    where
        F: Fn(Box<dyn FnOnce() + Send + '_>) + Send + Sync + 'static,
    {
        self.spec.chip_main = Some(Arc::new(f));
        self
    }

    /// Runs each of every chip's threads inside `f` (see [`pto_core::ChipBuilder::thread_main`]).
    pub fn chip_thread_main<F>(mut self, f: F) -> Self
    where
        F: Fn(Box<dyn FnOnce() + Send>) + Send + Sync + 'static,
    {
        self.spec.thread_main = Some(Arc::new(f));
        self
    }

    /// Adds a child Worker (L4) in the form the spec keeps (see `WorkerBuilder::child_worker`).
    pub(crate) fn nested(mut self, init: Arc<NestedInit>) -> Self {
        self.spec.workers.push(init);
        self
    }

    /// Registers a closure for child Workers in the form the spec keeps (see
    /// `WorkerBuilder::worker_fn`).
    pub(crate) fn nested_fn(mut self, name: &str, f: Arc<NestedFn>) -> Self {
        self.spec.worker_fns.push((name.to_string(), f));
        self
    }

    /// The checks `WorkerBuilder::init` makes before it forks: the timeout (from
    /// `PTO_WAIT_TIMEOUT_MS` unless set), the number of chips and the host staging. Returns the
    /// spec and the exit hook.
    pub(crate) fn checked(mut self) -> Result<(Arc<Spec>, Option<Arc<ExitHook>>), WorkerError> {
        if !self.spec.timeout_set {
            self.spec.timeout = pto_core::config::Settings::from_env()
                .map_err(|e| WorkerError::Args(e.to_string()))?
                .wait_timeout;
        }
        if self.spec.timeout.is_zero() {
            return Err(WorkerError::Args(
                "the Worker's timeout must be above zero".into(),
            ));
        }
        let spec = Arc::new(self.spec);
        if spec.in_process && !spec.workers.is_empty() {
            return Err(WorkerError::Args(
                "child Workers (L4) need processes of their own: not with in_process".into(),
            ));
        }
        if spec.chips == 0 || spec.chips > pto_comm::MAX_RANKS {
            return Err(WorkerError::Args(format!(
                "a Worker needs 1 to {} chips, not {}",
                pto_comm::MAX_RANKS,
                spec.chips
            )));
        }
        for (buf, descs) in &spec.staging {
            let b = spec
                .window
                .as_ref()
                .and_then(|w| w.buffers.iter().find(|b| &b.name == buf))
                .ok_or_else(|| {
                    WorkerError::Args(format!("staging: the window has no buffer {buf:?}"))
                })?;
            if descs.len() != spec.chips {
                return Err(WorkerError::Args(format!(
                    "staging {buf:?}: {} host tensors for {} chips",
                    descs.len(),
                    spec.chips
                )));
            }
            for (c, d) in descs.iter().enumerate() {
                let bytes = d.shape.iter().product::<u64>() * d.dtype.size() as u64;
                if d.segment.is_empty() || bytes != b.bytes as u64 {
                    return Err(WorkerError::Args(format!(
                        "staging {buf:?} for chip {c}: the host tensor must be contiguous, in shared memory, and {} bytes (it has {bytes})",
                        b.bytes
                    )));
                }
            }
        }
        Ok((spec, self.on_exit))
    }
}
