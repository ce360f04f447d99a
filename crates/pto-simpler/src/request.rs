//! What the host asks a chip: the request a chip task carries as its first tensor (JSON bytes),
//! written by the Python layer (`python/pto/simpler/`) and read here.
//!
//! Three requests: run a callable (an orchestration and its kernels) on this chip, allocate a
//! communication domain, free one. Host tensors travel as the chip task's own tensor arguments
//! (so the host's dependencies see them) and are named here by their index.

use serde::{Deserialize, Serialize};

/// One request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Run a callable on every member of the task's group, each with its own arguments.
    Run(RunRequest),
    /// Allocate a domain over `members` (collective over them).
    AllocDomain(DomainRequest),
    /// Free a domain (collective over its members).
    FreeDomain {
        /// The domain's id.
        id: u64,
    },
    /// Allocate `nbytes` of zeroed chip memory as `id`; its address goes to the task's second
    /// tensor (one `u64`).
    AllocDevice {
        /// The host's id for it.
        id: u64,
        /// Its size.
        nbytes: u64,
    },
    /// Free chip memory `id`.
    FreeDevice {
        /// The host's id.
        id: u64,
    },
    /// Copy the task's host tensor `index` into chip memory `id` at byte `offset`.
    CopyTo {
        /// The chip memory.
        id: u64,
        /// Byte offset in it.
        #[serde(default)]
        offset: u64,
        /// The host tensor (index among the task's tensors).
        index: usize,
    },
    /// Copy chip memory `id` from byte `offset` into the task's host tensor `index`.
    CopyFrom {
        /// The chip memory.
        id: u64,
        /// Byte offset in it.
        #[serde(default)]
        offset: u64,
        /// The host tensor (index among the task's tensors).
        index: usize,
    },
}

/// A compiled callable: the orchestration library and its kernels by func_id.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Callable {
    /// A name for messages (the driver's name for it).
    pub name: String,
    /// The orchestration's shared library.
    pub orchestration: String,
    /// Its entry function.
    pub function: String,
    /// Its config function (empty: none).
    #[serde(default)]
    pub config: String,
    /// The orchestration's source file, for messages.
    #[serde(default)]
    pub source: String,
    /// The kernels.
    pub kernels: Vec<KernelSpec>,
}

/// One kernel of a callable.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelSpec {
    /// The id orchestrations submit it by.
    pub func_id: i32,
    /// Its shared library.
    pub path: String,
    /// `aic` or `aiv`, or empty when unknown (the submit decides).
    #[serde(default)]
    pub core: String,
    /// Its source file, for messages.
    #[serde(default)]
    pub source: String,
}

/// Running a callable.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRequest {
    /// What to run.
    pub callable: Callable,
    /// Each member's arguments; a chip runs the entry whose `chip` is its own.
    pub members: Vec<MemberArgs>,
}

/// One chip's arguments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberArgs {
    /// The chip (Worker chip index).
    pub chip: usize,
    /// Tensor arguments, in order.
    pub tensors: Vec<ArgTensor>,
    /// Scalar arguments (64-bit patterns), in order.
    pub scalars: Vec<u64>,
}

/// Where a tensor argument's bytes are.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ArgTensor {
    /// A host tensor: the chip task's tensor argument `index`.
    Host {
        /// Index among the chip task's tensors.
        index: usize,
        /// Byte offset of the tensor in that host tensor.
        #[serde(default)]
        offset: u64,
        /// Shape (elements).
        shape: Vec<u32>,
        /// simpler dtype name.
        dtype: String,
    },
    /// Chip memory the host allocated on this chip.
    Device {
        /// The host's id of the allocation.
        id: u64,
        /// Byte offset of the tensor in it.
        offset: u64,
        /// Shape (elements).
        shape: Vec<u32>,
        /// simpler dtype name.
        dtype: String,
    },
    /// A buffer of a domain's window on this chip.
    Window {
        /// The domain's id.
        domain: u64,
        /// Byte offset of the tensor in this chip's window.
        offset: u64,
        /// Shape (elements).
        shape: Vec<u32>,
        /// simpler dtype name.
        dtype: String,
    },
}

/// Allocating a domain.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DomainRequest {
    /// Its id (the host's).
    pub id: u64,
    /// Its name, for messages.
    pub name: String,
    /// Worker chip indices, in domain-rank order.
    pub members: Vec<usize>,
    /// Bytes of window per member at least.
    pub window_size: u64,
    /// Named buffers carved from the window, in order.
    pub buffers: Vec<DomainBuffer>,
}

/// One named buffer of a domain's window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DomainBuffer {
    /// Its name.
    pub name: String,
    /// Its bytes.
    pub nbytes: u64,
}

/// What a member reports for a domain it allocated: written as `u64`s into the task's second
/// tensor, one row of [`DOMAIN_ROW`] per member in domain-rank order.
pub const DOMAIN_ROW: usize = 8;

/// The request in `bytes`.
///
/// # Errors
///
/// Bytes that are not a request.
pub fn parse(bytes: &[u8]) -> Result<Request, crate::SimplerError> {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    serde_json::from_slice(&bytes[..end]).map_err(|e| crate::SimplerError::Request(e.to_string()))
}
