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
//!
//! ## Children as threads
//!
//! [`WorkerBuilder::in_process`] runs every chip and sub-worker on threads of this process
//! instead: the same mailboxes, world and windows in shared memory, the same results, in one
//! process (any number of threads may exist). What a process boundary gave is lost: a child that
//! crashes takes the process with it, and one stuck in a kernel cannot be killed (abort and
//! close leave its thread behind, with its segments, until it returns).
//!
//! ```
//! use pto_core::{CoreKind, DType, KernelRegistry, TaskArgs};
//! use pto_worker::Worker;
//!
//! let mut kernels = KernelRegistry::new();
//! kernels.register("inc", CoreKind::Aiv, |ctx| {
//!     ctx.output::<i32>(0)?.for_each_mut(|x| *x += 1);
//!     Ok(())
//! })?;
//! let _busy = std::thread::spawn(|| ()); // another thread: no matter in process
//! let w = Worker::builder()
//!     .chips(2)
//!     .in_process()
//!     .program("inc", kernels, |o, call| {
//!         o.submit("inc", TaskArgs::new().inout(call.tensor(0)?)).map(|_| ())
//!     })
//!     .init()?;
//! assert_eq!(w.child_pid(0), None); // a thread, not a process
//! let x = w.tensor(&[2], DType::I32)?;
//! let xa = x.clone();
//! w.run(move |h| {
//!     h.submit_chip(0, "inc", TaskArgs::new().inout(&xa))?;
//!     h.submit_chip(1, "inc", TaskArgs::new().inout(&xa))?;
//!     Ok(())
//! })?;
//! assert_eq!(x.read::<i32>()?, vec![2, 2]);
//! w.close();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod builder;
mod child;
mod error;
mod failure;
pub mod frame;
mod host;
pub mod mailbox;
mod orch;
mod pipe;
pub mod shared;
mod spec;
mod supervise;

use std::any::Any;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pto_comm::check::{CheckReport, Checker};
use pto_comm::shm::ShmWorld;
use pto_core::{
    Chip, DType, KernelRegistry, OrchError, Program, RunOptions, RunReport, Tensor, TensorError,
};

use frame::Outcome;
use host::HostState;
use mailbox::BootFacts;
use spec::{Nested, Spec};
use supervise::reap_all;

pub use builder::WorkerBuilder;
pub use error::WorkerError;
pub use failure::{signal_name, ChildExit, ChildFailure, FailKind, RunFailure};
pub use mailbox::BootFacts as ChipFacts;
pub use orch::HostOrch;
pub use pto_shm::Fault;
pub use spec::{ChipCall, ChipFn, ChipMain, SubCall, SubFn};

/// A closure run on a child Worker (L4): it gets the child's own Worker.
pub type WorkerFn = dyn Fn(&Worker, &SubCall) -> Result<(), String> + Send + Sync;

/// A running Worker: its children are up; runs host orchestrations.
pub struct Worker {
    spec: Arc<Spec>,
    kernels: Arc<KernelRegistry>,
    state: Arc<HostState>,
    host: Chip,
    facts: Vec<BootFacts>,
    world: Option<Arc<ShmWorld>>,
    init_time: Duration,
    closed: bool,
    watcher: Option<std::thread::JoinHandle<()>>,
    check: Option<CheckFiles>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("chips", &self.spec.chips)
            .field("subs", &self.spec.subs)
            .finish_non_exhaustive()
    }
}

// Starting a Worker, and the registrations that name one (the rest of `WorkerBuilder` is in
// `builder.rs`, which does not name `Worker`).
impl WorkerBuilder {
    /// Adds a child Worker (L4): a process that builds its own Worker with `factory` (forking
    /// its own chips) and runs the closures registered with [`WorkerBuilder::worker_fn`].
    pub fn child_worker<F>(self, factory: F) -> Self
    where
        F: Fn() -> WorkerBuilder + Send + Sync + 'static,
    {
        self.nested(Arc::new(move || {
            factory()
                .init()
                .map(|w| Box::new(w) as Nested)
                .map_err(|e| e.to_string())
        }))
    }

    /// Registers a closure that child Workers run ([`HostOrch::submit_worker`]).
    pub fn worker_fn<F>(self, name: &str, f: F) -> Self
    where
        F: Fn(&Worker, &SubCall) -> Result<(), String> + Send + Sync + 'static,
    {
        let f: Arc<WorkerFn> = Arc::new(f);
        self.nested_fn(
            name,
            Arc::new(
                move |w: &dyn Any, call: &SubCall| match w.downcast_ref::<Worker>() {
                    Some(w) => f(w, call),
                    None => Err("not a child worker".into()),
                },
            ),
        )
    }

