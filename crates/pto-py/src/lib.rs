//! The native module of the `pto` Python package (`pto._native`): the host [`Worker`], numpy
//! arrays over its shared memory, host orchestration from a Python function, sub-worker tasks
//! as Python callables, and collectives from host code. The Python layer (`python/pto`) adds
//! numpy conveniences; `_native.pyi` describes this module and is checked against it.
//!
//! Every argument is checked here before it reaches the Rust crates (see [`args`]); the
//! exception classes are the Python ones of `pto._errors` (so that they pickle); blocking waits
//! happen without the GIL and in slices, so that Ctrl-C raises `KeyboardInterrupt` at once.
//!
//! One module per Python class or concern: `worker` (the `Worker` class), `buffer`
//! (`SharedBuffer`, numpy arrays as tensors), `orch` (`HostOrch`, the recorded submissions),
//! `runner` (the run thread), `programs` (chip programs, sub-worker callables, the listings),
//! `comm` (`Comm`), `window` (`Window`, a run_ranks window), `ranks_state` (what the
//! ranks of one run share), `ranks` (`run_ranks`), `kernels` (Python kernels and their `KernelContext`),
//! `plugins` (`load_plugin`), `errors`, `dtypes`, `args` (argument checks), `wait`
//! (waiting without the GIL) and `logging`. This file registers them as the module.

use pyo3::prelude::*;
use pyo3::types::PyType;

mod args;
mod buffer;
mod comm;
mod dtypes;
mod errors;
mod kernels;
mod logging;
mod orch;
mod plugins;
mod programs;
mod ranks;
mod ranks_state;
mod runner;
mod wait;
mod window;
mod worker;

use worker::Worker;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    logging::init(py);
    let errors = py.import("pto._errors")?;
    let class = |name: &str| -> PyResult<Py<PyType>> {
        Ok(errors.getattr(name)?.cast_into::<PyType>()?.unbind())
    };
    let types = errors::ERROR_TYPES.get_or_try_init(py, || -> PyResult<_> {
        Ok([
            class("PtoError")?,
            class("WorkerError")?,
            class("CommError")?,
        ])
    })?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PtoError", types[errors::Kind::Pto as usize].bind(py))?;
    m.add("WorkerError", types[errors::Kind::Worker as usize].bind(py))?;
    m.add("CommError", types[errors::Kind::Comm as usize].bind(py))?;
    m.add_class::<Worker>()?;
    m.add_class::<buffer::SharedBuffer>()?;
    m.add_class::<orch::HostOrch>()?;
    m.add_class::<comm::Comm>()?;
    m.add_class::<kernels::KernelContext>()?;
    m.add_class::<kernels::MemView>()?;
    m.add_class::<window::Window>()?;
    m.add_function(wrap_pyfunction!(plugins::load_plugin, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::run_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::join_world, m)?)?;
    m.add_class::<ranks::ShmWorld>()?;
    m.add_function(wrap_pyfunction!(programs::programs, m)?)?;
    m.add_function(wrap_pyfunction!(programs::kernels, m)?)?;
    m.add_function(wrap_pyfunction!(programs::simpler_include_dir, m)?)?;
    Ok(())
}
