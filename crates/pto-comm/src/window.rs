//! Symmetric windows: one region of the same size on every member, addressed by
//! `(rank, offset)`, with one-sided operations and signals.
//!
//! A window allocation is one segment: `[header | control page | rank 0 | rank 1 | ...]`, each
//! rank's part `stride` bytes apart (the size rounded up to 64). Every member maps all of it, so
//! put and get are copies and atomics are atomic instructions on the peer's memory. The control
//! page holds the window's barrier and the count of parked signal waiters.
//! See `docs/design/comm-windows.md`.

#![allow(unsafe_code)]

use std::fmt;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use pto_core::{Buffer, DType, ExternalMemory, Tensor};
use pto_shm::barrier::Barrier;
use pto_shm::segment_kind;
use pto_shm::wait::{wait_until, wake};
use pto_shm::HeaderInit;

use crate::comm::{wait_err, Comm};
use crate::mapping::Mapping;
use crate::mpi::{Mode, MpiComm, RmaWin};
use crate::CommError;

const OFF_BARRIER: usize = 256;
const OFF_SLEEPERS: usize = 384;
const DATA: usize = 4096;
/// Alignment of every rank's window and of every named buffer.
pub const WINDOW_ALIGN: usize = 64;
/// The largest window this build accepts per rank (1 TiB).
pub const MAX_WINDOW: usize = 1 << 40;

/// A named buffer to carve out of a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Number of elements.
    pub count: usize,
    /// Bytes reserved (at least `count × dtype size`; more leaves padding).
    pub bytes: usize,
}

impl BufferSpec {
    /// `count` elements of `dtype`, exactly `count × size` bytes.
    pub fn new(name: &str, dtype: DType, count: usize) -> BufferSpec {
        BufferSpec {
            name: name.to_string(),
            dtype,
            count,
            bytes: count.saturating_mul(dtype.size()),
        }
    }

    /// Reserves `bytes` instead (must hold the elements).
    pub fn with_bytes(mut self, bytes: usize) -> BufferSpec {
        self.bytes = bytes;
        self
    }
}

/// What to allocate: bytes per rank and the named buffers carved from them, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowSpec {
    /// Bytes per rank.
    pub bytes: usize,
    /// Named buffers.
    pub buffers: Vec<BufferSpec>,
}

impl WindowSpec {
    /// A window of `bytes` per rank with no named buffers.
    pub fn new(bytes: usize) -> WindowSpec {
        WindowSpec {
            bytes,
            buffers: Vec::new(),
        }
    }

    /// A window just big enough for `buffers` (each aligned to [`WINDOW_ALIGN`]).
    pub fn for_buffers(buffers: Vec<BufferSpec>) -> WindowSpec {
        let bytes = buffers.iter().fold(0usize, |a, b| {
            a.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN + b.bytes
        });
        WindowSpec { bytes, buffers }
    }

    /// Adds a named buffer.
    pub fn buffer(mut self, b: BufferSpec) -> WindowSpec {
        self.buffers.push(b);
        self
    }
}

/// A named buffer's place in the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferRef {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Elements.
    pub count: usize,
    /// Offset in the window.
    pub offset: usize,
    /// Bytes reserved.
    pub bytes: usize,
}

/// A typed remote reference: `offset` into rank `rank`'s part of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRef {
    /// Target rank (dense, in the window's communicator).
    pub rank: usize,
    /// Byte offset in its window.
    pub offset: usize,
}

/// How a notify changes a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Adds the value.
    Add,
    /// Stores the value.
    Set,
}

struct WindowInner {
    comm: Comm,
    seg: Mapping,
    name: String,
    size: usize,
    stride: usize,
    buffers: Vec<BufferRef>,
    /// Offset of this rank's part in `seg`.
    local_off: usize,
    /// The MPI RMA window, when peers are reached through MPI calls instead of loads and
    /// stores (then `seg` is only this rank's part).
    rma: Option<RmaWin>,
}

