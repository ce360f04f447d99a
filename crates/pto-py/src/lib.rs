//! The native module of the `pto` Python package (`pto._native`): the host [`Worker`], numpy
//! arrays over its shared memory, host orchestration from a Python function, sub-worker tasks
//! as Python callables, and collectives from host code. The Python layer (`python/pto`) adds
//! numpy conveniences; `_native.pyi` describes this module and is checked against it.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use pto_comm::{BufferSpec, Collectives, ReduceOp, WindowSpec};
use pto_core::{ArgMode, DType, KernelRegistry, Orch, OrchError, Scalar, TaskArgs, Tensor};
use pto_worker::{ChipCall, SubCall};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

pyo3::create_exception!(
    _native,
    PtoError,
    PyException,
    "Every error pto raises; the message names what failed (chip, task, kernel, rank)."
);
pyo3::create_exception!(
    _native,
    WorkerError,
    PtoError,
    "The Worker could not start, or a run failed (a chip or sub-worker task, a dead child)."
);
pyo3::create_exception!(
    _native,
    CommError,
    PtoError,
    "A communication error (a collective, a window, a rank)."
);

fn worker_err(e: impl std::fmt::Display) -> PyErr {
    WorkerError::new_err(e.to_string())
}

fn comm_err(e: impl std::fmt::Display) -> PyErr {
    CommError::new_err(e.to_string())
}

/// numpy's dtype names for pto's dtypes (bf16 has none).
fn numpy_name(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        _ => return None,
    })
}

/// A dtype from a numpy name (`"float32"`) or a pto name (`"f32"`).
fn dtype(name: &str) -> PyResult<DType> {
    DType::from_name(name)
        .or_else(|| {
            DType::ALL
                .into_iter()
                .find(|&d| numpy_name(d) == Some(name))
        })
        .ok_or_else(|| PyValueError::new_err(format!("unknown dtype {name:?}")))
}

/// numpy's array-interface type string of a dtype.
fn typestr(d: DType) -> PyResult<String> {
    let kind = match d {
        DType::F32 | DType::F64 | DType::F16 => 'f',
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 'i',
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 'u',
        DType::Bool => 'b',
        _ => return Err(PyTypeError::new_err(format!("{d} has no numpy equivalent"))),
    };
    let order = if d.size() == 1 { '|' } else { '<' };
    Ok(format!("{order}{kind}{}", d.size()))
}

