//! Allgather, reduce-scatter, broadcast and all-to-all, through the staging areas in pieces.

use pto_core::block_range;

use super::Collectives;
use crate::error::CommError;
use crate::reduce::{combine_into, ReduceOp, Reducible};

impl Collectives {
    /// Gathers every rank's `mine` into `out` (rank r's data at `out[r·k .. (r+1)·k]`).
    ///
    /// # Errors
    ///
    /// `out` is not `size × mine.len()` long, or a communication error.
    pub fn allgather<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T]) -> Result<(), CommError> {
        self.comm()
            .collective_join("allgather")
            .run(|| self.allgather_in::<T>(mine, out))
    }

    fn allgather_in<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T]) -> Result<(), CommError> {
        let (n, k) = (self.n(), mine.len());
        if out.len() != n * k {
            return Err(CommError::BadBuffer {
                name: "allgather output".into(),
                why: format!("has {} elements, needs {} ranks × {k}", out.len(), n),
            });
        }
        if let Some(m) = self.w.library() {
            let d = self.comm().deadline();
            return m.allgather(bytemuck::cast_slice(mine), bytemuck::cast_slice_mut(out), d);
        }
        let step = self.elems::<T>().max(1);
        let mut start = 0;
        loop {
            let end = (start + step).min(k);
            let e = self.next_epoch();
            let off = self.area(0, e);
            self.stage(off, &mine[start..end])?;
            self.ready(e)?;
            for p in 0..n {
                // SAFETY: epoch protocol.
                let s = self.peer::<T>(p, off, end - start)?;
                out[p * k + start..p * k + end].copy_from_slice(s);
            }
            start = end;
            if start >= k {
                return Ok(());
            }
        }
    }

    /// Reduces `data` across ranks and leaves this rank its share: elements
    /// [`block_range`]`(len, rank, size)`, returned.
    ///
    /// # Errors
    ///
    /// A communication error.
    pub fn reduce_scatter<T: Reducible>(
        &self,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Vec<T>, CommError> {
        self.comm()
            .collective_join("reduce_scatter")
            .run(|| self.reduce_scatter_in::<T>(data, op))
    }

    fn reduce_scatter_in<T: Reducible>(
        &self,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Vec<T>, CommError> {
        let (me, n) = (self.me(), self.n());
        let mine = block_range(data.len(), me as u32, n as u32);
        if self.w.library().is_some() {
            // Shares may differ in length by one, so not MPI_Reduce_scatter_block.
            let mut all = data.to_vec();
            self.library_allreduce(&mut all, op)?;
            return Ok(all[mine].to_vec());
        }
        let mut out = Vec::with_capacity(mine.len());
        let step = self.elems::<T>().max(1);
        let mut start = 0;
        loop {
            let end = (start + step).min(data.len());
            let e = self.next_epoch();
            let off = self.area(0, e);
            self.stage(off, &data[start..end])?;
            self.ready(e)?;
            // The part of my share inside this piece.
            let lo = mine.start.max(start);
            let hi = mine.end.min(end);
            if lo < hi {
                // SAFETY: epoch protocol.
                let first = self.peer::<T>(0, off, end - start)?;
                let mut acc = first[lo - start..hi - start].to_vec();
                for p in 1..n {
                    // SAFETY: epoch protocol.
                    let s = self.peer::<T>(p, off, end - start)?;
                    combine_into(&mut acc, &s[lo - start..hi - start], op, false);
                }
                out.extend_from_slice(&acc);
            }
            start = end;
            if start >= data.len() {
                return Ok(out);
            }
        }
    }

    /// Copies `root`'s `data` into every rank's `data`.
    ///
    /// # Errors
    ///
    /// A bad root, or a communication error.
    pub fn broadcast<T: bytemuck::Pod>(
        &self,
        data: &mut [T],
        root: usize,
    ) -> Result<(), CommError> {
        self.comm()
            .collective_join("broadcast")
            .run(|| self.broadcast_in::<T>(data, root))
    }

    fn broadcast_in<T: bytemuck::Pod>(&self, data: &mut [T], root: usize) -> Result<(), CommError> {
        if root >= self.n() {
            return Err(CommError::BadRank {
                rank: root,
                size: self.n(),
            });
        }
        if let Some(m) = self.w.library() {
            let d = self.comm().deadline();
            return m.broadcast(bytemuck::cast_slice_mut(data), root, d);
        }
        let step = self.elems::<T>().max(1);
        let mut start = 0;
        loop {
            let end = (start + step).min(data.len());
            let e = self.next_epoch();
            let off = self.area(0, e);
            if self.me() == root {
                self.stage(off, &data[start..end])?;
            }
            self.ready(e)?;
            if self.me() != root {
                // SAFETY: epoch protocol.
                let s = self.peer::<T>(root, off, end - start)?;
                data[start..end].copy_from_slice(s);
            }
            start = end;
            if start >= data.len() {
                return Ok(());
            }
        }
    }

    /// All-to-all: `send` holds `size` blocks of `k` elements, block j for rank j; `recv` gets
    /// block `rank` of every rank, rank j's at `recv[j·k ..]`.
    ///
    /// # Errors
    ///
    /// Lengths that are not `size × k`, or a communication error.
    pub fn all_to_all<T: bytemuck::Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
    ) -> Result<(), CommError> {
        self.comm()
            .collective_join("all_to_all")
            .run(|| self.all_to_all_in::<T>(send, recv))
    }

    fn all_to_all_in<T: bytemuck::Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), CommError> {
        let n = self.n();
        if !send.len().is_multiple_of(n) || recv.len() != send.len() {
            return Err(CommError::BadBuffer {
                name: "all_to_all".into(),
                why: format!(
                    "send has {} and recv {} elements; both must be {n} × k",
                    send.len(),
                    recv.len()
                ),
            });
        }
        let k = send.len() / n;
        if let Some(m) = self.w.library() {
            let d = self.comm().deadline();
            let block = k * std::mem::size_of::<T>();
            return m.all_to_all(
                bytemuck::cast_slice(send),
                bytemuck::cast_slice_mut(recv),
                block,
                d,
            );
        }
        let me = self.me();
        // Pieces of each block, so that n pieces fit the staging area.
        let step = (self.elems::<T>() / n.max(1)).max(1);
        let mut start = 0;
        loop {
            let end = (start + step).min(k);
            let len = end - start;
            let e = self.next_epoch();
            let off = self.area(0, e);
            for j in 0..n {
                let size = std::mem::size_of::<T>();
                self.w.put(
                    me,
                    off + j * len * size,
                    bytemuck::cast_slice(&send[j * k + start..j * k + end]),
                )?;
            }
            self.ready(e)?;
            for j in 0..n {
                // SAFETY: epoch protocol.
                let s = self.peer::<T>(j, off, n * len)?;
                recv[j * k + start..j * k + end].copy_from_slice(&s[me * len..(me + 1) * len]);
            }
            start = end;
            if start >= k {
                return Ok(());
            }
        }
    }
}
