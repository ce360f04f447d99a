//! The body of a child process: bring-up (chips), then serve frames until shutdown or until the
//! parent is gone. A child never returns into the parent's code: it leaves with `exit_now`.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use pto_comm::shm::ShmWorld;
use pto_comm::{Cause, CommContext, Window};
use pto_core::{ArgMode, Chip, OrchError, Program, RunOptions, Scalar, Tensor};
use smallvec::SmallVec;

use crate::frame::{FrameKind, FrameView, Outcome, TensorView};
use crate::mailbox::{BootFacts, Mailbox, RESULT_CAP};
use crate::shared::SegmentCache;
use crate::spec::{ChipCall, Spec, SubCall};

/// What a child process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Chip `i`.
    Chip(usize),
    /// A sub-worker.
    Sub,
    /// Child Worker `i` (L4).
    Worker(usize),
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

fn tensor(cache: &SegmentCache, d: &TensorView<'_>) -> Result<(Tensor, pto_core::ArgMode), String> {
    let buf = cache.buffer(d.segment, d.buffer_offset, d.buffer_len)?;
    let shape: SmallVec<[usize; 8]> = d.dims.iter().map(|&(v, _)| v as usize).collect();
    let strides: SmallVec<[usize; 8]> = d.dims.iter().map(|&(_, v)| v as usize).collect();
    let t = Tensor::strided(buf, d.dtype, &shape, &strides, d.offset as usize)
        .map_err(|e| format!("tensor in {}: {e}", d.segment))?;
    Ok((t, d.mode))
}

fn scalars(f: &FrameView<'_>) -> Vec<Scalar> {
    f.scalars
        .iter()
        .map(|&(bits, d)| pto_core::Scalar::from_bits(bits, d))
        .collect()
}

struct ChipState {
    chip: Chip,
    rank: usize,
    size: usize,
    ctx: Option<CommContext>,
    /// Host staging: (offset in the window, bytes, host tensor).
    staged: Vec<(usize, usize, Tensor)>,
}

impl ChipState {
    /// Stores every staged window buffer back into its host tensor.
    fn store_back(&self) -> Result<(), String> {
        let Some(w) = self.ctx.as_ref().and_then(|c| c.window(0).ok()) else {
            return Ok(());
        };
        for (off, bytes, host) in &self.staged {
            let mut data = vec![0u8; *bytes];
            w.get(w.rank(), *off, &mut data)
                .map_err(|e| e.to_string())?;
            write_bytes(host, &data)?;
        }
        Ok(())
    }
}

fn write_bytes(t: &Tensor, data: &[u8]) -> Result<(), String> {
    // Staged tensors are contiguous (checked at init): view them as bytes.
    let bytes = Tensor::new(
        t.buffer().clone(),
        pto_core::DType::U8,
        &[data.len()],
        t.region().offset() * t.dtype().size(),
    )
    .map_err(|e| e.to_string())?;
    bytes.write(data).map_err(|e| e.to_string())
}

thread_local! {
    /// The chip task a chip child serves now: the orchestration of its programs reads it (a
    /// program's orchestration runs on the thread that runs the program: this one).
    static CALL: RefCell<Option<ChipCall>> = const { RefCell::new(None) };
    /// The tensor list of the last chip task served, emptied, for the next one.
    static SPARE: RefCell<Vec<(Tensor, ArgMode)>> = const { RefCell::new(Vec::new()) };
}

/// A chip child's programs, made once: each orchestrates the chip task being served
/// ([`CALL`]), so that serving a frame builds no program (its name and closure were two
/// allocations per chip task).
fn chip_programs(spec: &Spec) -> Vec<Program> {
    spec.programs
        .iter()
        .map(|(name, kernels, orch)| {
            let orch = orch.clone();
            Program::new(name, kernels.clone(), move |o| {
                CALL.with(|c| match c.borrow().as_ref() {
                    Some(call) => orch(o, call),
                    None => Err(OrchError::Other("no chip task is being served".into())),
                })
            })
        })
        .collect()
}

