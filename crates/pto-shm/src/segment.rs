//! Named shared-memory segments with explicit ownership and a validated header.
//!
//! The creator makes the segment with `O_CREAT | O_EXCL` and mode `0600`, reserves its pages
//! with `fallocate` (a full `/dev/shm` is then an error here, not a `SIGBUS` later), writes the
//! header and publishes it by release-storing `ready = 1`. A joiner opens it by name, waits for
//! `ready` with a deadline, and validates the magic, the version, the size and that the creator
//! is alive before using it. The creator unlinks the name when its `Segment` drops.
//! Design note: `docs/design/shm-segments.md`.

#![allow(unsafe_code)]

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{FallocateFlags, Mode};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm;

use crate::process::ProcessId;
use crate::ShmError;

/// `b"PTO-SHM1"` as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PTO-SHM1");
/// Layout version of the header and of everything pto puts after it.
pub const VERSION: u32 = 1;
/// Bytes reserved for the header at the start of every segment.
pub const HEADER_LEN: usize = 256;

/// The header at the start of every pto segment. `#[repr(C)]`; the creator writes every field
/// before it release-stores `ready`, and nobody writes them after.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`VERSION`].
    pub version: u32,
    /// What the segment holds (defined by the user of the segment).
    pub kind: u32,
    /// The creator's pid.
    pub creator_pid: u32,
    _pad0: u32,
    /// The creator's start time (see [`ProcessId`]).
    pub creator_start: u64,
    /// Length of the whole segment in bytes.
    pub total_len: u64,
    /// Participants (ranks).
    pub nranks: u32,
    _pad1: u32,
    /// Bytes per rank (for windows).
    pub per_rank: u64,
    /// A generation or allocation number.
    pub generation: u64,
    /// Fields for the segment's user.
    pub user: [u64; 8],
    /// 0 until the creator has written the header, then 1.
    pub ready: AtomicU32,
    _pad2: u32,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_LEN);

/// What the creator writes into the header.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeaderInit {
    /// See [`Header::kind`].
    pub kind: u32,
    /// See [`Header::nranks`].
    pub nranks: u32,
    /// See [`Header::per_rank`].
    pub per_rank: u64,
    /// See [`Header::generation`].
    pub generation: u64,
    /// See [`Header::user`].
    pub user: [u64; 8],
}

/// A mapped segment. The creator's `Segment` owns the name and unlinks it on drop.
pub struct Segment {
    name: String,
    base: NonNull<u8>,
    len: usize,
    owner: bool,
    anon: bool,
}

// SAFETY: the mapping is plain shared memory; all access to its contents goes through atomics
// or through users that follow a cross-process protocol (documented where they do it).
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("len", &self.len)
            .field("owner", &self.owner)
            .finish()
    }
}

fn os<'a>(op: &'static str, name: &'a str) -> impl FnOnce(rustix::io::Errno) -> ShmError + 'a {
    move |e| ShmError::Os {
        op,
        name: name.to_string(),
        source: io::Error::from(e),
    }
}

fn check_name(name: &str) -> Result<(), ShmError> {
    let ok = name.len() <= 200
        && name.starts_with("/pto.")
        && name[1..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ShmError::BadName(name.to_string()))
    }
}

/// A random 64-bit nonce.
pub fn nonce() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

unsafe fn map(fd: &rustix::fd::OwnedFd, len: usize, name: &str) -> Result<NonNull<u8>, ShmError> {
    // SAFETY: a fresh shared mapping of `len` bytes of `fd`; the caller checked that the file
    // is at least that long, so no access through it can fault.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(os("mmap", name))?;
    NonNull::new(p.cast::<u8>()).ok_or_else(|| ShmError::BadSize {
        name: name.to_string(),
        bytes: len as u64,
    })
}

