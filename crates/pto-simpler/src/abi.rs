//! The headers' types, mirrored (`#[repr(C)]`, same field order) from `include/simpler/`. The
//! offsets a compiled kernel reads are pinned here as they are by the headers' static asserts.
//! No logic lives here.

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

/// `PTO_SIMPLER_ABI_VERSION` of `pto_orchestration_api.h`.
pub const ABI_VERSION: i32 = 1;

/// `MAX_TENSOR_DIMS`.
pub(crate) const MAX_DIMS: usize = 5;
/// `MAX_TENSOR_ARGS` of a core task.
pub(crate) const MAX_TENSOR_ARGS: usize = 32;
/// `MAX_SCALAR_ARGS` of a core task.
pub(crate) const MAX_SCALAR_ARGS: usize = 16;
/// `SPMD_LOCAL_CONTEXT_INDEX` / `SPMD_GLOBAL_CONTEXT_INDEX`: where a kernel finds its contexts.
pub(crate) const LOCAL_CONTEXT_INDEX: usize = 48;
pub(crate) const GLOBAL_CONTEXT_INDEX: usize = 49;
/// `MAX_COMPLETIONS_PER_TASK`.
pub(crate) const MAX_COMPLETIONS: usize = 64;
/// `COMM_MAX_RANK_NUM`.
pub(crate) const COMM_MAX_RANKS: usize = 64;
/// The invalid task id.
pub(crate) const INVALID_TASK: u64 = u64::MAX;

/// `TensorArgType`.
pub(crate) mod tag {
    pub(crate) const INPUT: i32 = 0;
    pub(crate) const OUTPUT: i32 = 1;
    pub(crate) const INOUT: i32 = 2;
    pub(crate) const OUTPUT_EXISTING: i32 = 3;
    pub(crate) const NO_DEP: i32 = 4;
}

/// `PtoSimplerSubmitKind`.
pub(crate) mod submit_kind {
    pub(crate) const TASK: i32 = 0;
    pub(crate) const DUMMY: i32 = 1;
    pub(crate) const ALLOC: i32 = 2;
}

/// `PTOBufferHandle`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferHandle {
    /// Base address of the allocation, in the process that uses the descriptor.
    pub addr: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// `ChipTensor`: 128 bytes, 64-aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChipTensor {
    /// The allocation viewed.
    pub buffer: BufferHandle,
    /// The task that created it (`PTO2TaskId`), or all ones.
    pub owner_task_id: u64,
    /// View origin in elements from `buffer.addr`.
    pub start_offset: u64,
    /// Overlap epoch.
    pub version: i32,
    /// Dimensions used.
    pub ndims: u32,
    /// `DataType` byte.
    pub dtype: u8,
    /// No dependency lookup for this tensor.
    pub manual_dep: bool,
    /// Row-major strides.
    pub is_contiguous: bool,
    /// `AddressSpace` byte.
    pub address_space: u8,
    /// Shape, per dimension.
    pub shapes: [u32; MAX_DIMS],
    /// `1 + sum (shape_i - 1) stride_i`.
    pub extent_elem_cache: u64,
    /// Element strides, each > 0.
    pub strides: [u32; MAX_DIMS],
    /// Reserved bytes.
    pub reserved: [u8; 36],
}

impl Default for ChipTensor {
    fn default() -> Self {
        ChipTensor {
            buffer: BufferHandle::default(),
            owner_task_id: INVALID_TASK,
            start_offset: 0,
            version: 0,
            ndims: 0,
            dtype: 0,
            manual_dep: false,
            is_contiguous: true,
            address_space: 0,
            shapes: [0; MAX_DIMS],
            extent_elem_cache: 0,
            strides: [0; MAX_DIMS],
            reserved: [0; 36],
        }
    }
}

/// `TensorCreateInfo`: 64 bytes, laid out like a `ChipTensor`'s first line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorCreateInfo {
    pub(crate) initial_value: u64,
    pub(crate) has_initial_value: bool,
    pub(crate) reserved1: [u8; 7],
    pub(crate) reserved2: u64,
    pub(crate) start_offset: u64,
    pub(crate) version: i32,
    pub(crate) ndims: u32,
    pub(crate) dtype: u8,
    pub(crate) manual_dep: bool,
    pub(crate) is_contiguous: bool,
    pub(crate) reserved3: u8,
    pub(crate) shapes: [u32; MAX_DIMS],
}