fn serve(
    spec: &Spec,
    programs: &[Program],
    chip: Option<&ChipState>,
    inner: Option<&dyn Any>,
    cache: &SegmentCache,
    bytes: &[u8],
) -> Outcome {
    let f = match FrameView::parse(bytes) {
        Ok(f) => f,
        Err(e) => return fail(2, e.to_string()),
    };
    let mut tensors = SPARE.with(|v| std::mem::take(&mut *v.borrow_mut()));
    tensors.reserve(f.tensors.len());
    for d in &f.tensors {
        match tensor(cache, d) {
            Ok(t) => tensors.push(t),
            Err(e) => return fail(2, e),
        }
    }
    match (f.kind, chip) {
        (FrameKind::Chip, Some(cs)) => {
            let Some(program) = programs.get(f.index as usize) else {
                return fail(2, format!("no chip program {}", f.index));
            };
            CALL.with(|c| {
                *c.borrow_mut() = Some(ChipCall {
                    tensors,
                    scalars: scalars(&f),
                    rank: cs.rank,
                    size: cs.size,
                    comm: cs.ctx.clone(),
                });
            });
            let ran = cs.chip.run_with(program, RunOptions { trace: f.trace });
            // The task's tensors go with it (as the program's closure did before); their
            // list is kept for the next task.
            if let Some(mut call) = CALL.with(|c| c.borrow_mut().take()) {
                call.tensors.clear();
                SPARE.with(|v| *v.borrow_mut() = call.tensors);
            }
            match ran
                .map_err(|e| {
                    // A failure caused by another chip (it died or aborted, or a wait on the
                    // others ran out) is reported as a consequence, not as a root cause.
                    let text = e.to_string();
                    let cause = match &cs.ctx {
                        Some(c) => c.comm().cause_of(&text),
                        None if text.contains("timed out after") => Cause::Timeout,
                        None => Cause::Own,
                    };
                    let status = match cause {
                        Cause::Own => 1,
                        Cause::Peer => 3,
                        Cause::Timeout => 4,
                    };
                    (status, text)
                })
                .and_then(|r| cs.store_back().map(|()| r).map_err(|e| (1, e)))
            {
                Ok(r) => Outcome {
                    status: 0,
                    tasks: r.stats.tasks,
                    message: String::new(),
                    trace: r
                        .trace
                        .map(|t| serde_like(&t.chrome_events()))
                        .unwrap_or_default(),
                },
                Err((status, e)) => fail(status, e),
            }
        }
        (FrameKind::Worker, _) if inner.is_some() => {
            let Some(w) = inner else {
                return fail(2, "not a child worker".into());
            };
            let Some((_, func)) = spec.worker_fns.get(f.index as usize) else {
                return fail(2, format!("no child-worker closure {}", f.index));
            };
            let call = SubCall {
                tensors,
                scalars: scalars(&f),
            };
            host_call(|| func(w, &call))
        }
        (FrameKind::Sub, None) if inner.is_none() => {
            let Some((_, func)) = spec.subs_fns.get(f.index as usize) else {
                return fail(2, format!("no sub-worker function {}", f.index));
            };
            let call = SubCall {
                tensors,
                scalars: scalars(&f),
            };
            host_call(|| func(&call))
        }
        (k, _) => fail(2, format!("a {k:?} frame sent to the wrong kind of child")),
    }
}

fn serde_like(events: &[serde_json::Value]) -> String {
    serde_json::Value::Array(events.to_vec()).to_string()
}

/// Why a bring-up failed: the message, and whose failure it is.
struct BootFail {
    cause: Cause,
    message: String,
}

impl From<String> for BootFail {
    fn from(message: String) -> BootFail {
        BootFail {
            cause: Cause::Own,
            message,
        }
    }
}

impl From<pto_comm::CommError> for BootFail {
    fn from(e: pto_comm::CommError) -> BootFail {
        BootFail {
            cause: e.cause(),
            message: e.to_string(),
        }
    }
}

