//! C plugins from Python: `pto.load_plugin(path)` loads one (`pto_plugin`) for the life of the
//! process; every Worker created afterwards has its kernels and programs (by name, beside the
//! built-ins) and its window buffers.

use std::sync::Mutex;

use pto_plugin::Plugin;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{pto_err, Kind};

static LOADED: Mutex<Vec<Plugin>> = Mutex::new(Vec::new());

/// The plugins loaded so far, in load order.
pub(crate) fn loaded() -> Vec<Plugin> {
    LOADED.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Loads the C plugin at `path` (a shared library built against `pto.h`); Workers created
/// afterwards can run its kernels and programs by name. Returns what it registered:
/// `{"path", "programs", "kernels": [(name, core)], "buffers": [(name, dtype, count)]}`.
#[pyfunction]
pub(crate) fn load_plugin<'py>(
    py: Python<'py>,
    path: std::path::PathBuf,
) -> PyResult<Bound<'py, PyDict>> {
    let p = Plugin::load(&path).map_err(|e| pto_err(Kind::Pto, e.to_string()))?;
    let mut all = LOADED
        .lock()
        .map_err(|_| pto_err(Kind::Pto, "the plugin list is poisoned by an earlier panic"))?;
    if let Some(old) = all.iter().find(|o| o.path() == p.path()) {
        // Loading the same file twice is loading it once.
        return describe(py, old);
    }
    // Refuse a kernel name that a built-in or an earlier plugin already has, now rather than
    // at the next Worker.
    let mut reg = pto_kernels::registry().map_err(|e| pto_err(Kind::Pto, e.to_string()))?;
    for o in all.iter() {
        o.add_kernels(&mut reg)
            .map_err(|e| pto_err(Kind::Pto, e.to_string()))?;
    }
    p.add_kernels(&mut reg)
        .map_err(|e| pto_err(Kind::Pto, e.to_string()))?;
    let d = describe(py, &p)?;
    all.push(p);
    Ok(d)
}

fn describe<'py>(py: Python<'py>, p: &Plugin) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("path", p.path())?;
    d.set_item("programs", p.programs().collect::<Vec<_>>())?;
    d.set_item(
        "kernels",
        p.kernels()
            .map(|(n, k)| (n.to_string(), k.name().to_lowercase()))
            .collect::<Vec<_>>(),
    )?;
    d.set_item(
        "buffers",
        p.buffers()
            .iter()
            .map(|b| (b.name.clone(), b.dtype.to_string(), b.count))
            .collect::<Vec<_>>(),
    )?;
    Ok(d)
}
