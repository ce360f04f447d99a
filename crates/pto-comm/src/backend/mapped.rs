//! Members that map each other's memory (threads, processes on one host, an MPI job on one
//! node with shared windows): barriers are words in a shared control area, and window
//! operations are loads, stores, copies and atomic instructions on the peer's memory.
//!
//! A window's memory is `[header | control page | rank 0 | rank 1 | ...]`, each rank's part
//! `stride` bytes apart (its size rounded up to 64). The control page holds the window's
//! barrier and the count of parked signal waiters. See `docs/design/comm-windows.md`.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use pto_core::ExternalMemory;
use pto_shm::wait::{wait_until, wake, WaitError};

use super::mapping::Mapping;
use crate::error::CommError;

/// Offset of the window's barrier in its control page.
const WIN_BARRIER: usize = 256;
/// Offset of the window's parked-waiter count.
const WIN_SLEEPERS: usize = 384;
/// Where rank 0's part of a window starts.
pub(crate) const WIN_DATA: usize = 4096;

/// A communicator whose members share `ctrl`: its barrier words live there.
pub(crate) struct MappedComm {
    ctrl: Mapping,
    barrier_off: usize,
    /// Offset of the two pair-barrier flag lines (used when the size is 2).
    pair_off: usize,
    /// Barriers this rank has passed in this communicator (the pair barrier's epoch).
    epoch: AtomicU32,
}

impl MappedComm {
    pub(crate) fn new(ctrl: Mapping, barrier_off: usize, pair_off: usize) -> MappedComm {
        MappedComm {
            ctrl,
            barrier_off,
            pair_off,
            epoch: AtomicU32::new(0),
        }
    }

    /// Waits until all `n` members arrived. Two members use the pair barrier: each adds one
    /// to the other's arrival counter and waits until its own reaches the number of barriers
    /// it has entered (one cache-line transfer each way, in parallel, instead of the central
    /// barrier's three in sequence; counters only grow, so a fast rank re-entering at once is
    /// harmless).
    pub(crate) fn barrier(
        &self,
        me: usize,
        n: usize,
        deadline: Instant,
        check: impl FnMut() -> Result<(), CommError>,
    ) -> Result<(), WaitError<CommError>> {
        if n != 2 {
            return self
                .ctrl
                .barrier(self.barrier_off)
                .wait(n as u32, deadline, check);
        }
        let epoch = self.epoch.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let line = |r: usize| self.pair_off + 64 * r;
        let (theirs, their_sleepers) = (
            self.ctrl.atomic_u32(line(1 - me)),
            self.ctrl.atomic_u32(line(1 - me) + 4),
        );
        theirs.fetch_add(1, Ordering::SeqCst);
        wake(theirs, their_sleepers);
        let (mine, my_sleepers) = (
            self.ctrl.atomic_u32(line(me)),
            self.ctrl.atomic_u32(line(me) + 4),
        );
        wait_until(
            mine,
            my_sleepers,
            |v| (v.wrapping_sub(epoch) as i32) >= 0,
            deadline,
            check,
        )
    }
}

/// A window whose every part is mapped here.
pub(crate) struct MappedWindow {
    seg: Mapping,
    stride: usize,
    size: usize,
}

impl MappedWindow {
    /// A window of `size` bytes per rank, parts `stride` bytes apart after [`WIN_DATA`].
    pub(crate) fn new(seg: Mapping, stride: usize, size: usize) -> MappedWindow {
        MappedWindow { seg, stride, size }
    }

    /// Bytes a window of `n` parts of `stride` bytes needs, if it fits in memory.
    pub(crate) fn bytes_for(stride: usize, n: usize) -> Option<usize> {
        stride
            .checked_mul(n)
            .and_then(|v| v.checked_add(WIN_DATA))
            .filter(|&v| v <= isize::MAX as usize)
    }

