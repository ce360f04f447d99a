//! Errors: the exception classes of `pto._errors` (Python classes, so that they pickle), made
//! from Rust errors and panics.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// pto's exception classes, in [`Kind`] order.
pub(crate) static ERROR_TYPES: PyOnceLock<[Py<PyType>; 3]> = PyOnceLock::new();

#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Pto = 0,
    Worker = 1,
    Comm = 2,
}

pub(crate) fn pto_err(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| match ERROR_TYPES.get(py) {
        Some(t) => PyErr::from_type(t[kind as usize].bind(py).clone(), msg),
        None => PyRuntimeError::new_err(msg),
    })
}

pub(crate) fn worker_err(e: impl std::fmt::Display) -> PyErr {
    pto_err(Kind::Worker, e.to_string())
}

pub(crate) fn comm_err(e: impl std::fmt::Display) -> PyErr {
    pto_err(Kind::Comm, e.to_string())
}

pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
