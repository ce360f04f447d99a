//! Collectives on symmetric windows: allreduce (one-phase mesh or two-phase reduce-scatter +
//! allgather), allgather, reduce-scatter, broadcast from any root, all-to-all, barrier.
//!
//! A [`Collectives`] owns one window: per-peer *ready* flags, two staging areas and two result
//! areas (double-buffered by call parity). Every call is one epoch: each rank writes its data
//! into `staging[epoch % 2]`, sets its ready flag on every peer to the epoch, waits until every
//! peer's flag reached it, then reads the peers' staging areas directly (they are mapped) and
//! combines. A rank rewrites a staging area only two epochs later, after it has seen every peer
//! enter the next epoch, which a peer does only when it finished reading: so no call ever needs
//! a trailing barrier, and the same window serves any number of calls. Data larger than the
//! staging area goes through in pieces. See `docs/design/collectives.md`.

#![allow(unsafe_code)]

use parking_lot::Mutex;
use pto_core::{block_range, DType};

use crate::{Comm, CommError, SignalOp, Window, WindowSpec};

/// How values combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Product.
    Prod,
}

impl ReduceOp {
    /// `"sum"`, `"max"`, `"min"` or `"prod"`.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }
}

/// Which allreduce algorithm to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Chosen by size and rank count.
    Auto,
    /// One phase: every rank reads every peer's data and reduces all of it.
    Mesh,
    /// Two phases: each rank reduces its share (reduce-scatter), then every rank gathers the
    /// reduced shares (allgather). Moves about twice the data whatever the rank count.
    TwoPhase,
    /// A ring: `n − 1` reduce-scatter steps and `n − 1` allgather steps, each between
    /// neighbours only (every rank pulls one chunk from its left neighbour per step).
    Ring,
}

/// An element type collectives can reduce.
pub trait Reducible: bytemuck::Pod + Send + Sync + 'static {
    /// Its dtype.
    const DTYPE: DType;
    /// `a op b`.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! reducible_num {
    ($t:ty, $d:ident, $add:expr, $mul:expr) => {
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => $add(a, b),
                    ReduceOp::Prod => $mul(a, b),
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
        }
    };
}

reducible_num!(f32, F32, |a: f32, b: f32| a + b, |a: f32, b: f32| a * b);
reducible_num!(f64, F64, |a: f64, b: f64| a + b, |a: f64, b: f64| a * b);
reducible_num!(i32, I32, i32::wrapping_add, i32::wrapping_mul);
reducible_num!(i64, I64, i64::wrapping_add, i64::wrapping_mul);

macro_rules! reducible_half {
    ($t:ty, $d:ident) => {
        impl Reducible for $t {
            const DTYPE: DType = DType::$d;
            #[inline]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                <$t>::from_f32(f32::combine(a.to_f32(), b.to_f32(), op))
            }
        }
    };
}

reducible_half!(half::f16, F16);
reducible_half!(half::bf16, Bf16);

/// Messages up to this many bytes use the mesh allreduce when [`Algorithm::Auto`] chooses.
pub const MESH_MAX_BYTES: usize = 64 << 10;

const LINE: usize = 64;

/// On the MPI backend with shared windows, [`Algorithm::Auto`] hands allreduces of this many
/// bytes (and a dtype MPI reduces) to MPI's own `MPI_Iallreduce`: in `pto bench allreduce
/// --backend mpi` on 2 and 4 ranks it was as fast or up to 1.2x faster there, and pto's own
/// was faster below (up to 3x) and at 64 MiB (see docs/BENCHMARKS.md).
pub const MPI_NATIVE_BYTES: std::ops::Range<usize> = (256 << 10)..(32 << 20);

/// Collectives over one communicator, with their own window.
#[derive(Debug)]
pub struct Collectives {
    w: Window,
    cap: usize,
    epoch: Mutex<u32>,
    /// Ring steps taken so far (the ring flags' epoch).
    steps: Mutex<u32>,
}

impl Collectives {
    /// Allocates the window: `cap` bytes of staging per area (calls with more data go through
    /// in pieces).
    ///
    /// # Collective
    ///
    /// Every member calls it with the same `cap`.
    ///
    /// # Errors
    ///
    /// As [`Comm::alloc_window`].
    pub fn new(comm: &Comm, cap: usize) -> Result<Collectives, CommError> {
        let cap = cap.max(LINE).div_ceil(LINE) * LINE;
        let flags = comm.size() * LINE;
        let w = comm.alloc_window(&WindowSpec::new(flags + 4 * cap))?;
        Ok(Collectives {
            w,
            cap,
            epoch: Mutex::new(0),
            steps: Mutex::new(0),
        })
    }

