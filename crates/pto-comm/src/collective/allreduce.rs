//! Allreduce: one-phase mesh, two-phase (reduce-scatter + allgather) and ring, on staged
//! copies or on data already in a window; the library's own where it serves better.

use pto_core::block_range;

use super::{
    describe_kind, op_code, Agreed, Algorithm, Collectives, ADDR_AT, LIBRARY_ALLREDUCE_BYTES, LINE,
    MESH_MAX_BYTES, SINGLE_COPY_MIN_BYTES, TREE_FANOUT, TREE_MIN_RANKS,
};
use crate::backend::library_reduces;
use crate::error::CommError;
use crate::reduce::{combine_into, ReduceOp, Reducible};
use crate::signal::SignalOp;
use crate::window::Window;

impl Collectives {
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
        self.comm()
            .collective_join("allreduce")
            .run(|| self.allreduce_with_in::<T>(data, op, algo))
    }

    fn allreduce_with_in<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<(), CommError> {
        if self
            .library_for::<T>(std::mem::size_of_val(data), algo)
            .is_some()
        {
            return self.library_allreduce(data, op);
        }
        let algo = self.resolve(algo, std::mem::size_of_val(data));
        // What every rank must pass alike, compared in each piece's ready exchange.
        // The algorithm too: ranks that chose differently (one could not reach its peers'
        // memory) fail alike instead of running different protocols.
        let desc = Agreed {
            bytes: std::mem::size_of_val(data) as u64,
            kind: (algo as u64) << 16 | (T::DTYPE as u64) << 8 | op_code(op),
        };
        if algo == Algorithm::SingleCopy && !data.is_empty() {
            // No staging, so no pieces: the whole buffer in one call.
            return self.allreduce_single_copy(data, op, desc);
        }
        for piece in data.chunks_mut(self.elems::<T>().max(1)) {
            match algo {
                Algorithm::Tree => self.allreduce_tree(piece, op, desc)?,
                Algorithm::TwoPhase => self.allreduce_two_phase(piece, op, desc)?,
                Algorithm::Ring => self.allreduce_ring(piece, op, desc)?,
                _ => self.allreduce_mesh(piece, op, desc)?,
            }
        }
        if data.is_empty() {
            // Keep every rank's epochs in step even for empty calls.
            let e = self.next_epoch();
            self.ready(e)?;
        }
        Ok(())
    }

    /// What [`Algorithm::Auto`] (or `algo`) runs for `bytes` of data on these ranks.
    fn resolve(&self, algo: Algorithm, bytes: usize) -> Algorithm {
        let direct = self.peers.available() && self.n() > 1;
        match algo {
            Algorithm::Auto if self.n() > TREE_MIN_RANKS => Algorithm::Tree,
            Algorithm::Auto if direct && bytes >= SINGLE_COPY_MIN_BYTES => Algorithm::SingleCopy,
            Algorithm::Auto if bytes <= MESH_MAX_BYTES || self.n() <= 2 => Algorithm::Mesh,
            Algorithm::Auto => Algorithm::TwoPhase,
            Algorithm::SingleCopy if !direct => Algorithm::TwoPhase,
            a => a,
        }
    }

    /// The name of the algorithm an [`Algorithm::Auto`] allreduce of `bytes` bytes of `T`
    /// uses here (`mesh`, `two-phase`, `ring`, or `library` when MPI's own runs it), for
    /// benchmark reports.
    pub fn allreduce_algorithm<T: Reducible>(&self, bytes: usize) -> &'static str {
        self.allreduce_algorithm_with::<T>(bytes, Algorithm::Auto)
    }

    /// [`Collectives::allreduce_algorithm`] of an allreduce asked to run `algo`.
    pub fn allreduce_algorithm_with<T: Reducible>(
        &self,
        bytes: usize,
        algo: Algorithm,
    ) -> &'static str {
        if let Some(l) = self.library_for::<T>(bytes, algo) {
            // Hierarchical once the first allreduce found several nodes with several ranks.
            return if l.is_hierarchical() {
                "hierarchical"
            } else {
                "library"
            };
        }
        match self.resolve(algo, bytes) {
            Algorithm::SingleCopy => "single-copy",
            Algorithm::Tree => "tree",
            Algorithm::TwoPhase => "two-phase",
            Algorithm::Ring => "ring",
            _ => "mesh",
        }
    }

    /// The library whose own allreduce serves one of `bytes` asked to run `algo`: always on
    /// RMA windows, and by choice for the sizes where it was measured faster
    /// ([`LIBRARY_ALLREDUCE_BYTES`]) when the caller leaves the algorithm to pto.
    fn library_for<T: Reducible>(
        &self,
        bytes: usize,
        algo: Algorithm,
    ) -> Option<&std::sync::Arc<crate::backend::Library>> {
        let by_choice = algo == Algorithm::Auto
            && library_reduces(T::DTYPE)
            && LIBRARY_ALLREDUCE_BYTES.contains(&bytes);
        self.w
            .library()
            .or_else(|| by_choice.then(|| self.comm().inner.io.library()).flatten())
    }

    fn allreduce_mesh<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        desc: Agreed,
    ) -> Result<(), CommError> {
        let e = self.next_epoch();
        let off = self.area(0, e);
        self.stage(off, data)?;
        self.ready_agreed(e, desc)?;
        let (me, n) = (self.me(), self.n());
        // Combine in rank order on every rank (x0 ⊕ x1 ⊕ ...), so every rank gets bit-identical
        // results. Work in blocks that stay in cache: each source is read once, the output
        // written once, and this rank's own contribution is read from `data` itself (the block
        // is overwritten only after it was used).
        let mut srcs = Vec::with_capacity(n);
        for p in 0..n {
            // SAFETY: epoch protocol (see `peer`).
            srcs.push(self.peer::<T>(p, off, data.len())?);
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
                combine_into(&mut tmp, s, op, false);
            }
            data[start..end].copy_from_slice(&tmp);
            start = end;
        }
        Ok(())
    }

    fn allreduce_ring<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        desc: Agreed,
    ) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let e = self.next_epoch();
        let off = self.area(0, e);
        self.stage(off, data)?;
        self.ready_agreed(e, desc)?;
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
        let wait_left = |k: u32| {
            self.w
                .wait_from(left, left * LINE + 8, base.wrapping_add(k))
        };
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
            let theirs = self.peer::<T>(left, off + r.start * size, r.len())?;
            // SAFETY: this rank's own staging area; only this rank writes it.
            let mine: Vec<T> = self.peer::<T>(me, off + r.start * size, r.len())?.to_vec();
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
            let theirs: Vec<T> = self
                .peer::<T>(left, off + r.start * size, r.len())?
                .to_vec();
            self.w
                .put(me, off + r.start * size, bytemuck::cast_slice(&theirs))?;
            step_done((n + s) as u32)?;
        }
        // SAFETY: this rank's own staging area, final now.
        let all = self.peer::<T>(me, off, data.len())?;
        data.copy_from_slice(all);
        // The right neighbour may still be reading my chunks: the next call's ready exchange
        // (which it enters only after finishing this one) protects them.
        Ok(())
    }

    /// [`Algorithm::SingleCopy`]: the callers' buffers are used where they are. Each rank
    /// publishes its buffer's address with its ready flag, then reduces its share (in rank
    /// order, so every rank's result is bit-identical to the mesh's) from every peer's buffer,
    /// block by block, and writes each reduced block into its own buffer and every peer's. A
    /// closing exchange says every share is everywhere. Share `r` of any buffer is read and
    /// written during the call by rank `r` alone (read first, then overwritten with the
    /// result), so nothing races; the buffers stay unchanged by anyone after the exchange.
    fn allreduce_single_copy<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        desc: Agreed,
    ) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let size = std::mem::size_of::<T>();
        let e = self.next_epoch();
        let at = ADDR_AT + 8 * (e as usize & 1);
        let addr = data.as_ptr() as u64;
        for p in (0..n).filter(|&p| p != me) {
            // Visible to `p` before this rank's ready flag (the notify releases it).
            self.w.put(p, me * LINE + at, &addr.to_le_bytes())?;
        }
        self.ready_agreed(e, desc)?;
        let mut addrs = vec![addr; n];
        for (p, a) in addrs.iter_mut().enumerate().filter(|(p, _)| *p != me) {
            let mut w = [0u8; 8];
            self.w.get(me, p * LINE + at, &mut w)?;
            *a = u64::from_le_bytes(w);
        }
        let at_elem = |p: usize, i: usize| addrs[p] + (i * size) as u64;
        let mine = block_range(data.len(), me as u32, n as u32);
        // Blocks of 256 KiB: few system calls, and the block, its peer's copy and the result
        // stay in a core's L2 (faster than 64 KiB at 1 and 16 MiB on 2 ranks here).
        let block = ((256 << 10) / size.max(1)).min(mine.len()).max(1);
        // Rank 0's block (when it is not this rank's), then every later peer's, one at a time.
        let mut acc = vec![T::zeroed(); if me == 0 { 0 } else { block }];
        let mut tmp = vec![T::zeroed(); if n > 2 || me == 0 { block } else { 0 }];
        let mut start = mine.start;
        while start < mine.end {
            let end = (start + block).min(mine.end);
            let k = end - start;
            let out = &mut data[start..end];
            // The running result is in `out` from rank `me` on (in place), in `acc` before.
            if me != 0 {
                self.peers.read(0, at_elem(0, start), &mut acc[..k])?;
            }
            for p in 1..n {
                if p == me {
                    combine_into(out, &acc[..k], op, true);
                    continue;
                }
                self.peers.read(p, at_elem(p, start), &mut tmp[..k])?;
                let running: &mut [T] = if p > me { out } else { &mut acc[..k] };
                combine_into(running, &tmp[..k], op, false);
            }
            let done = &data[start..end];
            for p in (0..n).filter(|&p| p != me) {
                self.peers.write(p, at_elem(p, start), done)?;
            }
            start = end;
        }
        // Every share is in every buffer once every rank has passed this.
        self.exchange(4, e)
    }

    /// [`Algorithm::Tree`]. Rank `r`'s children are `r·k + 1 ..= r·k + k` (k =
    /// [`TREE_FANOUT`]). Each rank stages its input, waits for each child's ready flag (its
    /// partial result is staged by then, and its arguments are in this rank's line), adds the
    /// children's partials to its own in child order, stages the sum and raises its ready flag
    /// on its parent; then it waits for its parent's done flag (word 1), copies the parent's
    /// staged result, stages it for its own children and raises their done flags. Everyone
    /// gets the root's result (bit-identical). A staging area is rewritten two epochs later
    /// only: by then the parent has finished with the partial (it sent done) and the children
    /// with the result (they sent the next ready). Arguments that differ from a child's abort
    /// the world with both ranks' (the other ranks wait in the tree, not in one exchange).
    pub(super) fn allreduce_tree<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        desc: Agreed,
    ) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let e = self.next_epoch();
        let off = self.area(0, e);
        let first = me * TREE_FANOUT + 1;
        let children = first.min(n)..(first + TREE_FANOUT).min(n);
        let len = data.len();
        self.stage(off, data)?;
        for c in children.clone() {
            self.w.wait_from(c, c * LINE, e)?;
            let Agreed { bytes, kind } = self.agreed_of(c, e)?;
            if (bytes, kind) != (desc.bytes, desc.kind) {
                let rank = |p: usize| self.comm().world_rank_of(p).unwrap_or(p);
                let each = format!(
                    "rank {}: {} bytes of {}; rank {}: {bytes} bytes of {}",
                    rank(me),
                    desc.bytes,
                    describe_kind(desc.kind, kind >> 16 != desc.kind >> 16),
                    rank(c),
                    describe_kind(kind, kind >> 16 != desc.kind >> 16),
                );
                let err = CommError::Disagree {
                    what: "allreduce",
                    each,
                };
                self.comm().abort(&err.to_string());
                return Err(err);
            }
            // SAFETY: epoch protocol: the child staged its partial before its ready flag and
            // leaves it alone until it has this call's result.
            let s = self.peer::<T>(c, off, len)?;
            combine_into(data, s, op, false);
        }
        if !children.is_empty() && len > 0 {
            self.stage(off, data)?;
        }
        if me > 0 {
            let parent = (me - 1) / TREE_FANOUT;
            // Visible to the parent before the ready flag (the notify releases it).
            self.put_agreed(parent, e, desc)?;
            self.w.notify(parent, me * LINE, e, SignalOp::Set)?;
            self.w.wait_from(parent, parent * LINE + 4, e)?;
            if len > 0 {
                // SAFETY: epoch protocol: the parent staged the result before its done flag.
                let s = self.peer::<T>(parent, off, len)?;
                data.copy_from_slice(s);
                if !children.is_empty() {
                    self.stage(off, data)?;
                }
            }
        }
        for c in children {
            self.w.notify(c, me * LINE + 4, e, SignalOp::Set)?;
        }
        Ok(())
    }

    fn allreduce_two_phase<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        desc: Agreed,
    ) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        let e = self.next_epoch();
        let (stage, result) = (self.area(0, e), self.area(1, e));
        self.stage(stage, data)?;
        self.ready_agreed(e, desc)?;
        // Phase 1: reduce my share from every rank's staging into my result area.
        let mine = block_range(data.len(), me as u32, n as u32);
        let mut acc: Vec<T> = {
            // SAFETY: epoch protocol.
            let s = self.peer::<T>(0, stage, data.len())?;
            s[mine.clone()].to_vec()
        };
        for p in 1..n {
            // SAFETY: epoch protocol.
            let s = self.peer::<T>(p, stage, data.len())?;
            combine_into(&mut acc, &s[mine.clone()], op, false);
        }
        let size = std::mem::size_of::<T>();
        self.w
            .put(me, result + mine.start * size, bytemuck::cast_slice(&acc))?;
        // Phase 2: once every share is reduced (the second flag of each line), gather them.
        self.exchange(4, e)?;
        for p in 0..n {
            let r = block_range(data.len(), p as u32, n as u32);
            // SAFETY: epoch protocol (result areas follow the same parity rule).
            let s = self.peer::<T>(p, result, data.len())?;
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
        self.comm()
            .collective_join("allreduce_window")
            .run(|| self.allreduce_window_in::<T>(w, offset, count, op))
    }

    fn allreduce_window_in<T: Reducible>(
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
        if w.library().is_some() {
            // RMA window: MPI's allreduce in place on this rank's own part, after syncing it.
            w.quiet();
            // This rank's own part, in place: peers do not write it during this collective
            // call (its contract), and this rank's other threads do not either.
            let local = w.inner.io.area_mut::<T>(me, me, offset, count)?;
            self.library_allreduce(local, op)?;
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
                // Chunk `mine` of every rank's part is read and written only by this rank
                // during this call (each rank owns its share), and no rank touches the data
                // again before the closing exchange below.
                srcs.push(w.inner.io.area_mut::<T>(
                    p,
                    me,
                    offset + mine.start * size,
                    mine.len(),
                )?);
            }
            let block = (16 << 10) / size.max(1);
            let mut tmp: Vec<T> = Vec::with_capacity(block.min(mine.len()));
            let mut start = 0;
            while start < mine.len() {
                let end = (start + block).min(mine.len());
                tmp.clear();
                tmp.extend_from_slice(&srcs[0][start..end]);
                for src in srcs.iter().skip(1) {
                    combine_into(&mut tmp, &src[start..end], op, false);
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
}
