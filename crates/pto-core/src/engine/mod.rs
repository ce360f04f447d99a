//! The DAG engine: task nodes, dependency wiring, dispatch, completion, poison, deferred
//! completion and reclamation, with no chip-wide lock on the hot path.
//!
//! * The orchestrating thread alone owns the TensorMap, the rings and the scopes
//!   (`submit::Orchestrator`): it infers a task's producers, wires the edges and publishes the
//!   task; it reclaims finished task nodes from the front of each ring.
//! * Every thread shares the task nodes (`slab`): an atomic count of unfinished producers, a
//!   successor list closed by a "finished" bit ([`succ`]), a reference count that says when the
//!   node may be reclaimed, and a state word.
//! * Ready tasks go to lock-free queues, one per core shape (those ready at submit to the
//!   orchestrating thread's own single-producer ring, [`spmc`]); a thread that finishes a task runs
//!   the first consumer it made ready itself (`execute`); idle threads spin briefly, then park
//!   under a protocol that loses no wake-up ([`sleep`]).
//!
//! The protocols are described in `docs/design/dependency-engine.md` and
//! `docs/design/chip-scheduler.md`.

pub(crate) mod cores;
pub(crate) mod deferred;
pub(crate) mod execute;
#[doc(hidden)]
pub mod gate;
#[doc(hidden)]
pub mod held;
#[doc(hidden)]
pub mod orchwait;
#[doc(hidden)]
pub mod reserve;
pub(crate) mod ring;
pub(crate) mod slab;
#[doc(hidden)]
pub mod sleep;
pub mod spmc;
pub(crate) mod submit;
#[doc(hidden)]
pub mod succ;
pub(crate) mod sync;
pub(crate) mod tensormap;

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_deque::Injector;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::deferred::CompletionSender;
use crate::error::TaskFailure;
use crate::kernel::CoreKind;
use crate::trace::Trace;
use cores::Cores;
use deferred::DeferredState;
use orchwait::OrchWait;
use reserve::Reserve;
use slab::Slab;
use sleep::Sleep;
use spmc::Spmc;

/// Rings, one per scope depth; depths past the last share it.
pub(crate) const NUM_RINGS: usize = 4;
/// Entries of the orchestrating thread's queue of each shape (more ready tasks than that go
/// to the shared queue).
const ORCH_QUEUE: usize = 4096;
/// Low bits of a token that hold the task id (the high bits hold the run's nonce).
pub(crate) const TOKEN_TASK_BITS: u32 = 40;
pub(crate) const TOKEN_TASK_MASK: u64 = (1 << TOKEN_TASK_BITS) - 1;

/// A task as the orchestrating thread refers to it: its node and its id (a node is reused by
/// later tasks, so the id tells whether it still holds this one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TaskRef {
    pub(crate) slot: u32,
    pub(crate) id: u64,
}

/// Counters reported at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Tasks submitted (dummy tasks included).
    pub tasks: u64,
    /// Kernel blocks executed.
    pub blocks: u64,
    /// Dependency-only tasks.
    pub dummy: u64,
    /// Tasks whose kernel failed.
    pub failed: u64,
    /// Tasks skipped because a producer failed.
    pub poisoned: u64,
    /// Dependency edges wired.
    pub edges: u64,
    /// Most live tasks in any ring at once.
    pub peak_ring_tasks: usize,
    /// Most output bytes in any ring at once.
    pub peak_ring_bytes: usize,
    /// Tasks that completed through deferred completion.
    pub deferred: u64,
    /// Completions drained from the completion queue.
    pub completions: u64,
}

/// Which ready queue a core kind uses.
pub(crate) fn queue_of(kind: CoreKind) -> usize {
    match kind {
        CoreKind::Mix => 0,
        CoreKind::Aic => 1,
        CoreKind::Aiv => 2,
    }
}

