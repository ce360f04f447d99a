//! The DAG engine: task states, dependency wiring, completion, poisoning, scopes and reclamation.
//!
//! Everything here is single-threaded state guarded by the chip's lock; the chip (or a Worker)
//! drives it from its threads. The protocol is described in `docs/design/dependency-engine.md`.

pub(crate) mod ring;
pub(crate) mod tensormap;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::args::{ArgMode, OutInit, TaskArgs, TaskId, TensorArg};
use crate::buffer::BorrowSet;
use crate::deferred::{Condition, Poll};
use crate::error::{OrchError, TaskFailure};
use crate::kernel::{CoreId, CoreKind, Kernel, Payload, Registrations, MAX_CONDITIONS};
use crate::tensor::{Lease, Origin, Region, Tensor, TensorError, MAX_DIMS};
use crate::trace::{Trace, TraceEvent};
use pto_shm::ring::{Completion, CompletionQueue};
use ring::{Full, Ring, OUT_ALIGN};
use tensormap::{EntryKey, Liveness, TensorMap};

static NEXT_NONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
const TOKEN_TASK_BITS: u32 = 40;

/// Rings, one per scope depth; depths past the last share it.
pub(crate) const NUM_RINGS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Waiting,
    Ready,
    Running,
    /// The kernel returned; completion waits for registered conditions.
    Deferred,
    Done,
    Failed,
    Poisoned,
}

impl State {
    fn finished(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Poisoned)
    }
}

#[derive(Debug)]
struct Node {
    kernel: Option<Arc<Kernel>>,
    payload: Arc<Payload>,
    state: State,
    /// Unfinished producers.
    fanin: u32,
    consumers: SmallVec<[u64; 2]>,
    /// Producers this task keeps alive until it finishes.
    retains: SmallVec<[u64; 2]>,
    /// Consumers keeping this task alive.
    retained: u32,
    scope_open: bool,
    consumed: bool,
    ring: u8,
    lease: Option<Arc<Lease>>,
    blocks_next: u32,
    blocks_done: u32,
    /// The failed task this one was poisoned by (itself, if it failed).
    root: Option<u64>,
    block_error: Option<(u32, Option<CoreId>, String)>,
    tm_keys: SmallVec<[EntryKey; 2]>,
    borrows: Option<BorrowSet>,
    deps: SmallVec<[u64; 2]>,
    /// Deferred completion: conditions still pending, tokens expected and seen.
    conds: Vec<(Box<dyn Condition>, std::time::Instant)>,
    tokens_expected: u32,
    tokens_seen: u32,
    token_error: Option<u64>,
    token_deadline: Option<std::time::Instant>,
    /// Trace: start of the first block and its core.
    first: Option<(f64, CoreId)>,
}

#[derive(Debug)]
struct Scope {
    manual: bool,
    tasks: Vec<u64>,
}

/// Logical core occupancy.
#[derive(Debug)]
pub(crate) struct Cores {
    aic: Vec<bool>,
    aiv: Vec<bool>,
}

impl Cores {
    pub(crate) fn new(aic: u32, aiv: u32) -> Cores {
        Cores {
            aic: vec![true; aic as usize],
            aiv: vec![true; aiv as usize],
        }
    }

    pub(crate) fn has(&self, kind: CoreKind) -> bool {
        match kind {
            CoreKind::Aic | CoreKind::Mix => !self.aic.is_empty(),
            CoreKind::Aiv => !self.aiv.is_empty(),
        }
    }

    fn cluster_free(&self, c: usize) -> bool {
        self.aic[c] && (2 * c..2 * c + 2).all(|v| self.aiv.get(v).copied().unwrap_or(true))
    }

    fn can_claim(&self, kind: CoreKind) -> bool {
        match kind {
            CoreKind::Aic => self.aic.contains(&true),
            CoreKind::Aiv => self.aiv.contains(&true),
            CoreKind::Mix => (0..self.aic.len()).any(|c| self.cluster_free(c)),
        }
    }

    fn claim(&mut self, kind: CoreKind) -> Option<CoreId> {
        let pick = |v: &mut Vec<bool>| {
            let i = v.iter().position(|f| *f)?;
            v[i] = false;
            Some(i as u32)
        };
        match kind {
            CoreKind::Aic => pick(&mut self.aic).map(|index| CoreId { kind, index }),
            CoreKind::Aiv => pick(&mut self.aiv).map(|index| CoreId { kind, index }),
            CoreKind::Mix => {
                let c = (0..self.aic.len()).find(|&c| self.cluster_free(c))?;
                self.aic[c] = false;
                for v in 2 * c..2 * c + 2 {
                    if let Some(f) = self.aiv.get_mut(v) {
                        *f = false;
                    }
                }
                Some(CoreId {
                    kind,
                    index: c as u32,
                })
            }
        }
    }

