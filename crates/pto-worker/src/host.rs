//! The host's side of its children: a handle per child process (its exit, kill, failure
//! records) and the state host kernels reach through the host chip's extension ([`HostState`]:
//! send a frame to a child, collect the results of frames already sent, note failures).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pto_shm::process::{ProcessId, Reaped};

use crate::failure::{ChildExit, ChildFailure, FailKind};
use crate::mailbox::Mailbox;
use crate::pipe::Pipe;
use crate::spec::{ExitHook, Spec};

/// Extra time the host gives a child past the wait deadline, so that a child's own deadline
/// error (which says what it waited for) arrives before the host gives up on it.
pub(crate) const GRACE: Duration = Duration::from_millis(300);

/// One child process, from the parent's side.
pub(crate) struct ChildHandle {
    pub(crate) who: String,
    pub(crate) pid: ProcessId,
    /// Its mailbox lanes (the first also carries the bootstrap record); see [`crate::pipe`].
    pub(crate) lanes: Vec<Mailbox>,
    /// Its frames in flight.
    pub(crate) pipe: Mutex<Pipe>,
    /// The generation of the last result taken (or failed), for lock-free polls.
    pub(crate) taken: AtomicU64,
    /// Lock-free polls so far (one in [`crate::pipe`]'s `LOOK_POLLS` looks after the child).
    pub(crate) polls: std::sync::atomic::AtomicU32,
    /// How it ended, once it is reaped.
    exit: Mutex<Option<ChildExit>>,
    /// True once the Worker itself killed it (after recording why): its death is then no news.
    pub(crate) killed: std::sync::atomic::AtomicBool,
    /// An in-process child's thread (its result is the exit code), until it is joined; `None`
    /// for a forked child.
    thread: Option<Mutex<Option<std::thread::JoinHandle<i32>>>>,
}

impl ChildHandle {
    /// A forked child; registered to be killed if a signal ends this process.
    pub(crate) fn new(who: String, pid: ProcessId, lanes: Vec<Mailbox>) -> ChildHandle {
        pto_shm::cleanup::register_child(pid.pid);
        tracing::debug!(child = who, pid = pid.pid, "child forked");
        ChildHandle::with(who, pid, lanes, None)
    }

    /// A child that is a thread of this process ([`crate::WorkerBuilder::in_process`]); its
    /// pid is this process's, and it is not registered to be killed.
    pub(crate) fn thread(
        who: String,
        lanes: Vec<Mailbox>,
        handle: std::thread::JoinHandle<i32>,
    ) -> ChildHandle {
        tracing::debug!(child = who, "child thread started");
        ChildHandle::with(
            who,
            ProcessId::current(),
            lanes,
            Some(Mutex::new(Some(handle))),
        )
    }

    fn with(
        who: String,
        pid: ProcessId,
        lanes: Vec<Mailbox>,
        thread: Option<Mutex<Option<std::thread::JoinHandle<i32>>>>,
    ) -> ChildHandle {
        ChildHandle {
            who,
            pid,
            lanes,
            pipe: Mutex::new(Pipe::new()),
            taken: AtomicU64::new(0),
            polls: std::sync::atomic::AtomicU32::new(0),
            exit: Mutex::new(None),
            killed: std::sync::atomic::AtomicBool::new(false),
            thread,
        }
    }

    /// True for a child that is a thread of this process.
    pub(crate) fn in_process(&self) -> bool {
        self.thread.is_some()
    }