    /// Start of `rank`'s part. Callers pass `rank` below the rank count the memory was sized
    /// for (the protocol layer checks ranks before any operation).
    fn base(&self, rank: usize) -> *mut u8 {
        let off = WIN_DATA + rank * self.stride;
        assert!(
            off + self.size <= self.seg.len(),
            "rank {rank} outside the window"
        );
        // SAFETY: in bounds (asserted).
        unsafe { self.seg.as_ptr().add(off) }
    }

    fn word32(&self, rank: usize, offset: usize) -> &AtomicU32 {
        // SAFETY: callers checked the range and 4-byte alignment; parts are 64-aligned; the
        // memory is shared and accessed atomically.
        unsafe { &*self.base(rank).add(offset).cast::<AtomicU32>() }
    }

    fn word64(&self, rank: usize, offset: usize) -> &AtomicU64 {
        // SAFETY: as in `word32`, with 8-byte alignment.
        unsafe { &*self.base(rank).add(offset).cast::<AtomicU64>() }
    }

    fn sleepers(&self) -> &AtomicU32 {
        self.seg.atomic_u32(WIN_SLEEPERS)
    }

    /// Zeroes this rank's part (before the ready barrier: no peer writes it yet).
    pub(crate) fn zero(&self, rank: usize) {
        // SAFETY: the part is `size` bytes at `base(rank)`, inside the mapping; callers zero it
        // before any peer may write it.
        unsafe { std::ptr::write_bytes(self.base(rank), 0, self.size) };
    }

    pub(crate) fn put(&self, rank: usize, offset: usize, src: &[u8]) {
        // SAFETY: the range is inside rank's part (checked by the caller); `copy` (memmove)
        // tolerates a `src` that is itself a slice of the window.
        unsafe { std::ptr::copy(src.as_ptr(), self.base(rank).add(offset), src.len()) };
    }

    pub(crate) fn get(&self, rank: usize, offset: usize, dst: &mut [u8]) {
        // SAFETY: as in `put`, the other way round.
        unsafe { std::ptr::copy(self.base(rank).add(offset), dst.as_mut_ptr(), dst.len()) };
    }

    pub(crate) fn fetch_add_u32(&self, rank: usize, offset: usize, v: u32) -> u32 {
        self.word32(rank, offset).fetch_add(v, Ordering::AcqRel)
    }

    pub(crate) fn fetch_add_u64(&self, rank: usize, offset: usize, v: u64) -> u64 {
        self.word64(rank, offset).fetch_add(v, Ordering::AcqRel)
    }

    pub(crate) fn load_u32(&self, rank: usize, offset: usize) -> u32 {
        self.word32(rank, offset).load(Ordering::Acquire)
    }

    pub(crate) fn load_u64(&self, rank: usize, offset: usize) -> u64 {
        self.word64(rank, offset).load(Ordering::Acquire)
    }

    /// Adds or stores `v` (`SeqCst`: it publishes everything this rank wrote before), then
    /// wakes the target if it parked.
    pub(crate) fn notify(&self, rank: usize, offset: usize, v: u32, add: bool) {
        let w = self.word32(rank, offset);
        if add {
            w.fetch_add(v, Ordering::SeqCst);
        } else {
            w.store(v, Ordering::SeqCst);
        }
        wake(w, self.sleepers());
    }

    /// Waits until this rank's signal at `offset` satisfies `reached`; returns its value then.
    pub(crate) fn wait(
        &self,
        me: usize,
        offset: usize,
        reached: impl Fn(u32) -> bool,
        deadline: Instant,
        check: impl FnMut() -> Result<(), CommError>,
    ) -> Result<u32, WaitError<CommError>> {
        let w = self.word32(me, offset);
        wait_until(w, self.sleepers(), reached, deadline, check)?;
        Ok(w.load(Ordering::Acquire))
    }

    /// The window's own barrier words.
    pub(crate) fn barrier(
        &self,
        n: usize,
        deadline: Instant,
        check: impl FnMut() -> Result<(), CommError>,
    ) -> Result<(), WaitError<CommError>> {
        self.seg
            .barrier(WIN_BARRIER)
            .wait(n as u32, deadline, check)
    }

