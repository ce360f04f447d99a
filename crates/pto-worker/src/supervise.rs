//! Watching the children: their exits (with status and time), a watcher thread that notices a
//! death in any phase (between runs too), and shutdown.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pto_shm::process::{ProcessId, Reaped};

use crate::failure::{ChildExit, ChildFailure, FailKind};
use crate::mailbox::Mailbox;
use crate::HostState;

/// One child process, from the parent's side.
pub(crate) struct ChildHandle {
    pub(crate) who: String,
    pub(crate) pid: ProcessId,
    pub(crate) mailbox: Mailbox,
    /// Held while a task runs on this child; counts frames sent.
    pub(crate) generation: Mutex<u64>,
    /// How it ended, once it is reaped.
    exit: Mutex<Option<ChildExit>>,
}

impl ChildHandle {
    /// A forked child; registered to be killed if a signal ends this process.
    pub(crate) fn new(who: String, pid: ProcessId, mailbox: Mailbox) -> ChildHandle {
        pto_shm::cleanup::register_child(pid.pid);
        tracing::debug!(child = who, pid = pid.pid, "child forked");
        ChildHandle {
            who,
            pid,
            mailbox,
            generation: Mutex::new(0),
            exit: Mutex::new(None),
        }
    }

    /// How the child ended, reaping it if it just did; `None` while it runs (or is stopped).
    /// One `waitpid` call, no `/proc` read.
    pub(crate) fn exit(&self) -> Option<ChildExit> {
        let mut e = self.exit.lock();
        if e.is_none() {
            *e = pto_shm::process::reap(self.pid.pid).map(|r| {
                pto_shm::cleanup::forget(self.pid.pid);
                let exit = match r {
                    Reaped::Exited(c) => ChildExit::Code(c),
                    Reaped::Signaled(s) => ChildExit::Signal(s),
                    Reaped::Unknown => ChildExit::Unknown,
                };
                tracing::debug!(child = self.who, pid = self.pid.pid, %exit, "child ended");
                exit
            });
        }
        *e
    }

    pub(crate) fn running(&self) -> bool {
        self.exit().is_none()
    }

    /// Sends `SIGKILL` unless the child was reaped (its pid may belong to another process).
    pub(crate) fn kill(&self) {
        let e = self.exit.lock();
        if e.is_none() {
            pto_shm::process::kill(self.pid.pid);
        }
    }

    /// A failure record for this child, seen now.
    pub(crate) fn failure(&self, child: usize, kind: FailKind, message: String) -> ChildFailure {
        ChildFailure {
            child,
            who: self.who.clone(),
            pid: self.pid.pid,
            kind,
            message,
            at: Instant::now(),
        }
    }

    /// Why this child did not answer `what` by its deadline: stopped, or running but silent.
    pub(crate) fn silence(&self, child: usize, waited: Duration, what: &str) -> ChildFailure {
        match self.exit() {
            Some(e) => self.failure(child, FailKind::Died(e), String::new()),
            None if pto_shm::process::is_stopped(self.pid.pid) => self.failure(
                child,
                FailKind::Stopped,
                format!("{what} got no answer within {waited:.1?}"),
            ),
            None => self.failure(
                child,
                FailKind::NoAnswer,
                format!(
                    "{what} got no answer within {waited:.1?} (busy in code that never returns?)"
                ),
            ),
        }
    }
}

/// Asks every child to leave, waits up to `grace`, then kills and reaps the rest.
pub(crate) fn reap_all(children: &[ChildHandle], grace: Duration) {
    for c in children {
        c.mailbox.shutdown();
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
