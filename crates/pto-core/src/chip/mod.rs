//! The simulated chip: logical AIC/AIV cores served by a few OS threads, and the orchestrator
//! API that chip programs use to submit tasks.
//!
//! Threads fit the machine: a chip with 24 logical cores on a 2-CPU host runs 2 threads, each
//! of which takes a ready block whose core kind has a free logical core, runs it, and takes the
//! next, with no chip-wide lock (see `crate::engine`). An idle thread spins briefly, then parks.
//! The orchestration runs on the thread that called [`Chip::run`], concurrently with the cores.
//! See `docs/design/chip-scheduler.md`.

mod orch;
mod worker;

pub use orch::{Orch, Submitted};

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::buffer::RunningTasks;
use crate::config::Settings;
use crate::deferred::{CompletionSender, QueueHost};
use crate::engine::submit::{Orchestrator, RingConfig};
use crate::engine::{Engine, EngineConfig, RunStats, NUM_RINGS};
use crate::error::{OrchError, RunError};
use crate::kernel::KernelRegistry;
use crate::trace::Trace;

/// The orchestration of a chip program.
pub type OrchFn = dyn Fn(&mut Orch<'_>) -> Result<(), OrchError> + Send + Sync;

/// A chip program: an orchestration plus the kernels it may submit.
#[derive(Clone)]
pub struct Program {
    name: String,
    kernels: Arc<KernelRegistry>,
    orch: Arc<OrchFn>,
}

impl fmt::Debug for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.name)
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

impl Program {
    /// A program named `name` that runs `orch` with `kernels`.
    pub fn new<F>(name: &str, kernels: impl Into<Arc<KernelRegistry>>, orch: F) -> Program
    where
        F: Fn(&mut Orch<'_>) -> Result<(), OrchError> + Send + Sync + 'static,
    {
        Program {
            name: name.to_string(),
            kernels: kernels.into(),
            orch: Arc::new(orch),
        }
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its kernels.
    pub fn kernels(&self) -> &Arc<KernelRegistry> {
        &self.kernels
    }
}

/// How a chip is shaped and how long it waits.
#[derive(Clone, Debug)]
pub struct ChipConfig {
    /// Chip number (the process id in traces).
    pub chip_id: u32,
    /// Logical AIC (matrix) cores.
    pub aic_cores: u32,
    /// Logical AIV (vector) cores.
    pub aiv_cores: u32,
    /// OS threads; default `min(aic + aiv, CPUs)`.
    pub threads: usize,
    /// Live tasks per scope ring.
    pub ring_task_window: usize,
    /// Output bytes per scope ring.
    pub ring_heap_bytes: usize,
    /// Deadline of orchestrator waits (ring space, tensor reads).
    pub wait_timeout: Duration,
    /// A run in which no task finishes for this long fails.
    pub stall_timeout: Duration,
    /// How long an idle thread spins before parking.
    pub spin: Duration,
    /// The orchestrating thread runs ready tasks itself while it waits for the run to end
    /// (see [`ChipBuilder::orchestrator_runs_tasks`]).
    pub orchestrator_runs_tasks: bool,
    /// One core thread stays parked while the orchestrating thread submits, so that the
    /// orchestrating thread keeps a CPU (see [`ChipBuilder::orchestrator_cpu`]).
    pub orchestrator_cpu: bool,
}

/// Builds a [`Chip`]. Unset values come from the `PTO_*` variables, then defaults.
///
/// ```
/// use pto_core::Chip;
/// let chip = Chip::builder().aic_cores(1).aiv_cores(2).build()?;
/// assert_eq!(chip.config().aiv_cores, 2);
/// # Ok::<(), pto_core::RunError>(())
/// ```
#[derive(Default)]
pub struct ChipBuilder {
    chip_id: u32,
    aic: Option<u32>,
    aiv: Option<u32>,
    threads: Option<usize>,
    window: Option<usize>,
    heap: Option<usize>,
    wait: Option<Duration>,
    stall: Option<Duration>,
    spin: Option<Duration>,
    orch_runs: bool,
    orch_cpu: Option<bool>,
    ext: Option<Arc<dyn Any + Send + Sync>>,
    queue: Option<Arc<dyn QueueHost>>,
    alloc: Option<Arc<crate::buffer::BufferAllocator>>,
    thread_main: Option<Arc<ThreadMain>>,
}

/// Runs a chip thread's whole life (the function it is given) inside something of the
/// embedder's; see [`ChipBuilder::thread_main`].
pub type ThreadMain = dyn Fn(Box<dyn FnOnce() + Send>) + Send + Sync;

impl fmt::Debug for ChipBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChipBuilder")
            .field("aic", &self.aic)
            .field("aiv", &self.aiv)
            .finish_non_exhaustive()
    }
}