    pub(crate) fn peer_ptr(&self, rank: usize) -> *mut u8 {
        self.base(rank)
    }

    /// `len` elements of `T` at `offset` in `rank`'s part, as a slice.
    ///
    /// Only for the collectives' epoch protocol: the area was written by its owner before the
    /// owner's ready flag of this epoch was seen, and is rewritten only two epochs later, so
    /// nobody writes it while the slice lives.
    pub(crate) fn area<T: bytemuck::Pod>(&self, rank: usize, offset: usize, len: usize) -> &[T] {
        assert!(
            offset + len * std::mem::size_of::<T>() <= self.size,
            "area outside rank {rank}'s part"
        );
        slice(&self.seg, WIN_DATA + rank * self.stride + offset, len)
    }

    /// [`MappedWindow::area`], writable: only for areas that no other rank reads or writes
    /// during the call (each rank owns its share of an in-window allreduce), one slice per
    /// area at a time.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn area_mut<T: bytemuck::Pod>(
        &self,
        rank: usize,
        offset: usize,
        len: usize,
    ) -> &mut [T] {
        assert!(
            offset + len * std::mem::size_of::<T>() <= self.size,
            "area outside rank {rank}'s part"
        );
        slice_mut(&self.seg, WIN_DATA + rank * self.stride + offset, len)
    }

    /// This rank's part, lendable to pto-core as a buffer.
    pub(crate) fn local_memory(&self, rank: usize) -> Box<dyn ExternalMemory> {
        Box::new(LocalPart {
            seg: self.seg.clone(),
            offset: WIN_DATA + rank * self.stride,
            len: self.size,
        })
    }
}

/// This rank's part of a window, lent to pto-core as a buffer.
pub(crate) struct LocalPart {
    pub(crate) seg: Mapping,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

// SAFETY: the pointer is the start of this rank's part of a live mapping (kept alive by the
// `Mapping`), 64-aligned (WIN_DATA and the stride are multiples of 64), valid for `len`
// bytes. Peers write the same bytes only under the window's signal protocol, as the docs of
// `Window::local_buffer` require.
unsafe impl ExternalMemory for LocalPart {
    fn as_ptr(&self) -> *mut u8 {
        // SAFETY: `offset + len` lies inside the mapping (checked at allocation).
        unsafe { self.seg.as_ptr().add(self.offset) }
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// `len` elements of `T` at `offset` of `seg`, read in place. Callers uphold the protocol of
/// [`MappedWindow::area`]: nobody writes the area while the slice lives.
pub(crate) fn slice<T: bytemuck::Pod>(seg: &Mapping, offset: usize, len: usize) -> &[T] {
    let bytes = len * std::mem::size_of::<T>();
    assert!(
        offset + bytes <= seg.len() && offset.is_multiple_of(std::mem::align_of::<T>()),
        "bad area {offset}+{bytes} in {}",
        seg.name()
    );
    // SAFETY: in bounds and aligned (asserted; the base is 64-aligned); any bytes are a valid
    // `T` (Pod); not written while the slice lives (the callers' protocol, above).
    unsafe { std::slice::from_raw_parts(seg.as_ptr().add(offset).cast::<T>(), len) }
}

/// [`slice`], writable. Callers uphold the protocol of [`MappedWindow::area_mut`]: nobody else
/// reads or writes the area while the slice lives, and they hold one slice per area.
#[allow(clippy::mut_from_ref)]
pub(crate) fn slice_mut<T: bytemuck::Pod>(seg: &Mapping, offset: usize, len: usize) -> &mut [T] {
    let bytes = len * std::mem::size_of::<T>();
    assert!(
        offset + bytes <= seg.len() && offset.is_multiple_of(std::mem::align_of::<T>()),
        "bad area {offset}+{bytes} in {}",
        seg.name()
    );
    // SAFETY: in bounds and aligned as in `slice`; exclusive while it lives (the callers'
    // protocol, above).
    unsafe { std::slice::from_raw_parts_mut(seg.as_ptr().add(offset).cast::<T>(), len) }
}
