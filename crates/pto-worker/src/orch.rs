//! Host orchestration: the API a run's closure gets ([`HostOrch`]: chip programs, groups of
//! chips, sub-worker and child-Worker closures) and the host kernels that carry each of its
//! tasks to the children as a frame. `HostOrch` appends routing scalars (program, chip, group
//! members, closure, child Worker) after the user's; the host kernels split them off.

use std::fmt;
use std::sync::atomic::Ordering;

use pto_core::{
    CoreKind, KernelCtx, KernelError, KernelRegistry, Orch, OrchError, Scalar, Submitted, TaskArgs,
};

use crate::frame::{Encoder, FrameKind, Outcome};
use crate::host::HostState;
use crate::pipe::Ticket;
use crate::spec::Spec;
use smallvec::SmallVec;

/// The host orchestration API: submit chip programs, groups of chips, sub-worker closures and
/// child-Worker closures.
pub struct HostOrch<'o, 'a> {
    orch: &'o mut Orch<'a>,
    spec: &'o Spec,
}

impl fmt::Debug for HostOrch<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostOrch").finish_non_exhaustive()
    }
}

impl<'o, 'a> HostOrch<'o, 'a> {
    /// The API over the host run's orchestration `orch`, for the Worker made from `spec`.
    pub(crate) fn new(orch: &'o mut Orch<'a>, spec: &'o Spec) -> HostOrch<'o, 'a> {
        HostOrch { orch, spec }
    }
}

impl<'a> HostOrch<'_, 'a> {
    fn program(&self, name: &str) -> Result<u64, OrchError> {
        self.spec
            .programs
            .iter()
            .position(|p| p.0 == name)
            .map(|p| p as u64)
            .ok_or_else(|| OrchError::msg(format!("no chip program named {name:?}")))
    }

    fn chip_index(&self, chip: usize) -> Result<u64, OrchError> {
        if chip >= self.spec.chips {
            return Err(OrchError::msg(format!(
                "chip {chip} does not exist (the Worker has {})",
                self.spec.chips
            )));
        }
        Ok(chip as u64)
    }

    /// Runs chip program `program` on chip `chip` with `args` (host tensors and scalars).
    ///
    /// # Errors
    ///
    /// An unknown program or chip, or the errors of [`Orch::submit`].
    pub fn submit_chip(
        &mut self,
        chip: usize,
        program: &str,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let (p, c) = (self.program(program)?, self.chip_index(chip)?);
        // Completes when the chip's result is in (see `crate::pipe`): no host thread waits.
        self.orch
            .submit("chip", args.scalar(p).scalar(c).deferred())
    }

    /// Runs `program` on every chip of `chips` at the same time (what a collective needs): no
    /// member starts before every member is free.
    ///
    /// # Errors
    ///
    /// An empty or repeated member list, an unknown program or chip, or the errors of
    /// [`Orch::submit`].
    pub fn submit_group(
        &mut self,
        chips: &[usize],
        program: &str,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        let p = self.program(program)?;
        let mut seen = vec![false; self.spec.chips];
        if chips.is_empty() {
            return Err(OrchError::msg("a group needs at least one chip"));
        }
        let mut args = args.scalar(p).scalar(chips.len() as u64);
        for &c in chips {
            self.chip_index(c)?;
            if std::mem::replace(&mut seen[c], true) {
                return Err(OrchError::msg(format!(
                    "chip {c} is listed twice in a group"
                )));
            }
        }
        for &c in chips {
            args = args.scalar(c as u64);
        }
        // The size goes last so the kernel can find the member list.
        args = args.scalar(chips.len() as u64);
        self.orch.submit("group", args)
    }

    /// Runs sub-worker closure `name` on a free sub-worker.
    ///
    /// # Errors
    ///
    /// An unknown closure, or the errors of [`Orch::submit`].
    pub fn submit_sub(&mut self, name: &str, args: TaskArgs) -> Result<Submitted, OrchError> {
        let f = self
            .spec
            .subs_fns
            .iter()
            .position(|s| s.0 == name)
            .ok_or_else(|| OrchError::msg(format!("no sub-worker closure named {name:?}")))?;
        self.orch.submit("sub", args.scalar(f as u64))
    }

    /// Runs closure `name` on child Worker `w` (L4).
    ///
    /// # Errors
    ///
    /// An unknown closure or child Worker, or the errors of [`Orch::submit`].
    pub fn submit_worker(
        &mut self,
        w: usize,
        name: &str,
        args: TaskArgs,
    ) -> Result<Submitted, OrchError> {
        if w >= self.spec.workers.len() {
            return Err(OrchError::msg(format!(
                "child worker {w} does not exist (there are {})",
                self.spec.workers.len()
            )));
        }
        let f = self
            .spec
            .worker_fns
            .iter()
            .position(|s| s.0 == name)
            .ok_or_else(|| OrchError::msg(format!("no child-worker closure named {name:?}")))?;
        self.orch
            .submit("worker", args.scalar(f as u64).scalar(w as u64))
    }

    /// Runs `f` in a nested scope (see [`Orch::scope`]): host tasks submitted inside are
    /// reclaimed once it ends, so long host orchestrations stay within the host rings.
    ///
    /// # Errors
    ///
    /// What `f` returns.
    pub fn scope<R>(
        &mut self,
        f: impl FnOnce(&mut HostOrch<'_, 'a>) -> Result<R, OrchError>,
    ) -> Result<R, OrchError> {
        let spec = self.spec;
        self.orch.scope(|o| {
            let mut h = HostOrch { orch: o, spec };
            f(&mut h)
        })
    }

    /// The underlying orchestration (scopes, reads, dummy tasks).
    pub fn orch(&mut self) -> &mut Orch<'a> {
        self.orch
    }
}

