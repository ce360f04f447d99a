//! The simulated chip: logical AIC/AIV cores served by a few OS threads, and the orchestrator
//! API that chip programs use to submit tasks.
//!
//! Threads fit the machine: a chip with 24 logical cores on a 2-CPU host runs 2 threads, each
//! of which claims a free logical core of the kind a ready task needs, runs one block, and
//! returns the core. An idle thread spins briefly, then parks on a condition variable. The
//! orchestration runs on the thread that called [`Chip::run`], concurrently with the cores.
//! See `docs/design/chip-scheduler.md`.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::args::{TaskArgs, TaskId};
use crate::config::Settings;
use crate::deferred::{CompletionSender, QueueHost};
use crate::dtype::Element;
use crate::engine::{remaining, Blocked, Dag, Job, RingConfig, RunStats};
use crate::error::{OrchError, RunError};
use crate::kernel::Registrations;
use crate::kernel::{KernelCtx, KernelRef, KernelRegistry};
use crate::tensor::Tensor;
use crate::trace::{now_us, Trace};

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
    ext: Option<Arc<dyn Any + Send + Sync>>,
    queue: Option<Arc<dyn QueueHost>>,
    alloc: Option<Arc<crate::buffer::BufferAllocator>>,
}

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
    /// An object every kernel can reach through [`KernelCtx::ext`] (for example a
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
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(ChipState {
                dag: None,
                run_gen: 0,
                shutdown: false,
                sleeping: 0,
                orch_wake_at: None,
                broken: None,
                polling: false,
            }),
            work_cv: Condvar::new(),
            orch_cv: Condvar::new(),
            hint: AtomicU64::new(0),
            tracing: AtomicBool::new(false),
            cfg: cfg.clone(),
            ext: self.ext,
            sender: CompletionSender::new(
                self.queue
                    .unwrap_or_else(|| Arc::new(pto_shm::ring::HeapQueue::new(4096))),
            ),
            alloc: self.alloc,
        });
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("pto-chip{}-{i}", cfg.chip_id))
                .spawn(move || worker_main(&s))
                .map_err(|e| RunError::Config(format!("cannot start a chip thread: {e}")))?;
            handles.push(h);
        }
        Ok(Chip {
            shared,
            threads: handles,
            gate: Mutex::new(()),
            cfg,
        })
    }
}

struct ChipState {
    dag: Option<Dag>,
    run_gen: u64,
    shutdown: bool,
    sleeping: usize,
    /// While the orchestrating thread waits: wake it once `dag.finished` reaches this. It asks
    /// for a batch of completions where one would not let it progress (a full ring, the end of
    /// a run), so a serial chain costs one wake-up per batch instead of one per task.
    orch_wake_at: Option<u64>,
    broken: Option<String>,
    /// A thread is polling the async wait list.
    polling: bool,
}

struct Shared {
    state: Mutex<ChipState>,
    work_cv: Condvar,
    orch_cv: Condvar,
    /// Bumped (under the state lock) whenever work may have been queued.
    hint: AtomicU64,
    tracing: AtomicBool,
    cfg: ChipConfig,
    ext: Option<Arc<dyn Any + Send + Sync>>,
    sender: CompletionSender,
    alloc: Option<Arc<crate::buffer::BufferAllocator>>,
}

impl Shared {
    /// Wakes the waiting orchestrating thread if what it asked for has finished, or if the
    /// cores are out of ready work (then it should refill them now).
    fn wake_orch(&self, st: &ChipState) {
        if let (Some(at), Some(dag)) = (st.orch_wake_at, st.dag.as_ref()) {
            if dag.finished >= at || dag.outstanding == 0 || !dag.has_dispatchable() {
                self.orch_cv.notify_one();
            }
        }
    }

    /// After queuing work: if a block could be dispatched now, let spinning threads see it and
    /// wake a parked one. Nothing happens when there is nothing to take, so idle threads stay
    /// parked while one thread runs a serial chain.
    fn kick(&self, st: &ChipState) {
        if st.dag.as_ref().is_some_and(Dag::has_dispatchable) {
            self.hint.fetch_add(1, Ordering::Release);
            if st.sleeping > 0 {
                self.work_cv.notify_one();
            }
        }
    }
}

