//! The native module of the `pto` Python package (`pto._native`): the host [`Worker`], numpy
//! arrays over its shared memory, host orchestration from a Python function, sub-worker tasks
//! as Python callables, and collectives from host code. The Python layer (`python/pto`) adds
//! numpy conveniences; `_native.pyi` describes this module and is checked against it.
//!
//! Every argument is checked here before it reaches the Rust crates (see [`args`]); the
//! exception classes are the Python ones of `pto._errors` (so that they pickle); blocking waits
//! happen without the GIL and in slices, so that Ctrl-C raises `KeyboardInterrupt` at once.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pto_comm::{BufferSpec, Collectives, ReduceOp, WindowSpec};
use pto_core::{ArgMode, DType, KernelRegistry, Orch, OrchError, Scalar, TaskArgs, Tensor};
use pto_worker::{ChipCall, SubCall};
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};

mod args;
mod logging;

use args::{
    boolean, int_in, items, repr, seconds, string, tuple_text, type_name, usize_in, MAX_BYTES,
};

/// How long a blocking call waits without the GIL before it looks for signals (Ctrl-C).
const SIGNAL_SLICE: Duration = Duration::from_millis(20);

/// Receives from `rx` without the GIL, waiting at most `slice` (`None` waits until a message
/// or the last sender is gone).
fn recv_detached<T: Send>(
    py: Python<'_>,
    rx: &Mutex<mpsc::Receiver<T>>,
    slice: Option<Duration>,
) -> Result<T, RecvTimeoutError> {
    py.detach(|| {
        let rx = rx.lock().map_err(|_| RecvTimeoutError::Disconnected)?;
        match slice {
            Some(d) => rx.recv_timeout(d),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    })
}

/// Staging bytes of each rank's collectives in `run_ranks` with `n` ranks: 1 MiB, less with
/// many ranks (16 MiB in all, at least 64 KiB each); larger data goes through in pieces.
fn ranks_collectives(n: usize) -> usize {
    ((16 << 20) / n.max(1)).clamp(64 << 10, 1 << 20)
}

/// Most ranks `run_ranks` starts (threads of this process).
const MAX_LOCAL_RANKS: usize = 256;

// ---------------------------------------------------------------------------------------------
// Errors: the classes of `pto._errors`.

/// pto's exception classes, in [`Kind`] order.
static ERROR_TYPES: PyOnceLock<[Py<PyType>; 3]> = PyOnceLock::new();

#[derive(Clone, Copy, Debug)]
enum Kind {
    Pto = 0,
    Worker = 1,
    Comm = 2,
}

fn pto_err(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| match ERROR_TYPES.get(py) {
        Some(t) => PyErr::from_type(t[kind as usize].bind(py).clone(), msg),
        None => PyRuntimeError::new_err(msg),
    })
}

fn worker_err(e: impl std::fmt::Display) -> PyErr {
    pto_err(Kind::Worker, e.to_string())
}

fn comm_err(e: impl std::fmt::Display) -> PyErr {
    pto_err(Kind::Comm, e.to_string())
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

// ---------------------------------------------------------------------------------------------
// dtypes

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

/// The names `dtype` accepts, for messages.
fn dtype_names() -> String {
    DType::ALL
        .into_iter()
        .map(|d| numpy_name(d).map_or_else(|| d.to_string(), str::to_string))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A dtype from a numpy name (`"float32"`) or a pto name (`"f32"`); `what` names the argument
/// in the error.
fn dtype_named(name: &str, what: &str) -> PyResult<DType> {
    DType::from_name(name)
        .or_else(|| {
            DType::ALL
                .into_iter()
                .find(|&d| numpy_name(d) == Some(name))
        })
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}: unknown dtype {} (use one of {})",
                repr(name),
                dtype_names()
            ))
        })
}

