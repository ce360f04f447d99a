//! Python kernels: a Python function registered as a chip kernel (`@pto.kernel`, then
//! `pto.Worker(kernels=[...])`). It runs on a chip's core threads with zero-copy numpy views of
//! its tensor arguments and a [`KernelContext`] (rank, size, SPMD block, the window and its
//! one-sided operations). An exception fails its task with the traceback.

use pto_comm::{CommContext, SignalOp, Window};
use pto_core::{DType, KernelCtx, KernelError, Tensor};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::dtypes::typestr;
use crate::errors::comm_err;

/// numpy's array-interface type string of a dtype; bfloat16 is viewed as its raw bits
/// (`uint16`), which numpy lacks.
fn view_typestr(d: DType) -> PyResult<String> {
    match d {
        DType::Bf16 => Ok("<u2".into()),
        d => typestr(d),
    }
}

/// Memory numpy views without a copy through `__array_interface__`: a kernel argument (its
/// tensor keeps the memory alive) or a window buffer (its window does).
#[pyclass(frozen, module = "pto._native")]
pub(crate) struct MemView {
    _keep: Keep,
    addr: usize,
    shape: Vec<usize>,
    strides: Vec<usize>,
    typestr: String,
    readonly: bool,
}

enum Keep {
    Tensor(#[allow(dead_code)] Tensor),
    Window(#[allow(dead_code)] Window),
}

impl std::fmt::Debug for MemView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemView")
            .field("shape", &self.shape)
            .field("typestr", &self.typestr)
            .finish()
    }
}

#[pymethods]
impl MemView {
    /// numpy's array interface (version 3).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("strides", PyTuple::new(py, &self.strides)?)?;
        d.set_item("typestr", &self.typestr)?;
        d.set_item("data", (self.addr, self.readonly))?;
        d.set_item("version", 3)?;
        Ok(d)
    }
}

/// A numpy view (no copy) of rank `rank`'s part of window buffer `name`, in its dtype (a peer's
/// part only where the window is mapped: threads and shared memory).
pub(crate) fn buffer_view<'py>(
    py: Python<'py>,
    w: &Window,
    rank: usize,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let b = w.buffer(name).map_err(comm_err)?;
    let base = w.peer_ptr(rank).map_err(comm_err)?;
    view_at(py, w, base as usize + b.offset, name)
}

/// A numpy view of buffer `name` of `w` at address `addr` (some rank's part of it).
fn view_at<'py>(
    py: Python<'py>,
    w: &Window,
    addr: usize,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let b = w.buffer(name).map_err(comm_err)?;
    let size = b.dtype.size();
    asarray(
        py,
        MemView {
            _keep: Keep::Window(w.clone()),
            addr,
            shape: vec![b.count],
            strides: vec![size],
            typestr: view_typestr(b.dtype)?,
            readonly: false,
        },
    )
}

static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn asarray<'py>(py: Python<'py>, v: MemView) -> PyResult<Bound<'py, PyAny>> {
    let f = ASARRAY.get_or_try_init(py, || -> PyResult<_> {
        Ok(py.import("numpy")?.getattr("asarray")?.unbind())
    })?;
    f.bind(py).call1((Bound::new(py, v)?,))
}

/// What a Python kernel's first argument is: this chip's place in the job and its window.
#[pyclass(frozen, module = "pto._native")]
#[derive(Debug)]
pub(crate) struct KernelContext {
    comm: Option<CommContext>,
    block_idx: u32,
    block_num: u32,
}

impl KernelContext {
    fn win(&self) -> PyResult<&Window> {
        self.comm
            .as_ref()
            .and_then(|c| c.window(0).ok())
            .ok_or_else(|| {
                PyValueError::new_err(
                    "this chip has no window: give the Worker buffers=[...] (or load a plugin that declares some)",
                )
            })
    }
}

pub(crate) fn u64_arg(v: i64, what: &str) -> PyResult<u64> {
    u64::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("{what} must be at least 0, not {v}")))
}

/// A signal value: 0 to 2**32 - 1, named in the error otherwise.
pub(crate) fn u32_arg(v: i64, what: &str) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} {v} out of range: signals hold 0 to 4294967295"
        ))
    })
}