/// Reserves the pages of `r` in the file (`fallocate`, which keeps the file's length).
fn reserve_range(
    fd: &rustix::fd::OwnedFd,
    name: &str,
    r: std::ops::Range<usize>,
) -> Result<(), ShmError> {
    if r.is_empty() {
        return Ok(());
    }
    let bytes = (r.end - r.start) as u64;
    rustix::fs::fallocate(fd, FallocateFlags::KEEP_SIZE, r.start as u64, bytes).map_err(|e| {
        tracing::debug!(segment = name, bytes, error = %e, "cannot reserve pages of the segment");
        if e == rustix::io::Errno::NOSPC {
            ShmError::NoSpace {
                name: name.to_string(),
                bytes,
            }
        } else {
            os("fallocate", name)(e)
        }
    })
}

impl Segment {
    /// A fresh name `/pto.<pid>.<nonce>.<tag>` (the tag may be empty).
    pub fn fresh_name(tag: &str) -> String {
        let pid = ProcessId::current().pid;
        if tag.is_empty() {
            format!("/pto.{pid}.{:016x}", nonce())
        } else {
            format!("/pto.{pid}.{:016x}.{tag}", nonce())
        }
    }

    /// Creates and maps a segment of `len` bytes (header included), zero-filled, and publishes
    /// its header. The returned segment owns the name.
    ///
    /// # Errors
    ///
    /// A bad name or size, a name that exists, no space in `/dev/shm`, or another OS error. On
    /// error nothing is left behind.
    pub fn create(name: &str, len: usize, init: HeaderInit) -> Result<Segment, ShmError> {
        Segment::create_reserving(name, len, init, std::iter::once(0..len))
    }

    /// Creates a segment of `len` bytes like [`Segment::create`], but reserves only the pages
    /// of the header and of `ranges` (clamped to the segment) now; the rest stays a hole that
    /// the creator reserves with [`Segment::reserve`] before any process touches it (touching a
    /// hole of a full `/dev/shm` raises `SIGBUS`). For segments most of whose bytes a run may
    /// never use: a Worker's mailbox lanes.
    ///
    /// # Errors
    ///
    /// As [`Segment::create`].
    pub fn create_reserving(
        name: &str,
        len: usize,
        init: HeaderInit,
        ranges: impl IntoIterator<Item = std::ops::Range<usize>>,
    ) -> Result<Segment, ShmError> {
        check_name(name)?;
        if len < HEADER_LEN || len > isize::MAX as usize {
            return Err(ShmError::BadSize {
                name: name.to_string(),
                bytes: len as u64,
            });
        }
        // A SIGKILL must not leave it behind either.
        crate::janitor::ensure_for(name);
        // A signal ending this process must see this file, or it must not be made.
        let _creating = crate::cleanup::Creating::begin().ok_or_else(|| ShmError::Os {
            op: "shm_open (create)",
            name: name.to_string(),
            source: io::Error::other("the process is being ended by a signal"),
        })?;
        let fd = shm::open(
            name,
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::from_raw_mode(0o600),
        )
        .map_err(os("shm_open (create)", name))?;
        let fail = |e: ShmError| {
            let _ = shm::unlink(name);
            e
        };
        // The file's length first (a hole), then its reserved pages.
        rustix::fs::ftruncate(&fd, len as u64)
            .map_err(os("ftruncate", name))
            .map_err(fail)?;
        for r in std::iter::once(0..HEADER_LEN).chain(ranges) {
            reserve_range(&fd, name, r.start.min(len)..r.end.min(len)).map_err(fail)?;
        }
        // SAFETY: the file was just sized to `len` bytes.
        let base = unsafe { map(&fd, len, name) }.map_err(fail)?;
        let seg = Segment {
            name: name.to_string(),
            base,
            len,
            owner: true,
            anon: false,
        };
        seg.publish(init);
        tracing::debug!(
            segment = name,
            bytes = len,
            kind = init.kind,
            "segment created"
        );
        Ok(seg)
    }

    /// Reserves the pages of `range` (clamped to the segment) of a segment this process
    /// created with [`Segment::create_reserving`], so that touching them can no longer fail.
    /// Reserving reserved pages again costs a system call and changes nothing.
    ///
    /// # Errors
    ///
    /// No space left in `/dev/shm` ([`ShmError::NoSpace`]), a segment that is not a named one
    /// owned by this process, or another OS error.
    pub fn reserve(&self, range: std::ops::Range<usize>) -> Result<(), ShmError> {
        if self.anon {
            // Private memory of this process: nothing to reserve.
            return Ok(());
        }
        if !self.owner {
            return Err(ShmError::Os {
                op: "fallocate",
                name: self.name.clone(),
                source: io::Error::other("only the segment's creator reserves its pages"),
            });
        }
        let fd = shm::open(self.name.as_str(), shm::OFlags::RDWR, Mode::empty())
            .map_err(os("shm_open (reserve)", &self.name))?;
        reserve_range(
            &fd,
            &self.name,
            range.start.min(self.len)..range.end.min(self.len),
        )
    }

