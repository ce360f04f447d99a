//! What a Worker's children run: every built-in kernel as a single-kernel chip program, the
//! registered chip programs (pto-examples), Python callables as sub-worker closures; and the
//! `programs()` and `kernels()` listings.

use std::collections::BTreeSet;

use pto_core::{ArgMode, CoreKind, DType, KernelRegistry, Orch, OrchError, Scalar, TaskArgs};
use pto_worker::{ChipCall, SubCall};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::buffer::array_of;
use crate::errors::worker_err;
use crate::kernels::py_kernel;

/// A chip program that submits one kernel with the host task's tensors (modes kept) and
/// scalars.
fn kernel_program(
    name: String,
) -> impl Fn(&mut Orch<'_>, &ChipCall) -> Result<(), OrchError> + Send + Sync + 'static {
    move |o, call| {
        let mut t = TaskArgs::new();
        for (x, m) in &call.tensors {
            t = match m {
                ArgMode::In => t.input(x),
                ArgMode::InOut => t.inout(x),
                ArgMode::NoDep => t.no_dep(x),
                _ => t.output_existing(x),
            };
        }
        for s in &call.scalars {
            t = push_scalar(t, s)?;
        }
        o.submit(name.as_str(), t).map(|_| ())
    }
}

fn push_scalar(t: TaskArgs, s: &Scalar) -> Result<TaskArgs, OrchError> {
    let bad = || OrchError::msg(format!("unsupported scalar type {}", s.dtype()));
    Ok(match s.dtype() {
        DType::F64 => t.scalar(s.get::<f64>().ok_or_else(bad)?),
        DType::F32 => t.scalar(s.get::<f32>().ok_or_else(bad)?),
        DType::I64 => t.scalar(s.get::<i64>().ok_or_else(bad)?),
        DType::I32 => t.scalar(s.get::<i32>().ok_or_else(bad)?),
        DType::U64 => t.scalar(s.get::<u64>().ok_or_else(bad)?),
        DType::U32 => t.scalar(s.get::<u32>().ok_or_else(bad)?),
        _ => return Err(bad()),
    })
}

/// The callable run on a sub-worker: it gets numpy arrays of the task's tensors, then its
/// scalars, positionally. An exception fails the task with its text (traceback included).
pub(crate) fn sub_fn(
    f: Py<PyAny>,
) -> impl Fn(&SubCall) -> Result<(), String> + Send + Sync + 'static {
    move |call| {
        Python::attach(|py| {
            let run = || -> PyResult<()> {
                let mut items: Vec<Bound<'_, PyAny>> = Vec::new();
                for (t, mode) in &call.tensors {
                    let a = array_of(py, t)?;
                    // An input is read-only, as in a Python kernel: numpy refuses a write.
                    if !mode.writable() {
                        a.getattr("flags")?.setattr("writeable", false)?;
                    }
                    items.push(a);
                }
                for s in &call.scalars {
                    let v = match s.dtype() {
                        DType::F64 | DType::F32 => s
                            .get::<f64>()
                            .or_else(|| s.get::<f32>().map(f64::from))
                            .unwrap_or(f64::NAN)
                            .into_pyobject(py)?
                            .into_any(),
                        _ => s.get::<i64>().unwrap_or(0).into_pyobject(py)?.into_any(),
                    };
                    items.push(v);
                }
                f.call1(py, PyTuple::new(py, items)?)?;
                Ok(())
            };
            run().map_err(|e| {
                let tb = e
                    .traceback(py)
                    .and_then(|t| t.format().ok())
                    .unwrap_or_default();
                format!("{tb}{e}")
            })
        })
    }
}

/// A Python kernel: its name, core kind and function.
pub(crate) type PyKernelSpec = (String, CoreKind, Py<PyAny>);

/// The chip programs of a Worker: every kernel (built-in, of a loaded plugin, or a Python
/// kernel) as a single-kernel chip program, the registered programs (pto-examples) and the
/// loaded plugins' programs; their names.
pub(crate) fn chip_programs(
    mut b: pto_worker::WorkerBuilder,
    py_kernels: Vec<PyKernelSpec>,
    plugins: &[pto_plugin::Plugin],
) -> PyResult<(pto_worker::WorkerBuilder, BTreeSet<String>)> {
    let mut reg: KernelRegistry = pto_kernels::registry().map_err(worker_err)?;
    for p in plugins {
        p.add_kernels(&mut reg).map_err(worker_err)?;
    }
    for (name, core, f) in py_kernels {
        reg.register(&name, core, py_kernel(f)).map_err(|e| {
            PyValueError::new_err(format!(
                "kernels: {e} (a built-in or plugin kernel has that name)"
            ))
        })?;
    }
    let names: Vec<String> = reg.iter().map(|k| k.name().to_string()).collect();
    let mut all = BTreeSet::new();
    for n in names {
        b = b.program(&n, reg.clone(), kernel_program(n.clone()));
        all.insert(n);
    }
    // simpler's programs: the bridge's chip program (python -m pto.simpler drives it).
    b = b.program(
        pto_simpler::PROGRAM,
        pto_simpler::kernel::registry().map_err(worker_err)?,
        pto_simpler::chip_program,
    );
    all.insert(pto_simpler::PROGRAM.to_string());
    for p in pto_examples::programs::PROGRAMS {
        b = b.program(p.name, (p.kernels)().map_err(worker_err)?, p.orch);
        all.insert(p.name.to_string());
    }
    for p in plugins {
        for name in p.programs() {
            if !all.insert(name.to_string()) {
                return Err(worker_err(format!(
                    "plugin {}: program {name:?} has the name of a kernel or another program",
                    p.path()
                )));
            }
            let orch = p.orchestration(name).map_err(worker_err)?;
            b = b.program(name, reg.clone(), move |o, _call| orch(o));
        }
    }
    Ok((b, all))
}

/// The registered chip programs (besides every built-in kernel): `(name, about)`.
#[pyfunction]
pub(crate) fn programs() -> Vec<(&'static str, &'static str)> {
    pto_examples::programs::PROGRAMS
        .iter()
        .map(|p| (p.name, p.about))
        .collect()
}

/// The built-in kernels, each also a chip program of the same name.
#[pyfunction]
pub(crate) fn kernels() -> PyResult<Vec<String>> {
    Ok(pto_kernels::registry()
        .map_err(worker_err)?
        .iter()
        .map(|k| k.name().to_string())
        .collect())
}

/// The folder of pto's simpler-compatible headers (`pto include-dir --simpler`).
#[pyfunction]
pub(crate) fn simpler_include_dir() -> PyResult<String> {
    pto_simpler::include_dir()
        .map(|p| p.display().to_string())
        .map_err(|e| worker_err(format!("writing pto's simpler headers: {e}")))
}
