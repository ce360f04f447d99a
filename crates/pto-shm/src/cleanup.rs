//! What a process leaves behind when a signal ends it: its children and its segments.
//!
//! `Drop` cannot run when `SIGINT`, `SIGTERM` or `SIGHUP` ends a process, so a run stopped with
//! Ctrl-C would leave its chip processes running (until their parent-death signal) and its
//! segments in `/dev/shm`. [`install`] puts a handler on those signals (only where their
//! disposition is still the default: a handler of the application's own, such as Python's
//! `KeyboardInterrupt`, is left alone) that, using only async-signal-safe system calls:
//!
//! 1. kills every child this process registered ([`register_child`]; process groups such as an
//!    `mpirun` job get `SIGTERM`, then `SIGKILL` after 1.5 s),
//! 2. removes every segment in `/dev/shm` named after this process or one of those children
//!    (every pto segment's name starts with `pto.<creator pid>.`), and, when a process group was
//!    registered, every pto segment whose creator is dead (the group's ranks),
//! 3. exits with `128 + signal` (130 for `SIGINT`, 143 for `SIGTERM`, 129 for `SIGHUP`).
//!
//! The registry is a fixed table of atomics in static memory, so the handler takes no lock and
//! allocates nothing. Each entry names the process that registered it, so a forked child (which
//! inherits the table) never kills its parent's other children. [`terminate`] runs the same
//! cleanup outside a signal (a supervisor that decided to end the process).

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

const SLOTS: usize = 4096;
/// Marks an entry as a process group (killed as a group, `SIGTERM` first).
const GROUP: u64 = 1 << 31;

/// `(owner pid << 32) | pid | GROUP?`; 0 is a free slot.
static CHILDREN: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The process that installed the handlers (it alone prints a line when a signal ends it).
static INSTALLER: AtomicU32 = AtomicU32::new(0);
/// Set once a signal or [`terminate`] started ending the process.
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// What the installer prints on standard output when `SIGINT`, `SIGTERM` or `SIGHUP` (in that
/// order) ends it; null for nothing. Set by [`set_last_words`], never freed (a handler may be
/// reading an earlier one).
static LAST_WORDS: [AtomicPtr<&'static [u8]>; 3] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

/// Who prints the last words: `WORDS_ARMED` until a signal handler (`WORDS_SIGNALED`) or the
/// process's own final report (`WORDS_PRINTING`, then `WORDS_DONE`) takes the turn.
static WORDS_STATE: AtomicU32 = AtomicU32::new(WORDS_ARMED);
const WORDS_ARMED: u32 = 0;
const WORDS_SIGNALED: u32 = 1;
const WORDS_PRINTING: u32 = 2;
const WORDS_DONE: u32 = 3;

/// Segment creations under way in this process (see [`Creating`]).
static CREATING: AtomicU32 = AtomicU32::new(0);

/// Spawns under way in this process, between `fork` and the child's registration (see
/// [`spawn_registered`]).
static SPAWNING: AtomicU32 = AtomicU32::new(0);

/// True once this process is being ended by a signal or [`terminate`]: a supervisor thread
/// seeing its children die should not report that as a failure of theirs.
pub fn terminating() -> bool {
    TERMINATING.load(Ordering::SeqCst)
}

/// Held while a segment file is being created, so that a signal's cleanup (which may run on
/// another thread at any moment) waits for the file to exist before it scans `/dev/shm`; once
/// the process is ending, no new segment may start.
#[derive(Debug)]
pub(crate) struct Creating(());

impl Creating {
    /// `None` when the process is being ended: create nothing.
    pub(crate) fn begin() -> Option<Creating> {
        CREATING.fetch_add(1, Ordering::SeqCst);
        if TERMINATING.load(Ordering::SeqCst) {
            CREATING.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Creating(()))
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        CREATING.fetch_sub(1, Ordering::SeqCst);
    }
}

fn me() -> u32 {
    // SAFETY: getpid is always safe (and async-signal-safe).
    unsafe { libc::getpid() as u32 }
}

fn add(entry: u32, group: bool) -> bool {
    let v = (u64::from(me()) << 32) | u64::from(entry) | if group { GROUP } else { 0 };
    let ok = CHILDREN.iter().any(|s| {
        s.compare_exchange(0, v, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if !ok {
        tracing::warn!(
            pid = entry,
            "cleanup table full: this child is not killed on a signal"
        );
    }
    ok
}

/// Registers a child process to kill if a signal ends this process. Returns false when the
/// table is full (the child then only has its parent-death signal).
pub fn register_child(pid: u32) -> bool {
    add(pid, false)
}

/// Registers a process group (for example an `mpirun` started in a group of its own): a signal
/// sends it `SIGTERM`, then `SIGKILL`.
pub fn register_group(pgid: u32) -> bool {
    add(pgid, true)
}

/// Spawns `cmd` and registers the child ([`register_child`], or [`register_group`] when `group`:
/// the command must then start its own process group) with no moment in between where a signal
/// ending this process would miss it.
///
/// Between `spawn` returning and a plain `register_*` call the child already runs (under load
/// it can start children of its own in that gap), and a signal handled then would leave it
/// behind. Here the three signals are blocked in the calling thread for the spawn and the
/// registration, so a signal aimed at this thread waits until the child is registered, and a
/// handler running on another thread waits (at most 1 s) for spawns under way to register
/// theirs. The child starts with the calling thread's mask from before.
///
/// # Errors
///
/// The spawn's error; `Interrupted` when the process is being ended by a signal already (nothing
/// is started then).
pub fn spawn_registered(
    cmd: &mut std::process::Command,
    group: bool,
) -> std::io::Result<std::process::Child> {
    let _spawning = Spawning::begin().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "this process is being ended by a signal: nothing more is started",
        )
    })?;
    // The child would inherit the blocked signals (the standard library does not reset the
    // mask): it gets this thread's mask from before.
    let old = _spawning.old;
    // SAFETY: the closure runs in the forked child before exec and only calls pthread_sigmask,
    // which is async-signal-safe, on a copy of a plain sigset_t.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    add(child.id(), group);
    Ok(child)
}

/// A spawn under way: the three signals blocked in this thread and counted in [`SPAWNING`];
/// both undone on drop (a pending signal is then delivered).
struct Spawning {
    old: libc::sigset_t,
}

impl Spawning {
    fn begin() -> Option<Spawning> {
        // SAFETY: sigset_t is plain old data; sigemptyset/sigaddset initialise it, and
        // pthread_sigmask only changes this thread's mask (the old one is kept to restore).
        let old = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            old
        };
        SPAWNING.fetch_add(1, Ordering::SeqCst);
        let g = Spawning { old };
        if TERMINATING.load(Ordering::SeqCst) {
            return None;
        }
        Some(g)
    }
}

