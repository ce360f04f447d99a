//! Symmetric windows: one region of the same size on every member, addressed by
//! `(rank, offset)`, with one-sided operations and signals.
//!
//! On mapped communicators a window is one segment that every member maps
//! (`[header | control page | rank 0 | rank 1 | ...]`); on library communicators the library
//! allocates it. Either way every operation goes through the backend's [`WindowIo`]; this
//! module checks ranks, ranges, alignment and buffers, and runs the allocation protocol. See
//! `docs/design/comm-windows.md`.

use std::fmt;
use std::sync::Arc;

use pto_core::{Buffer, Tensor};
use pto_shm::segment_kind;
use pto_shm::HeaderInit;

use crate::backend::mapping::Mapping;
use crate::backend::{wait_err, WindowIo};
use crate::check::{self, AccessKind};
use crate::comm::Comm;
use crate::error::CommError;

mod raw;
pub(crate) mod spec;

pub(crate) use spec::carve;
pub use spec::{BufferRef, BufferSpec, RemoteRef, WindowSpec, MAX_WINDOW, WINDOW_ALIGN};
pub(crate) struct WindowInner {
    pub(crate) comm: Comm,
    /// How peers' parts are reached (the backend boundary).
    pub(crate) io: WindowIo,
    name: String,
    /// Its allocation number in its communicator (the wait board names windows by it).
    pub(crate) seq: u64,
    size: usize,
    buffers: Vec<BufferRef>,
}