fn bring_up(
    spec: &Spec,
    world: Option<&ShmWorld>,
    index: usize,
    cache: &SegmentCache,
) -> Result<(ChipState, BootFacts), BootFail> {
    let n = spec.chips;
    let (ctx, window, facts) = match world {
        Some(w) => {
            let comm = w.join(index)?;
            if let Some(h) = &spec.boot_hook {
                h(index)?;
            }
            let (window, offsets, bytes): (Option<Window>, Vec<u64>, u64) = match &spec.window {
                Some(ws) => {
                    let win = comm.alloc_window(ws)?;
                    let offs = win.buffers().iter().map(|b| b.offset as u64).collect();
                    (Some(win), offs, ws.bytes as u64)
                }
                None => (None, Vec::new(), 0),
            };
            let coll = match spec.collectives {
                Some(cap) => Some(pto_comm::Collectives::new(&comm, cap)?),
                None => None,
            };
            let mut ctx = CommContext::new(comm);
            if let Some(c) = coll {
                ctx = ctx.with_collectives(c);
            }
            if let Some(w) = &window {
                ctx = ctx.with_window(w.clone());
            }
            let facts = BootFacts {
                rank: index as u32,
                size: n as u32,
                window_bytes: bytes,
                buffer_offsets: offsets,
            };
            (Some(ctx), window, facts)
        }
        None => {
            if let Some(h) = &spec.boot_hook {
                h(index)?;
            }
            (
                None,
                None,
                BootFacts {
                    rank: index as u32,
                    size: n as u32,
                    ..BootFacts::default()
                },
            )
        }
    };
    // Host staging: load each staged buffer from its host tensor.
    let mut staged = Vec::new();
    if let Some(w) = &window {
        for (name, descs) in &spec.staging {
            let b = w.buffer(name)?;
            let (host, _) = tensor(cache, &descs[index].view())?;
            let bytes = host.read_bytes().map_err(|e| e.to_string())?;
            w.put(w.rank(), b.offset, &bytes)?;
            staged.push((b.offset, b.bytes, host));
        }
        // Every chip loaded its buffers before any runs a task that may read a peer's.
        w.barrier()?;
    }
    drop(window);
    // The orchestrating thread, here the mailbox loop, runs the frame's tasks itself while it
    // waits for them (`ChipBuilder::orchestrator_runs_tasks`): a chip task of one kernel then
    // costs no hand-off to a core thread and no wake-up (`worker_chip_kernel_roundtrip` went
    // from 13-24 us to 3.2-4.3 us median, docs/BENCHMARKS.md). A kernel that never returns
    // stops the loop instead of being reported as a stall, but the parent's deadline for the
    // reply (`PTO_WAIT_TIMEOUT_MS`) is shorter than the stall timeout and fires first in
    // either mode. It also keeps no CPU for the loop (`orchestrator_cpu`): it needs none.
    let mut b = Chip::builder()
        .chip_id(index as u32)
        .aic_cores(spec.cores.0)
        .aiv_cores(spec.cores.1)
        .orchestrator_runs_tasks(true);
    if let Some(n) = spec.threads {
        b = b.threads(n);
    }
    // The Worker's timeout is its chips' too: a deferred task's conditions and the
    // orchestration's waits fail (naming what they waited for) before the host's backstop on
    // the reply.
    if !spec.timeout.is_zero() {
        b = b.wait_timeout(spec.timeout);
    }
    if let Some(c) = &ctx {
        b = b.extension(Arc::new(c.clone()));
    }
    if let Some(t) = &spec.thread_main {
        b = b.thread_main(t.clone());
    }
    let chip = b.build().map_err(|e| e.to_string())?;
    Ok((
        ChipState {
            chip,
            rank: index,
            size: n,
            ctx,
            staged,
        },
        facts,
    ))
}

