//! Passive-target RMA windows (`MPI_Win_allocate`, locked with `MPI_Win_lock_all` for their
//! whole life), and the memory MPI windows own.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

use mpi_sys as sys;

use super::ffi::{lock, MpiMemory, H};
use super::MpiComm;
use crate::backend::mapping::Mapping;
use crate::error::CommError;

/// A passive-target RMA window (locked with `MPI_Win_lock_all` for its whole life).
pub(crate) struct RmaWin {
    pub(super) win: H<sys::MPI_Win>,
    /// This rank in the window's communicator.
    pub(super) me: usize,
    /// Per member, where its part starts in its MPI allocation (64-byte alignment).
    pub(super) pads: Vec<usize>,
    pub(super) comm: Arc<MpiComm>,
    /// This rank's own part, mapped.
    pub(super) local: Mapping,
}

impl RmaWin {
    pub(crate) fn comm(&self) -> &Arc<MpiComm> {
        &self.comm
    }

    /// This rank's own part.
    pub(crate) fn local(&self) -> &Mapping {
        &self.local
    }

    fn ok(&self, rc: c_int, call: &'static str) -> Result<(), CommError> {
        self.comm.ok(rc, call)
    }

    fn flush(&self, rank: usize) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: the window is locked (lock_all) for its whole life.
        let rc = unsafe { sys::MPI_Win_flush(rank as c_int, self.win.0) };
        self.ok(rc, "MPI_Win_flush")
    }

    /// Completes every operation this rank issued, at every target, then syncs the local
    /// copy (`MPI_Win_flush_all` + `MPI_Win_sync`).
    pub(crate) fn quiet(&self) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: as in `flush`.
        unsafe {
            self.ok(sys::MPI_Win_flush_all(self.win.0), "MPI_Win_flush_all")?;
            self.ok(sys::MPI_Win_sync(self.win.0), "MPI_Win_sync")
        }
    }

    /// Makes data that peers put before a signal this rank observed visible to local loads.
    pub(crate) fn sync(&self) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: as in `flush`.
        self.ok(unsafe { sys::MPI_Win_sync(self.win.0) }, "MPI_Win_sync")
    }

    /// Runs `op(start, n, displacement)` over `len` bytes at `(rank, offset)` in pieces of at
    /// most 1 GiB (MPI counts are ints), then `complete(rank)` after each piece.
    fn chunked(
        &self,
        rank: usize,
        offset: usize,
        len: usize,
        call: &'static str,
        mut op: impl FnMut(usize, c_int, sys::MPI_Aint) -> c_int,
        complete: impl Fn(usize) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        const PIECE: usize = 1 << 30;
        let _mpi = lock();
        let mut start = 0;
        while start < len {
            let n = (len - start).min(PIECE);
            let disp = (self.pads[rank] + offset + start) as sys::MPI_Aint;
            self.ok(op(start, n as c_int, disp), call)?;
            complete(rank)?;
            start += n;
        }
        Ok(())
    }

    /// `MPI_Put` of `src` to `(rank, offset)`, complete at the origin on return.
    pub(crate) fn put(&self, rank: usize, offset: usize, src: &[u8]) -> Result<(), CommError> {
        let win = self.win.0;
        let put = |start: usize, n: c_int, disp: sys::MPI_Aint| {
            // SAFETY: `start + n <= src.len()`; the target range is inside the window (checked
            // by the caller); `src` stays borrowed until flush_local completes the transfer.
            unsafe {
                sys::MPI_Put(
                    src.as_ptr().add(start).cast(),
                    n,
                    sys::RSMPI_UINT8_T,
                    rank as c_int,
                    disp,
                    n,
                    sys::RSMPI_UINT8_T,
                    win,
                )
            }
        };
        self.chunked(rank, offset, src.len(), "MPI_Put", put, |r| {
            // SAFETY: as in `flush`.
            let rc = unsafe { sys::MPI_Win_flush_local(r as c_int, win) };
            self.ok(rc, "MPI_Win_flush_local")
        })
    }

    /// `MPI_Get` of `dst.len()` bytes from `(rank, offset)`, complete on return.
    pub(crate) fn get(&self, rank: usize, offset: usize, dst: &mut [u8]) -> Result<(), CommError> {
        if rank == self.me {
            self.sync()?;
        }
        let (win, len, base) = (self.win.0, dst.len(), dst.as_mut_ptr());
        let get = |start: usize, n: c_int, disp: sys::MPI_Aint| {
            // SAFETY: `start + n <= dst.len()`; `dst` is exclusively borrowed until the flush;
            // the source range is inside the window (checked by the caller).
            unsafe {
                sys::MPI_Get(
                    base.add(start).cast(),
                    n,
                    sys::RSMPI_UINT8_T,
                    rank as c_int,
                    disp,
                    n,
                    sys::RSMPI_UINT8_T,
                    win,
                )
            }
        };
        self.chunked(rank, offset, len, "MPI_Get", get, |r| self.flush(r))
    }

    fn fetch_op<T: bytemuck::Pod + Default>(
        &self,
        rank: usize,
        offset: usize,
        v: T,
        ty: sys::MPI_Datatype,
        op: sys::MPI_Op,
    ) -> Result<T, CommError> {
        let _mpi = lock();
        let mut old = T::default();
        // SAFETY: `offset` is aligned and inside the window (checked by the caller); both
        // buffers live until the flush.
        let rc = unsafe {
            sys::MPI_Fetch_and_op(
                (&v as *const T).cast::<c_void>(),
                (&mut old as *mut T).cast::<c_void>(),
                ty,
                rank as c_int,
                (self.pads[rank] + offset) as sys::MPI_Aint,
                op,
                self.win.0,
            )
        };
        self.ok(rc, "MPI_Fetch_and_op")?;
        self.flush(rank)?;
        Ok(old)
    }

    /// Atomic fetch-and-add of a `u32`.
    pub(crate) fn fetch_add_u32(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
    ) -> Result<u32, CommError> {
        // SAFETY: predefined handles.
        let (ty, op) = unsafe { (sys::RSMPI_UINT32_T, sys::RSMPI_SUM) };
        self.fetch_op(rank, offset, v, ty, op)
    }

    /// Atomic fetch-and-add of a `u64`.
    pub(crate) fn fetch_add_u64(
        &self,
        rank: usize,
        offset: usize,
        v: u64,
    ) -> Result<u64, CommError> {
        // SAFETY: predefined handles.
        let (ty, op) = unsafe { (sys::RSMPI_UINT64_T, sys::RSMPI_SUM) };
        self.fetch_op(rank, offset, v, ty, op)
    }

    /// Atomic store of a `u32` (compare-and-swap until it lands); returns the old value.
    fn swap_u32(&self, rank: usize, offset: usize, v: u32) -> Result<u32, CommError> {
        let _mpi = lock();
        let mut cur = self.fetch_add_u32(rank, offset, 0)?;
        loop {
            let mut got: u32 = 0;
            // SAFETY: as in `fetch_op`.
            let rc = unsafe {
                sys::MPI_Compare_and_swap(
                    (&v as *const u32).cast(),
                    (&cur as *const u32).cast(),
                    (&mut got as *mut u32).cast(),
                    sys::RSMPI_UINT32_T,
                    rank as c_int,
                    (self.pads[rank] + offset) as sys::MPI_Aint,
                    self.win.0,
                )
            };
            self.ok(rc, "MPI_Compare_and_swap")?;
            self.flush(rank)?;
            if got == cur {
                return Ok(got);
            }
            cur = got;
        }
    }

    /// A notify: completes this rank's earlier operations everywhere, then updates the signal.
    pub(crate) fn notify(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
        add: bool,
    ) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: as in `flush`.
        let rc = unsafe { sys::MPI_Win_flush_all(self.win.0) };
        self.ok(rc, "MPI_Win_flush_all")?;
        if add {
            self.accumulate_u32(rank, offset, v)?;
        } else {
            self.swap_u32(rank, offset, v)?;
        }
        Ok(())
    }

    /// `MPI_Accumulate` (`MPI_SUM`) of a `u32`: an atomic add whose old value is not needed,
    /// complete at the target on return.
    pub(crate) fn accumulate_u32(
        &self,
        rank: usize,
        offset: usize,
        v: u32,
    ) -> Result<(), CommError> {
        let _mpi = lock();
        // SAFETY: `offset` is 4-aligned and inside the window (checked by the caller); `v`
        // lives until the flush; predefined handles.
        let rc = unsafe {
            sys::MPI_Accumulate(
                (&v as *const u32).cast(),
                1,
                sys::RSMPI_UINT32_T,
                rank as c_int,
                (self.pads[rank] + offset) as sys::MPI_Aint,
                1,
                sys::RSMPI_UINT32_T,
                sys::RSMPI_SUM,
                self.win.0,
            )
        };
        self.ok(rc, "MPI_Accumulate")?;
        self.flush(rank)
    }
}

