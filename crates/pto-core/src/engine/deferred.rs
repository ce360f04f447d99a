//! Deferred completion: tasks whose kernels returned but whose conditions (signals, tokens) do
//! not all hold yet, and the completion queue's token posts. One idle thread at a time polls
//! them (`try_lock`); none of it is on the path of ordinary tasks. See
//! `docs/design/deferred-completion.md`.

use std::collections::VecDeque;
use std::time::Instant;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::execute::Finish;
use super::{Engine, TOKEN_TASK_BITS, TOKEN_TASK_MASK};
use crate::deferred::Poll;
use crate::kernel::{Registrations, MAX_CONDITIONS};
use crate::trace::TraceEvent;
use pto_shm::ring::Completion;

/// A deferred task whose kernel returned.
pub(crate) struct Waiting {
    pub(crate) slot: u32,
    pub(crate) id: u64,
    pub(crate) conds: crate::kernel::Conds,
    pub(crate) tokens_expected: u32,
    pub(crate) token_deadline: Option<Instant>,
}

impl Waiting {
    /// The queue and position of a task that waits for one ordered condition and no token
    /// (a chip task's answer): such tasks wait in their queue's [`Ordered`] line.
    fn ordered(&self) -> Option<(usize, u64)> {
        match self.conds.as_slice() {
            [(c, _)] if self.tokens_expected == 0 => c.order(),
            _ => None,
        }
    }
}

/// The tasks waiting for the conditions of one queue ([`Condition::order`]), by position: a
/// pass polls the first until one is pending, and looks behind it only when a deadline may
/// have passed there (or a token was posted), so its cost does not grow with the line.
#[derive(Default)]
struct Ordered {
    line: VecDeque<(u64, Waiting)>,
    /// No deadline in the line is earlier (it may be earlier than every one: it is lowered on
    /// push and recomputed only by a look behind the first).
    earliest: Option<Instant>,
}

impl Ordered {
    fn push(&mut self, at: u64, w: Waiting) {
        let deadline = w.conds[0].1;
        self.earliest = Some(self.earliest.map_or(deadline, |e| e.min(deadline)));
        // Tasks defer in about their order (each on the thread that posted it): search from
        // the back.
        let i = self
            .line
            .iter()
            .rposition(|(a, _)| *a <= at)
            .map_or(0, |i| i + 1);
        self.line.insert(i, (at, w));
    }
}

/// The deferred tasks of a run and the token posts seen.
#[derive(Default)]
pub(crate) struct DeferredState {
    /// Waiting tasks, but those in [`DeferredState::ordered`].
    pub(crate) waiting: Vec<Waiting>,
    /// Tasks that wait for one ordered condition, by queue (an emptied queue is kept for its
    /// next task while there are at most [`KEPT_QUEUES`]).
    ordered: FxHashMap<usize, Ordered>,
    /// How many tasks wait in [`DeferredState::ordered`].
    ordered_waiting: usize,
    /// Token posts per task id (kept when they come before the task registered, or existed):
    /// posts, and the first error status.
    pub(crate) tokens: FxHashMap<u64, (u32, Option<u64>)>,
    /// Tasks submitted as deferred, by id: their slot (to tell a late post from an early one).
    pub(crate) tasks: FxHashMap<u64, u32>,
    /// Completions that named no task of this run, or a task already complete.
    pub(crate) stray: Vec<String>,
}

impl DeferredState {
    /// Every waiting task (for stall reports).
    pub(crate) fn all_waiting(&self) -> impl Iterator<Item = &Waiting> {
        self.waiting.iter().chain(
            self.ordered
                .values()
                .flat_map(|o| o.line.iter().map(|(_, w)| w)),
        )
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.ordered_waiting == 0
    }

    /// Empties it for a new run, keeping the collections' memory.
    pub(crate) fn reset(&mut self) {
        self.waiting.clear();
        self.ordered.clear();
        self.ordered_waiting = 0;
        self.tokens.clear();
        self.tasks.clear();
        self.stray.clear();
    }
}

impl std::fmt::Debug for DeferredState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeferredState({} waiting)", self.all_waiting().count())
    }
}

/// What a pass polls besides the queues' first tasks and the completion queue: everything, or
/// (right after a task deferred) that task and the few oldest.
#[derive(Clone, Copy)]
struct Only {
    id: u64,
    queue: Option<usize>,
}

