//! # pto-worker: one host, many chips
//!
//! A [`Worker`] forks one process per chip (and per sub-worker), brings every chip up through its
//! own bootstrap channel (joining the shared-memory world and allocating its symmetric window),
//! and runs host-level orchestrations on the same DAG engine as a chip: the host submits chip
//! programs to chosen chips, groups of chips together (for collectives), and closures to
//! sub-workers, and dependencies are inferred from the tensor arguments exactly as on a chip.
//! Host tensors live in shared memory ([`Worker::tensor`]), so children read and write them in
//! place.
//!
//! ```
//! use pto_core::{CoreKind, DType, KernelRegistry, TaskArgs};
//! use pto_worker::Worker;
//!
//! let mut kernels = KernelRegistry::new();
//! kernels.register("double", CoreKind::Aiv, |ctx| {
//!     let x = ctx.input::<f32>(0)?.to_vec();
//!     ctx.output::<f32>(1)?.assign(&x.iter().map(|v| 2.0 * v).collect::<Vec<_>>())?;
//!     Ok(())
//! })?;
//! // Two chips, each a forked process (this doctest's process is single-threaded).
//! let w = Worker::builder()
//!     .chips(2)
//!     .no_comm()
//!     .program("double", kernels, |o, call| {
//!         o.submit("double", TaskArgs::new().input(call.tensor(0)?).output_existing(call.tensor(1)?))?;
//!         Ok(())
//!     })
//!     .init()?;
//! let x = w.tensor(&[3], DType::F32)?;
//! x.write(&[1.0f32, 2.0, 3.0])?;
//! let (y0, y1) = (w.tensor(&[3], DType::F32)?, w.tensor(&[3], DType::F32)?);
//! let (xa, a, b) = (x.clone(), y0.clone(), y1.clone());
//! w.run(move |h| {
//!     // Both chips read x; each writes its own output. Both tasks run at once.
//!     h.submit_chip(0, "double", TaskArgs::new().input(&xa).output_existing(&a))?;
//!     h.submit_chip(1, "double", TaskArgs::new().input(&xa).output_existing(&b))?;
//!     Ok(())
//! })?;
//! assert_eq!(y0.read::<f32>()?, vec![2.0, 4.0, 6.0]);
//! assert_eq!(y1.read::<f32>()?, vec![2.0, 4.0, 6.0]);
//! w.close();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Forking safely
//!
//! The Worker forks every child **before any thread exists** in the process: [`WorkerBuilder::init`]
//! refuses to run when the process has more than one thread ([`WorkerError::NotSingleThreaded`]).
//! * From a Rust binary: build the Worker at the start of `main`, before anything spawns threads
//!   (pto's own chip threads start after the fork).
//! * From tests: libtest runs tests on extra threads, so Worker tests live in a test target with
//!   `harness = false` whose `main` runs scenarios on the main thread (see `tests/worker.rs`).
//! * From Python: create the Worker before starting threads; the extension forks from the
//!   calling thread.
//!
//! Children die with their parent (`PR_SET_PDEATHSIG` plus a parent-pid check while idle); the
//! parent checks each child's liveness while it waits for it. See `docs/design/worker.md`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod child;
mod failure;
pub mod frame;
pub mod mailbox;
pub mod shared;
mod supervise;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pto_comm::shm::ShmWorld;
use pto_comm::{CommContext, CommError, WindowSpec};
use pto_core::{
    Chip, CoreKind, DType, KernelCtx, KernelError, KernelRegistry, Orch, OrchError, Program,
    RunError, RunOptions, RunReport, Scalar, Submitted, TaskArgs, Tensor,
};
use pto_shm::process::Forked;
use pto_shm::ShmError;

use frame::{Frame, FrameKind, Outcome, TensorDesc};
use mailbox::{BootFacts, Ident, Mailbox};
use supervise::{reap_all, ChildHandle};

pub use failure::{signal_name, ChildExit, ChildFailure, FailKind, RunFailure};
pub use mailbox::BootFacts as ChipFacts;
pub use pto_shm::Fault;

/// Errors of the Worker, naming the chip or sub-worker, task and message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The process has threads; forking now would be unsafe.
    #[error("a Worker must be created before any thread starts (this process has {threads}); see the pto-worker docs")]
    NotSingleThreaded {
        /// Threads found.
        threads: usize,
    },
    /// A chip failed to come up.
    #[error("bring-up failed: {message}")]
    Boot {
        /// The chip (the root cause).
        who: String,
        /// Every failure, the root cause first.
        message: String,
        /// The failures one by one.
        report: Box<RunFailure>,
    },
    /// A child process died.
    #[error("{who} (pid {pid}) died")]
    ChildDied {
        /// The chip or sub-worker.
        who: String,
        /// Its pid.
        pid: u32,
    },
    /// A wait passed its deadline.
    #[error("timeout: {0}")]
    Timeout(String),
    /// A frame or result in shared memory was invalid.
    #[error("corrupt mailbox data: {0}")]
    Corrupt(String),
    /// Bad arguments.
    #[error("{0}")]
    Args(String),
    /// The host run failed (a chip's task, a sub-worker, or the host orchestration).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The Worker cannot run any more.
    #[error("the Worker is unusable: {0}")]
    Broken(String),
    /// Forking failed.
    #[error("fork: {0}")]
    Fork(std::io::Error),
    /// The OS layer failed.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// Communication failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Children failed (a run, or bring-up): every failure, the root cause first.
    #[error("{0}")]
    Failed(Box<RunFailure>),
}

