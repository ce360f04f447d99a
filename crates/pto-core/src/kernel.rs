//! Kernels, the registry that names them, and the typed context they run in.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::args::{ArgMode, OutInit, Scalar, TaskId, TensorArg};
use crate::deferred::{CompletionSender, CompletionToken, Condition};
use crate::dtype::{DType, Element};
use crate::tensor::{Region, Tensor, TensorError};

use crate::view::{TensorMut, TensorRef};

/// The kind of logical core a kernel runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CoreKind {
    /// A matrix (cube) core.
    Aic,
    /// A vector core.
    Aiv,
    /// A whole cluster: one AIC core and its AIV cores, taken together.
    Mix,
}

impl CoreKind {
    /// `"AIC"`, `"AIV"` or `"MIX"`.
    pub fn name(self) -> &'static str {
        match self {
            CoreKind::Aic => "AIC",
            CoreKind::Aiv => "AIV",
            CoreKind::Mix => "MIX",
        }
    }
}

impl fmt::Display for CoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One logical core of a chip (for [`CoreKind::Mix`], a cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoreId {
    /// Its kind.
    pub kind: CoreKind,
    /// Its index among the cores of that kind.
    pub index: u32,
}

impl fmt::Display for CoreId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.kind, self.index)
    }
}

/// Why a kernel failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// An argument index past the end.
    #[error("{what} argument {index} out of range: the task has {count}")]
    ArgIndex {
        /// `"tensor"` or `"scalar"`.
        what: &'static str,
        /// The index asked for.
        index: usize,
        /// How many there are.
        count: usize,
    },
    /// Reading an argument the task may not read, or writing one it may not write.
    #[error("tensor argument {index} is {mode} and cannot be {wanted}")]
    Mode {
        /// The argument.
        index: usize,
        /// Its mode.
        mode: ArgMode,
        /// `"read"` or `"written"`.
        wanted: &'static str,
    },
    /// An SPMD task's blocks would share a writable tensor; use the `_chunk` accessors.
    #[error("tensor argument {index} is writable and the task runs {blocks} blocks: use input_chunk/output_chunk so blocks do not overlap")]
    SpmdShared {
        /// The argument.
        index: usize,
        /// The task's block count.
        blocks: u32,
    },
    /// A view of this argument is still alive in a conflicting mode.
    #[error("tensor argument {index} is already borrowed by a live view")]
    AlreadyBorrowed {
        /// The argument.
        index: usize,
    },
    /// A tensor operation failed (for example a dtype mismatch).
    #[error("tensor argument {index}: {source}")]
    Tensor {
        /// The argument.
        index: usize,
        /// The tensor error.
        source: TensorError,
    },
    /// A scalar read as the wrong type.
    #[error("scalar argument {index} is {actual}, read as {expected}")]
    ScalarType {
        /// The argument.
        index: usize,
        /// The type asked for.
        expected: DType,
        /// The scalar's dtype.
        actual: DType,
    },
    /// Writing a `NO_DEP` tensor that another running task uses.
    #[error("tensor argument {index} (buffer {buffer}) is in use by another running task")]
    DataRace {
        /// The argument.
        index: usize,
        /// The buffer id.
        buffer: u64,
    },
    /// A completion condition or token registered by a task not submitted as deferred.
    #[error("task {task} was not submitted as deferred (TaskArgs::deferred) and cannot register completion conditions")]
    NotDeferred {
        /// The task.
        task: TaskId,
    },
    /// More completion conditions than a task may hold.
    #[error("task {task} registered more than {max} completion conditions")]
    TooManyConditions {
        /// The task.
        task: TaskId,
        /// The limit.
        max: usize,
    },
    /// A view operation failed (for example [`crate::TensorMut::assign`] with the wrong
    /// length).
    #[error(transparent)]
    View(#[from] TensorError),
    /// The kernel's own failure.
    #[error("{0}")]
    Failed(String),
}

impl KernelError {
    /// A failure with a message of the kernel's own.
    pub fn msg(m: impl Into<String>) -> KernelError {
        KernelError::Failed(m.into())
    }
}