/// What one poll pass looks at: see [`Only`]; the time it compares deadlines with; whether the
/// run traces.
#[derive(Clone, Copy)]
struct Pass {
    only: Option<Only>,
    now: Instant,
    tracing: bool,
}

/// Emptied queues of ordered conditions are kept (for their next task, without an allocation)
/// while there are at most this many queues.
const KEPT_QUEUES: usize = 64;

/// Tasks a pass settles: slot, id, and the failure if any.
type Settled = SmallVec<[(u32, u64, Option<String>); 4]>;

/// How many of the oldest waiting tasks a task that defers polls besides its own conditions:
/// the oldest are the likeliest to have completed, and polling them keeps completions flowing
/// while every thread is busy running tasks (nobody searches, so nobody is the poller), at a
/// bounded cost per deferred task.
const OLDEST_POLLED: usize = 4;

impl Engine {
    /// A deferred task's last block returned with `regs`: it waits for them (or finishes now if
    /// they already hold, or fails if there are too many).
    pub(crate) fn defer(
        &self,
        tid: Option<usize>,
        slot: u32,
        id: u64,
        regs: Registrations,
    ) -> Option<Finish> {
        if regs.conds.len() + regs.tokens as usize > MAX_CONDITIONS {
            return Some(Finish::failed(
                0,
                None,
                format!("registered more than {MAX_CONDITIONS} completion conditions"),
            ));
        }
        self.deferred_count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.slab.get(slot).set_state(super::slab::State::Deferred);
        let w = Waiting {
            slot,
            id,
            conds: regs.conds,
            tokens_expected: regs.tokens,
            token_deadline: regs.token_deadline,
        };
        let ordered = w.ordered();
        let mut d = self.deferred.lock();
        match ordered {
            Some((q, at)) => {
                d.ordered.entry(q).or_default().push(at, w);
                d.ordered_waiting += 1;
            }
            None => d.waiting.push(w),
        }
        self.has_waiting
            .store(true, std::sync::atomic::Ordering::Release);
        // The conditions may hold already: poll this task's (the others are the poller's; a
        // poll of every waiting task here would cost O(waiting) per deferred task), under the
        // lock already held (one acquisition of a line every host thread takes, not two).
        self.poll_locked(
            d,
            tid,
            Some(Only {
                id,
                queue: ordered.map(|o| o.0),
            }),
        );
        None
    }

    fn absorb(&self, d: &mut DeferredState, c: Completion) {
        self.completions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (nonce, id) = (c.token >> TOKEN_TASK_BITS, c.token & TOKEN_TASK_MASK);
        let err = (c.status != 0).then_some(c.status);
        if nonce != self.nonce.load(std::sync::atomic::Ordering::Relaxed) {
            d.stray
                .push(format!("token {:#x} names no task of this run", c.token));
            return;
        }
        let submitted = self.submitted.load(std::sync::atomic::Ordering::Acquire);
        let finished = d.tasks.get(&id).is_some_and(|&slot| {
            let s = self.slab.get(slot);
            s.id.load(std::sync::atomic::Ordering::Acquire) != id || s.state().finished()
        });
        if finished || (id < submitted && !d.tasks.contains_key(&id)) {
            d.stray.push(format!(
                "token {:#x} posted for task #{id}, which had already completed",
                c.token
            ));
            return;
        }
        // For a task not submitted yet, or not yet waiting: kept until it registers.
        let e = d.tokens.entry(id).or_insert((0, None));
        e.0 += 1;
        e.1 = e.1.or(err);
    }

    /// Drains the completion queue and polls every waiting task; finishes (or fails) those
    /// whose conditions are settled. One thread at a time; returns true when anything happened.
    pub(crate) fn poll_async(&self, tid: Option<usize>) -> bool {
        self.poll_deferred(tid, None)
    }

    /// [`Engine::poll_async`]; when `only` is given, polling only that task's conditions and
    /// those of the [`OLDEST_POLLED`] oldest waiting tasks (and queues).
    fn poll_deferred(&self, tid: Option<usize>, only: Option<Only>) -> bool {
        let Some(d) = self.deferred.try_lock() else {
            return false;
        };
        self.poll_locked(d, tid, only)
    }