/// What one chip thread is doing, for stall reports and for borrows that must see the tasks
/// running now. Padded: each thread writes its own line.
#[derive(Debug, Default)]
pub(crate) struct ThreadSlot {
    /// 0 when idle, else `(slot + 1) << 40 | (task id & TOKEN_TASK_MASK)` of the running block.
    pub(crate) current: AtomicU64,
    /// The running block, and the core it runs on (`kind << 16 | index`), for reports.
    pub(crate) block: AtomicU32,
    pub(crate) core: AtomicU32,
    /// Blocks run in this run.
    pub(crate) blocks: AtomicU64,
    /// Tasks this thread finished in this run (summed by [`Engine::finished_total`]).
    pub(crate) finished: AtomicU64,
}

pub(crate) fn encode_current(slot: u32, id: u64) -> u64 {
    (u64::from(slot) + 1) << TOKEN_TASK_BITS | (id & TOKEN_TASK_MASK)
}

pub(crate) fn decode_current(v: u64) -> Option<(u32, u64)> {
    (v != 0).then(|| (((v >> TOKEN_TASK_BITS) - 1) as u32, v & TOKEN_TASK_MASK))
}

/// Per-run bookkeeping shared by every thread.
#[derive(Debug, Default)]
pub(crate) struct RunShared {
    pub(crate) failures: Vec<TaskFailure>,
}

