//! Stand-ins for the `mpi` backend's types when the `mpi` feature is off: they have no values,
//! so every MPI branch of the shared code is statically unreachable.

use std::sync::Arc;
use std::time::Instant;

use pto_core::DType;

use super::mapping::Mapping;
use crate::error::CommError;
use crate::reduce::ReduceOp;

pub(crate) enum MpiComm {}

pub(crate) fn abort_job(_rank: usize, _message: &str) -> ! {
    unreachable!("no MPI job without the mpi feature")
}

pub(crate) fn reduces(_: DType) -> bool {
    false
}

#[allow(clippy::unused_self, dead_code)]
impl MpiComm {
    pub(crate) fn peers_mapped(&self) -> bool {
        match *self {}
    }
    pub(crate) fn is_hierarchical(&self) -> bool {
        match *self {}
    }
    pub(crate) fn world_memory(
        &self,
        _: usize,
        _: usize,
        _: Instant,
    ) -> Result<Mapping, CommError> {
        match *self {}
    }
    pub(crate) fn barrier(&self, _: Instant) -> Result<(), CommError> {
        match *self {}
    }
    pub(crate) fn min_max(&self, _: u64, _: Instant) -> Result<(u64, u64), CommError> {
        match *self {}
    }
    pub(crate) fn create_group(&self, _: &[u32], _: u64) -> Result<MpiComm, CommError> {
        match *self {}
    }
    pub(crate) fn shared_alloc(
        &self,
        _: String,
        _: usize,
        _: usize,
        _: Instant,
    ) -> Result<Mapping, CommError> {
        match *self {}
    }
    pub(crate) fn win_allocate(
        self: &Arc<Self>,
        _: String,
        _: usize,
        _: Instant,
    ) -> Result<rma::RmaWin, CommError> {
        match **self {}
    }
    pub(crate) fn allreduce(
        &self,
        _: &mut [u8],
        _: DType,
        _: ReduceOp,
        _: Instant,
    ) -> Result<(), CommError> {
        match *self {}
    }
    pub(crate) fn allgather(&self, _: &[u8], _: &mut [u8], _: Instant) -> Result<(), CommError> {
        match *self {}
    }
    pub(crate) fn broadcast(&self, _: &mut [u8], _: usize, _: Instant) -> Result<(), CommError> {
        match *self {}
    }
    pub(crate) fn all_to_all(
        &self,
        _: &[u8],
        _: &mut [u8],
        _: usize,
        _: Instant,
    ) -> Result<(), CommError> {
        match *self {}
    }
}

/// Stand-in for the RMA windows.
pub(crate) mod rma {
    use std::sync::Arc;

    use crate::backend::mapping::Mapping;
    use crate::backend::mpi_off::MpiComm;
    use crate::error::CommError;

    pub(crate) enum RmaWin {}

    #[allow(clippy::unused_self, dead_code)]
    impl RmaWin {
        pub(crate) fn comm(&self) -> &Arc<MpiComm> {
            match *self {}
        }
        pub(crate) fn local(&self) -> &Mapping {
            match *self {}
        }
        pub(crate) fn quiet(&self) -> Result<(), CommError> {
            match *self {}
        }
        pub(crate) fn sync(&self) -> Result<(), CommError> {
            match *self {}
        }
        pub(crate) fn put(&self, _: usize, _: usize, _: &[u8]) -> Result<(), CommError> {
            match *self {}
        }
        pub(crate) fn get(&self, _: usize, _: usize, _: &mut [u8]) -> Result<(), CommError> {
            match *self {}
        }
        pub(crate) fn fetch_add_u32(&self, _: usize, _: usize, _: u32) -> Result<u32, CommError> {
            match *self {}
        }
        pub(crate) fn fetch_add_u64(&self, _: usize, _: usize, _: u64) -> Result<u64, CommError> {
            match *self {}
        }
        pub(crate) fn notify(&self, _: usize, _: usize, _: u32, _: bool) -> Result<(), CommError> {
            match *self {}
        }
    }
}
