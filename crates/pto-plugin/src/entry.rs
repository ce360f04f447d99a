//! The loader's side of the C ABI: the table of entry points a plugin calls through (`API`),
//! and the calls into a plugin's functions. Each entry point checks its pointers, turns C
//! arguments into Rust values, runs the safe logic of `call`, catches any panic, and returns a
//! code; the text of a failure is kept per thread for `pto_last_error`.
//!
//! A handle's `private` pointer leads to a `Slot`: a tag saying which kind of handle it is
//! (registry, program, kernel), then that call's state. The slot lives on the stack of the
//! Rust function that called into the plugin, for exactly that call.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use pto_core::{KernelCtx, KernelError, Orch, OrchError};

use crate::abi::{code, Api, Arg, Handle, KernelFn, ProgramFn, RegisterFn, TaskOpts, View};
use crate::abi::{AbiVersionFn, TeardownFn, ABI_VERSION};
use crate::call::{err, ApiResult, KernelCall, ProgramCall, Registration};

const TAG_REGISTRY: u32 = 0x7074_6f52;
const TAG_PROGRAM: u32 = 0x7074_6f50;
const TAG_KERNEL: u32 = 0x7074_6f4b;

/// What a handle's `private` points to: the tag first (`repr(C)`), whatever `T` is.
#[repr(C)]
struct Slot<T> {
    tag: u32,
    state: T,
}

type H = *mut Handle;
type Str = *const c_char;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

unsafe extern "C" fn last_error() -> Str {
    // The pointer stays valid until the next failing call on this thread replaces the string.
    LAST.with(|l| l.borrow().as_ptr())
}

/// The state behind handle `h` if it is a live handle of kind `tag`.
///
/// # Safety
///
/// `h` is NULL or a handle the loader passed to the plugin in a call that has not returned
/// (the header says handles are valid only during that call).
unsafe fn state<'h, T>(h: H, tag: u32) -> ApiResult<&'h T> {
    if h.is_null() {
        return err(code::ARG, "the handle is NULL");
    }
    // SAFETY: `h` is non-null and, per the contract, points to a live `Handle`.
    let handle = unsafe { &*h };
    if !std::ptr::eq(handle.api, &API) || handle.private.is_null() {
        return err(
            code::ARG,
            "not a handle the loader gave (or one used after its call)",
        );
    }
    // SAFETY: `private` points to a live `Slot<_>` whose first field (repr(C)) is the u32 tag.
    let t = unsafe { *handle.private.cast::<u32>() };
    if t != tag {
        let what = |t| match t {
            TAG_REGISTRY => "a pto_registry",
            TAG_PROGRAM => "a pto_orch",
            TAG_KERNEL => "a pto_kernel_ctx",
            _ => "not a handle",
        };
        return err(
            code::ARG,
            format!("{} was passed where {} belongs", what(t), what(tag)),
        );
    }
    // SAFETY: the tag says the slot holds a `T` (each tag is used with one state type).
    Ok(unsafe { &(*handle.private.cast::<Slot<T>>()).state })
}

/// A C string argument as `&str`.
///
/// # Safety
///
/// `p` is NULL or a NUL-terminated string that outlives the call.
unsafe fn text<'s>(p: Str, what: &str) -> ApiResult<&'s str> {
    if p.is_null() {
        return err(code::ARG, format!("{what} is NULL"));
    }
    // SAFETY: non-null and NUL-terminated per the contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_or_else(|_| err(code::ARG, format!("{what} is not UTF-8")), Ok)
}

/// `n` bytes at `p` to read.
///
/// # Safety
///
/// When `n > 0`, `p` is NULL or points to `n` readable bytes that outlive the call.
unsafe fn bytes_in<'s>(p: *const c_void, n: u64, what: &str) -> ApiResult<&'s [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return err(code::ARG, format!("{what} is NULL"));
    }
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)
        .map_or_else(|| err(code::RANGE, format!("{n} bytes is too large")), Ok)?;
    // SAFETY: per the contract, `n` readable bytes at a non-null `p`.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// `n` bytes at `p` to write.
