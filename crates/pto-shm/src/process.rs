//! Process identity and liveness.
//!
//! A pid alone is not an identity: pids are reused. A [`ProcessId`] pairs the pid with the
//! process's start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`), so a recycled
//! pid is not mistaken for the original process. A zombie (killed, not yet reaped) counts as
//! dead.

use std::fmt;

/// A process: pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    /// The pid.
    pub pid: u32,
    /// Start time in clock ticks since boot (0 when unknown).
    pub start: u64,
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)
    }
}

/// State letter and start time of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: parse after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields after the name start at field 3 (state); start time is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

impl ProcessId {
    /// This process.
    pub fn current() -> ProcessId {
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        ProcessId {
            pid,
            start: stat(pid).map_or(0, |s| s.1),
        }
    }

    /// True while the process exists, is not a zombie, and has the same start time.
    pub fn is_alive(&self) -> bool {
        match stat(self.pid) {
            Some((state, start)) => {
                !matches!(state, 'Z' | 'X' | 'x') && (self.start == 0 || start == self.start)
            }
            None => false,
        }
    }
}

/// Asks the kernel to send `SIGKILL` to this process when its parent thread exits, then checks
/// that the parent is still `parent` (closing the race where it died before the request).
///
/// # Errors
///
/// The `prctl` error, or `Err` when the parent already changed.
pub fn die_with_parent(parent: u32) -> std::io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    let now = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    if now != parent {
        return Err(std::io::Error::other(format!(
            "parent {parent} already exited (parent is now {now})"
        )));
    }
    Ok(())
}

/// Makes the process `cmd` starts get `SIGKILL` when this process dies (set up between fork
/// and exec with [`die_with_parent`]): a launcher's ranks never outlive it.
#[allow(unsafe_code)]
pub fn die_with_this_process(cmd: &mut std::process::Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl and
    // getppid, which are async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || die_with_parent(parent));
    }
}

/// Nanoseconds on `CLOCK_MONOTONIC`: one clock for every process on the host (traces of
/// several processes line up on it).
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Milliseconds on the coarse monotonic clock (the same clock as [`monotonic_ns`], read from
/// the last timer tick: a few nanoseconds instead of a full clock read, and up to a tick, a
/// few milliseconds, behind). For timestamps that only need milliseconds, taken on hot paths.
pub fn monotonic_coarse_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    (t.tv_sec as u64).saturating_mul(1_000) + t.tv_nsec as u64 / 1_000_000
}

/// Number of threads of this process (from `/proc/self/status`).
pub fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Bytes of memory the kernel says can be had without swapping (`MemAvailable` in
/// `/proc/meminfo`), or `None` when unknown.
pub fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// What `fork` returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forked {
    /// In the parent: the child's identity.
    Parent(ProcessId),
    /// In the child.
    Child,
}

/// Forks this process.
///
/// # Errors
///
/// The `fork` error.
///
/// # Safety
///
/// The process must be single-threaded (see [`thread_count`]): in a multi-threaded process the
/// child inherits locks held by threads that do not exist in it. The child must not return into
/// code that assumes it is the parent (it should run its own loop and leave with [`exit_now`]).
#[allow(unsafe_code)]
pub unsafe fn fork() -> std::io::Result<Forked> {
    // SAFETY: per this function's contract the process is single-threaded.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => {
            let pid = p as u32;
            // The child's start time: read it now (it exists until we reap it).
            let start = stat(pid).map_or(0, |s| s.1);
            Ok(Forked::Parent(ProcessId { pid, start }))
        }
    }
}

/// Ends this process at once with `code`, without running destructors or `atexit` handlers
/// (what a forked child does when it is done).
#[allow(unsafe_code)]
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

/// Sends `SIGKILL` to `pid`.
pub fn kill(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// How a reaped child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaped {
    /// It exited with this code.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
    /// It is gone, but not as a child of this process (already reaped elsewhere).
    Unknown,
}

/// Reaps `pid` if it has ended; `None` while it runs (or is stopped).
pub fn reap(pid: u32) -> Option<Reaped> {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return Some(Reaped::Unknown);
    };
    match rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG) {
        Ok(Some((_, st))) => Some(match (st.exit_status(), st.terminating_signal()) {
            (Some(c), _) => Reaped::Exited(c),
            (_, Some(s)) => Reaped::Signaled(s),
            _ => Reaped::Unknown,
        }),
        Ok(None) => None,
        Err(_) => Some(Reaped::Unknown),
    }
}

/// Reaps `pid` if it has exited: `Some(exit code, or 128 + signal)`, `None` while it runs.
pub fn try_reap(pid: u32) -> Option<i32> {
    reap(pid).map(|r| match r {
        Reaped::Exited(c) => c,
        Reaped::Signaled(s) => 128 + s,
        Reaped::Unknown => -1,
    })
}

/// True when child `pid` has ended, without reaping it (its parent, or whoever else waits for
/// it, still gets its status); also true when it is gone already (reaped elsewhere).
pub fn ended_unreaped(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return true;
    };
    let opts = rustix::process::WaitIdOptions::EXITED
        | rustix::process::WaitIdOptions::NOHANG
        | rustix::process::WaitIdOptions::NOWAIT;
    match rustix::process::waitid(rustix::process::WaitId::Pid(p), opts) {
        Ok(Some(_)) => true,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// The state letter of `pid` in `/proc/<pid>/stat` (`R` running, `S` sleeping, `T` stopped,
/// `t` stopped by a debugger, `Z` zombie...), or `None` when it does not exist.
pub fn state(pid: u32) -> Option<char> {
    stat(pid).map(|s| s.0)
}

/// True when `pid` is stopped (by `SIGSTOP`/`SIGTSTP` or a debugger).
pub fn is_stopped(pid: u32) -> bool {
    matches!(state(pid), Some('T' | 't'))
}

/// This process's parent pid.
pub fn parent_pid() -> u32 {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        let me = ProcessId::current();
        assert!(me.start > 0);
        assert!(me.is_alive());
        assert!(!ProcessId {
            pid: me.pid,
            start: me.start + 1
        }
        .is_alive());
        assert!(!ProcessId {
            pid: u32::MAX - 1,
            start: 0
        }
        .is_alive());
    }

    #[test]
    fn a_reaped_child_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = ProcessId {
            pid: child.id(),
            start: 0,
        };
        child.wait().unwrap();
        assert!(!id.is_alive());
    }
}
