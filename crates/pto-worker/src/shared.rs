//! Host tensors in shared memory: buffers that live in named segments, so a child process maps
//! the same bytes (no copies), whether the buffer was made before or after it forked.

#![allow(unsafe_code)]

use std::sync::Arc;

use parking_lot::Mutex;
use pto_core::{AllocError, Buffer, ExternalMemory};
use pto_shm::{segment_kind, HeaderInit, Segment, HEADER_LEN};
use rustc_hash::FxHashMap;

/// Where a shared buffer's bytes start in its segment (64-aligned).
pub const DATA_OFFSET: usize = HEADER_LEN;

struct SegMem {
    seg: Arc<Segment>,
    offset: usize,
    len: usize,
}

// SAFETY: `seg` keeps the mapping alive; `offset` is 64-aligned inside a page-aligned mapping
// and `offset + len` fits it (checked where made). Access follows pto-core's borrow table in
// this process; another process touches the bytes only while the host DAG gives it the task
// that uses them.
unsafe impl ExternalMemory for SegMem {
    fn as_ptr(&self) -> *mut u8 {
        // SAFETY: in bounds (see the impl's SAFETY note).
        unsafe { self.seg.as_ptr().add(self.offset) }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn shared_at(&self) -> Option<(&str, usize)> {
        Some((self.seg.name(), self.offset))
    }
}

/// Allocates a zeroed buffer of `bytes` in a fresh named segment (owned by this process).
///
/// # Errors
///
/// No space in `/dev/shm` or an OS error.
pub fn shared_buffer(bytes: usize) -> Result<Buffer, AllocError> {
    let seg = Segment::create(
        &Segment::fresh_name("t"),
        DATA_OFFSET + bytes.max(1),
        HeaderInit {
            kind: segment_kind::MAILBOX + 1,
            per_rank: bytes as u64,
            ..HeaderInit::default()
        },
    )
    .map_err(|_| AllocError { bytes })?;
    Ok(Buffer::from_external(Box::new(SegMem {
        seg: Arc::new(seg),
        offset: DATA_OFFSET,
        len: bytes,
    })))
}

/// A child's cache of the segments it mapped, by name, and of the buffers it made in them (the
/// same host buffer is the same [`Buffer`] in every frame: one borrow table, no allocation per
/// frame).
#[derive(Default, Debug)]
pub struct SegmentCache {
    map: Mutex<FxHashMap<String, Mapped>>,
}

#[derive(Debug)]
struct Mapped {
    seg: Arc<Segment>,
    buffers: FxHashMap<(u64, u64), Buffer>,
}

impl SegmentCache {
    /// The buffer at `offset .. offset + len` of segment `name`, mapping it on first use.
    ///
    /// # Errors
    ///
    /// The segment cannot be opened, or the range does not fit it.
    pub fn buffer(&self, name: &str, offset: u64, len: u64) -> Result<Buffer, String> {
        let mut m = self.map.lock();
        let mapped = match m.get_mut(name) {
            Some(s) => s,
            None => {
                let seg = Arc::new(
                    Segment::open(
                        name,
                        std::time::Instant::now() + std::time::Duration::from_secs(5),
                    )
                    .map_err(|e| e.to_string())?,
                );
                m.entry(name.to_string()).or_insert(Mapped {
                    seg,
                    buffers: FxHashMap::default(),
                })
            }
        };
        if let Some(b) = mapped.buffers.get(&(offset, len)) {
            return Ok(b.clone());
        }
        let seg = mapped.seg.clone();
        let (start, bytes) = (offset as usize, len as usize);
        if start % 64 != 0 || start.checked_add(bytes).is_none_or(|e| e > seg.len()) {
            return Err(format!(
                "buffer {start}+{bytes} does not fit segment {name} of {} bytes",
                seg.len()
            ));
        }
        let b = Buffer::from_external(Box::new(SegMem {
            seg,
            offset: start,
            len: bytes,
        }));
        mapped.buffers.insert((offset, len), b.clone());
        Ok(b)
    }
}