    /// Forks the children, waits until every chip is up, and starts the host scheduler.
    ///
    /// # Errors
    ///
    /// Bad sizes, a process that already has threads, a chip whose bring-up failed (named,
    /// with its message: every child is then reaped and no segment is left), or a timeout.
    pub fn init(self) -> Result<Worker, WorkerError> {
        let checking = self.checking();
        let (spec, on_exit) = self.checked()?;
        // The checker goes in before the fork: every chip inherits it.
        let check = if checking {
            Some(CheckFiles::install(spec.chips)?)
        } else {
            None
        };
        let up = supervise::start(&spec)?;
        let total = up.children.len();
        let deaths = up.world.as_deref().map(ShmWorld::supervise);
        let state = HostState::new(up.children, &spec, on_exit, deaths);
        let host = match Chip::builder()
            .chip_id(u32::MAX)
            .aic_cores(0)
            .aiv_cores(total as u32 + 1)
            .threads(total + 1)
            .ring_heap_bytes(16 << 20)
            .ring_allocator(Arc::new(shared::shared_buffer))
            .extension(state.clone())
            // Host kernels wait for children with deadlines: a run of one chip task needs no
            // hand-off to a host thread.
            .orchestrator_runs_tasks(true)
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
            kernels: Arc::new(orch::host_kernels().map_err(|e| WorkerError::Args(e.to_string()))?),
            state,
            host,
            facts: up.facts,
            world: up.world,
            init_time: up.t0.elapsed(),
            closed: false,
            watcher: Some(watcher),
            check,
        })
    }
}

/// The checker of a Worker built with [`WorkerBuilder::check`], and the folder of its chips'
/// records: the checker is removed, and the folder with it, when dropped (in the process that
/// installed them; a failed `init` drops it too).
struct CheckFiles {
    checker: Arc<Checker>,
    dir: std::path::PathBuf,
    pid: u32,
}

impl CheckFiles {
    fn install(chips: usize) -> Result<CheckFiles, WorkerError> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!(
            "pto-check-worker-{pid}-{}",
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| {
            WorkerError::Args(format!("check: cannot create {}: {e}", dir.display()))
        })?;
        Ok(CheckFiles {
            checker: Checker::install_files(chips, None, dir.clone()),
            dir,
            pid,
        })
    }
}

impl Drop for CheckFiles {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            Checker::uninstall();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A zeroed tensor in shared memory, usable before a Worker exists (for example for
/// [`WorkerBuilder::stage`]).
///
/// # Errors
///
/// A bad shape or no space in `/dev/shm`.
pub fn shared_tensor(shape: &[usize], dtype: DType) -> Result<Tensor, WorkerError> {
    let bad = |e: TensorError| WorkerError::Args(e.to_string());
    let n = Tensor::byte_size(shape, dtype).map_err(bad)?;
    let buf = shared::shared_buffer(n).map_err(|e| WorkerError::Args(e.to_string()))?;
    Tensor::new(buf, dtype, shape, 0).map_err(bad)
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

    /// With [`WorkerBuilder::check`]: what the checker found in the runs so far (the races
    /// between the chips' window accesses, stale signals); `None` without it.
    pub fn check_report(&self) -> Option<CheckReport> {
        self.check.as_ref().map(|c| c.checker.report())
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
            let mut h = HostOrch::new(o, &spec);
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
            // The host is its own process in the trace, with host lanes.
            trace_events.extend(t.chrome_events_as(&pto_core::trace::Lanes {
                pid: u32::MAX,
                process: "host".into(),
                host: true,
            }));
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
        let t = {
            let mut p = c.pipe.lock();
            self.state
                .post_locked(chip, &mut p, u64::MAX, |lane, ident| {
                    lane.inject_garbage(ident, bytes, claimed_len);
                    Ok(())
                })
                .map_err(WorkerError::Corrupt)?
        };
        self.state
            .wait(&[t])
            .pop()
            .unwrap_or_else(|| Err("no result".into()))
            .map_err(WorkerError::Corrupt)
    }

    /// Test hook: the most frames child `i` ever had in flight at once (queued behind the one
    /// it runs; at most its number of mailbox lanes).
    #[doc(hidden)]
    pub fn debug_peak_in_flight(&self, i: usize) -> Option<usize> {
        self.state.children.get(i).map(|c| c.pipe.lock().peak)
    }

    /// The pid of chip or sub-worker `i` (chips first); `None` for a child that is a thread
    /// of this process ([`WorkerBuilder::in_process`]).
    pub fn child_pid(&self, i: usize) -> Option<u32> {
        self.state
            .children
            .get(i)
            .filter(|c| !c.in_process())
            .map(|c| c.pid.pid)
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
            c.shutdown();
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
        self.check.take();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shutdown();
    }
}
