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
    watch: Option<Watch>,
}

/// What a supervising launcher uses to publish its ranks' deaths in the world (from any
/// thread): the ranks' waits then learn of a death from one word instead of reading every
/// peer's `/proc` entry. From [`ShmWorld::supervise`].
#[derive(Clone)]
pub struct Deaths {
    world: Arc<World>,
}

impl std::fmt::Debug for Deaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deaths")
            .field("name", &self.world.seg.name())
            .finish()
    }
}

impl Deaths {
    /// Rank `rank`'s process (`pid`) has ended. Unless it left the world first (a clean exit),
    /// it is marked dead: every peer's wait ends with an error naming it at its next liveness
    /// check, and the world barrier's waiters are woken. Returns whether it was marked.
    pub fn ended(&self, rank: usize, pid: u32) -> bool {
        let marked = self.world.mark_died(rank, pid);
        if marked {
            tracing::debug!(rank, pid, "rank ended without leaving: marked dead");
        }
        marked
    }
}

/// A thread that watches rank processes without reaping them ([`ShmWorld::watch`]).
struct Watch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
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
        ShmWorld::create_with_timeout(n, env_timeout()?)
    }

    /// Creates the world segment for `n` ranks whose waits (barriers, signals, collectives,
    /// joins) last at most `timeout` instead of `PTO_WAIT_TIMEOUT_MS`: a Worker's own timeout
    /// reaches its chips' waits this way.
    ///
    /// # Errors
    ///
    /// A bad size or an OS error.
    pub fn create_with_timeout(n: usize, timeout: Duration) -> Result<ShmWorld, CommError> {
        Ok(ShmWorld {
            world: Arc::new(create_world(n, Transport::Shm, 0, timeout)?),
            children: Vec::new(),
            watch: None,
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

    /// Declares that this launcher publishes the deaths of its rank processes through the
    /// returned [`Deaths`] (for example from the loop that reaps them): from now on the ranks'
    /// waits stop reading `/proc` and rely on it. A launcher that promises this must report
    /// every rank process that ends, within a second (docs/design/scale.md).
    pub fn supervise(&self) -> Deaths {
        self.world.set_supervised();
        Deaths {
            world: self.world.clone(),
        }
    }

    /// Supervises the rank processes `ranks` (`(rank, pid)`, children of this process, all
    /// forked before this call) with a thread that looks at them every 20 ms without reaping
    /// them (whoever waits for them still gets their status), and publishes their deaths. It
    /// stops when they have all ended or this `ShmWorld` is dropped.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn watch(&mut self, ranks: Vec<(usize, u32)>) -> std::io::Result<()> {
        let deaths = self.supervise();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pto-world-watch".into())
            .spawn(move || {
                let mut live = ranks;
                while !live.is_empty() && !halt.load(std::sync::atomic::Ordering::Acquire) {
                    live.retain(|&(rank, pid)| {
                        if pto_shm::process::ended_unreaped(pid) {
                            deaths.ended(rank, pid);
                            false
                        } else {
                            true
                        }
                    });
                    std::thread::park_timeout(Duration::from_millis(20));
                }
            })?;
        self.watch = Some(Watch {
            stop,
            thread: Some(thread),
        });
        Ok(())
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
        // A signal that ends this process ends the rank too, and removes its segments.
        let child = pto_shm::cleanup::spawn_registered(&mut cmd, false)
            .map_err(|source| CommError::Launch { rank, source })?;
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
        // This loop reaps the ranks and publishes how each ended: the ranks' waits need not
        // read `/proc` meanwhile.
        let deaths = self.supervise();
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
                    if std::os::unix::process::ExitStatusExt::signal(&st).is_some() {
                        deaths.ended(*rank, child.id());
                    } else if !st.success() {
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
        self.watch = None;
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
