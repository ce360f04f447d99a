//! The watchdog of blocking MPI calls: a blocking collective cannot be abandoned, so when one
//! has not returned by its deadline, a thread ends the job naming the rank and the call.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::ffi::abort_job;
use crate::error::CommError;

/// The blocking MPI call in progress, if any: its deadline, the caller's rank and the call.
/// Calls are serialized by `MPI_LOCK`, so there is at most one.
static WATCH: Mutex<Option<(Instant, usize, &'static str)>> = Mutex::new(None);

/// Starts the thread that ends the job when a blocking MPI call passes its deadline.
pub(super) fn start() -> Result<(), CommError> {
    std::thread::Builder::new()
        .name("pto-mpi-watchdog".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_millis(20));
            let late = match *WATCH.lock() {
                Some((deadline, rank, call)) if Instant::now() > deadline => Some((rank, call)),
                _ => None,
            };
            if let Some((rank, call)) = late {
                abort_job(
                    rank,
                    &format!("{call} did not complete before the deadline (PTO_WAIT_TIMEOUT_MS)"),
                );
            }
        })
        .map(|_| ())
        .map_err(|e| CommError::Env(format!("cannot start the MPI watchdog thread: {e}")))
}

/// Runs the blocking call `f` with the watchdog armed for `deadline`. Callers hold the MPI lock
/// (calls are serialized), so at most one call is watched at a time.
pub(super) fn watched<R>(
    deadline: Instant,
    rank: usize,
    call: &'static str,
    f: impl FnOnce() -> R,
) -> R {
    *WATCH.lock() = Some((deadline, rank, call));
    let r = f();
    *WATCH.lock() = None;
    r
}
