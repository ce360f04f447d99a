//! Where a world's, a domain's or a window's bytes live: a POSIX shared-memory [`Segment`]
//! (shm backend), an anonymous mapping (local backend), or memory an MPI library allocated
//! (`mpi` feature). The protocols only need a base pointer and a length, and reach the bytes
//! through the checked accessors here (atomics, barrier words, byte copies), never through raw
//! pointers of their own.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

use pto_shm::barrier::Barrier;
use pto_shm::Segment;

/// Memory every member of a communicator maps at some address.
///
/// # Safety
///
/// `as_ptr` must return a pointer valid for reads and writes of `len` bytes, 64-byte aligned,
/// for as long as the value lives, and the memory must be shared by the members that use it.
pub(crate) unsafe trait Memory: Send + Sync {
    fn as_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn name(&self) -> &str;
}

// SAFETY: a segment is a live shared mapping of `len` bytes, page-aligned, unmapped on drop.
unsafe impl Memory for Segment {
    fn as_ptr(&self) -> *mut u8 {
        Segment::as_ptr(self)
    }
    fn len(&self) -> usize {
        Segment::len(self)
    }
    fn name(&self) -> &str {
        Segment::name(self)
    }
}

/// A shared handle on some [`Memory`].
#[derive(Clone)]
pub(crate) struct Mapping(Arc<dyn Memory>);

impl Mapping {
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn new(m: Arc<dyn Memory>) -> Mapping {
        Mapping(m)
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn name(&self) -> &str {
        self.0.name()
    }

    /// An atomic `u32` at `offset`.
    ///
    /// # Panics
    ///
    /// If `offset` is misaligned or out of bounds (a bug in the caller's layout).
    pub(crate) fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.len(),
            "bad atomic offset {offset} in {}",
            self.name()
        );
        // SAFETY: aligned (the base is 64-aligned) and in bounds (asserted); shared memory
        // accessed only atomically through this reference.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// An atomic `u64` at `offset`.
    ///
    /// # Panics
    ///
    /// As [`Mapping::atomic_u32`].
    pub(crate) fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + 8 <= self.len(),
            "bad atomic offset {offset} in {}",
            self.name()
        );
        // SAFETY: as in `atomic_u32`.
        unsafe { &*self.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

impl Mapping {
    /// The barrier words at `offset` (zero-initialised by whoever created the memory).
    ///
    /// # Panics
    ///
    /// If `offset` is misaligned or the barrier does not fit (a bug in the caller's layout).
    pub(crate) fn barrier(&self, offset: usize) -> &Barrier {
        assert!(
            offset.is_multiple_of(64) && offset + Barrier::SIZE <= self.len(),
            "bad barrier offset {offset} in {}",
            self.name()
        );
        // SAFETY: in bounds and 64-aligned (asserted; the base is 64-aligned); a `Barrier` is
        // made of atomics only, valid for any bytes (zero is its initial state), and shared
        // memory is only accessed atomically through it.
        unsafe { &*self.as_ptr().add(offset).cast::<Barrier>() }
    }

    /// Copies `src` into the memory at `offset`. Concurrent writers of the same bytes may
    /// interleave theirs: only for areas whose readers accept any bytes (a message read after
    /// a flag).
    ///
    /// # Panics
    ///
    /// If the range is out of bounds (a bug in the caller's layout).
    pub(crate) fn write_bytes(&self, offset: usize, src: &[u8]) {
        assert!(
            offset
                .checked_add(src.len())
                .is_some_and(|e| e <= self.len()),
            "bad byte range {offset}+{} in {}",
            src.len(),
            self.name()
        );
        // SAFETY: the range is inside the mapping (asserted); `src` is a distinct slice of
        // this process's memory (a caller cannot borrow the shared mapping as a slice).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len())
        };
    }

    /// Copies bytes at `offset` into `dst` (they may be changing: the caller accepts any).
    ///
    /// # Panics
    ///
    /// As [`Mapping::write_bytes`].
    pub(crate) fn read_bytes(&self, offset: usize, dst: &mut [u8]) {
        assert!(
            offset
                .checked_add(dst.len())
                .is_some_and(|e| e <= self.len()),
            "bad byte range {offset}+{} in {}",
            dst.len(),
            self.name()
        );
        // SAFETY: as in `write_bytes`, the other way round.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
    }
}

impl From<Arc<Segment>> for Mapping {
    fn from(s: Arc<Segment>) -> Mapping {
        Mapping(s)
    }
}
