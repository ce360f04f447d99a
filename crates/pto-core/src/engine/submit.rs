//! The orchestrating thread's side: what only it touches (the TensorMap, the rings, the
//! scopes, the free slots) and how a task is planned, placed, wired and published; how
//! finished tasks are reclaimed from the front of each ring is in [`retire`].

#![allow(unsafe_code)]

mod memory;
pub(crate) use memory::RunMemory;
use memory::Scratch;
mod retire;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::execute::Finish;
use super::ring::{Full, OUT_ALIGN};
use super::slab::State;
use super::tensormap::{Liveness, Probe};
use super::{Engine, RunStats, TaskRef, NUM_RINGS, TOKEN_TASK_BITS};
use crate::args::{ArgMode, OutInit, TaskArgs, TaskId, TensorArg};
use crate::buffer::Buffer;
use crate::error::{OrchError, TaskFailure};
use crate::geometry::byte_size;
use crate::kernel::Kernel;
use crate::tensor::{Lease, Origin, Region, Tensor, TensorError};

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

/// What submit decided before any state changed. It borrows the kernel: the task's node keeps
/// the `Arc` it already holds when the kernel is the one it ran last (no reference count
/// traffic per task).
pub(crate) struct Plan<'k> {
    kernel: Option<&'k Arc<Kernel>>,
    /// Byte offsets of each runtime output within the task's allocation.
    out_offsets: SmallVec<[usize; 4]>,
    bytes: usize,
    ring: usize,
}

impl Plan<'_> {
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

#[derive(Debug)]
struct Scope {
    manual: bool,
    tasks: Vec<TaskRef>,
}

/// What only the orchestrating thread keeps about a slot's task. Kept by the engine between
/// runs (like the free slots), so that a run does not grow it again.
#[derive(Debug, Default)]
pub(crate) struct Aux {
    /// `1 + id` of the task in the node while it is live, 0 once reclaimed: the node's `id`
    /// mirrored here, so that telling a live producer from a retired one reads no line that
    /// core threads write (the node's first line changes as its task runs and finishes).
    live: u64,
    lease: Option<Arc<Lease>>,
    scope_open: bool,
    /// In `Orchestrator::kept`: its node may hold a kernel.
    kept: bool,
}

fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

fn invalid(kernel: &Option<&Arc<Kernel>>, detail: String) -> OrchError {
    OrchError::InvalidArgs {
        kernel: kernel
            .as_ref()
            .map_or_else(|| "<dummy>".to_string(), |k| k.name().to_string()),
        detail,
    }
}

/// Whether the task a TensorMap entry names is still live, retired after failing, or retired.
fn liveness(aux: &[Aux], retired_failed: &FxHashMap<u64, u64>, x: TaskRef) -> Liveness {
    if aux.get(x.slot as usize).is_some_and(|a| a.live == x.id + 1) {
        Liveness::Live
    } else if !retired_failed.is_empty() && retired_failed.contains_key(&x.id) {
        Liveness::RetiredFailed
    } else {
        Liveness::Retired
    }
}

/// A task whose producers have all finished, on the orchestrating thread: poison it, complete
/// it (dummy), or queue it.
fn release(e: &Engine, slot: u32, dummy: bool) {
    let how = if e.slab.get(slot).root.load(Ordering::Acquire) != 0 {
        Finish::Poisoned
    } else if dummy {
        Finish::Done
    } else {
        e.publish(slot);
        return;
    };
    if let Some(c) = e.finish(None, slot, how) {
        // This thread runs no kernel: queue the consumer it made ready.
        e.push_job(c);
    }
}

/// How many submits the orchestrating thread stages its ready tasks for before it publishes
/// them: each publish moves the queue's lines to the core threads once for the batch.
const PUBLISH_EVERY: u32 = 16;

