//! The core threads' side: taking a block, running it, finishing a task, releasing its
//! consumers (the first of which the finishing thread runs itself), poisoning. No chip-wide
//! lock: a task's producers count down its atomic fan-in, the last block to return finishes
//! the task, and finishing closes its successor list (see `succ`).

#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use super::slab::{Body, State};
use super::{encode_current, queue_of, Engine, TOKEN_TASK_BITS, TOKEN_TASK_MASK};
use crate::args::{ArgMode, OutInit, TaskId, TensorArg};
use crate::buffer::BorrowSet;

/// Lines of each consumer node asked for while its producer runs: the fan-in and the state
/// the finishing thread writes, and the body's head that the consumer's first block reads
/// (its block count and its arguments' vector).
const CONSUMER_LINES: usize = 4;
use crate::error::TaskFailure;
use crate::kernel::{CoreId, CoreKind, KernelCtx, Registrations};
use crate::trace::{now_us, TraceEvent};

/// How a task ends.
#[derive(Debug)]
pub(crate) enum Finish {
    Done,
    Failed {
        block: u32,
        core: Option<CoreId>,
        message: String,
    },
    /// A producer failed; the root is already in the slot.
    Poisoned,
}

/// A traced block's start and end, and the points it marked.
type Traced = (f64, f64, Vec<crate::trace::Mark>);

impl Finish {
    pub(crate) fn failed(block: u32, core: Option<CoreId>, message: String) -> Finish {
        Finish::Failed {
            block,
            core,
            message,
        }
    }
}

/// One block of one task, with the core it runs on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job {
    pub(crate) slot: u32,
    pub(crate) block: u32,
    pub(crate) core: CoreId,
}

/// Consecutive consumers a thread runs itself before it queues one (so that others can take
/// part in a long chain of one kind... and a queued task is never starved).
pub(crate) const IMMEDIATE_LIMIT: u32 = 256;

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

const KINDS: [CoreKind; 3] = [CoreKind::Mix, CoreKind::Aic, CoreKind::Aiv];

impl Engine {
    /// The body of the task in `slot`.
    ///
    /// # Safety
    ///
    /// The task is published and not finished, or the caller holds a counted reference.
    pub(crate) unsafe fn body_of(&self, slot: u32) -> &Body {
        // SAFETY: forwarded contract.
        unsafe { self.slab.get(slot).body() }
    }

    /// Queues a task that became ready (its first block; more are queued as blocks are
    /// claimed) and wakes a thread if none is looking.
    pub(crate) fn push_job(&self, slot: u32) {
        let kind = self.mark_ready(slot);
        self.push_ready(slot, kind);
    }

    /// Marks a task ready; returns the kind of core its kernel needs.
    fn mark_ready(&self, slot: u32) -> CoreKind {
        let s = self.slab.get(slot);
        s.set_state(State::Ready);
        // SAFETY: the task is ready, not finished: its body stays until it finishes.
        unsafe { s.body() }
            .kernel
            .as_ref()
            .map_or(CoreKind::Aiv, |k| k.kind())
    }

    /// Queues a ready task on the orchestrating thread's own queue of its shape (on the shared
    /// one, waking a thread if none is looking, when that is full).
    ///
    /// The entry is staged: the core threads see it when the orchestrating thread publishes
    /// its queues ([`Engine::publish_orch`]: every few submits, and before it waits), or when
    /// one of them, about to park, publishes it itself. A thread already parked would not look,
    /// so with one parked the entry is published at once. See `docs/design/chip-scheduler.md`.
    pub(crate) fn push_from_orch(&self, slot: u32) {
        let q = queue_of(self.mark_ready(slot));
        if let Err(slot) = self.orch_queues[q].stage(slot) {
            self.queues[q].push(slot);
            self.sleep.notify();
            return;
        }
        if self.sleep.any_sleeper() {
            self.publish_orch();
        }
    }

    /// Makes the orchestrating thread's staged entries visible, and wakes a thread if none is
    /// looking. Only the orchestrating thread calls it.
    pub(crate) fn publish_orch(&self) {
        let mut any = false;
        for q in &self.orch_queues {
            any |= q.publish();
        }
        if any {
            self.sleep.notify();
        }
    }