impl MpiComm {
    /// An RMA window of `len` bytes per member, zeroed, locked for passive access.
    pub(crate) fn win_allocate(
        self: &Arc<Self>,
        name: String,
        len: usize,
        deadline: Instant,
    ) -> Result<RmaWin, CommError> {
        // SAFETY: out-parameters written by the calls; the memory is owned by MPI until
        // MPI_Finalize (see `shared_alloc`).
        let (base, win, pad) = unsafe {
            let _mpi = lock();
            let mut p: *mut u8 = std::ptr::null_mut();
            let mut win: sys::MPI_Win = std::mem::zeroed();
            self.ok(
                sys::MPI_Win_allocate(
                    (len + 64) as sys::MPI_Aint,
                    1,
                    sys::RSMPI_INFO_NULL,
                    self.comm.0,
                    (&mut p as *mut *mut u8).cast(),
                    &mut win,
                ),
                "MPI_Win_allocate",
            )?;
            self.ok(
                sys::MPI_Win_set_errhandler(win, sys::RSMPI_ERRORS_RETURN),
                "MPI_Win_set_errhandler",
            )?;
            // MPI memory need not be 64-aligned (osc pt2pt mallocs it): each member's part
            // starts at its first 64-aligned byte, and the members exchange these pads.
            let pad = p.align_offset(64);
            let p = p.add(pad);
            std::ptr::write_bytes(p, 0, len);
            self.ok(sys::MPI_Win_lock_all(0, win), "MPI_Win_lock_all")?;
            (p, win, pad)
        };
        let mut pads = vec![0u8; self.size()?];
        // The exchange also serves as the barrier after zeroing.
        self.allgather(&[pad as u8], &mut pads, deadline)?;
        let local = Mapping::new(Arc::new(MpiMemory {
            base: H(base),
            len,
            name,
            _fin: self.fin.clone(),
        }));
        Ok(RmaWin {
            win: H(win),
            me: self.rank()?,
            pads: pads.into_iter().map(usize::from).collect(),
            comm: self.clone(),
            local,
        })
    }
}
