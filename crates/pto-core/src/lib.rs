//! # pto-core: dependency-inferred task graphs on a simulated chip
//!
//! A *chip* has logical AIC (matrix) and AIV (vector) cores. A *chip program* is an
//! orchestration (a closure that submits tasks) plus the kernels it may submit. Each task names
//! a kernel and its [`TaskArgs`]: tensors tagged with how the task accesses them. The runtime
//! infers the dependencies between tasks from those access modes over overlapping bytes of the
//! same buffer (read-after-write, write-after-write and write-after-read), runs every task once
//! its producers finished, and reclaims runtime-allocated outputs through per-scope rings.
//!
//! ```
//! use pto_core::{Chip, CoreKind, DType, KernelRegistry, Program, TaskArgs, Tensor};
//!
//! let mut kernels = KernelRegistry::new();
//! kernels.register("add", CoreKind::Aiv, |ctx| {
//!     let (a, b) = (ctx.input::<f32>(0)?, ctx.input::<f32>(1)?);
//!     let mut out = ctx.output::<f32>(2)?;
//!     let (a, b) = (a.to_vec(), b.to_vec());
//!     let mut i = 0;
//!     out.for_each_mut(|o| { *o = a[i] + b[i]; i += 1; });
//!     Ok(())
//! })?;
//!
//! let a = Tensor::from_slice(&[4], &[1.0f32, 2.0, 3.0, 4.0])?;
//! let b = Tensor::from_slice(&[4], &[10.0f32; 4])?;
//! let result = Tensor::zeros(&[4], DType::F32)?;
//! let r = result.clone();
//! let program = Program::new("demo", kernels, move |orch| {
//!     // c = a + b (runtime-allocated), then result = c + c (written in place).
//!     let c = orch.submit("add", TaskArgs::new().input(&a).input(&b).output(&[4], DType::F32))?.out(0)?;
//!     orch.submit("add", TaskArgs::new().input(&c).input(&c).output_existing(&r))?;
//!     Ok(())
//! });
//!
//! let chip = Chip::builder().aic_cores(1).aiv_cores(2).build()?;
//! let report = chip.run(&program)?;
//! assert_eq!(report.stats.tasks, 2);
//! assert_eq!(result.read::<f32>()?, vec![22.0, 24.0, 26.0, 28.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Failures are contained: a kernel that panics or returns an error fails its task, every task
//! downstream of it is *poisoned* (not run), and [`Chip::run`] returns a [`RunError`] naming the
//! task, kernel, core and message. The chip stays usable.
//!
//! Design notes: `docs/design/dependency-engine.md` and `docs/design/chip-scheduler.md`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod args;
mod buffer;
mod chip;
pub mod config;
mod deferred;
mod dtype;
#[doc(hidden)]
pub mod engine;
mod error;
mod geometry;
mod kernel;
pub mod observe;
mod tensor;
pub mod trace;
mod view;

pub use args::{ArgMode, ArgTensor, OutInit, Scalar, TaskArgs, TaskId};
/// The buffer's lock-free fast-path words, public for the loom models (`tests/loom.rs`).
#[doc(hidden)]
pub use buffer::fastpath;
pub use buffer::{AllocError, Buffer, BufferAllocator, ExternalMemory, BUFFER_ALIGN};
pub use chip::{
    Chip, ChipBuilder, ChipConfig, Orch, OrchFn, Program, RunOptions, RunReport, Submitted,
    ThreadMain,
};
pub use deferred::{
    CompletionSender, CompletionToken, Condition, Counter, FnCondition, Poll, QueueHost,
};
pub use dtype::{Bool, DType, Element};
pub use engine::RunStats;
pub use error::{OrchError, RunError, TaskFailure};
pub use kernel::{
    block_range, CoreId, CoreKind, Kernel, KernelCtx, KernelError, KernelFn, KernelId, KernelRef,
    KernelRegistry, RegistryError, MAX_CONDITIONS,
};
pub use pto_shm::ring::{Completion, CompletionQueue, HeapQueue, QueueFull};
pub use pto_shm::Fault;
pub use tensor::{
    intersects, overlap, Dims, Overlap, Region, Tensor, TensorError, MAX_DIMS, MAX_DIM_LEN,
};
pub use trace::{Trace, TraceEvent};
pub use view::{RawView, TensorMut, TensorRef};