/// The signature of a kernel body.
pub type KernelFn = dyn Fn(&KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync;

/// Identifies a kernel in a [`KernelRegistry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub u32);

/// A registered kernel: a name, an id, the core kind it runs on, and its body.
// Aligned to a cache line: the orchestrating thread counts references to it (in the `Arc`'s
// header) for every task while core threads read its fields.
#[repr(align(64))]
pub struct Kernel {
    name: String,
    id: KernelId,
    kind: CoreKind,
    func: Arc<KernelFn>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kernel({} #{} on {})", self.name, self.id.0, self.kind)
    }
}

impl Kernel {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The kernel's id.
    pub fn id(&self) -> KernelId {
        self.id
    }
    /// The core kind it runs on.
    pub fn kind(&self) -> CoreKind {
        self.kind
    }
    pub(crate) fn call(&self, ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
        (self.func)(ctx)
    }
}

/// Errors from registering kernels.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two kernels with one name.
    #[error("a kernel named {0:?} is already registered")]
    Duplicate(String),
    /// No kernel by that name or id.
    #[error("no kernel named {0} is registered")]
    Unknown(String),
}

/// The kernels a chip program may submit, by name and id.
///
/// ```
/// use pto_core::{CoreKind, KernelRegistry};
/// let mut reg = KernelRegistry::new();
/// let id = reg.register("double", CoreKind::Aiv, |ctx| {
///     let x = ctx.input::<f32>(0)?;
///     let mut y = ctx.output::<f32>(1)?;
///     for (o, i) in y.as_mut_slice().unwrap().iter_mut().zip(x.as_slice().unwrap()) {
///         *o = 2.0 * i;
///     }
///     Ok(())
/// })?;
/// assert_eq!(reg.lookup("double")?.id(), id);
/// # Ok::<(), pto_core::RegistryError>(())
/// ```
#[derive(Clone, Default)]
pub struct KernelRegistry {
    kernels: Vec<Arc<Kernel>>,
    names: FxHashMap<String, KernelId>,
}

impl fmt::Debug for KernelRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.kernels.iter()).finish()
    }
}

impl KernelRegistry {
    /// An empty registry.
    pub fn new() -> KernelRegistry {
        KernelRegistry::default()
    }

    /// Adds a kernel and returns its id.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Duplicate`] when the name is taken.
    pub fn register<F>(
        &mut self,
        name: &str,
        kind: CoreKind,
        f: F,
    ) -> Result<KernelId, RegistryError>
    where
        F: Fn(&KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static,
    {
        if self.names.contains_key(name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        let id = KernelId(self.kernels.len() as u32);
        self.kernels.push(Arc::new(Kernel {
            name: name.to_string(),
            id,
            kind,
            func: Arc::new(f),
        }));
        self.names.insert(name.to_string(), id);
        Ok(id)
    }

    /// The kernel named `name`.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Unknown`].
    pub fn lookup(&self, name: &str) -> Result<&Arc<Kernel>, RegistryError> {
        self.names
            .get(name)
            .and_then(|id| self.kernels.get(id.0 as usize))
            .ok_or_else(|| RegistryError::Unknown(format!("{name:?}")))
    }

    /// The kernel with id `id`.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Unknown`].
    pub fn get(&self, id: KernelId) -> Result<&Arc<Kernel>, RegistryError> {
        self.kernels
            .get(id.0 as usize)
            .ok_or_else(|| RegistryError::Unknown(format!("with id {}", id.0)))
    }

    /// Every kernel, in id order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Kernel>> {
        self.kernels.iter()
    }

    /// Number of kernels.
    pub fn len(&self) -> usize {
        self.kernels.len()
    }

    /// True when no kernel is registered.
    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }
}

/// Something that names a kernel: its name or its id.
pub trait KernelRef {
    /// Finds the kernel in `reg`.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Unknown`].
    fn resolve<'r>(&self, reg: &'r KernelRegistry) -> Result<&'r Arc<Kernel>, RegistryError>;

    /// As [`KernelRef::resolve`], answered from `last` (the kernel found last time) when it is
    /// the one named: a program that submits one kernel many times looks it up once.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Unknown`].
    #[doc(hidden)]
    fn resolve_after<'r>(
        &self,
        reg: &'r KernelRegistry,
        last: &mut Option<&'r Arc<Kernel>>,
    ) -> Result<&'r Arc<Kernel>, RegistryError> {
        let _ = last;
        self.resolve(reg)
    }
}