///
/// # Safety
///
/// When `n > 0`, `p` is NULL or points to `n` writable bytes, not aliased during the call.
unsafe fn bytes_out<'s>(p: *mut c_void, n: u64, what: &str) -> ApiResult<&'s mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return err(code::ARG, format!("{what} is NULL"));
    }
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)
        .map_or_else(|| err(code::RANGE, format!("{n} bytes is too large")), Ok)?;
    // SAFETY: per the contract, `n` writable bytes at a non-null `p`, not aliased.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) })
}

/// Stores `v` through an out-pointer.
///
/// # Safety
///
/// `p` is NULL or valid for a write of a `T`.
unsafe fn put_out<T>(p: *mut T, v: T, what: &str) -> ApiResult<()> {
    if p.is_null() {
        return err(code::ARG, format!("{what} is NULL"));
    }
    // SAFETY: non-null and writable per the contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Runs an entry point's body: a panic becomes `PTO_ERR_INTERNAL`, a failure sets the thread's
/// last error (and `note`s it on the call's state), success returns `PTO_OK`.
fn run(body: impl FnOnce() -> ApiResult<()>) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|p| {
        let m = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic in the loader".into());
        err(code::INTERNAL, format!("internal error: {m}"))
    });
    match r {
        Ok(()) => code::OK,
        Err(e) => {
            set_last(&e.msg);
            e.code
        }
    }
}

fn on_kernel(h: H, f: impl FnOnce(&KernelCall<'_, '_>) -> ApiResult<()>) -> c_int {
    run(|| {
        // SAFETY: `h` comes from the plugin, which the header binds to pass live handles.
        let k = unsafe { state::<KernelCall<'_, '_>>(h, TAG_KERNEL) }?;
        f(k).inspect_err(|e| k.note(e))
    })
}

fn on_program(h: H, f: impl FnOnce(&ProgramCall<'_, '_>) -> ApiResult<()>) -> c_int {
    run(|| {
        // SAFETY: as in `on_kernel`.
        let p = unsafe { state::<ProgramCall<'_, '_>>(h, TAG_PROGRAM) }?;
        f(p).inspect_err(|e| p.note(e))
    })
}

fn on_registry(h: H, f: impl FnOnce(&mut Registration) -> ApiResult<()>) -> c_int {
    run(|| {
        // SAFETY: as in `on_kernel`.
        let r = unsafe { state::<RefCell<Registration>>(h, TAG_REGISTRY) }?;
        let mut r = r
            .try_borrow_mut()
            .map_or_else(|_| err(code::STATE, "registration re-entered"), Ok)?;
        f(&mut r).inspect_err(|e| {
            if r.first_error.is_none() {
                r.first_error = Some(e.msg.clone());
            }
        })
    })
}

// ---- registration -------------------------------------------------------------------------

unsafe extern "C" fn register_kernel(h: H, name: Str, kind: i32, f: Option<KernelFn>) -> c_int {
    on_registry(h, |r| {
        // SAFETY: the header's contract for string arguments.
        let name = unsafe { text(name, "the kernel's name") }?;
        r.kernel(name, kind, f)
    })
}

unsafe extern "C" fn register_program(h: H, name: Str, f: Option<ProgramFn>) -> c_int {
    on_registry(h, |r| {
        // SAFETY: as above.
        let name = unsafe { text(name, "the program's name") }?;
        r.program(name, f)
    })
}

unsafe extern "C" fn declare_buffer(h: H, name: Str, dtype: i32, count: u64) -> c_int {
    on_registry(h, |r| {
        // SAFETY: as above.
        let name = unsafe { text(name, "the buffer's name") }?;
        r.buffer(name, dtype, count)
    })
}

// ---- programs ---------------------------------------------------------------------------

unsafe extern "C" fn orch_rank(h: H, out: *mut u32) -> c_int {
    on_program(h, |p| {
        // SAFETY: `out` is an out-pointer per the header.
        unsafe { put_out(out, p.rank(), "rank") }
    })
}