/// A symmetric window. Cloning shares it; the mapping goes when the last clone drops (and the
/// creator's drop unlinks the segment's name). [`Window::release`] adds a barrier first, so
/// that no peer still uses it.
#[derive(Clone)]
pub struct Window {
    inner: Arc<WindowInner>,
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("segment", &self.inner.name)
            .field("rank", &self.rank())
            .field("ranks", &self.ranks())
            .field("bytes", &self.inner.size)
            .finish()
    }
}

fn carve(spec: &WindowSpec) -> Result<Vec<BufferRef>, CommError> {
    let mut out: Vec<BufferRef> = Vec::with_capacity(spec.buffers.len());
    let mut at = 0usize;
    for b in &spec.buffers {
        let need = b
            .count
            .checked_mul(b.dtype.size())
            .ok_or_else(|| CommError::BadBuffer {
                name: b.name.clone(),
                why: "element count overflows".into(),
            })?;
        if b.bytes < need {
            return Err(CommError::BadBuffer {
                name: b.name.clone(),
                why: format!(
                    "{} bytes cannot hold {} {} elements ({need} bytes)",
                    b.bytes, b.count, b.dtype
                ),
            });
        }
        if out.iter().any(|o| o.name == b.name) {
            return Err(CommError::BadBuffer {
                name: b.name.clone(),
                why: "name used twice".into(),
            });
        }
        let offset = at.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN;
        let end = offset.saturating_add(b.bytes);
        if end > spec.bytes {
            return Err(CommError::BadBuffer {
                name: b.name.clone(),
                why: format!(
                    "needs bytes {offset}..{end} but the window has {} bytes",
                    spec.bytes
                ),
            });
        }
        out.push(BufferRef {
            name: b.name.clone(),
            dtype: b.dtype,
            count: b.count,
            offset,
            bytes: b.bytes,
        });
        at = end;
    }
    Ok(out)
}

/// The local part of a window, lent to pto-core as a buffer.
struct LocalPart {
    seg: Mapping,
    offset: usize,
    len: usize,
}

// SAFETY: the pointer is the start of this rank's part of a live mapping (kept alive by the
// `Arc<Segment>`), 64-aligned (DATA and the stride are multiples of 64), valid for `len` bytes.
// Peers write the same bytes only under the window's signal protocol, as the docs of
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

impl Window {
    pub(crate) fn allocate(comm: &Comm, spec: &WindowSpec, seq: u64) -> Result<Window, CommError> {
        if spec.bytes == 0 {
            return Err(CommError::BadWindow {
                bytes: 0,
                why: "a window needs at least one byte",
            });
        }
        if spec.bytes > MAX_WINDOW {
            return Err(CommError::BadWindow {
                bytes: spec.bytes,
                why: "larger than the 1 TiB maximum",
            });
        }
        let buffers = carve(spec)?;
        let n = comm.size();
        let stride = spec.bytes.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN;
        let len = stride
            .checked_mul(n)
            .and_then(|v| v.checked_add(DATA))
            .filter(|&v| v <= isize::MAX as usize)
            .ok_or(CommError::BadWindow {
                bytes: spec.bytes,
                why: "the window times the rank count does not fit in memory",
            })?;
        let name = format!("{}.w{seq}", comm.inner.key);
        if let Some(m) = &comm.inner.mpi {
            return Window::allocate_mpi(comm, m, spec, name, buffers, stride, len);
        }
        let seg = comm.create_or_open(
            &name,
            len,
            HeaderInit {
                kind: segment_kind::WINDOW,
                nranks: n as u32,
                per_rank: spec.bytes as u64,
                generation: seq,
                ..HeaderInit::default()
            },
        )?;
        let h = seg.header();
        let creator = format!("rank {} (the window's creator)", comm.world_rank_of(0)?);
        let mismatch = if h.nranks as usize != n {
            Some(CommError::Mismatch {
                what: "window rank count",
                theirs: u64::from(h.nranks),
                source_desc: creator,
                ours: n as u64,
            })
        } else if h.per_rank != spec.bytes as u64 {
            Some(CommError::Mismatch {
                what: "window size in bytes",
                theirs: h.per_rank,
                source_desc: creator,
                ours: spec.bytes as u64,
            })
        } else {
            None
        };
        if let Some(e) = mismatch {
            // The creator and the ranks that agree with it are waiting in the ready barrier:
            // abort so that they fail now, naming this error, instead of timing out.
            comm.abort(&e.to_string());
            return Err(e);
        }
        let w = Window {
            inner: Arc::new(WindowInner {
                comm: comm.clone(),
                seg: Mapping::from(seg),
                name: name.clone(),
                size: spec.bytes,
                stride,
                buffers,
                local_off: DATA + comm.rank() * stride,
                rma: None,
            }),
        };
        // Zero our own part before anyone can leave the ready barrier (and notify us).
        // SAFETY: our part is `size` bytes at `base(rank)`, inside the mapping; no peer writes
        // it before the barrier below.
        unsafe { std::ptr::write_bytes(w.base(comm.rank()), 0, spec.bytes) };
        w.barrier()?;
        comm.forget(&name);
        Ok(w)
    }