    /// Claims the next block of a task this thread took from a queue (or is about to run as an
    /// immediate successor) on `core`; `None` when every block was taken already.
    fn claim_block(&self, slot: u32, core: CoreId) -> Option<Job> {
        let s = self.slab.get(slot);
        // SAFETY: a queued task is not finished: its body stays until it finishes.
        let n = unsafe { s.body() }.payload.block_num;
        if n == 1 {
            // A task of one block has one queue entry (or is held), ever: later blocks are
            // queued by the thread that runs the first, and a task of one block has none. The
            // thread that took the entry owns the block, and no one reads `blocks_next` of a
            // task of one block: nothing to count.
            return Some(Job {
                slot,
                block: 0,
                core,
            });
        }
        let b = s.blocks_next.fetch_add(1, Ordering::AcqRel);
        (b < n).then_some(Job {
            slot,
            block: b,
            core,
        })
    }

    /// The next block this thread may run: first from the queue of the core it still holds
    /// (keeping a core across tasks of one shape saves two atomic operations per task), else
    /// from the queue of a shape that has a free core. `held` is given back when its queue is
    /// empty.
    pub(crate) fn find_work(&self, rotate: &mut usize, held: &mut Option<CoreId>) -> Option<Job> {
        if let Some(core) = *held {
            if let Some(job) = self.take_from(queue_of(core.kind), core) {
                *held = None;
                return Some(job);
            }
            self.cores.release(core);
            *held = None;
        }
        // MIX first (it needs a whole cluster), then AIC and AIV in alternating order.
        *rotate = rotate.wrapping_add(1);
        let order = if rotate.is_multiple_of(2) {
            [0, 1, 2]
        } else {
            [0, 2, 1]
        };
        for q in order {
            if self.queues[q].is_empty() && self.orch_queues[q].is_empty() {
                continue;
            }
            let Some(core) = self.cores.claim(KINDS[q]) else {
                continue;
            };
            if let Some(job) = self.take_from(q, core) {
                return Some(job);
            }
            self.cores.release(core);
        }
        None
    }

    /// A block to run on `core` from ready queue `q`: the orchestrating thread's queue first
    /// (it holds the tasks submitted ready, in order), then the shared one.
    fn take_from(&self, q: usize, core: CoreId) -> Option<Job> {
        while let Some(slot) = self.orch_queues[q].pop() {
            if let Some(job) = self.claim_block(slot, core) {
                return Some(job);
            }
        }
        loop {
            match self.queues[q].steal() {
                crossbeam_deque::Steal::Success(slot) => {
                    if let Some(job) = self.claim_block(slot, core) {
                        return Some(job);
                    }
                }
                crossbeam_deque::Steal::Empty => return None,
                crossbeam_deque::Steal::Retry => {}
            }
        }
    }

    /// The task the orchestrating thread held back (see `Engine::held`), as a job on a core of
    /// its kind (`held` if it has that kind, else a free one); queued instead when no such core
    /// is free.
    pub(crate) fn take_held(&self, held: &mut Option<CoreId>) -> Option<Job> {
        let slot = self.held.take()?;
        // SAFETY: a held task is ready, not finished: its body stays until it finishes.
        let kind = unsafe { self.body_of(slot) }
            .kernel
            .as_ref()
            .map_or(CoreKind::Aiv, |k| k.kind());
        let core = match held.take() {
            Some(c) if c.kind == kind => Some(c),
            other => {
                if let Some(c) = other {
                    self.cores.release(c);
                }
                self.cores.claim(kind)
            }
        };
        let Some(core) = core else {
            self.push_job(slot);
            return None;
        };
        let job = self.claim_block(slot, core);
        if job.is_none() {
            self.cores.release(core);
        }
        job
    }

