//! Matrix multiplication for AIC (matrix) cores.

use pto_core::{DType, KernelCtx, KernelError};

use crate::num::Num;
use crate::vector::{common_dtype, elems, unsupported};

/// Checks `a [M,K] @ b [K,N] -> c [M,N]` and returns `(K, N)`.
fn check_shapes(ctx: &KernelCtx<'_>) -> Result<(usize, usize), KernelError> {
    let (a, b, c) = (
        ctx.tensor(0)?.shape(),
        ctx.tensor(1)?.shape(),
        ctx.tensor(2)?.shape(),
    );
    let fail = |why: &str| {
        KernelError::msg(format!(
            "{}: shape mismatch: a {a:?} @ b {b:?} -> c {c:?}: {why}",
            ctx.kernel_name()
        ))
    };
    match (a.as_slice(), b.as_slice(), c.as_slice()) {
        (&[m, k], &[k2, n], &[cm, cn]) => {
            if k != k2 {
                Err(fail(&format!(
                    "inner dimensions differ ({k} columns of a, {k2} rows of b)"
                )))
            } else if (cm, cn) != (m, n) {
                Err(fail(&format!("c must be [{m}, {n}]")))
            } else {
                Ok((k, n))
            }
        }
        _ => Err(fail("all three must be 2-d")),
    }
}

/// This block's rows of `c (+)= a @ b`, accumulating every output element in f64.
fn matmul_t<T: Num>(ctx: &KernelCtx<'_>, accumulate: bool) -> Result<(), KernelError> {
    let (k, n) = check_shapes(ctx)?;
    let a = ctx.input_chunk::<T>(0)?;
    let b = ctx.input::<T>(1)?;
    let mut c = ctx.output_chunk::<T>(2)?;
    let rows = c.shape().first().copied().unwrap_or(0);
    let (a, b) = (elems(&a), elems(&b));
    if a.len() != rows * k || b.len() != k * n || c.len() != rows * n {
        return Err(KernelError::msg(format!(
            "{}: chunk sizes disagree: a {} elements, b {}, c {} for {rows} rows",
            ctx.kernel_name(),
            a.len(),
            b.len(),
            c.len()
        )));
    }
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let init = if accumulate { c.to_vec() } else { Vec::new() };
    let mut out = Vec::with_capacity(rows * n);
    let mut acc = vec![0.0f64; n];
    for i in 0..rows {
        if accumulate {
            for (s, v) in acc.iter_mut().zip(&init[i * n..(i + 1) * n]) {
                *s = v.to_f64();
            }
        } else {
            acc.fill(0.0);
        }
        // i-k-j: stream one row of b per element of a's row.
        for (p, &aip) in a[i * k..(i + 1) * k].iter().enumerate() {
            let aip = aip.to_f64();
            for (s, &bpj) in acc.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *s += aip * bpj.to_f64();
            }
        }
        out.extend(acc.iter().map(|&v| T::from_f64(v)));
    }
    c.assign(&out)?;
    Ok(())
}

fn run(ctx: &KernelCtx<'_>, accumulate: bool) -> Result<(), KernelError> {
    let d = common_dtype(ctx, &[0, 1, 2])?;
    match d {
        DType::F32 => matmul_t::<f32>(ctx, accumulate),
        DType::F64 => matmul_t::<f64>(ctx, accumulate),
        DType::F16 => matmul_t::<half::f16>(ctx, accumulate),
        DType::Bf16 => matmul_t::<half::bf16>(ctx, accumulate),
        other => Err(unsupported(ctx, other)),
    }
}

/// `matmul`: `t2 = t0 @ t1`. AIC, SPMD-capable.
///
/// Arguments: tensor 0 (IN) `a` of shape `[M, K]`, tensor 1 (IN) `b` of shape `[K, N]`, tensor 2
/// (written) `c` of shape `[M, N]`, all of one dtype: f32, f64, f16 or bf16. Any of them may be
/// a strided view (for example a transpose).
///
/// Every output element is accumulated in f64, over `k` in increasing order, and rounded once to
/// the element type (so f64 results equal a naive `i-j-k` loop's exactly). The loop runs in
/// `i-k-j` order over row-major copies for cache friendliness. With several blocks each block
/// computes its share of the rows of `a` and `c` (`b` is read whole).
///
/// # Errors
///
/// Shapes that do not chain (the message names all three), mismatched or unsupported dtypes, or
/// a bad argument.
pub fn matmul(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    run(ctx, false)
}

/// `matmul_acc`: `t2 += t0 @ t1`, for accumulating partial products. AIC, SPMD-capable.
///
/// Arguments as [`matmul`], except that tensor 2 is read and written: mode INOUT (or NO_DEP).
/// Each output element starts from its current value, accumulates the products in f64 as in
/// [`matmul`], and is rounded once.
///
/// # Errors
///
/// As [`matmul`], plus a tensor 2 whose mode cannot be read (OUT or OUTPUT_EXISTING).
pub fn matmul_acc(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let mode = ctx.mode(2)?;
    if !mode.readable() {
        return Err(KernelError::msg(format!(
            "{}: tensor 2 is accumulated into and must be INOUT, not {mode}",
            ctx.kernel_name()
        )));
    }
    run(ctx, true)
}
