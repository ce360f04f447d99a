//! Buffers: the memory that tensors view, with run-time borrow tracking.
//!
//! This is one of the modules of `pto-core` allowed to use `unsafe` (with [`crate::view`] and
//! the engine's task nodes). A [`Buffer`] owns (or borrows from an [`ExternalMemory`]) a block
//! of bytes that kernels on different threads read and write through tensor views.
//!
//! # Why access is sound
//!
//! The DAG engine orders every two of its tasks whose accesses to the same buffer share a byte
//! (read after write, write after write, write after read). Everything else must not be able
//! to race with them, and is guarded:
//!
//! * **Registered borrows.** Untracked access (`NO_DEP` arguments, manual scopes, host code
//!   calling [`crate::Tensor::read`] or [`crate::Tensor::write`], tasks of a run that shares the
//!   buffer with another run) registers a *borrow* of each region it touches in the buffer's
//!   table. A write borrow that shares a byte with any other live borrow (or a read that shares
//!   one with a live write) is refused: the task fails with a data-race error instead of two
//!   threads aliasing memory. The test is exact ([`crate::intersects`]): the engine may let two
//!   tasks run together when their views only look alike, and that must not count as a race.
//! * **Announced tasks (the fast path).** A run *owns* the buffers it uses while no other run
//!   does; its engine-ordered tasks do not register on them (no lock, no shared write per
//!   task). Instead a core thread announces the task it runs (one word per thread, `SeqCst`)
//!   and then reads the buffer's count of registered borrows; a registered borrow increments
//!   that count (`SeqCst`) and then, when a run owns the buffer, scans every engine's announced
//!   tasks. Of the two, one comes first, so a collision is always seen by at least one side,
//!   which fails ([`fastpath`]).
//!
//! So an untracked collision is an error, never a data race, and engine-ordered tasks pay one
//! store and one load per argument for that promise.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Weak;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::geometry::{intersects, Region};

#[doc(hidden)]
pub mod fastpath;
use fastpath::FastPath;

/// Alignment of every buffer's base address, in bytes.
pub const BUFFER_ALIGN: usize = 64;

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_BORROW_TOKEN: AtomicU64 = AtomicU64::new(1);

/// Memory that a [`Buffer`] can wrap without owning its allocation (for example a shared-memory
/// mapping).
///
/// # Safety
///
/// Implementors promise that `as_ptr()` is non-null, aligned to [`BUFFER_ALIGN`] bytes, valid for
/// reads and writes of `len()` bytes for as long as the object lives, and that the bytes are not
/// accessed by this process except through the [`Buffer`] that wraps it (other processes may
/// access it under a protocol of their own, such as a comm window's signals).
pub unsafe trait ExternalMemory: Send + Sync + 'static {
    /// Base address of the memory.
    fn as_ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when the memory has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where other processes find this memory: a shared-memory segment's name and the offset of
    /// this memory in it. `None` for memory only this process sees.
    fn shared_at(&self) -> Option<(&str, usize)> {
        None
    }
}

/// Allocates the buffers a chip's rings hand out (for example in shared memory, so that other
/// processes see runtime-allocated outputs).
pub type BufferAllocator = dyn Fn(usize) -> Result<Buffer, AllocError> + Send + Sync;

enum Memory {
    /// Zero-initialised memory from the global allocator: `base` is `ptr` rounded up to
    /// [`BUFFER_ALIGN`] (the allocation is over-sized by that much, with malloc's alignment, so
    /// that large buffers come from `calloc` and their pages are zeroed lazily by the OS).
    Heap {
        ptr: NonNull<u8>,
        base: *mut u8,
        layout: Layout,
    },
    /// Zero bytes: no allocation.
    Empty,
    External(Box<dyn ExternalMemory>),
}

