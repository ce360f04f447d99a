//! Checks of Python arguments: every bad value is a `TypeError` (wrong type) or `ValueError`
//! (out of range) naming the argument and what it may be, before any of it reaches Rust code
//! that could misbehave on it (an overflowing size, a panicking conversion, a hang).

use std::time::Duration;

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyString, PyTuple};

/// Largest `Worker.buffer` pto accepts, in bytes: far above any `/dev/shm` (which refuses
/// what it cannot hold, as a `WorkerError`), far below where size arithmetic could overflow.
/// (Window buffers and collectives staging are bounded by `pto_comm::MAX_WINDOW`.)
pub(crate) const MAX_BYTES: usize = 1 << 48;

/// Longest timeout, in seconds (about 31 years): effectively no deadline.
pub(crate) const MAX_TIMEOUT_S: f64 = 1e9;

/// `s` as Python's `repr` shows it (`'name'`), for messages.
pub(crate) fn repr(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A shape or list of numbers as Python shows a tuple: `(2, 3)`, `(4,)`.
pub(crate) fn tuple_text<T: std::fmt::Display>(v: &[T]) -> String {
    let parts: Vec<String> = v.iter().map(ToString::to_string).collect();
    match parts.len() {
        1 => format!("({},)", parts[0]),
        _ => format!("({})", parts.join(", ")),
    }
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

fn is_bool(obj: &Bound<'_, PyAny>) -> bool {
    // Python's bool is an int subclass; numpy's bool is not, but is still no count.
    obj.is_instance_of::<PyBool>() || matches!(type_name(obj).as_str(), "bool_" | "bool")
}

/// An integer argument from `lo` to `hi` (numpy integers too; bools refused).
pub(crate) fn int_in(obj: &Bound<'_, PyAny>, name: &str, lo: i64, hi: i64) -> PyResult<i64> {
    let want = || format!("{name} must be an int from {lo} to {hi}");
    if is_bool(obj) {
        return Err(PyTypeError::new_err(format!("{}, not a bool", want())));
    }
    match obj.extract::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        Ok(v) => Err(PyValueError::new_err(format!("{}, got {v}", want()))),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(PyValueError::new_err(
            format!("{}, got an int beyond the 64-bit range", want()),
        )),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{}, not {}",
            want(),
            type_name(obj)
        ))),
    }
}

/// [`int_in`] for sizes and indices.
pub(crate) fn usize_in(
    obj: &Bound<'_, PyAny>,
    name: &str,
    lo: usize,
    hi: usize,
) -> PyResult<usize> {
    let clamp = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    int_in(obj, name, clamp(lo), clamp(hi)).map(|v| usize::try_from(v).unwrap_or(usize::MAX))
}

/// A string argument.
pub(crate) fn string(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    if !obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a str, not {}",
            type_name(obj)
        )));
    }
    obj.extract()
}

/// A bool argument (Python's or numpy's).
pub(crate) fn boolean(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    if !is_bool(obj) {
        return Err(PyTypeError::new_err(format!(
            "{name} must be True or False, not {}",
            type_name(obj)
        )));
    }
    obj.is_truthy()
}

/// The items of a list or tuple argument (other iterables, strings included, are refused: a
/// string or an array passed by mistake would otherwise be taken apart).
pub(crate) fn items<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(l.iter().collect());
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    Err(PyTypeError::new_err(format!(
        "{name} must be a list or a tuple, not {}",
        type_name(obj)
    )))
}

/// A duration in seconds: a positive, finite number up to [`MAX_TIMEOUT_S`].
pub(crate) fn seconds(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Duration> {
    let want =
        || format!("{name} must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:e}");
    if is_bool(obj) {
        return Err(PyTypeError::new_err(format!("{}, not a bool", want())));
    }
    let t: f64 = match obj.extract::<f64>() {
        Ok(t) => t,
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            return Err(PyValueError::new_err(format!("{}, got a huge int", want())))
        }
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "{}, not {}",
                want(),
                type_name(obj)
            )))
        }
    };
    if !(t > 0.0 && t <= MAX_TIMEOUT_S) {
        let shown = obj
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| t.to_string());
        return Err(PyValueError::new_err(format!("{}, got {shown}", want())));
    }
    Duration::try_from_secs_f64(t)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{}, got {t:e} (rounds to 0)", want())))
}