unsafe extern "C" fn orch_nranks(h: H, out: *mut u32) -> c_int {
    on_program(h, |p| {
        // SAFETY: `out` is an out-pointer per the header.
        unsafe { put_out(out, p.nranks(), "nranks") }
    })
}

unsafe extern "C" fn window_tensor(h: H, buffer: Str, out: *mut u64) -> c_int {
    on_program(h, |p| {
        // SAFETY: the header's contract for strings and out-pointers.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        let t = p.window_tensor(b)?;
        // SAFETY: as above.
        unsafe { put_out(out, t, "the tensor") }
    })
}

unsafe extern "C" fn tensor_new(
    h: H,
    dtype: i32,
    ndim: u32,
    shape: *const u64,
    out: *mut u64,
) -> c_int {
    on_program(h, |p| {
        let n = (ndim as usize).min(crate::abi::MAX_DIMS) as u64 * 8;
        // SAFETY: the header: `shape` holds `ndim` dims (we read at most PTO_MAX_DIMS).
        let bytes = unsafe { bytes_in(shape.cast(), n, "shape") }?;
        let dims: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let mut full = [0u64; crate::abi::MAX_DIMS];
        full[..dims.len()].copy_from_slice(&dims);
        let t = p.tensor_new(dtype, ndim, &full)?;
        // SAFETY: out-pointer per the header.
        unsafe { put_out(out, t, "the tensor") }
    })
}

unsafe extern "C" fn tensor_write(h: H, t: u64, src: *const c_void, bytes: u64) -> c_int {
    on_program(h, |p| {
        // SAFETY: the header: `bytes` readable bytes at `src`.
        let src = unsafe { bytes_in(src, bytes, "src") }?;
        p.tensor_write(t, src)
    })
}

unsafe extern "C" fn tensor_read(h: H, t: u64, dst: *mut c_void, bytes: u64) -> c_int {
    on_program(h, |p| {
        let data = p.tensor_read(t, bytes)?;
        // SAFETY: the header: `bytes` writable bytes at `dst`.
        let dst = unsafe { bytes_out(dst, bytes, "dst") }?;
        dst.copy_from_slice(&data);
        Ok(())
    })
}

unsafe extern "C" fn submit(
    h: H,
    kernel: Str,
    args: *const Arg,
    nargs: u32,
    opts: *const TaskOpts,
    task: *mut u64,
) -> c_int {
    on_program(h, |p| {
        // SAFETY: the header's contract for strings.
        let kernel = unsafe { text(kernel, "the kernel's name") }?;
        let args: &[Arg] = if nargs == 0 {
            &[]
        } else if args.is_null() {
            return err(code::ARG, format!("args is NULL with nargs {nargs}"));
        } else {
            // SAFETY: the header: `nargs` arguments at `args`.
            unsafe { std::slice::from_raw_parts(args, nargs as usize) }
        };
        let opts = if opts.is_null() {
            None
        } else {
            // SAFETY: a non-null `opts` points to a pto_task_opts for the call.
            let o = unsafe { &*opts };
            let after: &[u64] = if o.nafter == 0 {
                &[]
            } else if o.after.is_null() {
                return err(
                    code::ARG,
                    format!("opts.after is NULL with nafter {}", o.nafter),
                );
            } else {
                // SAFETY: the header: `nafter` tasks at `after`.
                unsafe { std::slice::from_raw_parts(o.after, o.nafter as usize) }
            };
            Some((o, after))
        };
        let t = p.submit(kernel, args, opts)?;
        if !task.is_null() {
            // SAFETY: a non-null out-pointer per the header.
            unsafe { put_out(task, t, "task") }?;
        }
        Ok(())
    })
}

unsafe extern "C" fn task_output(h: H, task: u64, index: u32, out: *mut u64) -> c_int {
    on_program(h, |p| {
        let t = p.task_output(task, index)?;
        // SAFETY: out-pointer per the header.
        unsafe { put_out(out, t, "the tensor") }
    })
}

// ---- kernels ------------------------------------------------------------------------------