/// Everything the threads of one chip share. Lives as long as the chip; `begin_run` resets the
/// per-run parts.
pub(crate) struct Engine {
    pub(crate) slab: Slab,
    /// What the last run's orchestrating thread left for the next one: the free slots, the
    /// per-slot state, the TensorMap's and the rings' memory (emptied; only the orchestrating
    /// thread uses it, see `submit::RunMemory`). Boxed: inline, the TensorMap's size moved the
    /// unpadded atomics after it onto lines the deferred path shares (deferred latency p90
    /// 0.7-2 -> 8-15 us, measured).
    pub(crate) leftovers: Mutex<Option<Box<submit::RunMemory>>>,
    /// Ready queues: MIX, AIC, AIV.
    pub(crate) queues: [Injector<u32>; 3],
    /// The tasks the orchestrating thread found ready at submit, per shape as `queues` (it is
    /// their only producer: see [`spmc`]); the core threads take from both.
    pub(crate) orch_queues: [Spmc; 3],
    pub(crate) cores: Cores,
    pub(crate) sleep: Sleep,
    pub(crate) orch: OrchWait,
    /// Keeps a CPU for the orchestrating thread while it submits ([`reserve`]).
    pub(crate) reserve: Reserve,
    /// The core thread that yields to the orchestrating thread, if the chip reserves one.
    pub(crate) reserved: Option<usize>,
    /// One slot per core thread, then one for the orchestrating thread (when it runs tasks).
    pub(crate) threads: Box<[CachePadded<ThreadSlot>]>,
    /// Tasks finished this run by threads other than the core threads (the orchestrating
    /// thread, for dummy and poisoned tasks); each core thread counts its own in its
    /// [`ThreadSlot`], so that completions share no counter.
    pub(crate) finished_other: CachePadded<AtomicU64>,
    /// Tasks published this run (orchestrator writes).
    pub(crate) submitted: CachePadded<AtomicU64>,
    /// This run's token nonce.
    pub(crate) nonce: AtomicU64,
    pub(crate) run: Mutex<RunShared>,
    pub(crate) failed: AtomicU64,
    pub(crate) poisoned: AtomicU64,
    pub(crate) deferred_count: AtomicU64,
    pub(crate) completions: AtomicU64,
    pub(crate) deferred: Mutex<DeferredState>,
    /// True while deferred tasks wait (cheap check before taking `deferred`).
    pub(crate) has_waiting: AtomicBool,
    /// An idle thread polls the waiting deferred tasks closely (the others park).
    pub(crate) polling: AtomicBool,
    pub(crate) trace: Mutex<Option<Trace>>,
    pub(crate) tracing: AtomicBool,
    pub(crate) shutdown: AtomicBool,
    pub(crate) sender: CompletionSender,
    pub(crate) ext: Option<Arc<dyn Any + Send + Sync>>,
    pub(crate) spin: Duration,
    pub(crate) wait: Duration,
    /// When the orchestrating thread runs tasks itself (`ChipBuilder::orchestrator_runs_tasks`),
    /// the last task it found ready at submit is kept in `held` instead of being queued: it is
    /// queued (and a thread woken) when the next one comes, when the orchestrating thread is
    /// about to wait, or when a core thread is about to park; at the end of the run the
    /// orchestrating thread runs it itself. A run of one task then wakes no thread.
    pub(crate) hold: bool,
    pub(crate) held: held::Held,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("slab", &self.slab)
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// How an engine is made.
pub(crate) struct EngineConfig {
    pub(crate) aic: u32,
    pub(crate) aiv: u32,
    pub(crate) threads: usize,
    pub(crate) max_slots: usize,
    pub(crate) spin: Duration,
    pub(crate) wait: Duration,
    pub(crate) sender: CompletionSender,
    pub(crate) ext: Option<Arc<dyn Any + Send + Sync>>,
    /// The orchestrating thread keeps the last task it found ready (see [`Engine::held`]).
    pub(crate) hold: bool,
    /// Reserve the last core thread for when the orchestrating thread waits ([`reserve`]).
    pub(crate) reserve: bool,
}

impl Engine {
    pub(crate) fn new(cfg: EngineConfig) -> Engine {
        Engine {
            slab: Slab::new(cfg.max_slots),
            leftovers: Mutex::new(None),
            queues: [Injector::new(), Injector::new(), Injector::new()],
            orch_queues: std::array::from_fn(|_| Spmc::new(ORCH_QUEUE)),
            cores: Cores::new(cfg.aic, cfg.aiv),
            sleep: Sleep::default(),
            orch: OrchWait::default(),
            reserve: Reserve::default(),
            reserved: (cfg.reserve && cfg.threads >= 2).then(|| cfg.threads - 1),
            // One slot per core thread, and the last for the orchestrating thread when it runs
            // tasks itself.
            threads: (0..=cfg.threads)
                .map(|_| CachePadded::new(ThreadSlot::default()))
                .collect(),
            finished_other: CachePadded::new(AtomicU64::new(0)),
            submitted: CachePadded::new(AtomicU64::new(0)),
            nonce: AtomicU64::new(0),
            run: Mutex::new(RunShared::default()),
            failed: AtomicU64::new(0),
            poisoned: AtomicU64::new(0),
            deferred_count: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            deferred: Mutex::new(DeferredState::default()),
            has_waiting: AtomicBool::new(false),
            polling: AtomicBool::new(false),
            trace: Mutex::new(None),
            tracing: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sender: cfg.sender,
            ext: cfg.ext,
            spin: cfg.spin,
            wait: cfg.wait,
            hold: cfg.hold,
            held: held::Held::default(),
        }
    }

    /// Tasks finished in this run, by every thread.
    pub(crate) fn finished_total(&self) -> u64 {
        self.threads
            .iter()
            .map(|t| t.finished.load(Ordering::SeqCst))
            .sum::<u64>()
            + self.finished_other.load(Ordering::SeqCst)
    }