impl WorkerError {
    /// The kind of failure.
    pub fn fault(&self) -> Fault {
        match self {
            WorkerError::NotSingleThreaded { .. } | WorkerError::Args(_) => Fault::Usage,
            WorkerError::Fork(_) => Fault::Environment,
            WorkerError::Shm(e) => e.fault(),
            WorkerError::Comm(e) => e.fault(),
            WorkerError::Run(e) => e.fault(),
            _ => Fault::Runtime,
        }
    }

    /// The per-child failures, when this error has them.
    pub fn failures(&self) -> Option<&RunFailure> {
        match self {
            WorkerError::Failed(f) => Some(f),
            WorkerError::Boot { report, .. } => Some(report),
            _ => None,
        }
    }
}

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
type BootHook = dyn Fn(usize) -> Result<(), String> + Send + Sync;
/// A closure run on a child Worker (L4): it gets the child's own Worker.
pub type WorkerFn = dyn Fn(&Worker, &SubCall) -> Result<(), String> + Send + Sync;
type WorkerFactory = dyn Fn() -> WorkerBuilder + Send + Sync;

/// Everything a child needs; built before the fork, so children have it too.
pub(crate) struct Spec {
    chips: usize,
    cores: (u32, u32),
    subs: usize,
    window: Option<WindowSpec>,
    comm: bool,
    programs: Vec<(String, Arc<KernelRegistry>, Arc<ChipFn>)>,
    subs_fns: Vec<(String, Arc<SubFn>)>,
    boot_hook: Option<Arc<BootHook>>,
    timeout: Duration,
    /// Child Workers (L4): how to build each.
    workers: Vec<Arc<WorkerFactory>>,
    worker_fns: Vec<(String, Arc<WorkerFn>)>,
    /// Host staging: window buffer name and one host tensor per chip.
    staging: Vec<(String, Vec<TensorDesc>)>,
    /// Staging capacity of each chip's collectives, when it has them.
    collectives: Option<usize>,
    /// True when `timeout` was set explicitly (else `PTO_WAIT_TIMEOUT_MS` at init).
    timeout_set: bool,
}

