//! Task arguments: tensors tagged with access modes, scalars, explicit dependencies, SPMD width.

use std::fmt;

use smallvec::SmallVec;

use crate::dtype::{DType, Element};
use crate::tensor::{Tensor, MAX_DIMS};

/// Identifies a task within one run of a chip program. Ids grow in submission order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub(crate) u64);

impl TaskId {
    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How a task accesses a tensor argument; decides which dependencies are inferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArgMode {
    /// Read only: depends on earlier writers of overlapping bytes (read-after-write).
    In,
    /// A new tensor the runtime allocates from the scope's ring; the task writes it.
    Out,
    /// Read and written: depends on earlier readers and writers of overlapping bytes.
    InOut,
    /// Written in place in an existing tensor: depends on earlier readers and writers
    /// (write-after-read and write-after-write).
    OutputExisting,
    /// Not tracked: no inferred dependency. The kernel may read it, or write it when no other
    /// running task uses the same bytes (a collision fails the task instead of racing).
    NoDep,
}

impl ArgMode {
    /// True for the modes a kernel may read.
    pub fn readable(self) -> bool {
        matches!(self, ArgMode::In | ArgMode::InOut | ArgMode::NoDep)
    }
    /// True for the modes a kernel may write.
    pub fn writable(self) -> bool {
        !matches!(self, ArgMode::In)
    }
    /// The upper-case name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ArgMode::In => "IN",
            ArgMode::Out => "OUT",
            ArgMode::InOut => "INOUT",
            ArgMode::OutputExisting => "OUTPUT_EXISTING",
            ArgMode::NoDep => "NO_DEP",
        }
    }
}

impl fmt::Display for ArgMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A scalar argument: its bits and its dtype, so a kernel reading it as another type gets an
/// error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scalar {
    pub(crate) bits: u64,
    pub(crate) dtype: DType,
}

impl Scalar {
    /// Wraps a value of any element type.
    pub fn new<T: Element>(v: T) -> Scalar {
        let mut bytes = [0u8; 8];
        let src = bytemuck::bytes_of(&v);
        bytes[..src.len()].copy_from_slice(src);
        Scalar {
            bits: u64::from_le_bytes(bytes),
            dtype: T::DTYPE,
        }
    }

    /// The value as `T`, or `None` when `T` is not its dtype.
    pub fn get<T: Element>(&self) -> Option<T> {
        if T::DTYPE != self.dtype {
            return None;
        }
        let bytes = self.bits.to_le_bytes();
        bytemuck::try_pod_read_unaligned(&bytes[..T::DTYPE.size()]).ok()
    }

    /// The scalar's dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The raw bits (little-endian value in the low bytes).
    pub fn bits(&self) -> u64 {
        self.bits
    }

    /// A scalar from raw bits and a dtype (as [`Scalar::bits`] and [`Scalar::dtype`] give).
    pub fn from_bits(bits: u64, dtype: DType) -> Scalar {
        Scalar { bits, dtype }
    }
}

/// What the runtime should put in a runtime-allocated output before its kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutInit {
    /// Whatever the ring memory held (fastest; the kernel must write every element).
    Unspecified,
    /// All bytes zero.
    Zeroed,
}

#[derive(Clone, Debug)]
pub(crate) enum TensorArg {
    Existing(Tensor, ArgMode),
    Create {
        shape: SmallVec<[usize; MAX_DIMS]>,
        dtype: DType,
        init: OutInit,
    },
}

impl TensorArg {
    /// The tensor and its mode; `None` for an output not allocated yet.
    pub(crate) fn existing(&self) -> Option<(&Tensor, ArgMode)> {
        match self {
            TensorArg::Existing(t, m) => Some((t, *m)),
            TensorArg::Create { .. } => None,
        }
    }
}

