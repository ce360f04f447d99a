//! Reading a peer's private memory where it is: the single-copy collectives read the caller's
//! buffers of their peers instead of staging every byte through the window first. Threads of
//! one process read the peer's address; processes of one host read it with one kernel copy
//! (`pto_shm::cma`); MPI ranks cannot (their collectives stage).
//!
//! Only under the single-copy protocol of `docs/design/collectives.md`: a peer's range is read
//! while that peer is blocked inside the same collective call, which keeps the buffer alive,
//! and nobody writes the range during the phase that reads it.

#![allow(unsafe_code)]

use crate::error::CommError;

/// How this rank reaches the memory of the peers of one communicator.
#[derive(Debug, Clone)]
pub(crate) enum PeerMemory {
    /// Not at all: collectives stage.
    None,
    /// Threads of this process.
    Threads,
    /// Processes of this host, by comm rank: `(world rank, pid)`.
    Processes(Vec<(usize, u32)>),
}

impl PeerMemory {
    /// The error of a single-copy call where peers' memory cannot be reached.
    fn off(peer: usize) -> CommError {
        CommError::NotMapped {
            rank: peer,
            why: "the single-copy path is off on this backend",
        }
    }

    /// A failed cross-memory copy with comm rank `peer`, naming its world rank and pid.
    fn failed(pids: &[(usize, u32)], peer: usize, source: std::io::Error) -> CommError {
        let (rank, pid) = pids.get(peer).copied().unwrap_or((peer, 0));
        CommError::PeerRead { rank, pid, source }
    }

    fn pid(pids: &[(usize, u32)], peer: usize) -> u32 {
        pids.get(peer).map_or(0, |p| p.1)
    }

    /// Whether peers' memory can be read.
    pub(crate) fn available(&self) -> bool {
        !matches!(self, PeerMemory::None)
    }

    /// Copies `dst.len()` elements at `addr` in comm rank `peer`'s memory into `dst`.
    ///
    /// Only under the single-copy protocol: `addr` is the start of `dst.len()` elements of a
    /// live buffer of `peer` that nobody writes during this read.
    pub(crate) fn read<T: bytemuck::Pod>(
        &self,
        peer: usize,
        addr: u64,
        dst: &mut [T],
    ) -> Result<(), CommError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        match self {
            PeerMemory::None => Err(Self::off(peer)),
            PeerMemory::Threads => {
                // SAFETY: the protocol above: `addr` points to `bytes.len()` bytes of a buffer
                // of a thread of this process that is blocked in the same collective call (so
                // the buffer lives) and nobody writes those bytes during this phase; `bytes`
                // is this rank's own, distinct buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        addr as usize as *const u8,
                        bytes.as_mut_ptr(),
                        bytes.len(),
                    );
                }
                Ok(())
            }
            PeerMemory::Processes(pids) => pto_shm::cma::read(Self::pid(pids, peer), addr, bytes)
                .map_err(|e| Self::failed(pids, peer, e)),
        }
    }

    /// Copies `src` to `addr` in comm rank `peer`'s memory.
    ///
    /// Only under the single-copy protocol: `addr` is the start of `src.len()` elements of a
    /// live buffer of `peer` that nobody else reads or writes during this write.
    pub(crate) fn write<T: bytemuck::Pod>(
        &self,
        peer: usize,
        addr: u64,
        src: &[T],
    ) -> Result<(), CommError> {
        let bytes: &[u8] = bytemuck::cast_slice(src);
        match self {
            PeerMemory::None => Err(Self::off(peer)),
            PeerMemory::Threads => {
                // SAFETY: the protocol above: `addr` points to `bytes.len()` bytes of a buffer
                // of a thread of this process that is blocked in the same collective call (so
                // the buffer lives) and that nobody else touches during this phase; `bytes` is
                // this rank's own, distinct memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        addr as usize as *mut u8,
                        bytes.len(),
                    );
                }
                Ok(())
            }
            PeerMemory::Processes(pids) => pto_shm::cma::write(Self::pid(pids, peer), addr, bytes)
                .map_err(|e| Self::failed(pids, peer, e)),
        }
    }
}