/// What the watcher calls when a child dies outside a run.
type ExitHook = dyn Fn(&ChildFailure) + Send + Sync;

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    spec: Spec,
    on_exit: Option<Arc<ExitHook>>,
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
                subs: 0,
                window: None,
                comm: true,
                programs: Vec::new(),
                subs_fns: Vec::new(),
                boot_hook: None,
                timeout: Duration::ZERO,
                workers: Vec::new(),
                worker_fns: Vec::new(),
                staging: Vec::new(),
                collectives: None,
                timeout_set: false,
            },
            on_exit: None,
        }
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
    /// shared memory ([`shared_tensor`]), contiguous, and exactly the buffer's size.
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

    /// Adds a child Worker (L4): a process that builds its own Worker with `factory` (forking
    /// its own chips) and runs the closures registered with [`WorkerBuilder::worker_fn`].
    pub fn child_worker<F>(mut self, factory: F) -> Self
    where
        F: Fn() -> WorkerBuilder + Send + Sync + 'static,
    {
        self.spec.workers.push(Arc::new(factory));
        self
    }

    /// Registers a closure that child Workers run ([`HostOrch::submit_worker`]).
    pub fn worker_fn<F>(mut self, name: &str, f: F) -> Self
    where
        F: Fn(&Worker, &SubCall) -> Result<(), String> + Send + Sync + 'static,
    {
        self.spec.worker_fns.push((name.to_string(), Arc::new(f)));
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

    /// Forks the children, waits until every chip is up, and starts the host scheduler.
    ///
    /// # Errors
    ///
    /// Bad sizes, a process that already has threads, a chip whose bring-up failed (named,
    /// with its message: every child is then reaped and no segment is left), or a timeout.
    pub fn init(mut self) -> Result<Worker, WorkerError> {
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
        let threads = pto_shm::process::thread_count();
        if threads > 1 {
            return Err(WorkerError::NotSingleThreaded { threads });
        }
        // Before forking, so that children inherit it: a signal ends every child and removes
        // every segment (docs/design/worker.md).
        pto_shm::cleanup::install();
        let t0 = Instant::now();
        let world = if spec.comm {
            Some(ShmWorld::create(spec.chips)?)
        } else {
            None
        };
        let total = spec.chips + spec.subs + spec.workers.len();
        let mut boxes = Vec::with_capacity(total);
        for i in 0..total {
            boxes.push(Mailbox::create(&format!("mb{i}"))?);
        }
        let parent = std::process::id();
        let mut children: Vec<ChildHandle> = Vec::with_capacity(total);
        let mut boxes = boxes.into_iter();
        for i in 0..total {
            let Some(mb) = boxes.next() else { break };
            let role = if i < spec.chips {
                child::Role::Chip(i)
            } else if i < spec.chips + spec.subs {
                child::Role::Sub
            } else {
                child::Role::Worker(i - spec.chips - spec.subs)
            };
            // SAFETY: checked above that this process is single-threaded, and no thread has
            // been started since; the child runs `child_main`, which never returns.
            #[allow(unsafe_code)]
            let forked = unsafe { pto_shm::process::fork() };
            match forked {
                Ok(Forked::Child) => child::child_main(&spec, world.as_ref(), &mb, role, parent),
                Ok(Forked::Parent(pid)) => {
                    let who = match role {
                        child::Role::Chip(c) => format!("chip {c}"),
                        child::Role::Sub => format!("sub-worker {}", i - spec.chips),
                        child::Role::Worker(w) => format!("child worker {w}"),
                    };
                    children.push(ChildHandle::new(who, pid, mb));
                }
                Err(e) => {
                    reap_all(&children, Duration::from_millis(500));
                    return Err(WorkerError::Fork(e));
                }
            }
        }
        let facts = match bring_up(&children, spec.timeout) {
            Ok(f) => f,
            Err(e) => {
                reap_all(&children, Duration::from_millis(500));
                drop(world);
                return Err(e);
            }
        };
        tracing::debug!(chips = spec.chips, children = total, took = ?t0.elapsed(), "Worker up");
        let state = Arc::new(HostState {
            children,
            chips: spec.chips,
            subs: spec.subs,
            timeout: spec.timeout,
            run: AtomicU64::new(0),
            broken: Mutex::new(None),
            failures: Mutex::new(Vec::new()),
            in_run: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            aborted: Mutex::new(None),
            on_exit: self.on_exit,
            traces: Mutex::new(Vec::new()),
            tracing: AtomicBool::new(false),
        });
        let host = match Chip::builder()
            .chip_id(u32::MAX)
            .aic_cores(0)
            .aiv_cores(total as u32 + 1)
            .threads(total + 1)
            .ring_heap_bytes(16 << 20)
            .ring_allocator(Arc::new(shared::shared_buffer))
            .extension(state.clone())
            .build()
        {
            Ok(h) => h,
            Err(e) => {
                reap_all(&state.children, Duration::from_millis(500));
                return Err(e.into());
            }
        };
        let watcher = supervise::spawn_watcher(state.clone()).map_err(WorkerError::Fork)?;
        Ok(Worker {
            spec,
            kernels: Arc::new(host_kernels().map_err(|e| WorkerError::Args(e.to_string()))?),
            state,
            host,
            facts,
            world,
            init_time: t0.elapsed(),
            closed: false,
            watcher: Some(watcher),
        })
    }
}

/// Extra time the host gives a child past the wait deadline, so that a child's own deadline
/// error (which says what it waited for) arrives before the host gives up on it.
const GRACE: Duration = Duration::from_millis(300);