impl ChipBuilder {
    /// Chip number, used in traces and messages.
    pub fn chip_id(mut self, id: u32) -> Self {
        self.chip_id = id;
        self
    }
    /// Logical AIC cores (default 2).
    pub fn aic_cores(mut self, n: u32) -> Self {
        self.aic = Some(n);
        self
    }
    /// Logical AIV cores (default 4).
    pub fn aiv_cores(mut self, n: u32) -> Self {
        self.aiv = Some(n);
        self
    }
    /// OS threads serving the cores.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }
    /// Live tasks per scope ring.
    pub fn ring_task_window(mut self, n: usize) -> Self {
        self.window = Some(n);
        self
    }
    /// Output bytes per scope ring.
    pub fn ring_heap_bytes(mut self, n: usize) -> Self {
        self.heap = Some(n);
        self
    }
    /// Deadline of orchestrator waits.
    pub fn wait_timeout(mut self, d: Duration) -> Self {
        self.wait = Some(d);
        self
    }
    /// Stall watchdog of a run.
    pub fn stall_timeout(mut self, d: Duration) -> Self {
        self.stall = Some(d);
        self
    }
    /// How long idle threads (and the orchestrating thread, while it waits) spin before they
    /// park (default `PTO_SPIN_US`). Zero suits chips whose tasks are long.
    pub fn spin(mut self, d: Duration) -> Self {
        self.spin = Some(d);
        self
    }
    /// Lets the orchestrating thread run ready tasks itself while it waits for the run's last
    /// tasks (as an OpenMP `taskwait` does), instead of handing each one to a core thread: a
    /// run of a few tasks then costs no thread hand-off and no wake-up. Default off. Only for
    /// chips whose kernels bound their own waits: a kernel that never returns on the
    /// orchestrating thread hangs the run instead of being reported as a stall. The Worker's
    /// host chip uses it (its kernels wait for children with deadlines), and so do its chip
    /// children (the parent's deadline for each frame reports a hung kernel first).
    pub fn orchestrator_runs_tasks(mut self, on: bool) -> Self {
        self.orch_runs = on;
        self
    }
    /// Keeps a CPU for the orchestrating thread: the chip's last core thread runs tasks only
    /// while the orchestrating thread waits (for ring space, a tensor's producers or the end of
    /// the run) and stays parked while it submits, as an OpenMP team's master runs tasks only
    /// at a `taskwait`. Default (`PTO_ORCH_CPU`, else auto): on when the core threads alone
    /// fill every CPU (at least two threads, and as many as CPUs) and the orchestrating thread
    /// does not run tasks itself. A parked reserved thread still runs queued work when nothing
    /// has moved for a millisecond (an orchestrating thread blocked outside the engine, core
    /// threads stuck in kernels that wait for a queued task), so it never causes a hang.
    pub fn orchestrator_cpu(mut self, on: bool) -> Self {
        self.orch_cpu = Some(on);
        self
    }
    /// An object every kernel can reach through [`crate::KernelCtx::ext`] (for example a
    /// communication context).
    pub fn extension(mut self, ext: Arc<dyn Any + Send + Sync>) -> Self {
        self.ext = Some(ext);
        self
    }

    /// The completion queue deferred tasks' tokens are posted to (default: a 4096-entry queue
    /// in the heap). Pass one that lives in shared memory to let other processes post.
    pub fn completion_queue(mut self, q: Arc<dyn QueueHost>) -> Self {
        self.queue = Some(q);
        self
    }

