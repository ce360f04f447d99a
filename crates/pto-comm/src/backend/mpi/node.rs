//! Hierarchical allreduce across nodes: the ranks of a node combine their data in memory they
//! share (an `MPI_Win_allocate_shared` window of the node), one leader per node runs
//! `MPI_Allreduce` across the nodes, and every rank of the node reads the result back. Only
//! one rank per node crosses the network, and the network carries one message per node
//! instead of one per rank. Used on RMA windows (several nodes) when some node holds several
//! ranks; nodes are the MPI library's (`MPI_Comm_split_type` shared) or, with
//! `PTO_MPI_NODE_RANKS=k`, groups of k consecutive ranks (to try a hierarchy on one host).
//! See `docs/design/scale.md`.

use std::ffi::c_int;
use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

use mpi_sys as sys;
use pto_core::DType;

use super::ffi::lock;
use super::MpiComm;
use crate::backend::mapping::Mapping;
use crate::error::CommError;
use crate::reduce::{combine_into, ReduceOp, Reducible};
use pto_shm::HEADER_LEN;

/// Bytes of one rank's slot in the node's staging memory: larger allreduces run in pieces.
const SLOT: usize = 1 << 20;
/// Where the slots start in the node segment: after its header and the node's barrier.
const SLOTS: usize = HEADER_LEN + pto_shm::barrier::Barrier::SIZE;

/// Environment variable: group ranks into nodes of this many consecutive ranks.
pub const ENV_NODE_RANKS: &str = "PTO_MPI_NODE_RANKS";

/// A communicator's nodes, as one rank sees them.
pub(crate) struct Hierarchy {
    /// The ranks of this node.
    node: MpiComm,
    /// Every node's leader (node rank 0); `None` on the other ranks.
    leaders: Option<MpiComm>,
    node_rank: usize,
    node_size: usize,
    /// `node_size` slots of [`SLOT`] bytes, mapped by every rank of the node.
    staging: Mapping,
}