    /// Runs one block on thread `tid` and, when it was the task's last, finishes the task.
    /// Returns the block to run next without going through a queue: the next block of a
    /// consumer this completion made ready, on the same core, when it has the same shape.
    /// The thread keeps `job.core` either way (see [`Engine::find_work`]).
    pub(crate) fn run_block(&self, tid: usize, job: Job, streak: &mut u32) -> Option<Job> {
        let s = self.slab.get(job.slot);
        let id = s.id.load(Ordering::Acquire);
        // SAFETY: this thread holds an unfinished block of the task.
        let body = unsafe { s.body() };
        let n = body.payload.block_num;
        let ts = &self.threads[tid];
        // Announce the task before touching its memory: an untracked borrower scans these.
        ts.current
            .store(encode_current(job.slot, id), Ordering::SeqCst);
        ts.block.store(job.block, Ordering::Relaxed);
        ts.core.store(
            (queue_of(job.core.kind) as u32) << 16 | job.core.index,
            Ordering::Relaxed,
        );
        let mut conflict = self.check_untracked(body, tid);
        if job.block == 0 {
            s.set_state(State::Running);
            if conflict.is_none() && body.registered != 0 {
                conflict = self.register_borrows(job.slot, body);
            }
            if conflict.is_none() && body.payload.extras != 0 {
                for &(i, init) in &body.payload.inits {
                    if init == OutInit::Zeroed {
                        if let Some((t, _)) =
                            body.payload.tensors.get(i).and_then(TensorArg::existing)
                        {
                            crate::view::zero_fill(t);
                        }
                    }
                }
            }
        }
        if let (Some(message), 0) = (&conflict, job.block) {
            ts.current.store(0, Ordering::Release);
            // No other block of it runs: none was handed out (they are queued only below).
            s.blocks_next.store(n, Ordering::Release);
            let next = self.finish(
                Some(tid),
                job.slot,
                Finish::failed(job.block, Some(job.core), message.clone()),
            );
            return next.and_then(|c| self.take_immediate(c, job.core, streak));
        }
        if job.block + 1 < n {
            // More blocks: let other threads take them now.
            self.push_ready(job.slot, job.core.kind);
        }
        if n == 1 {
            // This thread will count this task off each consumer's fan-in when it finishes:
            // ask for those nodes now (the orchestrating thread wrote them last), so that
            // their lines arrive while the kernel runs.
            s.succ
                .peek_each(|c| self.slab.get(c).prefetch_lines(CONSUMER_LINES));
        }
        let (result, times, regs) = match conflict {
            // A later block collided: it fails without running; the others finish normally.
            Some(m) => (Err(m), None, Registrations::default()),
            None => self.execute(job, id, body),
        };
        ts.current.store(0, Ordering::Release);
        // This thread is the slot's only writer during a run: no locked instruction (it would
        // wait for this block's pending stores).
        ts.blocks
            .store(ts.blocks.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        if let Some((start, end, marks)) = times {
            self.trace_block(job, id, body, (start, end), marks);
        }
        let has_regs = !regs.conds.is_empty() || regs.tokens > 0;
        if result.is_err() || has_regs {
            let mut e = s.error.lock();
            if let Err(m) = result {
                e.get_or_insert((job.block, Some(job.core), m));
            }
            drop(e);
            if has_regs {
                s.regs.lock().merge(regs);
            }
            s.extra.store(true, Ordering::Release);
        }
        // A task of one block needs no count: its block is the last.
        if n > 1 && s.blocks_done.fetch_add(1, Ordering::AcqRel) + 1 < n {
            return None;
        }
        // The last block: finish the task (or let it wait for its conditions).
        let how = if s.extra.load(Ordering::Acquire) {
            let error = s.error.lock().take();
            let regs = std::mem::take(&mut *s.regs.lock());
            match error {
                Some((block, core, message)) => Some(Finish::failed(block, core, message)),
                None if !regs.conds.is_empty() || regs.tokens > 0 => {
                    return self
                        .defer(Some(tid), job.slot, id, regs)
                        .and_then(|f| self.finish(Some(tid), job.slot, f))
                        .and_then(|c| self.take_immediate(c, job.core, streak));
                }
                None => Some(Finish::Done),
            }
        } else {
            Some(Finish::Done)
        };
        let next = how.and_then(|f| self.finish(Some(tid), job.slot, f));
        match next {
            Some(c) => self.take_immediate(c, job.core, streak),
            None => {
                *streak = 0;
                None
            }
        }
    }

    /// A consumer this thread made ready: run it here when it has the shape of `core` (which
    /// this thread still holds) and the streak allows, else queue it.
    fn take_immediate(&self, c: u32, core: CoreId, streak: &mut u32) -> Option<Job> {
        // SAFETY: `c` is ready, not finished.
        let kind = unsafe { self.body_of(c) }
            .kernel
            .as_ref()
            .map_or(CoreKind::Aiv, |k| k.kind());
        if core.kind == kind && *streak < IMMEDIATE_LIMIT {
            *streak += 1;
            let cs = self.slab.get(c);
            cs.set_state(State::Ready);
            // This thread made `c` ready (its fan-in reached zero here) and queued it nowhere:
            // no other thread can claim a block of it until `run_block` queues its later
            // blocks (a release). Its first block is taken with a plain store, not the
            // `fetch_add` of a queued task's claim.
            cs.blocks_next.store(1, Ordering::Relaxed);
            return Some(Job {
                slot: c,
                block: 0,
                core,
            });
        }
        *streak = 0;
        self.push_job(c);
        None
    }

    fn execute(
        &self,
        job: Job,
        id: u64,
        body: &Body,
    ) -> (Result<(), String>, Option<Traced>, Registrations) {
        let Some(kernel) = body.kernel.as_deref() else {
            return (Ok(()), None, Registrations::default());
        };
        let trace = self.tracing.load(Ordering::Relaxed);
        let start = trace.then(now_us);
        if trace {
            crate::trace::begin_marks();
        }
        let ctx = KernelCtx {
            task: TaskId(id),
            kernel,
            core: job.core,
            block_idx: job.block,
            payload: &body.payload,
            token: body.token,
            flags: (0..body.payload.tensors.len())
                .map(|_| Cell::new(0))
                .collect(),
            ext: self.ext.as_deref(),
            deferred: body.payload.deferred,
            regs: RefCell::default(),
            sender: &self.sender,
            wait: self.wait,
        };
        let observer = crate::observe::observer();
        if let Some(o) = &observer {
            o.kernel_start(&ctx);
        }
        let result = match catch_unwind(AssertUnwindSafe(|| kernel.call(&ctx))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(p) => Err(format!("panicked: {}", panic_message(&*p))),
        };
        if let Some(o) = &observer {
            o.kernel_end(&ctx, result.is_ok());
        }
        let times = start.map(|s| (s, now_us(), crate::trace::end_marks()));
        (result, times, ctx.regs.into_inner())
    }

    fn trace_block(
        &self,
        job: Job,
        id: u64,
        body: &Body,
        (start, end): (f64, f64),
        marks: Vec<crate::trace::Mark>,
    ) {
        let s = self.slab.get(job.slot);
        let first = s.first_start.load(Ordering::Relaxed);
        if first == 0 || start < f64::from_bits(first) {
            s.first_start.store(start.to_bits(), Ordering::Relaxed);
            s.first_core.store(
                (queue_of(job.core.kind) as u32) << 16 | job.core.index,
                Ordering::Relaxed,
            );
        }
        let Some(k) = &body.kernel else { return };
        if let Some(t) = self.trace.lock().as_mut() {
            t.events.push(TraceEvent {
                task: TaskId(id),
                kernel: Arc::from(k.name()),
                core: job.core,
                block: job.block,
                start_us: start,
                end_us: end,
                deps: self.producer_ids(body),
                deferred: false,
                marks,
            });
        }
    }

    /// The ids of a task's producers (for traces): those it retains, read from their nodes
    /// (which it keeps), and those that had failed and retired before it was submitted.
    /// Valid until the task finishes.
    pub(crate) fn producer_ids(&self, body: &Body) -> Vec<TaskId> {
        let mut v: Vec<TaskId> = body
            .retains
            .iter()
            .map(|&p| TaskId(self.slab.get(p).id.load(Ordering::Acquire)))
            .chain(body.deps.iter().map(|&d| TaskId(d)))
            .collect();
        v.sort_unstable();
        v
    }

    /// Finishes a task and propagates: consumers' fan-in, poison, retained producers. Returns
    /// the first consumer it made ready that has a kernel to run (the caller runs or queues
    /// it); the others are queued here. Iterative, so long chains of dummy or poisoned tasks
    /// use no stack.
    pub(crate) fn finish(&self, tid: Option<usize>, slot: u32, how: Finish) -> Option<u32> {
        let mut work: SmallVec<[(u32, Finish); 8]> = SmallVec::new();
        work.push((slot, how));
        let mut next = None;
        while let Some((slot, how)) = work.pop() {
            let s = self.slab.get(slot);
            let id = s.id.load(Ordering::Acquire);
            let (state, root) = match how {
                Finish::Done => (State::Done, 0),
                Finish::Failed {
                    block,
                    core,
                    message,
                } => {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    // SAFETY: the task is not finished yet.
                    let kernel = unsafe { s.body() }
                        .kernel
                        .as_ref()
                        .map_or_else(|| "<dummy>".into(), |k| k.name().to_string());
                    self.run.lock().failures.push(TaskFailure {
                        task: TaskId(id),
                        kernel,
                        core,
                        block,
                        message,
                    });
                    (State::Failed, id + 1)
                }
                Finish::Poisoned => {
                    self.poisoned.fetch_add(1, Ordering::Relaxed);
                    (State::Poisoned, s.root.load(Ordering::Acquire))
                }
            };
            if state == State::Failed {
                s.root.store(root, Ordering::Release);
            }
            s.set_state(state);
            s.succ.finish_each(|c| {
                let cs = self.slab.get(c);
                if root != 0 {
                    let _ = cs
                        .root
                        .compare_exchange(0, root, Ordering::AcqRel, Ordering::Acquire);
                }
                if cs.fanin.fetch_sub(1, Ordering::AcqRel) == 1 {
                    // SAFETY: `c` just became ready; it is not finished.
                    let dummy = unsafe { cs.body() }.kernel.is_none();
                    if cs.root.load(Ordering::Acquire) != 0 {
                        work.push((c, Finish::Poisoned));
                    } else if dummy {
                        work.push((c, Finish::Done));
                    } else if next.is_none() {
                        next = Some(c);
                    } else {
                        self.push_job(c);
                    }
                }
            });
            if s.extra.load(Ordering::Acquire) {
                // Registered borrows end with the task.
                s.borrows.lock().take();
            }
            // SAFETY: the task holds its own reference until the decrement below.
            for &p in &unsafe { s.body() }.retains {
                self.slab.get(p).refs.fetch_sub(1, Ordering::AcqRel);
            }
            // Close the body to the borrow scan; with no reader in it, take the lines the
            // orchestrating thread will write next (see `Slot::take_lines`). Not on the
            // orchestrating thread (a dummy or poisoned task): its lines are there already.
            // Nor when this thread has its next task in hand (a consumer this completion made
            // ready): it is then the busy side, as on a chain whose ring is full, and the two
            // locked instructions and the stores would slow it to spare the orchestrating
            // thread stalls that do not set the pace (chain 0.895 without them, ABBA; a fan,
            // where the orchestrating thread sets the pace, 1.044).
            if tid.is_some() && next.is_none() {
                let alone = s.readers.close();
                if alone {
                    // SAFETY: this thread finishes the task and still holds its reference,
                    // and no reader holds the body.
                    unsafe { s.take_lines() };
                }
                s.readers.reopen(alone);
            }
            // The body may be reclaimed from here on: nothing below reads it.
            s.refs.fetch_sub(1, Ordering::AcqRel);
            self.count_finished(tid, id);
        }
        next
    }

    /// Fast-path arguments (ordered by the engine, not registered) of the task announced on
    /// thread `tid`: if an untracked borrow holds overlapping bytes of one, the message of the
    /// conflict.
    fn check_untracked(&self, body: &Body, tid: usize) -> Option<String> {
        let _ = tid;
        for (i, t, mode) in body.payload.args() {
            if i < 64 && body.registered & (1 << i) != 0 {
                continue;
            }
            let write = mode.writable() && mode != ArgMode::NoDep;
            if let Err(c) = t.buffer().check_untracked(body.token, t.region(), write) {
                return Some(self.conflict_message(i, t.buffer().id(), c.other));
            }
        }
        None
    }

    /// Registers a borrow of every argument marked in `registered` (untracked ones, or buffers
    /// another run uses), held until the task finishes.
    fn register_borrows(&self, slot: u32, body: &Body) -> Option<String> {
        let mut set = BorrowSet::with_token(body.token);
        for (i, t, mode) in body.payload.args() {
            if i < 64 && body.registered & (1 << i) == 0 {
                continue;
            }
            let write = mode.writable() && mode != ArgMode::NoDep;
            if let Err(c) = set.add(t.buffer(), t.region(), write) {
                return Some(self.conflict_message(i, t.buffer().id(), c.other));
            }
        }
        let s = self.slab.get(slot);
        *s.borrows.lock() = Some(set);
        s.extra.store(true, Ordering::Release);
        None
    }

    fn conflict_message(&self, i: usize, buf: u64, other: u64) -> String {
        let who = if other >> TOKEN_TASK_BITS == self.nonce.load(Ordering::Relaxed) {
            format!("task #{}", other & TOKEN_TASK_MASK)
        } else {
            "code outside this run (host code or another chip)".to_string()
        };
        format!("tensor argument {i} (buffer {buf}) overlaps memory in use by {who}: a data race the dependency engine was told not to order (NO_DEP or a manual scope)")
    }
}

impl crate::buffer::RunningTasks for Engine {
    fn collides(
        &self,
        buffer: u64,
        region: &crate::geometry::Region,
        write: bool,
        token: u64,
    ) -> Option<u64> {
        let nonce = self.nonce.load(Ordering::Acquire);
        for ts in self.threads.iter() {
            loop {
                let cur = ts.current.load(Ordering::SeqCst);
                let Some((slot, idlow)) = super::decode_current(cur) else {
                    break;
                };
                let s = self.slab.get(slot);
                // Pin the node (a reference keeps its body) while reading the arguments.
                let mut r = s.refs.load(Ordering::Acquire);
                while r != 0 {
                    match s.refs.compare_exchange_weak(
                        r,
                        r + 1,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => break,
                        Err(x) => r = x,
                    }
                }
                if r == 0 {
                    break;
                }
                let want = nonce << TOKEN_TASK_BITS | idlow;
                let mut hit = None;
                // A task whose finishing thread closed its body holds no bytes any more.
                if s.id.load(Ordering::Acquire) & TOKEN_TASK_MASK == idlow && s.readers.pin() {
                    // SAFETY: the reference taken above keeps the body until the decrement.
                    let body = unsafe { s.body() };
                    if body.token == want && body.token != token {
                        for (i, t, mode) in body.payload.args() {
                            if i < 64 && body.registered & (1 << i) != 0 {
                                continue;
                            }
                            if t.buffer().id() == buffer
                                && (write || mode.writable())
                                && crate::tensor::intersects(region, t.region())
                            {
                                hit = Some(body.token);
                                break;
                            }
                        }
                    }
                    s.readers.unpin();
                }
                s.refs.fetch_sub(1, Ordering::AcqRel);
                // A collision counts only if the task still runs: then both held the bytes at
                // once. If the thread moved on, look at what it runs now.
                if ts.current.load(Ordering::SeqCst) == cur {
                    if hit.is_some() {
                        return hit;
                    }
                    break;
                }
            }
        }
        None
    }
}

impl Engine {
    /// The kernel name of the task in `slot`, read under a counted reference (for reports).
    pub(crate) fn kernel_name(&self, slot: u32) -> Option<String> {
        let s = self.slab.get(slot);
        let mut r = s.refs.load(Ordering::Acquire);
        loop {
            if r == 0 {
                return None;
            }
            match s
                .refs
                .compare_exchange_weak(r, r + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(x) => r = x,
            }
        }
        // A task whose finishing thread closed its body is no longer running: no name.
        let name = s.readers.pin().then(|| {
            // SAFETY: the reference taken above keeps the body until the decrement, and the
            // pin keeps the finishing thread out of it.
            let name = unsafe { s.body() }
                .kernel
                .as_ref()
                .map(|k| k.name().to_string());
            s.readers.unpin();
            name
        });
        s.refs.fetch_sub(1, Ordering::AcqRel);
        name.flatten()
    }
}