    /// Where the rings' output memory comes from (default: the heap). A host-level chip puts it
    /// in shared memory so that child processes see runtime-allocated outputs.
    pub fn ring_allocator(mut self, f: Arc<crate::buffer::BufferAllocator>) -> Self {
        self.alloc = Some(f);
        self
    }

    /// Runs each of the chip's threads inside `f`: `f` gets the thread's main function and
    /// must call it. For embedders that keep per-thread state for the thread's life (the
    /// Python package attaches each thread to the interpreter once, so that Python kernels do
    /// not set up and tear down a thread state per call).
    pub fn thread_main(mut self, f: Arc<ThreadMain>) -> Self {
        self.thread_main = Some(f);
        self
    }

    /// Starts the chip's threads.
    ///
    /// # Errors
    ///
    /// [`RunError::Config`] for a chip without cores, zero threads, or a ring window below 4.
    pub fn build(self) -> Result<Chip, RunError> {
        let env = Settings::from_env().map_err(|e| RunError::Config(e.to_string()))?;
        let aic = self.aic.unwrap_or(2);
        let aiv = self.aiv.unwrap_or(4);
        if aic + aiv == 0 {
            return Err(RunError::Config("a chip needs at least one core".into()));
        }
        if aic > 1024 || aiv > 2048 {
            return Err(RunError::Config(format!(
                "{aic} AIC and {aiv} AIV cores exceed the supported 1024 and 2048"
            )));
        }
        let cpus = std::thread::available_parallelism().map_or(2, usize::from);
        let threads = self
            .threads
            .or(env.threads)
            .unwrap_or_else(|| ((aic + aiv) as usize).min(cpus));
        if threads == 0 {
            return Err(RunError::Config("a chip needs at least one thread".into()));
        }
        let window = self.window.unwrap_or(env.ring_task_window);
        if window < 4 {
            return Err(RunError::Config(format!(
                "ring task window {window} is below the minimum of 4"
            )));
        }
        let orchestrator_cpu = !self.orch_runs
            && threads >= 2
            && self.orch_cpu.or(env.orch_cpu).unwrap_or(threads >= cpus);
        let cfg = ChipConfig {
            chip_id: self.chip_id,
            aic_cores: aic,
            aiv_cores: aiv,
            threads,
            ring_task_window: window,
            ring_heap_bytes: self.heap.unwrap_or(env.ring_heap_bytes),
            wait_timeout: self.wait.unwrap_or(env.wait_timeout),
            stall_timeout: self.stall.unwrap_or(env.stall_timeout),
            spin: self.spin.unwrap_or(env.spin),
            orchestrator_runs_tasks: self.orch_runs,
            orchestrator_cpu,
        };
        let sender = CompletionSender::new(
            self.queue
                .unwrap_or_else(|| Arc::new(pto_shm::ring::HeapQueue::new(4096))),
        );
        let engine = Arc::new(Engine::new(EngineConfig {
            aic,
            aiv,
            threads,
            // Every ring full at once, plus room for what a stalled run leaves behind.
            max_slots: NUM_RINGS * window + 1024,
            spin: cfg.spin,
            wait: cfg.wait_timeout,
            sender,
            ext: self.ext,
            hold: cfg.orchestrator_runs_tasks,
            reserve: cfg.orchestrator_cpu,
        }));
        let running: Arc<dyn RunningTasks> = engine.clone();
        crate::buffer::register_running(Arc::downgrade(&running));
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let e = engine.clone();
            let wrap = self.thread_main.clone();
            let h = std::thread::Builder::new()
                .name(format!("pto-chip{}-{i}", cfg.chip_id))
                .spawn(move || match wrap {
                    Some(w) => w(Box::new(move || worker::main(&e, i))),
                    None => worker::main(&e, i),
                })
                .map_err(|e| {
                    RunError::Resources(format!(
                        "a thread: {e} (fewer cores or threads, or a higher ulimit -u)"
                    ))
                })?;
            handles.push(h);
        }
        Ok(Chip {
            engine,
            threads: handles,
            gate: Mutex::new(()),
            broken: Mutex::new(None),
            alloc: self.alloc,
            cfg,
        })
    }
}

