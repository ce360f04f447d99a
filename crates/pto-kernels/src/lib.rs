//! # pto-kernels: the built-in kernels of pto
//!
//! Plain kernel functions (`fn(&KernelCtx<'_>) -> Result<(), KernelError>`) for the simulated
//! chip of [`pto_core`], and [`register_all`] to add them to a [`KernelRegistry`] under the
//! stable names in [`NAMES`].
//!
//! | name | core | tensors (in `TaskArgs` order) | scalars |
//! |------|------|-------------------------------|---------|
//! | [`vector_add`] | AIV | t0 in, t1 in, t2 out: `t2 = t0 + t1` | |
//! | [`vector_sub`] | AIV | t0 in, t1 in, t2 out: `t2 = t0 - t1` | |
//! | [`vector_mul`] | AIV | t0 in, t1 in, t2 out: `t2 = t0 * t1` | |
//! | [`vector_scale`] | AIV | t0 in, t1 out: `t1 = t0 * s0` | s0 any number (t0's dtype exactly, else through f64) |
//! | [`vector_add_scalar`] | AIV | t0 in, t1 out: `t1 = t0 + s0` | s0 any number (t0's dtype exactly, else through f64) |
//! | [`relu`] | AIV | t0 in, t1 out: `t1 = max(t0, 0)` | |
//! | [`copy`] | AIV | t0 in, t1 out: `t1 = t0` (any dtype) | |
//! | [`fill`] | AIV | t0 out: every element `= s0` (any dtype) | s0 any number, converted to t0's dtype (a bool for bool) |
//! | [`reduce_sum`] | AIV | t0 in, t1 out (1 element): `t1 = sum(t0)` | |
//! | [`matmul`] | AIC | t0 in `[M,K]`, t1 in `[K,N]`, t2 out `[M,N]`: `t2 = t0 @ t1` | |
//! | [`matmul_acc`] | AIC | as `matmul`, t2 INOUT: `t2 += t0 @ t1` | |
//! | [`noop`] | AIV | none (any are ignored): does nothing (benchmarks, ordering points) | |
//!
//! "out" means any writable mode (OUT, OUTPUT_EXISTING, INOUT, NO_DEP). Elementwise kernels need
//! equal shapes and dtypes (no broadcasting) and support f32, f64, f16, bf16 and the 8- to 64-bit
//! integers (integer arithmetic wraps). Every kernel except `reduce_sum` is SPMD-capable: with
//! `TaskArgs::blocks(n)` each block handles its share of dimension 0 (for the matmuls, the rows
//! of t0 and t2). Inputs and outputs may be strided views (slices, transposes). Bad arguments
//! (shapes, dtypes, modes) make the kernel return a [`KernelError`]; kernels never panic on
//! them and contain no `unsafe` code.
//!
//! ```
//! use pto_core::{Chip, DType, KernelRegistry, Program, TaskArgs, Tensor};
//!
//! let mut kernels = KernelRegistry::new();
//! pto_kernels::register_all(&mut kernels)?;
//! assert_eq!(kernels.len(), pto_kernels::NAMES.len());
//!
//! let a = Tensor::from_slice(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! let b = Tensor::from_slice(&[2, 3], &[10.0f32; 6])?;
//! let c = Tensor::zeros(&[2, 3], DType::F32)?;
//! let out = c.clone();
//! let program = Program::new("add", kernels, move |orch| {
//!     // Two SPMD blocks, one row each.
//!     orch.submit("vector_add", TaskArgs::new().input(&a).input(&b).output_existing(&out).blocks(2))?;
//!     Ok(())
//! });
//!
//! let chip = Chip::builder().aic_cores(1).aiv_cores(2).build()?;
//! chip.run(&program)?;
//! assert_eq!(c.read::<f32>()?, vec![11.0, 12.0, 13.0, 14.0, 15.0, 16.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod matmul;
mod num;
mod vector;

use pto_core::{CoreKind, KernelCtx, KernelError, KernelRegistry, RegistryError};

pub use matmul::{matmul, matmul_acc};
pub use vector::{
    copy, fill, reduce_sum, relu, vector_add, vector_add_scalar, vector_mul, vector_scale,
    vector_sub,
};

/// Does nothing: the cost of a task itself (benchmarks), or an ordering point.
///
/// # Errors
///
/// None.
pub fn noop(_: &KernelCtx<'_>) -> Result<(), KernelError> {
    Ok(())
}

/// A kernel body as this crate defines them.
pub type KernelBody = fn(&KernelCtx<'_>) -> Result<(), KernelError>;

/// Every built-in kernel: its name, the core kind it runs on, and its body, in [`NAMES`] order.
pub const KERNELS: &[(&str, CoreKind, KernelBody)] = &[
    ("vector_add", CoreKind::Aiv, vector_add),
    ("vector_sub", CoreKind::Aiv, vector_sub),
    ("vector_mul", CoreKind::Aiv, vector_mul),
    ("vector_scale", CoreKind::Aiv, vector_scale),
    ("vector_add_scalar", CoreKind::Aiv, vector_add_scalar),
    ("copy", CoreKind::Aiv, copy),
    ("fill", CoreKind::Aiv, fill),
    ("reduce_sum", CoreKind::Aiv, reduce_sum),
    ("relu", CoreKind::Aiv, relu),
    ("matmul", CoreKind::Aic, matmul),
    ("matmul_acc", CoreKind::Aic, matmul_acc),
    ("noop", CoreKind::Aiv, noop),
];

/// The names [`register_all`] registers, in registration order.
pub const NAMES: &[&str] = &[
    "vector_add",
    "vector_sub",
    "vector_mul",
    "vector_scale",
    "vector_add_scalar",
    "copy",
    "fill",
    "reduce_sum",
    "relu",
    "matmul",
    "matmul_acc",
    "noop",
];

/// Registers every built-in kernel under its name in [`NAMES`].
///
/// # Errors
///
/// [`RegistryError::Duplicate`] when `reg` already has a kernel by one of those names; kernels
/// registered before the clash stay registered.
pub fn register_all(reg: &mut KernelRegistry) -> Result<(), RegistryError> {
    for &(name, kind, body) in KERNELS {
        reg.register(name, kind, body)?;
    }
    Ok(())
}

/// A new registry holding exactly the built-in kernels.
///
/// # Errors
///
/// None in practice (the names are distinct); the signature follows [`register_all`].
pub fn registry() -> Result<KernelRegistry, RegistryError> {
    let mut reg = KernelRegistry::new();
    register_all(&mut reg)?;
    Ok(reg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_kernels() {
        let names: Vec<&str> = KERNELS.iter().map(|k| k.0).collect();
        assert_eq!(names, NAMES);
    }
}