/// Waits for every child's bootstrap record. On a failure, keeps collecting for a moment so
/// that the report can tell the root cause from its consequences.
fn bring_up(children: &[ChildHandle], timeout: Duration) -> Result<Vec<BootFacts>, WorkerError> {
    let deadline = Instant::now() + timeout;
    let mut facts = vec![None; children.len()];
    let mut failures: Vec<ChildFailure> = Vec::new();
    let mut settle: Option<Instant> = None;
    loop {
        let mut pending = 0;
        for (i, c) in children.iter().enumerate() {
            if facts[i].is_some() || failures.iter().any(|f| f.child == i) {
                continue;
            }
            // A child may report just before it dies: read its record first.
            let exit = c.exit();
            match c.mailbox.boot_result() {
                Ok(Some(f)) => facts[i] = Some(f),
                Err(message) => {
                    // A chip whose bring-up failed because of another says so first.
                    let (kind, message) = if let Some(m) = message.strip_prefix("consequence: ") {
                        (FailKind::Consequence, m.to_string())
                    } else if let Some(m) = message.strip_prefix("timeout: ") {
                        (FailKind::TimedOut, m.to_string())
                    } else {
                        (FailKind::Task, message)
                    };
                    failures.push(c.failure(i, kind, message));
                }
                Ok(None) => match exit {
                    Some(e) => {
                        failures.push(c.failure(i, FailKind::Died(e), "during bring-up".into()))
                    }
                    None => pending += 1,
                },
            }
        }
        if !failures.is_empty() {
            // Consequences (peers noticing the failure) follow within a few wait slices.
            let until = *settle.get_or_insert_with(|| Instant::now() + Duration::from_millis(60));
            if pending == 0 || Instant::now() >= until {
                break;
            }
        } else if pending == 0 {
            return Ok(facts.into_iter().map(Option::unwrap_or_default).collect());
        } else if Instant::now() >= deadline + GRACE {
            // The chips' own deadlines (which say what they waited for) had their chance.
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Children that said nothing: a stopped one is a root cause.
    let waited = deadline.saturating_duration_since(Instant::now()) + timeout;
    for (i, c) in children.iter().enumerate() {
        if facts[i].is_none()
            && !failures.iter().any(|f| f.child == i)
            && (pto_shm::process::is_stopped(c.pid.pid) || c.exit().is_some())
        {
            failures.push(c.silence(i, waited.min(timeout + GRACE), "bring-up"));
        }
    }
    if failures.is_empty() {
        {
            let up = facts.iter().filter(|f| f.is_some()).count();
            let pending = children.len() - up;
            let waiting: Vec<&str> = children
                .iter()
                .enumerate()
                .filter(|(i, _)| facts[*i].is_none())
                .map(|(_, c)| c.who.as_str())
                .take(8)
                .collect();
            return Err(WorkerError::Timeout(format!(
                "bring-up did not finish within {timeout:?}: {up} of {} children up, still starting: {}{} (raise PTO_WAIT_TIMEOUT_MS, or run fewer chips)",
                children.len(),
                waiting.join(", "),
                if pending > waiting.len() { ", ..." } else { "" }
            )));
        }
    }
    let mut report = RunFailure::from_failures(failures)
        .ok_or_else(|| WorkerError::Timeout("bring-up failed".into()))?;
    if report.root.kind == FailKind::TimedOut {
        report.root.message.push_str(&format!(
            " (bring-up of {} children did not finish in time: raise PTO_WAIT_TIMEOUT_MS, or run fewer chips)",
            children.len()
        ));
    }
    Err(WorkerError::Boot {
        who: report.root.who.clone(),
        message: report.to_string(),
        report: Box::new(report),
    })
}

/// The host's view of its children, reachable from host kernels (the host chip's extension).
struct HostState {
    children: Vec<ChildHandle>,
    chips: usize,
    subs: usize,
    timeout: Duration,
    run: AtomicU64,
    /// Set once a child is gone or lost: the Worker cannot run any more.
    broken: Mutex<Option<String>>,
    /// Every child failure seen since the last run started.
    failures: Mutex<Vec<ChildFailure>>,
    in_run: AtomicBool,
    closing: AtomicBool,
    /// Why [`Worker::abort`] ended the Worker.
    aborted: Mutex<Option<String>>,
    on_exit: Option<Arc<ExitHook>>,
    traces: Mutex<Vec<String>>,
    tracing: AtomicBool,
}

/// What a child's result status means: 0 success, 1 its task failed, 2 the frame or the child
/// was bad, 3 its task failed because of another child, 4 a wait on the others ran out.
fn kind_of(status: u32) -> FailKind {
    match status {
        3 => FailKind::Consequence,
        4 => FailKind::TimedOut,
        _ => FailKind::Task,
    }
}

impl HostState {
    /// Keeps a failure; a child that is gone or lost makes the Worker unusable.
    fn note_failure(&self, f: ChildFailure) {
        if matches!(
            f.kind,
            FailKind::Died(_) | FailKind::Stopped | FailKind::NoAnswer
        ) {
            self.broken.lock().get_or_insert_with(|| f.to_string());
        }
        self.failures.lock().push(f);
    }

    /// Sends one frame to one child and waits for its result.
    fn send(&self, child: usize, task: u64, frame: &[u8]) -> Result<Outcome, String> {
        let c = &self.children[child];
        let mut gen = c.generation.lock();
        *gen += 1;
        let ident = Ident {
            run: self.run.load(Ordering::Relaxed),
            task,
            generation: *gen,
        };
        c.mailbox.send(ident, frame).map_err(|e| e.to_string())?;
        self.collect(task, &[(child, ident)])
            .pop()
            .unwrap_or_else(|| Err("no result".into()))
    }

    /// Waits for the results of frames already sent to `members`, all at once: a member that
    /// fails, dies or stops answering is noticed while the others are still awaited. Every
    /// failure is recorded (with the time it was seen); the results come back in member order.
    fn collect(&self, task: u64, members: &[(usize, Ident)]) -> Vec<Result<Outcome, String>> {
        let start = Instant::now();
        let deadline = start + self.timeout + GRACE;
        let mut out: Vec<Option<Result<Outcome, String>>> = vec![None; members.len()];
        let mut pending: Vec<usize> = (0..members.len()).collect();
        while let Some(&first) = pending.first() {
            let c = &self.children[members[first].0];
            // Park on the first pending member; between slices, look at all of them.
            let _ = c.mailbox.wait_ready(deadline, || {
                let changed = pending.iter().any(|&k| {
                    let ch = &self.children[members[k].0];
                    ch.mailbox.result_ready() || !ch.running()
                });
                if changed {
                    Err(())
                } else {
                    Ok(())
                }
            });
            let past = Instant::now() >= deadline;
            pending.retain(|&k| {
                let (ci, ident) = members[k];
                let ch = &self.children[ci];
                let r = if ch.mailbox.result_ready() {
                    let r = ch
                        .mailbox
                        .take_result(ident, &ch.who)
                        .map_err(|e| e.to_string())
                        .and_then(|b| Outcome::decode(&b).map_err(|e| format!("{}: {e}", ch.who)));
                    match &r {
                        Ok(o) if o.status != 0 => {
                            self.note_failure(ch.failure(ci, kind_of(o.status), o.message.clone()))
                        }
                        Ok(o) if !o.trace.is_empty() => self.traces.lock().push(o.trace.clone()),
                        Ok(_) => {}
                        Err(e) => self.note_failure(ch.failure(ci, FailKind::Task, e.clone())),
                    }
                    r
                } else if let Some(e) = ch.exit() {
                    let f = ch.failure(
                        ci,
                        FailKind::Died(e),
                        format!("while running host task {task}"),
                    );
                    let m = f.to_string();
                    self.note_failure(f);
                    Err(m)
                } else if past {
                    let f = ch.silence(ci, start.elapsed(), &format!("host task {task}"));
                    let m = f.to_string();
                    // It cannot be trusted with another frame: stop it (a stopped process
                    // takes SIGKILL too).
                    ch.kill();
                    self.note_failure(f);
                    Err(m)
                } else {
                    return true;
                };
                out[k] = Some(r);
                false
            });
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err("no result".into())))
            .collect()
    }
}

fn descs(ctx: &KernelCtx<'_>) -> Result<Vec<TensorDesc>, KernelError> {
    (0..ctx.num_tensors())
        .map(|i| {
            let t = ctx.tensor(i)?;
            let (name, off) = t.buffer().shared_at().ok_or_else(|| {
                KernelError::msg(format!(
                    "tensor argument {i} is not in shared memory: make it with Worker::tensor"
                ))
            })?;
            Ok(TensorDesc {
                segment: name.to_string(),
                buffer_offset: off as u64,
                buffer_len: t.buffer().len() as u64,
                offset: t.region().offset() as u64,
                dtype: t.dtype(),
                mode: ctx.mode(i)?,
                shape: t.shape().iter().map(|&v| v as u64).collect(),
                strides: t.strides().iter().map(|&v| v as u64).collect(),
            })
        })
        .collect()
}

/// The user's scalars (bits and dtype) and the routing scalars.
type SplitScalars = (Vec<(u64, DType)>, Vec<u64>);

/// Splits the routing scalars (the last `k`) from the user's.
fn split_scalars(ctx: &KernelCtx<'_>, k: usize) -> Result<SplitScalars, KernelError> {
    let all = ctx.scalars();
    if all.len() < k {
        return Err(KernelError::msg("missing routing scalars"));
    }
    let (user, route) = all.split_at(all.len() - k);
    Ok((
        user.iter().map(|s| (s.bits(), s.dtype())).collect(),
        route.iter().map(Scalar::bits).collect(),
    ))
}

fn host_kernels() -> Result<KernelRegistry, pto_core::RegistryError> {
    let mut k = KernelRegistry::new();
    // Routing scalars: [.., program, chip].
    k.register("chip", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let (scalars, route) = split_scalars(ctx, 2)?;
        let (program, chip) = (route[0] as u32, route[1] as usize);
        let frame = Frame {
            kind: FrameKind::Chip,
            index: program,
            tensors: descs(ctx)?,
            scalars,
            trace: st.tracing.load(Ordering::Relaxed),
        }
        .encode();
        check(
            st.send(chip, ctx.task().get(), &frame),
            &st.children[chip].who,
            ctx,
        )
    })?;
    // Routing scalars: [.., program, n, chip_0 .. chip_n-1].
    k.register("group", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let all = ctx.scalars();
        let n = all
            .len()
            .checked_sub(1)
            .and_then(|i| all.get(i))
            .map(|s| s.bits() as usize)
            .ok_or_else(|| KernelError::msg("missing group size"))?;
        let (scalars, route) = split_scalars(ctx, n + 3)?;
        let program = route[0] as u32;
        let mut members: Vec<usize> = route[2..2 + n].iter().map(|&c| c as usize).collect();
        let frame = Frame {
            kind: FrameKind::Chip,
            index: program,
            tensors: descs(ctx)?,
            scalars,
            trace: st.tracing.load(Ordering::Relaxed),
        }
        .encode();
        // Take every member's lock in one order (no two groups can deadlock), publish all
        // frames, then collect every result.
        members.sort_unstable();
        let mut guards: Vec<_> = members
            .iter()
            .map(|&m| st.children[m].generation.lock())
            .collect();
        let run = st.run.load(Ordering::Relaxed);
        let mut idents = Vec::with_capacity(members.len());
        for (g, &m) in guards.iter_mut().zip(&members) {
            **g += 1;
            let ident = Ident {
                run,
                task: ctx.task().get(),
                generation: **g,
            };
            st.children[m]
                .mailbox
                .send(ident, &frame)
                .map_err(|e| KernelError::msg(e.to_string()))?;
            idents.push((m, ident));
        }
        let results = st.collect(ctx.task().get(), &idents);
        drop(guards);
        let mut first_err = None;
        for ((m, _), r) in idents.iter().zip(results) {
            let who = &st.children[*m].who;
            match r {
                Ok(o) if o.status == 0 => {}
                Ok(o) => {
                    first_err.get_or_insert(format!("{who}: {}", o.message));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(KernelError::msg(e)),
        }
    })?;
    // Routing scalars: [.., function].
    k.register("sub", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let (scalars, route) = split_scalars(ctx, 1)?;
        let frame = Frame {
            kind: FrameKind::Sub,
            index: route[0] as u32,
            tensors: descs(ctx)?,
            scalars,
            trace: false,
        }
        .encode();
        let subs: Vec<usize> = (st.chips..st.chips + st.subs).collect();
        if subs.is_empty() {
            return Err(KernelError::msg("the Worker has no sub-workers"));
        }
        // An idle sub-worker if there is one, else the task's own choice (it waits its turn).
        let pick = subs
            .iter()
            .copied()
            .find(|&s| st.children[s].generation.try_lock().is_some())
            .unwrap_or(subs[ctx.task().get() as usize % subs.len()]);
        check(
            st.send(pick, ctx.task().get(), &frame),
            &st.children[pick].who,
            ctx,
        )
    })?;
    // Routing scalars: [.., function, child worker].
    k.register("worker", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let (scalars, route) = split_scalars(ctx, 2)?;
        let child = st.chips + st.subs + route[1] as usize;
        if child >= st.children.len() {
            return Err(KernelError::msg(format!("no child worker {}", route[1])));
        }
        let frame = Frame {
            kind: FrameKind::Worker,
            index: route[0] as u32,
            tensors: descs(ctx)?,
            scalars,
            trace: false,
        }
        .encode();
        check(
            st.send(child, ctx.task().get(), &frame),
            &st.children[child].who,
            ctx,
        )
    })?;
    Ok(k)
}

