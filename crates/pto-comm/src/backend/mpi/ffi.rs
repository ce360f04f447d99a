//! The MPI library's calls: the handle wrapper, the process-wide lock that serializes every
//! call, error texts, datatype and operation handles, `MPI_IN_PLACE`, and ending the job.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use mpi_sys as sys;
use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
use pto_core::DType;

use crate::backend::mapping::Memory;
use crate::error::CommError;
use crate::reduce::ReduceOp;

/// A raw MPI handle (a pointer in Open MPI) that may cross threads.
#[derive(Clone, Copy)]
pub(super) struct H<T>(pub(super) T);
// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED (checked in `init`) and every call is
// made under `MPI_LOCK`, so a handle may be used from any thread.
unsafe impl<T> Send for H<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for H<T> {}

/// Calls `MPI_Finalize` when the last handle on MPI state goes.
pub(super) struct Finalizer;

impl Drop for Finalizer {
    fn drop(&mut self) {
        let _mpi = lock();
        // SAFETY: MPI was initialised by `init`; every window, communicator and piece of MPI
        // memory holds an `Arc<Finalizer>`, so nothing uses MPI after this.
        unsafe {
            sys::MPI_Finalize();
        }
    }
}

/// One thread at a time calls MPI (`MPI_THREAD_SERIALIZED`): Open MPI's one-sided component
/// over TCP (`osc pt2pt`) does not support `MPI_THREAD_MULTIPLE`, and chip cores call window
/// operations from several threads. Reentrant, because some operations are built of others;
/// waits take it per poll, never across a wait.
static MPI_LOCK: ReentrantMutex<()> = ReentrantMutex::new(());

pub(super) fn lock() -> ReentrantMutexGuard<'static, ()> {
    MPI_LOCK.lock()
}

fn error_text(code: c_int) -> String {
    let _mpi = lock();
    let mut buf = [0u8; 512];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds more than MPI_MAX_ERROR_STRING (256 in Open MPI and MPICH).
    let rc = unsafe { sys::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return format!("MPI error code {code}");
    }
    String::from_utf8_lossy(&buf[..(len.max(0) as usize).min(buf.len())]).into_owned()
}

pub(super) fn ok(rc: c_int, rank: usize, call: &'static str) -> Result<(), CommError> {
    if rc == 0 {
        Ok(())
    } else {
        let message = error_text(rc);
        tracing::warn!(rank, call, code = rc, message, "MPI call failed");
        Err(CommError::Mpi {
            rank,
            call,
            code: rc,
            message,
        })
    }
}

/// Prints `message` naming `rank` and ends the whole job.
pub(crate) fn abort_job(rank: usize, message: &str) -> ! {
    pto_shm::eprint_line!("pto: rank {rank} aborts the MPI job: {message}");
    // SAFETY: MPI_Abort is callable at any time after MPI_Init; it does not return.
    unsafe {
        sys::MPI_Abort(sys::RSMPI_COMM_WORLD, 1);
    }
    std::process::abort()
}

pub(super) fn int(n: usize, rank: usize, call: &'static str) -> Result<c_int, CommError> {
    c_int::try_from(n).map_err(|_| CommError::Mpi {
        rank,
        call,
        code: -1,
        message: format!("{n} elements do not fit MPI's int count"),
    })
}

/// `MPI_IN_PLACE`, which rsmpi does not export: its value is fixed by each library's ABI
/// (`(void *) 1` in Open MPI, `(void *) -1` in MPICH and its derivatives), so it is chosen by
/// the library `MPI_Get_library_version` names; `None` (copy instead) for any other.
pub(super) fn in_place() -> Option<*const c_void> {
    static KIND: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let v = *KIND.get_or_init(|| {
        let mut buf = vec![0u8; 8192];
        let mut len: c_int = 0;
        let _mpi = lock();
        // SAFETY: the buffer is larger than MPI_MAX_LIBRARY_VERSION_STRING (8192 at most in
        // the libraries we know; the call writes at most that many bytes).
        let rc = unsafe { sys::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
        if rc != 0 {
            return None;
        }
        let text =
            String::from_utf8_lossy(&buf[..(len.max(0) as usize).min(buf.len())]).into_owned();
        if text.contains("Open MPI") {
            Some(1)
        } else if text.contains("MPICH")
            || text.contains("Intel(R) MPI")
            || text.contains("MVAPICH")
        {
            Some(usize::MAX)
        } else {
            None
        }
    });
    v.map(|a| a as *const c_void)
}

/// `MPI_Allgather` and `MPI_Alltoall`: send buffer, count, type, receive buffer, count, type,
/// communicator.
pub(super) type ByteExchangeFn = unsafe extern "C" fn(
    *const c_void,
    c_int,
    sys::MPI_Datatype,
    *mut c_void,
    c_int,
    sys::MPI_Datatype,
    sys::MPI_Comm,
) -> c_int;

pub(super) fn datatype(d: DType, rank: usize) -> Result<(sys::MPI_Datatype, usize), CommError> {
    // SAFETY: reading MPI's predefined datatype handles (initialised statics).
    let ty = unsafe {
        match d {
            DType::F32 => sys::RSMPI_FLOAT,
            DType::F64 => sys::RSMPI_DOUBLE,
            DType::I32 => sys::RSMPI_INT32_T,
            DType::I64 => sys::RSMPI_INT64_T,
            _ => {
                return Err(CommError::Mpi {
                    rank,
                    call: "datatype",
                    code: -1,
                    message: format!("MPI has no predefined datatype for {d}"),
                })
            }
        }
    };
    Ok((ty, d.size()))
}

/// True when MPI reduces `d` itself.
pub(crate) fn reduces(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::I32 | DType::I64)
}

pub(super) fn op_handle(op: ReduceOp) -> sys::MPI_Op {
    // SAFETY: reading MPI's predefined operation handles.
    unsafe {
        match op {
            ReduceOp::Sum => sys::RSMPI_SUM,
            ReduceOp::Max => sys::RSMPI_MAX,
            ReduceOp::Min => sys::RSMPI_MIN,
            ReduceOp::Prod => sys::RSMPI_PROD,
        }
    }
}

/// Memory an MPI window owns (freed by `MPI_Finalize`, which waits for this handle).
pub(super) struct MpiMemory {
    pub(super) base: H<*mut u8>,
    pub(super) len: usize,
    pub(super) name: String,
    pub(super) _fin: Arc<Finalizer>,
}

// SAFETY: `base` is the 64-aligned start of `len` bytes of MPI window memory, valid until
// MPI_Finalize, which cannot run while this value holds its `Arc<Finalizer>`.
unsafe impl Memory for MpiMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.base.0
    }
    fn len(&self) -> usize {
        self.len
    }
    fn name(&self) -> &str {
        &self.name
    }
}