    /// [`Engine::poll_deferred`] with the lock taken (and released before the settled tasks
    /// finish).
    fn poll_locked(
        &self,
        mut d: parking_lot::MutexGuard<'_, DeferredState>,
        tid: Option<usize>,
        only: Option<Only>,
    ) -> bool {
        let mut progress = false;
        while let Some(c) = self.sender.host.queue().pop() {
            self.absorb(&mut d, c);
            progress = true;
        }
        let now = Instant::now();
        let mut settled: Settled = SmallVec::new();
        let tracing = self.tracing.load(std::sync::atomic::Ordering::Relaxed);
        let mut held: Vec<(u64, crate::trace::Mark)> = Vec::new();
        let tokens = std::mem::take(&mut d.tokens);
        let mut index = 0usize;
        // The earliest pending position of each ordered queue seen in this pass.
        let mut pending: SmallVec<[(usize, u64); 8]> = SmallVec::new();
        d.waiting.retain_mut(|w| {
            index += 1;
            if only.is_some_and(|o| o.id != w.id) && index > OLDEST_POLLED {
                return true;
            }
            let (seen, token_error) = if tokens.is_empty() {
                (0, None)
            } else {
                tokens.get(&w.id).copied().unwrap_or((0, None))
            };
            if let Some(st) = token_error {
                settled.push((
                    w.slot,
                    w.id,
                    Some(format!("its completion was posted with status {st}")),
                ));
                return false;
            }
            let mut failed = None;
            let id = w.id;
            w.conds.retain(|(c, deadline)| {
                if failed.is_some() {
                    return true;
                }
                let order = c.order();
                if let Some((q, at)) = order {
                    // An earlier condition of its queue is pending: so is this one (polled
                    // anyway at its deadline, to fail it with its own poll's answer).
                    if now < *deadline && pending.iter().any(|&(pq, pa)| pq == q && pa < at) {
                        return true;
                    }
                }
                match c.poll() {
                    Poll::Ready => {
                        if let (true, Some(key)) = (tracing, c.trace_key()) {
                            held.push((
                                id,
                                crate::trace::Mark {
                                    ts_us: crate::trace::now_us(),
                                    name: "wait",
                                    key,
                                },
                            ));
                        }
                        false
                    }
                    Poll::Pending if now >= *deadline => {
                        failed = Some(format!(
                            "condition {} did not hold before its deadline",
                            c.describe()
                        ));
                        true
                    }
                    Poll::Pending => {
                        if let Some((q, at)) = order {
                            match pending.iter_mut().find(|p| p.0 == q) {
                                Some(p) => p.1 = p.1.min(at),
                                None => pending.push((q, at)),
                            }
                        }
                        true
                    }
                    Poll::Failed(m) => {
                        failed = Some(format!("condition {} failed: {m}", c.describe()));
                        true
                    }
                }
            });
            if failed.is_some() {
                settled.push((w.slot, w.id, failed));
                return false;
            }
            if w.conds.is_empty() && seen >= w.tokens_expected {
                settled.push((w.slot, w.id, None));
                return false;
            }
            if seen < w.tokens_expected && w.token_deadline.is_some_and(|dl| now >= dl) {
                settled.push((
                    w.slot,
                    w.id,
                    Some(format!(
                        "completion token {:#x} was posted {seen} of {} times before its deadline",
                        self.nonce.load(std::sync::atomic::Ordering::Relaxed) << TOKEN_TASK_BITS
                            | w.id,
                        w.tokens_expected
                    )),
                ));
                return false;
            }
            true
        });
        let pass = Pass { only, now, tracing };
        poll_ordered(&mut d, pass, &tokens, &mut settled, &mut held);
        d.tokens = tokens;
        for (_, id, _) in &settled {
            d.tokens.remove(id);
        }
        if d.is_empty() {
            self.has_waiting
                .store(false, std::sync::atomic::Ordering::Release);
        }
        drop(d);
        progress |= !settled.is_empty();
        for (slot, id, failure) in settled {
            if self.tracing.load(std::sync::atomic::Ordering::Relaxed) {
                let marks = held
                    .iter()
                    .filter(|(t, _)| *t == id)
                    .map(|(_, m)| m.clone())
                    .collect();
                self.trace_deferred(slot, id, marks);
            }
            let f = match failure {
                None => Finish::Done,
                Some(m) => Finish::failed(0, None, m),
            };
            if let Some(next) = self.finish(tid, slot, f) {
                // No core runs here: hand the consumer to the queues.
                self.push_job(next);
            }
        }
        progress
    }