fn host<'a>(ctx: &'a KernelCtx<'_>) -> Result<&'a HostState, KernelError> {
    ctx.ext::<HostState>()
        .ok_or_else(|| KernelError::msg("host kernel outside a Worker"))
}

fn check(r: Result<Outcome, String>, who: &str, ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    match r {
        Ok(o) if o.status == 0 => Ok(()),
        Ok(o) => Err(KernelError::msg(format!(
            "{who}: host task {}: {}",
            ctx.task(),
            o.message
        ))),
        Err(e) => Err(KernelError::msg(format!(
            "{who}: host task {}: {e}",
            ctx.task()
        ))),
    }
}

/// The host orchestration API: submit chip programs, groups and sub-worker closures.
pub struct HostOrch<'o, 'a> {
    orch: &'o mut Orch<'a>,
    spec: &'o Spec,
}

impl fmt::Debug for HostOrch<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostOrch").finish_non_exhaustive()
    }
}

impl<'a> HostOrch<'_, 'a> {
    fn program(&self, name: &str) -> Result<u64, OrchError> {
        self.spec
            .programs
            .iter()
            .position(|p| p.0 == name)
            .map(|p| p as u64)
            .ok_or_else(|| OrchError::msg(format!("no chip program named {name:?}")))
    }

    fn chip_index(&self, chip: usize) -> Result<u64, OrchError> {
        if chip >= self.spec.chips {
            return Err(OrchError::msg(format!(
                "chip {chip} does not exist (the Worker has {})",
                self.spec.chips
            )));
        }
        Ok(chip as u64)
    }

    /// Runs chip program `program` on chip `chip` with `args` (host tensors and scalars).
    ///
    /// # Errors
    ///
    /// An unknown program or chip, or the errors of [`Orch::submit`].
    pub fn submit_chip(
        &mut self,
        chip: usize,
        program: &str,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let (p, c) = (self.program(program)?, self.chip_index(chip)?);
        self.orch.submit("chip", args.scalar(p).scalar(c))
    }

    /// Runs `program` on every chip of `chips` at the same time (what a collective needs): no
    /// member starts before every member is free.
    ///
    /// # Errors
    ///
    /// An empty or repeated member list, an unknown program or chip, or the errors of
    /// [`Orch::submit`].
    pub fn submit_group(
        &mut self,
        chips: &[usize],
        program: &str,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let p = self.program(program)?;
        let mut seen = vec![false; self.spec.chips];
        if chips.is_empty() {
            return Err(OrchError::msg("a group needs at least one chip"));
        }
        let mut args = args.scalar(p).scalar(chips.len() as u64);
        for &c in chips {
            self.chip_index(c)?;
            if std::mem::replace(&mut seen[c], true) {
                return Err(OrchError::msg(format!(
                    "chip {c} is listed twice in a group"
                )));
            }
        }
        for &c in chips {
            args = args.scalar(c as u64);
        }
        // The size goes last so the kernel can find the member list.
        args = args.scalar(chips.len() as u64);
        self.orch.submit("group", args)
    }

    /// Runs sub-worker closure `name` on a free sub-worker.
    ///
    /// # Errors
    ///
    /// An unknown closure, or the errors of [`Orch::submit`].
    pub fn submit_sub(&mut self, name: &str, args: TaskArgs) -> Result<Submitted, OrchError> {
        let f = self
            .spec
            .subs_fns
            .iter()
            .position(|s| s.0 == name)
            .ok_or_else(|| OrchError::msg(format!("no sub-worker closure named {name:?}")))?;
        self.orch.submit("sub", args.scalar(f as u64))
    }

    /// Runs closure `name` on child Worker `w` (L4).
    ///
    /// # Errors
    ///
    /// An unknown closure or child Worker, or the errors of [`Orch::submit`].
    pub fn submit_worker(
        &mut self,
        w: usize,
        name: &str,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        if w >= self.spec.workers.len() {
            return Err(OrchError::msg(format!(
                "child worker {w} does not exist (there are {})",
                self.spec.workers.len()
            )));
        }
        let f = self
            .spec
            .worker_fns
            .iter()
            .position(|s| s.0 == name)
            .ok_or_else(|| OrchError::msg(format!("no child-worker closure named {name:?}")))?;
        self.orch
            .submit("worker", args.scalar(f as u64).scalar(w as u64))
    }

    /// Runs `f` in a nested scope (see [`Orch::scope`]): host tasks submitted inside are
    /// reclaimed once it ends, so long host orchestrations stay within the host rings.
    ///
    /// # Errors
    ///
    /// What `f` returns.
    pub fn scope<R>(
        &mut self,
        f: impl FnOnce(&mut HostOrch<'_, 'a>) -> Result<R, OrchError>,
    ) -> Result<R, OrchError> {
        let spec = self.spec;
        self.orch.scope(|o| {
            let mut h = HostOrch { orch: o, spec };
            f(&mut h)
        })
    }

    /// The underlying orchestration (scopes, reads, dummy tasks).
    pub fn orch(&mut self) -> &mut Orch<'a> {
        self.orch
    }
}