impl KernelRef for &str {
    fn resolve<'r>(&self, reg: &'r KernelRegistry) -> Result<&'r Arc<Kernel>, RegistryError> {
        reg.lookup(self)
    }

    fn resolve_after<'r>(
        &self,
        reg: &'r KernelRegistry,
        last: &mut Option<&'r Arc<Kernel>>,
    ) -> Result<&'r Arc<Kernel>, RegistryError> {
        if let Some(k) = *last {
            // Byte by byte: names are short, and a call to `memcmp` per submit costs more.
            let (a, b) = (k.name().as_bytes(), self.as_bytes());
            if a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y) {
                return Ok(k);
            }
        }
        let k = reg.lookup(self)?;
        *last = Some(k);
        Ok(k)
    }
}

impl KernelRef for KernelId {
    fn resolve<'r>(&self, reg: &'r KernelRegistry) -> Result<&'r Arc<Kernel>, RegistryError> {
        reg.get(*self)
    }
}

/// A task's arguments after submission: runtime outputs allocated, modes fixed.
/// `repr(C)`: the fields every task uses first, the vectors most tasks leave empty last (see
/// the engine's `Body`).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Payload {
    pub(crate) block_num: u32,
    pub(crate) deferred: bool,
    /// Non-zero when `scalars`, `inits` or the body's `deps` may hold something (so that the
    /// common task never touches their lines).
    pub(crate) extras: u8,
    /// The task's arguments as submitted, each an [`TensorArg::Existing`] (the engine turns a
    /// runtime output into one when it allocates it): the submitting [`crate::TaskArgs`]'
    /// own vector, moved in whole rather than element by element.
    pub(crate) tensors: Vec<TensorArg>,
    pub(crate) scalars: SmallVec<[Scalar; 4]>,
    pub(crate) inits: SmallVec<[(usize, OutInit); 2]>,
}

impl Payload {
    /// The tensor arguments with their positions and modes.
    pub(crate) fn args(&self) -> impl Iterator<Item = (usize, &Tensor, ArgMode)> {
        self.tensors
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.existing().map(|(t, m)| (i, t, m)))
    }
}

/// The most completion conditions one task may register.
pub const MAX_CONDITIONS: usize = 64;

/// A task's completion conditions with their deadlines: inline for one (a Worker's chip task
/// registers one per task, and a vector per task was allocated by the thread that ran the
/// kernel and freed by the one that polled it, both through the allocator's slow paths).
pub(crate) type Conds = smallvec::SmallVec<[(Box<dyn Condition>, Instant); 1]>;

/// What a deferred task's kernel registered.
#[derive(Default)]
pub(crate) struct Registrations {
    pub(crate) conds: Conds,
    pub(crate) tokens: u32,
    /// Deadline for the expected token posts (the earliest of the registrations).
    pub(crate) token_deadline: Option<Instant>,
}

impl Registrations {
    /// Adds what another block of the same task registered.
    pub(crate) fn merge(&mut self, other: Registrations) {
        if self.conds.is_empty() {
            // The first block to register (most tasks have one): its vector moves in whole.
            self.conds = other.conds;
        } else {
            self.conds.extend(other.conds);
        }
        self.tokens += other.tokens;
        if let Some(d) = other.token_deadline {
            self.token_deadline = Some(self.token_deadline.map_or(d, |x| x.min(d)));
        }
    }
}

impl fmt::Debug for Registrations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Registrations({} conditions, {} tokens)",
            self.conds.len(),
            self.tokens
        )
    }
}

/// The range of `0..len` that block `block` of `blocks` owns: near-equal contiguous shares.
pub fn block_range(len: usize, block: u32, blocks: u32) -> Range<usize> {
    let (b, n) = (block as usize, blocks.max(1) as usize);
    (len * b / n)..(len * (b + 1) / n)
}