    fn release(&mut self, core: CoreId) {
        let i = core.index as usize;
        match core.kind {
            CoreKind::Aic => self.aic[i] = true,
            CoreKind::Aiv => self.aiv[i] = true,
            CoreKind::Mix => {
                self.aic[i] = true;
                for v in 2 * i..2 * i + 2 {
                    if let Some(f) = self.aiv.get_mut(v) {
                        *f = true;
                    }
                }
            }
        }
    }
}

/// One block of one task, handed to a thread to run.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) task: u64,
    pub(crate) block: u32,
    pub(crate) core: CoreId,
    pub(crate) kernel: Arc<Kernel>,
    pub(crate) payload: Arc<Payload>,
    pub(crate) token: u64,
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

/// Ring sizing for one run.
#[derive(Clone)]
pub(crate) struct RingConfig {
    pub(crate) window: usize,
    pub(crate) heap_bytes: usize,
    pub(crate) alloc: Option<Arc<crate::buffer::BufferAllocator>>,
}

impl std::fmt::Debug for RingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RingConfig({} tasks, {} bytes)",
            self.window, self.heap_bytes
        )
    }
}

/// What submit decided before any state changed.
pub(crate) struct Plan {
    kernel: Option<Arc<Kernel>>,
    args: TaskArgs,
    /// Byte offsets of each runtime output within the task's allocation.
    out_offsets: SmallVec<[usize; 4]>,
    bytes: usize,
    ring: usize,
}

impl Plan {
    pub(crate) fn ring(&self) -> usize {
        self.ring
    }
}

/// Why a placement must wait or cannot happen.
pub(crate) enum Blocked {
    /// Space will free up when tasks finish.
    Wait(String),
    /// It never will: an error.
    Never(OrchError),
}

/// The state of one run.
#[derive(Debug)]
pub(crate) struct Dag {
    nodes: FxHashMap<u64, Node>,
    next_id: u64,
    tmap: TensorMap,
    rings: Vec<Ring>,
    scopes: Vec<Scope>,
    ready: [VecDeque<u64>; 3],
    rotate: usize,
    pub(crate) cores: Cores,
    /// Tasks submitted and not finished.
    pub(crate) outstanding: usize,
    /// Finished tasks, ever (a progress counter for waits).
    pub(crate) finished: u64,
    /// Jobs handed out and not yet returned.
    pub(crate) running: FxHashMap<(u64, u32), (CoreId, Arc<Kernel>)>,
    failures: Vec<TaskFailure>,
    retired_failed: FxHashMap<u64, u64>,
    /// High bits of this run's borrow tokens: `nonce << 40 | task`.
    nonce: u64,
    pub(crate) trace: Option<Trace>,
    pub(crate) stats: RunStats,
    rings_cfg: RingConfig,
    /// Deferred tasks whose kernels returned, waiting for their conditions.
    waiting: Vec<u64>,
    /// Token posts for tasks not submitted yet.
    early: FxHashMap<u64, (u32, Option<u64>)>,
    /// Completions that named no task of this run, or a task already complete.
    pub(crate) stray: Vec<String>,
}

fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

fn invalid(kernel: &Option<Arc<Kernel>>, detail: String) -> OrchError {
    OrchError::InvalidArgs {
        kernel: kernel
            .as_ref()
            .map_or_else(|| "<dummy>".to_string(), |k| k.name().to_string()),
        detail,
    }
}

impl Dag {
    pub(crate) fn new(aic: u32, aiv: u32, rings: RingConfig, trace: Option<u32>) -> Dag {
        Dag {
            nodes: FxHashMap::default(),
            next_id: 0,
            tmap: TensorMap::default(),
            rings: (0..NUM_RINGS)
                .map(|_| Ring::new(rings.window, rings.heap_bytes))
                .collect(),
            scopes: vec![Scope {
                manual: false,
                tasks: Vec::new(),
            }],
            ready: Default::default(),
            rotate: 0,
            cores: Cores::new(aic, aiv),
            outstanding: 0,
            finished: 0,
            running: FxHashMap::default(),
            failures: Vec::new(),
            retired_failed: FxHashMap::default(),
            nonce: NEXT_NONCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            trace: trace.map(|chip| Trace {
                chip,
                events: Vec::new(),
            }),
            stats: RunStats::default(),
            rings_cfg: rings.clone(),
            waiting: Vec::new(),
            early: FxHashMap::default(),
            stray: Vec::new(),
        }
    }

