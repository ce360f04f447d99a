//! The `shm` backend: ranks are processes on one host sharing POSIX shared memory.
//!
//! A launcher creates the world segment ([`ShmWorld::create`]) and starts one process per rank
//! with three variables set ([`ENV_WORLD`], [`ENV_RANK`], [`ENV_SIZE`]); each rank calls
//! [`from_env`] (or [`join`]). Ranks create the segments of their domains and windows under the
//! world's name prefix; the launcher removes whatever is left when it drops.

use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Transport;
use crate::comm::{Comm, RankGuard};
use crate::error::CommError;
use crate::world::{create_world, env_timeout, open_world, World};

/// The world segment's name.
pub const ENV_WORLD: &str = "PTO_COMM_WORLD";
/// The rank.
pub const ENV_RANK: &str = "PTO_COMM_RANK";
/// The number of ranks.
pub const ENV_SIZE: &str = "PTO_COMM_SIZE";

/// The launcher's side of a world: it owns the world segment and the rank processes it spawned.
pub struct ShmWorld {
    world: Arc<World>,
    children: Vec<(usize, Child)>,
}

impl std::fmt::Debug for ShmWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmWorld")
            .field("name", &self.name())
            .field("size", &self.world.size)
            .field("children", &self.children.len())
            .finish()
    }
}

impl ShmWorld {
    /// Creates the world segment for `n` ranks.
    ///
    /// # Errors
    ///
    /// A bad size or an OS error.
    pub fn create(n: usize) -> Result<ShmWorld, CommError> {
        let timeout = env_timeout()?;
        Ok(ShmWorld {
            world: Arc::new(create_world(n, Transport::Shm, 0, timeout)?),
            children: Vec::new(),
        })
    }

    /// The world segment's name.
    pub fn name(&self) -> &str {
        self.world.seg.name()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.world.size
    }

    /// The variables that make a process rank `rank` of this world.
    pub fn rank_env(&self, rank: usize) -> [(&'static str, String); 3] {
        [
            (ENV_WORLD, self.name().to_string()),
            (ENV_RANK, rank.to_string()),
            (ENV_SIZE, self.size().to_string()),
        ]
    }

    /// Starts `cmd` as rank `rank`. The child gets `SIGKILL` if this process dies.
    ///
    /// # Errors
    ///
    /// A bad rank, or the spawn failed.
    pub fn spawn(&mut self, rank: usize, mut cmd: Command) -> Result<(), CommError> {
        if rank >= self.size() {
            return Err(CommError::BadRank {
                rank,
                size: self.size(),
            });
        }
        for (k, v) in self.rank_env(rank) {
            cmd.env(k, v);
        }
        pto_shm::process::die_with_this_process(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|source| CommError::Launch { rank, source })?;
        // A signal that ends this process ends the rank too, and removes its segments.
        pto_shm::cleanup::register_child(child.id());
        tracing::debug!(rank, pid = child.id(), "rank process started");
        self.children.push((rank, child));
        Ok(())
    }

    /// Joins rank `rank` from this process (for a launcher that forks, or that is a rank
    /// itself).
    ///
    /// # Errors
    ///
    /// A bad rank or a rank already joined.
    pub fn join(&self, rank: usize) -> Result<Comm, CommError> {
        if rank >= self.size() {
            return Err(CommError::BadRank {
                rank,
                size: self.size(),
            });
        }
        self.world.join(rank)?;
        Ok(Comm::world(Arc::new(RankGuard::new(
            self.world.clone(),
            rank,
        ))))
    }

    /// Waits until every rank has joined, at most `timeout`; true when they all did.
    pub fn wait_joined(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if (0..self.size()).all(|r| self.world.joined(r)) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Sends `SIGKILL` to the process of rank `rank` (it is reaped by [`ShmWorld::wait`]).
    ///
    /// # Errors
    ///
    /// No process was spawned for that rank, or the kill failed.
    pub fn kill(&mut self, rank: usize) -> Result<(), CommError> {
        let (_, child) =
            self.children
                .iter_mut()
                .find(|(r, _)| *r == rank)
                .ok_or(CommError::BadRank {
                    rank,
                    size: self.world.size,
                })?;
        child
            .kill()
            .map_err(|source| CommError::Launch { rank, source })
    }

    /// Waits for every spawned rank to exit, at most `timeout`; ranks still running then are
    /// killed. A rank that exits with failure is marked failed at once, so its peers stop
    /// waiting for it. Returns each rank's exit status, in spawn order.
    ///
    /// # Errors
    ///
    /// An OS error while waiting.
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<(usize, ExitStatus)>, CommError> {
        let deadline = Instant::now() + timeout;
        let mut done: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        loop {
            for (i, (rank, child)) in self.children.iter_mut().enumerate() {
                if done[i].is_some() {
                    continue;
                }
                if let Some(st) = child.try_wait().map_err(|source| CommError::Launch {
                    rank: *rank,
                    source,
                })? {
                    pto_shm::cleanup::forget(child.id());
                    if !st.success() {
                        tracing::debug!(rank, status = %st, "rank process failed");
                        self.world.mark_failed(*rank);
                    }
                    done[i] = Some(st);
                }
            }
            if done.iter().all(Option::is_some) {
                break;
            }
            if Instant::now() >= deadline {
                for (i, (rank, child)) in self.children.iter_mut().enumerate() {
                    if done[i].is_none() {
                        let _ = child.kill();
                        done[i] = child.wait().ok();
                        pto_shm::cleanup::forget(child.id());
                        self.world.mark_failed(*rank);
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let out = self
            .children
            .drain(..)
            .zip(done)
            .filter_map(|((rank, _), st)| st.map(|s| (rank, s)))
            .collect();
        Ok(out)
    }
}

impl Drop for ShmWorld {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
            pto_shm::cleanup::forget(c.id());
        }
        // Segments the ranks created and could not remove (a rank died) carry our prefix.
        let _ = pto_shm::sweep::remove_prefix(&format!("{}.", self.world.prefix));
    }
}

/// Joins the world segment `name` as rank `rank` of `size`.
///
/// # Errors
///
/// A bad rank or size, a world of another size (both values named), a stale or missing
/// segment, or a rank already joined.
pub fn join(name: &str, rank: usize, size: usize) -> Result<Comm, CommError> {
    join_with_timeout(name, rank, size, env_timeout()?)
}

/// [`join`] with an explicit deadline for opening the world and for every later wait.
///
/// # Errors
///
/// As [`join`].
pub fn join_with_timeout(
    name: &str,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<Comm, CommError> {
    let world = Arc::new(open_world(name, rank, size, timeout)?);
    world.join(rank)?;
    Ok(Comm::world(Arc::new(RankGuard::new(world, rank))))
}

/// Joins the world described by [`ENV_WORLD`], [`ENV_RANK`] and [`ENV_SIZE`]; `None` when
/// [`ENV_WORLD`] is not set (this process was not launched as a rank).
///
/// # Errors
///
/// Unparsable variables, or the errors of [`join`].
pub fn from_env() -> Result<Option<Comm>, CommError> {
    let Ok(name) = std::env::var(ENV_WORLD) else {
        return Ok(None);
    };
    let num = |k: &str| -> Result<usize, CommError> {
        std::env::var(k)
            .map_err(|_| CommError::Env(format!("{ENV_WORLD} is set but {k} is not")))?
            .parse()
            .map_err(|_| CommError::Env(format!("{k} is not a number")))
    };
    join(&name, num(ENV_RANK)?, num(ENV_SIZE)?).map(Some)
}