/// What a kernel sees: its typed arguments, its block, its core. Kernels never touch raw
/// pointers; every access is checked (index, mode, dtype, SPMD overlap).
pub struct KernelCtx<'a> {
    pub(crate) task: TaskId,
    pub(crate) kernel: &'a Kernel,
    pub(crate) core: CoreId,
    pub(crate) block_idx: u32,
    pub(crate) payload: &'a Payload,
    pub(crate) token: u64,
    pub(crate) flags: SmallVec<[Cell<isize>; 8]>,
    pub(crate) ext: Option<&'a (dyn Any + Send + Sync)>,
    pub(crate) deferred: bool,
    pub(crate) regs: RefCell<Registrations>,
    pub(crate) sender: &'a CompletionSender,
    pub(crate) wait: Duration,
}

impl fmt::Debug for KernelCtx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelCtx")
            .field("task", &self.task)
            .field("kernel", &self.kernel.name)
            .field("core", &self.core)
            .field("block", &(self.block_idx, self.payload.block_num))
            .finish()
    }
}

impl<'a> KernelCtx<'a> {
    /// The task being run.
    pub fn task(&self) -> TaskId {
        self.task
    }
    /// The kernel's name.
    pub fn kernel_name(&self) -> &str {
        &self.kernel.name
    }
    /// The logical core (or cluster) running this block.
    pub fn core(&self) -> CoreId {
        self.core
    }
    /// This block's index in `0..block_num()`.
    pub fn block_idx(&self) -> u32 {
        self.block_idx
    }
    /// The task's SPMD width.
    pub fn block_num(&self) -> u32 {
        self.payload.block_num
    }
    /// This block's share of `0..len`.
    pub fn block_range(&self, len: usize) -> Range<usize> {
        block_range(len, self.block_idx, self.payload.block_num)
    }
    /// Number of tensor arguments.
    pub fn num_tensors(&self) -> usize {
        self.payload.tensors.len()
    }