/// Memory shared with the Worker's chips: a numpy array made from it (`numpy.asarray`) views
/// the same bytes, without a copy, and keeps it alive.
#[pyclass(frozen, module = "pto._native")]
#[derive(Debug)]
struct SharedBuffer {
    tensor: Tensor,
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

/// The shared buffer behind `arr` (following `.base`), and `arr` as a pto tensor over it.
fn tensor_of(arr: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let mut base = arr.clone();
    let buf =
        loop {
            if let Ok(b) = base.extract::<PyRef<'_, SharedBuffer>>() {
                break b;
            }
            let next = base.getattr("base").ok().filter(|b| !b.is_none());
            match next {
                Some(b) => base = b,
                None => return Err(PyTypeError::new_err(
                    "a tensor argument must be an array from Worker.buffer() (or a view of one)",
                )),
            }
        };
    let ai = arr.getattr("__array_interface__")?;
    let shape: Vec<usize> = ai.get_item("shape")?.extract()?;
    let (ptr, _): (usize, bool) = ai.get_item("data")?.extract()?;
    let ts: String = ai.get_item("typestr")?.extract()?;
    let name: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
    let d = dtype(&name)?;
    if typestr(d)? != ts {
        return Err(PyTypeError::new_err(format!(
            "array of type {ts} is not a little-endian {name}"
        )));
    }
    let size = d.size();
    let strides: Option<Vec<isize>> = ai.get_item("strides")?.extract()?;
    let strides: Vec<usize> = match strides {
        None => {
            let mut s = vec![1usize; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                s[i] = s[i + 1] * shape[i + 1].max(1);
            }
            s
        }
        Some(st) => st
            .iter()
            .map(|&b| {
                if b > 0 && b as usize % size == 0 {
                    Ok(b as usize / size)
                } else {
                    Err(PyValueError::new_err(format!(
                        "array strides {st:?} are not positive multiples of the {size}-byte element"
                    )))
                }
            })
            .collect::<PyResult<_>>()?,
    };
    let base_addr = buf.tensor.buffer().addr();
    let off = ptr
        .checked_sub(base_addr)
        .filter(|o| o % size == 0)
        .ok_or_else(|| PyValueError::new_err("array does not start on an element of its buffer"))?;
    let shape = if shape.is_empty() { vec![1] } else { shape };
    let strides = if strides.is_empty() { vec![1] } else { strides };
    Tensor::strided(buf.tensor.buffer().clone(), d, &shape, &strides, off / size)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// One recorded argument.
#[derive(Debug)]
enum Arg {
    Tensor(Tensor, ArgMode),
    F64(f64),
    I64(i64),
}

#[derive(Debug)]
enum Target {
    Chip(usize),
    Group(Vec<usize>),
    Sub(String),
}

#[derive(Debug)]
struct Submission {
    target: Target,
    program: String,
    args: Vec<Arg>,
}

fn parse_args(args: &Bound<'_, PyAny>) -> PyResult<Vec<Arg>> {
    let mut out = Vec::new();
    for a in args.try_iter()? {
        let a = a?;
        if let Ok((mode, arr)) = a.extract::<(String, Bound<'_, PyAny>)>() {
            let m = match mode.as_str() {
                "in" => ArgMode::In,
                "out" => ArgMode::OutputExisting,
                "inout" => ArgMode::InOut,
                "nodep" => ArgMode::NoDep,
                other => {
                    return Err(PyValueError::new_err(format!(
                    "unknown argument mode {other:?}: use pto.IN, pto.OUT, pto.INOUT or pto.NODEP"
                )))
                }
            };
            out.push(Arg::Tensor(tensor_of(&arr)?, m));
        } else if let Ok(i) = a.extract::<i64>() {
            out.push(Arg::I64(i));
        } else if let Ok(f) = a.extract::<f64>() {
            out.push(Arg::F64(f));
        } else {
            return Err(PyTypeError::new_err(format!(
                "argument {a}: pass pto.IN(array), pto.OUT(array), pto.INOUT(array) or a number"
            )));
        }
    }
    Ok(out)
}

fn task_args(args: &[Arg]) -> TaskArgs {
    args.iter().fold(TaskArgs::new(), |t, a| match a {
        Arg::Tensor(x, ArgMode::In) => t.input(x),
        Arg::Tensor(x, ArgMode::InOut) => t.inout(x),
        Arg::Tensor(x, ArgMode::NoDep) => t.no_dep(x),
        Arg::Tensor(x, _) => t.output_existing(x),
        Arg::F64(v) => t.scalar(*v),
        Arg::I64(v) => t.scalar(*v),
    })
}

/// The host orchestration's recorder: `orch_fn` submits through it, and the Worker runs the
/// submissions in order (dependencies come from the tensors, as always).
#[pyclass(module = "pto._native")]
#[derive(Debug, Default)]
struct HostOrch {
    subs: Mutex<Vec<Submission>>,
}

impl HostOrch {
    fn push(&self, target: Target, program: String, args: &Bound<'_, PyAny>) -> PyResult<()> {
        let args = parse_args(args)?;
        self.subs
            .lock()
            .map_err(|_| PtoError::new_err("orchestration recorder poisoned"))?
            .push(Submission {
                target,
                program,
                args,
            });
        Ok(())
    }
}

#[pymethods]
impl HostOrch {
    /// Runs chip program `program` (a built-in kernel's name, or a registered program) on chip
    /// `chip` with `args`.
    #[pyo3(signature = (chip, program, args=None))]
    fn submit_chip(
        &self,
        py: Python<'_>,
        chip: usize,
        program: String,
        args: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let args = args.unwrap_or_else(|| PyList::empty(py).into_any());
        self.push(Target::Chip(chip), program, &args)
    }

