//! Deferred completion: tasks that finish after their kernel returns.
//!
//! A task submitted with [`crate::TaskArgs::deferred`] may, from its kernel, register
//! *conditions* ([`crate::KernelCtx::defer`]) and *completion tokens*
//! ([`crate::KernelCtx::defer_token`]). The kernel returns at once and its core is free; the
//! scheduler keeps the task on an async wait list, polls its conditions between dispatches
//! (never on a core), drains the chip's completion queue, and completes the task, releasing
//! its consumers, when every condition holds and every expected token was posted. A condition
//! that does not hold before its deadline fails the task, naming the condition, and poisons its
//! consumers. See `docs/design/deferred-completion.md`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pto_shm::ring::{Completion, CompletionQueue, HeapQueue, QueueFull};

/// What polling a condition found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Poll {
    /// The condition holds.
    Ready,
    /// Not yet.
    Pending,
    /// It never will: the task fails with this message.
    Failed(String),
}

/// Something a deferred task waits for. Polling must be cheap and must not block: the
/// scheduler calls it between dispatches while holding the chip's lock.
pub trait Condition: Send + Sync + 'static {
    /// Checks the condition.
    fn poll(&self) -> Poll;
    /// Names the condition in errors ("signal at offset 64 of rank 1 >= 3").
    fn describe(&self) -> String;
    /// What a trace joins it to when it holds: the key of the signal whose notify released it
    /// (see [`crate::trace::mark`]); `None` (the default) draws no arrow.
    fn trace_key(&self) -> Option<String> {
        None
    }
    /// Where it stands among conditions that hold in order: `(queue, position)`, where
    /// `queue` identifies the queue (an address, say) and a condition holds only after every
    /// one of its queue with a smaller position held (the answers of one peer, taken in the
    /// order they were asked). While one of a queue is pending, a poll pass skips the later
    /// ones of that queue, so a pass costs one poll per queue rather than one per waiting task
    /// (tasks waiting for one such condition each wait in their queue's line, which a pass
    /// does not walk past its first pending task). `None` (the default): polled on every pass.
    fn order(&self) -> Option<(usize, u64)> {
        None
    }
}

impl fmt::Debug for dyn Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Condition({})", self.describe())
    }
}

/// A condition from a closure and a description.
pub struct FnCondition<F> {
    f: F,
    what: String,
}

impl<F: Fn() -> Poll + Send + Sync + 'static> FnCondition<F> {
    /// Wraps `f`, described as `what`.
    pub fn new(what: &str, f: F) -> FnCondition<F> {
        FnCondition {
            f,
            what: what.to_string(),
        }
    }
}

impl<F> fmt::Debug for FnCondition<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FnCondition({})", self.what)
    }
}

impl<F: Fn() -> Poll + Send + Sync + 'static> Condition for FnCondition<F> {
    fn poll(&self) -> Poll {
        (self.f)()
    }
    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// A shared in-process counter that tasks can wait on ([`Counter::at_least`]).
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// A counter at 0.
    pub fn new() -> Counter {
        Counter::default()
    }
    /// Adds `v` (release).
    pub fn add(&self, v: u64) {
        self.0.fetch_add(v, Ordering::Release);
    }
    /// The value (acquire).
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
    /// A condition that holds once the counter is at least `v`.
    pub fn at_least(&self, v: u64) -> impl Condition {
        let c = self.0.clone();
        FnCondition::new(&format!("counter >= {v}"), move || {
            if c.load(Ordering::Acquire) >= v {
                Poll::Ready
            } else {
                Poll::Pending
            }
        })
    }
}

/// Identifies a deferred task to whoever posts its completion: the run's nonce in the high
/// bits and the task id in the low 40.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompletionToken(pub u64);

impl fmt::Display for CompletionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Where a completion queue lives (the heap, or a shared-memory segment mapped by several
/// processes).
pub trait QueueHost: Send + Sync + 'static {
    /// The queue.
    fn queue(&self) -> &CompletionQueue;
}

impl QueueHost for HeapQueue {
    fn queue(&self) -> &CompletionQueue {
        HeapQueue::queue(self)
    }
}

/// Posts completions to a chip's completion queue; cheap to clone and to send to other threads.
#[derive(Clone)]
pub struct CompletionSender {
    pub(crate) host: Arc<dyn QueueHost>,
}

impl fmt::Debug for CompletionSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CompletionSender({} entries)",
            self.host.queue().capacity()
        )
    }
}

impl CompletionSender {
    /// A sender over a queue host.
    pub fn new(host: Arc<dyn QueueHost>) -> CompletionSender {
        CompletionSender { host }
    }

    /// Posts one successful completion of `token`.
    ///
    /// # Errors
    ///
    /// [`QueueFull`] when the queue has no free entry (retry later).
    pub fn post(&self, token: CompletionToken) -> Result<(), QueueFull> {
        self.host.queue().post(Completion {
            token: token.0,
            status: 0,
        })
    }

    /// Posts a failed completion: the task fails with `status` in its message.
    ///
    /// # Errors
    ///
    /// [`QueueFull`].
    pub fn post_error(&self, token: CompletionToken, status: u64) -> Result<(), QueueFull> {
        self.host.queue().post(Completion {
            token: token.0,
            status: status.max(1),
        })
    }
}