    /// True when the task was submitted as deferred.
    pub fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// The registrations, when the task is deferred and has room for one more.
    fn registrations_with_room(&self) -> Result<std::cell::RefMut<'_, Registrations>, KernelError> {
        if !self.deferred {
            return Err(KernelError::NotDeferred { task: self.task });
        }
        let r = self.regs.borrow_mut();
        if r.conds.len() + r.tokens as usize >= MAX_CONDITIONS {
            return Err(KernelError::TooManyConditions {
                task: self.task,
                max: MAX_CONDITIONS,
            });
        }
        Ok(r)
    }

    fn register(&self, c: Box<dyn Condition>, deadline: Instant) -> Result<(), KernelError> {
        let mut r = self.registrations_with_room()?;
        r.conds.push((c, deadline));
        Ok(())
    }

    /// Makes the task's completion wait for `c`, with the default deadline
    /// (`PTO_WAIT_TIMEOUT_MS` from now). The kernel returns at once; the task completes when
    /// every registered condition holds.
    ///
    /// # Errors
    ///
    /// [`KernelError::NotDeferred`] or [`KernelError::TooManyConditions`].
    pub fn defer(&self, c: impl Condition) -> Result<(), KernelError> {
        self.register(Box::new(c), Instant::now() + self.wait)
    }

    /// [`KernelCtx::defer`] with an explicit deadline.
    ///
    /// # Errors
    ///
    /// As [`KernelCtx::defer`].
    pub fn defer_until(&self, c: impl Condition, deadline: Instant) -> Result<(), KernelError> {
        self.register(Box::new(c), deadline)
    }

    /// Makes the task's completion wait for one more post of its token (through a
    /// [`CompletionSender`], from any thread, or from another process sharing the queue).
    /// Every call expects one more post; all calls return the same token.
    ///
    /// # Errors
    ///
    /// As [`KernelCtx::defer`].
    pub fn defer_token(&self) -> Result<CompletionToken, KernelError> {
        let mut r = self.registrations_with_room()?;
        r.tokens += 1;
        let d = Instant::now() + self.wait;
        r.token_deadline = Some(r.token_deadline.map_or(d, |x| x.min(d)));
        Ok(CompletionToken(self.token))
    }

    /// This task's completion token, without registering a wait for it (to hand out before
    /// [`KernelCtx::defer_token`]; a post that arrives first is kept and counted).
    pub fn completion_token(&self) -> CompletionToken {
        CompletionToken(self.token)
    }

    /// A sender to the chip's completion queue (to hand to a thread that will post this
    /// task's token).
    pub fn completion_sender(&self) -> CompletionSender {
        self.sender.clone()
    }
    /// Number of scalar arguments.
    pub fn num_scalars(&self) -> usize {
        self.payload.scalars.len()
    }

    /// Every scalar argument.
    pub fn scalars(&self) -> &[Scalar] {
        &self.payload.scalars
    }
    /// The extension object the chip was built with (for example a communication context), if
    /// it has type `E`.
    pub fn ext<E: Any>(&self) -> Option<&'a E> {
        self.ext.and_then(|e| e.downcast_ref::<E>())
    }

    #[inline]
    pub(crate) fn arg(&self, index: usize) -> Result<(&'a Tensor, ArgMode), KernelError> {
        // Errors are built only on failure (see `view`): this runs for every argument.
        match self
            .payload
            .tensors
            .get(index)
            .and_then(TensorArg::existing)
        {
            Some(found) => Ok(found),
            None => Err(KernelError::ArgIndex {
                what: "tensor",
                index,
                count: self.payload.tensors.len(),
            }),
        }
    }

    /// Tensor argument `index`'s metadata (shape, dtype, strides), without borrowing its data.
    ///
    /// # Errors
    ///
    /// [`KernelError::ArgIndex`].
    pub fn tensor(&self, index: usize) -> Result<&'a Tensor, KernelError> {
        Ok(self.arg(index)?.0)
    }

    /// Tensor argument `index`'s mode.
    ///
    /// # Errors
    ///
    /// [`KernelError::ArgIndex`].
    pub fn mode(&self, index: usize) -> Result<ArgMode, KernelError> {
        Ok(self.arg(index)?.1)
    }

    pub(crate) fn chunk_region(&self, t: &Tensor) -> Region {
        let mut r = *t.region();
        let range = self.block_range(r.dim(0));
        if !range.is_empty() {
            r.offset += range.start * r.stride(0);
        }
        // A part of dimension 0: fits.
        r.shape[0] = range.len() as u32;
        r
    }

    /// Reads tensor argument `index` (mode IN, INOUT or NO_DEP) as elements of type `T`.
    ///
    /// # Errors
    ///
    /// A bad index or mode, a dtype other than `T`'s, a writable argument of an SPMD task
    /// (use [`KernelCtx::input_chunk`]), or a live mutable view of the same argument.
    pub fn input<T: Element>(&self, index: usize) -> Result<TensorRef<'_, T>, KernelError> {
        self.read_view(index, false)
    }

    /// Writes tensor argument `index` (mode OUT, INOUT, OUTPUT_EXISTING or NO_DEP).
    ///
    /// # Errors
    ///
    /// A bad index or mode, a dtype other than `T`'s, an SPMD task (use
    /// [`KernelCtx::output_chunk`]), or another live view of the same argument.
    pub fn output<T: Element>(&self, index: usize) -> Result<TensorMut<'_, T>, KernelError> {
        self.write_view(index, false)
    }

    /// Reads this block's chunk of tensor argument `index`: rows [`KernelCtx::block_range`] of
    /// dimension 0.
    ///
    /// # Errors
    ///
    /// As [`KernelCtx::input`], without the SPMD restriction.
    pub fn input_chunk<T: Element>(&self, index: usize) -> Result<TensorRef<'_, T>, KernelError> {
        self.read_view(index, true)
    }

    /// Writes this block's chunk of tensor argument `index`: rows [`KernelCtx::block_range`] of
    /// dimension 0.
    ///
    /// # Errors
    ///
    /// As [`KernelCtx::output`], without the SPMD restriction.
    pub fn output_chunk<T: Element>(&self, index: usize) -> Result<TensorMut<'_, T>, KernelError> {
        self.write_view(index, true)
    }

    /// Scalar argument `index` as `T`.
    ///
    /// # Errors
    ///
    /// [`KernelError::ArgIndex`] or [`KernelError::ScalarType`].
    pub fn scalar<T: Element>(&self, index: usize) -> Result<T, KernelError> {
        let Some(s) = self.payload.scalars.get(index) else {
            return Err(KernelError::ArgIndex {
                what: "scalar",
                index,
                count: self.payload.scalars.len(),
            });
        };
        match s.get::<T>() {
            Some(value) => Ok(value),
            None => Err(KernelError::ScalarType {
                index,
                expected: T::DTYPE,
                actual: s.dtype,
            }),
        }
    }
}
