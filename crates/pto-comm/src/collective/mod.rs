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

use parking_lot::Mutex;

use crate::backend::direct::PeerMemory;
use crate::backend::library_reduces;
use crate::comm::Comm;
use crate::error::CommError;
use crate::reduce::{ReduceOp, Reducible};
use crate::signal::SignalOp;
use crate::window::{Window, WindowSpec};

mod allreduce;
mod exchange;

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
    /// Two phases on the callers' own buffers, with no staging: each rank reads its share of
    /// every peer's buffer where it is (one copy: threads read it, processes of one host use
    /// cross-memory attach), reduces it into its own buffer, then reads the other reduced
    /// shares from their owners. Where peers' memory cannot be read (MPI, or a kernel that
    /// refuses it), it runs as [`Algorithm::TwoPhase`].
    SingleCopy,
    /// A tree of fan-out [`TREE_FANOUT`]: each rank adds its children's partial sums to its
    /// own and passes the result to its parent; the root's result goes back down. O(ranks)
    /// flags per call instead of O(ranks²): what [`Algorithm::Auto`] runs above
    /// [`TREE_MIN_RANKS`] ranks.
    Tree,
}

/// Above this many ranks, [`Algorithm::Auto`] allreduces (and the collectives' barrier) go
/// through a tree: the flat exchanges cost O(ranks²) flags per call.
pub const TREE_MIN_RANKS: usize = 16;

/// Children per rank in [`Algorithm::Tree`] (1,024 ranks are 4 levels: 1, 16, 256, 751).
pub const TREE_FANOUT: usize = 16;

/// Allreduces of at least this many bytes use [`Algorithm::SingleCopy`] when
/// [`Algorithm::Auto`] chooses and peers' memory can be read. Below it the staged algorithms
/// are faster: a system call per peer and block, and pinning the peer's pages, cost more than
/// the copies they save (measured on 2 CPUs, shm: on 4 ranks 256 KiB took 83-87 µs single-copy
/// against 34-55 two-phase, 2 MiB 515-534 against 366-562, 4 MiB 992-1297 against 1274-1448;
/// on 2 ranks against the mesh, 256 KiB 47-55 against 27-29 µs, 2 MiB 169-177 against
/// 122-230).
pub const SINGLE_COPY_MIN_BYTES: usize = 2 << 20;

/// Messages up to this many bytes use the mesh allreduce when [`Algorithm::Auto`] chooses.
pub const MESH_MAX_BYTES: usize = 64 << 10;

pub(super) const LINE: usize = 64;

/// Where in a rank's flag line its arguments go (two words, by epoch parity): `+0` is the
/// ready flag, `+4` the second phase's (and the single-copy closing one), `+8` the ring's.
const AGREED_AT: usize = 16;

/// Where in a rank's flag line the address of its buffer goes, for a single-copy call (two
/// words, by epoch parity).
pub(super) const ADDR_AT: usize = 48;

/// What every rank of a collective call must pass alike: the byte count and a code of the
/// element type and operation. Each rank writes its own into every peer's line before its
/// ready flag and compares the peers' after them: a call whose ranks disagree fails on every
/// rank, naming the rank and both values, in the same exchange (no extra round trip).
#[derive(Clone, Copy, Debug)]
pub(super) struct Agreed {
    pub(super) bytes: u64,
    pub(super) kind: u64,
}

impl Agreed {
    fn to_words(self) -> [u8; 16] {
        let mut w = [0u8; 16];
        w[..8].copy_from_slice(&self.bytes.to_le_bytes());
        w[8..].copy_from_slice(&self.kind.to_le_bytes());
        w
    }

    fn from_words(w: [u8; 16]) -> Agreed {
        let word = |b: &[u8]| {
            let mut x = [0u8; 8];
            x.copy_from_slice(b);
            u64::from_le_bytes(x)
        };
        Agreed {
            bytes: word(&w[..8]),
            kind: word(&w[8..]),
        }
    }
}