pub(crate) fn rank_arg(w: &Window, rank: i64) -> PyResult<usize> {
    usize::try_from(rank)
        .ok()
        .filter(|&r| r < w.ranks())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "rank {rank} out of range: the job has {} rank(s)",
                w.ranks()
            ))
        })
}

#[pymethods]
impl KernelContext {
    /// This chip's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.as_ref().map_or(0, CommContext::rank)
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.comm.as_ref().map_or(1, CommContext::size)
    }

    /// This block's index (SPMD).
    #[getter]
    fn block_idx(&self) -> u32 {
        self.block_idx
    }

    /// The task's block count.
    #[getter]
    fn block_num(&self) -> u32 {
        self.block_num
    }

    /// A numpy view (no copy) of this rank's part of window buffer `name`, in its dtype. Under
    /// `check=True` taking it counts as a write of the whole buffer by the task.
    fn window<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let w = self.win()?;
        // Recorded by `pto check` as a write of the whole buffer by this task.
        let (p, _) = w.buffer_ptr(name, "window view").map_err(comm_err)?;
        view_at(py, w, p as usize, name)
    }

    /// Copies `array`'s bytes into rank `rank`'s window buffer `buffer` at `offset_bytes`.
    fn put(
        &self,
        py: Python<'_>,
        rank: i64,
        buffer: &str,
        offset_bytes: i64,
        array: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let w = self.win()?;
        let r = rank_arg(w, rank)?;
        // In the buffer's dtype (a list of Python floats is not float64 bytes in a float32
        // buffer); what does not convert is numpy's ValueError or TypeError.
        let typestr = view_typestr(w.buffer(buffer).map_err(comm_err)?.dtype)?;
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("dtype", typestr)?;
        let data: Vec<u8> = py
            .import("numpy")?
            .getattr("ascontiguousarray")?
            .call((array,), Some(&kw))?
            .call_method0("tobytes")?
            .extract()?;
        let off = w
            .buffer_range(
                buffer,
                u64_arg(offset_bytes, "offset_bytes")?,
                data.len() as u64,
            )
            .map_err(comm_err)?;
        w.put(r, off, &data).map_err(comm_err)
    }

    /// Copies `out.nbytes` bytes from rank `rank`'s window buffer `buffer` at `offset_bytes`
    /// into `out` (a writable numpy array).
    fn get(
        &self,
        py: Python<'_>,
        rank: i64,
        buffer: &str,
        offset_bytes: i64,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let w = self.win()?;
        let r = rank_arg(w, rank)?;
        let np = py.import("numpy")?;
        if !out.is_instance(&np.getattr("ndarray")?)? {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "get: out must be a numpy array, not {}",
                out.get_type().name()?
            )));
        }
        if !out.getattr("flags")?.getattr("writeable")?.is_truthy()? {
            return Err(PyValueError::new_err("get: out is a read-only array"));
        }
        let want = np
            .getattr("dtype")?
            .call1((view_typestr(w.buffer(buffer).map_err(comm_err)?.dtype)?,))?;
        if !out.getattr("dtype")?.eq(&want)? {
            return Err(PyValueError::new_err(format!(
                "get: out is {}, buffer {buffer:?} holds {} (give out the buffer's dtype)",
                out.getattr("dtype")?.str()?,
                want.str()?
            )));
        }
        let n: u64 = out.getattr("nbytes")?.extract()?;
        let off = w
            .buffer_range(buffer, u64_arg(offset_bytes, "offset_bytes")?, n)
            .map_err(comm_err)?;
        let mut data = vec![0u8; n as usize];
        w.get(r, off, &mut data).map_err(comm_err)?;
        let flat = np
            .call_method1(
                "frombuffer",
                (pyo3::types::PyBytes::new(py, &data), out.getattr("dtype")?),
            )?
            .call_method1("reshape", (out.getattr("shape")?,))?;
        out.set_item(py.Ellipsis(), flat)
    }

    /// Adds `value` to the u32 signal at `offset_bytes` of rank `rank`'s buffer `buffer`,
    /// after every put before it is visible there.
    fn notify(&self, rank: i64, buffer: &str, offset_bytes: i64, value: i64) -> PyResult<()> {
        let value = u32_arg(value, "notify: value")?;
        let w = self.win()?;
        let r = rank_arg(w, rank)?;
        let off = w
            .buffer_range(buffer, u64_arg(offset_bytes, "offset_bytes")?, 4)
            .map_err(comm_err)?;
        w.fence();
        w.notify(r, off, value, SignalOp::Add).map_err(comm_err)
    }

    /// Waits (without the GIL) until this rank's u32 signal at `offset_bytes` of `buffer` is
    /// at least `value`, under the run's deadline.
    fn wait_until(
        &self,
        py: Python<'_>,
        buffer: &str,
        offset_bytes: i64,
        value: i64,
    ) -> PyResult<()> {
        let value = u32_arg(value, "wait_until: value")?;
        let w = self.win()?;
        let off = w
            .buffer_range(buffer, u64_arg(offset_bytes, "offset_bytes")?, 4)
            .map_err(comm_err)?;
        py.detach(|| w.wait_until(off, value))
            .map(drop)
            .map_err(comm_err)
    }

    /// A barrier of every rank (without the GIL).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        match (&self.comm, self.win()) {
            (_, Ok(w)) => py.detach(|| w.barrier()).map_err(comm_err),
            (Some(c), Err(_)) => py.detach(|| c.comm().barrier()).map_err(comm_err),
            (None, Err(_)) => Ok(()),
        }
    }
}