/// A running Worker: its children are up; runs host orchestrations.
pub struct Worker {
    spec: Arc<Spec>,
    kernels: Arc<KernelRegistry>,
    state: Arc<HostState>,
    host: Chip,
    facts: Vec<BootFacts>,
    world: Option<ShmWorld>,
    init_time: Duration,
    closed: bool,
    watcher: Option<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("chips", &self.spec.chips)
            .field("subs", &self.spec.subs)
            .finish_non_exhaustive()
    }
}

/// A zeroed tensor in shared memory, usable before a Worker exists (for example for
/// [`WorkerBuilder::stage`]).
///
/// # Errors
///
/// A bad shape or no space in `/dev/shm`.
pub fn shared_tensor(shape: &[usize], dtype: DType) -> Result<Tensor, WorkerError> {
    let n: usize = shape.iter().product::<usize>() * dtype.size();
    let buf = shared::shared_buffer(n).map_err(|e| WorkerError::Args(e.to_string()))?;
    Tensor::new(buf, dtype, shape, 0).map_err(|e| WorkerError::Args(e.to_string()))
}

/// What a successful run did.
#[derive(Debug)]
pub struct WorkerReport {
    /// The host run's report.
    pub host: RunReport,
    /// Chrome trace events of the host and every chip (empty unless asked for).
    pub trace_events: Vec<serde_json::Value>,
}