/// What a tensor argument of [`TaskArgs`] may be given as: a `&Tensor` (the arguments keep a
/// clone), or a `Tensor` the caller gives up, typically a view made for this task alone, which
/// saves a reference-count increment and decrement on the buffer (two locked instructions on
/// the submit path of fine-grained tasks).
///
/// ```
/// use pto_core::{DType, TaskArgs, Tensor};
/// let t = Tensor::zeros(&[4, 4], DType::F32)?;
/// let args = TaskArgs::new().input(&t).output_existing(t.view(&[1, 4], &[2, 0])?);
/// assert_eq!(args.num_tensors(), 2);
/// # Ok::<(), pto_core::TensorError>(())
/// ```
pub trait ArgTensor: sealed::Sealed {
    /// The tensor the arguments keep.
    fn into_arg(self) -> Tensor;
}

impl ArgTensor for &Tensor {
    fn into_arg(self) -> Tensor {
        self.clone()
    }
}

impl ArgTensor for Tensor {
    fn into_arg(self) -> Tensor {
        self
    }
}

impl ArgTensor for &mut Tensor {
    fn into_arg(self) -> Tensor {
        self.clone()
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for &super::Tensor {}
    impl Sealed for &mut super::Tensor {}
    impl Sealed for super::Tensor {}
}

/// The arguments of one task, built in order: tensors (each with an [`ArgMode`]), scalars,
/// explicit dependencies and the SPMD width.
///
/// Tensor arguments are numbered in the order they are added, whatever their mode; scalars are
/// numbered separately. Kernels read them through [`crate::KernelCtx`].
///
/// ```
/// use pto_core::{DType, TaskArgs, Tensor};
/// let a = Tensor::zeros(&[4], DType::F32)?;
/// let args = TaskArgs::new()
///     .input(&a)                 // tensor 0
///     .output(&[4], DType::F32)  // tensor 1, allocated by the runtime
///     .scalar(2.0f32);           // scalar 0
/// assert_eq!(args.num_tensors(), 2);
/// # Ok::<(), pto_core::TensorError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct TaskArgs {
    // From a per-thread pool that the orchestrating thread refills after each submit, so that
    // building a task's arguments allocates nothing in steady state (inline storage would
    // make every move of the arguments a copy of several hundred bytes).
    pub(crate) tensors: Vec<TensorArg>,
    pub(crate) scalars: SmallVec<[Scalar; 2]>,
    pub(crate) deps: SmallVec<[TaskId; 2]>,
    pub(crate) block_num: u32,
    pub(crate) deferred: bool,
}

impl TaskArgs {
    /// No arguments; one block.
    pub fn new() -> TaskArgs {
        TaskArgs {
            block_num: 1,
            ..TaskArgs::default()
        }
    }

    #[inline(always)]
    fn with(mut self, t: impl ArgTensor, mode: ArgMode) -> TaskArgs {
        if self.tensors.capacity() == 0 {
            self.tensors = pool::take();
        }
        self.tensors.push(TensorArg::Existing(t.into_arg(), mode));
        self
    }

    /// A tensor the task reads (a reference, or a tensor given up: see [`ArgTensor`]).
    pub fn input(self, t: impl ArgTensor) -> TaskArgs {
        self.with(t, ArgMode::In)
    }

    /// A tensor the task reads and writes.
    pub fn inout(self, t: impl ArgTensor) -> TaskArgs {
        self.with(t, ArgMode::InOut)
    }

    /// An existing tensor the task writes.
    pub fn output_existing(self, t: impl ArgTensor) -> TaskArgs {
        self.with(t, ArgMode::OutputExisting)
    }

    /// A tensor excluded from dependency tracking.
    pub fn no_dep(self, t: impl ArgTensor) -> TaskArgs {
        self.with(t, ArgMode::NoDep)
    }

    /// A tensor with an explicit mode.
    pub fn tensor(self, t: impl ArgTensor, mode: ArgMode) -> TaskArgs {
        self.with(t, mode)
    }

    /// A new tensor allocated by the runtime; its contents are unspecified until the kernel
    /// writes them. It is returned by the submit call.
    pub fn output(self, shape: &[usize], dtype: DType) -> TaskArgs {
        self.output_init(shape, dtype, OutInit::Unspecified)
    }