thread_local! {
    /// The frame buffer a host thread encodes its next frame into (see [`give_back`]).
    static FRAME_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Keeps a frame's buffer for this thread's next frame (a frame per chip task, each one
/// copied into a mailbox lane or a queue: no allocation per task). Large ones are dropped.
fn give_back(frame: Vec<u8>) {
    if frame.capacity() <= 64 << 10 {
        FRAME_BUF.set(frame);
    }
}

/// The frame of host task `ctx`: its tensors (each must live in shared memory) and its user
/// scalars (all but the last `routing`), encoded straight from the task's arguments.
fn frame(
    ctx: &KernelCtx<'_>,
    kind: FrameKind,
    index: u32,
    trace: bool,
    routing: usize,
) -> Result<Vec<u8>, KernelError> {
    let (user, _) = split_routing(ctx, routing)?;
    let n = ctx.num_tensors();
    let mut e = Encoder::into_buffer(FRAME_BUF.take(), kind, trace, index, n);
    for i in 0..n {
        let t = ctx.tensor(i)?;
        let (name, off) = t.buffer().shared_at().ok_or_else(|| {
            KernelError::msg(format!(
                "tensor argument {i} is not in shared memory: make it with Worker::tensor"
            ))
        })?;
        e.tensor(
            name,
            off as u64,
            t.buffer().len() as u64,
            t.region().offset() as u64,
            t.dtype(),
            ctx.mode(i)?,
            t.shape()
                .into_iter()
                .zip(t.strides())
                .map(|(s, st)| (s as u64, st as u64)),
        );
    }
    Ok(e.finish(user.iter().map(|s| (s.bits(), s.dtype()))))
}

/// The task's scalars split into the user's and the last `k` (the routing ones).
fn split_routing<'c>(
    ctx: &'c KernelCtx<'_>,
    k: usize,
) -> Result<(&'c [Scalar], &'c [Scalar]), KernelError> {
    let all = ctx.scalars();
    let at = all
        .len()
        .checked_sub(k)
        .ok_or_else(|| KernelError::msg("missing routing scalars"))?;
    Ok(all.split_at(at))
}

/// The routing scalars (the last `k`), as bits.
fn routing(ctx: &KernelCtx<'_>, k: usize) -> Result<SmallVec<[u64; 4]>, KernelError> {
    Ok(split_routing(ctx, k)?.1.iter().map(Scalar::bits).collect())
}

pub(crate) fn host_kernels() -> Result<KernelRegistry, pto_core::RegistryError> {
    let mut k = KernelRegistry::new();
    // Routing scalars: [.., program, chip].
    k.register("chip", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let route = routing(ctx, 2)?;
        let (program, chip) = (route[0] as u32, route[1] as usize);
        let frame = frame(
            ctx,
            FrameKind::Chip,
            program,
            st.tracing.load(Ordering::Relaxed),
            2,
        )?;
        let task = ctx.task().get();
        let posted = st.post(chip, task, &frame);
        give_back(frame);
        let ticket = posted.map_err(|e| {
            KernelError::msg(format!("{}: host task {task}: {e}", st.children[chip].who))
        })?;
        let me = st
            .me
            .upgrade()
            .ok_or_else(|| KernelError::msg("the Worker is gone"))?;
        // The condition fails on its own when the child is lost or silent (the pipe's
        // deadlines); the engine's deadline is only a backstop past every frame ahead of it.
        let backstop = (st.timeout + crate::host::GRACE)
            .saturating_mul(st.children[chip].lanes.len() as u32 + 1)
            + std::time::Duration::from_secs(1);
        ctx.defer_until(
            ChipResult { st: me, ticket },
            std::time::Instant::now() + backstop,
        )
    })?;
    // Routing scalars: [.., program, n, chip_0 .. chip_n-1].
    k.register("group", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let all = ctx.scalars();
        let n = all
            .len()
            .checked_sub(1)
            .and_then(|i| all.get(i))
            .map(|s| s.bits() as usize)
            .ok_or_else(|| KernelError::msg("missing group size"))?;
        let route = routing(ctx, n + 3)?;
        let program = route[0] as u32;
        let mut members: Vec<usize> = route[2..2 + n].iter().map(|&c| c as usize).collect();
        let frame = frame(
            ctx,
            FrameKind::Chip,
            program,
            st.tracing.load(Ordering::Relaxed),
            n + 3,
        )?;
        // Take every member's lock in one order (no two groups can deadlock) and queue the
        // frame on every member at once (every member sees groups in the same order), then
        // collect every result.
        members.sort_unstable();
        let task = ctx.task().get();
        let tickets = {
            let mut guards: Vec<_> = members
                .iter()
                .map(|&m| st.children[m].pipe.lock())
                .collect();
            let mut tickets = Vec::with_capacity(members.len());
            for (g, &m) in guards.iter_mut().zip(&members) {
                tickets.push(
                    st.post_queued(m, g, task, &frame)
                        .map_err(KernelError::msg)?,
                );
            }
            tickets
        };
        give_back(frame);
        let results = st.wait(&tickets);
        let mut first_err = None;
        for (m, r) in members.iter().zip(results) {
            let who = &st.children[*m].who;
            match r {
                Ok(o) if o.status == 0 => {}
                Ok(o) => {
                    first_err.get_or_insert(format!("{who}: {}", o.message));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(KernelError::msg(e)),
        }
    })?;
    // Routing scalars: [.., function].
    k.register("sub", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let route = routing(ctx, 1)?;
        let frame = frame(ctx, FrameKind::Sub, route[0] as u32, false, 1)?;
        let subs: Vec<usize> = (st.chips..st.chips + st.subs).collect();
        if subs.is_empty() {
            return Err(KernelError::msg("the Worker has no sub-workers"));
        }
        // An idle sub-worker if there is one, else the task's own choice (it waits its turn).
        let pick = subs
            .iter()
            .copied()
            .find(|&s| st.children[s].pipe.try_lock().is_some_and(|p| p.idle()))
            .unwrap_or(subs[ctx.task().get() as usize % subs.len()]);
        check(
            st.send(pick, ctx.task().get(), &frame),
            &st.children[pick].who,
            ctx,
        )
    })?;
    // Routing scalars: [.., function, child worker].
    k.register("worker", CoreKind::Aiv, |ctx| {
        let st = host(ctx)?;
        let route = routing(ctx, 2)?;
        let child = st.chips + st.subs + route[1] as usize;
        if child >= st.children.len() {
            return Err(KernelError::msg(format!("no child worker {}", route[1])));
        }
        let frame = frame(ctx, FrameKind::Worker, route[0] as u32, false, 2)?;
        check(
            st.send(child, ctx.task().get(), &frame),
            &st.children[child].who,
            ctx,
        )
    })?;
    Ok(k)
}