    /// An MPI window: the members agree on the size first (so a mismatch is an error on every
    /// rank, not an abort), then allocate shared memory (one node) or an RMA window.
    fn allocate_mpi(
        comm: &Comm,
        m: &Arc<MpiComm>,
        spec: &WindowSpec,
        name: String,
        buffers: Vec<BufferRef>,
        stride: usize,
        len: usize,
    ) -> Result<Window, CommError> {
        let deadline = comm.deadline();
        let ours = spec.bytes as u64;
        let (lo, hi) = m.min_max(ours, deadline)?;
        if lo != hi {
            return Err(CommError::Mismatch {
                what: "window size in bytes",
                theirs: if ours == lo { hi } else { lo },
                source_desc: "another member of the MPI communicator".into(),
                ours,
            });
        }
        let (seg, local_off, rma) = match m.mode() {
            Mode::Shared => (
                m.shared_alloc(name.clone(), len, comm.rank(), deadline)?,
                DATA + comm.rank() * stride,
                None,
            ),
            Mode::Rma => {
                let (r, w) = m.win_allocate(name.clone(), stride, deadline)?;
                (r, 0, Some(w))
            }
        };
        Ok(Window {
            inner: Arc::new(WindowInner {
                comm: comm.clone(),
                seg,
                name,
                size: spec.bytes,
                stride,
                buffers,
                local_off,
                rma,
            }),
        })
    }

    /// The MPI communicator whose own collectives serve this window's, when its peers are
    /// not mapped (RMA windows).
    pub(crate) fn native(&self) -> Option<&Arc<MpiComm>> {
        self.inner.rma.as_ref().map(RmaWin::comm)
    }

    /// Start of this rank's part.
    fn local_ptr(&self) -> *mut u8 {
        // SAFETY: `local_off + size` lies inside `seg` (set at allocation).
        unsafe { self.inner.seg.as_ptr().add(self.inner.local_off) }
    }

    /// Start of `rank`'s part in the mapping (mapped windows only).
    fn base(&self, rank: usize) -> *mut u8 {
        // SAFETY: callers pass `rank < ranks()`; DATA + rank * stride + size is within the
        // segment (checked at allocation).
        unsafe { self.inner.seg.as_ptr().add(DATA + rank * self.inner.stride) }
    }

    /// This rank's rank in the window's communicator.
    pub fn rank(&self) -> usize {
        self.inner.comm.rank()
    }

    /// Number of ranks sharing the window.
    pub fn ranks(&self) -> usize {
        self.inner.comm.size()
    }

    /// Bytes per rank.
    pub fn len(&self) -> usize {
        self.inner.size
    }

    /// Always false: windows have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The window's communicator.
    pub fn comm(&self) -> &Comm {
        &self.inner.comm
    }

    /// The named buffers.
    pub fn buffers(&self) -> &[BufferRef] {
        &self.inner.buffers
    }

