//! The orchestration API: submit tasks, open scopes, read results. It runs on the thread that
//! called `Chip::run` and owns the run's TensorMap, rings and scopes.

use std::any::Any;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ChipConfig;
use crate::args::{TaskArgs, TaskId};
use crate::dtype::Element;
use crate::engine::submit::{Blocked, Orchestrator};
use crate::engine::{remaining, Engine};
use crate::error::OrchError;
use crate::kernel::{KernelRef, KernelRegistry};
use crate::tensor::Tensor;

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

/// Parks the orchestrating thread until `engine.finished` reaches `at` (or `timeout` passes,
/// or the cores run out of work); see `crate::engine::orchwait`.
pub(crate) fn park_until(engine: &Engine, at: u64, timeout: Duration) {
    engine
        .orch
        .park_until(at, || engine.finished_total(), timeout);
}

/// The orchestration API: submit tasks, open scopes, read results.
pub struct Orch<'a> {
    engine: &'a Engine,
    kernels: &'a KernelRegistry,
    state: Orchestrator,
    wait: Duration,
    spin: Duration,
    /// The kernel submitted last (see [`KernelRef::resolve_after`]).
    last_kernel: Option<&'a Arc<crate::kernel::Kernel>>,
}

impl fmt::Debug for Orch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Orch").finish_non_exhaustive()
    }
}

