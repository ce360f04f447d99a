//! `Window`: a symmetric window of `run_ranks` ranks from Python. Zero-copy numpy views of
//! any rank's buffers where the window is mapped (threads and shared memory), one-sided
//! `put`/`get` from and into numpy arrays without the GIL, and `u32` signals with
//! `notify`/`wait_until`. Offsets here are bytes; the Python layer speaks in elements.

use std::sync::Arc;

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pto_comm::SignalOp;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::dtypes::numpy_name;
use crate::errors::comm_err;
use crate::kernels::{buffer_view, rank_arg, u64_arg};
use crate::ranks_state::Ranks;

/// One window of a `run_ranks` rank.
#[pyclass(frozen, module = "pto._native")]
#[derive(Debug)]
pub(crate) struct Window {
    win: pto_comm::Window,
    ranks: Arc<Ranks>,
}

impl Window {
    pub(crate) fn new(win: pto_comm::Window, ranks: Arc<Ranks>) -> Window {
        Window { win, ranks }
    }

    /// The window's byte offset of `len` bytes at `offset_bytes` of buffer `name`, checked.
    fn at(&self, name: &str, offset_bytes: i64, len: usize) -> PyResult<usize> {
        self.ranks.usable()?;
        self.win
            .buffer_range(name, u64_arg(offset_bytes, "offset_bytes")?, len as u64)
            .map_err(comm_err)
    }

    fn rank(&self, rank: i64) -> PyResult<usize> {
        rank_arg(&self.win, rank)
    }
}

#[pymethods]
impl Window {
    /// This window's buffers: `(name, numpy dtype name, count)` in order.
    #[getter]
    fn buffers(&self) -> Vec<(String, String, usize)> {
        self.win
            .buffers()
            .iter()
            .map(|b| {
                let d = numpy_name(b.dtype).map_or_else(|| b.dtype.to_string(), str::to_string);
                (b.name.clone(), d, b.count)
            })
            .collect()
    }

    /// A numpy view (no copy) of rank `rank`'s part of buffer `name`.
    fn view<'py>(&self, py: Python<'py>, rank: i64, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.ranks.usable()?;
        let r = self.rank(rank)?;
        buffer_view(py, &self.win, r, name)
    }

    /// Copies `data` (raw bytes) into rank `rank`'s buffer `name` at `offset_bytes`.
    fn put(
        &self,
        py: Python<'_>,
        rank: i64,
        name: &str,
        offset_bytes: i64,
        data: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<()> {
        let r = self.rank(rank)?;
        let d = data
            .as_slice()
            .map_err(|_| PyValueError::new_err("put: the array must be contiguous"))?;
        let off = self.at(name, offset_bytes, d.len())?;
        py.detach(|| self.win.put(r, off, d)).map_err(comm_err)
    }

    /// Copies `out.nbytes` bytes of rank `rank`'s buffer `name` at `offset_bytes` into `out`.
    fn get(
        &self,
        py: Python<'_>,
        rank: i64,
        name: &str,
        offset_bytes: i64,
        mut out: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        let r = self.rank(rank)?;
        let o = out
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("get: out must be contiguous"))?;
        let off = self.at(name, offset_bytes, o.len())?;
        py.detach(|| self.win.get(r, off, o)).map_err(comm_err)
    }

    /// Adds (`add`) or stores `value` into the u32 signal at `offset_bytes` of rank `rank`'s
    /// buffer `name`, after every put of this rank before it is visible there.
    fn notify(
        &self,
        rank: i64,
        name: &str,
        offset_bytes: i64,
        value: u32,
        add: bool,
    ) -> PyResult<()> {
        let r = self.rank(rank)?;
        let off = self.at(name, offset_bytes, 4)?;
        self.win.fence();
        let op = if add { SignalOp::Add } else { SignalOp::Set };
        self.win.notify(r, off, value, op).map_err(comm_err)
    }

    /// Waits (without the GIL, under the job's deadline) until this rank's u32 signal at
    /// `offset_bytes` of buffer `name` reaches `value`; returns the value seen.
    fn wait_until(
        &self,
        py: Python<'_>,
        name: &str,
        offset_bytes: i64,
        value: u32,
    ) -> PyResult<u32> {
        let off = self.at(name, offset_bytes, 4)?;
        py.detach(|| self.win.wait_until(off, value))
            .map_err(comm_err)
    }

    /// The u32 at `offset_bytes` of rank `rank`'s buffer `name`, read atomically.
    fn load(&self, rank: i64, name: &str, offset_bytes: i64) -> PyResult<u32> {
        let r = self.rank(rank)?;
        let off = self.at(name, offset_bytes, 4)?;
        self.win.load_u32(r, off).map_err(comm_err)
    }

    /// Completes this rank's puts (visible to every peer).
    fn quiet(&self) -> PyResult<()> {
        self.ranks.usable()?;
        self.win.quiet();
        Ok(())
    }

    /// A barrier of every rank of the window (without the GIL).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.ranks.usable()?;
        py.detach(|| self.win.barrier()).map_err(comm_err)
    }
}
