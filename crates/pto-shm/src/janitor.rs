//! The janitor: removes a process's segments after it was killed with `SIGKILL`.
//!
//! A process ended by `SIGKILL` (or the OOM killer) runs no handler, so [`crate::cleanup`]
//! cannot remove its segments. Before a process creates its first segment it starts a janitor,
//! in the manner of Python's `multiprocessing` resource tracker: a `/bin/sh` in a process group
//! of its own, whose standard input is the read end of a pipe whose write end only this process
//! (and the children it forks) hold. The janitor reads until end-of-file, which comes when every
//! holder has ended, however it ended; then, unless the creator's pid still runs (it ran `exec`,
//! which closes the write end), it removes `/dev/shm/pto.<pid>.*`. After a clean exit
//! the creator has removed its segments already and the janitor finds nothing.
//!
//! The janitor holds no file of the creator's but the pipe (every other descriptor is closed at
//! its `exec`), so a pipe or socket the program shares with other processes never stays open
//! because of it, and a terminal's Ctrl-C (sent to the foreground process group) does not end
//! it. Where `/bin/sh` cannot be started, segments are created without a janitor (logged at
//! debug level), as before: `pto clean` and the next `pto run` remove what is left.
//!
//! See `docs/design/failures.md`, "Signal cleanup".

#![allow(unsafe_code)]

use std::os::fd::IntoRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The pid of the process that started a janitor (a forked child inherits it, and starts its
/// own only for segments named after itself).
static STARTED_FOR: AtomicU32 = AtomicU32::new(0);

/// Waits for end-of-file on its input, then removes the segments named after `$1` unless that
/// pid runs again (a zombie, which `kill -0` would call alive, counts as ended).
const SCRIPT: &str = "while read -r _; do :; done; s=X; \
    { while read -r k v _; do if [ \"$k\" = State: ]; then s=$v; break; fi; done; } < /proc/\"$1\"/status; \
    case $s in Z|X) exec rm -f -- /dev/shm/pto.\"$1\".*;; esac";

/// Starts this process's janitor before it creates segment `name`, once per process, when the
/// name is this process's own (`/pto.<this pid>.…`): segments a forked child names after its
/// parent are covered by the parent's janitor, which also waits for that child.
pub(crate) fn ensure_for(name: &str) {
    let me = std::process::id();
    let owner = name
        .strip_prefix("/pto.")
        .and_then(|r| r.split('.').next())
        .and_then(|p| p.parse::<u32>().ok());
    if owner != Some(me) || STARTED_FOR.swap(me, Ordering::AcqRel) == me {
        return;
    }
    match start(me) {
        Ok(pid) => tracing::debug!(janitor = pid, "janitor started"),
        Err(e) => {
            tracing::debug!(error = %e, "no janitor: segments left by a SIGKILL stay until `pto clean`")
        }
    }
}

fn start(me: u32) -> std::io::Result<u32> {
    // Both ends close-on-exec: only the janitor's standard input survives its exec.
    let (read, write) = std::io::pipe()?;
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(SCRIPT)
        .arg("pto-janitor")
        .arg(me.to_string())
        .stdin(Stdio::from(read))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec, after its standard streams
    // are in place, and only makes async-signal-safe system calls (close_range, getrlimit,
    // fcntl) on its own descriptor table.
    unsafe {
        cmd.pre_exec(|| {
            close_on_exec_from(3);
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(cmd);
    // The write end stays open for the rest of this process's life (and in the children it
    // forks); nobody writes to it.
    let _ = write.into_raw_fd();
    Ok(child.id())
}

/// Marks every descriptor from `first` up close-on-exec (in a child about to `exec`).
fn close_on_exec_from(first: u32) {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes this process's descriptor flags.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if r == 0 {
        return;
    }
    // A kernel before 5.11: one fcntl per possible descriptor.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(65_536) as libc::c_int
    } else {
        4096
    };
    for fd in first as libc::c_int..max {
        // SAFETY: fcntl on a descriptor number that may not be open fails with EBADF, harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}
