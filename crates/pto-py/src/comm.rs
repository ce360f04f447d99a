//! The `Comm` of one `run_ranks` rank: its rank and size, a barrier, and collectives over
//! numpy data (as bytes), refused once `run_ranks` has returned; and what the ranks share.

use std::sync::Arc;

use numpy::{
    PyArrayDyn, PyArrayMethods, PyReadonlyArray1, PyReadwriteArray1, PyUntypedArrayMethods,
};
use pto_comm::{BufferSpec, Collectives, ReduceOp, WindowSpec};
use pto_core::DType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::args::{repr, string, usize_in};
use crate::dtypes::{dtype_named, numpy_name};
use crate::errors::{comm_err, pto_err, Kind};
use crate::ranks_state::Ranks;
use crate::window::Window;

/// One rank of `run_ranks`: its rank and size, a barrier, and collectives over numpy data
/// (passed as bytes by the Python layer).
#[pyclass(module = "pto._native")]
#[derive(Debug)]
pub(crate) struct Comm {
    pub(crate) comm: pto_comm::Comm,
    pub(crate) co: Collectives,
    pub(crate) ranks: Arc<Ranks>,
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
        self.ranks.usable()
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

    /// Raises the world's abort with `message`: every peer's waits fail at once, naming this
    /// rank (a forked rank calls it when its function raised).
    fn abort(&self, message: &str) {
        self.comm.abort(message);
    }

    /// Says this rank is done: peers still waiting for it fail at once naming it as exited (a
    /// forked rank calls it before `os._exit`, which runs no destructor).
    fn leave(&self) {
        self.comm.leave();
    }

    /// Waits for every rank.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.usable()?;
        py.detach(|| self.comm.barrier()).map_err(comm_err)
    }

    /// Allreduce of numpy array `a` in place, without a copy, with `op`, when `a` is a
    /// C-contiguous, writable float16, float32, float64, int32 or int64 array: returns whether
    /// it was (the Python layer handles, or refuses by name, every other argument). The only
    /// checks on this path are numpy's flags and dtype, read here: reading them from Python
    /// costs more than the allreduce of a few elements.
    fn allreduce_array(
        &self,
        py: Python<'_>,
        a: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.usable()?;
        let op = reduce_op(op)?;
        macro_rules! go {
            ($t:ty) => {
                if let Ok(arr) = a.cast::<PyArrayDyn<$t>>() {
                    if !arr.is_c_contiguous() {
                        return Ok(false);
                    }
                    let Ok(mut rw) = arr.try_readwrite() else {
                        return Ok(false);
                    };
                    let Ok(s) = rw.as_slice_mut() else {
                        return Ok(false);
                    };
                    // The ranks' lengths, dtypes and ops are compared inside the allreduce's
                    // own exchange (an error naming a peer, on every rank).
                    return py
                        .detach(|| self.co.allreduce(s, op))
                        .map(|()| true)
                        .map_err(comm_err);
                }
            };
        }
        go!(f32);
        go!(f64);
        go!(i32);
        go!(i64);
        go!(half::f16);
        Ok(false)
    }

    /// Allgather of `mine` (bytes, the same length on every rank) into `out` (bytes, size ×
    /// that length), without copies through Python objects.
    fn allgather_into(
        &self,
        py: Python<'_>,
        mine: PyReadonlyArray1<'_, u8>,
        mut out: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        self.usable()?;
        let m = mine
            .as_slice()
            .map_err(|_| PyValueError::new_err("allgather: the array must be contiguous"))?;
        self.agree(py, "allgather", [m.len() as u64, 0, 0], show_bytes)?;
        let o = out
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("allgather: out must be contiguous"))?;
        if o.len() != m.len() * self.comm.size() {
            return Err(PyValueError::new_err(format!(
                "allgather: out has {} bytes, not {} x {}",
                o.len(),
                self.comm.size(),
                m.len()
            )));
        }
        py.detach(|| self.co.allgather(m, o)).map_err(comm_err)
    }

    /// Broadcast of `buf` (bytes) from `root`, in place.
    fn broadcast_into(
        &self,
        py: Python<'_>,
        mut buf: PyReadwriteArray1<'_, u8>,
        root: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.usable()?;
        let n = self.comm.size();
        let root = usize_in(root, &format!("broadcast: root (a rank of {n})"), 0, n - 1)?;
        let b = buf
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("broadcast: the array must be contiguous"))?;
        self.agree(
            py,
            "broadcast",
            [b.len() as u64, root as u64, 0],
            show_broadcast,
        )?;
        py.detach(|| self.co.broadcast(b, root)).map_err(comm_err)
    }

    /// All-to-all of `send` (bytes, size × k) into `recv` (bytes, the same length).
    fn all_to_all_into(
        &self,
        py: Python<'_>,
        send: PyReadonlyArray1<'_, u8>,
        mut recv: PyReadwriteArray1<'_, u8>,
    ) -> PyResult<()> {
        self.usable()?;
        let s = send
            .as_slice()
            .map_err(|_| PyValueError::new_err("all_to_all: the array must be contiguous"))?;
        self.agree(py, "all_to_all", [s.len() as u64, 0, 0], show_bytes)?;
        let r = recv
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("all_to_all: out must be contiguous"))?;
        py.detach(|| self.co.all_to_all(s, r)).map_err(comm_err)
    }

    /// Allreduce in place of `buf`, the raw bytes (C-contiguous, writable) of elements of
    /// dtype `dtype_name` (any reducible dtype: `bf16` arrives this way, as numpy has no
    /// bfloat16 of its own), with `op`.
    fn allreduce_raw(
        &self,
        py: Python<'_>,
        mut buf: PyReadwriteArray1<'_, u8>,
        dtype_name: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.usable()?;
        let op = reduce_op(op)?;
        let d = reducible(dtype_name, "allreduce")?;
        let b = buf
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("allreduce: the array must be contiguous"))?;
        macro_rules! go {
            ($t:ty) => {{
                let s: &mut [$t] = elems_mut(b, "allreduce")?;
                py.detach(|| self.co.allreduce(s, op)).map_err(comm_err)
            }};
        }
        by_dtype!(d, go)
    }

    /// Reduce-scatter of `send` (raw bytes of `dtype_name` elements, size × k of them) with
    /// `op`: this rank's block of k reduced elements lands in `recv` (k elements' bytes).
    fn reduce_scatter_into(
        &self,
        py: Python<'_>,
        send: PyReadonlyArray1<'_, u8>,
        mut recv: PyReadwriteArray1<'_, u8>,
        dtype_name: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.usable()?;
        let op = reduce_op(op)?;
        let d = reducible(dtype_name, "reduce_scatter")?;
        let n = self.comm.size();
        let s = send
            .as_slice()
            .map_err(|_| PyValueError::new_err("reduce_scatter: the array must be contiguous"))?;
        self.agree(
            py,
            "reduce_scatter",
            [s.len() as u64, dtype_code(d), op_code(op)],
            show_reduce,
        )?;
        let r = recv
            .as_slice_mut()
            .map_err(|_| PyValueError::new_err("reduce_scatter: out must be contiguous"))?;
        if s.len() % (n * d.size()) != 0 || r.len() * n != s.len() {
            return Err(PyValueError::new_err(format!(
                "reduce_scatter: {} bytes in and {} out do not split into {n} equal blocks of {d} elements",
                s.len(),
                r.len()
            )));
        }
        macro_rules! go {
            ($t:ty) => {{
                let input: &[$t] = elems(s, "reduce_scatter")?;
                let out: &mut [$t] = elems_mut(r, "reduce_scatter")?;
                let share = py
                    .detach(|| self.co.reduce_scatter(input, op))
                    .map_err(comm_err)?;
                out.copy_from_slice(&share);
                Ok(())
            }};
        }
        by_dtype!(d, go)
    }

    /// Allocates a window on every rank (collective): buffers `(name, dtype, count)` in order.
    fn window(&self, py: Python<'_>, buffers: Vec<(String, String, usize)>) -> PyResult<Window> {
        self.usable()?;
        if buffers.is_empty() {
            return Err(PyValueError::new_err("window: give at least one buffer"));
        }
        let mut specs = Vec::with_capacity(buffers.len());
        for (name, dtype, count) in &buffers {
            let d = dtype_named(dtype, &format!("window: buffer {}", repr(name)))?;
            specs.push(BufferSpec::new(name, d, *count));
        }
        let win = py
            .detach(|| self.comm.alloc_window(&WindowSpec::for_buffers(specs)))
            .map_err(comm_err)?;
        Ok(Window::new(win, self.ranks.clone()))
    }
}

