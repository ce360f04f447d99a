//! The C ABI's types, mirrored from `include/pto.h` (`#[repr(C)]`, same field order). No logic
//! lives here: `entry` implements the table, `call` what each entry does.

use std::ffi::{c_char, c_int, c_void};

/// `PTO_ABI_VERSION` of `include/pto.h`.
pub const ABI_VERSION: u32 = 1;

/// `PTO_MAX_DIMS`.
pub(crate) const MAX_DIMS: usize = 8;

/// Error codes (`PTO_OK`, `PTO_ERR_*`).
pub(crate) mod code {
    pub(crate) const OK: i32 = 0;
    pub(crate) const ARG: i32 = -1;
    pub(crate) const NOT_FOUND: i32 = -2;
    pub(crate) const RANGE: i32 = -3;
    pub(crate) const DTYPE: i32 = -4;
    pub(crate) const MODE: i32 = -5;
    pub(crate) const COMM: i32 = -6;
    pub(crate) const TIMEOUT: i32 = -7;
    pub(crate) const DUPLICATE: i32 = -8;
    pub(crate) const STATE: i32 = -9;
    pub(crate) const FAILED: i32 = -10;
    pub(crate) const INTERNAL: i32 = -11;

    /// The name `pto_strerror` gives a code.
    pub(crate) fn name(code: i32) -> &'static str {
        match code {
            OK => "ok",
            ARG => "invalid argument",
            NOT_FOUND => "not found",
            RANGE => "out of range",
            DTYPE => "dtype mismatch",
            MODE => "access mode",
            COMM => "communication failed",
            TIMEOUT => "timed out",
            DUPLICATE => "duplicate",
            STATE => "not allowed here",
            FAILED => "failed",
            _ => "internal error",
        }
    }
}

/// Argument kinds (`pto_arg_kind`).
pub(crate) mod arg_kind {
    pub(crate) const IN: i32 = 0;
    pub(crate) const OUT: i32 = 1;
    pub(crate) const INOUT: i32 = 2;
    pub(crate) const NO_DEP: i32 = 3;
    pub(crate) const OUT_NEW: i32 = 4;
    pub(crate) const SCALAR: i32 = 5;
}

/// `pto_registry`, `pto_orch` and `pto_kernel_ctx`: the table, and the loader's state.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) api: *const Api,
    pub(crate) private: *mut c_void,
}

/// `pto_kernel_fn`.
pub(crate) type KernelFn = unsafe extern "C" fn(*mut Handle) -> c_int;
/// `pto_program_fn`.
pub(crate) type ProgramFn = unsafe extern "C" fn(*mut Handle) -> c_int;
/// `pto_plugin_register`.
pub(crate) type RegisterFn = unsafe extern "C" fn(*mut Handle) -> c_int;
/// `pto_plugin_abi_version`.
pub(crate) type AbiVersionFn = unsafe extern "C" fn() -> u32;
/// `pto_plugin_teardown`.
pub(crate) type TeardownFn = unsafe extern "C" fn();

/// `pto_arg`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Arg {
    pub(crate) kind: i32,
    pub(crate) dtype: i32,
    pub(crate) tensor: u64,
    pub(crate) ndim: u32,
    pub(crate) reserved: u32,
    pub(crate) shape: [u64; MAX_DIMS],
    /// The header's `union { double f64; int64_t i64; uint64_t u64; }`: eight bytes, read
    /// here as its bits (`f64::from_bits`, `as i64`), which is the same layout without a union.
    pub(crate) scalar: u64,
}

/// `pto_task_opts`.
#[repr(C)]
pub(crate) struct TaskOpts {
    pub(crate) blocks: u32,
    pub(crate) deferred: u32,
    pub(crate) after: *const u64,
    pub(crate) nafter: u32,
    pub(crate) reserved: u32,
}

/// `pto_view`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct View {
    pub(crate) data: *mut c_void,
    pub(crate) dtype: i32,
    pub(crate) ndim: u32,
    pub(crate) shape: [u64; MAX_DIMS],
    pub(crate) strides: [u64; MAX_DIMS],
    pub(crate) count: u64,
    pub(crate) writable: u32,
    pub(crate) contiguous: u32,
}

impl Default for Handle {
    fn default() -> Self {
        Handle {
            api: std::ptr::null(),
            private: std::ptr::null_mut(),
        }
    }
}

type H = *mut Handle;
type Str = *const c_char;

/// `pto_api`: the loader's entry points, in the header's order.
#[repr(C)]
pub(crate) struct Api {
    pub(crate) abi_version: u32,
    pub(crate) size: u32,
    pub(crate) last_error: unsafe extern "C" fn() -> Str,
    pub(crate) register_kernel: unsafe extern "C" fn(H, Str, i32, Option<KernelFn>) -> c_int,
    pub(crate) register_program: unsafe extern "C" fn(H, Str, Option<ProgramFn>) -> c_int,
    pub(crate) declare_buffer: unsafe extern "C" fn(H, Str, i32, u64) -> c_int,
    pub(crate) orch_rank: unsafe extern "C" fn(H, *mut u32) -> c_int,
    pub(crate) orch_nranks: unsafe extern "C" fn(H, *mut u32) -> c_int,
    pub(crate) window_tensor: unsafe extern "C" fn(H, Str, *mut u64) -> c_int,
    pub(crate) tensor_new: unsafe extern "C" fn(H, i32, u32, *const u64, *mut u64) -> c_int,
    pub(crate) tensor_write: unsafe extern "C" fn(H, u64, *const c_void, u64) -> c_int,
    pub(crate) tensor_read: unsafe extern "C" fn(H, u64, *mut c_void, u64) -> c_int,
    pub(crate) submit:
        unsafe extern "C" fn(H, Str, *const Arg, u32, *const TaskOpts, *mut u64) -> c_int,
    pub(crate) task_output: unsafe extern "C" fn(H, u64, u32, *mut u64) -> c_int,
    pub(crate) rank: unsafe extern "C" fn(H, *mut u32) -> c_int,
    pub(crate) nranks: unsafe extern "C" fn(H, *mut u32) -> c_int,
    pub(crate) block: unsafe extern "C" fn(H, *mut u32, *mut u32) -> c_int,
    pub(crate) num_args: unsafe extern "C" fn(H, *mut u32, *mut u32) -> c_int,
    pub(crate) tensor: unsafe extern "C" fn(H, u32, i32, *mut View) -> c_int,
    pub(crate) scalar: unsafe extern "C" fn(H, u32, i32, *mut c_void) -> c_int,
    pub(crate) window_ptr: unsafe extern "C" fn(H, Str, *mut *mut c_void, *mut u64) -> c_int,
    pub(crate) put: unsafe extern "C" fn(H, u32, Str, u64, *const c_void, u64) -> c_int,
    pub(crate) get: unsafe extern "C" fn(H, u32, Str, u64, *mut c_void, u64) -> c_int,
    pub(crate) notify: unsafe extern "C" fn(H, u32, Str, u64, u32) -> c_int,
    pub(crate) wait_until: unsafe extern "C" fn(H, Str, u64, u32) -> c_int,
    pub(crate) barrier: unsafe extern "C" fn(H) -> c_int,
    pub(crate) fail: unsafe extern "C" fn(H, Str) -> c_int,
    pub(crate) defer_until: unsafe extern "C" fn(H, Str, u64, u32) -> c_int,
}