/// The orchestrating thread's state for one run.
pub(crate) struct Orchestrator {
    pub(crate) engine: Arc<Engine>,
    next_id: u64,
    /// Its collections, kept from one run to the next (see [`RunMemory`]): boxed, so that a
    /// run takes them from the engine and gives them back without copying them.
    mem: Box<RunMemory>,
    /// The free slot the next task takes, taken out of `free` and prefetched at the end of
    /// the commit before (reclaims push onto `free` meanwhile).
    next_slot: Option<u32>,
    rings_cfg: RingConfig,
    nonce: u64,
    /// Submits since the orchestrating thread last published its ready queues.
    since_publish: u32,
    pub(crate) stats: RunStats,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("next_id", &self.next_id)
            .finish_non_exhaustive()
    }
}

impl Orchestrator {
    /// Tasks submitted so far.
    pub(crate) fn submitted(&self) -> u64 {
        self.next_id
    }

    /// Depth of the innermost open scope (0 = the implicit outer scope).
    pub(crate) fn depth(&self) -> usize {
        self.mem.scopes.len() - 1
    }

    fn manual(&self) -> bool {
        self.mem.scopes.last().is_some_and(|s| s.manual)
    }

    pub(crate) fn begin_scope(&mut self, manual: bool) -> Result<(), OrchError> {
        if !manual && self.manual() {
            return Err(OrchError::AutoInsideManual);
        }
        let tasks = self.mem.spare_scopes.pop().unwrap_or_default();
        self.mem.scopes.push(Scope { manual, tasks });
        Ok(())
    }

    /// Ends the innermost scope (the implicit outer one too, at the end of a run): its tasks
    /// stop pinning their rings.
    pub(crate) fn end_scope(&mut self) {
        let Some(mut scope) = self.mem.scopes.pop() else {
            return;
        };
        // The scope's pin is orchestrator-private: no atomic on the (shared) task nodes.
        for t in scope.tasks.drain(..) {
            if let Some(a) = self.mem.aux.get_mut(t.slot as usize) {
                a.scope_open = false;
            }
        }
        // Kept for the next scope: opening and closing scopes allocates nothing.
        if self.mem.spare_scopes.len() < 16 {
            self.mem.spare_scopes.push(scope.tasks);
        }
        self.reclaim();
    }