/// Runs `$go!(T)` for the element type `T` of reducible dtype `$d`.
macro_rules! by_dtype {
    ($d:expr, $go:ident) => {
        match $d {
            DType::F32 => $go!(f32),
            DType::F64 => $go!(f64),
            DType::I32 => $go!(i32),
            DType::I64 => $go!(i64),
            DType::F16 => $go!(half::f16),
            _ => $go!(half::bf16),
        }
    };
}
use by_dtype;

/// A dtype collectives can reduce, from its numpy or pto name.
fn reducible(name: &Bound<'_, PyAny>, what: &str) -> PyResult<DType> {
    let name = string(name, &format!("{what}: dtype"))?;
    let name = if name == "bfloat16" {
        "bf16".to_string()
    } else {
        name
    };
    dtype_named(&name, &format!("{what}: dtype"))
        .ok()
        .filter(|d| {
            matches!(
                d,
                DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::F16 | DType::Bf16
            )
        })
        .ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{what} supports float16, bfloat16, float32, float64, int32 and int64, not {name}"
            ))
        })
}

fn op_code(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
        ReduceOp::Min => 2,
        ReduceOp::Prod => 3,
    }
}

/// Raw bytes as elements of `T` (whole and aligned, as numpy's own arrays are).
fn elems<'a, T: bytemuck::Pod>(b: &'a [u8], what: &str) -> PyResult<&'a [T]> {
    bytemuck::try_cast_slice(b).map_err(|e| {
        PyValueError::new_err(format!(
            "{what}: the array's bytes are not whole, aligned elements ({e:?})"
        ))
    })
}

fn elems_mut<'a, T: bytemuck::Pod>(b: &'a mut [u8], what: &str) -> PyResult<&'a mut [T]> {
    bytemuck::try_cast_slice_mut(b).map_err(|e| {
        PyValueError::new_err(format!(
            "{what}: the array's bytes are not whole, aligned elements ({e:?})"
        ))
    })
}
