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

use std::ffi::CString;
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
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
    let pid = match spawn_closing_fds(me, read.as_raw_fd())? {
        Some(pid) => pid,
        None => spawn_with_fork(me, read)?,
    };
    // The write end stays open for the rest of this process's life (and in the children it
    // forks); nobody writes to it.
    let _ = write.into_raw_fd();
    Ok(pid)
}

type AddCloseFrom =
    unsafe extern "C" fn(*mut libc::posix_spawn_file_actions_t, libc::c_int) -> libc::c_int;

/// `posix_spawn` (a `vfork`: no copy of this process's page tables, about 0.2 ms against 0.7
/// for `fork` here, which made a 9 ms `pto run` 20 % slower) with every descriptor from 3 up
/// closed in the child: glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34), looked up
/// at run time so that an older C library still links. `None` when it is missing.
#[allow(clippy::transmute_ptr_to_ptr)]
fn spawn_closing_fds(me: u32, read: RawFd) -> std::io::Result<Option<u32>> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    let sym = unsafe {
        libc::dlsym(
            libc::RTLD_DEFAULT,
            c"posix_spawn_file_actions_addclosefrom_np".as_ptr(),
        )
    };
    if sym.is_null() {
        return Ok(None);
    }
    // SAFETY: glibc declares the symbol with exactly this signature.
    let closefrom: AddCloseFrom =
        unsafe { std::mem::transmute::<*mut libc::c_void, AddCloseFrom>(sym) };
    let script = CString::new(SCRIPT).map_err(std::io::Error::other)?;
    let pid_arg = CString::new(me.to_string()).map_err(std::io::Error::other)?;
    let argv: [*const libc::c_char; 6] = [
        c"/bin/sh".as_ptr(),
        c"-c".as_ptr(),
        script.as_ptr(),
        c"pto-janitor".as_ptr(),
        pid_arg.as_ptr(),
        std::ptr::null(),
    ];
    let envp: [*const libc::c_char; 2] = [c"PATH=/usr/bin:/bin".as_ptr(), std::ptr::null()];
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(rc))
        }
    };
    // SAFETY: the file actions and attributes are initialised before use and destroyed once,
    // on every path; every pointer handed to posix_spawn outlives the call (the C strings and
    // arrays above); `read` is an open descriptor.
    unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        check(libc::posix_spawn_file_actions_init(&mut fa))?;
        if let Err(e) = check(libc::posix_spawnattr_init(&mut attr)) {
            libc::posix_spawn_file_actions_destroy(&mut fa);
            return Err(e);
        }
        let mut pid: libc::pid_t = 0;
        let result = (|| {
            check(libc::posix_spawn_file_actions_adddup2(&mut fa, read, 0))?;
            check(libc::posix_spawn_file_actions_addopen(
                &mut fa,
                1,
                c"/dev/null".as_ptr(),
                libc::O_WRONLY,
                0,
            ))?;
            check(libc::posix_spawn_file_actions_adddup2(&mut fa, 1, 2))?;
            check(closefrom(&mut fa, 3))?;
            // A group of its own (a terminal's Ctrl-C does not reach it), no blocked signal,
            // and the default action for those this process ignores or handles.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            let mut dfl: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut dfl);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
                libc::sigaddset(&mut dfl, sig);
            }
            check(libc::posix_spawnattr_setpgroup(&mut attr, 0))?;
            check(libc::posix_spawnattr_setsigmask(&mut attr, &none))?;
            check(libc::posix_spawnattr_setsigdefault(&mut attr, &dfl))?;
            check(libc::posix_spawnattr_setflags(
                &mut attr,
                (libc::POSIX_SPAWN_SETPGROUP
                    | libc::POSIX_SPAWN_SETSIGMASK
                    | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
            ))?;
            check(libc::posix_spawn(
                &mut pid,
                c"/bin/sh".as_ptr(),
                &fa,
                &attr,
                argv.as_ptr().cast(),
                envp.as_ptr().cast(),
            ))
        })();
        libc::posix_spawnattr_destroy(&mut attr);
        libc::posix_spawn_file_actions_destroy(&mut fa);
        result.map(|()| Some(pid as u32))
    }
}

/// The portable way, for a C library without `addclosefrom_np`: `fork`, then every
/// descriptor from 3 up marked close-on-exec before the `exec`.
fn spawn_with_fork(me: u32, read: std::io::PipeReader) -> std::io::Result<u32> {
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
    // Not waited for: it ends after this process does.
    Ok(cmd.spawn()?.id())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::{Duration, Instant};

    fn dead_pid() -> u32 {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    }

    /// A janitor started by `spawn` for a process that has ended removes its segments once
    /// the pipe's write end is closed, not before.
    fn removes_after_the_end(spawn: impl Fn(u32, std::io::PipeReader) -> std::io::Result<u32>) {
        let pid = dead_pid();
        let path = format!("/dev/shm/pto.{pid}.00000000000ba5ed.janitor-test");
        std::fs::write(&path, b"x").unwrap();
        let (read, write) = std::io::pipe().unwrap();
        spawn(pid, read).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(std::path::Path::new(&path).exists(), "removed too early");
        drop(write);
        let t = Instant::now();
        while std::path::Path::new(&path).exists() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let left = std::path::Path::new(&path).exists();
        let _ = std::fs::remove_file(&path);
        assert!(!left, "the janitor did not remove {path}");
    }

    #[test]
    fn the_posix_spawn_janitor_removes_a_dead_creators_segments() {
        removes_after_the_end(|pid, read| {
            spawn_closing_fds(pid, read.as_raw_fd())?
                .ok_or_else(|| std::io::Error::other("no addclosefrom_np in this C library"))
        });
    }

    #[test]
    fn the_fork_janitor_removes_a_dead_creators_segments() {
        removes_after_the_end(spawn_with_fork);
    }
}
