//! What went wrong in a Worker, child by child, with the root cause first.
//!
//! Every failure a Worker observes (a chip's failed task, a child's death with its signal, a
//! child that stopped answering, a failed bring-up) is kept with the time it was seen. A
//! report leads with the *root cause*: the first failure in time that is not a consequence of
//! another (a peer that died, an abort, a wait on others that ran out), then lists the
//! failures that followed from it.

use std::fmt;
use std::time::Instant;

/// How a child process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// It is gone, but its status could not be collected.
    Unknown,
}

/// The usual name of a signal number.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => "a signal",
    }
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChildExit::Code(c) => write!(f, "exited with code {c}"),
            ChildExit::Signal(s) => write!(f, "was killed by signal {s} ({})", signal_name(*s)),
            ChildExit::Unknown => write!(f, "is gone (exit status unknown)"),
        }
    }
}

/// What kind of failure a child had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailKind {
    /// Its task (or bring-up) failed on its own: a kernel's error, a bad argument.
    Task,
    /// Its task failed because another child died, failed or aborted first: a consequence.
    Consequence,
    /// Its task failed because a wait on other children ran out: a consequence of whoever did
    /// not arrive, and the root cause only when no child failed otherwise.
    TimedOut,
    /// The process ended.
    Died(ChildExit),
    /// The process is stopped (`SIGSTOP`, `SIGTSTP`, a debugger) and did not answer in time.
    Stopped,
    /// The process runs but did not answer its task in time.
    NoAnswer,
}

impl FailKind {
    /// 0 for a root cause, 1 for a wait that ran out, 2 for a consequence of a named peer.
    fn rank(&self) -> u8 {
        match self {
            FailKind::TimedOut => 1,
            FailKind::Consequence => 2,
            _ => 0,
        }
    }
}

/// One child's failure.
#[derive(Clone, Debug)]
pub struct ChildFailure {
    /// The child's index (chips first, then sub-workers, then child Workers).
    pub child: usize,
    /// Its name, for example `chip 2`.
    pub who: String,
    /// Its pid.
    pub pid: u32,
    /// What happened.
    pub kind: FailKind,
    /// The message (the task's error, or what was awaited).
    pub message: String,
    /// When the Worker saw it.
    pub at: Instant,
}

impl fmt::Display for ChildFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pid {})", self.who, self.pid)?;
        match &self.kind {
            FailKind::Died(exit) => write!(f, " {exit}")?,
            FailKind::Stopped => write!(f, " is stopped and stopped answering")?,
            FailKind::NoAnswer => write!(f, " stopped answering")?,
            FailKind::Task | FailKind::Consequence | FailKind::TimedOut => {}
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

/// Everything that failed in one run (or bring-up), the root cause first.
#[derive(Clone, Debug)]
pub struct RunFailure {
    /// The root cause: the first failure in time that is not a consequence of another (or the
    /// first failure, when all are consequences).
    pub root: ChildFailure,
    /// The failures that followed, in the order they were seen (one per child).
    pub others: Vec<ChildFailure>,
    /// The host run's own error, when the failures ended a run (how many host tasks failed
    /// or were poisoned).
    pub host: Option<pto_core::RunError>,
}

impl RunFailure {
    /// Orders `failures` (any order) into a report; `None` when there are none. A child that
    /// failed more than once is listed once, with its first root-cause failure if it had one.
    pub fn from_failures(mut failures: Vec<ChildFailure>) -> Option<RunFailure> {
        failures.sort_by_key(|f| (f.kind.rank(), f.at));
        let mut seen = Vec::new();
        failures.retain(|f| {
            let first = !seen.contains(&f.child);
            seen.push(f.child);
            first
        });
        if failures.is_empty() {
            return None;
        }
        let root = failures.remove(0);
        failures.sort_by_key(|f| f.at);
        Some(RunFailure {
            root,
            others: failures,
            host: None,
        })
    }

    /// Every failure, the root cause first.
    pub fn all(&self) -> impl Iterator<Item = &ChildFailure> {
        std::iter::once(&self.root).chain(&self.others)
    }
}

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The root cause, then the first consequences in time; the rest counted (every one
        // is in `others`, and in `pto run --json`'s per-rank list).
        const SHOWN: usize = 8;
        write!(f, "{}", self.root)?;
        if !self.others.is_empty() {
            write!(f, "; then")?;
            for (i, o) in self.others.iter().take(SHOWN).enumerate() {
                write!(f, "{} {o}", if i == 0 { "" } else { ";" })?;
            }
            if self.others.len() > SHOWN {
                write!(f, "; and {} more", self.others.len() - SHOWN)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn f(child: usize, kind: FailKind, ms: u64, t0: Instant) -> ChildFailure {
        ChildFailure {
            child,
            who: format!("chip {child}"),
            pid: 100 + child as u32,
            kind,
            message: String::new(),
            at: t0 + Duration::from_millis(ms),
        }
    }

    #[test]
    fn the_root_cause_is_the_first_failure_that_is_not_a_consequence() {
        let t0 = Instant::now();
        // Chips 0 and 1 time out waiting (consequences, seen first); chip 2 is found stopped
        // later: it is the root cause.
        let r = RunFailure::from_failures(vec![
            f(0, FailKind::Consequence, 10, t0),
            f(2, FailKind::Stopped, 30, t0),
            f(1, FailKind::Consequence, 20, t0),
        ])
        .unwrap();
        assert_eq!(r.root.child, 2);
        assert_eq!(r.others.iter().map(|o| o.child).collect::<Vec<_>>(), [0, 1]);
        // Only consequences: the first in time leads, a wait that ran out before a failure
        // that names a peer (the peer only noticed the one that gave up).
        let r = RunFailure::from_failures(vec![
            f(1, FailKind::Consequence, 20, t0),
            f(0, FailKind::Consequence, 10, t0),
        ])
        .unwrap();
        assert_eq!(r.root.child, 0);
        let r = RunFailure::from_failures(vec![
            f(1, FailKind::Consequence, 20, t0),
            f(2, FailKind::TimedOut, 30, t0),
        ])
        .unwrap();
        assert_eq!(r.root.child, 2);
        // A child listed twice (its task failed, then it died) appears once.
        let r = RunFailure::from_failures(vec![
            f(3, FailKind::Died(ChildExit::Signal(9)), 5, t0),
            f(3, FailKind::Task, 1, t0),
        ])
        .unwrap();
        assert_eq!(r.others.len(), 0);
        assert_eq!(r.root.kind, FailKind::Task);
        assert!(RunFailure::from_failures(Vec::new()).is_none());
        assert!(f(3, FailKind::Died(ChildExit::Signal(9)), 0, t0)
            .to_string()
            .contains("killed by signal 9 (SIGKILL)"));
    }
}