/// A simulated chip. It runs programs one after another; its threads live until it drops.
pub struct Chip {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    gate: Mutex<()>,
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

fn execute(shared: &Shared, job: &Job) -> (Result<(), String>, Option<(f64, f64)>, Registrations) {
    let trace = shared.tracing.load(Ordering::Relaxed);
    let start = trace.then(now_us);
    let ctx = KernelCtx {
        task: TaskId(job.task),
        kernel: &job.kernel,
        core: job.core,
        block_idx: job.block,
        payload: &job.payload,
        token: job.token,
        flags: (0..job.payload.tensors.len())
            .map(|_| Cell::new(0))
            .collect(),
        ext: shared.ext.as_deref(),
        deferred: job.payload.deferred,
        regs: Default::default(),
        sender: &shared.sender,
        wait: shared.cfg.wait_timeout,
    };
    let result = match catch_unwind(AssertUnwindSafe(|| job.kernel.call(&ctx))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!("panicked: {}", panic_message(&*p))),
    };
    let times = start.map(|s| (s, now_us()));
    (result, times, ctx.regs.into_inner())
}

/// Spins until `hint` moves away from `seen` or `spin` passes; true if it moved.
fn spin_for(hint: &AtomicU64, seen: u64, spin: Duration) -> bool {
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        if hint.load(Ordering::Acquire) != seen {
            return true;
        }
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) {
            if start.elapsed() >= spin {
                return false;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn worker_main(shared: &Shared) {
    let mut st = shared.state.lock();
    // Consecutive polls of the async wait list that found nothing.
    let mut idle_polls = 0u32;
    loop {
        if st.shutdown {
            return;
        }
        let gen = st.run_gen;
        if let Some(job) = st.dag.as_mut().and_then(Dag::next_job) {
            idle_polls = 0;
            shared.kick(&st);
            let (result, times, regs) = MutexGuard::unlocked(&mut st, || execute(shared, &job));
            if st.run_gen == gen {
                if let Some(dag) = st.dag.as_mut() {
                    dag.finish_block(&job, result, times, regs);
                }
                // No kick here: this thread takes the next block itself; it kicks others only
                // if more is dispatchable after that.
                shared.wake_orch(&st);
            }
            continue;
        }
        // Deferred tasks: poll their conditions (never on a core). Only one thread polls.
        let waiting = st.dag.as_ref().is_some_and(Dag::has_waiting);
        if (waiting || !shared.sender.host.queue().is_empty()) && !st.polling {
            let progressed = st
                .dag
                .as_mut()
                .is_some_and(|d| d.poll_async(shared.sender.host.queue()));
            if progressed {
                idle_polls = 0;
                // No kick: this thread takes the released work itself at the top of the loop
                // and kicks others only if more is dispatchable.
                shared.wake_orch(&st);
                continue;
            }
            if st.dag.as_ref().is_some_and(Dag::has_waiting) {
                idle_polls = idle_polls.saturating_add(1);
                // Poll again soon: spin for the first polls (latency), then back off to short
                // sleeps so a long wait does not burn a CPU.
                let seen = shared.hint.load(Ordering::Acquire);
                st.polling = true;
                if idle_polls < 2000 {
                    MutexGuard::unlocked(&mut st, || {
                        // A few hundred nanoseconds between polls: conditions are plain loads,
                        // and the latency from "condition holds" to "consumer runs" is what
                        // deferred tasks are for. Yield now and then for other threads.
                        for _ in 0..8 {
                            if shared.hint.load(Ordering::Acquire) != seen {
                                break;
                            }
                            std::hint::spin_loop();
                        }
                        if idle_polls.is_multiple_of(64) {
                            std::thread::yield_now();
                        }
                    });
                } else {
                    let nap =
                        Duration::from_micros(50 * u64::from((idle_polls - 2000).min(20) + 1));
                    st.sleeping += 1;
                    shared.work_cv.wait_for(&mut st, nap);
                    st.sleeping -= 1;
                }
                st.polling = false;
                continue;
            }
        }
        let seen = shared.hint.load(Ordering::Acquire);
        if MutexGuard::unlocked(&mut st, || spin_for(&shared.hint, seen, shared.cfg.spin)) {
            continue;
        }
        if shared.hint.load(Ordering::Acquire) != seen || st.shutdown {
            continue;
        }
        st.sleeping += 1;
        // Idle threads park; the timeout bounds a missed wake-up, and lets a parked thread
        // take over polling deferred tasks.
        shared.work_cv.wait_for(
            &mut st,
            Duration::from_millis(if waiting { 5 } else { 250 }),
        );
        st.sleeping -= 1;
    }
}

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
        self.shared.sender.clone()
    }

    /// Why the chip cannot run programs any more, if it cannot.
    pub fn broken(&self) -> Option<String> {
        self.shared.state.lock().broken.clone()
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

    /// Runs a program with options.
    ///
    /// # Errors
    ///
    /// As [`Chip::run`].
    pub fn run_with(&self, program: &Program, opts: RunOptions) -> Result<RunReport, RunError> {
        let _gate = self.gate.lock();
        {
            let mut st = self.shared.state.lock();
            if let Some(b) = &st.broken {
                return Err(RunError::Broken(b.clone()));
            }
            st.run_gen += 1;
            st.dag = Some(Dag::new(
                self.cfg.aic_cores,
                self.cfg.aiv_cores,
                RingConfig {
                    window: self.cfg.ring_task_window,
                    heap_bytes: self.cfg.ring_heap_bytes,
                    alloc: self.shared.alloc.clone(),
                },
                opts.trace.then_some(self.cfg.chip_id),
            ));
        }
        self.shared.tracing.store(opts.trace, Ordering::Relaxed);
        let t0 = Instant::now();
        let mut orch = Orch {
            shared: &self.shared,
            kernels: &program.kernels,
        };
        let orch_result = match catch_unwind(AssertUnwindSafe(|| (program.orch)(&mut orch))) {
            Ok(r) => r,
            Err(p) => Err(OrchError::Other(format!(
                "orchestration panicked: {}",
                panic_message(&*p)
            ))),
        };

        let mut st = self.shared.state.lock();
        let stall = self.cfg.stall_timeout;
        let mut stalled = None;
        if let Some(dag) = st.dag.as_mut() {
            while dag.depth() > 0 {
                dag.end_scope();
            }
            dag.end_scope();
        }
        let mut last = (u64::MAX, Instant::now());
        let wait_start = Instant::now();
        while let Some(dag) = st.dag.as_ref() {
            if dag.outstanding == 0 {
                break;
            }
            if dag.finished != last.0 {
                last = (dag.finished, Instant::now());
            } else if last.1.elapsed() >= stall {
                let running = dag.running_report();
                if !dag.running.is_empty() {
                    st.broken = Some(format!("a kernel never returned: {running}"));
                }
                stalled = Some(RunError::Stalled {
                    waited: stall,
                    running,
                });
                break;
            }
            // Spin briefly (the last blocks are often about to finish: a futex wake-up costs
            // more than they do), then park. The orchestrating thread never runs kernels
            // itself, so the stall watchdog below always gets control back.
            if wait_start.elapsed() < self.cfg.spin {
                MutexGuard::unlocked(&mut st, || {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    std::thread::yield_now();
                });
                continue;
            }
            // Only the last completion matters here; the timeout drives the stall watchdog.
            st.orch_wake_at = Some(dag.finished + dag.outstanding as u64);
            self.shared
                .orch_cv
                .wait_for(&mut st, Duration::from_millis(100).min(stall));
            st.orch_wake_at = None;
        }
        let mut dag = st.dag.take();
        drop(st);
        let Some(dag) = dag.as_mut() else {
            return Err(RunError::Broken("run state lost".into()));
        };
        dag.close();
        if let Some(e) = stalled {
            return Err(e);
        }
        // Drain completions that arrived at the very end (they may be stray).
        dag.poll_async(self.shared.sender.host.queue());
        if let Some(f) = dag.failures().first() {
            return Err(RunError::TaskFailed {
                failure: f.clone(),
                failed: dag.stats.failed as usize,
                poisoned: dag.stats.poisoned as usize,
            });
        }
        orch_result.map_err(RunError::Orchestration)?;
        if !dag.stray.is_empty() {
            return Err(RunError::Completion(dag.stray.join("; ")));
        }
        Ok(RunReport {
            program: program.name.clone(),
            wall: t0.elapsed(),
            stats: dag.stats,
            trace: dag.trace.take(),
        })
    }
}

impl Drop for Chip {
    fn drop(&mut self) {
        let broken = {
            let mut st = self.shared.state.lock();
            st.shutdown = true;
            st.broken.is_some()
        };
        self.shared.work_cv.notify_all();
        if broken {
            // A thread is stuck in a kernel that never returned: do not wait for it. It exits
            // on its own if the kernel ever returns.
            return;
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// What a submit returns: the task and its runtime-allocated outputs, in argument order.
#[derive(Clone, Debug)]
pub struct Submitted {
    /// The task.
    pub task: TaskId,
    /// The outputs the runtime allocated (the task's `output(...)` arguments), in order.
    pub outputs: Vec<Tensor>,
}

impl Submitted {
    /// Output `i`.
    ///
    /// # Errors
    ///
    /// [`OrchError::Other`] when the task has fewer outputs.
    pub fn out(&self, i: usize) -> Result<Tensor, OrchError> {
        self.outputs.get(i).cloned().ok_or_else(|| {
            OrchError::msg(format!(
                "task {} has {} runtime output(s), asked for output {i}",
                self.task,
                self.outputs.len()
            ))
        })
    }
}

/// The orchestration API: submit tasks, open scopes, read results.
pub struct Orch<'a> {
    shared: &'a Shared,
    kernels: &'a KernelRegistry,
}

impl fmt::Debug for Orch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Orch").finish_non_exhaustive()
    }
}

impl Orch<'_> {
    fn lock(&self) -> MutexGuard<'_, ChipState> {
        self.shared.state.lock()
    }

    fn submit_inner(
        &mut self,
        kernel: Option<Arc<crate::kernel::Kernel>>,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let wait = self.shared.cfg.wait_timeout;
        let mut st = self.lock();
        let dag = dag_mut(&mut st)?;
        let plan = dag.plan(kernel, args)?;
        let deadline = Instant::now() + wait;
        loop {
            let dag = dag_mut(&mut st)?;
            match dag.place(&plan) {
                Ok(at) => {
                    let (task, outputs) = dag.commit(plan, at)?;
                    self.shared.kick(&st);
                    return Ok(Submitted { task, outputs });
                }
                Err(Blocked::Never(e)) => return Err(e),
                Err(Blocked::Wait(what)) => {
                    let Some(left) = remaining(deadline) else {
                        return Err(OrchError::FlowControlTimeout {
                            ring: plan.ring(),
                            waited: wait,
                            what,
                        });
                    };
                    // Low-water mark: come back when half of what is in flight has finished,
                    // then refill the ring in one go.
                    let (done, in_flight) = (dag.finished, dag.outstanding as u64);
                    // The cap bounds the cost of a threshold that progress elsewhere (a kernel
                    // waiting on a peer) keeps from being reached.
                    st.orch_wake_at = Some(done + (in_flight / 2).max(1));
                    self.shared
                        .orch_cv
                        .wait_for(&mut st, left.min(Duration::from_millis(1)));
                    st.orch_wake_at = None;
                }
            }
        }
    }

    /// Submits a task running `kernel` (a name or a [`crate::KernelId`]).
    ///
    /// Dependencies are inferred from the tensor arguments (read-after-write, write-after-write
    /// and write-after-read on overlapping bytes) plus the explicit ones. Blocks while the
    /// scope's ring is full; fails at once if it can never free.
    ///
    /// # Errors
    ///
    /// An unknown kernel, invalid arguments, a chip without the kernel's core kind, outputs
    /// larger than the ring, a scope deadlock, or a flow-control timeout.
    pub fn submit(
        &mut self,
        kernel: impl KernelRef,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let k = kernel.resolve(self.kernels)?.clone();
        self.submit_inner(Some(k), args)
    }

    /// Submits a dependency-only task: it joins the graph (its outputs are allocated, its
    /// dependencies inferred) but runs no kernel.
    ///
    /// # Errors
    ///
    /// As [`Orch::submit`].
    pub fn submit_dummy(&mut self, args: TaskArgs) -> Result<Submitted, OrchError> {
        self.submit_inner(None, args)
    }

    fn scoped<R>(
        &mut self,
        manual: bool,
        f: impl FnOnce(&mut Self) -> Result<R, OrchError>,
    ) -> Result<R, OrchError> {
        dag_mut(&mut self.lock())?.begin_scope(manual)?;
        let r = f(self);
        let mut st = self.lock();
        dag_mut(&mut st)?.end_scope();
        self.shared.kick(&st);
        r
    }

    /// Runs `f` in a nested automatic scope. Outputs of tasks submitted inside come from the
    /// next ring and are reclaimed once the scope has ended and their consumers finished, so
    /// tensors returned inside are valid only inside.
    ///
    /// # Errors
    ///
    /// What `f` returns; [`OrchError::AutoInsideManual`] inside a manual scope.
    pub fn scope<R>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<R, OrchError>,
    ) -> Result<R, OrchError> {
        self.scoped(false, f)
    }

    /// Runs `f` in a manual scope: no dependency is inferred, only explicit ones
    /// ([`TaskArgs::after`]) count.
    ///
    /// # Errors
    ///
    /// What `f` returns.
    pub fn manual_scope<R>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<R, OrchError>,
    ) -> Result<R, OrchError> {
        self.scoped(true, f)
    }

    /// Waits until every task that writes bytes of `t` (or, with `write`, also reads them) has
    /// finished.
    fn wait_producers(&mut self, t: &Tensor, write: bool) -> Result<(), OrchError> {
        let wait = self.shared.cfg.wait_timeout;
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        let start = Instant::now();
        loop {
            let pending = dag_mut(&mut st)?.pending_for(t, write)?;
            if pending == 0 {
                return Ok(());
            }
            let Some(left) = remaining(deadline) else {
                return Err(OrchError::WaitTimeout {
                    waited: wait,
                    pending,
                });
            };
            if start.elapsed() < self.shared.cfg.spin {
                MutexGuard::unlocked(&mut st, || {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                    std::thread::yield_now();
                });
                continue;
            }
            let done = dag_mut(&mut st)?.finished;
            st.orch_wake_at = Some(done + 1);
            self.shared.orch_cv.wait_for(&mut st, left);
            st.orch_wake_at = None;
        }
    }

    /// Waits for the producers of `t`, then copies its elements out.
    ///
    /// # Errors
    ///
    /// A producer failed (the error names it), the deadline passed, or the tensor's dtype is not
    /// `T`'s.
    pub fn read<T: Element>(&mut self, t: &Tensor) -> Result<Vec<T>, OrchError> {
        self.wait_producers(t, false)?;
        Ok(t.read::<T>()?)
    }

    /// Waits for every task reading or writing `t`, then copies `data` in.
    ///
    /// # Errors
    ///
    /// As [`Orch::read`], and a length other than the element count.
    pub fn write<T: Element>(&mut self, t: &Tensor, data: &[T]) -> Result<(), OrchError> {
        self.wait_producers(t, true)?;
        Ok(t.write(data)?)
    }

    /// Logical AIC and AIV cores of this chip (to size SPMD work).
    pub fn core_counts(&self) -> (u32, u32) {
        (self.shared.cfg.aic_cores, self.shared.cfg.aiv_cores)
    }

    /// Depth of the innermost open scope (0 is the run's implicit scope).
    pub fn depth(&self) -> usize {
        self.lock().dag.as_ref().map_or(0, Dag::depth)
    }

    /// The chip's extension object, if it has type `E`.
    pub fn ext<E: Any>(&self) -> Option<&E> {
        self.shared
            .ext
            .as_deref()
            .and_then(|e| e.downcast_ref::<E>())
    }
}

fn dag_mut<'s>(st: &'s mut MutexGuard<'_, ChipState>) -> Result<&'s mut Dag, OrchError> {
    st.dag
        .as_mut()
        .ok_or_else(|| OrchError::msg("no run in progress"))
}