impl<'a> Orch<'a> {
    pub(crate) fn new(
        engine: &'a Arc<Engine>,
        kernels: &'a KernelRegistry,
        state: Orchestrator,
        cfg: &ChipConfig,
    ) -> Orch<'a> {
        Orch {
            engine,
            kernels,
            state,
            wait: cfg.wait_timeout,
            spin: cfg.spin,
            last_kernel: None,
        }
    }

    pub(crate) fn into_orchestrator(self) -> Orchestrator {
        self.state
    }

    /// Waits (spinning briefly, then parked) until `finished` reaches `at`, or `cap` passes.
    fn wait_finished(&self, at: u64, cap: Duration, since: Instant) {
        self.engine.flush_orch();
        self.engine.orch_idle();
        if since.elapsed() < self.spin {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            std::thread::yield_now();
            return;
        }
        park_until(self.engine, at, cap);
    }

    fn submit_inner(
        &mut self,
        kernel: Option<&Arc<crate::kernel::Kernel>>,
        mut args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let plan = self.state.plan(kernel, &args)?;
        // The clock is read only once the ring is full (a clock read per task costs more than
        // the rest of a submit's bookkeeping on some virtual machines).
        let mut started: Option<(Instant, Instant)> = None;
        let placed = loop {
            match self.state.place(&plan) {
                Ok(at) => break Ok(at),
                Err(Blocked::Never(e)) => break Err(e),
                Err(Blocked::Wait(what)) => {
                    let (start, deadline) = *started.get_or_insert_with(|| {
                        let now = Instant::now();
                        (now, now + self.wait)
                    });
                    let Some(left) = remaining(deadline) else {
                        break Err(OrchError::FlowControlTimeout {
                            ring: plan.ring(),
                            waited: self.wait,
                            what,
                        });
                    };
                    // Low-water mark: come back when half of what is in flight has finished,
                    // then refill the ring in one go. The cap bounds the cost of a threshold
                    // that progress elsewhere (a kernel waiting on a peer) keeps from being
                    // reached.
                    let done = self.engine.finished_total();
                    let in_flight = self.state.submitted().saturating_sub(done);
                    self.wait_finished(
                        done + (in_flight / 2).max(1),
                        left.min(Duration::from_millis(1)),
                        start,
                    );
                }
            }
        };
        if started.is_some() {
            // The wait released the reserved core thread: busy again.
            self.engine.orch_busy();
        }
        let (task, outputs) = self.state.commit(&plan, &mut args, placed?)?;
        Ok(Submitted { task, outputs })
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
        let k = kernel.resolve_after(self.kernels, &mut self.last_kernel)?;
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
        self.state.begin_scope(manual)?;
        let r = f(self);
        self.state.end_scope();
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

    /// Opens a scope that a later [`Orch::end_scope`] closes, for orchestrations whose scopes
    /// are not Rust closures (a C++ program's RAII guard calls begin and end separately): a
    /// manual one with `manual` (only explicit dependencies count), else an automatic one.
    /// Scopes still open when the program returns are closed with the run.
    ///
    /// # Errors
    ///
    /// [`OrchError::AutoInsideManual`] for an automatic scope inside a manual one.
    pub fn begin_scope(&mut self, manual: bool) -> Result<(), OrchError> {
        self.state.begin_scope(manual)
    }

    /// Closes the innermost scope [`Orch::begin_scope`] opened: its outputs are reclaimed once
    /// their consumers finished.
    ///
    /// # Errors
    ///
    /// [`OrchError::Other`] when no scope is open (the run's own outer scope is not the
    /// caller's to close).
    pub fn end_scope(&mut self) -> Result<(), OrchError> {
        if self.state.depth() == 0 {
            return Err(OrchError::msg("end_scope without an open scope"));
        }
        self.state.end_scope();
        Ok(())
    }

    /// Waits until every task that writes bytes of `t` (or, with `write`, also reads them) has
    /// finished.
    fn wait_producers(&mut self, t: &Tensor, write: bool) -> Result<(), OrchError> {
        self.engine.flush_orch();
        let mut released = false;
        let r = self.wait_producers_of(t, write, &mut released);
        if released {
            self.engine.orch_busy();
        }
        r
    }

    /// [`Orch::wait_producers`]'s loop; releases the reserved core thread (setting `released`)
    /// once it has to wait.
    fn wait_producers_of(
        &mut self,
        t: &Tensor,
        write: bool,
        released: &mut bool,
    ) -> Result<(), OrchError> {
        let deadline = Instant::now() + self.wait;
        let start = Instant::now();
        loop {
            // Counted before the look: a completion after it makes the park below return.
            let before = self.engine.finished_total();
            let (pending, one) = self.state.pending_for(t, write)?;
            if pending == 0 {
                return Ok(());
            }
            let Some(left) = remaining(deadline) else {
                return Err(OrchError::WaitTimeout {
                    waited: self.wait,
                    pending,
                });
            };
            if !*released {
                self.engine.orch_idle();
                *released = true;
            }
            // While deferred tasks wait, their conditions come from elsewhere, after a while:
            // park at once rather than spin beside the thread that polls them.
            if start.elapsed() < self.spin && !self.engine.has_waiting.load(Ordering::Acquire) {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
            } else {
                self.engine
                    .orch
                    .park_for_task(one, before, || self.engine.finished_total(), left);
            }
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

    /// Waits for the producers of `t`, then copies its raw bytes out (in logical order).
    ///
    /// # Errors
    ///
    /// As [`Orch::read`], without the dtype check.
    pub fn read_bytes(&mut self, t: &Tensor) -> Result<Vec<u8>, OrchError> {
        self.wait_producers(t, false)?;
        Ok(t.read_bytes()?)
    }

    /// Waits for every task reading or writing `t`, then copies `data` (its raw bytes, in
    /// logical order) in.
    ///
    /// # Errors
    ///
    /// As [`Orch::write`]; `data` must be exactly [`Tensor::nbytes`] long.
    pub fn write_bytes(&mut self, t: &Tensor, data: &[u8]) -> Result<(), OrchError> {
        self.wait_producers(t, true)?;
        Ok(t.write_bytes(data)?)
    }

    /// Logical AIC and AIV cores of this chip (to size SPMD work).
    pub fn core_counts(&self) -> (u32, u32) {
        let c = &self.engine.cores;
        (c.count(crate::CoreKind::Aic), c.count(crate::CoreKind::Aiv))
    }

    /// Depth of the innermost open scope (0 = the implicit outer scope).
    pub fn depth(&self) -> usize {
        self.state.depth()
    }

    /// The chip's extension object, if it has type `E`.
    pub fn ext<E: Any>(&self) -> Option<&E> {
        self.engine
            .ext
            .as_deref()
            .and_then(|e| e.downcast_ref::<E>())
    }
}
