//! dtypes between Python and pto: numpy's names, pto's names, and numpy's array-interface type
//! strings.

use pto_core::DType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::args::{repr, string};

/// numpy's dtype names for pto's dtypes (bf16 has none).
pub(crate) fn numpy_name(d: DType) -> Option<&'static str> {
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
pub(crate) fn dtype_named(name: &str, what: &str) -> PyResult<DType> {
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
pub(crate) fn dtype_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<DType> {
    dtype_named(&string(obj, what)?, what)
}

/// numpy's array-interface type string of a dtype.
pub(crate) fn typestr(d: DType) -> PyResult<String> {
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