    /// The window's communicator.
    pub fn comm(&self) -> &Comm {
        self.w.comm()
    }

    /// Bytes per staging area.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn n(&self) -> usize {
        self.w.ranks()
    }

    fn me(&self) -> usize {
        self.w.rank()
    }

    fn area(&self, which: usize, epoch: u32) -> usize {
        // which: 0 staging, 1 result; double-buffered by epoch parity.
        self.n() * LINE + (2 * which + (epoch as usize & 1)) * self.cap
    }

    /// Starts an epoch: returns it.
    fn next_epoch(&self) -> u32 {
        let mut e = self.epoch.lock();
        *e = e.wrapping_add(1);
        *e
    }

    /// Sets this rank's flag at `flag_base` on every peer to `epoch`, then waits for every
    /// peer's flag in this rank's window to reach it.
    fn exchange(&self, flag_base: usize, epoch: u32) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        for p in 0..n {
            if p != me {
                self.w
                    .notify(p, flag_base + me * LINE, epoch, SignalOp::Set)?;
            }
        }
        for p in 0..n {
            if p != me {
                self.w.wait_until(flag_base + p * LINE, epoch)?;
            }
        }
        Ok(())
    }

    fn ready(&self, epoch: u32) -> Result<(), CommError> {
        self.exchange(0, epoch)
    }

    /// A typed view of rank `r`'s area at `off`, `len` elements.
    ///
    /// # Safety
    ///
    /// The caller follows the epoch protocol: the area is not written by its owner while this
    /// view lives (it was written before the owner's ready flag of this epoch was seen, and
    /// the owner rewrites it only two epochs later).
    unsafe fn peer<T: bytemuck::Pod>(
        &self,
        r: usize,
        off: usize,
        len: usize,
    ) -> Result<&[T], CommError> {
        // SAFETY: `peer_ptr` is the start of rank r's mapped part; `off + len * size` is inside
        // the window (areas are sized `cap` and callers keep `len * size <= cap`); areas are
        // 64-aligned, so aligned for T.
        unsafe {
            let p = self.w.peer_ptr(r)?.add(off).cast::<T>();
            Ok(std::slice::from_raw_parts(p, len))
        }
    }

    fn stage<T: bytemuck::Pod>(&self, off: usize, data: &[T]) -> Result<(), CommError> {
        self.w.put(self.me(), off, bytemuck::cast_slice(data))
    }

    fn elems<T>(&self) -> usize {
        self.cap / std::mem::size_of::<T>().max(1)
    }

    /// Reduces `data` across all ranks in place, with the automatic algorithm choice.
    ///
    /// # Collective
    ///
    /// Every member calls it with the same length and operation.
    ///
    /// # Errors
    ///
    /// A dead or failed peer, an abort, or a timeout (communication errors).
    pub fn allreduce<T: Reducible>(&self, data: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        self.allreduce_with(data, op, Algorithm::Auto)
    }

    /// [`Collectives::allreduce`] with a chosen algorithm.
    ///
    /// # Errors
    ///
    /// As [`Collectives::allreduce`].
    pub fn allreduce_with<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<(), CommError> {
        let on_mpi_by_choice = algo == Algorithm::Auto
            && crate::mpi::native_dtype(T::DTYPE)
            && MPI_NATIVE_BYTES.contains(&std::mem::size_of_val(data));
        if self.w.native().is_some() || (on_mpi_by_choice && self.comm().inner.mpi.is_some()) {
            return self.native_allreduce(data, op);
        }
        let algo = match algo {
            Algorithm::Auto if std::mem::size_of_val(data) <= MESH_MAX_BYTES || self.n() <= 2 => {
                Algorithm::Mesh
            }
            Algorithm::Auto => Algorithm::TwoPhase,
            a => a,
        };
        for piece in data.chunks_mut(self.elems::<T>().max(1)) {
            match algo {
                Algorithm::TwoPhase => self.allreduce_two_phase(piece, op)?,
                Algorithm::Ring => self.allreduce_ring(piece, op)?,
                _ => self.allreduce_mesh(piece, op)?,
            }
        }
        if data.is_empty() {
            // Keep every rank's epochs in step even for empty calls.
            let e = self.next_epoch();
            self.ready(e)?;
        }
        Ok(())
    }

    fn allreduce_mesh<T: Reducible>(&self, data: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let e = self.next_epoch();
        let off = self.area(0, e);
        self.stage(off, data)?;
        self.ready(e)?;
        let (me, n) = (self.me(), self.n());
        // Combine in rank order on every rank (x0 ⊕ x1 ⊕ ...), so every rank gets bit-identical
        // results. Work in blocks that stay in cache: each source is read once, the output
        // written once, and this rank's own contribution is read from `data` itself (the block
        // is overwritten only after it was used).
        let mut srcs = Vec::with_capacity(n);
        for p in 0..n {
            // SAFETY: epoch protocol (see `peer`).
            srcs.push(unsafe { self.peer::<T>(p, off, data.len())? });
        }
        let block = (16 << 10) / std::mem::size_of::<T>().max(1);
        let mut tmp: Vec<T> = Vec::with_capacity(block.min(data.len()));
        let mut start = 0;
        while start < data.len() {
            let end = (start + block).min(data.len());
            tmp.clear();
            if me == 0 {
                tmp.extend_from_slice(&data[start..end]);
            } else {
                tmp.extend_from_slice(&srcs[0][start..end]);
            }
            for (p, src) in srcs.iter().enumerate().skip(1) {
                let s = if p == me {
                    &data[start..end]
                } else {
                    &src[start..end]
                };
                for (a, v) in tmp.iter_mut().zip(s) {
                    *a = T::combine(*a, *v, op);
                }
            }
            data[start..end].copy_from_slice(&tmp);
            start = end;
        }
        Ok(())
    }

    fn allreduce_ring<T: Reducible>(&self, data: &mut [T], op: ReduceOp) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let e = self.next_epoch();
        let off = self.area(0, e);
        self.stage(off, data)?;
        self.ready(e)?;
        if n == 1 {
            return Ok(());
        }
        let left = (me + n - 1) % n;
        let size = std::mem::size_of::<T>();
        let chunk = |c: usize| block_range(data.len(), c as u32, n as u32);
        let base = {
            let mut s = self.steps.lock();
            let b = *s;
            *s = s.wrapping_add(2 * (n as u32 - 1));
            b
        };
        // My flag (third word of my line in each peer's window) counts the steps I finished;
        // only my right neighbour waits for it.
        let right = (me + 1) % n;
        let step_done = |k: u32| {
            self.w
                .notify(right, me * LINE + 8, base.wrapping_add(k), SignalOp::Set)
        };
        let wait_left = |k: u32| self.w.wait_until(left * LINE + 8, base.wrapping_add(k));
        // Reduce-scatter: at step s, pull chunk (me − s − 1) from the left neighbour, which
        // finished reducing it at its step s − 1, and combine it into mine.
        for s in 0..n - 1 {
            if s > 0 {
                wait_left(s as u32)?;
            }
            let c = (me + 2 * n - s - 1) % n;
            let r = chunk(c);
            // SAFETY: the left neighbour wrote chunk c before finishing step s − 1 (or staged it
            // before the ready exchange, for s = 0) and does not touch it again in this call
            // until the allgather step that overwrites it, which waits for this rank.
            let theirs = unsafe { self.peer::<T>(left, off + r.start * size, r.len())? };
            // SAFETY: this rank's own staging area; only this rank writes it.
            let mine: Vec<T> =
                unsafe { self.peer::<T>(me, off + r.start * size, r.len())? }.to_vec();
            let acc: Vec<T> = theirs
                .iter()
                .zip(&mine)
                .map(|(a, b)| T::combine(*a, *b, op))
                .collect();
            self.w
                .put(me, off + r.start * size, bytemuck::cast_slice(&acc))?;
            step_done(s as u32 + 1)?;
        }
        // Allgather: at step s, pull the finished chunk (me − s) from the left neighbour.
        for s in 0..n - 1 {
            wait_left((n - 1 + s) as u32)?;
            let c = (me + n - s) % n;
            let r = chunk(c);
            // SAFETY: as above; chunk c is final on the left neighbour since its step.
            let theirs: Vec<T> =
                unsafe { self.peer::<T>(left, off + r.start * size, r.len())? }.to_vec();
            self.w
                .put(me, off + r.start * size, bytemuck::cast_slice(&theirs))?;
            step_done((n + s) as u32)?;
        }
        // SAFETY: this rank's own staging area, final now.
        let all = unsafe { self.peer::<T>(me, off, data.len())? };
        data.copy_from_slice(all);
        // The right neighbour may still be reading my chunks: the next call's ready exchange
        // (which it enters only after finishing this one) protects them.
        Ok(())
    }

    fn allreduce_two_phase<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let e = self.next_epoch();
        let (stage, result) = (self.area(0, e), self.area(1, e));
        self.stage(stage, data)?;
        self.ready(e)?;
        // Phase 1: reduce my share from every rank's staging into my result area.
        let mine = block_range(data.len(), me as u32, n as u32);
        let mut acc: Vec<T> = {
            // SAFETY: epoch protocol.
            let s = unsafe { self.peer::<T>(0, stage, data.len())? };
            s[mine.clone()].to_vec()
        };
        for p in 1..n {
            // SAFETY: epoch protocol.
            let s = unsafe { self.peer::<T>(p, stage, data.len())? };
            for (a, v) in acc.iter_mut().zip(&s[mine.clone()]) {
                *a = T::combine(*a, *v, op);
            }
        }
        let size = std::mem::size_of::<T>();
        self.w
            .put(me, result + mine.start * size, bytemuck::cast_slice(&acc))?;
        // Phase 2: once every share is reduced (the second flag of each line), gather them.
        self.exchange(4, e)?;
        for p in 0..n {
            let r = block_range(data.len(), p as u32, n as u32);
            // SAFETY: epoch protocol (result areas follow the same parity rule).
            let s = unsafe { self.peer::<T>(p, result, data.len())? };
            data[r.clone()].copy_from_slice(&s[r]);
        }
        Ok(())
    }

    /// Allreduce of data that already lives in a window: `count` elements of `T` at `offset` of
    /// every rank's part of `w`, replaced by the result on every rank. No staging copy: rank r
    /// reads its share of every rank's part directly, reduces it, and writes the result into
    /// every rank's part (each share is read and written only by its owner), then a second
    /// exchange says every share is done. This is the memory-bound path for large data.
    ///
    /// # Collective
    ///
    /// Every member calls it with the same window, offset, count and operation; `w` must span
    /// the same ranks as these collectives.
    ///
    /// # Errors
    ///
    /// A range outside the window, a window over other ranks, or a communication error.
    pub fn allreduce_window<T: Reducible>(
        &self,
        w: &Window,
        offset: usize,
        count: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let size = std::mem::size_of::<T>();
        if w.ranks() != n || w.rank() != me {
            return Err(CommError::BadWindow {
                bytes: w.len(),
                why: "the window does not span the ranks of these collectives",
            });
        }
        let bytes = count.checked_mul(size).ok_or(CommError::BadWindow {
            bytes: usize::MAX,
            why: "count overflows",
        })?;
        w.remote(me, offset)?;
        if !offset.is_multiple_of(64) || offset + bytes > w.len() {
            return Err(CommError::OutOfBounds {
                op: "allreduce_window",
                rank: me,
                offset,
                len: bytes,
                size: w.len(),
            });
        }
        if w.native().is_some() {
            // RMA window: MPI's allreduce in place on this rank's own part, after syncing it.
            w.quiet();
            // SAFETY: `peer_ptr(me)` is this rank's local part; the range was checked above
            // and is 64-aligned; peers do not write it during this collective call (its
            // contract), and this rank's other threads do not either.
            let local = unsafe {
                std::slice::from_raw_parts_mut(w.peer_ptr(me)?.add(offset).cast::<T>(), count)
            };
            self.native_allreduce(local, op)?;
            w.quiet();
            return Ok(());
        }
        // Everyone's input is in place.
        let e = self.next_epoch();
        self.ready(e)?;
        let mine = block_range(count, me as u32, n as u32);
        if !mine.is_empty() {
            let mut srcs = Vec::with_capacity(n);
            for p in 0..n {
                // SAFETY: chunk `mine` of every rank's part is read and written only by this
                // rank during this call (each rank owns its share), and no rank touches the
                // data again before the closing exchange below.
                srcs.push(unsafe {
                    let base = w.peer_ptr(p)?.add(offset + mine.start * size).cast::<T>();
                    std::slice::from_raw_parts_mut(base, mine.len())
                });
            }
            let block = (16 << 10) / size.max(1);
            let mut tmp: Vec<T> = Vec::with_capacity(block.min(mine.len()));
            let mut start = 0;
            while start < mine.len() {
                let end = (start + block).min(mine.len());
                tmp.clear();
                tmp.extend_from_slice(&srcs[0][start..end]);
                for src in srcs.iter().skip(1) {
                    for (a, v) in tmp.iter_mut().zip(&src[start..end]) {
                        *a = T::combine(*a, *v, op);
                    }
                }
                for dst in srcs.iter_mut() {
                    dst[start..end].copy_from_slice(&tmp);
                }
                start = end;
            }
        }
        // Every share is done (second word of the flag lines).
        self.exchange(4, e)?;
        Ok(())
    }

    /// Gathers every rank's `mine` into `out` (rank r's data at `out[r·k .. (r+1)·k]`).
    ///
    /// # Errors
    ///
    /// `out` is not `size × mine.len()` long, or a communication error.
    pub fn allgather<T: bytemuck::Pod>(&self, mine: &[T], out: &mut [T]) -> Result<(), CommError> {
        let (n, k) = (self.n(), mine.len());
        if out.len() != n * k {
            return Err(CommError::BadBuffer {
                name: "allgather output".into(),
                why: format!("has {} elements, needs {} ranks × {k}", out.len(), n),
            });
        }
        if let Some(m) = self.w.native() {
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
                let s = unsafe { self.peer::<T>(p, off, end - start)? };
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
        let (me, n) = (self.me(), self.n());
        let mine = block_range(data.len(), me as u32, n as u32);
        if self.w.native().is_some() {
            // Shares may differ in length by one, so not MPI_Reduce_scatter_block.
            let mut all = data.to_vec();
            self.native_allreduce(&mut all, op)?;
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
                let first = unsafe { self.peer::<T>(0, off, end - start)? };
                let mut acc = first[lo - start..hi - start].to_vec();
                for p in 1..n {
                    // SAFETY: epoch protocol.
                    let s = unsafe { self.peer::<T>(p, off, end - start)? };
                    for (a, v) in acc.iter_mut().zip(&s[lo - start..hi - start]) {
                        *a = T::combine(*a, *v, op);
                    }
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
        if root >= self.n() {
            return Err(CommError::BadRank {
                rank: root,
                size: self.n(),
            });
        }
        if let Some(m) = self.w.native() {
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
                let s = unsafe { self.peer::<T>(root, off, end - start)? };
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
        if let Some(m) = self.w.native() {
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
                let s = unsafe { self.peer::<T>(j, off, n * len)? };
                recv[j * k + start..j * k + end].copy_from_slice(&s[me * len..(me + 1) * len]);
            }
            start = end;
            if start >= k {
                return Ok(());
            }
        }
    }

    /// A barrier over the collectives' flags (no data).
    ///
    /// # Errors
    ///
    /// A communication error.
    pub fn barrier(&self) -> Result<(), CommError> {
        if let Some(m) = self.w.native() {
            return m.barrier(self.comm().deadline());
        }
        let e = self.next_epoch();
        self.ready(e)
    }

    /// MPI's own allreduce (RMA windows: peers are not mapped). Types MPI cannot reduce
    /// (f16, bf16) are gathered and combined in rank order, the same on every rank.
    fn native_allreduce<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let Some(m) = &self.comm().inner.mpi else {
            return Ok(());
        };
        let d = self.comm().deadline();
        if crate::mpi::native_dtype(T::DTYPE) {
            return m.allreduce(bytemuck::cast_slice_mut(data), T::DTYPE, op, d);
        }
        let (n, len) = (self.n(), data.len());
        let mut all = vec![T::zeroed(); n * len];
        m.allgather(
            bytemuck::cast_slice(data),
            bytemuck::cast_slice_mut(&mut all),
            d,
        )?;
        for (i, x) in data.iter_mut().enumerate() {
            let mut a = all[i];
            for p in 1..n {
                a = T::combine(a, all[p * len + i], op);
            }
            *x = a;
        }
        Ok(())
    }
}