    /// How the child ended, reaping it if it just did; `None` while it runs (or is stopped).
    /// One `waitpid` call, no `/proc` read.
    pub(crate) fn exit(&self) -> Option<ChildExit> {
        let mut e = self.exit.lock();
        if let (None, Some(t)) = (*e, &self.thread) {
            let mut t = t.lock();
            if t.as_ref().is_some_and(std::thread::JoinHandle::is_finished) {
                // A thread that panicked outside any task ends like a process that failed.
                let code = t.take().map_or(101, |h| h.join().unwrap_or(101));
                tracing::debug!(child = self.who, code, "child thread ended");
                *e = Some(ChildExit::Code(code));
            }
            return *e;
        }
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

    /// The lane that carries the bootstrap record.
    pub(crate) fn boot_lane(&self) -> &Mailbox {
        &self.lanes[0]
    }

    /// Asks the child to leave, on every lane (it waits on one of them).
    pub(crate) fn shutdown(&self) {
        for l in &self.lanes {
            l.shutdown();
        }
    }

    pub(crate) fn running(&self) -> bool {
        self.exit().is_none()
    }

    /// Sends `SIGKILL` unless the child was reaped (its pid may belong to another process).
    /// A thread cannot be killed: it is asked to leave, and marked as killed so that its end
    /// is no news.
    pub(crate) fn kill(&self) {
        let e = self.exit.lock();
        if e.is_none() {
            self.killed.store(true, Ordering::Release);
            if self.in_process() {
                self.shutdown();
            } else {
                pto_shm::process::kill(self.pid.pid);
            }
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
                    "{what} got no answer within {waited:.1?} (busy in code that never returns? \
                     a chip task that truly runs longer needs a longer timeout: \
                     PTO_WAIT_TIMEOUT_MS or WorkerBuilder::timeout)"
                ),
            ),
        }
    }
}

/// The host's view of its children, reachable from host kernels (the host chip's extension).
pub(crate) struct HostState {
    pub(crate) children: Vec<ChildHandle>,
    pub(crate) chips: usize,
    pub(crate) subs: usize,
    pub(crate) timeout: Duration,
    pub(crate) run: AtomicU64,
    /// Set once a child is gone or lost: the Worker cannot run any more.
    pub(crate) broken: Mutex<Option<String>>,
    /// Every child failure seen since the last run started.
    pub(crate) failures: Mutex<Vec<ChildFailure>>,
    pub(crate) in_run: AtomicBool,
    pub(crate) closing: AtomicBool,
    /// Why [`Worker::abort`](crate::Worker::abort) ended the Worker.
    pub(crate) aborted: Mutex<Option<String>>,
    pub(crate) on_exit: Option<Arc<ExitHook>>,
    pub(crate) traces: Mutex<Vec<String>>,
    pub(crate) tracing: AtomicBool,
    /// Where the chips' deaths are published for their peers (when they communicate).
    pub(crate) deaths: Option<pto_comm::shm::Deaths>,
    /// Itself, for the conditions of deferred host tasks (they outlive a kernel's borrow).
    pub(crate) me: std::sync::Weak<HostState>,
}

/// What a child's result status means: 0 success, 1 its task failed, 2 the frame or the child
/// was bad, 3 its task failed because of another child, 4 a wait on the others ran out.
pub(crate) fn kind_of(status: u32) -> FailKind {
    match status {
        3 => FailKind::Consequence,
        4 => FailKind::TimedOut,
        _ => FailKind::Task,
    }
}

impl HostState {
    /// The state of a Worker whose `children` are up, none failed yet.
    pub(crate) fn new(
        children: Vec<ChildHandle>,
        spec: &Spec,
        on_exit: Option<Arc<ExitHook>>,
        deaths: Option<pto_comm::shm::Deaths>,
    ) -> Arc<HostState> {
        Arc::new_cyclic(|me| HostState {
            children,
            chips: spec.chips,
            subs: spec.subs,
            timeout: spec.timeout,
            run: AtomicU64::new(0),
            broken: Mutex::new(None),
            failures: Mutex::new(Vec::new()),
            in_run: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            aborted: Mutex::new(None),
            on_exit,
            traces: Mutex::new(Vec::new()),
            tracing: AtomicBool::new(false),
            deaths,
            me: me.clone(),
        })
    }

    /// Keeps a failure; a child that is gone or lost makes the Worker unusable.
    pub(crate) fn note_failure(&self, f: ChildFailure) {
        if matches!(
            f.kind,
            FailKind::Died(_) | FailKind::Stopped | FailKind::NoAnswer
        ) {
            self.broken.lock().get_or_insert_with(|| f.to_string());
        }
        self.failures.lock().push(f);
    }
}