    /// Starts `program` on every chip of `chips` at once (for programs that communicate).
    #[pyo3(signature = (chips, program, args=None))]
    fn submit_group(
        &self,
        py: Python<'_>,
        chips: Vec<usize>,
        program: String,
        args: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let args = args.unwrap_or_else(|| PyList::empty(py).into_any());
        self.push(Target::Group(chips), program, &args)
    }

    /// Runs the sub-worker callable `name` on a sub-worker process with `args`.
    #[pyo3(signature = (name, args=None))]
    fn submit_sub(
        &self,
        py: Python<'_>,
        name: String,
        args: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let args = args.unwrap_or_else(|| PyList::empty(py).into_any());
        self.push(Target::Sub(name.clone()), name, &args)
    }
}

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

/// A numpy array viewing `t` (zero copy), for sub-worker callables.
fn array_of<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let buf = Bound::new(py, SharedBuffer { tensor: t.clone() })?;
    py.import("numpy")?.call_method1("asarray", (buf,))
}

/// The callable run on a sub-worker: it gets numpy arrays of the task's tensors, then its
/// scalars, positionally. An exception fails the task with its text (traceback included).
fn sub_fn(f: Py<PyAny>) -> impl Fn(&SubCall) -> Result<(), String> + Send + Sync + 'static {
    move |call| {
        Python::attach(|py| {
            let run = || -> PyResult<()> {
                let mut items: Vec<Bound<'_, PyAny>> = Vec::new();
                for (t, _) in &call.tensors {
                    items.push(array_of(py, t)?);
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

/// Many chips on this host, one process each, driven from Python.
#[pyclass(unsendable, module = "pto._native")]
struct Worker {
    inner: Option<pto_worker::Worker>,
    buffers: Vec<BufferSpec>,
    chips: usize,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("chips", &self.chips)
            .finish()
    }
}

impl Worker {
    fn get(&self) -> PyResult<&pto_worker::Worker> {
        self.inner
            .as_ref()
            .ok_or_else(|| WorkerError::new_err("this Worker is closed"))
    }
}

/// Every built-in kernel (pto-kernels) as a single-kernel chip program.
fn builtin_programs(mut b: pto_worker::WorkerBuilder) -> PyResult<pto_worker::WorkerBuilder> {
    let reg: KernelRegistry = pto_kernels::registry().map_err(worker_err)?;
    let names: Vec<String> = reg.iter().map(|k| k.name().to_string()).collect();
    for n in names {
        b = b.program(&n, reg.clone(), kernel_program(n.clone()));
    }
    for p in pto_examples::programs::PROGRAMS {
        b = b.program(p.name, (p.kernels)().map_err(worker_err)?, p.orch);
    }
    Ok(b)
}

#[pymethods]
impl Worker {
    /// Starts the Worker: forks one process per chip and per sub-worker (call it before this
    /// process starts threads).
    #[new]
    #[pyo3(signature = (chips=1, cores=(1, 2), sub_workers=0, buffers=None, collectives=None, comm=true, subs=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        chips: usize,
        cores: (u32, u32),
        sub_workers: usize,
        buffers: Option<Vec<(String, String, usize)>>,
        collectives: Option<usize>,
        comm: bool,
        subs: Option<Bound<'_, PyDict>>,
        timeout: Option<f64>,
    ) -> PyResult<Worker> {
        let mut b = pto_worker::Worker::builder()
            .chips(chips)
            .cores(cores.0, cores.1)
            .sub_workers(sub_workers);
        let mut specs = Vec::new();
        for (name, d, count) in buffers.unwrap_or_default() {
            specs.push(BufferSpec::new(&name, dtype(&d)?, count));
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
            if !(t > 0.0 && t.is_finite()) {
                return Err(PyValueError::new_err(format!(
                    "timeout must be positive, got {t}"
                )));
            }
            b = b.timeout(Duration::from_secs_f64(t));
        }
        if let Some(subs) = subs {
            for (k, v) in subs.iter() {
                let name: String = k.extract()?;
                if !v.is_callable() {
                    return Err(PyTypeError::new_err(format!(
                        "sub-worker {name:?} is not callable"
                    )));
                }
                b = b.sub(&name, sub_fn(v.unbind()));
            }
        }
        b = builtin_programs(b)?;
        // The GIL stays held across the fork: a sub-worker child continues on this thread,
        // which then holds the GIL it needs to call its Python callables.
        let w = b.init().map_err(worker_err)?;
        Ok(Worker {
            inner: Some(w),
            buffers: specs,
            chips,
        })
    }

    /// A buffer in shared memory that every chip reads and writes in place; wrap it with
    /// `numpy.asarray` (the Python `Worker.buffer` does) to get a zero-copy array.
    fn buffer(&self, shape: Vec<usize>, dtype_name: &str) -> PyResult<SharedBuffer> {
        let d = dtype(dtype_name)?;
        let tensor = self.get()?.tensor(&shape, d).map_err(worker_err)?;
        Ok(SharedBuffer { tensor })
    }

    /// Number of chips.
    #[getter]
    fn chips(&self) -> usize {
        self.chips
    }

    /// Calls `orch_fn(orch, args)` to record the host orchestration, then runs it (without the
    /// GIL) until every task is done. Returns `{"tasks": n}`; with `trace`, writes a Chrome
    /// trace of the host and every chip there.
    #[pyo3(signature = (orch_fn, args=None, trace=None))]
    fn run(
        &self,
        py: Python<'_>,
        orch_fn: Bound<'_, PyAny>,
        args: Option<Bound<'_, PyAny>>,
        trace: Option<PathBuf>,
    ) -> PyResult<Py<PyDict>> {
        let rec = Bound::new(py, HostOrch::default())?;
        orch_fn.call1((
            rec.clone(),
            args.unwrap_or_else(|| py.None().into_bound(py)),
        ))?;
        let subs = std::mem::take(
            &mut *rec
                .borrow()
                .subs
                .lock()
                .map_err(|_| PtoError::new_err("orchestration recorder poisoned"))?,
        );
        let w = self.get()?;
        let report = py
            .detach(|| {
                w.run_with(
                    move |h| {
                        for s in &subs {
                            let a = task_args(&s.args);
                            match &s.target {
                                Target::Chip(c) => h.submit_chip(*c, &s.program, a)?,
                                Target::Group(cs) => h.submit_group(cs, &s.program, a)?,
                                Target::Sub(n) => h.submit_sub(n, a)?,
                            };
                        }
                        Ok(())
                    },
                    trace.is_some(),
                )
            })
            .map_err(worker_err)?;
        if let Some(path) = &trace {
            let doc =
                serde_json::json!({ "traceEvents": report.trace_events, "displayTimeUnit": "ns" });
            std::fs::write(path, doc.to_string()).map_err(|e| {
                PtoError::new_err(format!("writing the trace to {}: {e}", path.display()))
            })?;
        }
        let d = PyDict::new(py);
        d.set_item("tasks", report.host.stats.tasks)?;
        Ok(d.unbind())
    }

    /// What chip `i` knows: its rank, the number of chips, its window size and named buffers
    /// (`(name, dtype, count, offset)`).
    fn chip_context<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyDict>> {
        let f = self.get()?.chip_facts(i).ok_or_else(|| {
            PyValueError::new_err(format!("no chip {i} (the Worker has {})", self.chips))
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

    /// Stops every child process; the Worker cannot run again.
    fn close(&mut self) {
        if let Some(w) = self.inner.take() {
            w.close();
        }
    }
}

/// One rank of `run_ranks`: its rank and size, a barrier, and collectives over numpy data
/// (passed as bytes by the Python layer).
#[pyclass(module = "pto._native")]
#[derive(Debug)]
struct Comm {
    comm: pto_comm::Comm,
    co: Collectives,
}

fn reduce_op(op: &str) -> PyResult<ReduceOp> {
    Ok(match op {
        "sum" => ReduceOp::Sum,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "prod" => ReduceOp::Prod,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown op {other:?}: sum, max, min or prod"
            )))
        }
    })
}

fn typed<T: bytemuck::Pod>(data: &[u8]) -> PyResult<Vec<T>> {
    if data.len() % std::mem::size_of::<T>() != 0 {
        return Err(PyValueError::new_err(
            "data length is not a whole number of elements",
        ));
    }
    Ok(data
        .chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect())
}

#[pymethods]
impl Comm {
    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }

    /// Waits for every rank.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.comm.barrier()).map_err(comm_err)
    }

    /// Allreduce of `data` (raw bytes of `dtype` elements) with `op`; returns the result bytes.
    fn allreduce_bytes(
        &self,
        py: Python<'_>,
        data: Vec<u8>,
        dtype_name: &str,
        op: &str,
    ) -> PyResult<Vec<u8>> {
        let op = reduce_op(op)?;
        macro_rules! go {
            ($t:ty) => {{
                let mut v: Vec<$t> = typed(&data)?;
                py.detach(|| self.co.allreduce(&mut v, op))
                    .map_err(comm_err)?;
                Ok(bytemuck::cast_slice(&v).to_vec())
            }};
        }
        match dtype(dtype_name)? {
            DType::F32 => go!(f32),
            DType::F64 => go!(f64),
            DType::I32 => go!(i32),
            DType::I64 => go!(i64),
            d => Err(PyTypeError::new_err(format!(
                "allreduce supports float32, float64, int32 and int64, not {d}"
            ))),
        }
    }

    /// Allgather of `data` (raw bytes, the same length on every rank); returns every rank's
    /// bytes in rank order.
    fn allgather_bytes(&self, py: Python<'_>, data: Vec<u8>) -> PyResult<Vec<u8>> {
        let mut out = vec![0u8; data.len() * self.comm.size()];
        py.detach(|| self.co.allgather(&data, &mut out))
            .map_err(comm_err)?;
        Ok(out)
    }

    /// Broadcast of `data` (raw bytes) from `root`; returns root's bytes.
    fn broadcast_bytes(&self, py: Python<'_>, data: Vec<u8>, root: usize) -> PyResult<Vec<u8>> {
        let mut v = data;
        py.detach(|| self.co.broadcast(&mut v, root))
            .map_err(comm_err)?;
        Ok(v)
    }
}

