//! `run_ranks`: a Python function on many ranks (threads of this process), each with its
//! [`Comm`]; the first failure aborts the others, and Ctrl-C aborts them all.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};

use pto_comm::Collectives;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::args::{type_name, usize_in};
use crate::comm::Comm;
use crate::errors::{comm_err, panic_text, pto_err, Kind};
use crate::ranks_state::{Ranks, ENDED, INTERRUPTED, RUNNING};
use crate::wait::{recv_detached, SIGNAL_SLICE};

/// Staging bytes of each rank's collectives in `run_ranks` with `n` ranks: 1 MiB, less with
/// many ranks (16 MiB in all, at least 64 KiB each); larger data goes through in pieces.
fn ranks_collectives(n: usize) -> usize {
    ((16 << 20) / n.max(1)).clamp(64 << 10, 1 << 20)
}

/// Most ranks `run_ranks` starts (threads of this process).
const MAX_LOCAL_RANKS: usize = 256;

/// How one rank ended.
enum RankEnd {
    Value(Py<PyAny>),
    /// Its exception, and its place in the order of failures.
    Raised(usize, PyErr),
}

/// One rank's thread: its collectives, then `f(comm)`. A failure aborts the world, so that
/// peers blocked in collectives fail at once instead of at their deadline.
fn rank_main(comm: pto_comm::Comm, f: Py<PyAny>, ranks: &Arc<Ranks>) -> RankEnd {
    let handle = comm.clone();
    let fail = |e: PyErr, text: String| {
        let seq = ranks.seq.fetch_add(1, Ordering::AcqRel);
        // Peers see "aborted by rank R: {text}".
        handle.abort(&text);
        RankEnd::Raised(seq, e)
    };
    // Collective (a window barrier): set up before taking the GIL, which the other ranks need
    // to get here.
    let co = match Collectives::new(&comm, ranks_collectives(comm.size())) {
        Ok(co) => co,
        Err(e) => return fail(comm_err(&e), e.to_string()),
    };
    Python::attach(|py| {
        let c = match Bound::new(
            py,
            Comm {
                comm,
                co,
                ranks: ranks.clone(),
            },
        ) {
            Ok(c) => c,
            Err(e) => {
                let t = e.to_string();
                return fail(e, t);
            }
        };
        match f.call1(py, (c,)) {
            Ok(v) => RankEnd::Value(v),
            Err(e) => {
                let t = format!(
                    "{}: {}",
                    e.get_type(py)
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                    e.value(py)
                        .str()
                        .map(|s| s.to_string())
                        .unwrap_or_else(|_| "<unprintable>".into())
                );
                fail(e, t)
            }
        }
    })
}

fn ranks_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    usize_in(obj, "n (ranks)", 1, MAX_LOCAL_RANKS)
}

/// Runs `f(comm)` on `n` ranks (threads of this process) and returns their results in rank
/// order. Collectives release the GIL while they wait. When ranks raise, the first exception
/// (in time) is raised here with its type, its message prefixed `"rank R: "`, a `rank`
/// attribute and the original as `__cause__`; the others are added as notes. Ctrl-C aborts
/// every collective at once and raises `KeyboardInterrupt` when the ranks have returned.
#[pyfunction]
pub(crate) fn run_ranks(
    py: Python<'_>,
    #[pyo3(from_py_with = ranks_arg)] n: usize,
    f: &Bound<'_, PyAny>,
) -> PyResult<Vec<Py<PyAny>>> {
    if !f.is_callable() {
        return Err(PyTypeError::new_err(format!(
            "f must be callable (f(comm)), not {}",
            type_name(f)
        )));
    }
    let comms = py.detach(|| pto_comm::local::comms(n)).map_err(comm_err)?;
    let handle = comms[0].clone();
    let ranks = Arc::new(Ranks {
        state: AtomicU8::new(RUNNING),
        seq: AtomicUsize::new(0),
    });
    let fs: Vec<Py<PyAny>> = (0..n).map(|_| f.clone().unbind()).collect();
    let mut ends: Vec<Option<RankEnd>> = (0..n).map(|_| None).collect();
    let mut interrupt: Option<PyErr> = None;
    let (tx, rx) = mpsc::channel::<(usize, RankEnd)>();
    let rx = Mutex::new(rx);
    std::thread::scope(|s| {
        for (comm, f) in comms.into_iter().zip(fs) {
            let (tx, mine) = (tx.clone(), ranks.clone());
            let r = comm.rank();
            let body = move || {
                let end = std::panic::catch_unwind(AssertUnwindSafe(|| rank_main(comm, f, &mine)))
                    .unwrap_or_else(|p| {
                        let seq = mine.seq.fetch_add(1, Ordering::AcqRel);
                        RankEnd::Raised(
                            seq,
                            pto_err(Kind::Pto, format!("rank panicked: {}", panic_text(&*p))),
                        )
                    });
                let _ = tx.send((r, end));
            };
            if let Err(e) = std::thread::Builder::new()
                .name(format!("pto-rank{r}"))
                .spawn_scoped(s, body)
            {
                handle.abort(&format!("cannot start rank {r}'s thread: {e}"));
                let seq = ranks.seq.fetch_add(1, Ordering::AcqRel);
                ends[r] = Some(RankEnd::Raised(
                    seq,
                    comm_err(format!("cannot start the thread: {e}")),
                ));
            }
        }
        drop(tx);
        loop {
            match recv_detached(py, &rx, Some(SIGNAL_SLICE)) {
                Ok((r, end)) => ends[r] = Some(end),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    if interrupt.is_none() {
                        if let Err(e) = py.check_signals() {
                            // Every blocked and later collective fails at once; the ranks'
                            // Python code returns at its next pto call.
                            tracing::info!("run_ranks interrupted: aborting its collectives");
                            ranks.state.store(INTERRUPTED, Ordering::Release);
                            handle.abort("run_ranks was interrupted (KeyboardInterrupt)");
                            interrupt = Some(e);
                        }
                    }
                }
            }
        }
    });
    ranks.state.store(ENDED, Ordering::Release);
    if let Some(e) = interrupt {
        return Err(e);
    }
    let mut values = Vec::with_capacity(n);
    let mut failures: Vec<(usize, usize, PyErr)> = Vec::new();
    for (r, end) in ends.into_iter().enumerate() {
        match end {
            Some(RankEnd::Value(v)) => values.push(v),
            Some(RankEnd::Raised(seq, e)) => failures.push((seq, r, e)),
            None => failures.push((
                usize::MAX,
                r,
                pto_err(Kind::Pto, "the rank ended without a result"),
            )),
        }
    }
    if failures.is_empty() {
        return Ok(values);
    }
    failures.sort_by_key(|f| (f.0, f.1));
    let list = PyList::empty(py);
    for (_, r, e) in failures {
        list.append((r, e.into_value(py)))?;
    }
    let exc = py
        .import("pto._errors")?
        .getattr("_rank_error")?
        .call1((list, n))?;
    Err(PyErr::from_value(exc))
}