/// [`dtype_named`] of a Python argument that must be a str.
fn dtype_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<DType> {
    dtype_named(&string(obj, what)?, what)
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

// ---------------------------------------------------------------------------------------------
// Shared buffers and tensors

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

static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn is_ndarray(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let t = NDARRAY.import(obj.py(), "numpy", "ndarray")?;
    obj.is_instance(t)
}

/// `arr` (a numpy array over a [`SharedBuffer`], or a view of one) as a pto tensor over the same
/// bytes. `what` names the argument in errors; `writes` refuses read-only arrays.
fn tensor_of(arr: &Bound<'_, PyAny>, what: &str, writes: bool) -> PyResult<Tensor> {
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

// ---------------------------------------------------------------------------------------------
// Host orchestration

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

/// `args` of a submission: `(mode, array)` pairs (from `pto.IN` and friends) and numbers.
/// `func` names the call in errors.
fn parse_args(args: Option<&Bound<'_, PyAny>>, func: &str) -> PyResult<Vec<Arg>> {
    let Some(args) = args.filter(|a| !a.is_none()) else {
        return Ok(Vec::new());
    };
    let list = items(args, &format!("{func}: args"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, a) in list.iter().enumerate() {
        let what = format!("{func}: args[{i}]");
        if let Ok(t) = a.cast::<PyTuple>() {
            if t.len() != 2 || !t.get_item(0)?.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err(format!(
                    "{what} must be pto.IN(array), pto.OUT(array), pto.INOUT(array), \
                     pto.NODEP(array) or a number, not a tuple of {} items",
                    t.len()
                )));
            }
            let mode: String = t.get_item(0)?.extract()?;
            let m = match mode.as_str() {
                "in" => ArgMode::In,
                "out" => ArgMode::OutputExisting,
                "inout" => ArgMode::InOut,
                "nodep" => ArgMode::NoDep,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "{what}: unknown argument mode {}: use pto.IN, pto.OUT, pto.INOUT \
                         or pto.NODEP",
                        repr(other)
                    )))
                }
            };
            let writes = matches!(m, ArgMode::OutputExisting | ArgMode::InOut);
            let label = format!("{what} ({})", mode.to_uppercase());
            out.push(Arg::Tensor(tensor_of(&t.get_item(1)?, &label, writes)?, m));
        } else if is_ndarray(a)? {
            return Err(PyTypeError::new_err(format!(
                "{what} is a bare array: wrap it as pto.IN(a), pto.OUT(a), pto.INOUT(a) or \
                 pto.NODEP(a) to say how the task uses it"
            )));
        } else if type_name(a) == "bool" || type_name(a) == "bool_" {
            return Err(PyTypeError::new_err(format!(
                "{what} is a bool: pass scalars as int or float"
            )));
        } else if a.hasattr("__index__")? {
            match a.extract::<i64>() {
                Ok(v) => out.push(Arg::I64(v)),
                Err(_) => {
                    return Err(PyValueError::new_err(format!(
                        "{what}: the int is outside the 64-bit range"
                    )))
                }
            }
        } else if let Ok(f) = a.extract::<f64>() {
            out.push(Arg::F64(f));
        } else {
            return Err(PyTypeError::new_err(format!(
                "{what} must be pto.IN(array), pto.OUT(array), pto.INOUT(array), \
                 pto.NODEP(array) or a number (int or float), not {}",
                type_name(a)
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

/// "the Worker has 1 chip", "the Worker has 4 chips".
fn chips_text(n: usize) -> String {
    format!("the Worker has {n} chip{}", if n == 1 { "" } else { "s" })
}

/// What a Worker can run, to check submissions when they are made.
#[derive(Debug, Default)]
struct Catalog {
    chips: usize,
    programs: BTreeSet<String>,
    subs: BTreeSet<String>,
    sub_workers: usize,
}

impl Catalog {
    fn chip(&self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
        usize_in(
            obj,
            &format!("{what} ({})", chips_text(self.chips)),
            0,
            self.chips - 1,
        )
    }

    fn program(&self, obj: &Bound<'_, PyAny>, func: &str) -> PyResult<String> {
        let name = string(obj, &format!("{func}: program"))?;
        if !self.programs.contains(&name) {
            return Err(PyValueError::new_err(format!(
                "{func}: unknown chip program {}: use a kernel of pto.kernels() or a \
                 program of pto.programs()",
                repr(&name)
            )));
        }
        Ok(name)
    }
}

/// The host orchestration's recorder: `orch_fn` submits through it, and the Worker runs the
/// submissions in order (dependencies come from the tensors, as always).
#[pyclass(module = "pto._native")]
#[derive(Debug)]
struct HostOrch {
    catalog: Arc<Catalog>,
    /// `None` once the run took the submissions.
    subs: Mutex<Option<Vec<Submission>>>,
}

impl HostOrch {
    fn new(catalog: Arc<Catalog>) -> HostOrch {
        HostOrch {
            catalog,
            subs: Mutex::new(Some(Vec::new())),
        }
    }

    fn push(&self, target: Target, program: String, args: Vec<Arg>) -> PyResult<()> {
        let mut g = self
            .subs
            .lock()
            .map_err(|_| pto_err(Kind::Pto, "orchestration recorder poisoned"))?;
        let subs = g.as_mut().ok_or_else(|| {
            pto_err(
                Kind::Worker,
                "this orchestration has already run: submit only from inside orch_fn",
            )
        })?;
        subs.push(Submission {
            target,
            program,
            args,
        });
        Ok(())
    }

    /// Ends recording: the submissions so far.
    fn finish(&self) -> PyResult<Vec<Submission>> {
        Ok(self
            .subs
            .lock()
            .map_err(|_| pto_err(Kind::Pto, "orchestration recorder poisoned"))?
            .take()
            .unwrap_or_default())
    }
}

#[pymethods]
impl HostOrch {
    /// Runs chip program `program` (a built-in kernel's name, or a registered program) on chip
    /// `chip` with `args`.
    #[pyo3(signature = (chip, program, args=None))]
    fn submit_chip(
        &self,
        chip: &Bound<'_, PyAny>,
        program: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let chip = self.catalog.chip(chip, "submit_chip: chip")?;
        let program = self.catalog.program(program, "submit_chip")?;
        let args = parse_args(args, "submit_chip")?;
        self.push(Target::Chip(chip), program, args)
    }

    /// Starts `program` on every chip of `chips` at once (for programs that communicate).
    #[pyo3(signature = (chips, program, args=None))]
    fn submit_group(
        &self,
        chips: &Bound<'_, PyAny>,
        program: &Bound<'_, PyAny>,
        args: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let list = items(chips, "submit_group: chips")?;
        if list.is_empty() {
            return Err(PyValueError::new_err(
                "submit_group: chips must list at least one chip",
            ));
        }
        let mut group = Vec::with_capacity(list.len());
        for (i, c) in list.iter().enumerate() {
            let c = self.catalog.chip(c, &format!("submit_group: chips[{i}]"))?;
            if group.contains(&c) {
                return Err(PyValueError::new_err(format!(
                    "submit_group: chips lists chip {c} twice"
                )));
            }
            group.push(c);
        }
        let program = self.catalog.program(program, "submit_group")?;
        let args = parse_args(args, "submit_group")?;
        self.push(Target::Group(group), program, args)
    }

    /// Runs the sub-worker callable `name` on a sub-worker process with `args`.
    #[pyo3(signature = (name, args=None))]
    fn submit_sub(&self, name: &Bound<'_, PyAny>, args: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let name = string(name, "submit_sub: name")?;
        if !self.catalog.subs.contains(&name) {
            let known: Vec<&str> = self.catalog.subs.iter().map(String::as_str).collect();
            return Err(PyValueError::new_err(format!(
                "submit_sub: no sub-worker callable {} (the Worker's subs: {})",
                repr(&name),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        if self.catalog.sub_workers == 0 {
            return Err(PyValueError::new_err(format!(
                "submit_sub: {} needs a sub-worker process, and the Worker has none: \
                 create it with sub_workers=1 or more",
                repr(&name)
            )));
        }
        let args = parse_args(args, "submit_sub")?;
        self.push(Target::Sub(name.clone()), name, args)
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

// ---------------------------------------------------------------------------------------------
// The Worker

/// Many chips on this host, one process each, driven from Python. Usable from any thread:
/// runs go to one run thread, one after the other.
#[pyclass(module = "pto._native")]
struct Worker {
    inner: Option<Arc<pto_worker::Worker>>,
    /// Started with the first run.
    runner: std::sync::OnceLock<Runner>,
    buffers: Vec<BufferSpec>,
    catalog: Arc<Catalog>,
    /// The process that created it: a forked child (`os.fork`, multiprocessing) must neither
    /// run it nor close it, which would end the parent's children and remove its memory.
    pid: u32,
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

/// Every built-in kernel (pto-kernels) as a single-kernel chip program, and the registered
/// programs; their names.
fn builtin_programs(
    mut b: pto_worker::WorkerBuilder,
) -> PyResult<(pto_worker::WorkerBuilder, BTreeSet<String>)> {
    let reg: KernelRegistry = pto_kernels::registry().map_err(worker_err)?;
    let names: Vec<String> = reg.iter().map(|k| k.name().to_string()).collect();
    let mut all = BTreeSet::new();
    for n in names {
        b = b.program(&n, reg.clone(), kernel_program(n.clone()));
        all.insert(n);
    }
    for p in pto_examples::programs::PROGRAMS {
        b = b.program(p.name, (p.kernels)().map_err(worker_err)?, p.orch);
        all.insert(p.name.to_string());
    }
    Ok((b, all))
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

/// What the run thread sends back.
type RunResult =
    std::thread::Result<Result<pto_worker::WorkerReport, Box<pto_worker::WorkerError>>>;

/// A job for the run thread.
type Job = Box<dyn FnOnce() + Send>;

/// The thread that runs a Worker's runs, so that the thread that called `run` can wait for
/// them in slices and look for signals in between. It lives as long as the Worker: handing a
/// run to a waiting thread costs microseconds, starting a thread per run tens of them.
#[derive(Debug)]
struct Runner {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runner {
    fn start() -> std::io::Result<Runner> {
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("pto-run".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })?;
        Ok(Runner {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs the submissions on `w` on the run thread, while this thread waits without the GIL in
/// short slices and checks for signals between them: Ctrl-C (or any signal handler that
/// raises) aborts the Worker, which fails the run at once, and its exception is raised.
fn run_interruptibly(
    py: Python<'_>,
    runner: &Runner,
    w: &Arc<pto_worker::Worker>,
    subs: Vec<Submission>,
    trace: bool,
) -> PyResult<pto_worker::WorkerReport> {
    let interrupted = |e: PyErr| {
        let why = format!(
            "interrupted ({})",
            Python::attach(|py| e.get_type(py).name().map(|n| n.to_string()))
                .unwrap_or_else(|_| "a signal".into())
        );
        tracing::info!(why = why.as_str(), "aborting the Worker's run");
        w.abort(&why);
        e
    };
    let (tx, rx) = mpsc::sync_channel::<RunResult>(1);
    let rx = Mutex::new(rx);
    let worker = w.clone();
    let job: Job = Box::new(move || {
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            worker
                .run_with(
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
                    trace,
                )
                .map_err(Box::new)
        }));
        drop(worker);
        let _ = tx.send(r);
    });
    if !runner.submit(job) {
        return Err(worker_err("the Worker's run thread is gone"));
    }
    loop {
        match recv_detached(py, &rx, Some(SIGNAL_SLICE)) {
            Ok(r) => {
                // A signal that came with the end of the run (children interrupted by the same
                // Ctrl-C fail their tasks) wins over the run's own result.
                py.check_signals().map_err(interrupted)?;
                return match r {
                    Ok(r) => r.map_err(worker_err),
                    Err(p) => Err(pto_err(
                        Kind::Worker,
                        format!("the run panicked: {}", panic_text(&*p)),
                    )),
                };
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    let e = interrupted(e);
                    // The abort fails the run within milliseconds; wait for it.
                    let _ = recv_detached(py, &rx, None);
                    return Err(e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(worker_err("the run thread ended without a result"))
            }
        }
    }
}

#[pymethods]
impl Worker {
    /// Starts the Worker: forks one process per chip and per sub-worker (call it before this
    /// process starts threads).
    #[new]
    #[pyo3(signature = (chips=1, cores=(1, 2), sub_workers=0, buffers=None, collectives=None, comm=true, subs=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = chips_arg)] chips: usize,
        #[pyo3(from_py_with = cores_arg)] cores: (u32, u32),
        #[pyo3(from_py_with = sub_workers_arg)] sub_workers: usize,
        buffers: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = collectives_arg)] collectives: Option<usize>,
        #[pyo3(from_py_with = comm_arg)] comm: bool,
        subs: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = timeout_arg)] timeout: Option<Duration>,
    ) -> PyResult<Worker> {
        let specs = buffer_specs(buffers)?;
        let callables = sub_callables(subs)?;
        let mut b = pto_worker::Worker::builder()
            .chips(chips)
            .cores(cores.0, cores.1)
            .sub_workers(sub_workers);
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
        let (b, programs) = builtin_programs(b)?;
        // The GIL stays held across the fork: a sub-worker child continues on this thread,
        // which then holds the GIL it needs to call its Python callables.
        let w = b.init().map_err(worker_err)?;
        Ok(Worker {
            inner: Some(Arc::new(w)),
            runner: std::sync::OnceLock::new(),
            pid: std::process::id(),
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
            let n = usize_in(v, &format!("Worker.buffer: shape[{i}]"), 1, max)?;
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
        }
        let rec = Bound::new(py, HostOrch::new(self.catalog.clone()))?;
        let none = py.None().into_bound(py);
        let called = orch_fn.call1((rec.clone(), args.unwrap_or(&none)));
        let subs = rec.borrow().finish()?;
        called?;
        let report = run_interruptibly(py, self.runner()?, w, subs, trace.is_some())?;
        if let Some(path) = &trace {
            let doc =
                serde_json::json!({ "traceEvents": report.trace_events, "displayTimeUnit": "ns" });
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
    fn close(&mut self, py: Python<'_>) {
        self.forget_in_child();
        self.runner.take();
        if let Some(w) = self.inner.take() {
            // The only reference, now that the run thread is gone.
            py.detach(|| match Arc::try_unwrap(w) {
                Ok(w) => w.close(),
                Err(w) => drop(w),
            });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// run_ranks and its Comm

/// What the ranks of one `run_ranks` share: whether it still runs, and the order of failures.
#[derive(Debug)]
struct Ranks {
    /// [`RUNNING`], [`INTERRUPTED`] or [`ENDED`].
    state: AtomicU8,
    /// Order of failures (the first to fail is the one raised).
    seq: AtomicUsize,
}

const RUNNING: u8 = 0;
const INTERRUPTED: u8 = 1;
const ENDED: u8 = 2;

/// One rank of `run_ranks`: its rank and size, a barrier, and collectives over numpy data
/// (passed as bytes by the Python layer).
#[pyclass(module = "pto._native")]
#[derive(Debug)]
struct Comm {
    comm: pto_comm::Comm,
    co: Collectives,
    ranks: Arc<Ranks>,
}

fn reduce_op(op: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    let op = string(op, "op")?;
    Ok(match op.as_str() {
        "sum" => ReduceOp::Sum,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "prod" => ReduceOp::Prod,
        other => {
            return Err(PyValueError::new_err(format!(
                "op: unknown reduction {}: use 'sum', 'max', 'min' or 'prod'",
                repr(other)
            )))
        }
    })
}

fn typed<T: bytemuck::Pod>(data: &[u8]) -> PyResult<Vec<T>> {
    let chunks = data.chunks_exact(std::mem::size_of::<T>());
    if !chunks.remainder().is_empty() {
        return Err(PyValueError::new_err(
            "data length is not a whole number of elements",
        ));
    }
    Ok(chunks.map(bytemuck::pod_read_unaligned).collect())
}

/// Codes of what each rank passes to a collective, compared across ranks before it runs.
fn dtype_code(d: DType) -> u64 {
    DType::ALL
        .iter()
        .position(|&x| x == d)
        .map_or(0, |p| p as u64 + 1)
}

impl Comm {
    /// Refuses calls once `run_ranks` has returned or was interrupted.
    fn usable(&self) -> PyResult<()> {
        match self.ranks.state.load(Ordering::Acquire) {
            RUNNING => Ok(()),
            INTERRUPTED => Err(PyKeyboardInterrupt::new_err("run_ranks was interrupted")),
            _ => Err(pto_err(
                Kind::Comm,
                "this Comm's run_ranks has returned: use it only inside the rank function",
            )),
        }
    }

    /// Every rank passes `desc` (what it gives to collective `what`); they must agree, or
    /// every rank gets the same error naming the ranks and what each passed.
    fn agree(
        &self,
        py: Python<'_>,
        what: &str,
        desc: [u64; 3],
        show: fn(&[u64]) -> String,
    ) -> PyResult<()> {
        let n = self.comm.size();
        let mut all = vec![0u64; 3 * n];
        py.detach(|| self.co.allgather(&desc, &mut all))
            .map_err(comm_err)?;
        if all.chunks_exact(3).all(|c| c == desc) {
            return Ok(());
        }
        let each: Vec<String> = all
            .chunks_exact(3)
            .enumerate()
            .map(|(r, c)| format!("rank {r}: {}", show(c)))
            .collect();
        Err(pto_err(
            Kind::Comm,
            format!(
                "{what}: the ranks passed different arguments ({}); every rank must pass the same",
                each.join("; ")
            ),
        ))
    }
}

fn show_reduce(c: &[u64]) -> String {
    let d = DType::ALL
        .get((c[1] as usize).wrapping_sub(1))
        .map_or("?".to_string(), |d| {
            numpy_name(*d).unwrap_or("?").to_string()
        });
    let op = ["sum", "max", "min", "prod"]
        .get(c[2] as usize)
        .unwrap_or(&"?");
    format!("{} bytes of {d}, op {op}", c[0])
}

fn show_bytes(c: &[u64]) -> String {
    format!("{} bytes", c[0])
}

fn show_broadcast(c: &[u64]) -> String {
    format!("{} bytes from root {}", c[0], c[1])
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
        self.usable()?;
        py.detach(|| self.comm.barrier()).map_err(comm_err)
    }

    /// Allreduce of `data` (raw bytes of `dtype` elements) with `op`; returns the result bytes.
    fn allreduce_bytes(
        &self,
        py: Python<'_>,
        data: Vec<u8>,
        dtype_name: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u8>> {
        self.usable()?;
        let op = reduce_op(op)?;
        let name = string(dtype_name, "allreduce: dtype")?;
        let d = dtype_named(&name, "allreduce: dtype")
            .ok()
            .filter(|d| matches!(d, DType::F32 | DType::F64 | DType::I32 | DType::I64))
            .ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "allreduce supports float32, float64, int32 and int64, not {name}"
                ))
            })?;
        if !data.chunks_exact(d.size()).remainder().is_empty() {
            return Err(PyValueError::new_err(
                "allreduce: data length is not a whole number of elements",
            ));
        }
        let op_code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
            _ => 3,
        };
        self.agree(
            py,
            "allreduce",
            [data.len() as u64, dtype_code(d), op_code],
            show_reduce,
        )?;
        macro_rules! go {
            ($t:ty) => {{
                let mut v: Vec<$t> = typed(&data)?;
                py.detach(|| self.co.allreduce(&mut v, op))
                    .map_err(comm_err)?;
                Ok(bytemuck::cast_slice(&v).to_vec())
            }};
        }
        match d {
            DType::F32 => go!(f32),
            DType::F64 => go!(f64),
            DType::I32 => go!(i32),
            _ => go!(i64),
        }
    }

    /// Allgather of `data` (raw bytes, the same length on every rank); returns every rank's
    /// bytes in rank order.
    fn allgather_bytes(&self, py: Python<'_>, data: Vec<u8>) -> PyResult<Vec<u8>> {
        self.usable()?;
        self.agree(py, "allgather", [data.len() as u64, 0, 0], show_bytes)?;
        let mut out = vec![0u8; data.len() * self.comm.size()];
        py.detach(|| self.co.allgather(&data, &mut out))
            .map_err(comm_err)?;
        Ok(out)
    }

    /// Broadcast of `data` (raw bytes) from `root`; returns root's bytes.
    fn broadcast_bytes(
        &self,
        py: Python<'_>,
        data: Vec<u8>,
        root: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u8>> {
        self.usable()?;
        let n = self.comm.size();
        let root = usize_in(root, &format!("broadcast: root (a rank of {n})"), 0, n - 1)?;
        self.agree(
            py,
            "broadcast",
            [data.len() as u64, root as u64, 0],
            show_broadcast,
        )?;
        let mut v = data;
        py.detach(|| self.co.broadcast(&mut v, root))
            .map_err(comm_err)?;
        Ok(v)
    }
}

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
fn run_ranks(
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

// ---------------------------------------------------------------------------------------------
// Listings and the module

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
    logging::init(py);
    let errors = py.import("pto._errors")?;
    let class = |name: &str| -> PyResult<Py<PyType>> {
        Ok(errors.getattr(name)?.cast_into::<PyType>()?.unbind())
    };
    let types = ERROR_TYPES.get_or_try_init(py, || -> PyResult<_> {
        Ok([
            class("PtoError")?,
            class("WorkerError")?,
            class("CommError")?,
        ])
    })?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PtoError", types[Kind::Pto as usize].bind(py))?;
    m.add("WorkerError", types[Kind::Worker as usize].bind(py))?;
    m.add("CommError", types[Kind::Comm as usize].bind(py))?;
    m.add_class::<Worker>()?;
    m.add_class::<SharedBuffer>()?;
    m.add_class::<HostOrch>()?;
    m.add_class::<Comm>()?;
    m.add_function(wrap_pyfunction!(run_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(programs, m)?)?;
    m.add_function(wrap_pyfunction!(kernels, m)?)?;
    Ok(())
}
