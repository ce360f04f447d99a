//! Cross-memory attach: one process of this host reads (or writes) another's private memory
//! with one kernel copy (`process_vm_readv`, `process_vm_writev`), so a collective reads its peers' buffers where they are
//! instead of staging them through shared memory first.
//!
//! The kernel allows it between processes of the same user that may trace each other: under
//! Yama's `ptrace_scope` 1 (Ubuntu's default) only a process's ancestors may, so
//! [`allow_peer_readers`] declares every process of the user a permitted reader (the same
//! check Open MPI's single-copy transport relies on). Scope 2 and 3 refuse it: [`available`]
//! says so and callers keep their staged path.
//!
//! Design note: `docs/design/collectives.md` (single-copy allreduce).

use std::io;

/// Reads `dst.len()` bytes at `addr` in process `pid` into `dst`.
///
/// # Errors
///
/// The system call's error: `ESRCH` (no such process), `EFAULT` (the range is not mapped
/// there), `EPERM` (not permitted), `ENOSYS` (not in this kernel or sandbox).
pub fn read(pid: u32, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    transfer(pid, addr, dst.as_mut_ptr(), dst.len(), Direction::Read)
}

/// Writes `src` at `addr` in process `pid`.
///
/// # Errors
///
/// As [`read`].
pub fn write(pid: u32, addr: u64, src: &[u8]) -> io::Result<()> {
    // The kernel only reads `src` (the pointer is `*mut` for the iovec type alone).
    transfer(
        pid,
        addr,
        src.as_ptr().cast_mut(),
        src.len(),
        Direction::Write,
    )
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// Copies `len` bytes between `local` (this process) and `addr` in process `pid`, looping over
/// partial copies. `local` must be valid for `len` bytes for the call: written when reading,
/// only read when writing ([`read`] and [`write`] pass their slices).
fn transfer(pid: u32, addr: u64, local: *mut u8, len: usize, dir: Direction) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let here = libc::iovec {
            iov_base: local.wrapping_add(done).cast(),
            iov_len: len - done,
        };
        let there = libc::iovec {
            iov_base: (addr as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        let pid = pid as libc::pid_t;
        // SAFETY: `here` describes `local[done..len]`, memory the caller's slice lends for the
        // call: the kernel writes at most `iov_len` bytes there when reading and only reads it
        // when writing. `there` names memory of another process, which the kernel checks (an
        // unmapped range is EFAULT; nothing in this process is touched through it).
        let n = unsafe {
            match dir {
                Direction::Read => libc::process_vm_readv(pid, &here, 1, &there, 1, 0),
                Direction::Write => libc::process_vm_writev(pid, &here, 1, &there, 1, 0),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "cross-memory attach copied nothing",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Yama's `ptrace_scope` (0 to 3), or `None` when the kernel has no Yama.
pub fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Lets every process of this user read this process's memory through [`read`] (under Yama
/// scope 1; nothing changes where the scope is 0 or absent).
///
/// # Errors
///
/// The `prctl` error.
pub fn allow_peer_readers() -> io::Result<()> {
    if ptrace_scope() != Some(1) {
        return Ok(());
    }
    // SAFETY: PR_SET_PTRACER takes an integer argument and changes only this process's Yama
    // attribute; no memory is passed.
    let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether sibling processes of this user can [`read`] each other here: Yama's scope is 0, 1
/// or absent, and the system call works (a read of this process's own memory: sandboxes
/// that filter it fail this).
pub fn available() -> bool {
    if ptrace_scope().is_some_and(|s| s > 1) {
        return false;
    }
    let probe = [0x5au8; 8];
    let mut got = [0u8; 8];
    read(std::process::id(), probe.as_ptr() as u64, &mut got).is_ok() && got == probe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_memory_and_refuses_unmapped_ranges() {
        let src: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        if !available() {
            return; // a sandbox without the system call: callers keep their staged path
        }
        read(std::process::id(), src.as_ptr() as u64, &mut dst).expect("own memory");
        assert_eq!(src, dst);
        let back = vec![7u8; 1000];
        write(std::process::id(), dst[5000..].as_mut_ptr() as u64, &back).expect("own memory");
        assert!(dst[5000..6000].iter().all(|&b| b == 7) && dst[4999] == src[4999]);
        let e = read(std::process::id(), 8, &mut dst[..8]).expect_err("page zero");
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    }
}