/// [`Agreed::kind`] in words: `f32, op sum`.
pub(super) fn describe_kind(kind: u64, with_algorithm: bool) -> String {
    let dtype = pto_core::DType::ALL
        .get(((kind >> 8) & 0xff) as usize)
        .map_or_else(|| "?".to_string(), ToString::to_string);
    let op = match kind & 0xff {
        1 => "sum",
        2 => "max",
        3 => "min",
        4 => "prod",
        _ => "?",
    };
    let algo = match if with_algorithm { kind >> 16 } else { 0 } {
        1 => ", mesh",
        2 => ", two-phase",
        3 => ", ring",
        4 => ", single-copy",
        5 => ", tree",
        _ => "",
    };
    format!("{dtype}, op {op}{algo}")
}

/// A reduction's code in [`Agreed::kind`].
pub(super) fn op_code(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Sum => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Prod => 4,
    }
}

/// On the MPI backend with shared windows, [`Algorithm::Auto`] hands allreduces of this many
/// bytes (and a dtype MPI reduces) to MPI's own `MPI_Allreduce`: in `pto bench allreduce
/// --backend mpi` on 2 and 4 ranks it was as fast or up to 1.2x faster there, and pto's own
/// was faster below (up to 3x) and at 64 MiB (see docs/BENCHMARKS.md).
pub const LIBRARY_ALLREDUCE_BYTES: std::ops::Range<usize> = (256 << 10)..(32 << 20);

