//! Shared buffers and tensors: [`SharedBuffer`] (memory the Worker's chips share, viewed by
//! numpy without a copy), and numpy arrays over it as pto tensors and back.

use pto_core::{DType, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::args::{tuple_text, type_name};
use crate::dtypes::{numpy_name, typestr};

/// Memory shared with the Worker's chips: a numpy array made from it (`numpy.asarray`) views
/// the same bytes, without a copy, and keeps it alive.
#[pyclass(frozen, module = "pto._native")]
#[derive(Debug)]
pub(crate) struct SharedBuffer {
    pub(crate) tensor: Tensor,
}

#[pymethods]
impl SharedBuffer {
    /// Its shape.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.tensor.shape().to_vec()
    }

    /// Its dtype, as numpy names it.
    #[getter]
    fn dtype(&self) -> &'static str {
        numpy_name(self.tensor.dtype()).unwrap_or("bfloat16")
    }

    /// Address of its first byte.
    #[getter]
    fn addr(&self) -> usize {
        self.tensor.buffer().addr() + self.tensor.region().offset() * self.tensor.dtype().size()
    }

    /// numpy's array interface (version 3), so `numpy.asarray` views it without a copy.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, self.tensor.shape())?)?;
        d.set_item("typestr", typestr(self.tensor.dtype())?)?;
        d.set_item("data", (self.addr(), false))?;
        d.set_item("version", 3)?;
        Ok(d)
    }
}

static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

pub(crate) fn is_ndarray(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let t = NDARRAY.import(obj.py(), "numpy", "ndarray")?;
    obj.is_instance(t)
}

/// `arr` (a numpy array over a [`SharedBuffer`], or a view of one) as a pto tensor over the same
/// bytes. `what` names the argument in errors; `writes` refuses read-only arrays.
pub(crate) fn tensor_of(arr: &Bound<'_, PyAny>, what: &str, writes: bool) -> PyResult<Tensor> {
    let not_shared = |detail: &str| {
        PyTypeError::new_err(format!(
            "{what} must be a numpy array from Worker.buffer() (or a view of one){detail}"
        ))
    };
    if !is_ndarray(arr)? {
        return Err(not_shared(&format!(", not {}", type_name(arr))));
    }
    let mut base = arr.clone();
    let buf =
        loop {
            if let Ok(b) = base.extract::<PyRef<'_, SharedBuffer>>() {
                break b;
            }
            match base.getattr("base").ok().filter(|b| !b.is_none()) {
                Some(b) => base = b,
                None => return Err(not_shared(
                    ": this array is not in a Worker's shared memory (a copy, or made by numpy)",
                )),
            }
        };
    if writes && !arr.getattr("flags")?.getattr("writeable")?.is_truthy()? {
        return Err(PyValueError::new_err(format!(
            "{what} is a read-only array (flags.writeable is False), but pto writes into it: \
             pass a writable array (read-only arrays are fine as pto.IN)"
        )));
    }
    let ai = arr.getattr("__array_interface__")?;
    let shape: Vec<usize> = ai.get_item("shape")?.extract()?;
    let (ptr, _): (usize, bool) = ai.get_item("data")?.extract()?;
    let ts: String = ai.get_item("typestr")?.extract()?;
    let name: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
    let d = DType::ALL
        .into_iter()
        .find(|&d| numpy_name(d) == Some(name.as_str()))
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{what} has dtype {name}, which pto does not support"
            ))
        })?;
    if typestr(d)? != ts {
        return Err(PyTypeError::new_err(format!(
            "{what} has type {ts}, not a little-endian {name}"
        )));
    }
    if shape.contains(&0) {
        return Err(PyValueError::new_err(format!(
            "{what} is empty (shape {}): a tensor has at least one element",
            tuple_text(&shape)
        )));
    }
    if shape.len() > pto_core::MAX_DIMS {
        return Err(PyValueError::new_err(format!(
            "{what} has {} dimensions; pto tensors have at most {}",
            shape.len(),
            pto_core::MAX_DIMS
        )));
    }
    let size = d.size();
    let strides: Option<Vec<isize>> = ai.get_item("strides")?.extract()?;
    let strides: Vec<usize> = match strides {
        None => {
            let mut s = vec![1usize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                s[i] = s[i + 1].saturating_mul(shape[i + 1].max(1));
            }
            s
        }
        Some(st) => st
            .iter()
            .map(|&b| {
                if b > 0 && b.unsigned_abs() % size == 0 {
                    Ok(b.unsigned_abs() / size)
                } else {
                    Err(PyValueError::new_err(format!(
                        "{what} has strides {} (bytes), which are not positive multiples of \
                         its {size}-byte element (reversed or broadcast views are not supported)",
                        tuple_text(&st)
                    )))
                }
            })
            .collect::<PyResult<_>>()?,
    };
    let base_addr = buf.tensor.buffer().addr();
    let off = ptr
        .checked_sub(base_addr)
        .filter(|o| o % size == 0)
        .ok_or_else(|| {
            PyValueError::new_err(format!("{what} does not start on an element of its buffer"))
        })?;
    let shape = if shape.is_empty() { vec![1] } else { shape };
    let strides = if strides.is_empty() { vec![1] } else { strides };
    Tensor::strided(buf.tensor.buffer().clone(), d, &shape, &strides, off / size)
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// A numpy array viewing `t` (zero copy), for sub-worker callables.
pub(crate) fn array_of<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let buf = Bound::new(py, SharedBuffer { tensor: t.clone() })?;
    py.import("numpy")?.call_method1("asarray", (buf,))
}