    /// Depth of the innermost open scope (0 = the implicit outer scope).
    pub(crate) fn depth(&self) -> usize {
        self.scopes.len() - 1
    }

    fn manual(&self) -> bool {
        self.scopes.last().is_some_and(|s| s.manual)
    }

    pub(crate) fn begin_scope(&mut self, manual: bool) -> Result<(), OrchError> {
        if !manual && self.manual() {
            return Err(OrchError::AutoInsideManual);
        }
        self.scopes.push(Scope {
            manual,
            tasks: Vec::new(),
        });
        Ok(())
    }

    /// Ends the innermost scope (the implicit outer one too, at the end of a run).
    pub(crate) fn end_scope(&mut self) {
        let Some(scope) = self.scopes.pop() else {
            return;
        };
        for t in scope.tasks {
            if let Some(n) = self.nodes.get_mut(&t) {
                n.scope_open = false;
            }
            self.maybe_consume(t);
        }
    }

    pub(crate) fn failures(&self) -> &[TaskFailure] {
        &self.failures
    }

    /// Validates a submission and computes its output layout. Changes nothing.
    pub(crate) fn plan(
        &self,
        kernel: Option<Arc<Kernel>>,
        args: TaskArgs,
    ) -> Result<Plan, OrchError> {
        if let Some(k) = &kernel {
            if !self.cores.has(k.kind()) {
                return Err(OrchError::NoCore {
                    kernel: k.name().to_string(),
                    kind: k.kind(),
                });
            }
        }
        if args.block_num == 0 {
            return Err(invalid(&kernel, "block count must be at least 1".into()));
        }
        for d in &args.deps {
            if d.0 >= self.next_id {
                return Err(OrchError::UnknownTask(*d));
            }
        }
        let mut out_offsets = SmallVec::new();
        let mut bytes = 0usize;
        for (i, a) in args.tensors.iter().enumerate() {
            match a {
                TensorArg::Existing(t, _) => t.check_live()?,
                TensorArg::Create { shape, dtype, .. } => {
                    if shape.is_empty() || shape.len() > MAX_DIMS {
                        return Err(TensorError::BadRank { ndims: shape.len() }.into());
                    }
                    let n = shape
                        .iter()
                        .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
                        .ok_or_else(|| invalid(&kernel, format!("output {i} is too large")))?;
                    out_offsets.push(bytes);
                    bytes = bytes
                        .checked_add(align_up(n, OUT_ALIGN))
                        .ok_or_else(|| invalid(&kernel, format!("output {i} is too large")))?;
                }
            }
        }
        // Two arguments of one task may overlap only if both are read-only.
        {
            let existing: SmallVec<[(usize, &Tensor, ArgMode); 8]> = args
                .tensors
                .iter()
                .enumerate()
                .filter_map(|(i, a)| match a {
                    TensorArg::Existing(t, m) => Some((i, t, *m)),
                    TensorArg::Create { .. } => None,
                })
                .collect();
            for (x, &(i, ti, mi)) in existing.iter().enumerate() {
                for &(j, tj, mj) in &existing[x + 1..] {
                    if (mi.writable() || mj.writable())
                        && ti.buffer() == tj.buffer()
                        && crate::tensor::intersects(ti.region(), tj.region())
                    {
                        return Err(invalid(
                        &kernel,
                        format!("tensor arguments {i} ({mi}) and {j} ({mj}) overlap and one is written"),
                    ));
                    }
                }
            }
        }
        let ring = self.depth().min(NUM_RINGS - 1);
        if bytes > self.rings[ring].heap_size {
            return Err(OrchError::OutputTooLarge {
                kernel: kernel
                    .as_ref()
                    .map_or_else(|| "<dummy>".into(), |k| k.name().to_string()),
                bytes,
                ring,
                capacity: self.rings[ring].heap_size,
            });
        }
        Ok(Plan {
            kernel,
            args,
            out_offsets,
            bytes,
            ring,
        })
    }

