//! Signals: a `u32` in a window that peers notify (add or store, with release semantics) and
//! its owner waits on, tests, or hands to a chip as a deferred-completion condition. See
//! `docs/design/comm-windows.md`.

use std::time::Instant;

use crate::backend::wait_err;
use crate::error::CommError;
use crate::window::Window;
use crate::world::Awaiting;

/// How a notify changes a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Adds the value.
    Add,
    /// Stores the value.
    Set,
}

impl Window {
    /// A signal's name for reports: `` `flag[4]` of window W >= v ``.
    pub(crate) fn signal_name(&self, offset: usize, value: u32) -> String {
        match self
            .buffers()
            .iter()
            .find(|b| offset >= b.offset && offset < b.offset + b.bytes)
        {
            Some(b) => format!(
                "signal `{}[{}]` of window {} >= {value}",
                b.name,
                offset - b.offset,
                self.name()
            ),
            None => format!(
                "signal at offset {offset} of window {} >= {value}",
                self.name()
            ),
        }
    }

    /// Notifies the signal (a `u32`) at `(rank, offset)`: adds or stores `value`, with release
    /// semantics (everything this rank wrote before is visible to a waiter that sees it), and
    /// wakes the target if it is parked.
    ///
    /// # One-sided
    ///
    /// Only the caller takes part.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 4-aligned.
    pub fn notify(
        &self,
        rank: usize,
        offset: usize,
        value: u32,
        op: SignalOp,
    ) -> Result<(), CommError> {
        self.check_atomic("signal notify", rank, offset, 4)?;
        self.note(rank, offset, 4, crate::check::AccessKind::Atomic, "notify");
        self.released(rank, offset);
        pto_core::trace::mark("notify", || {
            let comm = &self.inner.comm;
            let t = comm.world_rank_of(rank).unwrap_or(rank);
            format!("{} {t} {offset}", self.name())
        });
        self.inner
            .io
            .notify(rank, offset, value, op == SignalOp::Add)
    }

    /// Waits until this rank's signal at `offset` reaches `value` (`>=`, compared as the signed
    /// difference so that epoch counters may wrap), with the default deadline. Returns the
    /// value seen.
    ///
    /// # Errors
    ///
    /// A range outside the window, a misaligned offset, a dead or failed member (named), an
    /// abort, or the deadline. A member that exited cleanly fails the wait only once no member
    /// that could still raise the signal is running: one that left after doing its part does
    /// not fail the others' waits.
    pub fn wait_until(&self, offset: usize, value: u32) -> Result<u32, CommError> {
        self.wait_until_deadline(offset, value, self.inner.comm.deadline())
    }

    /// [`Window::wait_until`] with an explicit deadline.
    ///
    /// # Errors
    ///
    /// As [`Window::wait_until`].
    pub fn wait_until_deadline(
        &self,
        offset: usize,
        value: u32,
        deadline: Instant,
    ) -> Result<u32, CommError> {
        self.wait_awaiting(offset, value, deadline, Awaiting::Anyone)
    }

    /// [`Window::wait_until`] for a signal that only rank `source` (of the window's
    /// communicator) raises: the collectives' flags. Its exit fails the wait at once; other
    /// members that exited do not (they may have finished their part).
    pub(crate) fn wait_from(
        &self,
        source: usize,
        offset: usize,
        value: u32,
    ) -> Result<u32, CommError> {
        let comm = &self.inner.comm;
        let world = comm.world_rank_of(source)?;
        self.wait_awaiting(offset, value, comm.deadline(), Awaiting::Rank(world as u32))
    }