/// Collectives over one communicator, with their own window.
#[derive(Debug)]
pub struct Collectives {
    w: Window,
    /// How this rank reads its peers' buffers (single-copy allreduce).
    peers: PeerMemory,
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
        // Every member has joined (the allocation met them all): their pids are known.
        let world = comm.world_ref();
        let members = comm
            .members()
            .into_iter()
            .map(|r| (r, world.pid(r)))
            .collect();
        let peers = if comm.inner.io.library().is_some() {
            PeerMemory::None
        } else {
            world.transport.peer_memory(members)
        };
        Ok(Collectives {
            w,
            peers,
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

    pub(super) fn n(&self) -> usize {
        self.w.ranks()
    }

    pub(super) fn me(&self) -> usize {
        self.w.rank()
    }

    pub(super) fn area(&self, which: usize, epoch: u32) -> usize {
        // which: 0 staging, 1 result; double-buffered by epoch parity.
        self.n() * LINE + (2 * which + (epoch as usize & 1)) * self.cap
    }

    /// Starts an epoch: returns it.
    pub(super) fn next_epoch(&self) -> u32 {
        let mut e = self.epoch.lock();
        *e = e.wrapping_add(1);
        *e
    }

    /// Sets this rank's flag at `flag_base` on every peer to `epoch`, then waits for every
    /// peer's flag in this rank's window to reach it.
    pub(super) fn exchange(&self, flag_base: usize, epoch: u32) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        for p in 0..n {
            if p != me {
                self.w
                    .notify(p, flag_base + me * LINE, epoch, SignalOp::Set)?;
            }
        }
        for p in 0..n {
            if p != me {
                self.w.wait_from(p, flag_base + p * LINE, epoch)?;
            }
        }
        Ok(())
    }

    pub(super) fn ready(&self, epoch: u32) -> Result<(), CommError> {
        self.exchange(0, epoch)
    }

    /// Writes this rank's arguments `a` of `epoch` into its line in `peer`'s window (before
    /// the flag that releases them).
    pub(super) fn put_agreed(&self, peer: usize, epoch: u32, a: Agreed) -> Result<(), CommError> {
        let at = AGREED_AT + 16 * (epoch as usize & 1);
        self.w.put(peer, self.me() * LINE + at, &a.to_words())
    }

    /// The arguments rank `p` wrote for `epoch` into its line of this rank's window (after its
    /// flag was seen).
    pub(super) fn agreed_of(&self, p: usize, epoch: u32) -> Result<Agreed, CommError> {
        let at = AGREED_AT + 16 * (epoch as usize & 1);
        let mut w = [0u8; 16];
        self.w.get(self.me(), p * LINE + at, &mut w)?;
        Ok(Agreed::from_words(w))
    }

    /// [`Collectives::ready`], comparing what every rank passed ([`Agreed`]). The words are
    /// double-buffered by epoch parity: a peer rewrites this epoch's only two epochs later,
    /// after it has seen this rank's next ready flag, which comes after this comparison.
    pub(super) fn ready_agreed(&self, epoch: u32, a: Agreed) -> Result<(), CommError> {
        let (me, n) = (self.me(), self.n());
        for p in 0..n {
            if p != me {
                // Visible to `p` before this rank's ready flag (the notify releases it).
                self.put_agreed(p, epoch, a)?;
            }
        }
        self.ready(epoch)?;
        let mut all = Vec::with_capacity(n);
        for p in 0..n {
            let theirs = if p == me {
                a
            } else {
                self.agreed_of(p, epoch)?
            };
            all.push((theirs.bytes, theirs.kind));
        }
        if all.iter().any(|x| *x != (a.bytes, a.kind)) {
            // The algorithm is named only where the ranks chose differently.
            let algos_differ = all.iter().any(|x| x.1 >> 16 != a.kind >> 16);
            let each: Vec<String> = all
                .iter()
                .enumerate()
                .map(|(p, (bytes, kind))| {
                    let rank = self.comm().world_rank_of(p).unwrap_or(p);
                    format!(
                        "rank {rank}: {bytes} bytes of {}",
                        describe_kind(*kind, algos_differ)
                    )
                })
                .collect();
            return Err(CommError::Disagree {
                what: "allreduce",
                each: each.join("; "),
            });
        }
        Ok(())
    }

    /// Rank `r`'s area at `off`, `len` elements, read in place. Only under the epoch
    /// protocol: the area is not written by its owner while the view lives (it was written
    /// before the owner's ready flag of this epoch was seen, and the owner rewrites it only two
    /// epochs later).
    pub(super) fn peer<T: bytemuck::Pod>(
        &self,
        r: usize,
        off: usize,
        len: usize,
    ) -> Result<&[T], CommError> {
        self.w.inner.io.area(r, self.me(), off, len)
    }

    pub(super) fn stage<T: bytemuck::Pod>(&self, off: usize, data: &[T]) -> Result<(), CommError> {
        self.w.put(self.me(), off, bytemuck::cast_slice(data))
    }

    pub(super) fn elems<T>(&self) -> usize {
        self.cap / std::mem::size_of::<T>().max(1)
    }

    /// A barrier over the collectives' flags (no data).
    ///
    /// # Errors
    ///
    /// A communication error.
    pub fn barrier(&self) -> Result<(), CommError> {
        self.comm()
            .collective_join("barrier")
            .run(|| self.barrier_in())
    }

    fn barrier_in(&self) -> Result<(), CommError> {
        if let Some(m) = self.w.library() {
            return m.barrier(self.comm().deadline());
        }
        if self.n() > TREE_MIN_RANKS {
            // An allreduce of nothing: up the tree and back down, O(ranks) flags.
            let desc = Agreed { bytes: 0, kind: 0 };
            return self.allreduce_tree::<i32>(&mut [], ReduceOp::Sum, desc);
        }
        let e = self.next_epoch();
        self.ready(e)
    }

    /// MPI's own allreduce (RMA windows: peers are not mapped). Types MPI cannot reduce
    /// (f16, bf16) are gathered and combined in rank order, the same on every rank.
    pub(super) fn library_allreduce<T: Reducible>(
        &self,
        data: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let Some(m) = self.comm().inner.io.library() else {
            return Ok(());
        };
        let d = self.comm().deadline();
        if library_reduces(T::DTYPE) {
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
