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
    let f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len < HEADER_LEN as u64 {
        return from_name;
    }
    // SAFETY: a read-only private mapping of HEADER_LEN bytes of a file that holds at least
    // that many; we only read plain integers from it.
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

/// Every pto segment in `/dev/shm`.
pub fn list() -> Vec<SegmentInfo> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let mut out: Vec<SegmentInfo> = dir
        .filter_map(Result::ok)
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            if !file.starts_with("pto.") {
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

/// Removes every pto segment whose creator is dead; returns what it removed.
///
/// # Errors
///
/// The first unlink that failed for a reason other than the segment being gone already.
pub fn sweep_stale() -> Result<Vec<SegmentInfo>, ShmError> {
    let stale: Vec<SegmentInfo> = list().into_iter().filter(|s| !s.alive).collect();
    for s in &stale {
        Segment::unlink(&s.name)?;
    }
    Ok(stale)
}

/// Removes every segment whose name starts with `prefix` (a launcher cleaning up after its
/// ranks); returns the names removed.
///
/// # Errors
///
/// The first unlink that failed.
pub fn remove_prefix(prefix: &str) -> Result<Vec<String>, ShmError> {
    let names: Vec<String> = list()
        .into_iter()
        .map(|s| s.name)
        .filter(|n| n.starts_with(prefix))
        .collect();
    for n in &names {
        Segment::unlink(n)?;
    }
    Ok(names)
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
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let dead_name = format!("/pto.{dead_pid}.0123456789abcdef.dead");
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
        let d = all.iter().find(|s| s.name == dead_name).unwrap();
        assert!(!d.alive);
        let removed = sweep_stale().unwrap();
        assert!(removed.iter().any(|s| s.name == dead_name));
        assert!(!removed.iter().any(|s| s.name == live.name()));
        assert!(list().iter().any(|s| s.name == live.name()));
    }
}
