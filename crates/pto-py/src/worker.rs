//! The Python `Worker`: many chips on this host, one process each; its constructor's
//! arguments, shared buffers, runs (recorded by [`HostOrch`], run on the [`Runner`]), what each
//! chip knows, and closing.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pto_comm::{BufferSpec, WindowSpec};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::args::{
    boolean, int_in, items, repr, seconds, string, tuple_text, type_name, usize_in, MAX_BYTES,
};
use crate::buffer::SharedBuffer;
use crate::dtypes::{dtype_arg, numpy_name, typestr};
use crate::errors::{pto_err, worker_err, Kind};
use crate::orch::{chips_text, Catalog, HostOrch};
use crate::programs::{chip_programs, sub_fn, PyKernelSpec};
use crate::runner::{run_interruptibly, Runner};

/// Many chips on this host, one process each, driven from Python. Usable from any thread:
/// runs go to one run thread, one after the other.
#[pyclass(module = "pto._native")]
pub(crate) struct Worker {
    inner: Option<Arc<pto_worker::Worker>>,
    /// Started with the first run.
    runner: std::sync::OnceLock<Runner>,
    buffers: Vec<BufferSpec>,
    catalog: Arc<Catalog>,
    /// The process that created it: a forked child (`os.fork`, multiprocessing) must neither
    /// run it nor close it, which would end the parent's children and remove its memory.
    pid: u32,
    /// With `check=True`: the happens-before checker (every chip appends its records to a file
    /// in the folder) and the folder.
    check: Option<(Arc<pto_comm::check::Checker>, PathBuf)>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("chips", &self.catalog.chips)
            .finish()
    }
}

impl Worker {
    fn get(&self) -> PyResult<&Arc<pto_worker::Worker>> {
        self.inner
            .as_ref()
            .ok_or_else(|| pto_err(Kind::Worker, "this Worker is closed"))
    }

    fn forked(&self) -> bool {
        std::process::id() != self.pid
    }

    /// In a forked child: lets go of the parent's Worker without touching it.
    fn forget_in_child(&mut self) {
        if self.forked() {
            std::mem::forget(self.runner.take());
            std::mem::forget(self.inner.take());
        }
    }

    fn runner(&self) -> PyResult<&Runner> {
        if let Some(r) = self.runner.get() {
            return Ok(r);
        }
        let r = Runner::start()
            .map_err(|e| worker_err(format!("cannot start the Worker's run thread: {e}")))?;
        Ok(self.runner.get_or_init(|| r))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.forget_in_child();
        // The run thread first (it is idle: runs are waited for), then the Worker's own drop
        // reaps the children and removes the segments.
        self.runner.take();
    }
}

fn chips_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    usize_in(obj, "chips", 1, pto_comm::MAX_RANKS)
}

fn sub_workers_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    usize_in(obj, "sub_workers", 0, pto_comm::MAX_RANKS)
}

/// Most AIC and AIV cores of a chip (pto-core's limits).
const MAX_AIC: i64 = 1024;
const MAX_AIV: i64 = 2048;

fn cores_arg(obj: &Bound<'_, PyAny>) -> PyResult<(u32, u32)> {
    let pair = items(obj, "cores (AIC, AIV)")?;
    if pair.len() != 2 {
        return Err(PyValueError::new_err(format!(
            "cores must be a pair (AIC, AIV), not {} items",
            pair.len()
        )));
    }
    let aic = int_in(&pair[0], "cores[0] (AIC cores)", 0, MAX_AIC)?;
    let aiv = int_in(&pair[1], "cores[1] (AIV cores)", 0, MAX_AIV)?;
    if aic + aiv == 0 {
        return Err(PyValueError::new_err(
            "cores must give a chip at least one core, got (0, 0)",
        ));
    }
    Ok((aic as u32, aiv as u32))
}

fn check_arg(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    boolean(obj, "check")
}

fn comm_arg(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    boolean(obj, "comm")
}