    /// Finds room for a plan now, or says why not.
    pub(crate) fn place(&self, plan: &Plan) -> Result<usize, Blocked> {
        let ring = &self.rings[plan.ring];
        match ring.try_place(plan.bytes) {
            Ok(at) => Ok(at),
            Err(full) => {
                let what = match full {
                    Full::Tasks => format!("task window of {}", ring.window),
                    Full::Heap => format!("{} of {} heap bytes wanted", plan.bytes, ring.heap_size),
                };
                let hint = match full {
                    Full::Tasks => "PTO_RING_TASK_WINDOW",
                    Full::Heap => "PTO_RING_HEAP_BYTES",
                };
                let pinned = ring
                    .live
                    .front()
                    .and_then(|t| self.nodes.get(t))
                    .is_some_and(|n| n.scope_open);
                if pinned {
                    Err(Blocked::Never(OrchError::ScopeDeadlock {
                        depth: self.depth(),
                        ring: plan.ring,
                        live: ring.live.len(),
                        what,
                        hint,
                    }))
                } else {
                    Err(Blocked::Wait(what))
                }
            }
        }
    }

    fn liveness(nodes: &FxHashMap<u64, Node>, failed: &FxHashMap<u64, u64>, t: u64) -> Liveness {
        if nodes.contains_key(&t) {
            Liveness::Live
        } else if failed.contains_key(&t) {
            Liveness::RetiredFailed
        } else {
            Liveness::Retired
        }
    }

    /// Commits a placed plan: allocates outputs, infers and wires dependencies, and makes the
    /// task ready when nothing holds it back. Returns the task and its runtime outputs.
    pub(crate) fn commit(
        &mut self,
        plan: Plan,
        at: usize,
    ) -> Result<(TaskId, Vec<Tensor>), OrchError> {
        let Plan {
            kernel,
            args,
            out_offsets,
            bytes,
            ring,
        } = plan;
        let id = self.next_id;
        let heap = if bytes > 0 {
            Some(
                self.rings[ring]
                    .heap(self.rings_cfg.alloc.as_deref())
                    .map_err(TensorError::from)?,
            )
        } else {
            None
        };
        self.next_id += 1;
        let lease = (!out_offsets.is_empty()).then(|| Arc::new(Lease::default()));
        let manual = self.manual();

        let mut tensors = Vec::with_capacity(args.tensors.len());
        let mut outputs = Vec::with_capacity(out_offsets.len());
        let mut inits = SmallVec::new();
        let mut deps: SmallVec<[u64; 8]> = args.deps.iter().map(|d| d.0).collect();
        let mut keys = SmallVec::new();
        let mut outs = out_offsets.iter();
        for (i, a) in args.tensors.into_iter().enumerate() {
            match a {
                TensorArg::Existing(t, mode) => {
                    if !manual {
                        if let Some(o) = &t.origin {
                            deps.push(o.task.0);
                        }
                        let (lookup, record) = match mode {
                            ArgMode::In => (Some(false), Some(false)),
                            ArgMode::InOut | ArgMode::OutputExisting => (Some(true), Some(true)),
                            ArgMode::NoDep | ArgMode::Out => (None, None),
                        };
                        if let Some(write) = lookup {
                            let (nodes, failed) = (&self.nodes, &self.retired_failed);
                            self.tmap.lookup(
                                t.buffer().id(),
                                t.region(),
                                write,
                                |x| Self::liveness(nodes, failed, x),
                                &mut deps,
                            );
                        }
                        if let Some(write) = record {
                            keys.push(self.tmap.insert(t.buffer().id(), t.region(), write, id));
                        }
                    }
                    tensors.push((t, mode));
                }
                TensorArg::Create { shape, dtype, init } => {
                    let off = at + outs.next().copied().unwrap_or(0);
                    let heap = heap
                        .clone()
                        .ok_or_else(|| invalid(&kernel, "no heap".into()))?;
                    let region = Region::contiguous(dtype, off / dtype.size(), &shape);
                    let t = Tensor {
                        buffer: heap,
                        region,
                        origin: lease.as_ref().map(|l| Origin {
                            task: TaskId(id),
                            lease: l.clone(),
                        }),
                    };
                    if init != OutInit::Unspecified {
                        inits.push((i, init));
                    }
                    outputs.push(t.clone());
                    tensors.push((t, ArgMode::Out));
                }
            }
        }
        deps.sort_unstable();
        deps.dedup();
        deps.retain(|d| *d != id);

        let mut node = Node {
            kernel,
            payload: Arc::new(Payload {
                tensors,
                scalars: args.scalars,
                block_num: args.block_num,
                inits,
                deferred: args.deferred,
            }),
            state: State::Waiting,
            fanin: 0,
            consumers: SmallVec::new(),
            retains: SmallVec::new(),
            retained: 0,
            scope_open: true,
            consumed: false,
            ring: ring as u8,
            lease,
            blocks_next: 0,
            blocks_done: 0,
            root: None,
            block_error: None,
            tm_keys: keys,
            borrows: None,
            deps: SmallVec::new(),
            conds: Vec::new(),
            tokens_expected: 0,
            tokens_seen: 0,
            token_error: None,
            token_deadline: None,
            first: None,
        };
        if let Some((seen, err)) = self.early.remove(&id) {
            node.tokens_seen = seen;
            node.token_error = err;
        }
        for &p in &deps {
            if let Some(pn) = self.nodes.get_mut(&p) {
                match pn.state {
                    State::Failed | State::Poisoned => {
                        node.root = node.root.or(pn.root);
                    }
                    State::Done => {}
                    _ => {
                        node.fanin += 1;
                        pn.consumers.push(id);
                    }
                }
                pn.retained += 1;
                node.retains.push(p);
                node.deps.push(p);
                self.stats.edges += 1;
            } else if let Some(root) = self.retired_failed.get(&p) {
                node.root = node.root.or(Some(*root));
                node.deps.push(p);
            }
        }
        let ready_now = node.fanin == 0;
        let dummy = node.kernel.is_none();
        self.nodes.insert(id, node);
        self.rings[ring].commit(id, at, bytes);
        if let Some(s) = self.scopes.last_mut() {
            s.tasks.push(id);
        }
        self.outstanding += 1;
        self.stats.tasks += 1;
        if dummy {
            self.stats.dummy += 1;
        }
        if ready_now {
            self.release(id);
        }
        Ok((TaskId(id), outputs))
    }