    /// Counts a finished task (on core thread `tid`, or elsewhere) and wakes the orchestrating
    /// thread if it waits for this many. The increment, then the `SeqCst` fence in
    /// [`OrchWait::finished`] and its load of `wake_at`, pair with the orchestrator's store of
    /// `wake_at` (or `wake_task`), its fence and its sum.
    ///
    /// A thread slot's count has one writer, the thread `tid` names (a core thread, or the
    /// orchestrating thread in the last slot), so it is raised with a load and a store: no
    /// locked instruction (the fence that follows orders it before the load of `wake_at`).
    pub(crate) fn count_finished(&self, tid: Option<usize>, id: u64) {
        match tid.and_then(|t| self.threads.get(t)) {
            Some(t) => t
                .finished
                .store(t.finished.load(Ordering::Relaxed) + 1, Ordering::Release),
            None => {
                self.finished_other.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.orch.finished(id, || self.finished_total());
    }

    /// The cores ran out of work: wake the orchestrating thread if it waits, so that it
    /// refills them now.
    pub(crate) fn idle_poke(&self) {
        self.orch.poke();
    }

    /// True when some ready queue holds an entry (or a task is held).
    pub(crate) fn has_ready(&self) -> bool {
        self.queues.iter().any(|q| !q.is_empty())
            || self.orch_queues.iter().any(|q| !q.is_empty())
            || self.held.is_some()
    }

    /// [`Engine::has_ready`], or entries the orchestrating thread staged: those it publishes
    /// (the last look of a thread about to park, so that staged work is never stranded while
    /// the orchestrating thread is busy elsewhere).
    pub(crate) fn has_ready_or_staged(&self) -> bool {
        self.has_ready() || self.publish_staged()
    }

    /// The orchestrating thread is busy (it runs the program between waits): the reserved core
    /// thread, if any, keeps out of its way.
    pub(crate) fn orch_busy(&self) {
        if self.reserved.is_some() {
            self.reserve.hold();
        }
    }

    /// The orchestrating thread waits (or the run's program returned): the reserved core
    /// thread, if any, may work. It is woken only when more than one task is queued: one task
    /// the other threads take themselves (a run of one task, the usual Worker chip task, then
    /// costs no wake-up), and a reserved thread not woken sees the release within a
    /// millisecond anyway.
    pub(crate) fn orch_idle(&self) {
        if self.reserved.is_some() {
            self.reserve.release(|| self.ready_len() >= 2);
        }
    }

    /// Tasks queued now (a snapshot; held tasks not counted).
    pub(crate) fn ready_len(&self) -> usize {
        self.queues.iter().map(Injector::len).sum::<usize>()
            + self.orch_queues.iter().map(Spmc::len).sum::<usize>()
    }

    /// Publishes what the orchestrating thread staged, from any thread; true when there was
    /// some. (A searching thread calls it now and then, so that staged work waits at most a
    /// few microseconds when the orchestrating thread does something else than submit.)
    pub(crate) fn publish_staged(&self) -> bool {
        self.orch_queues
            .iter()
            .fold(false, |a, q| q.publish_staged() | a)
    }

    /// What the orchestrating thread does before it waits: publishes what it staged and queues
    /// what it holds.
    pub(crate) fn flush_orch(&self) {
        self.publish_orch();
        self.flush_held();
    }

    /// A task the orchestrating thread found ready at submit: held back when the engine holds
    /// (see [`Engine::held`]), queued otherwise. Only the orchestrating thread calls it.
    pub(crate) fn publish(&self, slot: u32) {
        if !self.hold {
            self.push_from_orch(slot);
            return;
        }
        self.slab.get(slot).set_state(slab::State::Ready);
        if let Some(prev) = self.held.put(slot) {
            self.push_from_orch(prev);
        }
    }

    /// Queues the held task, if any (before a wait that its completion may end).
    pub(crate) fn flush_held(&self) {
        if let Some(h) = self.held.take() {
            self.push_job(h);
        }
    }

    /// Queues a ready task (or one more of its blocks) and wakes a thread if none is looking.
    pub(crate) fn push_ready(&self, slot: u32, kind: CoreKind) {
        self.queues[queue_of(kind)].push(slot);
        self.sleep.notify();
    }
}

/// A deadline helper: the time left, or `None` once passed.
pub(crate) fn remaining(deadline: std::time::Instant) -> Option<Duration> {
    deadline.checked_duration_since(std::time::Instant::now())
}

#[cfg(test)]
mod tests;