/// A chip task's completion: its result came back (or the chip was lost).
struct ChipResult {
    st: std::sync::Arc<HostState>,
    ticket: Ticket,
}

impl pto_core::Condition for ChipResult {
    fn poll(&self) -> pto_core::Poll {
        let who = || &self.st.children[self.ticket.child].who;
        match self.st.poll(&self.ticket, false) {
            None => pto_core::Poll::Pending,
            Some(Ok(o)) if o.status == 0 => pto_core::Poll::Ready,
            Some(Ok(o)) => pto_core::Poll::Failed(format!("{}: {}", who(), o.message)),
            Some(Err(e)) => pto_core::Poll::Failed(e),
        }
    }

    /// A child answers its frames in the order they were sent (`HostState::poll` takes
    /// results oldest first).
    fn order(&self) -> Option<(usize, u64)> {
        let child: *const _ = &self.st.children[self.ticket.child];
        Some((child as usize, self.ticket.ident.generation))
    }

    fn describe(&self) -> String {
        format!(
            "{}'s answer to host task {}",
            self.st.children[self.ticket.child].who, self.ticket.ident.task
        )
    }
}

fn host<'a>(ctx: &'a KernelCtx<'_>) -> Result<&'a HostState, KernelError> {
    ctx.ext::<HostState>()
        .ok_or_else(|| KernelError::msg("host kernel outside a Worker"))
}

fn check(r: Result<Outcome, String>, who: &str, ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    match r {
        Ok(o) if o.status == 0 => Ok(()),
        Ok(o) => Err(KernelError::msg(format!(
            "{who}: host task {}: {}",
            ctx.task(),
            o.message
        ))),
        Err(e) => Err(KernelError::msg(format!(
            "{who}: host task {}: {e}",
            ctx.task()
        ))),
    }
}
