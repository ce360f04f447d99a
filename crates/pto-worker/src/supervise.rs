//! Supervising the children: forking them and waiting for their bring-up ([`start`]), a
//! watcher thread that notices a death in any phase (between runs too), and reaping them at
//! shutdown.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pto_comm::shm::ShmWorld;
use pto_shm::process::Forked;

use crate::child;
use crate::error::WorkerError;
use crate::failure::{ChildFailure, FailKind, RunFailure};
use crate::host::{ChildHandle, HostState, GRACE};
use crate::mailbox::{BootFacts, Mailbox};
use crate::spec::Spec;

/// A Worker's children, forked and up.
pub(crate) struct Started {
    /// Every child: chips, then sub-workers, then child Workers.
    pub(crate) children: Vec<ChildHandle>,
    /// What each chip reported at bring-up.
    pub(crate) facts: Vec<BootFacts>,
    /// The chips' world, when they communicate (shared with in-process children's threads).
    pub(crate) world: Option<Arc<ShmWorld>>,
    /// When the forking began (the Worker's init time counts from here).
    pub(crate) t0: Instant,
}

/// How long a process that still counts other threads is given for them to go before it is
/// refused: a thread that was just joined is still counted for a moment (the kernel wakes the
/// joiner before it releases the thread), so a program that joined every thread and then builds
/// a Worker would otherwise be refused now and then.
const THREADS_SETTLE: Duration = Duration::from_millis(200);