fn collectives_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if obj.is_none() {
        return Ok(None);
    }
    // The chips' collectives window holds four staging areas and a flag line per chip.
    let max = (pto_comm::MAX_WINDOW - 64 * pto_comm::MAX_RANKS) / 4;
    usize_in(obj, "collectives (staging bytes)", 1, max).map(Some)
}

fn timeout_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<Duration>> {
    if obj.is_none() {
        return Ok(None);
    }
    seconds(obj, "timeout").map(Some)
}

/// The window's buffers: `[(name, dtype, count), ...]`.
fn buffer_specs(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<BufferSpec>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let mut specs: Vec<BufferSpec> = Vec::new();
    let mut total = 0usize;
    for (i, b) in items(obj, "buffers")?.iter().enumerate() {
        let what = format!("buffers[{i}]");
        let spec = items(b, &format!("{what} (name, dtype, count)"))?;
        if spec.len() != 3 {
            return Err(PyValueError::new_err(format!(
                "{what} must be (name, dtype, count), not {} items",
                spec.len()
            )));
        }
        let name = string(&spec[0], &format!("{what} name"))?;
        if name.is_empty() || name.len() > 255 {
            return Err(PyValueError::new_err(format!(
                "{what} name must have 1 to 255 characters"
            )));
        }
        if specs.iter().any(|s| s.name == name) {
            return Err(PyValueError::new_err(format!(
                "{what}: buffer name {} is used twice",
                repr(&name)
            )));
        }
        let d = dtype_arg(&spec[1], &format!("{what} dtype"))?;
        let max = pto_comm::MAX_WINDOW / d.size();
        let count = usize_in(&spec[2], &format!("{what} count ({d} elements)"), 1, max)?;
        total = total
            .div_ceil(pto_comm::WINDOW_ALIGN)
            .saturating_mul(pto_comm::WINDOW_ALIGN)
            .saturating_add(count * d.size());
        if total > pto_comm::MAX_WINDOW {
            return Err(PyValueError::new_err(format!(
                "buffers: the window would take {total} bytes per chip, more than the {} maximum",
                pto_comm::MAX_WINDOW
            )));
        }
        specs.push(BufferSpec::new(&name, d, count));
    }
    Ok(specs)
}

/// `subs`: `{name: callable}`.
fn sub_callables<'py>(
    obj: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let d = obj.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "subs must be a dict {{name: callable}}, not {}",
            type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    for (k, v) in d.iter() {
        let name = string(&k, "subs: every key (a sub-worker callable's name)")?;
        if name.is_empty() {
            return Err(PyValueError::new_err("subs: a name is empty"));
        }
        if !v.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "subs[{}] must be callable, not {}",
                repr(&name),
                type_name(&v)
            )));
        }
        out.push((name, v));
    }
    Ok(out)
}

/// `kernels=[(name, core, fn), ...]` (what `pto.kernel` makes): distinct names, a core of
/// "aic", "aiv" or "mix", a callable.
fn kernel_specs(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<PyKernelSpec>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<PyKernelSpec> = Vec::new();
    for (i, item) in items(obj, "kernels")?.iter().enumerate() {
        let what = format!("kernels[{i}]");
        let parts = items(item, &what)?;
        if parts.len() != 3 {
            return Err(PyTypeError::new_err(format!(
                "{what} must be a kernel made by @pto.kernel (or a (name, core, callable) tuple)"
            )));
        }
        let name = string(&parts[0], &format!("{what} name"))?;
        let core = match string(&parts[1], &format!("{what} core"))?.as_str() {
            "aic" => pto_core::CoreKind::Aic,
            "aiv" => pto_core::CoreKind::Aiv,
            "mix" => pto_core::CoreKind::Mix,
            other => {
                return Err(PyValueError::new_err(format!(
                    "{what}: core must be \"aic\", \"aiv\" or \"mix\", not {}",
                    repr(other)
                )))
            }
        };
        if !parts[2].is_callable() {
            return Err(PyTypeError::new_err(format!(
                "{what}: the kernel must be callable, not {}",
                type_name(&parts[2])
            )));
        }
        if name.is_empty() || out.iter().any(|k| k.0 == name) {
            return Err(PyValueError::new_err(format!(
                "{what}: kernel name {} is empty or given twice",
                repr(&name)
            )));
        }
        out.push((name, core, parts[2].clone().unbind()));
    }
    Ok(out)
}

