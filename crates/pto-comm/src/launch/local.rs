//! The `local` backend: ranks are threads of one process.
//!
//! The world and every window live in anonymous shared mappings with the same layout as the
//! `shm` backend's segments, so both backends run the same protocols.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::Transport;
use crate::comm::{Comm, RankGuard};
use crate::error::CommError;
use crate::world::{create_world, env_timeout};

/// One communicator per rank of a new in-process world of `n` ranks. Move each into its own
/// thread.
///
/// # Errors
///
/// [`CommError::BadSize`] for 0 or more than [`crate::MAX_RANKS`] ranks.
pub fn comms(n: usize) -> Result<Vec<Comm>, CommError> {
    comms_with_timeout(n, env_timeout()?)
}

/// [`comms`] with an explicit deadline for every wait.
///
/// # Errors
///
/// As [`comms`].
pub fn comms_with_timeout(n: usize, timeout: Duration) -> Result<Vec<Comm>, CommError> {
    let world = Arc::new(create_world(
        n,
        Transport::Local(Default::default()),
        0,
        timeout,
    )?);
    (0..n)
        .map(|r| {
            world.join(r)?;
            Ok(Comm::world(Arc::new(RankGuard::new(world.clone(), r))))
        })
        .collect()
}

/// Runs `f` on `n` ranks, one thread each, and returns every rank's result in rank order. A
/// rank that panics marks itself failed (its peers' waits fail naming it) and its result is
/// `Err` with the panic message.
///
/// # Errors
///
/// As [`comms`].
///
/// ```
/// let sums = pto_comm::local::run(4, |comm| {
///     let w = comm.alloc_window(&pto_comm::WindowSpec::new(64))?;
///     w.fetch_add_u64(0, 0, comm.rank() as u64 + 1)?;
///     w.barrier()?;
///     w.load_u64(0, 0)
/// })?;
/// for s in sums {
///     assert_eq!(s.unwrap()?, 10);
/// }
/// # Ok::<(), pto_comm::CommError>(())
/// ```
pub fn run<R, F>(n: usize, f: F) -> Result<Vec<Result<R, String>>, CommError>
where
    R: Send,
    F: Fn(Comm) -> R + Sync,
{
    let comms = comms(n)?;
    Ok(std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("pto-rank{}", c.rank()))
                    .spawn_scoped(s, move || f(c))
            })
            .collect();
        hs.into_iter()
            .map(|h| match h {
                Ok(h) => h.join().map_err(|p| {
                    p.downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "rank panicked".into())
                }),
                Err(e) => Err(format!("cannot start a rank thread: {e}")),
            })
            .collect()
    }))
}