/// `CommContext`: 1056 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommContext {
    /// Workspace address (0 on pto).
    pub work_space: u64,
    /// Workspace bytes.
    pub work_space_size: u64,
    /// This rank in the domain.
    pub rank_id: u32,
    /// Ranks in the domain.
    pub rank_num: u32,
    /// Window bytes per rank.
    pub win_size: u64,
    /// Rank i's window as mapped in this process.
    pub windows_in: [u64; COMM_MAX_RANKS],
    /// The same (pto has one window per domain).
    pub windows_out: [u64; COMM_MAX_RANKS],
}

/// `DeferredCompletionEntry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CompletionEntry {
    pub(crate) addr: u64,
    pub(crate) backend_cookie: u64,
    pub(crate) expected_value: u32,
    pub(crate) engine: u32,
    pub(crate) completion_type: i32,
    pub(crate) pad: u32,
}

/// `DeferredCompletionSlab`.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct CompletionSlab {
    pub(crate) count: u32,
    pub(crate) error_code: i32,
    pub(crate) entries: [CompletionEntry; MAX_COMPLETIONS],
}

/// `AsyncCtx`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsyncCtx {
    pub(crate) completion_count: *mut u32,
    pub(crate) completion_error_code: *mut i32,
    pub(crate) completion_entries: *mut CompletionEntry,
    pub(crate) completion_capacity: u32,
    pub(crate) task_token: u64,
}

/// `LocalContext`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalContext {
    pub(crate) block_idx: i32,
    pub(crate) block_num: i32,
    pub(crate) async_ctx: AsyncCtx,
}

/// `GlobalContext`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GlobalContext {
    pub(crate) sub_block_id: i32,
    pub(crate) dma_workspace: [u64; 2],
}

/// `PtoSimplerTensorArg`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorArg {
    pub(crate) desc: *const c_void,
    pub(crate) tag: i32,
    pub(crate) reserved: i32,
}

/// `PtoSimplerSubmit`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Submit {
    pub(crate) kind: i32,
    pub(crate) kernel_ids: [i32; 3],
    pub(crate) tensor_count: i32,
    pub(crate) scalar_count: i32,
    pub(crate) tensors: *const TensorArg,
    pub(crate) scalars: *const u64,
    pub(crate) deps: *const u64,
    pub(crate) dep_kinds: *const u8,
    pub(crate) dep_count: u32,
    pub(crate) block_num: i32,
    pub(crate) require_sync_start: u8,
    pub(crate) allow_early_resolve: u8,
    pub(crate) predicate_op: u8,
    pub(crate) reserved: u8,
    pub(crate) timing_slot: i32,
    pub(crate) predicate_tensor: *const ChipTensor,
    pub(crate) predicate_ndims: u32,
    pub(crate) predicate_indices: [u32; MAX_DIMS],
    pub(crate) predicate_target: i64,
}

/// `TaskOutputTensors` (pto's layout: id, count, pointers).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct TaskOutputs {
    pub(crate) task_id: u64,
    pub(crate) output_count: u32,
    pub(crate) reserved: u32,
    pub(crate) tensors: [*const ChipTensor; MAX_TENSOR_ARGS],
}

/// `PTO2Runtime`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Runtime {
    pub(crate) ops: *const Ops,
    pub(crate) pending_scope_mode: u8,
    pub(crate) implementation: *mut c_void,
}

/// `PtoSimplerOps`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Ops {
    pub(crate) abi_version: u32,
    pub(crate) size: u32,
    pub(crate) submit: unsafe extern "C" fn(*mut Runtime, *const Submit, *mut TaskOutputs) -> i32,
    pub(crate) scope_begin: unsafe extern "C" fn(*mut Runtime, u8, *const c_char, i32),
    pub(crate) scope_end: unsafe extern "C" fn(*mut Runtime),
    pub(crate) orchestration_done: unsafe extern "C" fn(*mut Runtime),
    pub(crate) is_fatal: unsafe extern "C" fn(*mut Runtime) -> bool,
    pub(crate) report_fatal: unsafe extern "C" fn(*mut Runtime, i32, *const c_char, *const c_char),
    pub(crate) log: unsafe extern "C" fn(*mut Runtime, i32, *const c_char, *const c_char),
    pub(crate) get_tensor_data:
        unsafe extern "C" fn(*mut Runtime, *const ChipTensor, u32, *const u32) -> u64,
    pub(crate) set_tensor_data:
        unsafe extern "C" fn(*mut Runtime, *const ChipTensor, u32, *const u32, u64),
    pub(crate) available_cluster_count: unsafe extern "C" fn(*mut Runtime) -> i32,
    pub(crate) available_aiv_count: unsafe extern "C" fn(*mut Runtime) -> i32,
}