    fn trace_deferred(&self, slot: u32, id: u64, marks: Vec<crate::trace::Mark>) {
        let s = self.slab.get(slot);
        let start = f64::from_bits(s.first_start.load(std::sync::atomic::Ordering::Relaxed));
        // SAFETY: the task is deferred (not finished): it cannot be reclaimed yet.
        #[allow(unsafe_code)]
        let body = unsafe { s.body() };
        let (Some(k), true) = (&body.kernel, start > 0.0) else {
            return;
        };
        let core = crate::kernel::CoreId {
            kind: k.kind(),
            index: 0,
        };
        if let Some(t) = self.trace.lock().as_mut() {
            t.events.push(TraceEvent {
                task: crate::args::TaskId(id),
                kernel: std::sync::Arc::from(k.name()),
                core,
                block: 0,
                start_us: start,
                end_us: crate::trace::now_us(),
                deps: self.producer_ids(body),
                deferred: true,
                marks,
            });
        }
    }
}

/// The queues' part of a pass: settles each queue's first tasks while their conditions
/// hold (or failed, or passed their deadline), and looks behind a pending one only when a
/// deadline there may have passed or a token was posted.
fn poll_ordered(
    d: &mut DeferredState,
    Pass { only, now, tracing }: Pass,
    tokens: &FxHashMap<u64, (u32, Option<u64>)>,
    settled: &mut Settled,
    held: &mut Vec<(u64, crate::trace::Mark)>,
) {
    // A task's answer, or `None` while it waits: a posted error status, its condition's
    // poll, its deadline.
    let mut answer = |w: &Waiting, first: bool| -> Option<Option<String>> {
        if let Some(st) = tokens.get(&w.id).and_then(|t| t.1) {
            return Some(Some(format!("its completion was posted with status {st}")));
        }
        let (c, deadline) = &w.conds[0];
        if !first && now < *deadline {
            return None;
        }
        match c.poll() {
            Poll::Ready => {
                if let (true, Some(key)) = (tracing, c.trace_key()) {
                    held.push((
                        w.id,
                        crate::trace::Mark {
                            ts_us: crate::trace::now_us(),
                            name: "wait",
                            key,
                        },
                    ));
                }
                Some(None)
            }
            Poll::Pending if now >= *deadline => Some(Some(format!(
                "condition {} did not hold before its deadline",
                c.describe()
            ))),
            Poll::Pending => None,
            Poll::Failed(m) => Some(Some(format!("condition {} failed: {m}", c.describe()))),
        }
    };
    let mut emptied: SmallVec<[usize; 4]> = SmallVec::new();
    let mut others = 0usize;
    let before = settled.len();
    for (&q, o) in d.ordered.iter_mut() {
        if o.line.is_empty() {
            emptied.push(q);
            continue;
        }
        if let Some(only) = only {
            if only.queue != Some(q) {
                if others >= OLDEST_POLLED {
                    continue;
                }
                others += 1;
            }
        }
        while let Some((_, w)) = o.line.front() {
            let Some(failure) = answer(w, true) else {
                break;
            };
            settled.push((w.slot, w.id, failure));
            o.line.pop_front();
        }
        if !tokens.is_empty() || o.earliest.is_some_and(|e| now >= e) {
            let mut earliest: Option<Instant> = None;
            o.line.retain(|(_, w)| match answer(w, false) {
                Some(failure) => {
                    settled.push((w.slot, w.id, failure));
                    false
                }
                None => {
                    let dl = w.conds[0].1;
                    earliest = Some(earliest.map_or(dl, |e| e.min(dl)));
                    true
                }
            });
            o.earliest = earliest;
        }
        if o.line.is_empty() {
            emptied.push(q);
        }
    }
    d.ordered_waiting -= settled.len() - before;
    if d.ordered.len() > KEPT_QUEUES {
        for q in emptied {
            d.ordered.remove(&q);
        }
    }
}