impl MpiComm {
    /// `MPI_Comm_split` of this communicator (`color` `None`: this rank takes no part).
    fn split(&self, color: Option<usize>, key: usize) -> Result<Option<MpiComm>, CommError> {
        let color = match color {
            // SAFETY: reading a predefined constant.
            None => unsafe { sys::RSMPI_UNDEFINED },
            Some(c) => super::ffi::int(c, self.world_rank, "MPI_Comm_split")?,
        };
        let key = super::ffi::int(key, self.world_rank, "MPI_Comm_split")?;
        let _mpi = lock();
        // SAFETY: the out-parameter is written by the call; the communicator is valid while
        // `self` lives.
        unsafe {
            let mut c: sys::MPI_Comm = std::mem::zeroed();
            self.ok(
                sys::MPI_Comm_split(self.comm.0, color, key, &mut c),
                "MPI_Comm_split",
            )?;
            if c == sys::RSMPI_COMM_NULL {
                return Ok(None);
            }
            self.ok(
                sys::MPI_Comm_set_errhandler(c, sys::RSMPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler",
            )?;
            Ok(Some(self.derived(c)))
        }
    }

    /// The rank in this communicator of `sub`'s first member (a local query of the groups).
    fn first_member_of(&self, sub: &MpiComm) -> Result<usize, CommError> {
        let _mpi = lock();
        // SAFETY: both communicators are valid while borrowed; the groups are freed after use;
        // the rank arrays hold one element each.
        unsafe {
            let mut gs: sys::MPI_Group = std::mem::zeroed();
            let mut gc: sys::MPI_Group = std::mem::zeroed();
            self.ok(sys::MPI_Comm_group(sub.comm.0, &mut gs), "MPI_Comm_group")?;
            let rc = sys::MPI_Comm_group(self.comm.0, &mut gc);
            if rc != 0 {
                sys::MPI_Group_free(&mut gs);
            }
            self.ok(rc, "MPI_Comm_group")?;
            let zero: [c_int; 1] = [0];
            let mut out: [c_int; 1] = [-1];
            let rc = sys::MPI_Group_translate_ranks(gs, 1, zero.as_ptr(), gc, out.as_mut_ptr());
            sys::MPI_Group_free(&mut gs);
            sys::MPI_Group_free(&mut gc);
            self.ok(rc, "MPI_Group_translate_ranks")?;
            usize::try_from(out[0]).map_err(|_| self.lost("MPI_Group_translate_ranks"))
        }
    }

    /// The ranks of this communicator that share this rank's node (`MPI_Comm_split_type`).
    fn split_shared(&self) -> Result<MpiComm, CommError> {
        let _mpi = lock();
        // SAFETY: as in `split`.
        unsafe {
            let mut c: sys::MPI_Comm = std::mem::zeroed();
            self.ok(
                sys::MPI_Comm_split_type(
                    self.comm.0,
                    sys::RSMPI_COMM_TYPE_SHARED as c_int,
                    0,
                    sys::RSMPI_INFO_NULL,
                    &mut c,
                ),
                "MPI_Comm_split_type",
            )?;
            self.ok(
                sys::MPI_Comm_set_errhandler(c, sys::RSMPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler",
            )?;
            Ok(self.derived(c))
        }
    }

    /// The hierarchy of this communicator's nodes, built on first use (collectively: every
    /// member calls it at the same collective), or `None` when it would not help: one node,
    /// shared windows (pto's own algorithms already run in shared memory), or one rank per node.
    pub(crate) fn hierarchy(&self, deadline: Instant) -> Result<Option<&Hierarchy>, CommError> {
        if let Some(h) = self.hier.get() {
            return Ok(h.as_deref());
        }
        let built = self.build_hierarchy(deadline)?.map(Box::new);
        Ok(self.hier.get_or_init(|| built).as_deref())
    }

    fn build_hierarchy(&self, deadline: Instant) -> Result<Option<Hierarchy>, CommError> {
        if self.mode == super::Mode::Shared {
            return Ok(None);
        }
        let (rank, size) = (self.rank()?, self.size()?);
        let by =
            pto_core::config::int(ENV_NODE_RANKS).map_err(|e| CommError::Env(e.to_string()))?;
        let node = match by {
            Some(k) => {
                let k = k as usize;
                match self.split(Some(rank / k), rank)? {
                    Some(n) => n,
                    None => return Err(self.lost("MPI_Comm_split")),
                }
            }
            None => self.split_shared()?,
        };
        let (node_rank, node_size) = (node.rank()?, node.size()?);
        // Every rank names its node by its lowest rank; the nodes must partition the ranks
        // (a library that gets locality wrong, as Open MPI can when two hosts share a
        // hostname, would make ranks wait in different groups): else no hierarchy.
        // (Found without communicating on `node`: a broken node communicator must not be used.)
        let first = self.first_member_of(&node)? as u64;
        let mut all = vec![0u8; 8 * size];
        self.allgather(&first.to_le_bytes(), &mut all, deadline)?;
        let firsts: Vec<u64> = all
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        let count = |f: u64| firsts.iter().filter(|&&x| x == f).count();
        let consistent = firsts.iter().enumerate().all(|(r, &f)| {
            let f_us = f as usize;
            f_us < size && firsts[f_us] == f && (r == f_us || f_us < r)
        }) && count(first) == node_size
            && (node_rank == 0) == (first == rank as u64);
        let (agreed, _) = self.min_max(u64::from(consistent), deadline)?;
        if agreed == 0 {
            if rank == 0 {
                tracing::warn!("the MPI library's nodes do not partition the ranks: allreduces stay flat (set {ENV_NODE_RANKS} to group ranks yourself)");
            }
            return Ok(None);
        }
        // Worth it only when some node holds several ranks and there are several nodes.
        let largest = firsts.iter().map(|&f| count(f)).max().unwrap_or(1);
        if largest <= 1 || count(firsts[0]) == size {
            return Ok(None);
        }
        let leaders = self.split((node_rank == 0).then_some(0), rank)?;
        let staging = node.node_segment(node_rank, SLOTS - HEADER_LEN + node_size * SLOT, deadline);
        // Every node must have its staging memory, or the leaders would wait for a node that
        // gave up: all agree before any allreduce runs.
        let (all_ok, _) = self.min_max(u64::from(staging.is_ok()), deadline)?;
        let staging = match (staging, all_ok) {
            (Ok(s), 1) => s,
            (Err(e), _) => return Err(e),
            (Ok(_), _) => {
                return Err(CommError::Env(format!(
                    "rank {}: another node could not set up a hierarchical allreduce",
                    self.world_rank
                )))
            }
        };
        tracing::debug!(rank, node_rank, node_size, "hierarchical allreduce ready");
        Ok(Some(Hierarchy {
            node,
            leaders,
            node_rank,
            node_size,
            staging,
        }))
    }

    /// True once this communicator's allreduces run hierarchically (after the first one).
    pub(crate) fn is_hierarchical(&self) -> bool {
        matches!(self.hier.get(), Some(Some(_)))
    }

    /// `len` bytes shared by the node's ranks (after a segment header): a POSIX shared memory
    /// segment that node rank 0 creates and names to the others with an `MPI_Bcast`, and
    /// unlinks once every rank has mapped it (nothing is left in `/dev/shm` even if the job
    /// dies). Not `MPI_Win_allocate_shared`: Open MPI's one-sided component over TCP (`osc
    /// pt2pt`) has no shared windows.
    fn node_segment(
        &self,
        node_rank: usize,
        len: usize,
        deadline: Instant,
    ) -> Result<Mapping, CommError> {
        let shm = |e: pto_shm::ShmError| CommError::Env(format!("rank {}: {e}", self.world_rank));
        let mut name = [0u8; 256];
        let created = if node_rank == 0 {
            let n = pto_shm::Segment::fresh_name("node");
            let seg = pto_shm::Segment::create(
                &n,
                HEADER_LEN + len,
                pto_shm::HeaderInit {
                    kind: pto_shm::segment_kind::WINDOW,
                    per_rank: SLOT as u64,
                    ..pto_shm::HeaderInit::default()
                },
            )
            .map_err(shm);
            if seg.is_ok() && n.len() < name.len() {
                name[..n.len()].copy_from_slice(n.as_bytes());
            }
            Some(seg)
        } else {
            None
        };
        // Sent even when the creation failed (an empty name), so nobody waits for a name.
        self.broadcast(&mut name, 0, deadline)?;
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let seg = match created {
            Some(seg) => seg?,
            None if end == 0 => {
                return Err(CommError::Env(format!(
                    "rank {}: the node's first rank could not create the staging segment of a hierarchical allreduce",
                    self.world_rank
                )))
            }
            None => {
                let n = std::str::from_utf8(&name[..end])
                    .map_err(|_| CommError::Env("node segment name is not UTF-8".into()))?;
                pto_shm::Segment::open(n, deadline).map_err(shm)?
            }
        };
        self.barrier(deadline)?;
        let mut seg = seg;
        if seg.is_owner() {
            seg.disown();
            pto_shm::Segment::unlink(seg.name()).map_err(shm)?;
        }
        Ok(Mapping::from(std::sync::Arc::new(seg)))
    }

    fn lost(&self, call: &'static str) -> CommError {
        CommError::Mpi {
            rank: self.world_rank,
            call,
            code: -1,
            message: "this rank was left out of its own node's communicator".into(),
        }
    }
}

impl Hierarchy {
    /// Allreduce of `data` (elements of `dtype`: f32, f64, i32 or i64) in place, through the
    /// node's shared memory and the leaders' `MPI_Allreduce`. Every rank gets the leaders'
    /// result, so the ranks' results are bit-identical.
    pub(crate) fn allreduce(
        &self,
        data: &mut [u8],
        dtype: DType,
        op: ReduceOp,
        deadline: Instant,
    ) -> Result<(), CommError> {
        // SAFETY: the staging segment holds SLOTS bytes of header and barrier, then the slots.
        let base = unsafe { self.staging.as_ptr().add(SLOTS) };
        let elem = dtype.size().max(1);
        let piece = SLOT - SLOT % (64 * elem);
        for chunk in data.chunks_mut(piece) {
            let len = chunk.len();
            // 1. Every rank writes its piece into its slot.
            self.staging
                .write_bytes(SLOTS + self.node_rank * SLOT, chunk);
            self.sync(deadline)?;
            // 2. Rank r of the node reduces share r of the piece over every slot into slot 0.
            let per = len.div_ceil(self.node_size * elem) * elem;
            let lo = (self.node_rank * per).min(len);
            let hi = (lo + per).min(len);
            if lo < hi {
                // SAFETY: the staging mapping holds `node_size` slots of SLOT bytes and
                // `hi <= len <= SLOT`; between the barriers around this step only this rank
                // writes bytes lo..hi of slot 0, and nobody writes the other slots.
                let acc = unsafe { std::slice::from_raw_parts_mut(base.add(lo), hi - lo) };
                for s in 1..self.node_size {
                    // SAFETY: as above; slot s is read only in this step.
                    let v = unsafe { std::slice::from_raw_parts(base.add(s * SLOT + lo), hi - lo) };
                    combine_bytes(acc, v, dtype, op)?;
                }
            }
            self.sync(deadline)?;
            // 3. The leaders combine the nodes' sums.
            if let Some(l) = &self.leaders {
                // SAFETY: slot 0's first `len` bytes; between the barriers only the leader
                // touches them.
                let sum = unsafe { std::slice::from_raw_parts_mut(base, len) };
                l.allreduce_flat(sum, dtype, op, deadline)?;
            }
            self.sync(deadline)?;
            // 4. Everyone reads the result; the barrier after it frees the slots for reuse.
            self.staging.read_bytes(SLOTS, chunk);
            self.sync(deadline)?;
        }
        Ok(())
    }

    /// A barrier of the node's ranks in their shared segment (a sense-reversing barrier that
    /// spins, then parks: no MPI call), which also orders the shared accesses around it. A
    /// node peer that dies ends the whole MPI job (the launcher's business), so the only
    /// failure here is the deadline.
    fn sync(&self, deadline: Instant) -> Result<(), CommError> {
        let start = Instant::now();
        fence(Ordering::SeqCst);
        self.staging
            .barrier(HEADER_LEN)
            .wait(self.node_size as u32, deadline, || Ok::<(), CommError>(()))
            .map_err(|e| match e {
                pto_shm::wait::WaitError::Check(e) => e,
                pto_shm::wait::WaitError::Timeout { .. } => CommError::Timeout {
                    what: "the node barrier of a hierarchical allreduce".into(),
                    rank: self.node.world_rank,
                    waited: start.elapsed(),
                },
            })?;
        fence(Ordering::SeqCst);
        Ok(())
    }
}

/// `acc op= v`, elementwise, for the dtypes MPI reduces.
fn combine_bytes(acc: &mut [u8], v: &[u8], dtype: DType, op: ReduceOp) -> Result<(), CommError> {
    fn typed<T: Reducible>(acc: &mut [u8], v: &[u8], op: ReduceOp) -> Result<(), CommError> {
        match (
            bytemuck::try_cast_slice_mut::<u8, T>(acc),
            bytemuck::try_cast_slice::<u8, T>(v),
        ) {
            (Ok(a), Ok(b)) => {
                combine_into(a, b, op, false);
                Ok(())
            }
            _ => Err(CommError::Env(
                "hierarchical allreduce: a misaligned piece of staging memory".into(),
            )),
        }
    }
    match dtype {
        DType::F32 => typed::<f32>(acc, v, op),
        DType::F64 => typed::<f64>(acc, v, op),
        DType::I32 => typed::<i32>(acc, v, op),
        DType::I64 => typed::<i64>(acc, v, op),
        other => Err(CommError::Env(format!(
            "hierarchical allreduce: {other:?} is not reduced by MPI"
        ))),
    }
}