/// A simulated chip. It runs programs one after another; its threads live until it drops.
pub struct Chip {
    engine: Arc<Engine>,
    threads: Vec<JoinHandle<()>>,
    /// One run at a time.
    gate: Mutex<()>,
    broken: Mutex<Option<String>>,
    alloc: Option<Arc<crate::buffer::BufferAllocator>>,
    cfg: ChipConfig,
}

impl fmt::Debug for Chip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chip").field("config", &self.cfg).finish()
    }
}

/// Options of one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Record a trace of every task.
    pub trace: bool,
}

/// What a successful run did.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The program's name.
    pub program: String,
    /// Wall time of the run, orchestration included.
    pub wall: Duration,
    /// Counters.
    pub stats: RunStats,
    /// The trace, when asked for.
    pub trace: Option<Trace>,
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// A run's nonce: the high bits of its tokens (never 0, never reused in this process).
static NEXT_NONCE: AtomicU64 = AtomicU64::new(1);

impl Chip {
    /// A builder with defaults (2 AIC and 4 AIV cores).
    pub fn builder() -> ChipBuilder {
        ChipBuilder::default()
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &ChipConfig {
        &self.cfg
    }

    /// A sender to this chip's completion queue (for posting deferred tasks' tokens).
    pub fn completion_sender(&self) -> CompletionSender {
        self.engine.sender.clone()
    }

    /// Why the chip cannot run programs any more, if it cannot.
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().clone()
    }

    /// Runs a program to completion.
    ///
    /// # Errors
    ///
    /// See [`RunError`]: a failed kernel (downstream tasks poisoned), a failed orchestration, a
    /// stall, or a broken chip. After any of them but the last, the chip runs the next program.
    pub fn run(&self, program: &Program) -> Result<RunReport, RunError> {
        self.run_with(program, RunOptions::default())
    }

    /// Resets the per-run state shared by the threads.
    fn begin_run(&self, nonce: u64, trace: bool) {
        let e = &self.engine;
        e.nonce.store(nonce, Ordering::Release);
        e.finished_other.store(0, Ordering::SeqCst);
        e.submitted.store(0, Ordering::Release);
        e.run.lock().failures.clear();
        for c in [&e.failed, &e.poisoned, &e.deferred_count, &e.completions] {
            c.store(0, Ordering::Relaxed);
        }
        for t in e.threads.iter() {
            t.blocks.store(0, Ordering::Relaxed);
            t.finished.store(0, Ordering::SeqCst);
        }
        e.deferred.lock().reset();
        e.has_waiting.store(false, Ordering::Release);
        *e.trace.lock() = trace.then(|| Trace {
            chip: self.cfg.chip_id,
            events: Vec::new(),
        });
        e.tracing.store(trace, Ordering::Release);
    }

    /// Runs a program with options.
    ///
    /// # Errors
    ///
    /// As [`Chip::run`].
    pub fn run_with(&self, program: &Program, opts: RunOptions) -> Result<RunReport, RunError> {
        let _gate = self.gate.lock();
        if let Some(b) = self.broken.lock().clone() {
            return Err(RunError::Broken(b));
        }
        let nonce = NEXT_NONCE.fetch_add(1, Ordering::Relaxed);
        self.begin_run(nonce, opts.trace);
        let t0 = Instant::now();
        let mut orch = Orch::new(
            &self.engine,
            &program.kernels,
            Orchestrator::new(
                self.engine.clone(),
                RingConfig {
                    window: self.cfg.ring_task_window,
                    heap_bytes: self.cfg.ring_heap_bytes,
                    alloc: self.alloc.clone(),
                },
                nonce,
            ),
            &self.cfg,
        );
        self.engine.orch_busy();
        let orch_result = match catch_unwind(AssertUnwindSafe(|| (program.orch)(&mut orch))) {
            Ok(r) => r,
            Err(p) => Err(OrchError::Other(format!(
                "orchestration panicked: {}",
                panic_message(&*p)
            ))),
        };
        // The program returned: the reserved core thread helps with what is left.
        self.engine.orch_idle();
        let mut o = orch.into_orchestrator();
        while o.depth() > 0 {
            o.end_scope();
        }
        o.end_scope();
        let stalled = self.wait_all(&o);
        let e = &self.engine;
        e.tracing.store(false, Ordering::Release);
        // Drain completions that arrived at the very end (they may be stray). Every task
        // finished, so nothing waits: with the queue empty there is nothing to do (most runs).
        if !e.sender.host.queue().is_empty() {
            e.poll_async(None);
        }
        let mut stats = o.close();
        if let Some(err) = stalled {
            return Err(err);
        }
        stats.blocks = e
            .threads
            .iter()
            .map(|t| t.blocks.load(Ordering::Relaxed))
            .sum();
        stats.failed = e.failed.load(Ordering::Relaxed);
        stats.poisoned = e.poisoned.load(Ordering::Relaxed);
        stats.deferred = e.deferred_count.load(Ordering::Relaxed);
        stats.completions = e.completions.load(Ordering::Relaxed);
        if let Some(f) = e.run.lock().failures.first() {
            return Err(RunError::TaskFailed {
                failure: f.clone(),
                failed: stats.failed as usize,
                poisoned: stats.poisoned as usize,
            });
        }
        orch_result.map_err(RunError::Orchestration)?;
        let stray = std::mem::take(&mut e.deferred.lock().stray);
        if !stray.is_empty() {
            return Err(RunError::Completion(stray.join("; ")));
        }
        Ok(RunReport {
            program: program.name.clone(),
            wall: t0.elapsed(),
            stats,
            trace: e.trace.lock().take(),
        })
    }