impl Drop for Spawning {
    fn drop(&mut self) {
        SPAWNING.fetch_sub(1, Ordering::SeqCst);
        // SAFETY: restores this thread's mask as it was before `begin`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// Forgets a child or group (once it is reaped: its pid may be reused).
pub fn forget(pid: u32) {
    let mine = u64::from(me()) << 32;
    for s in &CHILDREN {
        let v = s.load(Ordering::Acquire);
        if v != 0 && v & !GROUP & 0xffff_ffff == u64::from(pid) && v >> 32 == mine >> 32 {
            let _ = s.compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Sets what this process prints on standard output, after the cleanup, when `SIGINT`, `SIGTERM`
/// or `SIGHUP` ends it: `words(exit code)` for each (130, 143, 129), made now, so that the
/// handler only writes bytes. For a command that promises one JSON object whatever happens.
/// A later call replaces the words (the earlier ones stay allocated, a few hundred bytes).
pub fn set_last_words(words: impl Fn(i32) -> String) {
    for (slot, sig) in LAST_WORDS
        .iter()
        .zip([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
    {
        let text: &'static [u8] = Box::leak(words(128 + sig).into_bytes().into_boxed_slice());
        slot.store(Box::into_raw(Box::new(text)), Ordering::Release);
    }
}

/// The process's own final report, printed instead of the last words of [`set_last_words`]:
/// while it is held a signal's handler waits (at most 200 ms) for the report to be written
/// whole before the process exits, and prints nothing more.
#[derive(Debug)]
pub struct FinalReport(());

impl FinalReport {
    /// `None` when a signal is ending the process already: its handler prints the last words,
    /// the caller prints nothing.
    pub fn begin() -> Option<FinalReport> {
        WORDS_STATE
            .compare_exchange(
                WORDS_ARMED,
                WORDS_PRINTING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .ok()
            .map(|_| FinalReport(()))
    }
}

impl Drop for FinalReport {
    fn drop(&mut self) {
        WORDS_STATE.store(WORDS_DONE, Ordering::Release);
    }
}

/// Installs the handler on `SIGINT`, `SIGTERM` and `SIGHUP`, each only where its disposition is
/// the default. Idempotent; forked children inherit it.
pub fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    INSTALLER.store(me(), Ordering::Release);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `sigaction` is plain old data: all zeroes is a valid value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a null new action only reads the current one into `old`.
        let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        if rc != 0 || old.sa_sigaction != libc::SIG_DFL {
            tracing::debug!(
                signal = sig,
                "signal has a handler already: pto leaves it alone"
            );
            continue;
        }
        // SAFETY: `on_signal` only makes async-signal-safe calls; the mask blocks the other two
        // signals while it runs, so a second Ctrl-C cannot interrupt the cleanup.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut act.sa_mask);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut act.sa_mask, s);
            }
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
    tracing::debug!("signal cleanup installed");
}

extern "C" fn on_signal(sig: libc::c_int) {
    TERMINATING.store(true, Ordering::SeqCst);
    cleanup();
    if INSTALLER.load(Ordering::Acquire) == me() {
        let name: &[u8] = match sig {
            libc::SIGINT => b"pto: interrupted (SIGINT): children stopped, segments removed\n",
            libc::SIGTERM => b"pto: terminated (SIGTERM): children stopped, segments removed\n",
            _ => b"pto: hung up (SIGHUP): children stopped, segments removed\n",
        };
        // SAFETY: write(2) on stderr with a static buffer is async-signal-safe.
        unsafe {
            libc::write(2, name.as_ptr().cast(), name.len());
        }
        let slot = match sig {
            libc::SIGINT => 0,
            libc::SIGTERM => 1,
            _ => 2,
        };
        let words = LAST_WORDS[slot].load(Ordering::Acquire);
        let mine = WORDS_STATE
            .compare_exchange(
                WORDS_ARMED,
                WORDS_SIGNALED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if !mine {
            // The final report is being written: let it finish.
            for _ in 0..200 {
                if WORDS_STATE.load(Ordering::Acquire) != WORDS_PRINTING {
                    break;
                }
                sleep_ms(1);
            }
        } else if !words.is_null() {
            // SAFETY: a non-null slot points to a leaked `&'static [u8]` (`set_last_words`),
            // never freed; write(2) on stdout is async-signal-safe.
            unsafe {
                let w: &[u8] = *words;
                libc::write(1, w.as_ptr().cast(), w.len());
            }
        }
    }
    // SAFETY: _exit is async-signal-safe and does not return.
    unsafe { libc::_exit(128 + sig) }
}

/// Runs the cleanup (kill registered children, remove their and this process's segments), then
/// exits with `code` at once, running no destructors.
pub fn terminate(code: i32) -> ! {
    TERMINATING.store(true, Ordering::SeqCst);
    cleanup();
    // SAFETY: _exit does not return.
    unsafe { libc::_exit(code) }
}

fn sleep_ms(ms: i64) {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: ms * 1_000_000,
    };
    // SAFETY: nanosleep with a valid timespec is async-signal-safe.
    unsafe {
        libc::nanosleep(&ts, std::ptr::null_mut());
    }
}

/// Async-signal-safe: no allocation, no lock.
fn cleanup() {
    let me = me();
    // Spawns under way on other threads register their child first (this thread is not one of
    // them: they block the signals). Bounded: a spawn waits for the child's exec only.
    for _ in 0..1000 {
        if SPAWNING.load(Ordering::SeqCst) == 0 {
            break;
        }
        sleep_ms(1);
    }
    let mut groups = false;
    for s in &CHILDREN {
        let v = s.load(Ordering::Acquire);
        if v == 0 || (v >> 32) as u32 != me {
            continue;
        }
        let pid = (v & 0x7fff_ffff) as libc::pid_t;
        // SAFETY: kill is async-signal-safe.
        unsafe {
            if v & GROUP != 0 {
                groups = true;
                libc::kill(-pid, libc::SIGTERM);
            } else {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    // Wait (at most 1.5 s) until the killed children are gone: a child that had not yet
    // taken the SIGKILL could still create a segment after the sweep below, and must not be
    // left running when this process exits.
    for _ in 0..150 {
        let mut alive = false;
        for s in &CHILDREN {
            let v = s.load(Ordering::Acquire);
            if v == 0 || v & GROUP != 0 || (v >> 32) as u32 != me {
                continue;
            }
            let pid = (v & 0x7fff_ffff) as libc::pid_t;
            // SAFETY: waitpid with WNOHANG is async-signal-safe. 0 means "not yet"; the pid,
            // or -1 (already reaped elsewhere, or not our child), means gone.
            unsafe {
                let mut st = 0;
                if libc::waitpid(pid, &mut st, libc::WNOHANG) == 0 {
                    alive = true;
                }
            }
        }
        if !alive {
            break;
        }
        sleep_ms(10);
    }
    if groups {
        // Give each group (an MPI launcher and its ranks) 1.5 s to end, then kill what is left.
        for _ in 0..150 {
            let mut alive = false;
            for s in &CHILDREN {
                let v = s.load(Ordering::Acquire);
                if v & GROUP == 0 || (v >> 32) as u32 != me {
                    continue;
                }
                let pid = (v & 0x7fff_ffff) as libc::pid_t;
                // SAFETY: waitpid with WNOHANG and kill with signal 0 are async-signal-safe;
                // reaping the group leader keeps its zombie from counting as alive.
                unsafe {
                    let mut st = 0;
                    libc::waitpid(pid, &mut st, libc::WNOHANG);
                    if libc::kill(-pid, 0) == 0 {
                        alive = true;
                    }
                }
            }
            if !alive {
                break;
            }
            sleep_ms(10);
        }
        for s in &CHILDREN {
            let v = s.load(Ordering::Acquire);
            if v & GROUP != 0 && (v >> 32) as u32 == me {
                // SAFETY: as above.
                unsafe {
                    libc::kill(-((v & 0x7fff_ffff) as libc::pid_t), libc::SIGKILL);
                }
            }
        }
    }
    // Creations under way on other threads finish their file first (at most 200 ms: one may
    // be on this very thread, interrupted by this signal); none can start any more.
    for _ in 0..200 {
        if CREATING.load(Ordering::SeqCst) == 0 {
            break;
        }
        sleep_ms(1);
    }
    remove_segments(me, groups);
}

fn parse_pid(name: &[u8]) -> Option<u32> {
    let rest = name.strip_prefix(b"pto.")?;
    let mut pid = 0u32;
    let mut digits = 0;
    for &c in rest {
        if c == b'.' {
            break;
        }
        if !c.is_ascii_digit() || digits >= 9 {
            return None;
        }
        pid = pid * 10 + u32::from(c - b'0');
        digits += 1;
    }
    (digits > 0).then_some(pid)
}

fn owned(pid: u32, me: u32) -> bool {
    pid == me
        || CHILDREN.iter().any(|s| {
            let v = s.load(Ordering::Acquire);
            v != 0 && (v >> 32) as u32 == me && (v & 0x7fff_ffff) as u32 == pid
        })
}

/// Removes `/dev/shm/pto.<pid>.*` regular files for this process and its registered children;
/// with `dead_too`, also those whose creator pid no longer exists.
fn remove_segments(me: u32, dead_too: bool) {
    // SAFETY: open, getdents64, unlinkat and close are async-signal-safe system calls; the
    // buffer is on this stack and every record is bounds-checked before it is read.
    unsafe {
        let dir = libc::open(
            c"/dev/shm".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            return;
        }
        let mut buf = [0u8; 8192];
        loop {
            let n = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
            if n <= 0 {
                break;
            }
            let n = n as usize;
            let mut off = 0;
            while off + 19 < n {
                let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
                if reclen == 0 || off + reclen > n {
                    break;
                }
                let dtype = buf[off + 18];
                let name_start = off + 19;
                let name_end = buf[name_start..off + reclen]
                    .iter()
                    .position(|&b| b == 0)
                    .map_or(off + reclen, |p| name_start + p);
                let name = &buf[name_start..name_end];
                if dtype == libc::DT_REG {
                    if let Some(pid) = parse_pid(name) {
                        let remove = owned(pid, me)
                            || (dead_too
                                && libc::kill(pid as libc::pid_t, 0) != 0
                                && *libc::__errno_location() == libc::ESRCH);
                        if remove && name_end < off + reclen {
                            // The name is NUL-terminated inside the record.
                            libc::unlinkat(dir, buf[name_start..].as_ptr().cast(), 0);
                        }
                    }
                }
                off += reclen;
            }
        }
        libc::close(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_their_creator() {
        assert_eq!(parse_pid(b"pto.1234.00ff.world"), Some(1234));
        assert_eq!(parse_pid(b"pto.7"), Some(7));
        assert_eq!(parse_pid(b"pto.x.1"), None);
        assert_eq!(parse_pid(b"other.1.2"), None);
        assert_eq!(parse_pid(b"pto..1"), None);
    }

    #[test]
    fn a_spawned_child_is_registered_and_starts_with_no_blocked_signal() {
        let mut c = std::process::Command::new("/bin/sh");
        c.args([
            "-c",
            "while read -r k v; do [ \"$k\" = SigBlk: ] && echo \"$v\"; done < /proc/self/status",
        ])
        .stdout(std::process::Stdio::piped());
        let child = spawn_registered(&mut c, false).unwrap();
        let pid = child.id();
        assert!(owned(pid, me()));
        let out = child.wait_with_output().unwrap();
        forget(pid);
        let mask = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            mask.chars().all(|c| c == '0'),
            "the child's blocked signals: {mask}"
        );
        // This thread's mask is as it was.
        // SAFETY: reading this thread's mask into a zeroed set.
        let blocked = unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, libc::SIGTERM)
        };
        assert_eq!(blocked, 0);
        assert_eq!(SPAWNING.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn children_register_and_forget() {
        assert!(register_child(4_000_001));
        assert!(owned(4_000_001, me()));
        forget(4_000_001);
        assert!(!owned(4_000_001, me()));
    }
}