unsafe extern "C" fn rank(h: H, out: *mut u32) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: `out` is an out-pointer per the header.
        unsafe { put_out(out, k.rank(), "rank") }
    })
}

unsafe extern "C" fn nranks(h: H, out: *mut u32) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: `out` is an out-pointer per the header.
        unsafe { put_out(out, k.nranks(), "nranks") }
    })
}

unsafe extern "C" fn block(h: H, idx: *mut u32, num: *mut u32) -> c_int {
    on_kernel(h, |k| {
        let (i, n) = k.block();
        // SAFETY: out-pointers per the header.
        unsafe { put_out(idx, i, "idx") }?;
        // SAFETY: as above.
        unsafe { put_out(num, n, "num") }
    })
}

unsafe extern "C" fn num_args(h: H, tensors: *mut u32, scalars: *mut u32) -> c_int {
    on_kernel(h, |k| {
        let (t, s) = k.num_args();
        if !tensors.is_null() {
            // SAFETY: a non-null out-pointer.
            unsafe { put_out(tensors, t, "tensors") }?;
        }
        if !scalars.is_null() {
            // SAFETY: as above.
            unsafe { put_out(scalars, s, "scalars") }?;
        }
        Ok(())
    })
}

unsafe extern "C" fn tensor(h: H, index: u32, chunk: i32, out: *mut View) -> c_int {
    on_kernel(h, |k| {
        let v = k.tensor(index, chunk != 0)?;
        // SAFETY: out-pointer per the header.
        unsafe { put_out(out, v, "the view") }
    })
}

unsafe extern "C" fn scalar(h: H, index: u32, dtype: i32, out: *mut c_void) -> c_int {
    on_kernel(h, |k| {
        let s = k.scalar(index, dtype)?;
        if out.is_null() {
            return err(code::ARG, "out is NULL");
        }
        // The value in the scalar's own type (`k.scalar` checked it is the dtype asked for).
        let bytes = s.bits().to_ne_bytes();
        let n = s.dtype().size();
        let at = if cfg!(target_endian = "big") {
            8 - n
        } else {
            0
        };
        // SAFETY: the header's typed pto_scalar_* wrappers pass a pointer to a value of the
        // dtype they ask for, so `out` is valid for `n` bytes (4 or 8), unaligned writes are
        // fine for a byte copy, and `bytes` is ours.
        unsafe { std::ptr::copy_nonoverlapping(bytes[at..].as_ptr(), out.cast::<u8>(), n) };
        Ok(())
    })
}

unsafe extern "C" fn window_ptr(
    h: H,
    buffer: Str,
    ptr: *mut *mut c_void,
    bytes: *mut u64,
) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: the header's contract for strings.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        let (p, n) = k.window_ptr(b)?;
        // SAFETY: out-pointer per the header.
        unsafe { put_out(ptr, p.cast::<c_void>(), "ptr") }?;
        if !bytes.is_null() {
            // SAFETY: a non-null out-pointer.
            unsafe { put_out(bytes, n, "bytes") }?;
        }
        Ok(())
    })
}

unsafe extern "C" fn put(
    h: H,
    rank: u32,
    buffer: Str,
    off: u64,
    src: *const c_void,
    n: u64,
) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: the header's contract for strings and source buffers.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        // SAFETY: as above.
        let src = unsafe { bytes_in(src, n, "src") }?;
        k.put(rank, b, off, src)
    })
}

unsafe extern "C" fn get(
    h: H,
    rank: u32,
    buffer: Str,
    off: u64,
    dst: *mut c_void,
    n: u64,
) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: the header's contract for strings and destination buffers.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        // SAFETY: as above.
        let dst = unsafe { bytes_out(dst, n, "dst") }?;
        k.get(rank, b, off, dst)
    })
}

unsafe extern "C" fn notify(h: H, rank: u32, buffer: Str, off: u64, value: u32) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: the header's contract for strings.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        k.notify(rank, b, off, value)
    })
}

