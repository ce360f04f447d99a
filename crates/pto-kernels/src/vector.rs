//! Elementwise and reduction kernels for AIV (vector) cores.

use std::borrow::Cow;

use pto_core::{DType, Element, KernelCtx, KernelError, TensorMut, TensorRef};

use crate::num::Num;

/// Calls `$f::<T>($ctx)` with `T` the Rust type of `$dtype`, for every arithmetic dtype.
macro_rules! dispatch_num {
    ($ctx:expr, $dtype:expr, $f:ident) => {
        match $dtype {
            DType::F32 => $f::<f32>($ctx),
            DType::F64 => $f::<f64>($ctx),
            DType::F16 => $f::<half::f16>($ctx),
            DType::Bf16 => $f::<half::bf16>($ctx),
            DType::I8 => $f::<i8>($ctx),
            DType::I16 => $f::<i16>($ctx),
            DType::I32 => $f::<i32>($ctx),
            DType::I64 => $f::<i64>($ctx),
            DType::U8 => $f::<u8>($ctx),
            DType::U16 => $f::<u16>($ctx),
            DType::U32 => $f::<u32>($ctx),
            DType::U64 => $f::<u64>($ctx),
            other => Err(unsupported($ctx, other)),
        }
    };
}

/// Calls `$f::<T>($ctx)` with `T` the Rust type of `$dtype`, for every dtype.
macro_rules! dispatch_any {
    ($ctx:expr, $dtype:expr, $f:ident) => {
        match $dtype {
            DType::Bool => $f::<pto_core::Bool>($ctx),
            other => dispatch_num!($ctx, other, $f),
        }
    };
}

pub(crate) fn unsupported(ctx: &KernelCtx<'_>, dtype: DType) -> KernelError {
    KernelError::msg(format!("{}: unsupported dtype {dtype}", ctx.kernel_name()))
}

/// Errors unless tensor arguments `indices` all exist and have the dtype of the first.
pub(crate) fn common_dtype(ctx: &KernelCtx<'_>, indices: &[usize]) -> Result<DType, KernelError> {
    let mut dtype = None;
    for &i in indices {
        let d = ctx.tensor(i)?.dtype();
        match dtype {
            None => dtype = Some((i, d)),
            Some((first, fd)) if fd != d => {
                return Err(KernelError::msg(format!(
                    "{}: dtype mismatch: tensor {first} is {fd}, tensor {i} is {d}",
                    ctx.kernel_name()
                )))
            }
            Some(_) => {}
        }
    }
    dtype
        .map(|(_, d)| d)
        .ok_or_else(|| KernelError::msg(format!("{}: no tensor arguments", ctx.kernel_name())))
}

/// Errors unless tensor arguments `indices` all have the same shape.
fn same_shape(ctx: &KernelCtx<'_>, indices: &[usize]) -> Result<(), KernelError> {
    let Some((&first, rest)) = indices.split_first() else {
        return Ok(());
    };
    let shape = ctx.tensor(first)?.shape();
    for &i in rest {
        let s = ctx.tensor(i)?.shape();
        if s != shape {
            return Err(KernelError::msg(format!(
                "{}: shape mismatch: tensor {first} has shape {shape:?}, tensor {i} has shape {s:?}",
                ctx.kernel_name()
            )));
        }
    }
    Ok(())
}

/// The view's elements in logical order, borrowed when it is contiguous.
pub(crate) fn elems<'v, T: Element>(v: &'v TensorRef<'_, T>) -> Cow<'v, [T]> {
    match v.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(v.to_vec()),
    }
}

/// Writes `f(i)` for every element `i` (in logical order) of `out`.
fn write_with<T: Element>(out: &mut TensorMut<'_, T>, mut f: impl FnMut(usize) -> T) {
    if let Some(s) = out.as_mut_slice() {
        for (i, o) in s.iter_mut().enumerate() {
            *o = f(i);
        }
    } else {
        let mut i = 0;
        out.for_each_mut(|o| {
            *o = f(i);
            i += 1;
        });
    }
}

/// `t2 = op(t0, t1)` elementwise over this block's chunk.
fn binary<T: Num>(ctx: &KernelCtx<'_>, op: impl Fn(T, T) -> T) -> Result<(), KernelError> {
    same_shape(ctx, &[0, 1, 2])?;
    let a = ctx.input_chunk::<T>(0)?;
    let b = ctx.input_chunk::<T>(1)?;
    let mut c = ctx.output_chunk::<T>(2)?;
    let (a, b) = (elems(&a), elems(&b));
    if a.len() != c.len() || b.len() != c.len() {
        return Err(KernelError::msg(format!(
            "{}: chunk lengths differ: {}, {} and {}",
            ctx.kernel_name(),
            a.len(),
            b.len(),
            c.len()
        )));
    }
    write_with(&mut c, |i| op(a[i], b[i]));
    Ok(())
}