    fn wait_awaiting(
        &self,
        offset: usize,
        value: u32,
        deadline: Instant,
        awaiting: Awaiting,
    ) -> Result<u32, CommError> {
        let me = self.rank();
        self.check_atomic("signal wait", me, offset, 4)?;
        let reached = |v: u32| (v.wrapping_sub(value) as i32) >= 0;
        let comm = &self.inner.comm;
        let checker = crate::check::active();
        let what = checker.as_ref().map(|_| self.signal_name(offset, value));
        if let (Some(c), Some(what)) = (&checker, &what) {
            c.wait_begin(comm.world_rank(), self.name(), offset, what.clone());
        }
        let posted = comm.post_wait(crate::world::Waiting::Signal {
            window: self.inner.seq,
            offset: offset as u64,
            value,
        });
        let r = self
            .inner
            .io
            .wait(me, offset, reached, deadline, || {
                comm.check_awaiting(awaiting)
            })
            .map_err(wait_err(
                || {
                    // Named by its buffer, with the value it holds now (read only on failure).
                    let seen = self
                        .inner
                        .io
                        .load_u32(me, offset)
                        .map_or_else(|_| "?".to_string(), |v| v.to_string());
                    format!(
                        "wait on {} (window #{}, offset {offset}; it holds {seen})",
                        self.signal_name(offset, value),
                        self.inner.seq
                    )
                },
                comm.world_rank(),
            ))
            .map_err(|e| comm.with_wait_for_graph(e));
        drop(posted);
        if r.is_ok() {
            pto_core::trace::mark("wait", || {
                format!("{} {} {offset}", self.name(), comm.world_rank())
            });
        }
        if let Some(c) = &checker {
            c.wait_end(
                comm.world_rank(),
                r.as_ref().is_err_and(crate::check::stalled),
            );
            if r.is_ok() {
                c.acquire_wait(
                    comm.world_rank(),
                    self.name(),
                    offset,
                    what.as_deref().unwrap_or(""),
                );
            }
        }
        r
    }

    /// Test a signal without waiting: true when this rank's signal at `offset` is `>= value`.
    ///
    /// # Errors
    ///
    /// A range outside the window or a misaligned offset.
    pub fn test(&self, offset: usize, value: u32) -> Result<bool, CommError> {
        let v = self.load_u32(self.rank(), offset)?;
        Ok((v.wrapping_sub(value) as i32) >= 0)
    }

    /// A deferred-completion condition: this rank's signal at `offset` reaches `value` (`>=`,
    /// wrapping as in [`Window::wait_until`]). Polling it is one atomic load plus the abort
    /// word; an abort fails it.
    ///
    /// # Errors
    ///
    /// A range outside the window or a misaligned offset.
    pub fn signal_condition(
        &self,
        offset: usize,
        value: u32,
    ) -> Result<SignalCondition, CommError> {
        self.counter_condition(self.rank(), offset, value)
    }

    /// A deferred-completion condition on the `u32` counter at `(rank, offset)` of any rank's
    /// window reaching `value`.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window or a misaligned offset.
    pub fn counter_condition(
        &self,
        rank: usize,
        offset: usize,
        value: u32,
    ) -> Result<SignalCondition, CommError> {
        self.check_atomic("signal condition", rank, offset, 4)?;
        Ok(SignalCondition {
            window: self.clone(),
            rank,
            offset,
            value,
        })
    }
}

/// A signal or counter in a window reaching a value, as a deferred-completion condition
/// ([`Window::signal_condition`]).
#[derive(Clone, Debug)]
pub struct SignalCondition {
    window: Window,
    rank: usize,
    offset: usize,
    value: u32,
}

impl pto_core::Condition for SignalCondition {
    fn poll(&self) -> pto_core::Poll {
        let value = self.value;
        let reached = |v: u32| (v.wrapping_sub(value) as i32) >= 0;
        match self.window.inner.io.poll(self.rank, self.offset, reached) {
            Ok(Some(_)) => {
                if let Some(c) = crate::check::active() {
                    let w = &self.window;
                    let comm = &w.inner.comm;
                    if self.rank == w.rank() {
                        let what = w.signal_name(self.offset, value);
                        c.acquire_wait(comm.world_rank(), w.name(), self.offset, &what);
                    } else {
                        w.acquired(self.rank, self.offset);
                    }
                }
                return pto_core::Poll::Ready;
            }
            Ok(None) => {}
            Err(e) => return pto_core::Poll::Failed(e.to_string()),
        }
        match self.window.inner.comm.world_ref().check_abort() {
            Ok(()) => pto_core::Poll::Pending,
            Err(e) => pto_core::Poll::Failed(e.to_string()),
        }
    }

    fn describe(&self) -> String {
        format!(
            "signal at offset {} of rank {} >= {}",
            self.offset, self.rank, self.value
        )
    }

    fn trace_key(&self) -> Option<String> {
        let comm = &self.window.inner.comm;
        let t = comm.world_rank_of(self.rank).unwrap_or(self.rank);
        Some(format!("{} {t} {}", self.window.name(), self.offset))
    }
}