    /// Opens a segment another process created, waiting until `deadline` for it to exist and
    /// be published, then validates its header and its creator's liveness.
    ///
    /// # Errors
    ///
    /// A bad name, a timeout, a header that is not pto's, a size that disagrees with the header,
    /// a dead creator ([`ShmError::Stale`]), or an OS error.
    pub fn open(name: &str, deadline: Instant) -> Result<Segment, ShmError> {
        check_name(name)?;
        let start = Instant::now();
        let timeout = || ShmError::Timeout {
            name: name.to_string(),
            waited_ms: start.elapsed().as_millis() as u64,
        };
        let fd = loop {
            match shm::open(name, shm::OFlags::RDWR, Mode::empty()) {
                Ok(fd) => break fd,
                Err(rustix::io::Errno::NOENT) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(rustix::io::Errno::NOENT) => return Err(timeout()),
                Err(e) => return Err(os("shm_open", name)(e)),
            }
        };
        // The creator sizes the file before publishing; never map more than it holds.
        let len = loop {
            let st = rustix::fs::fstat(&fd).map_err(os("fstat", name))?;
            // Anything but a regular file (a FIFO or a device someone named like a segment)
            // is not ours: never map or wait on it.
            if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
            {
                return Err(ShmError::BadHeader {
                    name: name.to_string(),
                    why: "not a regular file".into(),
                });
            }
            let len = usize::try_from(st.st_size).unwrap_or(0);
            if len >= HEADER_LEN {
                break len;
            }
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        // SAFETY: fstat says the file holds `len` bytes.
        let base = unsafe { map(&fd, len, name) }?;
        let seg = Segment {
            name: name.to_string(),
            base,
            len,
            owner: false,
            anon: false,
        };
        while seg.header().ready.load(Ordering::Acquire) == 0 {
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        seg.validate()?;
        tracing::debug!(segment = name, bytes = len, "segment opened");
        Ok(seg)
    }

    /// Writes the header and release-stores `ready`.
    fn publish(&self, init: HeaderInit) {
        let me = ProcessId::current();
        // SAFETY: the header lies at the start of our fresh mapping (len >= HEADER_LEN) and no
        // one else reads it before `ready` is set below.
        unsafe {
            let h = self.base.as_ptr().cast::<Header>();
            std::ptr::addr_of_mut!((*h).magic).write(MAGIC);
            std::ptr::addr_of_mut!((*h).version).write(VERSION);
            std::ptr::addr_of_mut!((*h).kind).write(init.kind);
            std::ptr::addr_of_mut!((*h).creator_pid).write(me.pid);
            std::ptr::addr_of_mut!((*h).creator_start).write(me.start);
            std::ptr::addr_of_mut!((*h).total_len).write(self.len as u64);
            std::ptr::addr_of_mut!((*h).nranks).write(init.nranks);
            std::ptr::addr_of_mut!((*h).per_rank).write(init.per_rank);
            std::ptr::addr_of_mut!((*h).generation).write(init.generation);
            std::ptr::addr_of_mut!((*h).user).write(init.user);
        }
        self.header().ready.store(1, Ordering::Release);
    }

    /// A process-private segment (an anonymous shared mapping) with the same header and layout
    /// as a named one: what the in-process backend uses. It has no name in `/dev/shm`.
    ///
    /// # Errors
    ///
    /// A bad size or an OS error.
    pub fn anonymous(label: &str, len: usize, init: HeaderInit) -> Result<Segment, ShmError> {
        if len < HEADER_LEN || len > isize::MAX as usize {
            return Err(ShmError::BadSize {
                name: label.to_string(),
                bytes: len as u64,
            });
        }
        // SAFETY: a fresh anonymous shared mapping; nothing else refers to it.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
            )
        }
        .map_err(|e| {
            if e == rustix::io::Errno::NOMEM {
                ShmError::NoSpace {
                    name: label.to_string(),
                    bytes: len as u64,
                }
            } else {
                os("mmap", label)(e)
            }
        })?;
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| ShmError::BadSize {
            name: label.to_string(),
            bytes: len as u64,
        })?;
        let seg = Segment {
            name: label.to_string(),
            base,
            len,
            owner: false,
            anon: true,
        };
        seg.publish(init);
        Ok(seg)
    }

    fn validate(&self) -> Result<(), ShmError> {
        let h = self.header();
        let bad = |why: String| ShmError::BadHeader {
            name: self.name.clone(),
            why,
        };
        if h.magic != MAGIC {
            return Err(bad(format!(
                "magic {:#018x}, expected {MAGIC:#018x}",
                h.magic
            )));
        }
        if h.version != VERSION {
            return Err(bad(format!("version {}, expected {VERSION}", h.version)));
        }
        if h.total_len != self.len as u64 {
            return Err(bad(format!(
                "header says {} bytes, the segment has {}",
                h.total_len, self.len
            )));
        }
        let creator = ProcessId {
            pid: h.creator_pid,
            start: h.creator_start,
        };
        if !creator.is_alive() {
            return Err(ShmError::Stale {
                name: self.name.clone(),
                pid: h.creator_pid,
            });
        }
        Ok(())
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Length in bytes, header included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a segment holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// True for the creator's segment (it unlinks the name on drop).
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Base address of the mapping. Dereferencing it follows the user's protocol.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping holds at least HEADER_LEN bytes, is page-aligned, and the header's
        // fields are plain integers (any bit pattern is valid) or atomics.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    /// An atomic `u32` at `offset` (4-aligned, inside the segment).
    ///
    /// # Panics
    ///
    /// If `offset` is misaligned or out of bounds (a bug in the caller's layout).
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.len,
            "bad atomic offset {offset}"
        );
        // SAFETY: aligned and in bounds (asserted); shared memory accessed only atomically here.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// An atomic `u64` at `offset` (8-aligned, inside the segment).
    ///
    /// # Panics
    ///
    /// If `offset` is misaligned or out of bounds.
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len,
            "bad atomic offset {offset}"
        );
        // SAFETY: as in `atomic_u32`.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// Takes over ownership: this handle will unlink the name on drop.
    pub fn adopt(&mut self) {
        self.owner = true;
    }

    /// Gives up ownership: the name stays after drop (someone else unlinks it).
    pub fn disown(&mut self) {
        self.owner = false;
    }

    /// Removes a segment name. A missing name is not an error.
    ///
    /// # Errors
    ///
    /// A bad name or an OS error other than "no such segment".
    pub fn unlink(name: &str) -> Result<(), ShmError> {
        check_name(name)?;
        match shm::unlink(name) {
            Ok(()) => {
                tracing::debug!(segment = name, "segment unlinked");
                Ok(())
            }
            Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(os("shm_unlink", name)(e)),
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in create/open, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
        if self.owner && !self.anon {
            match shm::unlink(self.name.as_str()) {
                Ok(()) => tracing::debug!(segment = self.name, "segment unlinked"),
                Err(e) => tracing::debug!(segment = self.name, error = %e, "segment unlink failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// A segment made with `create_reserving` holds the pages of its header and of the ranges
    /// it was given; `reserve` adds more (clamped to the segment, idempotent), and only the
    /// creator may reserve.
    #[test]
    fn a_reserving_segment_holds_only_the_pages_it_reserved() {
        use std::os::unix::fs::MetadataExt;
        const PAGE: usize = 4096;
        let name = Segment::fresh_name("sparse");
        let len = 64 * PAGE;
        let seg = Segment::create_reserving(
            &name,
            len,
            HeaderInit::default(),
            std::iter::once(8 * PAGE..9 * PAGE),
        )
        .unwrap();
        let path = format!("/dev/shm{name}");
        let held = || std::fs::metadata(&path).unwrap().blocks() * 512;
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len as u64);
        let first = held();
        assert!(
            first >= 2 * PAGE as u64 && first < len as u64 / 4,
            "{first} bytes"
        );
        seg.reserve(16 * PAGE..20 * PAGE).unwrap();
        let second = held();
        assert!(
            second >= first + 4 * PAGE as u64,
            "{first} then {second} bytes"
        );
        seg.reserve(16 * PAGE..20 * PAGE).unwrap();
        assert_eq!(held(), second);
        seg.reserve(60 * PAGE..usize::MAX).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len as u64);
        assert!(held() >= second + 4 * PAGE as u64);
        let other = Segment::open(&name, deadline()).unwrap();
        assert!(other.reserve(0..PAGE).is_err());
        // The whole segment reads as zeros, reserved or not.
        // SAFETY: the mapping is `len` bytes long and nothing else writes it.
        let bytes =
            unsafe { std::slice::from_raw_parts(seg.as_ptr().add(HEADER_LEN), len - HEADER_LEN) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn create_open_validate_and_unlink() {
        let name = Segment::fresh_name("t1");
        let init = HeaderInit {
            kind: 7,
            nranks: 3,
            per_rank: 4096,
            ..HeaderInit::default()
        };
        let a = Segment::create(&name, HEADER_LEN + 3 * 4096, init).unwrap();
        let b = Segment::open(&name, deadline()).unwrap();
        assert_eq!(b.header().nranks, 3);
        assert_eq!(b.header().kind, 7);
        assert_eq!(b.len(), HEADER_LEN + 3 * 4096);
        b.atomic_u32(HEADER_LEN).store(42, Ordering::Release);
        assert_eq!(a.atomic_u32(HEADER_LEN).load(Ordering::Acquire), 42);
        // The name is taken.
        assert!(Segment::create(&name, HEADER_LEN, HeaderInit::default()).is_err());
        drop(b);
        drop(a);
        assert!(matches!(
            Segment::open(&name, Instant::now() + Duration::from_millis(20)),
            Err(ShmError::Timeout { .. })
        ));
    }

    #[test]
    fn bad_names_and_sizes() {
        assert!(matches!(
            Segment::create("/other", 4096, HeaderInit::default()),
            Err(ShmError::BadName(_))
        ));
        assert!(matches!(
            Segment::create("/pto.x/y", 4096, HeaderInit::default()),
            Err(ShmError::BadName(_))
        ));
        let name = Segment::fresh_name("small");
        assert!(matches!(
            Segment::create(&name, 8, HeaderInit::default()),
            Err(ShmError::BadSize { .. })
        ));
    }

    #[test]
    fn a_non_pto_segment_is_rejected() {
        let name = Segment::fresh_name("foreign");
        let fd = shm::open(
            name.as_str(),
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        // Mark it ready with a wrong magic.
        let mut seg = Segment::open(&name, Instant::now() + Duration::from_millis(30));
        assert!(matches!(seg, Err(ShmError::Timeout { .. })), "{seg:?}");
        // SAFETY: test-only write of a ready flag into a 4096-byte file we own.
        unsafe {
            let p = map(&fd, 4096, &name).unwrap();
            (*p.as_ptr().cast::<Header>())
                .ready
                .store(1, Ordering::Release);
            rustix::mm::munmap(p.as_ptr().cast(), 4096).unwrap();
        }
        seg = Segment::open(&name, deadline());
        assert!(matches!(seg, Err(ShmError::BadHeader { .. })), "{seg:?}");
        Segment::unlink(&name).unwrap();
    }

    #[test]
    fn no_space_is_an_error_not_a_sigbus() {
        let name = Segment::fresh_name("huge");
        // Far more than any /dev/shm here.
        let r = Segment::create(&name, 1 << 50, HeaderInit::default());
        assert!(
            matches!(r, Err(ShmError::NoSpace { .. }) | Err(ShmError::Os { .. })),
            "{r:?}"
        );
        assert!(matches!(
            Segment::open(&name, Instant::now() + Duration::from_millis(10)),
            Err(ShmError::Timeout { .. })
        ));
    }
}