/// `t1 = op(t0)` elementwise over this block's chunk.
fn unary<T: Element>(ctx: &KernelCtx<'_>, op: impl Fn(T) -> T) -> Result<(), KernelError> {
    same_shape(ctx, &[0, 1])?;
    let a = ctx.input_chunk::<T>(0)?;
    let mut c = ctx.output_chunk::<T>(1)?;
    let a = elems(&a);
    if a.len() != c.len() {
        return Err(KernelError::msg(format!(
            "{}: chunk lengths differ: {} and {}",
            ctx.kernel_name(),
            a.len(),
            c.len()
        )));
    }
    write_with(&mut c, |i| op(a[i]));
    Ok(())
}

/// A scalar operand: of the tensor's own dtype, or another number (an f64 or an i64, as
/// Python's floats and ints arrive) taken through f64.
enum Operand<T> {
    Same(T),
    F64(f64),
}

/// Scalar `index` as an f64, whatever its numeric dtype.
fn scalar_as_f64(ctx: &KernelCtx<'_>, index: usize) -> Option<f64> {
    let s = ctx.scalars().get(index)?;
    let (bits, d) = (s.bits(), s.dtype());
    Some(match d {
        DType::F64 => f64::from_bits(bits),
        DType::F32 => f64::from(f32::from_bits(bits as u32)),
        DType::I64 => bits as i64 as f64,
        DType::I32 => f64::from(bits as u32 as i32),
        DType::I16 => f64::from(bits as u16 as i16),
        DType::I8 => f64::from(bits as u8 as i8),
        DType::U64 => bits as f64,
        DType::U32 => f64::from(bits as u32),
        DType::U16 => f64::from(bits as u16),
        DType::U8 => f64::from(bits as u8),
        _ => return None,
    })
}

fn operand<T: Num>(ctx: &KernelCtx<'_>, index: usize) -> Result<Operand<T>, KernelError> {
    match ctx.scalar::<T>(index) {
        Ok(v) => Ok(Operand::Same(v)),
        Err(KernelError::ScalarType { actual, .. }) => match scalar_as_f64(ctx, index) {
            Some(v) => Ok(Operand::F64(v)),
            None => Err(KernelError::msg(format!(
                "{}: scalar {index} must be a number (of {}, the tensor's dtype, or any other), got {actual}",
                ctx.kernel_name(),
                T::DTYPE
            ))),
        },
        Err(e) => Err(e),
    }
}

fn add_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    binary::<T>(ctx, T::add)
}
fn sub_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    binary::<T>(ctx, T::sub)
}
fn mul_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    binary::<T>(ctx, T::mul)
}
fn scale_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    match operand::<T>(ctx, 0)? {
        Operand::Same(s) => unary::<T>(ctx, |x| x.mul(s)),
        Operand::F64(s) => unary::<T>(ctx, |x| T::from_f64(x.to_f64() * s)),
    }
}
fn add_scalar_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    match operand::<T>(ctx, 0)? {
        Operand::Same(s) => unary::<T>(ctx, |x| x.add(s)),
        Operand::F64(s) => unary::<T>(ctx, |x| T::from_f64(x.to_f64() + s)),
    }
}
fn relu_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    unary::<T>(ctx, T::relu)
}
fn copy_t<T: Element>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    same_shape(ctx, &[0, 1])?;
    let a = ctx.input_chunk::<T>(0)?;
    let mut c = ctx.output_chunk::<T>(1)?;
    c.assign(&elems(&a))?;
    Ok(())
}
fn fill_t<T: Element>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let v = ctx.scalar::<T>(0)?;
    ctx.output_chunk::<T>(0)?.fill(v);
    Ok(())
}
/// `fill` with a scalar of another numeric dtype, converted (as `numpy.full` does).
fn fill_num_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let v = match operand::<T>(ctx, 0)? {
        Operand::Same(v) => v,
        Operand::F64(v) => T::from_f64(v),
    };
    ctx.output_chunk::<T>(0)?.fill(v);
    Ok(())
}
fn reduce_sum_t<T: Num>(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let a = ctx.input::<T>(0)?;
    let mut out = ctx.output::<T>(1)?;
    let total = match a.as_slice() {
        Some(s) => T::sum(s.iter().copied()),
        None => T::sum(a.iter()),
    };
    out.fill(total);
    Ok(())
}

/// `vector_add`: `t2 = t0 + t1`, elementwise. AIV, SPMD-capable.
///
/// Arguments: tensor 0 (IN), tensor 1 (IN), tensor 2 (written: OUT, OUTPUT_EXISTING, INOUT).
/// All three have the same shape and dtype (no broadcasting). Supported dtypes: f32, f64, f16,
/// bf16 and the 8- to 64-bit signed and unsigned integers; integers wrap on overflow. With
/// several blocks each block handles its share of the rows (dimension 0).
///
/// # Errors
///
/// Mismatched shapes or dtypes, an unsupported dtype, or a bad argument (index, mode).
pub fn vector_add(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1, 2])?;
    dispatch_num!(ctx, d, add_t)
}