/// Runs `f(comm)` on `n` ranks (threads of this process) and returns their results in rank
/// order. Collectives release the GIL while they wait. An exception on a rank is raised here,
/// naming the rank.
#[pyfunction]
fn run_ranks(py: Python<'_>, n: usize, f: Py<PyAny>) -> PyResult<Vec<Py<PyAny>>> {
    let results = py
        .detach(|| {
            pto_comm::local::run(n, |comm| {
                // Collective (a window barrier): set up before taking the GIL, which the
                // other ranks need to get here.
                let co = Collectives::new(&comm, 1 << 20).map_err(|e| e.to_string())?;
                Python::attach(|py| -> Result<Py<PyAny>, String> {
                    let c = Bound::new(py, Comm { comm, co }).map_err(|e| e.to_string())?;
                    f.call1(py, (c,)).map_err(|e| e.to_string())
                })
            })
        })
        .map_err(comm_err)?;
    results
        .into_iter()
        .enumerate()
        .map(|(r, res)| match res {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) | Err(e) => Err(PtoError::new_err(format!("rank {r}: {e}"))),
        })
        .collect()
}

/// The registered chip programs (besides every built-in kernel): `(name, about)`.
#[pyfunction]
fn programs() -> Vec<(&'static str, &'static str)> {
    pto_examples::programs::PROGRAMS
        .iter()
        .map(|p| (p.name, p.about))
        .collect()
}

/// The built-in kernels, each also a chip program of the same name.
#[pyfunction]
fn kernels() -> PyResult<Vec<String>> {
    Ok(pto_kernels::registry()
        .map_err(worker_err)?
        .iter()
        .map(|k| k.name().to_string())
        .collect())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PtoError", py.get_type::<PtoError>())?;
    m.add("WorkerError", py.get_type::<WorkerError>())?;
    m.add("CommError", py.get_type::<CommError>())?;
    m.add_class::<Worker>()?;
    m.add_class::<SharedBuffer>()?;
    m.add_class::<HostOrch>()?;
    m.add_class::<Comm>()?;
    m.add_function(wrap_pyfunction!(run_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(programs, m)?)?;
    m.add_function(wrap_pyfunction!(kernels, m)?)?;
    Ok(())
}