/// `kernel_entry`.
pub(crate) type KernelEntry = unsafe extern "C" fn(*mut i64);
/// `pto_simpler_bind_runtime`.
pub(crate) type BindRuntime = unsafe extern "C" fn(*mut Runtime);
/// `pto_simpler_abi_version`.
pub(crate) type AbiVersion = unsafe extern "C" fn() -> i32;
/// `pto_simpler_call_orchestration`.
pub(crate) type CallOrchestration = unsafe extern "C" fn(
    *mut c_void,
    i32,
    *const ChipTensor,
    i32,
    *const u64,
    i32,
    *mut i32,
    *mut c_char,
    u32,
) -> i32;

// The layouts the headers pin with static_asserts, pinned again on this side.
const _: () = {
    assert!(size_of::<ChipTensor>() == 128);
    assert!(offset_of!(ChipTensor, owner_task_id) == 16);
    assert!(offset_of!(ChipTensor, start_offset) == 24);
    assert!(offset_of!(ChipTensor, version) == 32);
    assert!(offset_of!(ChipTensor, ndims) == 36);
    assert!(offset_of!(ChipTensor, dtype) == 40);
    assert!(offset_of!(ChipTensor, manual_dep) == 41);
    assert!(offset_of!(ChipTensor, is_contiguous) == 42);
    assert!(offset_of!(ChipTensor, address_space) == 43);
    assert!(offset_of!(ChipTensor, shapes) == 44);
    assert!(offset_of!(ChipTensor, extent_elem_cache) == 64);
    assert!(offset_of!(ChipTensor, strides) == 72);
    assert!(size_of::<TensorCreateInfo>() == 64);
    assert!(offset_of!(TensorCreateInfo, start_offset) == 24);
    assert!(offset_of!(TensorCreateInfo, ndims) == 36);
    assert!(offset_of!(TensorCreateInfo, dtype) == 40);
    assert!(offset_of!(TensorCreateInfo, shapes) == 44);
    assert!(size_of::<CommContext>() == 1056);
    assert!(offset_of!(CommContext, rank_id) == 16);
    assert!(offset_of!(CommContext, rank_num) == 20);
    assert!(offset_of!(CommContext, win_size) == 24);
    assert!(offset_of!(CommContext, windows_in) == 32);
    assert!(offset_of!(CommContext, windows_out) == 544);
    assert!(size_of::<CompletionEntry>() == 32);
    assert!(size_of::<CompletionSlab>().is_multiple_of(64));
    assert!(size_of::<LocalContext>() == 48);
    assert!(offset_of!(LocalContext, async_ctx) == 8);
    assert!(size_of::<GlobalContext>() == 24);
    assert!(offset_of!(TaskOutputs, tensors) == 16);
    assert!(size_of::<TensorArg>() == 16);
};

/// `DataType` byte → pto's dtype, for the element types pto can hold.
pub(crate) fn dtype(code: u8) -> Option<pto_core::DType> {
    use pto_core::DType;
    Some(match code {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::I32,
        3 => DType::I16,
        4 => DType::I8,
        5 | 12..=14 => DType::U8,
        6 => DType::Bf16,
        7 => DType::I64,
        8 => DType::U64,
        9 => DType::U16,
        10 => DType::U32,
        11 => DType::Bool,
        _ => return None,
    })
}

/// Bytes per element of a `DataType` byte (0 for an unknown one).
pub(crate) fn element_size(code: u8) -> u64 {
    match code {
        0 | 2 | 10 => 4,
        1 | 3 | 6 | 9 => 2,
        7 | 8 => 8,
        4 | 5 | 11..=14 => 1,
        _ => 0,
    }
}

/// The `DataType` byte of a simpler dtype name (`float32`, `FLOAT32`, ...).
pub fn dtype_code(name: &str) -> Option<u8> {
    Some(match name.to_ascii_lowercase().as_str() {
        "float32" | "f32" => 0,
        "float16" | "f16" => 1,
        "int32" | "i32" => 2,
        "int16" | "i16" => 3,
        "int8" | "i8" => 4,
        "uint8" | "u8" => 5,
        "bfloat16" | "bf16" => 6,
        "int64" | "i64" => 7,
        "uint64" | "u64" => 8,
        "uint16" | "u16" => 9,
        "uint32" | "u32" => 10,
        "bool" => 11,
        _ => return None,
    })
}
