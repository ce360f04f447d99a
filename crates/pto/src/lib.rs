//! # pto
//!
//! A Rust runtime that runs tensor task graphs on simulated chips. This facade re-exports the
//! layers below it:
//!
//! * [`core`] (`pto-core`): tensors, task arguments, the dependency-inferred DAG engine and the
//!   simulated chip;
//! * [`kernels`] (`pto-kernels`): the built-in kernels;
//! * [`comm`] (`pto-comm`): symmetric windows, signals, barriers and domains across ranks;
//! * [`worker`] (`pto-worker`): the host Worker (one process per chip);
//! * [`plugin`] (`pto-plugin`): kernels and programs from C plugins (`include/pto.h`);
//! * [`config`]: the one list of `PTO_*` environment variables.
//!
//! ## A first program
//!
//! ```
//! use pto::prelude::*;
//!
//! let chip = Chip::builder().aic_cores(1).aiv_cores(2).build()?;
//! let a = Tensor::from_slice(&[4], &[1.0f32, 2.0, 3.0, 4.0])?;
//! let b = Tensor::from_slice(&[4], &[0.5f32; 4])?;
//! let out = Tensor::zeros(&[4], DType::F32)?;
//! let o2 = out.clone();
//! let program = Program::new("first", pto::kernels::registry()?, move |orch| {
//!     // sum = a + b, runtime-allocated; out = 2 * sum, written in place. The second task
//!     // depends on the first because it reads what the first wrote.
//!     let sum = orch
//!         .submit("vector_add", TaskArgs::new().input(&a).input(&b).output(&[4], DType::F32))?
//!         .out(0)?;
//!     orch.submit("vector_scale", TaskArgs::new().input(&sum).output_existing(&o2).scalar(2.0f64))?;
//!     Ok(())
//! });
//! chip.run(&program)?;
//! assert_eq!(out.read::<f32>()?, vec![3.0, 5.0, 7.0, 9.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Dependencies come from access modes
//!
//! Each tensor argument is tagged `IN`, `OUT` (allocated by the runtime), `INOUT`,
//! `OUTPUT_EXISTING` or `NO_DEP`. Two tasks that touch overlapping bytes of one buffer are
//! ordered when at least one of them writes: read-after-write, write-after-write and
//! write-after-read. Inside a [`core::Orch::manual_scope`] only explicit dependencies
//! ([`core::TaskArgs::after`]) count.
//!
//! ## Failures are contained
//!
//! A kernel that panics or returns an error fails its task; the tasks downstream are poisoned
//! and not run; the run returns an error naming the task, kernel, core and message, and the chip
//! runs the next program.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use pto_comm as comm;
pub use pto_core as core;
pub use pto_core::config;
pub use pto_core::{Fault, RunError};
pub use pto_kernels as kernels;
pub use pto_plugin as plugin;
pub use pto_worker as worker;

/// The names most programs need.
pub mod prelude {
    pub use pto_core::{
        ArgMode, Chip, CoreKind, DType, KernelCtx, KernelError, KernelRegistry, Orch, OrchError,
        Program, RunError, RunOptions, TaskArgs, Tensor,
    };
}