unsafe extern "C" fn wait_until(h: H, buffer: Str, off: u64, value: u32) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: as above.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        k.wait_until(b, off, value)
    })
}

unsafe extern "C" fn barrier(h: H) -> c_int {
    on_kernel(h, |k| k.barrier())
}

unsafe extern "C" fn fail(h: H, message: Str) -> c_int {
    let rc = on_kernel(h, |k| {
        // SAFETY: as above; a NULL or non-UTF-8 message still fails the task.
        let m = unsafe { text(message, "the message") }
            .map(str::to_string)
            .unwrap_or_else(|e| format!("pto_fail: {}", e.msg));
        k.fail(&m);
        err(code::FAILED, m)
    });
    // A bad handle reports its own code; otherwise pto_fail always returns PTO_ERR_FAILED.
    if rc == code::FAILED || rc == code::ARG {
        rc
    } else {
        code::FAILED
    }
}

unsafe extern "C" fn defer_until(h: H, buffer: Str, off: u64, value: u32) -> c_int {
    on_kernel(h, |k| {
        // SAFETY: as above.
        let b = unsafe { text(buffer, "the buffer's name") }?;
        k.defer_until(b, off, value)
    })
}

/// The table every handle carries.
pub(crate) static API: Api = Api {
    abi_version: ABI_VERSION,
    size: std::mem::size_of::<Api>() as u32,
    last_error,
    register_kernel,
    register_program,
    declare_buffer,
    orch_rank,
    orch_nranks,
    window_tensor,
    tensor_new,
    tensor_write,
    tensor_read,
    submit,
    task_output,
    rank,
    nranks,
    block,
    num_args,
    tensor,
    scalar,
    window_ptr,
    put,
    get,
    notify,
    wait_until,
    barrier,
    fail,
    defer_until,
};

fn handle<T>(slot: &Slot<T>) -> Handle {
    Handle {
        api: &API,
        private: std::ptr::from_ref(slot).cast_mut().cast(),
    }
}

/// Calls a plugin's `pto_plugin_register` and returns what it registered, or why it failed.
pub(crate) fn call_register(f: RegisterFn) -> (c_int, Registration) {
    let slot = Slot {
        tag: TAG_REGISTRY,
        state: RefCell::new(Registration::default()),
    };
    let mut h = handle(&slot);
    // SAFETY: `f` is the library's `pto_plugin_register` (found by dlsym in a library that is
    // still loaded), called with a handle that lives until it returns.
    let rc = unsafe { f(&mut h) };
    (rc, slot.state.into_inner())
}

/// Calls an optional `pto_plugin_abi_version`.
pub(crate) fn call_abi_version(f: AbiVersionFn) -> u32 {
    // SAFETY: the library's `pto_plugin_abi_version` (found by dlsym in a loaded library),
    // which takes nothing.
    unsafe { f() }
}

/// Calls an optional `pto_plugin_teardown`.
pub(crate) fn call_teardown(f: TeardownFn) {
    // SAFETY: the library's `pto_plugin_teardown`, called once, before it is unloaded.
    unsafe { f() }
}

/// Runs a plugin kernel for one task (block).
pub(crate) fn call_kernel(f: KernelFn, ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let slot = Slot {
        tag: TAG_KERNEL,
        state: KernelCall::new(ctx),
    };
    let mut h = handle(&slot);
    // SAFETY: a kernel function the plugin registered; its library stays loaded while the
    // registry that holds this kernel lives (the kernel's closure holds the plugin). The handle
    // lives until the call returns.
    let rc = unsafe { f(&mut h) };
    slot.state.finish(rc)
}

/// Runs a plugin program's orchestration on a chip.
pub(crate) fn call_program(f: ProgramFn, name: &str, orch: &mut Orch<'_>) -> Result<(), OrchError> {
    let slot = Slot {
        tag: TAG_PROGRAM,
        state: ProgramCall::new(orch),
    };
    let mut h = handle(&slot);
    // SAFETY: as in `call_kernel`, for a program function.
    let rc = unsafe { f(&mut h) };
    slot.state.finish(name, rc)
}