/// The process's thread count once threads that are exiting have gone (at most
/// [`THREADS_SETTLE`]): 1 as soon as it reads 1.
fn settled_thread_count() -> usize {
    let until = Instant::now() + THREADS_SETTLE;
    loop {
        let n = pto_shm::process::thread_count();
        if n <= 1 || Instant::now() >= until {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Forks every child and waits until each is up.
///
/// # Errors
///
/// A process that already has threads, a failed fork, a chip whose bring-up failed (every
/// child is then reaped and no segment is left), or a timeout.
pub(crate) fn start(spec: &Arc<Spec>) -> Result<Started, WorkerError> {
    if !spec.in_process {
        let threads = settled_thread_count();
        if threads > 1 {
            return Err(WorkerError::NotSingleThreaded { threads });
        }
    }
    // Before forking, so that children inherit it: a signal ends every child and removes
    // every segment (docs/design/worker.md).
    pto_shm::cleanup::install();
    let t0 = Instant::now();
    let world = if spec.comm {
        // The Worker's timeout is its chips' too: a chip's wait fails (naming what it waited
        // on) before the host's backstop on its reply.
        Some(Arc::new(ShmWorld::create_with_timeout(
            spec.chips,
            spec.timeout,
        )?))
    } else {
        None
    };
    // The Worker reaps its chips (during bring-up below, then in its watcher) and publishes
    // their deaths in the world: the chips' waits need no /proc reads, from the first fork on.
    let deaths = world.as_deref().map(ShmWorld::supervise);
    let total = spec.chips + spec.subs + spec.workers.len();
    let lanes = crate::pipe::lanes_for(total);
    let boxes = Mailbox::create_set("mb", total.saturating_mul(lanes))?;
    let parent = std::process::id();
    let mut children: Vec<ChildHandle> = Vec::with_capacity(total);
    let mut boxes = boxes.into_iter();
    for i in 0..total {
        let mb: Vec<Mailbox> = boxes.by_ref().take(lanes).collect();
        if mb.len() < lanes {
            break;
        }
        let role = if i < spec.chips {
            child::Role::Chip(i)
        } else if i < spec.chips + spec.subs {
            child::Role::Sub
        } else {
            child::Role::Worker(i - spec.chips - spec.subs)
        };
        let who = match role {
            child::Role::Chip(c) => format!("chip {c}"),
            child::Role::Sub => format!("sub-worker {}", i - spec.chips),
            child::Role::Worker(w) => format!("child worker {w}"),
        };
        if spec.in_process {
            match spawn_thread(spec, world.as_ref(), &mb, role, parent, &who) {
                Ok(h) => children.push(ChildHandle::thread(who, mb, h)),
                Err(e) => {
                    reap_all(&children, Duration::from_millis(500));
                    return Err(WorkerError::Fork(e));
                }
            }
            continue;
        }
        // SAFETY: checked above that this process is single-threaded, and no thread has
        // been started since; the child runs `child_main`, which never returns.
        #[allow(unsafe_code)]
        let forked = unsafe { pto_shm::process::fork() };
        match forked {
            Ok(Forked::Child) => match (&spec.chip_main, role) {
                (Some(wrap), child::Role::Chip(_)) => {
                    let w = world.as_deref();
                    let mb = &mb;
                    wrap(Box::new(move || {
                        child::child_main(spec, w, mb, role, parent)
                    }));
                    // `child_main` never returns; a wrapper that did not call it ends here.
                    pto_shm::process::exit_now(3)
                }
                _ => child::child_main(spec, world.as_deref(), &mb, role, parent),
            },
            Ok(Forked::Parent(pid)) => {
                children.push(ChildHandle::new(who, pid, mb));
            }
            Err(e) => {
                reap_all(&children, Duration::from_millis(500));
                return Err(WorkerError::Fork(e));
            }
        }
    }
    let facts = match bring_up(&children, spec.chips, deaths.as_ref(), spec.timeout) {
        Ok(f) => f,
        Err(e) => {
            reap_all(&children, Duration::from_millis(500));
            drop(world);
            return Err(e);
        }
    };
    tracing::debug!(chips = spec.chips, children = total, took = ?t0.elapsed(), "Worker up");
    Ok(Started {
        children,
        facts,
        world,
        t0,
    })
}

/// Starts an in-process child: a thread running the child's life on its own handles of the
/// mailbox lanes (a chip's inside the embedder's [`Spec::chip_main`], as a forked chip's).
fn spawn_thread(
    spec: &Arc<Spec>,
    world: Option<&Arc<ShmWorld>>,
    lanes: &[Mailbox],
    role: child::Role,
    parent: u32,
    who: &str,
) -> std::io::Result<std::thread::JoinHandle<i32>> {
    let spec = spec.clone();
    let world = world.cloned();
    let lanes: Vec<Mailbox> = lanes.iter().map(Mailbox::twin).collect();
    std::thread::Builder::new()
        .name(format!("pto-{}", who.replace(' ', "-")))
        .spawn(move || {
            let w = world.as_deref();
            match (&spec.chip_main, role) {
                (Some(wrap), child::Role::Chip(_)) => {
                    let mut code = 3;
                    let c = &mut code;
                    wrap(Box::new(|| {
                        *c = child::child_body(&spec, w, &lanes, role, parent);
                    }));
                    code
                }
                _ => child::child_body(&spec, w, &lanes, role, parent),
            }
        })
}

/// Waits for every child's bootstrap record. On a failure, keeps collecting for a moment so
/// that the report can tell the root cause from its consequences.
fn bring_up(
    children: &[ChildHandle],
    chips: usize,
    deaths: Option<&pto_comm::shm::Deaths>,
    timeout: Duration,
) -> Result<Vec<BootFacts>, WorkerError> {
    let deadline = Instant::now() + timeout;
    let mut facts = vec![None; children.len()];
    let mut failures: Vec<ChildFailure> = Vec::new();
    let mut settle: Option<Instant> = None;
    loop {
        let mut pending = 0;
        for (i, c) in children.iter().enumerate() {
            if facts[i].is_some() || failures.iter().any(|f| f.child == i) {
                continue;
            }
            // A child may report just before it dies: read its record first.
            let exit = c.exit();
            if let (Some(_), Some(d)) = (exit, deaths) {
                if i < chips {
                    d.ended(i, c.pid.pid);
                }
            }
            match c.boot_lane().boot_result() {
                Ok(Some(f)) => facts[i] = Some(f),
                Err(message) => {
                    // A chip whose bring-up failed because of another says so first.
                    let (kind, message) = if let Some(m) = message.strip_prefix("consequence: ") {
                        (FailKind::Consequence, m.to_string())
                    } else if let Some(m) = message.strip_prefix("timeout: ") {
                        (FailKind::TimedOut, m.to_string())
                    } else {
                        (FailKind::Task, message)
                    };
                    failures.push(c.failure(i, kind, message));
                }
                Ok(None) => match exit {
                    Some(e) => {
                        failures.push(c.failure(i, FailKind::Died(e), "during bring-up".into()))
                    }
                    None => pending += 1,
                },
            }
        }
        if !failures.is_empty() {
            // Consequences (peers noticing the failure) follow within a few wait slices.
            let until = *settle.get_or_insert_with(|| Instant::now() + Duration::from_millis(60));
            if pending == 0 || Instant::now() >= until {
                break;
            }
        } else if pending == 0 {
            return Ok(facts.into_iter().map(Option::unwrap_or_default).collect());
        } else if Instant::now() >= deadline + GRACE {
            // The chips' own deadlines (which say what they waited for) had their chance.
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // Children that said nothing: a stopped one is a root cause.
    let waited = deadline.saturating_duration_since(Instant::now()) + timeout;
    for (i, c) in children.iter().enumerate() {
        if facts[i].is_none()
            && !failures.iter().any(|f| f.child == i)
            && (pto_shm::process::is_stopped(c.pid.pid) || c.exit().is_some())
        {
            failures.push(c.silence(i, waited.min(timeout + GRACE), "bring-up"));
        }
    }
    if failures.is_empty() {
        {
            let up = facts.iter().filter(|f| f.is_some()).count();
            let pending = children.len() - up;
            let waiting: Vec<&str> = children
                .iter()
                .enumerate()
                .filter(|(i, _)| facts[*i].is_none())
                .map(|(_, c)| c.who.as_str())
                .take(8)
                .collect();
            return Err(WorkerError::Timeout(format!(
                "bring-up did not finish within {timeout:?}: {up} of {} children up, still starting: {}{} (raise PTO_WAIT_TIMEOUT_MS, or run fewer chips)",
                children.len(),
                waiting.join(", "),
                if pending > waiting.len() { ", ..." } else { "" }
            )));
        }
    }
    let mut report = RunFailure::from_failures(failures)
        .ok_or_else(|| WorkerError::Timeout("bring-up failed".into()))?;
    if report.root.kind == FailKind::TimedOut {
        report.root.message.push_str(&format!(
            " (bring-up of {} children did not finish in time: raise PTO_WAIT_TIMEOUT_MS, or run fewer chips)",
            children.len()
        ));
    }
    Err(WorkerError::Boot {
        who: report.root.who.clone(),
        message: report.to_string(),
        report: Box::new(report),
    })
}

/// How often the watcher looks: every 20 ms for up to 64 children, less often for more (each
/// look is one `waitpid` per child).
fn interval(children: usize) -> Duration {
    if children <= 64 {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(100)
    }
}

/// Starts the thread that notices a child's death in any phase: it records the failure (with
/// the exit status and time), marks the Worker unusable, and outside a run calls the Worker's
/// `on_child_exit` hook. It ends when the Worker closes.
pub(crate) fn spawn_watcher(state: Arc<HostState>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pto-worker-watch".into())
        .spawn(move || {
            let every = interval(state.children.len());
            let mut noticed = vec![false; state.children.len()];
            while !state.closing.load(Ordering::Acquire) {
                for (i, c) in state.children.iter().enumerate() {
                    if noticed[i] {
                        continue;
                    }
                    let Some(exit) = c.exit() else { continue };
                    noticed[i] = true;
                    // Its peers stop waiting for it (a chip that left cleanly is not marked).
                    if let (true, Some(d)) = (i < state.chips, &state.deaths) {
                        d.ended(i, c.pid.pid);
                    }
                    // The Worker killed it after recording why (a stopped or silent child).
                    if c.killed.load(Ordering::Acquire) {
                        continue;
                    }
                    // Closing, or a signal is ending this process (it killed the child).
                    if state.closing.load(Ordering::Acquire) || pto_shm::cleanup::terminating() {
                        break;
                    }
                    let f = c.failure(i, FailKind::Died(exit), String::new());
                    tracing::info!(child = c.who, pid = c.pid.pid, %exit, "child ended unexpectedly");
                    state.note_failure(f.clone());
                    if !state.in_run.load(Ordering::Acquire) {
                        if let Some(hook) = &state.on_exit {
                            hook(&f);
                        }
                    }
                }
                std::thread::park_timeout(every);
            }
        })
}

/// Asks every child to leave, waits up to `grace`, then kills and reaps the rest.
pub(crate) fn reap_all(children: &[ChildHandle], grace: Duration) {
    for c in children {
        c.shutdown();
    }
    let deadline = Instant::now() + grace;
    for c in children {
        // A stopped child cannot leave on its own: no grace for it.
        if c.running() && pto_shm::process::is_stopped(c.pid.pid) {
            c.kill();
        }
        while c.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if c.running() {
            tracing::debug!(
                child = c.who,
                pid = c.pid.pid,
                "child did not leave: killed"
            );
            c.kill();
            let t = Instant::now();
            while c.running() && t.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}