    /// A task whose producers have all finished: poison it, complete it (dummy), or queue it.
    fn release(&mut self, id: u64) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        if n.root.is_some() {
            self.finish(id, State::Poisoned);
        } else if let Some(k) = &n.kernel {
            n.state = State::Ready;
            let q = match k.kind() {
                CoreKind::Mix => 0,
                CoreKind::Aic => 1,
                CoreKind::Aiv => 2,
            };
            self.ready[q].push_back(id);
        } else {
            self.finish(id, State::Done);
        }
    }

    /// True when some queued block could be dispatched on a free core now.
    pub(crate) fn has_dispatchable(&self) -> bool {
        let kinds = [CoreKind::Mix, CoreKind::Aic, CoreKind::Aiv];
        (0..3).any(|q| !self.ready[q].is_empty() && self.cores.can_claim(kinds[q]))
    }

    /// Hands out the next block that has a free core of its kind.
    pub(crate) fn next_job(&mut self) -> Option<Job> {
        const KINDS: [CoreKind; 3] = [CoreKind::Mix, CoreKind::Aic, CoreKind::Aiv];
        loop {
            let mut picked = None;
            // MIX first (it needs a whole cluster), then AIC and AIV in alternating order.
            let order = if self.rotate.is_multiple_of(2) {
                [0, 1, 2]
            } else {
                [0, 2, 1]
            };
            self.rotate = self.rotate.wrapping_add(1);
            for q in order {
                if let Some(&id) = self.ready[q].front() {
                    if let Some(core) = self.cores.claim(KINDS[q]) {
                        picked = Some((q, id, core));
                        break;
                    }
                }
            }
            let (q, id, core) = picked?;
            let n = self.nodes.get_mut(&id)?;
            let block = n.blocks_next;
            n.blocks_next += 1;
            if n.blocks_next >= n.payload.block_num {
                self.ready[q].pop_front();
            }
            if block == 0 {
                n.state = State::Running;
                let mut set = BorrowSet::with_token(self.nonce << TOKEN_TASK_BITS | id);
                let mut conflict = None;
                for (i, (t, mode)) in n.payload.tensors.iter().enumerate() {
                    let write = mode.writable() && *mode != ArgMode::NoDep;
                    if let Err(c) = set.add(t.buffer(), t.region(), write) {
                        conflict = Some((i, t.buffer().id(), c.other));
                        break;
                    }
                }
                n.borrows = Some(set);
                if let Some((i, buf, other)) = conflict {
                    let who = if other >> TOKEN_TASK_BITS == self.nonce {
                        format!("task #{}", other & ((1 << TOKEN_TASK_BITS) - 1))
                    } else {
                        "code outside this run (host code or another chip)".to_string()
                    };
                    self.cores.release(core);
                    self.ready[q].retain(|x| *x != id);
                    let n = self.nodes.get_mut(&id)?;
                    n.blocks_next = n.payload.block_num;
                    n.block_error = Some((
                        0,
                        None,
                        format!("tensor argument {i} (buffer {buf}) overlaps memory in use by {who}: a data race the dependency engine was told not to order (NO_DEP or a manual scope)"),
                    ));
                    self.finish(id, State::Failed);
                    continue;
                }
                Self::init_outputs(n);
            }
            let n = self.nodes.get(&id)?;
            let kernel = n.kernel.clone()?;
            let token = n.borrows.as_ref().map_or(0, BorrowSet::token);
            self.running.insert((id, block), (core, kernel.clone()));
            return Some(Job {
                task: id,
                block,
                core,
                kernel,
                payload: n.payload.clone(),
                token,
            });
        }
    }

    fn init_outputs(n: &Node) {
        for &(i, init) in &n.payload.inits {
            if init == OutInit::Zeroed {
                if let Some((t, _)) = n.payload.tensors.get(i) {
                    crate::view::zero_fill(t);
                }
            }
        }
    }

    /// A block came back from its core, with what its kernel registered.
    pub(crate) fn finish_block(
        &mut self,
        job: &Job,
        result: Result<(), String>,
        times: Option<(f64, f64)>,
        regs: Registrations,
    ) {
        self.cores.release(job.core);
        self.running.remove(&(job.task, job.block));
        self.stats.blocks += 1;
        let Some(n) = self.nodes.get_mut(&job.task) else {
            return;
        };
        if let Some((start_us, end_us)) = times {
            if n.first.is_none_or(|f| start_us < f.0) {
                n.first = Some((start_us, job.core));
            }
            if let Some(trace) = &mut self.trace {
                trace.events.push(TraceEvent {
                    task: TaskId(job.task),
                    kernel: Arc::from(job.kernel.name()),
                    core: job.core,
                    block: job.block,
                    start_us,
                    end_us,
                    deps: n.deps.iter().map(|d| TaskId(*d)).collect(),
                    deferred: false,
                });
            }
        }
        if let Err(m) = result {
            if n.block_error.is_none() {
                n.block_error = Some((job.block, Some(job.core), m));
            }
        }
        n.tokens_expected += regs.tokens;
        if let Some(d) = regs.token_deadline {
            n.token_deadline = Some(n.token_deadline.map_or(d, |x| x.min(d)));
        }
        n.conds.extend(regs.conds);
        if n.conds.len() + n.tokens_expected as usize > MAX_CONDITIONS && n.block_error.is_none() {
            n.block_error = Some((
                job.block,
                Some(job.core),
                format!("registered more than {MAX_CONDITIONS} completion conditions"),
            ));
        }
        n.blocks_done += 1;
        if n.blocks_done == n.payload.block_num {
            if n.block_error.is_some() {
                self.finish(job.task, State::Failed);
            } else if n.conds.is_empty() && n.tokens_expected == 0 {
                self.finish(job.task, State::Done);
            } else {
                n.state = State::Deferred;
                self.waiting.push(job.task);
                self.stats.deferred += 1;
                // Conditions may hold already.
                self.poll_waiting(std::time::Instant::now());
            }
        }
    }

    /// True when deferred tasks wait for their conditions.
    pub(crate) fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    fn absorb(&mut self, c: Completion) {
        self.stats.completions += 1;
        let (nonce, id) = (
            c.token >> TOKEN_TASK_BITS,
            c.token & ((1 << TOKEN_TASK_BITS) - 1),
        );
        let err = (c.status != 0).then_some(c.status);
        if nonce != self.nonce {
            self.stray
                .push(format!("token {:#x} names no task of this run", c.token));
        } else if let Some(n) = self.nodes.get_mut(&id) {
            if n.state.finished() {
                self.stray.push(format!(
                    "token {:#x} posted for task #{id}, which had already completed",
                    c.token
                ));
            } else {
                n.tokens_seen += 1;
                n.token_error = n.token_error.or(err);
            }
        } else if id >= self.next_id {
            // Posted before the task was submitted: kept until it appears.
            let e = self.early.entry(id).or_insert((0, None));
            e.0 += 1;
            e.1 = e.1.or(err);
        } else {
            self.stray.push(format!(
                "token {:#x} posted for task #{id}, which had already completed",
                c.token
            ));
        }
    }

    /// Drains the completion queue and polls every waiting task; completes (or fails) those
    /// whose conditions are settled. Returns true when anything happened.
    pub(crate) fn poll_async(&mut self, queue: &CompletionQueue) -> bool {
        let mut progress = false;
        while let Some(c) = queue.pop() {
            self.absorb(c);
            progress = true;
        }
        if !self.waiting.is_empty() {
            progress |= self.poll_waiting(std::time::Instant::now());
        }
        progress
    }

    fn poll_waiting(&mut self, now: std::time::Instant) -> bool {
        let mut settled: SmallVec<[(u64, Option<String>); 4]> = SmallVec::new();
        self.waiting.retain(|&id| {
            let Some(n) = self.nodes.get_mut(&id) else {
                return false;
            };
            if let Some(st) = n.token_error {
                settled.push((
                    id,
                    Some(format!("its completion was posted with status {st}")),
                ));
                return false;
            }
            let mut failed = None;
            n.conds.retain(|(c, deadline)| {
                if failed.is_some() {
                    return true;
                }
                match c.poll() {
                    Poll::Ready => false,
                    Poll::Pending if now >= *deadline => {
                        failed = Some(format!(
                            "condition {} did not hold before its deadline",
                            c.describe()
                        ));
                        true
                    }
                    Poll::Pending => true,
                    Poll::Failed(m) => {
                        failed = Some(format!("condition {} failed: {m}", c.describe()));
                        true
                    }
                }
            });
            if failed.is_some() {
                settled.push((id, failed));
                return false;
            }
            if n.conds.is_empty() && n.tokens_seen >= n.tokens_expected {
                settled.push((id, None));
                return false;
            }
            if n.tokens_seen < n.tokens_expected && n.token_deadline.is_some_and(|d| now >= d) {
                settled.push((
                    id,
                    Some(format!(
                        "completion token {:#x} was posted {} of {} times before its deadline",
                        self.nonce << TOKEN_TASK_BITS | id,
                        n.tokens_seen,
                        n.tokens_expected
                    )),
                ));
                return false;
            }
            true
        });
        let progress = !settled.is_empty();
        let now_us = self.trace.is_some().then(crate::trace::now_us);
        for (id, failure) in settled {
            if let (Some(trace), Some(end_us)) = (&mut self.trace, now_us) {
                if let Some(n) = self.nodes.get(&id) {
                    if let (Some((start_us, core)), Some(k)) = (n.first, &n.kernel) {
                        trace.events.push(TraceEvent {
                            task: TaskId(id),
                            kernel: Arc::from(k.name()),
                            core,
                            block: 0,
                            start_us,
                            end_us,
                            deps: n.deps.iter().map(|d| TaskId(*d)).collect(),
                            deferred: true,
                        });
                    }
                }
            }
            match failure {
                None => self.finish(id, State::Done),
                Some(m) => {
                    if let Some(n) = self.nodes.get_mut(&id) {
                        n.block_error = Some((0, None, m));
                    }
                    self.finish(id, State::Failed);
                }
            }
        }
        progress
    }

    /// Marks a task finished and propagates: consumers' fan-in, poison, retained producers,
    /// reclamation. Iterative, so long chains of dummy or poisoned tasks use no stack.
    fn finish(&mut self, id: u64, state: State) {
        let mut work: SmallVec<[(u64, State); 8]> = SmallVec::new();
        work.push((id, state));
        while let Some((id, state)) = work.pop() {
            let Some(n) = self.nodes.get_mut(&id) else {
                continue;
            };
            debug_assert!(!n.state.finished());
            n.state = state;
            n.borrows = None;
            self.outstanding -= 1;
            self.finished += 1;
            match state {
                State::Failed => {
                    n.root = Some(id);
                    self.stats.failed += 1;
                    let (block, core, message) =
                        n.block_error
                            .take()
                            .unwrap_or((0, None, "unknown failure".into()));
                    self.failures.push(TaskFailure {
                        task: TaskId(id),
                        kernel: n
                            .kernel
                            .as_ref()
                            .map_or_else(|| "<dummy>".into(), |k| k.name().to_string()),
                        core,
                        block,
                        message,
                    });
                }
                State::Poisoned => self.stats.poisoned += 1,
                _ => {}
            }
            let root = n.root;
            let consumers = std::mem::take(&mut n.consumers);
            let retains = std::mem::take(&mut n.retains);
            for c in consumers {
                let Some(cn) = self.nodes.get_mut(&c) else {
                    continue;
                };
                if root.is_some() && cn.root.is_none() {
                    cn.root = root;
                }
                cn.fanin -= 1;
                if cn.fanin == 0 {
                    if cn.root.is_some() {
                        work.push((c, State::Poisoned));
                    } else if cn.kernel.is_none() {
                        work.push((c, State::Done));
                    } else {
                        self.release(c);
                    }
                }
            }
            for p in retains {
                if let Some(pn) = self.nodes.get_mut(&p) {
                    pn.retained -= 1;
                }
                self.maybe_consume(p);
            }
            self.maybe_consume(id);
        }
    }

    fn maybe_consume(&mut self, id: u64) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        if n.consumed || !n.state.finished() || n.scope_open || n.retained > 0 {
            return;
        }
        n.consumed = true;
        let ring = usize::from(n.ring);
        while let Some(&front) = self.rings[ring].live.front() {
            if !self.nodes.get(&front).is_some_and(|n| n.consumed) {
                break;
            }
            self.rings[ring].pop_front(front);
            if let Some(n) = self.nodes.remove(&front) {
                if let Some(l) = &n.lease {
                    l.reclaim();
                }
                if let Some(root) = n.root {
                    // Keep its TensorMap entries: later readers of what it should have
                    // written are poisoned too.
                    self.retired_failed.insert(front, root);
                } else {
                    for k in n.tm_keys {
                        self.tmap.remove(k);
                    }
                }
            }
        }
    }

    /// The producers a host read (or write) of `t` must wait for; `Err` names a failed one.
    pub(crate) fn pending_for(&mut self, t: &Tensor, write: bool) -> Result<usize, OrchError> {
        let mut deps: SmallVec<[u64; 8]> = SmallVec::new();
        if let Some(o) = &t.origin {
            deps.push(o.task.0);
        }
        let (nodes, failed) = (&self.nodes, &self.retired_failed);
        self.tmap.lookup(
            t.buffer().id(),
            t.region(),
            write,
            |x| Self::liveness(nodes, failed, x),
            &mut deps,
        );
        let mut pending = 0;
        for d in deps {
            if let Some(n) = self.nodes.get(&d) {
                match n.state {
                    State::Failed | State::Poisoned => return Err(self.poison_error(d, n.root)),
                    State::Done => {}
                    _ => pending += 1,
                }
            } else if let Some(root) = self.retired_failed.get(&d) {
                return Err(self.poison_error(d, Some(*root)));
            }
        }
        Ok(pending)
    }

    fn poison_error(&self, task: u64, root: Option<u64>) -> OrchError {
        let cause = root
            .and_then(|r| self.failures.iter().find(|f| f.task.0 == r))
            .map_or_else(|| "a producer failed".to_string(), ToString::to_string);
        OrchError::Poisoned {
            task: TaskId(task),
            cause,
        }
    }

    /// Names the tasks still running, for a stall report.
    pub(crate) fn running_report(&self) -> String {
        if self.running.is_empty() && self.waiting.is_empty() {
            let waiting = self.outstanding;
            return format!("none ({waiting} task(s) waiting)");
        }
        let mut v: Vec<String> = self
            .running
            .iter()
            .map(|((t, b), (c, k))| format!("task #{t} block {b} kernel {:?} on {c}", k.name()))
            .collect();
        v.sort();
        for id in &self.waiting {
            if let Some(n) = self.nodes.get(id) {
                let conds: Vec<String> = n.conds.iter().map(|(c, _)| c.describe()).collect();
                v.push(format!(
                    "deferred task #{id} waiting for [{}] and {}/{} token posts",
                    conds.join(", "),
                    n.tokens_seen,
                    n.tokens_expected
                ));
            }
        }
        v.join(", ")
    }

    /// Marks every output lease reclaimed at the end of a run (stale handles then error).
    pub(crate) fn close(&mut self) {
        for n in self.nodes.values() {
            if let Some(l) = &n.lease {
                l.reclaim();
            }
        }
        for r in &self.rings {
            self.stats.peak_ring_tasks = self.stats.peak_ring_tasks.max(r.peak_tasks);
            self.stats.peak_ring_bytes = self.stats.peak_ring_bytes.max(r.peak_bytes);
        }
    }
}

/// A deadline helper: the time left, or `None` once passed.
pub(crate) fn remaining(deadline: std::time::Instant) -> Option<Duration> {
    deadline.checked_duration_since(std::time::Instant::now())
}

#[cfg(test)]
mod tests;