/// Runs a forked child in its `role` (a chip, a sub-worker or a child Worker) until the parent
/// asks it to leave or is gone; never returns.
pub(crate) fn child_main(
    spec: &Spec,
    world: Option<&ShmWorld>,
    lanes: &[Mailbox],
    role: Role,
    parent: u32,
) -> ! {
    let _ = pto_shm::process::die_with_parent(parent);
    pto_shm::process::exit_now(child_body(spec, world, lanes, role, parent))
}

/// A child's life (in a forked process, or on a thread of the Worker's process): bring-up,
/// then frames until the parent asks it to leave or is gone. Returns its exit code.
pub(crate) fn child_body(
    spec: &Spec,
    world: Option<&ShmWorld>,
    lanes: &[Mailbox],
    role: Role,
    parent: u32,
) -> i32 {
    // The first lane carries the bootstrap record; frames come on every lane in turn.
    let mailbox = &lanes[0];
    let cache = SegmentCache::default();
    let mut inner = None;
    let state = match role {
        Role::Chip(i) => match bring_up(spec, world, i, &cache) {
            Ok((s, facts)) => {
                mailbox.boot_success(&facts);
                Some(s)
            }
            Err(e) => {
                let mark = match e.cause {
                    Cause::Own => "",
                    Cause::Peer => "consequence: ",
                    Cause::Timeout => "timeout: ",
                };
                mailbox.boot_error(1, &format!("{mark}{}", e.message));
                return 3;
            }
        },
        Role::Sub => {
            mailbox.boot_success(&BootFacts::default());
            None
        }
        Role::Worker(i) => {
            // This process is a fresh fork: single-threaded, so it may fork its own children.
            let Some(factory) = spec.workers.get(i) else {
                mailbox.boot_error(1, &format!("child worker {i}: no factory"));
                return 3;
            };
            match factory() {
                Ok(w) => {
                    inner = Some(w);
                    mailbox.boot_success(&BootFacts::default());
                }
                Err(e) => {
                    mailbox.boot_error(1, &format!("child worker {i}: {e}"));
                    return 3;
                }
            }
            None
        }
    };
    let programs = if state.is_some() {
        chip_programs(spec)
    } else {
        Vec::new()
    };
    // One buffer for the frames and one for the results, reused frame after frame.
    let (mut bytes, mut reply) = (Vec::new(), Vec::new());
    for n in 0u64.. {
        let lane = crate::pipe::lane_of(lanes, n + 1);
        match lane.next_frame_into(parent, &mut bytes) {
            Ok(Some((ident, Ok(())))) => {
                let out = serve(
                    spec,
                    &programs,
                    state.as_ref(),
                    inner.as_deref(),
                    &cache,
                    &bytes,
                );
                out.encode_into(RESULT_CAP, &mut reply);
                lane.reply(ident, &reply);
                // No frame waits behind it: the host most likely waits for this result,
                // perhaps on this CPU; let it run before this child's own wait spins.
                if !crate::pipe::lane_of(lanes, n + 2).frame_ready() {
                    std::thread::yield_now();
                }
            }
            Ok(Some((ident, Err(e)))) => {
                let out = Outcome {
                    status: 2,
                    tasks: 0,
                    message: e.to_string(),
                    trace: String::new(),
                };
                lane.reply(ident, &out.encode(RESULT_CAP));
            }
            Ok(None) | Err(_) => break,
        }
    }
    drop(state);
    // A child Worker shuts its own children down and removes its segments.
    drop(inner);
    drop(cache);
    0
}

/// Runs one host-side function (a sub-worker's or a child Worker's): one task, its error or
/// panic as the failure message.
fn host_call(call: impl FnOnce() -> Result<(), String>) -> Outcome {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => Outcome {
            status: 0,
            tasks: 1,
            message: String::new(),
            trace: String::new(),
        },
        Ok(Err(m)) => fail(1, m),
        Err(p) => fail(1, format!("panicked: {}", panic_text(&*p))),
    }
}

/// A frame that failed: `status` 1 for the work itself, 2 for the frame or the child.
fn fail(status: u32, message: String) -> Outcome {
    Outcome {
        status,
        tasks: 0,
        message,
        trace: String::new(),
    }
}