    /// The named buffer `name`.
    ///
    /// # Errors
    ///
    /// [`CommError::BadBuffer`] when there is none.
    pub fn buffer(&self, name: &str) -> Result<&BufferRef, CommError> {
        self.inner
            .buffers
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| CommError::BadBuffer {
                name: name.to_string(),
                why: "no such buffer in this window".into(),
            })
    }

    /// A remote reference, checked against the window.
    ///
    /// # Errors
    ///
    /// A bad rank or an offset past the end.
    pub fn remote(&self, rank: usize, offset: usize) -> Result<RemoteRef, CommError> {
        self.check_range("remote", rank, offset, 0)?;
        Ok(RemoteRef { rank, offset })
    }

    fn check_range(
        &self,
        op: &'static str,
        rank: usize,
        offset: usize,
        len: usize,
    ) -> Result<(), CommError> {
        if rank >= self.ranks() {
            return Err(CommError::BadRank {
                rank,
                size: self.ranks(),
            });
        }
        if offset.checked_add(len).is_none_or(|e| e > self.inner.size) {
            return Err(CommError::OutOfBounds {
                op,
                rank,
                offset,
                len,
                size: self.inner.size,
            });
        }
        Ok(())
    }

    fn check_atomic(
        &self,
        op: &'static str,
        rank: usize,
        offset: usize,
        width: usize,
    ) -> Result<(), CommError> {
        self.check_range(op, rank, offset, width)?;
        if !offset.is_multiple_of(width) {
            return Err(CommError::Misaligned {
                op,
                offset,
                align: width,
            });
        }
        Ok(())
    }

    /// Copies `src` into rank `rank`'s window at `offset`.
    ///
    /// # One-sided
    ///
    /// Only the caller takes part. The data is visible to the target after a signal (notify)
    /// or a barrier that follows it.
    ///
    /// # Errors
    ///
    /// A bad rank or a range outside the window.
    pub fn put(&self, rank: usize, offset: usize, src: &[u8]) -> Result<(), CommError> {
        self.check_range("put", rank, offset, src.len())?;
        if let Some(r) = &self.inner.rma {
            return r.put(rank, offset, src);
        }
        // SAFETY: the range is inside rank's window (checked); `src` cannot overlap the mapping
        // of a window part... unless the caller passes a slice of the window itself, which
        // `copy` (memmove) tolerates.
        unsafe { std::ptr::copy(src.as_ptr(), self.base(rank).add(offset), src.len()) };
        Ok(())
    }

    /// Copies elements into rank `rank`'s window at `offset`.
    ///
    /// # Errors
    ///
    /// As [`Window::put`].
    pub fn put_slice<T: bytemuck::Pod>(
        &self,
        rank: usize,
        offset: usize,
        src: &[T],
    ) -> Result<(), CommError> {
        self.put(rank, offset, bytemuck::cast_slice(src))
    }

    /// Copies `dst.len()` bytes from rank `rank`'s window at `offset`.
    ///
    /// # One-sided
    ///
    /// Only the caller takes part.
    ///
    /// # Errors
    ///
    /// A bad rank or a range outside the window.
    pub fn get(&self, rank: usize, offset: usize, dst: &mut [u8]) -> Result<(), CommError> {
        self.check_range("get", rank, offset, dst.len())?;
        if let Some(r) = &self.inner.rma {
            return r.get(rank, offset, dst);
        }
        // SAFETY: the range is inside rank's window (checked); `dst` is a distinct exclusive
        // slice, or (harmlessly) one aliasing the mapping, handled by memmove.
        unsafe { std::ptr::copy(self.base(rank).add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `count` elements from rank `rank`'s window at `offset`.
    ///
    /// # Errors
    ///
    /// As [`Window::get`].
    pub fn get_vec<T: bytemuck::Pod>(
        &self,
        rank: usize,
        offset: usize,
        count: usize,
    ) -> Result<Vec<T>, CommError> {
        let mut v = vec![T::zeroed(); count];
        self.get(rank, offset, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }

    fn word32(&self, rank: usize, offset: usize) -> &AtomicU32 {
        // SAFETY: callers checked the range and 4-byte alignment; the window base is 64-aligned;
        // the memory is shared and accessed atomically.
        unsafe { &*self.base(rank).add(offset).cast::<AtomicU32>() }
    }

    fn word64(&self, rank: usize, offset: usize) -> &AtomicU64 {
        // SAFETY: as in `word32`, with 8-byte alignment.
        unsafe { &*self.base(rank).add(offset).cast::<AtomicU64>() }
    }

    /// Atomically adds `v` to the `u32` at `(rank, offset)`; returns the previous value.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 4-aligned.
    pub fn fetch_add_u32(&self, rank: usize, offset: usize, v: u32) -> Result<u32, CommError> {
        self.check_atomic("atomic add (u32)", rank, offset, 4)?;
        if let Some(r) = &self.inner.rma {
            return r.fetch_add_u32(rank, offset, v);
        }
        Ok(self.word32(rank, offset).fetch_add(v, Ordering::AcqRel))
    }

    /// Atomically adds `v` to the `u64` at `(rank, offset)`; returns the previous value.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 8-aligned.
    pub fn fetch_add_u64(&self, rank: usize, offset: usize, v: u64) -> Result<u64, CommError> {
        self.check_atomic("atomic add (u64)", rank, offset, 8)?;
        if let Some(r) = &self.inner.rma {
            return r.fetch_add_u64(rank, offset, v);
        }
        Ok(self.word64(rank, offset).fetch_add(v, Ordering::AcqRel))
    }

    /// Atomically adds `v` to the `u64` at `(rank, offset)`.
    ///
    /// # Errors
    ///
    /// As [`Window::fetch_add_u64`].
    pub fn atomic_add_u64(&self, rank: usize, offset: usize, v: u64) -> Result<(), CommError> {
        self.fetch_add_u64(rank, offset, v).map(|_| ())
    }

    /// Atomically reads the `u32` at `(rank, offset)`.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 4-aligned.
    pub fn load_u32(&self, rank: usize, offset: usize) -> Result<u32, CommError> {
        self.check_atomic("atomic load (u32)", rank, offset, 4)?;
        if let Some(r) = &self.inner.rma {
            return r.fetch_add_u32(rank, offset, 0);
        }
        Ok(self.word32(rank, offset).load(Ordering::Acquire))
    }

    /// Atomically reads the `u64` at `(rank, offset)`.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 8-aligned.
    pub fn load_u64(&self, rank: usize, offset: usize) -> Result<u64, CommError> {
        self.check_atomic("atomic load (u64)", rank, offset, 8)?;
        if let Some(r) = &self.inner.rma {
            return r.fetch_add_u64(rank, offset, 0);
        }
        Ok(self.word64(rank, offset).load(Ordering::Acquire))
    }

    fn sleepers(&self) -> &AtomicU32 {
        self.inner.seg.atomic_u32(OFF_SLEEPERS)
    }

    /// Notifies the signal (a `u32`) at `(rank, offset)`: adds or stores `value`, with release
    /// semantics (everything this rank wrote before is visible to a waiter that sees it), and
    /// wakes the target if it is parked.
    ///
    /// # One-sided
    ///
    /// Only the caller takes part.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 4-aligned.
    pub fn notify(
        &self,
        rank: usize,
        offset: usize,
        value: u32,
        op: SignalOp,
    ) -> Result<(), CommError> {
        self.check_atomic("signal notify", rank, offset, 4)?;
        if let Some(r) = &self.inner.rma {
            return r.notify(rank, offset, value, op == SignalOp::Add);
        }
        let w = self.word32(rank, offset);
        match op {
            SignalOp::Add => {
                w.fetch_add(value, Ordering::SeqCst);
            }
            SignalOp::Set => w.store(value, Ordering::SeqCst),
        }
        wake(w, self.sleepers());
        Ok(())
    }

    /// Waits until this rank's signal at `offset` reaches `value` (`>=`, compared as the signed
    /// difference so that epoch counters may wrap), with the default deadline. Returns the
    /// value seen.
    ///
    /// # Errors
    ///
    /// A range outside the window, a misaligned offset, a dead or failed member (named), an
    /// abort, or the deadline.
    pub fn wait_until(&self, offset: usize, value: u32) -> Result<u32, CommError> {
        self.wait_until_deadline(offset, value, self.inner.comm.deadline())
    }

    /// [`Window::wait_until`] with an explicit deadline.
    ///
    /// # Errors
    ///
    /// As [`Window::wait_until`].
    pub fn wait_until_deadline(
        &self,
        offset: usize,
        value: u32,
        deadline: Instant,
    ) -> Result<u32, CommError> {
        let me = self.rank();
        self.check_atomic("signal wait", me, offset, 4)?;
        let reached = |v: u32| (v.wrapping_sub(value) as i32) >= 0;
        let comm = &self.inner.comm;
        if let Some(r) = &self.inner.rma {
            return rma_wait(r, comm, offset, value, deadline);
        }
        let w = self.word32(me, offset);
        wait_until(w, self.sleepers(), reached, deadline, || comm.check()).map_err(wait_err(
            || format!("signal wait at offset {offset} for >= {value}"),
            comm.world_rank(),
        ))?;
        Ok(w.load(Ordering::Acquire))
    }

    /// Test a signal without waiting: true when this rank's signal at `offset` is `>= value`.
    ///
    /// # Errors
    ///
    /// A range outside the window or a misaligned offset.
    pub fn test(&self, offset: usize, value: u32) -> Result<bool, CommError> {
        let v = self.load_u32(self.rank(), offset)?;
        Ok((v.wrapping_sub(value) as i32) >= 0)
    }

    /// A deferred-completion condition: this rank's signal at `offset` reaches `value` (`>=`,
    /// wrapping as in [`Window::wait_until`]). Polling it is one atomic load plus the abort
    /// word; an abort fails it.
    ///
    /// # Errors
    ///
    /// A range outside the window or a misaligned offset.
    pub fn signal_condition(
        &self,
        offset: usize,
        value: u32,
    ) -> Result<SignalCondition, CommError> {
        self.counter_condition(self.rank(), offset, value)
    }

    /// A deferred-completion condition on the `u32` counter at `(rank, offset)` of any rank's
    /// window reaching `value`.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window or a misaligned offset.
    pub fn counter_condition(
        &self,
        rank: usize,
        offset: usize,
        value: u32,
    ) -> Result<SignalCondition, CommError> {
        self.check_atomic("signal condition", rank, offset, 4)?;
        Ok(SignalCondition {
            window: self.clone(),
            rank,
            offset,
            value,
        })
    }

    /// Orders this rank's earlier puts and atomics before its later ones, as seen by any peer.
    pub fn fence(&self) {
        self.quiet();
    }

    /// Completes every put and atomic this rank issued: they are visible to every peer.
    /// (On the mapped backends operations complete when they return; this is a full fence.)
    pub fn quiet(&self) {
        if let Some(r) = &self.inner.rma {
            if let Err(e) = r.quiet() {
                // Operations may be lost: the program cannot go on correctly.
                crate::mpi::abort_job(self.inner.comm.world_rank(), &e.to_string());
            }
        }
        fence(Ordering::SeqCst);
    }

    /// Waits until every member reaches this barrier (the window's own barrier words).
    ///
    /// # Collective
    ///
    /// Every member calls it.
    ///
    /// # Errors
    ///
    /// As [`Comm::barrier`].
    pub fn barrier(&self) -> Result<(), CommError> {
        let comm = &self.inner.comm;
        comm.world_ref().check_abort()?;
        if let Some(m) = &comm.inner.mpi {
            return m.barrier(comm.deadline());
        }
        // SAFETY: the control page holds a zero-initialised `Barrier` at OFF_BARRIER.
        let b = unsafe { &*self.inner.seg.as_ptr().add(OFF_BARRIER).cast::<Barrier>() };
        b.wait(self.ranks() as u32, comm.deadline(), || comm.check())
            .map_err(wait_err(
                || format!("barrier of window {}", self.inner.name),
                comm.world_rank(),
            ))
    }

    /// A direct pointer to rank `rank`'s part of the window (mapped on these backends).
    ///
    /// # Errors
    ///
    /// A bad rank.
    ///
    /// # Safety
    ///
    /// The pointer is valid for [`Window::len`] bytes while this window lives. Reads and
    /// writes through it race with peers unless the program orders them with signals or
    /// barriers; the caller is responsible for that ordering.
    pub unsafe fn peer_ptr(&self, rank: usize) -> Result<*mut u8, CommError> {
        self.check_range("peer_ptr", rank, 0, 0)?;
        if self.inner.rma.is_some() {
            if rank == self.rank() {
                return Ok(self.local_ptr());
            }
            return Err(CommError::NotMapped {
                rank,
                why: "an MPI RMA window: use put and get",
            });
        }
        Ok(self.base(rank))
    }

    /// This rank's part of the window as a pto-core [`Buffer`], so kernels can read and write
    /// it through tensors (the borrow table still orders local tasks). Peers write it only
    /// under the program's signal protocol.
    pub fn local_buffer(&self) -> Buffer {
        Buffer::from_external(Box::new(LocalPart {
            seg: self.inner.seg.clone(),
            offset: self.inner.local_off,
            len: self.inner.size,
        }))
    }

    /// The named buffer `name` of this rank's part as a 1-D tensor of its dtype.
    ///
    /// # Errors
    ///
    /// No such buffer.
    pub fn local_tensor(&self, name: &str) -> Result<Tensor, CommError> {
        let b = self.buffer(name)?;
        Tensor::new(
            self.local_buffer(),
            b.dtype,
            &[b.count],
            b.offset / b.dtype.size(),
        )
        .map_err(|e| CommError::BadBuffer {
            name: name.to_string(),
            why: e.to_string(),
        })
    }

    /// Releases the window: a barrier (so no peer still uses it), then drops this handle.
    ///
    /// # Collective
    ///
    /// Every member calls it.
    ///
    /// # Errors
    ///
    /// The failures of the barrier; the handle is dropped either way.
    pub fn release(self) -> Result<(), CommError> {
        self.barrier()
    }
}

/// A signal or counter in a window reaching a value, as a deferred-completion condition
/// ([`Window::signal_condition`]).
#[derive(Clone, Debug)]
pub struct SignalCondition {
    window: Window,
    rank: usize,
    offset: usize,
    value: u32,
}

impl pto_core::Condition for SignalCondition {
    fn poll(&self) -> pto_core::Poll {
        let v = match &self.window.inner.rma {
            Some(r) => match r.fetch_add_u32(self.rank, self.offset, 0) {
                Ok(v) => v,
                Err(e) => return pto_core::Poll::Failed(e.to_string()),
            },
            None => self
                .window
                .word32(self.rank, self.offset)
                .load(Ordering::Acquire),
        };
        if (v.wrapping_sub(self.value) as i32) >= 0 {
            if let Some(r) = &self.window.inner.rma {
                if let Err(e) = r.sync() {
                    return pto_core::Poll::Failed(e.to_string());
                }
            }
            return pto_core::Poll::Ready;
        }
        match self.window.inner.comm.world_ref().check_abort() {
            Ok(()) => pto_core::Poll::Pending,
            Err(e) => pto_core::Poll::Failed(e.to_string()),
        }
    }

    fn describe(&self) -> String {
        format!(
            "signal at offset {} of rank {} >= {}",
            self.offset, self.rank, self.value
        )
    }
}

/// Polls this rank's signal through MPI (`MPI_Fetch_and_op`, which also drives progress) until
/// it reaches `value`, then `MPI_Win_sync` so that the data put before it is visible.
fn rma_wait(
    r: &RmaWin,
    comm: &Comm,
    offset: usize,
    value: u32,
    deadline: Instant,
) -> Result<u32, CommError> {
    let me = comm.rank();
    let start = Instant::now();
    let mut last_check = start;
    let mut round = 0u32;
    loop {
        let v = r.fetch_add_u32(me, offset, 0)?;
        if (v.wrapping_sub(value) as i32) >= 0 {
            r.sync()?;
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            tracing::debug!(offset, value, seen = v, "signal wait deadline passed");
            return Err(CommError::Timeout {
                what: format!("signal wait at offset {offset} for >= {value}"),
                rank: comm.world_rank(),
                waited: now - start,
            });
        }
        if now - last_check > std::time::Duration::from_millis(5) {
            comm.check()?;
            last_check = now;
        }
        round += 1;
        if round < 64 {
            std::hint::spin_loop();
        } else if round < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}