impl Memory {
    fn ptr(&self) -> *mut u8 {
        match self {
            Memory::Heap { base, .. } => *base,
            Memory::Empty => NonNull::<u64>::dangling().as_ptr().cast(),
            Memory::External(m) => m.as_ptr(),
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Heap { ptr, layout, .. } = self {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` in `Buffer::zeroed` and is freed
            // exactly once, here.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), *layout) }
        }
    }
}

/// The regions one token borrows in one list (a task's arguments: mostly one).
type Regions = SmallVec<[Region; 1]>;

/// A buffer's registered borrows by token, readers apart from writers: a read only looks at the
/// writes, and an end finds its token's entries at once. (A Worker's host keeps a thousand
/// deferred chip tasks borrowing one buffer; they end out of their start order, and a search
/// from the oldest entry took a tenth of the host's time.)
#[derive(Default)]
struct Borrows {
    reads: FxHashMap<u64, Regions>,
    writes: FxHashMap<u64, Regions>,
}

impl Borrows {
    /// A registered borrow other than `token`'s that `region` collides with (a read looks at
    /// the writes only).
    fn conflict(&self, token: u64, region: &Region, write: bool) -> Option<u64> {
        let hit = |l: &FxHashMap<u64, Regions>| {
            l.iter()
                .find(|(t, rs)| **t != token && rs.iter().any(|r| intersects(region, r)))
                .map(|(t, _)| *t)
        };
        hit(&self.writes).or_else(|| if write { hit(&self.reads) } else { None })
    }

    /// The list a borrow of this kind goes in.
    fn list(&mut self, write: bool) -> &mut FxHashMap<u64, Regions> {
        if write {
            &mut self.writes
        } else {
            &mut self.reads
        }
    }

    /// Removes one borrow of `region` under `token`; true if there was one.
    fn remove_one(&mut self, token: u64, region: &Region, write: bool) -> bool {
        let list = self.list(write);
        let Some(rs) = list.get_mut(&token) else {
            return false;
        };
        let Some(i) = rs.iter().rposition(|r| r == region) else {
            return false;
        };
        rs.remove(i);
        if rs.is_empty() {
            list.remove(&token);
        }
        true
    }

    /// Removes up to `n` borrows of `token` (writes first); returns how many.
    fn remove(&mut self, token: u64, mut n: usize) -> usize {
        let mut removed = 0;
        for list in [&mut self.writes, &mut self.reads] {
            if n == 0 {
                break;
            }
            if let Some(rs) = list.get_mut(&token) {
                let k = n.min(rs.len());
                rs.drain(..k);
                n -= k;
                removed += k;
                if rs.is_empty() {
                    list.remove(&token);
                }
            }
        }
        removed
    }
}

// Aligned to a cache line: behind `Arc`'s reference counts, which the orchestrating thread
// updates for every task that names the buffer (a clone into the arguments, a drop at
// retirement), these fields, which core threads read for every task (the memory, the
// untracked-borrow count), start on a line of their own; on one line, the core threads' reads
// made each count update wait for the other copy to be invalidated (diamond 434 -> 381 ns
// per task with one core thread, 438 -> 395 with two; docs/BENCHMARKS.md).
#[repr(align(64))]
pub(crate) struct BufferInner {
    id: u64,
    len: usize,
    mem: Memory,
    borrows: Mutex<Borrows>,
    /// How many borrows are registered, and which run uses the buffer on the fast path.
    fast: FastPath,
}

// SAFETY: the raw pointer inside `Memory` is only dereferenced through views whose regions were
// admitted by the borrow table (see the module docs), so sharing the buffer between threads
// cannot create a data race on its bytes. `ExternalMemory` is `Send + Sync` by its bounds.
unsafe impl Send for BufferInner {}
// SAFETY: see the `Send` impl above.
unsafe impl Sync for BufferInner {}

/// A block of bytes that tensors view. Cloning a `Buffer` clones a reference to the same memory.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("id", &self.inner.id)
            .field("len", &self.inner.len)
            .finish()
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Self) -> bool {
        self.inner.id == other.inner.id
    }
}
impl Eq for Buffer {}

/// A borrow of a region that was refused because it overlaps a live one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BorrowConflict {
    /// The token of the live borrow it collides with.
    pub other: u64,
}

/// Allocation failed: the size does not fit in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate a buffer of {bytes} bytes")]
pub struct AllocError {
    /// Requested size.
    pub bytes: usize,
}

impl Buffer {
    /// Allocates `len` zeroed bytes, aligned to [`BUFFER_ALIGN`].
    ///
    /// # Errors
    ///
    /// [`AllocError`] when the size overflows a layout or the allocator refuses it.
    pub fn zeroed(len: usize) -> Result<Buffer, AllocError> {
        let mem = if len == 0 {
            Memory::Empty
        } else {
            let padded = len
                .checked_add(BUFFER_ALIGN)
                .ok_or(AllocError { bytes: len })?;
            let layout =
                Layout::from_size_align(padded, 16).map_err(|_| AllocError { bytes: len })?;
            // SAFETY: `layout` has a non-zero size (len > 0 checked above).
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            let ptr = NonNull::new(ptr).ok_or(AllocError { bytes: len })?;
            let skip = ptr.as_ptr().align_offset(BUFFER_ALIGN);
            // SAFETY: `skip < BUFFER_ALIGN`, so `base .. base + len` lies inside the `padded`
            // bytes just allocated.
            let base = unsafe { ptr.as_ptr().add(skip) };
            Memory::Heap { ptr, base, layout }
        };
        Ok(Self::from_memory(len, mem))
    }

    /// Wraps memory owned by someone else (for example a shared-memory mapping).
    pub fn from_external(mem: Box<dyn ExternalMemory>) -> Buffer {
        let len = mem.len();
        Self::from_memory(len, Memory::External(mem))
    }

    fn from_memory(len: usize, mem: Memory) -> Buffer {
        Buffer {
            inner: Arc::new(BufferInner {
                id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed),
                len,
                mem,
                borrows: Mutex::new(Borrows::default()),
                fast: FastPath::default(),
            }),
        }
    }

    /// Where other processes find this buffer (segment name, offset), if they can.
    pub fn shared_at(&self) -> Option<(&str, usize)> {
        match &self.inner.mem {
            Memory::External(m) => m.shared_at(),
            _ => None,
        }
    }

    /// The address of the first byte, for zero-copy views from other languages (numpy arrays
    /// in the Python package). Access through it bypasses the borrow table: such views must not
    /// be touched while a run uses the buffer.
    pub fn addr(&self) -> usize {
        self.base_ptr() as usize
    }

    /// A process-unique id; the key under which the dependency engine tracks accesses.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// A fresh borrow token. Tokens below `1 << 40` are handed out here; the DAG engine makes
    /// its own above that (a per-run nonce in the high bits, the task id in the low 40).
    pub(crate) fn new_token() -> u64 {
        NEXT_BORROW_TOKEN.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers a borrow of `region` under `token`. Several regions may share one token (all the
    /// arguments of one task); they never conflict with each other. A registered borrow also
    /// looks at the tasks running now on the fast path (announced, not registered): see the
    /// module docs.
    pub(crate) fn try_borrow(
        &self,
        token: u64,
        region: &Region,
        write: bool,
    ) -> Result<(), BorrowConflict> {
        {
            let mut borrows = self.inner.borrows.lock();
            if let Some(other) = borrows.conflict(token, region, write) {
                return Err(BorrowConflict { other });
            }
            borrows.list(write).entry(token).or_default().push(*region);
        }
        // Count it, then look at the announced tasks: of this increment and a task's
        // announcement, one comes first, so either the task sees the count (and checks the
        // list above) or this scan sees the task. No run owns the buffer: no task uses it
        // unregistered, and nothing to scan.
        if !self.inner.fast.register() {
            return Ok(());
        }
        if let Some(other) = scan_running(self.id(), region, write, token) {
            self.release_one(token, region, write);
            return Err(BorrowConflict { other });
        }
        Ok(())
    }

    fn release_one(&self, token: u64, region: &Region, write: bool) {
        if self.inner.borrows.lock().remove_one(token, region, write) {
            self.inner.fast.unregister(1);
        }
    }

    /// Drops the `n` borrows registered under `token` (every one, if it has fewer).
    fn release_n(&self, token: u64, n: usize) {
        let removed = self.inner.borrows.lock().remove(token, n) as u32;
        self.inner.fast.unregister(removed);
    }

    /// For an engine-ordered task on the fast path, after it announced itself: the registered
    /// borrow (if any) it collides with. Costs one load when nothing is registered.
    pub(crate) fn check_untracked(
        &self,
        token: u64,
        region: &Region,
        write: bool,
    ) -> Result<(), BorrowConflict> {
        if !self.inner.fast.any_registered() {
            return Ok(());
        }
        match self.inner.borrows.lock().conflict(token, region, write) {
            Some(other) => Err(BorrowConflict { other }),
            None => Ok(()),
        }
    }

    /// Lets run `nonce` use this buffer on the fast path: `Some(true)` when it just claimed it,
    /// `Some(false)` when it had it, `None` when another run has it.
    pub(crate) fn claim_owner(&self, nonce: u64) -> Option<bool> {
        self.inner.fast.claim(nonce)
    }

    /// Run `nonce` is over and none of its tasks runs any more: another run may claim the
    /// buffer.
    pub(crate) fn release_owner(&self, nonce: u64) {
        self.inner.fast.release(nonce);
    }

    /// Base address. Dereferencing it is only sound inside an admitted borrow.
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.inner.mem.ptr()
    }
}

/// Something that runs tasks which touch buffers without registering borrows (a chip's engine):
/// a registered borrow asks it whether one of them collides.
pub(crate) trait RunningTasks: Send + Sync {
    /// The token of a running task whose arguments share a byte of `region` of `buffer` in a
    /// conflicting mode (one of the two writes), other than `token`.
    fn collides(&self, buffer: u64, region: &Region, write: bool, token: u64) -> Option<u64>;
}

/// Every live engine of this process.
static RUNNING: Mutex<Vec<Weak<dyn RunningTasks>>> = Mutex::new(Vec::new());

/// Makes `e`'s running tasks visible to registered borrows (until it drops).
pub(crate) fn register_running(e: Weak<dyn RunningTasks>) {
    let mut v = RUNNING.lock();
    v.retain(|w| w.strong_count() > 0);
    v.push(e);
}

fn scan_running(buffer: u64, region: &Region, write: bool, token: u64) -> Option<u64> {
    // Outside the lock while asking them (they take their own); no allocation for a few.
    let engines: smallvec::SmallVec<[std::sync::Arc<dyn RunningTasks>; 4]> =
        RUNNING.lock().iter().filter_map(Weak::upgrade).collect();
    engines
        .iter()
        .find_map(|e| e.collides(buffer, region, write, token))
}

/// A set of borrows taken together and released on drop.
pub(crate) struct BorrowSet {
    token: u64,
    /// Each buffer once, with how many borrows this set registered in it.
    buffers: smallvec::SmallVec<[(Buffer, usize); 4]>,
}

impl BorrowSet {
    pub(crate) fn new() -> BorrowSet {
        Self::with_token(Buffer::new_token())
    }

    /// A set under a token the caller made unique (see [`Buffer::new_token`]).
    pub(crate) fn with_token(token: u64) -> BorrowSet {
        BorrowSet {
            token,
            buffers: smallvec::SmallVec::new(),
        }
    }

    /// Adds a borrow; on a conflict, everything taken so far stays registered until drop.
    pub(crate) fn add(
        &mut self,
        buffer: &Buffer,
        region: &Region,
        write: bool,
    ) -> Result<(), BorrowConflict> {
        let added = buffer.try_borrow(self.token, region, write);
        // On a conflict, the borrows taken so far (and nothing of this one) stay registered.
        added?;
        match self.buffers.iter_mut().find(|(b, _)| b == buffer) {
            Some((_, n)) => *n += 1,
            None => self.buffers.push((buffer.clone(), 1)),
        }
        Ok(())
    }
}

impl fmt::Debug for BorrowSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BorrowSet(token {}, {} buffers)",
            self.token,
            self.buffers.len()
        )
    }
}

impl Drop for BorrowSet {
    fn drop(&mut self) {
        for (b, n) in &self.buffers {
            b.release_n(self.token, *n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn region(offset: usize, len: usize) -> Region {
        Region::contiguous(DType::U8, offset, &[len])
    }

    #[test]
    fn write_borrows_exclude_overlaps() {
        let b = Buffer::zeroed(128).unwrap();
        let (t1, t2) = (Buffer::new_token(), Buffer::new_token());
        b.try_borrow(t1, &region(0, 64), true).unwrap();
        assert_eq!(
            b.try_borrow(t2, &region(32, 64), false),
            Err(BorrowConflict { other: t1 })
        );
        b.try_borrow(t2, &region(64, 64), true).unwrap();
        // The same token never conflicts with itself.
        b.try_borrow(t1, &region(0, 8), false).unwrap();
        b.release_n(t1, 2);
        b.try_borrow(t2, &region(0, 64), false).unwrap();
    }

    /// A set's end drops its own borrows, reads and writes, and nobody else's.
    #[test]
    fn a_set_drops_exactly_its_borrows() {
        let b = Buffer::zeroed(128).unwrap();
        let mut set = BorrowSet::new();
        set.add(&b, &region(0, 32), true).unwrap();
        set.add(&b, &region(64, 32), false).unwrap();
        b.try_borrow(Buffer::new_token(), &region(96, 32), false)
            .unwrap();
        assert!(b
            .try_borrow(Buffer::new_token(), &region(0, 8), false)
            .is_err());
        assert!(b
            .try_borrow(Buffer::new_token(), &region(64, 8), true)
            .is_err());
        assert_eq!(b.inner.fast.registered(), 3);
        drop(set);
        assert_eq!(b.inner.fast.registered(), 1);
        b.try_borrow(Buffer::new_token(), &region(0, 96), true)
            .unwrap();
        // The other read is still there.
        assert!(b
            .try_borrow(Buffer::new_token(), &region(96, 8), true)
            .is_err());
    }

    #[test]
    fn reads_share() {
        let b = Buffer::zeroed(64).unwrap();
        b.try_borrow(1_000_001, &region(0, 64), false).unwrap();
        b.try_borrow(1_000_002, &region(0, 64), false).unwrap();
        assert!(b.try_borrow(1_000_003, &region(0, 1), true).is_err());
    }

    #[test]
    fn zero_length_and_huge() {
        assert!(Buffer::zeroed(0).unwrap().is_empty());
        assert_eq!(
            Buffer::zeroed(usize::MAX - 8).unwrap_err(),
            AllocError {
                bytes: usize::MAX - 8
            }
        );
    }
}