    /// Waits until every submitted task finished; a stall (no task finishing for the stall
    /// timeout) is an error naming what runs, and a kernel that never returned breaks the chip.
    fn wait_all(&self, o: &Orchestrator) -> Option<RunError> {
        let e = &self.engine;
        e.publish_orch();
        let total = o.submitted();
        let stall = self.cfg.stall_timeout;
        let mut helper = self
            .cfg
            .orchestrator_runs_tasks
            .then(worker::Helper::default);
        // The clock is read only once there is something to wait for (a run whose tasks are
        // all done, as the Worker's chip runs often are, reads it not at all here).
        let mut clock: Option<((u64, Instant), Instant)> = None;
        loop {
            let done = e.finished_total();
            if done >= total {
                if let Some(h) = helper.as_mut() {
                    h.stop(e);
                }
                return None;
            }
            if let Some(h) = helper.as_mut() {
                if h.run_some(e) || h.poll(e) {
                    continue;
                }
            }
            let (last, start) = clock.get_or_insert_with(|| {
                let now = Instant::now();
                ((done, now), now)
            });
            let start = *start;
            if done != last.0 {
                *last = (done, Instant::now());
            } else if last.1.elapsed() >= stall {
                if let Some(h) = helper.as_mut() {
                    h.stop(e);
                }
                let (running, stuck) = worker::running_report(e);
                if stuck {
                    *self.broken.lock() = Some(format!("a kernel never returned: {running}"));
                }
                return Some(RunError::Stalled {
                    waited: stall,
                    running,
                });
            }
            // Spin briefly (the last blocks are often about to finish: a futex wake-up costs
            // more than they do), then park until the last completion (or a stall check).
            let polling = helper.as_mut().is_some_and(|h| h.polling_closely(e));
            if start.elapsed() < self.cfg.spin || polling {
                std::hint::spin_loop();
                std::thread::yield_now();
                continue;
            }
            // While deferred tasks wait, their conditions wake no one: nap briefly.
            let nap = if e.has_waiting.load(Ordering::Acquire) {
                worker::DEFERRED_NAP_MAX
            } else {
                Duration::from_millis(100)
            };
            orch::park_until(e, total, nap.min(stall));
        }
    }
}

impl Drop for Chip {
    fn drop(&mut self) {
        self.engine.shutdown.store(true, Ordering::SeqCst);
        self.engine.sleep.notify_all();
        // The reserved thread may be parked on the reserve (released without a wake-up when
        // no work waited): wake it too, or joining it waits for its park's deadline.
        self.engine.reserve.release_now();
        if self.broken.lock().is_some() {
            // A thread is stuck in a kernel that never returned: do not wait for it. It exits
            // on its own if the kernel ever returns.
            return;
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}
