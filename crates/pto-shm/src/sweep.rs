//! Finding and removing pto segments, and those whose creator died.
//!
//! Every pto segment is named `/pto.<creator pid>.<nonce>[.<tag>]` (it shows up as
//! `/dev/shm/pto.…`). A segment is *stale* when its creator is dead: the header's pid and start
//! time when the header is readable, the pid in the name otherwise.

#![allow(unsafe_code)]

use std::path::Path;

use crate::process::ProcessId;
use crate::{Header, Segment, ShmError, HEADER_LEN, MAGIC};

/// One pto segment found in `/dev/shm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Its name (with the leading `/`).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its creator.
    pub creator: Option<ProcessId>,
    /// True when the creator is alive.
    pub alive: bool,
}

fn creator_of(path: &Path, name: &str) -> Option<ProcessId> {
    // Read the header through a private read-only mapping of the file when it is big enough.
    let from_name = name
        .strip_prefix("/pto.")
        .and_then(|r| r.split('.').next())
        .and_then(|p| p.parse().ok())
        .map(|pid| ProcessId { pid, start: 0 });
    // Never block (a FIFO named like a segment) and never follow a link; another user's
    // segment cannot be opened: its name still tells the creator.
    let f = match rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::NONBLOCK
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(segment = name, error = %e, "cannot open the segment to read its header");
            return from_name;
        }
    };
    let st = rustix::fs::fstat(&f).ok()?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
        || (st.st_size as u64) < HEADER_LEN as u64
    {
        return from_name;
    }
    // SAFETY: a read-only private mapping of HEADER_LEN bytes of a regular file that holds at
    // least that many; we only read plain integers from it.
    let hdr = unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            HEADER_LEN,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::PRIVATE,
            &f,
            0,
        )
        .ok()?;
        let h = &*p.cast::<Header>();
        let r = (h.magic == MAGIC).then_some(ProcessId {
            pid: h.creator_pid,
            start: h.creator_start,
        });
        let _ = rustix::mm::munmap(p, HEADER_LEN);
        r
    };
    hdr.or(from_name)
}

/// Every pto segment in `/dev/shm`. Entries named like a segment that are not regular files
/// (a FIFO, a link, a directory) are skipped with a warning: they are not pto's.
pub fn list() -> Vec<SegmentInfo> {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let mut out: Vec<SegmentInfo> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            if !file.starts_with("pto.") {
                return None;
            }
            // `file_type` does not follow links.
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                tracing::warn!(
                    path = %e.path().display(),
                    "skipping an entry named like a pto segment that is not a regular file"
                );
                return None;
            }
            let name = format!("/{file}");
            let bytes = e.metadata().map_or(0, |m| m.len());
            let creator = creator_of(&e.path(), &name);
            let alive = creator.is_some_and(|c| c.is_alive());
            Some(SegmentInfo {
                name,
                bytes,
                creator,
                alive,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// What a sweep removed, and what it could not remove (with why).
#[derive(Debug, Default)]
pub struct Swept {
    /// Segments removed.
    pub removed: Vec<SegmentInfo>,
    /// Segments that could not be removed (another user's, for example).
    pub failed: Vec<(SegmentInfo, ShmError)>,
}

fn remove_all(segments: Vec<SegmentInfo>) -> Swept {
    let mut out = Swept::default();
    for s in segments {
        match Segment::unlink(&s.name) {
            Ok(()) => {
                tracing::info!(segment = s.name, bytes = s.bytes, "removed a stale segment");
                out.removed.push(s);
            }
            Err(e) => {
                tracing::warn!(segment = s.name, error = %e, "cannot remove a stale segment");
                out.failed.push((s, e));
            }
        }
    }
    out
}

/// Removes every pto segment whose creator is dead. A segment that cannot be removed (another
/// user's) is skipped, not an error: the sweep goes on.
pub fn sweep_stale() -> Swept {
    remove_all(list().into_iter().filter(|s| !s.alive).collect())
}

/// Removes every segment whose name starts with `prefix` (a launcher cleaning up after its
/// ranks).
pub fn remove_prefix(prefix: &str) -> Swept {
    remove_all(
        list()
            .into_iter()
            .filter(|s| s.name.starts_with(prefix))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::HeaderInit;

    #[test]
    fn lists_live_segments_and_sweeps_dead_ones() {
        let live = Segment::create(
            &Segment::fresh_name("live"),
            HEADER_LEN,
            HeaderInit::default(),
        )
        .unwrap();
        // A segment "created" by a process that is gone: name it after a reaped child's pid.
        // Any `pto run` on the machine (another test, another copy of the suite) sweeps such
        // segments as it starts and may take it before the list below: then another is made.
        let mut dead_name = String::new();
        for _ in 0..10 {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            let dead_pid = child.id();
            child.wait().unwrap();
            dead_name = format!("/pto.{dead_pid}.0123456789abcdef.dead");
            let fd = rustix::shm::open(
                dead_name.as_str(),
                rustix::shm::OFlags::CREATE | rustix::shm::OFlags::RDWR,
                rustix::fs::Mode::from_raw_mode(0o600),
            )
            .unwrap();
            drop(fd);
            let all = list();
            let l = all.iter().find(|s| s.name == live.name()).unwrap();
            assert!(l.alive);
            if let Some(d) = all.iter().find(|s| s.name == dead_name) {
                assert!(!d.alive);
                break;
            }
            assert!(
                !std::path::Path::new(&format!("/dev/shm{dead_name}")).exists(),
                "{dead_name} exists but is not listed"
            );
        }
        let removed = sweep_stale().removed;
        // Gone (a concurrent `pto run` in another test may have swept it first).
        assert!(!std::path::Path::new(&format!("/dev/shm{dead_name}")).exists());
        assert!(!removed.iter().any(|s| s.name == live.name()));
        assert!(list().iter().any(|s| s.name == live.name()));
    }
}

#[cfg(test)]
mod fifo_tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A FIFO named like a segment: listing, sweeping and opening it must neither block nor
    /// count it as a segment.
    #[test]
    fn a_fifo_named_like_a_segment_is_skipped_not_opened() {
        let name = format!("/pto.{}.{:016x}.fifo", std::process::id(), crate::nonce());
        let path = format!("/dev/shm{name}");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path.as_str(),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let t = Instant::now();
        assert!(!list().iter().any(|s| s.name == name));
        let swept = sweep_stale();
        assert!(!swept.removed.iter().any(|s| s.name == name));
        let err = Segment::open(&name, Instant::now() + Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, ShmError::BadHeader { .. }), "{err}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "took {:?}",
            t.elapsed()
        );
        std::fs::remove_file(&path).unwrap();
    }
}