    /// Validates a submission and computes its output layout. Changes nothing.
    pub(crate) fn plan<'k>(
        &self,
        kernel: Option<&'k Arc<Kernel>>,
        args: &TaskArgs,
    ) -> Result<Plan<'k>, OrchError> {
        if let Some(k) = &kernel {
            if !self.engine.cores.has(k.kind()) {
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
                    let n = match byte_size(shape, *dtype) {
                        Err(TensorError::Overflow) => {
                            return Err(invalid(&kernel, format!("output {i} is too large")));
                        }
                        n => n?,
                    };
                    out_offsets.push(bytes);
                    bytes = bytes
                        .checked_add(align_up(n, OUT_ALIGN))
                        .ok_or_else(|| invalid(&kernel, format!("output {i} is too large")))?;
                }
            }
        }
        // Two arguments of one task may share bytes only if both are read-only. Byte extents
        // first: most pairs are apart.
        let ts = &args.tensors;
        for (i, a) in ts.iter().enumerate().skip(1) {
            let TensorArg::Existing(ti, mi) = a else {
                continue;
            };
            let mut range_i = None;
            for (j, b) in ts[..i].iter().enumerate() {
                let TensorArg::Existing(tj, mj) = b else {
                    continue;
                };
                if !(mi.writable() || mj.writable()) || ti.buffer() != tj.buffer() {
                    continue;
                }
                let (si, ei) = *range_i.get_or_insert_with(|| ti.region().byte_range());
                let (sj, ej) = tj.region().byte_range();
                if si < ej && sj < ei && crate::tensor::intersects(ti.region(), tj.region()) {
                    return Err(invalid(
                        &kernel,
                        format!(
                            "tensor arguments {j} ({mj}) and {i} ({mi}) overlap and one is written"
                        ),
                    ));
                }
            }
        }
        let ring = self.depth().min(NUM_RINGS - 1);
        if bytes > self.mem.rings[ring].heap_size {
            return Err(OrchError::OutputTooLarge {
                kernel: kernel
                    .as_ref()
                    .map_or_else(|| "<dummy>".into(), |k| k.name().to_string()),
                bytes,
                ring,
                capacity: self.mem.rings[ring].heap_size,
            });
        }
        Ok(Plan {
            kernel,
            out_offsets,
            bytes,
            ring,
        })
    }

    /// Finds room for a plan now (reclaiming finished tasks first), or says why not.
    pub(crate) fn place(&mut self, plan: &Plan<'_>) -> Result<usize, Blocked> {
        if let Ok(at) = self.mem.rings[plan.ring].try_place(plan.bytes) {
            return Ok(at);
        }
        self.reclaim();
        let ring = &self.mem.rings[plan.ring];
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
                    .and_then(|t| self.mem.aux.get(t.slot as usize))
                    .is_some_and(|a| a.scope_open);
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

    fn alloc_slot(&mut self) -> Result<u32, OrchError> {
        if let Some(s) = self.next_slot.take().or_else(|| self.mem.free.pop()) {
            return Ok(s);
        }
        let r = self.engine.slab.grow().ok_or_else(|| {
            OrchError::msg("no free task node: more live tasks than the rings allow")
        })?;
        self.mem.free.extend(r.rev());
        self.mem
            .free
            .pop()
            .ok_or_else(|| OrchError::msg("no free task node"))
    }

    /// Commits a placed plan: allocates outputs, infers and wires dependencies, and publishes
    /// the task (to a ready queue when nothing holds it back). Returns the task and its
    /// runtime outputs.
    pub(crate) fn commit(
        &mut self,
        plan: &Plan<'_>,
        args: &mut TaskArgs,
        at: usize,
    ) -> Result<(TaskId, Vec<Tensor>), OrchError> {
        let &Plan {
            kernel,
            ref out_offsets,
            bytes,
            ring,
        } = plan;
        let heap = if bytes > 0 {
            Some(
                self.mem.rings[ring]
                    .heap(self.rings_cfg.alloc.as_deref())
                    .map_err(TensorError::from)?,
            )
        } else {
            None
        };
        let slot = self.alloc_slot()?;
        if self.mem.aux.len() <= slot as usize {
            // In steps: the slab grows in chunks too.
            self.mem
                .aux
                .resize_with((slot as usize + 1).next_multiple_of(256), Aux::default);
        }
        let id = self.next_id;
        let me = TaskRef { slot, id };
        let lease = (!out_offsets.is_empty()).then(|| Arc::new(Lease::new(TaskId(id))));
        let manual = self.manual();
        let dummy = kernel.is_none();
        let deferred = args.deferred;
        let Self {
            engine,
            mem,
            nonce,
            next_id,
            stats,
            ..
        } = self;
        let RunMemory {
            tmap,
            owned,
            retired_failed,
            rings,
            scopes,
            aux,
            kept,
            scratch,
            ..
        } = &mut **mem;
        let Scratch {
            deps,
            explicit,
            wire,
        } = scratch;
        deps.clear();
        explicit.clear();
        wire.clear();
        let engine: &Engine = engine;
        let slab = &engine.slab;
        let s = slab.get(slot);
        // SAFETY: the slot came from the free list: no other thread can reach it, and this is
        // the only reference to its body until `install`.
        let b = unsafe { s.body_mut() };
        // The node keeps the kernel of its last task (see `Slot::reclaim`): most programs
        // submit one kernel many times, and then nothing is cloned or dropped here.
        match (&b.kernel, kernel) {
            (Some(old), Some(new)) if Arc::ptr_eq(old, new) => {}
            _ => {
                b.kernel = kernel.cloned();
                let a = &mut aux[slot as usize];
                if kernel.is_some() && !a.kept {
                    a.kept = true;
                    kept.push(slot);
                }
            }
        }
        b.payload.block_num = args.block_num;
        b.payload.deferred = deferred;
        if !args.scalars.is_empty() {
            b.payload.scalars.extend(args.scalars.drain(..));
            b.payload.extras = 1;
        }
        b.token = *nonce << TOKEN_TASK_BITS | id;
        b.registered = 0;

        let own = |owned: &mut Vec<Buffer>, buf: &Buffer| match buf.claim_owner(*nonce) {
            Some(true) => {
                owned.push(buf.clone());
                true
            }
            Some(false) => true,
            None => false,
        };
        let live = |x: TaskRef| liveness(aux, retired_failed, x);
        let mut outputs = Vec::with_capacity(out_offsets.len());
        for d in &args.deps {
            explicit.push(d.0);
        }
        // First the dependencies, reading the arguments where the caller put them; then one
        // move of each into the node (a move between the two would copy each tensor twice).
        let mut tensors = std::mem::take(&mut args.tensors);
        for (i, a) in tensors.iter().enumerate() {
            let TensorArg::Existing(t, mode) = a else {
                continue;
            };
            let mode = *mode;
            let tracked = !manual && mode != ArgMode::NoDep;
            if (!tracked || !own(owned, t.buffer())) && i < 64 {
                b.registered |= 1 << i;
            }
            if manual {
                continue;
            }
            if let Some(o) = &t.origin {
                explicit.push(o.task().0);
            }
            // A read depends on writers and is recorded as a reader; an update or an overwrite
            // depends on both and is recorded as a writer.
            let write = match mode {
                ArgMode::In => false,
                ArgMode::InOut | ArgMode::OutputExisting => true,
                ArgMode::NoDep | ArgMode::Out => continue,
            };
            tmap.access(
                t.buffer().id(),
                t.region(),
                &Probe::of(t.region()),
                write,
                me,
                live,
                deps,
            );
        }
        // Runtime outputs become tensors in place; then the vector moves into the node whole
        // (no tensor is copied), and the node's emptied one goes back to the pool.
        if !out_offsets.is_empty() {
            let mut outs = out_offsets.iter();
            for (i, a) in tensors.iter_mut().enumerate() {
                let TensorArg::Create { shape, dtype, init } = a else {
                    continue;
                };
                let (dtype, init) = (*dtype, *init);
                let off = at + outs.next().copied().unwrap_or(0);
                let Some(heap) = heap.clone() else {
                    return Err(OrchError::msg("internal: an output without a ring heap"));
                };
                let region = Region::contiguous(dtype, off / dtype.size(), shape);
                let t = Tensor {
                    buffer: heap,
                    region,
                    origin: lease.as_ref().map(|l| Origin(l.clone())),
                };
                // The ring's heap is this run's own.
                if !own(owned, t.buffer()) && i < 64 {
                    b.registered |= 1 << i;
                }
                if init != OutInit::Unspecified {
                    b.payload.inits.push((i, init));
                    b.payload.extras = 1;
                }
                outputs.push(t.clone());
                *a = TensorArg::Existing(t, ArgMode::Out);
            }
        }
        std::mem::swap(&mut b.payload.tensors, &mut tensors);
        let next_len = b.payload.tensors.len();
        crate::args::pool::give(tensors, next_len);
        // Explicit dependencies and producers of runtime outputs name tasks by id: find their
        // nodes among the live ones (the TensorMap knows tasks by node). `root` is `1 + id` of
        // a failed task that poisons this one, or 0.
        let mut root = 0u64;
        for &d in explicit.iter() {
            if let Some(r) = rings.iter().flat_map(|r| r.live.iter()).find(|t| t.id == d) {
                deps.push(*r);
            } else if let Some(failed) = retired_failed.get(&d) {
                root = root.max(failed + 1);
                b.deps.push(d);
                b.payload.extras = 1;
            }
        }
        if deps.len() > 16 {
            deps.sort_unstable_by_key(|d| (d.id, d.slot));
            deps.dedup();
        } else if deps.len() > 1 {
            // A handful of producers (most tasks): drop repeats in place, keeping the first of
            // each, with fewer instructions than a sort.
            let mut n = 1;
            for i in 1..deps.len() {
                let d = deps[i];
                if !deps[..n].contains(&d) {
                    deps[n] = d;
                    n += 1;
                }
            }
            deps.truncate(n);
        }
        // Which producers are live (wired; retained when it has runtime outputs, which must
        // outlive this task's reads) and which poison it. The ids of producers not retained
        // are kept for traces (a retained one's id is read from its node).
        let trace_ids = cfg!(test) || engine.tracing.load(Ordering::Relaxed);
        for d in deps.iter() {
            if d.id == id {
                continue;
            }
            if liveness(aux, retired_failed, *d) == Liveness::Live {
                wire.push(d.slot);
                if aux.get(d.slot as usize).is_some_and(|a| a.lease.is_some()) {
                    b.retains.push(d.slot);
                } else if trace_ids {
                    b.deps.push(d.id);
                    b.payload.extras = 1;
                }
            } else if let Some(r) = retired_failed.get(&d.id) {
                root = root.max(r + 1);
                b.deps.push(d.id);
                b.payload.extras = 1;
            }
        }
        // The fan-in starts at one per producer about to be wired, so wiring takes no atomic
        // on this node: a producer that finished first (or while its edge was being added) is
        // counted off in one subtraction at publish. No guard is needed: the node is complete
        // before the first edge exists, and a producer only takes off an edge it holds, so the
        // count reaches zero only once every wired producer finished and every refused edge
        // was counted off. When every edge was added, the finishing producers alone release
        // the task (this thread then touches the node no more: no locked instruction here).
        let fanin = wire.len() as u32;
        // SAFETY: the body is filled; the slot is still free for every other thread.
        unsafe { s.install(id, fanin) };
        if deferred {
            engine.deferred.lock().tasks.insert(id, slot);
        }
        if root != 0 {
            s.root.store(root, Ordering::Release);
        }
        // SAFETY: published (installed) but not ready: only this thread reads `retains` now.
        for &p in &unsafe { s.body() }.retains {
            slab.get(p).refs.fetch_add(1, Ordering::AcqRel);
        }
        // Wire: an edge to every live producer not finished yet. (A finished one is only
        // read: its node's line is not taken away from the thread that finished it.)
        let mut unwired = 0;
        for &p in wire.iter() {
            let ps = slab.get(p);
            if ps.succ.is_finished() || !ps.succ.push(slot) {
                unwired += 1;
                // No edge; it may have failed.
                let r = ps.root.load(Ordering::Acquire);
                if r != 0 {
                    let _ = s
                        .root
                        .compare_exchange(0, r, Ordering::AcqRel, Ordering::Acquire);
                }
            }
        }
        stats.edges += wire.len() as u64;
        *next_id += 1;
        rings[ring].commit(me, at, bytes);
        if let Some(sc) = scopes.last_mut() {
            sc.tasks.push(me);
        }
        let a = &mut aux[slot as usize];
        a.live = id + 1;
        a.lease = lease;
        a.scope_open = true;
        stats.tasks += 1;
        if dummy {
            stats.dummy += 1;
        }
        engine.submitted.store(*next_id, Ordering::Release);
        // Publish: count off the edges not wired; the task is ready if every producer
        // finished. With no edge added no other thread can reach the count (and every producer
        // was seen finished with an acquire): a plain store, no locked instruction. With every
        // edge added there is nothing to count off (the last producer to finish releases it).
        if unwired == fanin {
            s.fanin.store(0, Ordering::Relaxed);
            release(engine, slot, dummy);
        } else if unwired > 0 && s.fanin.fetch_sub(unwired, Ordering::AcqRel) == unwired {
            release(engine, slot, dummy);
        }
        // Ready tasks are published to the core threads in batches (see `push_from_orch`).
        self.since_publish += 1;
        if self.since_publish >= PUBLISH_EVERY {
            self.since_publish = 0;
            engine.publish_orch();
        }
        // The node the next task will take: fetch it while the caller builds that task.
        if self.next_slot.is_none() {
            self.next_slot = self.mem.free.pop();
        }
        if let Some(n) = self.next_slot {
            self.engine.slab.get(n).prefetch();
        }
        Ok((TaskId(id), outputs))
    }

    /// The live task with id `id`, if any (explicit dependencies are rare: a scan of the
    /// rings).
    fn find_live(&self, id: u64) -> Option<TaskRef> {
        self.mem
            .rings
            .iter()
            .flat_map(|r| r.live.iter())
            .find(|t| t.id == id)
            .copied()
    }

    /// The producers a host read (or write) of `t` must wait for: how many, and the id of one
    /// of them; `Err` names a failed one.
    pub(crate) fn pending_for(
        &mut self,
        t: &Tensor,
        write: bool,
    ) -> Result<(usize, u64), OrchError> {
        let mut deps = Vec::new();
        let (aux, retired) = (&self.mem.aux, &self.mem.retired_failed);
        self.mem.tmap.lookup(
            t.buffer().id(),
            t.region(),
            &Probe::of(t.region()),
            write,
            |x: TaskRef| liveness(aux, retired, x),
            &mut deps,
        );
        if let Some(o) = &t.origin {
            let task = o.task().0;
            if let Some(r) = self.find_live(task) {
                deps.push(r);
            } else if let Some(root) = self.mem.retired_failed.get(&task) {
                return Err(self.poison_error(task, Some(*root)));
            }
        }
        let (mut pending, mut one) = (0, 0);
        for d in deps {
            let s = self.engine.slab.get(d.slot);
            if s.id.load(Ordering::Acquire) == d.id {
                match s.state() {
                    State::Failed | State::Poisoned => {
                        let r = s.root.load(Ordering::Acquire);
                        return Err(self.poison_error(d.id, r.checked_sub(1)));
                    }
                    State::Done => {}
                    _ => {
                        pending += 1;
                        one = d.id;
                    }
                }
            } else if let Some(root) = self.mem.retired_failed.get(&d.id) {
                return Err(self.poison_error(d.id, Some(*root)));
            }
        }
        Ok((pending, one))
    }

    fn poison_error(&self, task: u64, root: Option<u64>) -> OrchError {
        let failures = &self.engine.run.lock().failures;
        let cause = root
            .and_then(|r| failures.iter().find(|f: &&TaskFailure| f.task.0 == r))
            .map_or_else(|| "a producer failed".to_string(), ToString::to_string);
        OrchError::Poisoned {
            task: TaskId(task),
            cause,
        }
    }
}