/// A symmetric window. Cloning shares it; the mapping goes when the last clone drops (and the
/// creator's drop unlinks the segment's name). [`Window::release`] adds a barrier first, so
/// that no peer still uses it.
#[derive(Clone)]
pub struct Window {
    pub(crate) inner: Arc<WindowInner>,
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

impl Comm {
    /// Allocates a symmetric window: `spec.bytes` on every member, zeroed, with its named
    /// buffers carved in order. Returns after every member's window is zeroed (so no peer's
    /// first signal can be wiped).
    ///
    /// # Collective
    ///
    /// Every member calls it with the same size.
    ///
    /// # Errors
    ///
    /// A size of 0 or too large, buffers that do not fit, members that disagree on the size or
    /// rank count (the error names both values), no space in `/dev/shm`, and the failures of a
    /// barrier.
    pub fn alloc_window(&self, spec: &WindowSpec) -> Result<Window, CommError> {
        let seq = {
            let mut s = self.inner.window_seq.lock();
            *s += 1;
            *s
        };
        let w = Window::allocate(self, spec, seq);
        if let (Ok(w), Some(c)) = (&w, check::active()) {
            c.window(&w.inner.name, &w.inner.buffers);
        }
        match &w {
            Ok(_) => tracing::debug!(
                rank = self.rank(),
                bytes = spec.bytes,
                seq,
                "window allocated"
            ),
            Err(e) => {
                tracing::debug!(rank = self.rank(), bytes = spec.bytes, error = %e, "window allocation failed")
            }
        }
        w
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
        let len = WindowIo::mapped_bytes(stride, n).ok_or(CommError::BadWindow {
            bytes: spec.bytes,
            why: "the window times the rank count does not fit in memory",
        })?;
        let name = format!("{}.w{seq}", comm.inner.key);
        let deadline = comm.deadline();
        // Library communicators agree on the size first (so a mismatch is an error on every
        // rank, not an abort), then the library allocates the window.
        let ours = spec.bytes as u64;
        if let Some((lo, hi)) = comm.inner.io.agree(ours, deadline)? {
            if lo != hi {
                return Err(CommError::Mismatch {
                    what: "window size in bytes",
                    theirs: if ours == lo { hi } else { lo },
                    source_desc: "another member of the communicator".into(),
                    ours,
                });
            }
        }
        let made = comm.inner.io.library_window(
            name.clone(),
            stride,
            spec.bytes,
            len,
            comm.rank(),
            deadline,
        )?;
        if let Some(io) = made {
            return Ok(Window {
                inner: Arc::new(WindowInner {
                    comm: comm.clone(),
                    io,
                    name,
                    seq,
                    size: spec.bytes,
                    buffers,
                }),
            });
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
                io: WindowIo::mapped(Mapping::from(seg), stride, spec.bytes),
                name: name.clone(),
                seq,
                size: spec.bytes,
                buffers,
            }),
        };
        // Zero our own part before anyone can leave the ready barrier (and notify us).
        w.inner.io.zero(comm.rank());
        w.barrier()?;
        comm.forget(&name);
        Ok(w)
    }

    /// The library communicator whose own collectives serve this window's, when its peers'
    /// parts are not mapped (RMA windows).
    pub(crate) fn library(&self) -> Option<&Arc<crate::backend::Library>> {
        self.inner.io.library()
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

    /// The window offset of `len` bytes at `offset` in buffer `name` (as the same buffer on any
    /// rank), checked to lie inside the buffer.
    ///
    /// # Errors
    ///
    /// [`CommError::BadBuffer`] when there is no such buffer, [`CommError::OutsideBuffer`]
    /// when the range does not fit it.
    pub fn buffer_range(&self, name: &str, offset: u64, len: u64) -> Result<usize, CommError> {
        let b = self.buffer(name)?;
        if offset.checked_add(len).is_none_or(|e| e > b.bytes as u64) {
            return Err(CommError::OutsideBuffer {
                name: name.to_string(),
                offset,
                len,
                bytes: b.bytes,
            });
        }
        Ok(b.offset + offset as usize)
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

    /// Tells the checker (when one is installed) about an access to `target`'s part.
    pub(crate) fn note(
        &self,
        target: usize,
        off: usize,
        len: usize,
        kind: AccessKind,
        op: &'static str,
    ) {
        if let Some(c) = check::active() {
            let comm = &self.inner.comm;
            let t = comm.world_rank_of(target).unwrap_or(target);
            c.access(comm.world_rank(), &self.inner.name, t, (off, len), kind, op);
        }
    }

    /// Tells the checker (when one is installed) that this rank saw the signal at
    /// `(target, off)`: it acquires what its notifiers released.
    pub(crate) fn acquired(&self, target: usize, off: usize) {
        if let Some(c) = check::active() {
            let comm = &self.inner.comm;
            let t = comm.world_rank_of(target).unwrap_or(target);
            c.acquire(comm.world_rank(), &self.inner.name, t, off);
        }
    }

    /// Tells the checker (when one is installed) that this rank released what it did so far on
    /// the word at `(target, off)` (a notify, or an atomic read-modify-write).
    pub(crate) fn released(&self, target: usize, off: usize) {
        if let Some(c) = check::active() {
            let comm = &self.inner.comm;
            let t = comm.world_rank_of(target).unwrap_or(target);
            c.release(comm.world_rank(), &self.inner.name, t, off);
        }
    }

    /// The window's name (unique in its world).
    pub(crate) fn name(&self) -> &str {
        &self.inner.name
    }

    pub(crate) fn check_range(
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

    pub(crate) fn check_atomic(
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
        self.note(rank, offset, src.len(), AccessKind::Write, "put");
        self.inner.io.put(rank, offset, src)
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
        self.note(rank, offset, dst.len(), AccessKind::Read, "get");
        self.inner.io.get(rank, offset, dst)
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

    /// Atomically adds `v` to the `u32` at `(rank, offset)`; returns the previous value.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 4-aligned.
    pub fn fetch_add_u32(&self, rank: usize, offset: usize, v: u32) -> Result<u32, CommError> {
        self.check_atomic("atomic add (u32)", rank, offset, 4)?;
        self.note(rank, offset, 4, AccessKind::Atomic, "atomic add");
        // Acquire and release, as the operation is (it orders like a notify and a wait).
        self.released(rank, offset);
        let v = self.inner.io.fetch_add_u32(rank, offset, v)?;
        self.acquired(rank, offset);
        Ok(v)
    }

    /// Atomically adds `v` to the `u64` at `(rank, offset)`; returns the previous value.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 8-aligned.
    pub fn fetch_add_u64(&self, rank: usize, offset: usize, v: u64) -> Result<u64, CommError> {
        self.check_atomic("atomic add (u64)", rank, offset, 8)?;
        self.note(rank, offset, 8, AccessKind::Atomic, "atomic add");
        // Acquire and release, as the operation is (it orders like a notify and a wait).
        self.released(rank, offset);
        let v = self.inner.io.fetch_add_u64(rank, offset, v)?;
        self.acquired(rank, offset);
        Ok(v)
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
        let v = self.inner.io.load_u32(rank, offset)?;
        self.acquired(rank, offset);
        Ok(v)
    }

    /// Atomically reads the `u64` at `(rank, offset)`.
    ///
    /// # Errors
    ///
    /// A bad rank, a range outside the window, or an offset not 8-aligned.
    pub fn load_u64(&self, rank: usize, offset: usize) -> Result<u64, CommError> {
        self.check_atomic("atomic load (u64)", rank, offset, 8)?;
        let v = self.inner.io.load_u64(rank, offset)?;
        self.acquired(rank, offset);
        Ok(v)
    }

    /// Orders this rank's earlier puts and atomics before its later ones, as seen by any peer.
    pub fn fence(&self) {
        self.quiet();
    }

    /// Completes every put and atomic this rank issued: they are visible to every peer.
    /// (On the mapped backends operations complete when they return; this is a full fence.)
    pub fn quiet(&self) {
        self.inner.io.quiet(self.inner.comm.world_rank());
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
        let join = self.inner.comm.join_point(&self.inner.name, "barrier");
        let comm = &self.inner.comm;
        let _posted = comm.post_wait(crate::world::Waiting::Barrier {
            members: comm.size() as u32,
        });
        comm.world_ref()
            .check_abort()
            .inspect_err(|e| join.failed(e))?;
        // A library communicator's barrier serves its windows; mapped ones have their own words.
        if comm.inner.io.library().is_some() {
            return comm.barrier().inspect_err(|e| join.failed(e));
        }
        self.inner
            .io
            .barrier(self.ranks(), comm.deadline(), || comm.check())
            .map_err(wait_err(
                || format!("barrier of window {}", self.inner.name),
                comm.world_rank(),
            ))
            .map_err(|e| comm.with_wait_for_graph(e))
            .inspect_err(|e| join.failed(e))
    }

    /// A direct pointer to rank `rank`'s part of the window: any rank's on mapped windows,
    /// only this rank's own on RMA windows.
    ///
    /// The pointer is valid for [`Window::len`] bytes while this window lives. Dereferencing
    /// it is `unsafe` and the caller's responsibility: reads and writes through it race with
    /// peers unless the program orders them with signals or barriers.
    ///
    /// # Errors
    ///
    /// A bad rank, or a peer's part of an RMA window ([`CommError::NotMapped`]).
    pub fn peer_ptr(&self, rank: usize) -> Result<*mut u8, CommError> {
        self.check_range("peer_ptr", rank, 0, 0)?;
        self.inner.io.peer_ptr(rank, self.rank())
    }

    /// This rank's part of the window as a pto-core [`Buffer`], so kernels can read and write
    /// it through tensors (the borrow table still orders local tasks). Peers write it only
    /// under the program's signal protocol.
    pub fn local_buffer(&self) -> Buffer {
        let b = Buffer::from_external(self.inner.io.local_memory(self.rank(), self.inner.size));
        if let Some(c) = check::active() {
            c.buffer(b.id(), &self.inner.name, self.inner.comm.world_rank());
        }
        b
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
