//! Errors of orchestrations and runs.

use std::fmt;
use std::time::Duration;

use crate::args::TaskId;
use crate::buffer::AllocError;
use crate::dtype::DType;
use crate::geometry::{MAX_DIMS, MAX_DIM_LEN};
use crate::kernel::{CoreId, CoreKind, RegistryError};

/// Why a task failed: which task, kernel, core and block, and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskFailure {
    /// The task.
    pub task: TaskId,
    /// Its kernel's name.
    pub kernel: String,
    /// The core that ran the failing block, if it got one.
    pub core: Option<CoreId>,
    /// The failing block.
    pub block: u32,
    /// The panic or error message.
    pub message: String,
}

impl fmt::Display for TaskFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {} (kernel {:?}", self.task, self.kernel)?;
        if let Some(c) = self.core {
            write!(f, " on {c}")?;
        }
        write!(f, ", block {}) failed: {}", self.block, self.message)
    }
}

/// Errors the orchestration API returns (submit, scopes, reads).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrchError {
    /// No such kernel.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// A tensor argument is invalid.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// Arguments that make no sense together.
    #[error("invalid arguments for kernel {kernel:?}: {detail}")]
    InvalidArgs {
        /// The kernel being submitted.
        kernel: String,
        /// What is wrong.
        detail: String,
    },
    /// The chip has no core of the kind the kernel needs.
    #[error("kernel {kernel:?} needs a {kind} core and this chip has none")]
    NoCore {
        /// The kernel.
        kernel: String,
        /// The kind it needs.
        kind: CoreKind,
    },
    /// A task's outputs can never fit its ring.
    #[error("task outputs of kernel {kernel:?} need {bytes} bytes but ring {ring} holds {capacity}; raise PTO_RING_HEAP_BYTES")]
    OutputTooLarge {
        /// The kernel.
        kernel: String,
        /// Bytes needed.
        bytes: usize,
        /// The ring (scope depth, capped at 3).
        ring: usize,
        /// Ring capacity.
        capacity: usize,
    },
    /// The scope holds more than its ring can ever free while it is open.
    #[error("scope at depth {depth} deadlocks ring {ring}: its {live} live tasks pin the ring ({what}) and cannot be freed until the scope ends; open an inner scope or raise {hint}")]
    ScopeDeadlock {
        /// Depth of the innermost open scope (0 = the implicit outer scope).
        depth: usize,
        /// The ring.
        ring: usize,
        /// Live tasks in the ring.
        live: usize,
        /// What is exhausted.
        what: String,
        /// The variable to raise.
        hint: &'static str,
    },
    /// The ring did not free space before the deadline.
    #[error("waited {waited:?} for ring {ring} to free space ({what}); tasks are not finishing")]
    FlowControlTimeout {
        /// The ring.
        ring: usize,
        /// How long.
        waited: Duration,
        /// What is exhausted.
        what: String,
    },
    /// An explicit dependency on a task that does not exist.
    #[error("explicit dependency on task {0} which was never submitted")]
    UnknownTask(TaskId),
    /// An automatic scope inside a manual one.
    #[error("an automatic scope cannot open inside a manual scope")]
    AutoInsideManual,
    /// A tensor read waited on a failed or poisoned producer.
    #[error("tensor depends on task {task}, which did not complete: {cause}")]
    Poisoned {
        /// The producer that did not complete.
        task: TaskId,
        /// The root failure.
        cause: String,
    },
    /// A wait for a tensor's producers passed its deadline.
    #[error("waited {waited:?} for the producers of a tensor ({pending} still pending)")]
    WaitTimeout {
        /// How long.
        waited: Duration,
        /// Producers not finished.
        pending: usize,
    },
    /// The orchestration's own error.
    #[error("{0}")]
    Other(String),
}

impl OrchError {
    /// An orchestration error with a message of the caller's own.
    pub fn msg(m: impl Into<String>) -> OrchError {
        OrchError::Other(m.into())
    }
}