    /// A new zero-filled tensor allocated by the runtime.
    pub fn output_zeroed(self, shape: &[usize], dtype: DType) -> TaskArgs {
        self.output_init(shape, dtype, OutInit::Zeroed)
    }

    fn output_init(mut self, shape: &[usize], dtype: DType, init: OutInit) -> TaskArgs {
        if self.tensors.capacity() == 0 {
            self.tensors = pool::take();
        }
        self.tensors.push(TensorArg::Create {
            shape: SmallVec::from_slice(shape),
            dtype,
            init,
        });
        self
    }

    /// A scalar argument.
    pub fn scalar<T: Element>(mut self, v: T) -> TaskArgs {
        self.scalars.push(Scalar::new(v));
        self
    }

    /// An explicit dependency: the task runs after `task` completes.
    pub fn after(mut self, task: TaskId) -> TaskArgs {
        self.deps.push(task);
        self
    }

    /// Explicit dependencies on several tasks.
    pub fn after_all(mut self, tasks: impl IntoIterator<Item = TaskId>) -> TaskArgs {
        self.deps.extend(tasks);
        self
    }

    /// Submits the task as deferred: its kernel may register completion conditions and
    /// tokens, and the task completes only when they hold (see [`crate::KernelCtx::defer`]).
    pub fn deferred(mut self) -> TaskArgs {
        self.deferred = true;
        self
    }

    /// Runs the kernel as `n` SPMD blocks (`n >= 1`).
    pub fn blocks(mut self, n: u32) -> TaskArgs {
        self.block_num = n;
        self
    }

    /// Number of tensor arguments.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Number of scalar arguments.
    pub fn num_scalars(&self) -> usize {
        self.scalars.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_keep_their_type() {
        let s = Scalar::new(-3i16);
        assert_eq!(s.get::<i16>(), Some(-3));
        assert_eq!(s.get::<u16>(), None);
        let f = Scalar::new(half::bf16::from_f32(1.5));
        assert_eq!(f.get::<half::bf16>(), Some(half::bf16::from_f32(1.5)));
        assert_eq!(Scalar::new(2.5f64).get::<f64>(), Some(2.5));
    }
}

/// Recycled argument vectors (see [`TaskArgs`]): each thread keeps a few.
pub(crate) mod pool {
    use std::cell::RefCell;

    use super::TensorArg;

    /// Vectors kept per thread.
    const KEEP: usize = 32;
    /// Larger vectors are freed rather than kept.
    const MAX_CAPACITY: usize = 16;
    /// Lines of a vector given back that are fetched for writing.
    const PREFETCH_LINES: usize = 5;

    thread_local! {
        static POOL: RefCell<Vec<Vec<TensorArg>>> = const { RefCell::new(Vec::new()) };
    }

    /// An empty vector, recycled when one is at hand.
    pub(crate) fn take() -> Vec<TensorArg> {
        POOL.try_with(|p| p.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_else(|| Vec::with_capacity(4))
    }

    /// Gives an emptied vector back; the next task most likely has `next_len` arguments.
    pub(crate) fn give(mut v: Vec<TensorArg>, next_len: usize) {
        v.clear();
        if v.capacity() == 0 || v.capacity() > MAX_CAPACITY {
            return;
        }
        // The next task's arguments go into this vector (the pool is last in, first out).
        // Its lines were last read by the core thread that ran the task it held, so writing
        // them would wait for that copy to be invalidated: ask for the lines the next task
        // will most likely write.
        let bytes = next_len.min(v.capacity()) * std::mem::size_of::<TensorArg>();
        for l in 0..bytes.div_ceil(64).min(PREFETCH_LINES) {
            pto_shm::sync::prefetch_write(v.as_ptr().cast::<u8>().wrapping_add(l * 64));
        }
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < KEEP {
                p.push(v);
            }
        });
    }
}