/// `vector_sub`: `t2 = t0 - t1`, elementwise. Arguments, dtypes and SPMD as [`vector_add`].
///
/// # Errors
///
/// As [`vector_add`].
pub fn vector_sub(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1, 2])?;
    dispatch_num!(ctx, d, sub_t)
}

/// `vector_mul`: `t2 = t0 * t1`, elementwise. Arguments, dtypes and SPMD as [`vector_add`].
///
/// # Errors
///
/// As [`vector_add`].
pub fn vector_mul(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1, 2])?;
    dispatch_num!(ctx, d, mul_t)
}

/// `vector_scale`: `t1 = t0 * s0`, elementwise. AIV, SPMD-capable.
///
/// Arguments: tensor 0 (IN), tensor 1 (written), same shape and dtype; scalar 0, the factor.
///
/// The factor is normally an `f64`: each element is widened to f64, multiplied, and converted
/// back (floats round to nearest; integers round half away from zero and saturate, and are exact
/// only below 2^53 in magnitude). A factor of the tensors' own dtype is applied in that dtype
/// instead (integers wrap). Dtypes as [`vector_add`].
///
/// # Errors
///
/// As [`vector_add`], plus a missing scalar or one that is not a number.
pub fn vector_scale(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1])?;
    dispatch_num!(ctx, d, scale_t)
}

/// `vector_add_scalar`: `t1 = t0 + s0`, elementwise. AIV, SPMD-capable.
///
/// Arguments: tensor 0 (IN), tensor 1 (written), same shape and dtype; scalar 0, the addend,
/// an `f64` (applied in f64, converted as in [`vector_scale`]) or a value of the tensors' dtype
/// (applied in that dtype; integers wrap).
///
/// # Errors
///
/// As [`vector_scale`].
pub fn vector_add_scalar(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1])?;
    dispatch_num!(ctx, d, add_scalar_t)
}

/// `relu`: `t1 = max(t0, 0)`, elementwise (NaN stays NaN). AIV, SPMD-capable.
///
/// Arguments: tensor 0 (IN), tensor 1 (written), same shape and dtype. Dtypes as
/// [`vector_add`] (for unsigned integers it is a copy).
///
/// # Errors
///
/// As [`vector_add`].
pub fn relu(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1])?;
    dispatch_num!(ctx, d, relu_t)
}

/// `copy`: `t1 = t0`. AIV, SPMD-capable.
///
/// Arguments: tensor 0 (IN), tensor 1 (written), same shape and dtype, any dtype (including
/// bool). Either may be a strided view; elements are copied in logical row-major order.
///
/// # Errors
///
/// Mismatched shapes or dtypes, or a bad argument.
pub fn copy(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1])?;
    dispatch_any!(ctx, d, copy_t)
}

/// `fill`: every element of `t0` becomes `s0`. AIV, SPMD-capable.
///
/// Arguments: tensor 0 (written), any dtype; scalar 0 of the same dtype as tensor 0, or (for a
/// numeric tensor) any number, converted to the tensor's dtype.
///
/// # Errors
///
/// A missing scalar, one that is not a number (or not a bool for a bool tensor), or a bad
/// argument.
pub fn fill(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let d = ctx.tensor(0)?.dtype();
    match d {
        DType::Bool => dispatch_any!(ctx, d, fill_t),
        _ => dispatch_num!(ctx, d, fill_num_t),
    }
}

/// `reduce_sum`: `t1 = sum(t0)`. AIV, single block.
///
/// Arguments: tensor 0 (IN), any shape; tensor 1 (written), same dtype, exactly one element
/// (any shape, for example `[1]`). Floats accumulate in f64 in logical row-major order and round
/// once; integers wrap in their own type. The sum of no elements is 0. Dtypes as
/// [`vector_add`].
///
/// # Errors
///
/// More than one block, an output with other than one element, mismatched dtypes, an
/// unsupported dtype, or a bad argument.
pub fn reduce_sum(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    if ctx.block_num() > 1 {
        return Err(KernelError::msg(format!(
            "{}: runs as a single block, not {}",
            ctx.kernel_name(),
            ctx.block_num()
        )));
    }
    let d = common_dtype(ctx, &[0, 1])?;
    let out = ctx.tensor(1)?;
    if out.numel() != 1 {
        return Err(KernelError::msg(format!(
            "{}: output must have exactly 1 element, has shape {:?}",
            ctx.kernel_name(),
            out.shape()
        )));
    }
    dispatch_num!(ctx, d, reduce_sum_t)
}