/// Why a run failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A kernel failed; every task downstream of it was poisoned and not run.
    #[error("{failure} ({failed} task(s) failed, {poisoned} poisoned and not run)")]
    TaskFailed {
        /// The first failure.
        failure: TaskFailure,
        /// Tasks whose kernel failed.
        failed: usize,
        /// Tasks skipped because a producer failed.
        poisoned: usize,
    },
    /// The orchestration returned an error or panicked.
    #[error("orchestration failed: {0}")]
    Orchestration(OrchError),
    /// No task finished for too long.
    #[error(
        "run stalled: no task finished for {waited:?}; running: {running} (a kernel that truly \
         runs longer needs a longer stall timeout: PTO_STALL_TIMEOUT_MS or \
         ChipBuilder::stall_timeout)"
    )]
    Stalled {
        /// How long.
        waited: Duration,
        /// The tasks still running (task, kernel, core).
        running: String,
    },
    /// Completions were posted for tokens that name no waiting task of the run.
    #[error("completion queue: {0}")]
    Completion(String),
    /// The chip cannot run programs any more (a kernel never returned).
    #[error("chip is unusable: {0}")]
    Broken(String),
    /// A bad chip configuration.
    #[error("invalid chip configuration: {0}")]
    Config(String),
    /// The machine refused what the chip needs (a thread: the process's or the system's limit).
    #[error("the machine refused the chip {0}")]
    Resources(String),
}

impl RunError {
    /// The kind of failure: a bad chip configuration is the caller's, a refusal of the
    /// machine's the environment's; the rest is the run's.
    pub fn fault(&self) -> pto_shm::Fault {
        match self {
            RunError::Config(_) => pto_shm::Fault::Usage,
            RunError::Resources(_) => pto_shm::Fault::Environment,
            _ => pto_shm::Fault::Runtime,
        }
    }
}

/// Errors from building, viewing or accessing tensors.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A tensor needs 1 to [`MAX_DIMS`] dimensions.
    #[error("a tensor has 1 to {MAX_DIMS} dimensions, not {ndims}")]
    BadRank {
        /// The rank asked for.
        ndims: usize,
    },
    /// Strides must be positive.
    #[error("stride of dimension {dim} is 0; strides must be positive")]
    ZeroStride {
        /// The dimension.
        dim: usize,
    },
    /// The view reaches past the end of its buffer.
    #[error("view needs bytes up to {needed} but its buffer has {len}")]
    OutOfBuffer {
        /// One past the last byte the view touches.
        needed: usize,
        /// The buffer's length.
        len: usize,
    },
    /// A dimension's size or stride (in elements) is larger than [`MAX_DIM_LEN`]: regions keep
    /// them in 32 bits.
    #[error("dimension {dim}'s {what} is {value} elements; at most {MAX_DIM_LEN} are supported")]
    DimTooLarge {
        /// `"size"`, `"stride"` or `"row-major stride"`.
        what: &'static str,
        /// The dimension.
        dim: usize,
        /// The value asked for.
        value: usize,
    },
    /// Sizes overflow `usize`.
    #[error("tensor size overflows")]
    Overflow,
    /// A sub-view or index falls outside the tensor.
    #[error("{what}: {detail}")]
    OutOfRange {
        /// Which operation.
        what: &'static str,
        /// What was out of range.
        detail: String,
    },
    /// Reshape needs the same number of elements and a contiguous tensor.
    #[error("cannot reshape {from:?} into {to:?}: {why}")]
    Reshape {
        /// Old shape.
        from: Vec<usize>,
        /// New shape.
        to: Vec<usize>,
        /// Why not.
        why: &'static str,
    },
    /// Typed access with the wrong element type.
    #[error("tensor has dtype {actual}, accessed as {expected}")]
    DTypeMismatch {
        /// The type the access asked for.
        expected: DType,
        /// The tensor's dtype.
        actual: DType,
    },
    /// A slice of data does not match the tensor's element count.
    #[error("tensor has {expected} elements, data has {actual}")]
    LengthMismatch {
        /// Elements in the tensor.
        expected: usize,
        /// Elements supplied.
        actual: usize,
    },
    /// The memory is in use by a task that overlaps this access.
    #[error("buffer {buffer} is in use by a running task that overlaps this access")]
    Busy {
        /// The buffer's id.
        buffer: u64,
    },
    /// The runtime-allocated output was reclaimed after its scope ended.
    #[error("tensor produced by task {task} was reclaimed when its scope ended; read it inside the scope")]
    Stale {
        /// The producer.
        task: TaskId,
    },
    /// Allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
}