/// A world of ranks in shared memory for `run_ranks(backend="shm")`: the Python layer forks
/// one process per rank, each joins it ([`join_world`]); closing (or dropping) it in the
/// creating process removes its segments.
#[pyclass(module = "pto._native")]
pub(crate) struct ShmWorld {
    world: Option<pto_comm::shm::ShmWorld>,
    pid: u32,
}

impl std::fmt::Debug for ShmWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmWorld").field("pid", &self.pid).finish()
    }
}

#[pymethods]
impl ShmWorld {
    #[new]
    fn new(#[pyo3(from_py_with = ranks_arg)] n: usize) -> PyResult<ShmWorld> {
        Ok(ShmWorld {
            world: Some(pto_comm::shm::ShmWorld::create(n).map_err(comm_err)?),
            pid: std::process::id(),
        })
    }

    /// The world segment's name.
    #[getter]
    fn name(&self) -> PyResult<String> {
        self.world
            .as_ref()
            .map(|w| w.name().to_string())
            .ok_or_else(|| pto_err(Kind::Comm, "this world is closed"))
    }

    /// Watches the forked ranks (`pids`, in rank order) without reaping them, publishing their
    /// deaths to their peers (whose waits then need no `/proc` reads). Call it after the last
    /// fork: it starts a thread.
    fn watch(&mut self, pids: Vec<u32>) -> PyResult<()> {
        let w = self
            .world
            .as_mut()
            .ok_or_else(|| pto_err(Kind::Comm, "this world is closed"))?;
        w.watch(pids.into_iter().enumerate().collect())
            .map_err(|e| pto_err(Kind::Comm, format!("starting the rank watcher: {e}")))
    }

    /// Removes the world's segments (in the creating process only; twice is fine).
    fn close(&mut self) {
        if std::process::id() == self.pid {
            self.world.take();
        } else {
            // A forked rank must not remove the world its peers still use.
            std::mem::forget(self.world.take());
        }
    }
}

impl Drop for ShmWorld {
    fn drop(&mut self) {
        self.close();
    }
}

/// Joins world `name` as rank `rank` of `size` (in a process forked by `run_ranks`) and sets
/// up its collectives (every rank calls it).
#[pyfunction]
pub(crate) fn join_world(py: Python<'_>, name: String, rank: usize, size: usize) -> PyResult<Comm> {
    let comm = py
        .detach(|| pto_comm::shm::join(&name, rank, size))
        .map_err(comm_err)?;
    let co = py
        .detach(|| Collectives::new(&comm, ranks_collectives(size)))
        .map_err(comm_err)?;
    Ok(Comm {
        comm,
        co,
        ranks: Arc::new(Ranks {
            state: AtomicU8::new(RUNNING),
            seq: AtomicUsize::new(0),
        }),
    })
}