fn scalar_obj<'py>(py: Python<'py>, s: &pto_core::Scalar) -> PyResult<Bound<'py, PyAny>> {
    Ok(match s.dtype() {
        DType::F64 => s
            .get::<f64>()
            .unwrap_or(f64::NAN)
            .into_pyobject(py)?
            .into_any(),
        DType::F32 => f64::from(s.get::<f32>().unwrap_or(f32::NAN))
            .into_pyobject(py)?
            .into_any(),
        DType::U64 => s.get::<u64>().unwrap_or(0).into_pyobject(py)?.into_any(),
        DType::U32 => s.get::<u32>().unwrap_or(0).into_pyobject(py)?.into_any(),
        DType::I32 => s.get::<i32>().unwrap_or(0).into_pyobject(py)?.into_any(),
        _ => s.get::<i64>().unwrap_or(0).into_pyobject(py)?.into_any(),
    })
}

/// The chip kernel that calls Python function `f(ctx, *arrays, *scalars)`: the arrays view the
/// task's tensor arguments (read-only unless the task may write them; an SPMD task's blocks get
/// their own rows of what they write).
pub(crate) fn py_kernel(
    f: Py<PyAny>,
) -> impl Fn(&KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static {
    move |ctx| {
        let chunked = ctx.block_num() > 1;
        let mut guards = Vec::with_capacity(ctx.num_tensors());
        let mut views = Vec::with_capacity(ctx.num_tensors());
        for i in 0..ctx.num_tensors() {
            let writes = ctx.mode(i)?.writable();
            let v = ctx.raw_view(i, chunked && writes)?;
            let size = v.dtype().size();
            views.push(MemView {
                _keep: Keep::Tensor(ctx.tensor(i)?.clone()),
                addr: v.as_ptr() as usize,
                shape: v.shape().to_vec(),
                strides: v.strides().iter().map(|s| s * size).collect(),
                typestr: view_typestr(v.dtype()).map_err(|e| KernelError::msg(e.to_string()))?,
                readonly: !v.writable(),
            });
            guards.push(v);
        }
        let kctx = KernelContext {
            comm: ctx.ext::<CommContext>().cloned(),
            block_idx: ctx.block_idx(),
            block_num: ctx.block_num(),
        };
        let r = Python::attach(|py| -> PyResult<()> {
            let mut items: Vec<Bound<'_, PyAny>> = Vec::with_capacity(1 + views.len());
            items.push(Bound::new(py, kctx)?.into_any());
            for v in views {
                items.push(asarray(py, v)?);
            }
            for s in ctx.scalars() {
                items.push(scalar_obj(py, s)?);
            }
            f.call1(py, PyTuple::new(py, items)?)?;
            Ok(())
        });
        drop(guards);
        r.map_err(|e| {
            Python::attach(|py| {
                let tb = e
                    .traceback(py)
                    .and_then(|t| t.format().ok())
                    .unwrap_or_default();
                KernelError::msg(format!("{tb}{e}"))
            })
        })
    }
}