#[cfg(test)]
impl Orchestrator {
    /// Tasks not reclaimed yet.
    pub(crate) fn live_tasks(&self) -> usize {
        self.mem.rings.iter().map(|r| r.live.len()).sum()
    }

    /// Entries in the TensorMap after a sweep (those of retired tasks leave in sweeps).
    pub(crate) fn tmap_len(&mut self) -> usize {
        self.sweep_tmap();
        self.mem.tmap.len()
    }

    /// Entries in the TensorMap now, swept or not.
    pub(crate) fn tmap_entries(&self) -> usize {
        self.mem.tmap.len()
    }

    /// The producers task `id` was wired to (live ones, by id).
    pub(crate) fn deps_of(&self, id: u64) -> Vec<u64> {
        let r = self.find_live(id).expect("a live task");
        let s = self.engine.slab.get(r.slot);
        // Read the body under a reader's pin (the thread finishing the task may be writing
        // its lines for a moment: `Slot::take_lines`).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !s.readers.pin() {
            assert!(
                std::time::Instant::now() < deadline,
                "a finishing task kept its body"
            );
            std::thread::yield_now();
        }
        // SAFETY: the task is live and only this thread reclaims; the pin keeps the finishing
        // thread from writing the body.
        let body = unsafe { s.body() };
        let ids = self
            .engine
            .producer_ids(body)
            .into_iter()
            .map(|t| t.get())
            .collect();
        s.readers.unpin();
        ids
    }
}