/// The loaded plugins' window buffers join the Worker's (a buffer both declare must agree).
fn merge_plugin_buffers(
    specs: &mut Vec<BufferSpec>,
    plugins: &[pto_plugin::Plugin],
) -> PyResult<()> {
    for p in plugins {
        for b in p.buffers() {
            match specs.iter().find(|s| s.name == b.name) {
                Some(s) if s.dtype == b.dtype && s.count == b.count => {}
                Some(s) => {
                    return Err(PyValueError::new_err(format!(
                        "buffers: {} is {} x {} here but {} x {} in plugin {}",
                        repr(&b.name),
                        s.count,
                        s.dtype,
                        b.count,
                        b.dtype,
                        p.path()
                    )))
                }
                None => specs.push(b.clone()),
            }
        }
    }
    Ok(())
}

#[pymethods]
impl Worker {
    /// Starts the Worker: forks one process per chip and per sub-worker (call it before this
    /// process starts threads).
    #[new]
    #[pyo3(signature = (chips=1, cores=(1, 2), sub_workers=0, buffers=None, collectives=None, comm=true, subs=None, timeout=None, kernels=None, check=false, threads=None, backend=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = chips_arg)] chips: usize,
        #[pyo3(from_py_with = cores_arg)] cores: (u32, u32),
        #[pyo3(from_py_with = sub_workers_arg)] sub_workers: usize,
        buffers: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = collectives_arg)] collectives: Option<usize>,
        #[pyo3(from_py_with = comm_arg)] comm: bool,
        subs: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = timeout_arg)] timeout: Option<Duration>,
        kernels: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = check_arg)] check: bool,
        threads: Option<usize>,
        backend: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Worker> {
        let in_process = match backend.filter(|b| !b.is_none()) {
            None => false,
            Some(b) => match string(b, "Worker: backend")?.as_str() {
                "shm" => false,
                "local" => true,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "Worker: backend must be \"shm\" (children are forked processes) or \"local\" (threads of this process), not {}",
                        repr(other)
                    )))
                }
            },
        };
        let mut specs = buffer_specs(buffers)?;
        let callables = sub_callables(subs)?;
        let py_kernels = kernel_specs(kernels)?;
        let plugins = crate::plugins::loaded();
        merge_plugin_buffers(&mut specs, &plugins)?;
        let mut b = pto_worker::Worker::builder()
            .chips(chips)
            .cores(cores.0, cores.1)
            .sub_workers(sub_workers);
        if in_process {
            b = b.in_process();
        }
        if let Some(n) = threads {
            if !(1..=1024).contains(&n) {
                return Err(PyValueError::new_err(format!(
                    "Worker: threads must be 1 to 1024, not {n}"
                )));
            }
            b = b.threads(n);
        }
        if !specs.is_empty() {
            b = b.window(WindowSpec::for_buffers(specs.clone()));
        }
        if let Some(cap) = collectives {
            b = b.collectives(cap);
        }
        if !comm {
            b = b.no_comm();
        }
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        let mut sub_names = BTreeSet::new();
        for (name, f) in callables {
            b = b.sub(&name, sub_fn(f.unbind()));
            sub_names.insert(name);
        }
        if !py_kernels.is_empty() {
            // A chip child's main thread holds the GIL it inherited across the fork; it lets
            // it go for the child's life, so that the chip's core threads can run Python
            // kernels.
            b = b.chip_main(|run| Python::attach(|py| py.detach(run)));
            // Each chip thread attaches to the interpreter once, for its life (a thread state
            // set up and torn down per kernel call costs tens of microseconds), and holds the
            // GIL only while a kernel runs.
            b = b.chip_thread_main(|run| Python::attach(|py| py.detach(run)));
        }
        let (b, programs) = chip_programs(b, py_kernels, &plugins)?;
        // With check=True the checker is installed before the fork: every chip inherits it and
        // appends its records to its own file in the folder.
        let check = if check {
            let dir = std::env::temp_dir().join(format!("pto-check-py-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| {
                pto_err(
                    Kind::Pto,
                    format!("check: cannot create {}: {e}", dir.display()),
                )
            })?;
            Some((
                pto_comm::check::Checker::install_files(chips, None, dir.clone()),
                dir,
            ))
        } else {
            None
        };
        // The GIL stays held across the fork: a sub-worker child continues on this thread,
        // which then holds the GIL it needs to call its Python callables. Children that are
        // threads take the GIL themselves (a chip running Python kernels, during its bring-up
        // too): the GIL is let go while they start.
        let w = if in_process {
            py.detach(|| b.init())
        } else {
            b.init()
        }
        .map_err(worker_err)?;
        Ok(Worker {
            inner: Some(Arc::new(w)),
            runner: std::sync::OnceLock::new(),
            pid: std::process::id(),
            check,
            buffers: specs,
            catalog: Arc::new(Catalog {
                chips,
                programs,
                subs: sub_names,
                sub_workers,
            }),
        })
    }

    /// A buffer in shared memory that every chip reads and writes in place; wrap it with
    /// `numpy.asarray` (the Python `Worker.buffer` does) to get a zero-copy array.
    fn buffer(
        &self,
        shape: &Bound<'_, PyAny>,
        dtype_name: &Bound<'_, PyAny>,
    ) -> PyResult<SharedBuffer> {
        let w = self.get()?;
        let d = dtype_arg(dtype_name, "Worker.buffer: dtype")?;
        typestr(d).map_err(|_| {
            PyValueError::new_err(format!(
                "Worker.buffer: dtype {d} has no numpy equivalent (use it in window buffers only)"
            ))
        })?;
        let dims = items(shape, "Worker.buffer: shape")?;
        if dims.is_empty() || dims.len() > pto_core::MAX_DIMS {
            return Err(PyValueError::new_err(format!(
                "Worker.buffer: shape must have 1 to {} dimensions, got {}",
                pto_core::MAX_DIMS,
                dims.len()
            )));
        }
        let max = MAX_BYTES / d.size();
        let mut shape = Vec::with_capacity(dims.len());
        let mut elems = 1usize;
        for (i, v) in dims.iter().enumerate() {
            // One dimension holds at most MAX_DIM_LEN elements (32-bit regions), the whole
            // buffer at most MAX_BYTES.
            let n = usize_in(
                v,
                &format!("Worker.buffer: shape[{i}]"),
                1,
                max.min(pto_core::MAX_DIM_LEN),
            )?;
            elems = elems.saturating_mul(n);
            shape.push(n);
        }
        if elems > max {
            return Err(PyValueError::new_err(format!(
                "Worker.buffer: shape {} of {d} takes more than {MAX_BYTES} bytes",
                tuple_text(&shape)
            )));
        }
        let tensor = w.tensor(&shape, d).map_err(worker_err)?;
        Ok(SharedBuffer { tensor })
    }

    /// Number of chips.
    #[getter]
    fn chips(&self) -> usize {
        self.catalog.chips
    }

    /// Calls `orch_fn(orch, args)` to record the host orchestration, then runs it (without the
    /// GIL) until every task is done. Returns `{"tasks": n}`; with `trace`, writes a Chrome
    /// trace of the host and every chip there. Ctrl-C during the run raises
    /// `KeyboardInterrupt` and leaves the Worker unusable (close it).
    #[pyo3(signature = (orch_fn, args=None, trace=None))]
    fn run(
        &self,
        py: Python<'_>,
        orch_fn: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
        trace: Option<PathBuf>,
    ) -> PyResult<Py<PyDict>> {
        let w = self.get()?;
        if self.forked() {
            return Err(pto_err(
                Kind::Worker,
                format!(
                    "this Worker belongs to process {}: a forked child cannot run it",
                    self.pid
                ),
            ));
        }
        if !orch_fn.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "orch_fn must be callable (orch_fn(orch, args)), not {}",
                type_name(orch_fn)
            )));
        }
        if let Some(path) = &trace {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !dir.is_dir() {
                return Err(PyValueError::new_err(format!(
                    "trace: {} is not in an existing directory",
                    path.display()
                )));
            }
            if path.as_os_str().is_empty() || path.is_dir() {
                return Err(PyValueError::new_err(format!(
                    "trace: {:?} is not a file path (a directory, or empty): name the file to write",
                    path.display().to_string()
                )));
            }
        }
        let rec = Bound::new(py, HostOrch::new(self.catalog.clone()))?;
        let none = py.None().into_bound(py);
        let called = orch_fn.call1((rec.clone(), args.unwrap_or(&none)));
        let subs = rec.borrow().finish()?;
        called?;
        let report = run_interruptibly(py, self.runner()?, w, subs, trace.is_some())?;
        if let Some(path) = &trace {
            let mut events = report.trace_events.clone();
            events.extend(pto_core::trace::Trace::signal_flows(&report.trace_events));
            let doc = serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ns" });
            std::fs::write(path, doc.to_string()).map_err(|e| {
                pto_err(
                    Kind::Pto,
                    format!("writing the trace to {}: {e}", path.display()),
                )
            })?;
        }
        let d = PyDict::new(py);
        d.set_item("tasks", report.host.stats.tasks)?;
        Ok(d.unbind())
    }

    /// What chip `i` knows: its rank, the number of chips, its window size and named buffers
    /// (`(name, dtype, count, offset)`).
    fn chip_context<'py>(
        &self,
        py: Python<'py>,
        i: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let w = self.get()?;
        let chips = self.catalog.chips;
        let i = usize_in(
            i,
            &format!("chip_context: i ({})", chips_text(chips)),
            0,
            chips - 1,
        )?;
        let f = w.chip_facts(i).ok_or_else(|| {
            PyValueError::new_err(format!("no chip {i} (the Worker has {chips})"))
        })?;
        let d = PyDict::new(py);
        d.set_item("rank", f.rank)?;
        d.set_item("size", f.size)?;
        d.set_item("window_bytes", f.window_bytes)?;
        let bufs = PyList::empty(py);
        for (b, off) in self.buffers.iter().zip(&f.buffer_offsets) {
            bufs.append((
                b.name.clone(),
                numpy_name(b.dtype).unwrap_or("bfloat16"),
                b.count,
                *off,
            ))?;
        }
        d.set_item("buffers", bufs)?;
        Ok(d)
    }

    /// Stops every child process and removes the Worker's shared memory; the Worker cannot
    /// run again. Closing twice is fine.
    /// With `check=True`: what the checker found in the runs so far: `{"races": [text, ...],
    /// "warnings": [text, ...], "accesses": n, "edges": n}`.
    fn check_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Some((c, _)) = &self.check else {
            return Err(PyValueError::new_err(
                "check_report: this Worker was made without check=True",
            ));
        };
        let r = c.report();
        let d = PyDict::new(py);
        d.set_item(
            "races",
            r.races.iter().map(ToString::to_string).collect::<Vec<_>>(),
        )?;
        d.set_item("warnings", r.warnings.clone())?;
        d.set_item("accesses", r.accesses)?;
        d.set_item("edges", r.edges)?;
        Ok(d)
    }

    fn close(&mut self, py: Python<'_>) {
        self.forget_in_child();
        self.runner.take();
        if let Some((_, dir)) = self.check.take() {
            if !self.forked() {
                pto_comm::check::Checker::uninstall();
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        if let Some(w) = self.inner.take() {
            // The only reference, now that the run thread is gone.
            py.detach(|| match Arc::try_unwrap(w) {
                Ok(w) => w.close(),
                Err(w) => drop(w),
            });
        }
    }
}