impl Worker {
    /// A builder.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::new()
    }

    /// What chip `i` reported at bring-up.
    pub fn chip_facts(&self, i: usize) -> Option<&ChipFacts> {
        self.facts.get(i)
    }

    /// Time `init` took, from the first fork to every chip up.
    pub fn init_time(&self) -> Duration {
        self.init_time
    }

    /// A zeroed host tensor in shared memory (children see it without copies).
    /// Same as [`shared_tensor`].
    ///
    /// # Errors
    ///
    /// A bad shape or no space in `/dev/shm`.
    pub fn tensor(&self, shape: &[usize], dtype: DType) -> Result<Tensor, WorkerError> {
        shared_tensor(shape, dtype)
    }

    fn usable(&self) -> Result<(), WorkerError> {
        if self.closed {
            return Err(WorkerError::Broken("closed".into()));
        }
        if let Some(b) = self.state.broken.lock().clone() {
            return Err(WorkerError::Broken(b));
        }
        // A child's death is noticed by the watcher thread (or while the host waits for it).
        Ok(())
    }

    /// Checks that every child is still there: the error names the first that is not (with
    /// its exit status), so code that prepares inputs for a long time can stop early.
    ///
    /// # Errors
    ///
    /// [`WorkerError::Broken`] once a child died or was lost, or the Worker was closed.
    pub fn check(&self) -> Result<(), WorkerError> {
        for (i, c) in self.state.children.iter().enumerate() {
            if let Some(e) = c.exit() {
                self.state
                    .note_failure(c.failure(i, FailKind::Died(e), String::new()));
            }
        }
        self.usable()
    }

    /// Runs a host orchestration.
    ///
    /// # Errors
    ///
    /// [`WorkerError::Run`] when a chip task, a sub-worker or the orchestration failed (named;
    /// dependent tasks were poisoned; the Worker stays usable), [`WorkerError::Broken`] when a
    /// child died (the Worker is then unusable).
    pub fn run<F>(&self, f: F) -> Result<RunReport, WorkerError>
    where
        F: Fn(&mut HostOrch<'_, '_>) -> Result<(), OrchError> + Send + Sync + 'static,
    {
        self.run_with(f, false).map(|r| r.host)
    }

    /// [`Worker::run`] with a trace of the host and every chip on one clock.
    ///
    /// # Errors
    ///
    /// As [`Worker::run`].
    pub fn run_with<F>(&self, f: F, trace: bool) -> Result<WorkerReport, WorkerError>
    where
        F: Fn(&mut HostOrch<'_, '_>) -> Result<(), OrchError> + Send + Sync + 'static,
    {
        self.usable()?;
        self.state.failures.lock().clear();
        self.state.in_run.store(true, Ordering::Release);
        self.state.run.fetch_add(1, Ordering::Relaxed);
        self.state.tracing.store(trace, Ordering::Relaxed);
        self.state.traces.lock().clear();
        let spec = self.spec.clone();
        let program = Program::new("host", self.kernels.clone(), move |o| {
            let mut h = HostOrch {
                orch: o,
                spec: &spec,
            };
            f(&mut h)
        });
        let r = self.host.run_with(&program, RunOptions { trace });
        self.state.in_run.store(false, Ordering::Release);
        let failures = std::mem::take(&mut *self.state.failures.lock());
        if let Some(why) = self.state.aborted.lock().clone() {
            return Err(WorkerError::Broken(why));
        }
        if let Some(mut report) = RunFailure::from_failures(failures) {
            report.host = r.err();
            return Err(WorkerError::Failed(Box::new(report)));
        }
        if let Some(b) = self.state.broken.lock().clone() {
            return Err(WorkerError::Broken(b));
        }
        let host = r?;
        let mut trace_events = Vec::new();
        if let Some(t) = &host.trace {
            let mut t = t.clone();
            t.chip = 0;
            for mut e in t.chrome_events() {
                // The host is its own process in the trace.
                e["pid"] = serde_json::json!(u32::MAX);
                if e["name"] == "process_name" {
                    e["args"]["name"] = serde_json::json!("host");
                }
                trace_events.push(e);
            }
        }
        for chunk in self.state.traces.lock().drain(..) {
            if let Ok(serde_json::Value::Array(v)) = serde_json::from_str(&chunk) {
                trace_events.extend(v);
            }
        }
        Ok(WorkerReport { host, trace_events })
    }

    /// Test hook: sends raw bytes as chip `chip`'s next frame, claiming `claimed_len` bytes,
    /// and returns the child's verdict.
    #[doc(hidden)]
    pub fn debug_send_raw(
        &self,
        chip: usize,
        bytes: &[u8],
        claimed_len: u32,
    ) -> Result<Outcome, WorkerError> {
        let c = self
            .state
            .children
            .get(chip)
            .ok_or_else(|| WorkerError::Args(format!("no child {chip}")))?;
        let mut g = c.generation.lock();
        *g += 1;
        let ident = Ident {
            run: u64::MAX,
            task: u64::MAX,
            generation: *g,
        };
        c.mailbox.inject_garbage(ident, bytes, claimed_len);
        let b = c.mailbox.wait_result(
            ident,
            c.pid.pid,
            &c.who,
            Instant::now() + self.spec.timeout,
            || c.running(),
        )?;
        Outcome::decode(&b).map_err(|e| WorkerError::Corrupt(e.to_string()))
    }

    /// The pid of chip or sub-worker `i` (chips first).
    pub fn child_pid(&self, i: usize) -> Option<u32> {
        self.state.children.get(i).map(|c| c.pid.pid)
    }

    /// Ends the Worker from any thread: marks it unusable with `why` and kills every child, so
    /// that a run in progress (on another thread) fails within a few tens of milliseconds with
    /// [`WorkerError::Broken`] naming `why`. Used for Ctrl-C in the Python module. Children are
    /// reaped and segments removed by [`Worker::close`] (or drop) as usual.
    pub fn abort(&self, why: &str) {
        self.state
            .aborted
            .lock()
            .get_or_insert_with(|| why.to_string());
        self.state
            .broken
            .lock()
            .get_or_insert_with(|| why.to_string());
        for c in &self.state.children {
            c.mailbox.shutdown();
            c.kill();
        }
    }

    /// Shuts every child down and reaps it (children that do not leave within a second are
    /// killed), then removes every segment of the Worker's world.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.state.closing.store(true, Ordering::Release);
        if let Some(w) = self.watcher.take() {
            w.thread().unpark();
            let _ = w.join();
        }
        reap_all(&self.state.children, Duration::from_secs(1));
        self.world.take();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
    }
}
