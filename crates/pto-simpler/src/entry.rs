//! The foreign side: the table of operations orchestrations call, the calls into
//! orchestrations and kernels, and the raw memory a kernel names (its completion counters, a
//! new output's initial value). Everything unsafe of the bridge is here; what each operation
//! does is `runtime` (safe).

#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::OnceLock;

use pto_core::{FnCondition, Poll};

use crate::abi::{
    self, AbiVersion, AsyncCtx, BindRuntime, CallOrchestration, ChipTensor, CompletionEntry,
    CompletionSlab, GlobalContext, LocalContext, Ops, Runtime, Submit, TaskOutputs, TensorArg,
    TensorCreateInfo, ABI_VERSION, GLOBAL_CONTEXT_INDEX, LOCAL_CONTEXT_INDEX, MAX_COMPLETIONS,
};
use crate::kernel::Payload;
use crate::runtime::{ArgDesc, Session, SubmitSpec};

static OPS: Ops = Ops {
    abi_version: ABI_VERSION as u32,
    size: std::mem::size_of::<Ops>() as u32,
    submit: op_submit,
    scope_begin: op_scope_begin,
    scope_end: op_scope_end,
    orchestration_done: op_done,
    is_fatal: op_is_fatal,
    report_fatal: op_report_fatal,
    log: op_log,
    get_tensor_data: op_get_tensor_data,
    set_tensor_data: op_set_tensor_data,
    available_cluster_count: op_clusters,
    available_aiv_count: op_aivs,
};

/// The session a runtime handle belongs to.
///
/// # Safety
///
/// `rt` must be the handle [`call_orchestration`] made, during that call (its `implementation`
/// points to the live session, which nothing else uses while the orchestration runs).
unsafe fn session<'x>(rt: *mut Runtime) -> Option<&'x mut Session<'x, 'x>> {
    if rt.is_null() {
        return None;
    }
    // SAFETY: per the contract, `rt` is valid and `implementation` is the session, exclusively
    // ours for the callback's duration (the orchestration calls back on the one thread that
    // runs it, synchronously).
    unsafe { (*rt).implementation.cast::<Session<'x, 'x>>().as_mut() }
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the header passes NUL-terminated strings it formatted (or __FUNCTION__ / a file
    // name), valid for the call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Runs `f` on the session, turning a panic into a fatal error (a panic must not unwind into
/// C++).
fn with_session<R>(rt: *mut Runtime, default: R, f: impl FnOnce(&mut Session<'_, '_>) -> R) -> R {
    // SAFETY: every op is only reachable through the table handed to the orchestration inside
    // `call_orchestration`, which makes `rt` as `session` requires.
    let Some(s) = (unsafe { session(rt) }) else {
        return default;
    };
    match catch_unwind(AssertUnwindSafe(|| f(&mut *s))) {
        Ok(r) => r,
        Err(_) => {
            s.fail("internal: pto's runtime panicked in an orchestration call".into());
            default
        }
    }
}

/// Decodes a submit. Pointers come from pto's header, which fills them from the caller's
/// arguments.
///
/// # Safety
///
/// `s` must be a valid `PtoSimplerSubmit` whose arrays hold the counts it says, and whose tensor
/// descriptors are valid `ChipTensor`s (or, for OUTPUT, `TensorCreateInfo`s).
unsafe fn decode(s: &Submit) -> Result<SubmitSpec, String> {
    let nt = usize::try_from(s.tensor_count).map_err(|_| "negative tensor count")?;
    let ns = usize::try_from(s.scalar_count).map_err(|_| "negative scalar count")?;
    let mut tensors = Vec::with_capacity(nt);
    if nt > 0 {
        // SAFETY: per the contract, `tensors` holds `nt` entries.
        let args: &[TensorArg] = unsafe { std::slice::from_raw_parts(s.tensors, nt) };
        for (i, a) in args.iter().enumerate() {
            if a.desc.is_null() {
                return Err(format!("tensor argument {i} is null"));
            }
            if a.tag == abi::tag::OUTPUT {
                // SAFETY: an OUTPUT slot points to the caller's TensorCreateInfo.
                tensors.push(ArgDesc::Create(unsafe {
                    *a.desc.cast::<TensorCreateInfo>()
                }));
            } else {
                // SAFETY: other slots point to the caller's ChipTensor.
                tensors.push(ArgDesc::Existing(
                    unsafe { *a.desc.cast::<ChipTensor>() },
                    a.tag,
                ));
            }
        }
    }
    let scalars = if ns > 0 {
        // SAFETY: per the contract, `scalars` holds `ns` values.
        unsafe { std::slice::from_raw_parts(s.scalars, ns) }.to_vec()
    } else {
        Vec::new()
    };
    let deps = if s.dep_count > 0 && !s.deps.is_null() {
        // SAFETY: the caller's dependency array holds `dep_count` ids (set_dependencies).
        unsafe { std::slice::from_raw_parts(s.deps, s.dep_count as usize) }.to_vec()
    } else {
        Vec::new()
    };
    Ok(SubmitSpec {
        kind: s.kind,
        kernel_ids: s.kernel_ids,
        tensors,
        scalars,
        deps,
        block_num: s.block_num,
        has_predicate: s.predicate_op != 0,
    })
}

unsafe extern "C" fn op_submit(rt: *mut Runtime, s: *const Submit, out: *mut TaskOutputs) -> i32 {
    with_session(rt, -1, |session| {
        if session.fatal.is_some() || s.is_null() || out.is_null() {
            return -1;
        }
        // SAFETY: the header passes a PtoSimplerSubmit it filled from the caller's arguments.
        let spec = match unsafe { decode(&*s) } {
            Ok(spec) => spec,
            Err(e) => {
                session.fail(format!("submit: {e}"));
                return -1;
            }
        };
        match session.submit(spec) {
            Ok(r) => {
                // SAFETY: `out` is the caller's TaskOutputTensors (pto's layout, header-pinned).
                let o = unsafe { &mut *out };
                o.task_id = r.task_id;
                o.output_count = r.outputs.len() as u32;
                for (slot, p) in o.tensors.iter_mut().zip(&r.outputs) {
                    *slot = *p;
                }
                0
            }
            Err(e) => {
                let n = session_tasks_hint(session);
                session.fail(format!("submit {n}: {e}"));
                -1
            }
        }
    })
}

fn session_tasks_hint(s: &Session<'_, '_>) -> String {
    format!("in {}", s.callable)
}

unsafe extern "C" fn op_scope_begin(rt: *mut Runtime, mode: u8, _file: *const c_char, _line: i32) {
    with_session(rt, (), |s| s.scope_begin(mode == 1));
}

unsafe extern "C" fn op_scope_end(rt: *mut Runtime) {
    with_session(rt, (), |s| s.scope_end());
}

unsafe extern "C" fn op_done(_rt: *mut Runtime) {}

unsafe extern "C" fn op_is_fatal(rt: *mut Runtime) -> bool {
    with_session(rt, true, |s| s.fatal.is_some())
}

unsafe extern "C" fn op_report_fatal(
    rt: *mut Runtime,
    code: i32,
    func: *const c_char,
    message: *const c_char,
) {
    let (func, message) = (text(func), text(message));
    with_session(rt, (), |s| {
        s.fail(format!("rt_report_fatal({code}) in {func}: {message}"));
    });
}

unsafe extern "C" fn op_log(
    rt: *mut Runtime,
    level: i32,
    func: *const c_char,
    message: *const c_char,
) {
    let (func, message) = (text(func), text(message));
    let callable = with_session(rt, String::new(), |s| s.callable.clone());
    match level {
        0 => tracing::error!(callable, func, "{message}"),
        1 => tracing::warn!(callable, func, "{message}"),
        2 => tracing::info!(callable, func, "{message}"),
        _ => tracing::debug!(callable, func, "{message}"),
    }
    if level == 0 {
        // An orchestration's LOG_ERROR is for the user: shown even when logging is quiet.
        eprintln!("pto simpler: {callable}: {func}: {message}");
    }
}

unsafe extern "C" fn op_get_tensor_data(
    rt: *mut Runtime,
    _t: *const ChipTensor,
    _ndims: u32,
    _indices: *const u32,
) -> u64 {
    with_session(rt, 0, |s| {
        s.fail("get_tensor_data is not supported by pto's bridge yet".into());
        0
    })
}

unsafe extern "C" fn op_set_tensor_data(
    rt: *mut Runtime,
    _t: *const ChipTensor,
    _ndims: u32,
    _indices: *const u32,
    _value: u64,
) {
    with_session(rt, (), |s| {
        s.fail("set_tensor_data is not supported by pto's bridge yet".into());
    });
}

unsafe extern "C" fn op_clusters(rt: *mut Runtime) -> i32 {
    with_session(rt, 0, |s| s.counts().0)
}

unsafe extern "C" fn op_aivs(rt: *mut Runtime) -> i32 {
    with_session(rt, 0, |s| s.counts().1)
}

/// `pto_simpler_abi_version()` of a library.
pub(crate) fn call_abi_version(f: AbiVersion) -> i32 {
    // SAFETY: the symbol was looked up under that name, which pto's header defines as
    // `int32_t (void)` with no side effect.
    unsafe { f() }
}

/// Calls an orchestration's config (`config`) or entry function `f` through its library's
/// `pto_simpler_call_orchestration`, with `session` bound as the calling thread's runtime.
/// Returns the config's expected argument count (entry: -1), or the C++ exception's text.
pub(crate) fn call_orchestration(
    session: &mut Session<'_, '_>,
    glue: (BindRuntime, CallOrchestration),
    f: *mut c_void,
    config: bool,
    tensors: &[ChipTensor],
    scalars: &[u64],
) -> Result<i32, String> {
    let (bind, call) = glue;
    let mut rt = Runtime {
        ops: &OPS,
        pending_scope_mode: 0,
        implementation: std::ptr::from_mut::<Session<'_, '_>>(session).cast::<c_void>(),
    };
    let mut expected = -1i32;
    let mut err = [0 as c_char; 1024];
    // SAFETY: `bind` and `call` are the library's own helpers (checked ABI version); `rt` lives
    // until after the unbind below, and the session behind it is not touched by this thread
    // otherwise while the orchestration runs (only through the callbacks). `f` is the library's
    // exported entry or config function, whose signature simpler's orchestration ABI fixes.
    // The arrays are valid for their lengths during the call.
    let rc = unsafe {
        bind(&mut rt);
        let rc = call(
            f,
            i32::from(config),
            tensors.as_ptr(),
            tensors.len() as i32,
            scalars.as_ptr(),
            scalars.len() as i32,
            &mut expected,
            err.as_mut_ptr(),
            err.len() as u32,
        );
        bind(std::ptr::null_mut());
        rc
    };
    if rc != 0 {
        // SAFETY: the helper wrote a NUL-terminated message into `err` (snprintf).
        return Err(unsafe { CStr::from_ptr(err.as_ptr()) }
            .to_string_lossy()
            .into_owned());
    }
    Ok(expected)
}

/// Calls a task's kernel for one block with simpler's argument array. Returns the completion
/// conditions it registered (`(counter address, expected value)`), or the error code it set in
/// its slab.
pub(crate) fn call_kernel(
    p: &Payload,
    descs: &[ChipTensor],
    (block_idx, block_num): (u32, u32),
) -> Result<Vec<(u64, u32)>, i32> {
    let mut slab = Box::new(CompletionSlab {
        count: 0,
        error_code: 0,
        entries: [CompletionEntry::default(); MAX_COMPLETIONS],
    });
    let local = LocalContext {
        block_idx: block_idx as i32,
        block_num: block_num as i32,
        async_ctx: AsyncCtx {
            completion_count: &mut slab.count,
            completion_error_code: &mut slab.error_code,
            completion_entries: slab.entries.as_mut_ptr(),
            completion_capacity: MAX_COMPLETIONS as u32,
            task_token: p.task_id,
        },
    };
    let global = GlobalContext {
        sub_block_id: i32::from(p.sub_block),
        dma_workspace: [0; 2],
    };
    let mut args = vec![0i64; GLOBAL_CONTEXT_INDEX + 1];
    for (i, d) in descs.iter().enumerate() {
        args[i] = std::ptr::from_ref::<ChipTensor>(d) as i64;
    }
    for (j, s) in p.scalars.iter().enumerate() {
        args[descs.len() + j] = *s as i64;
    }
    args[LOCAL_CONTEXT_INDEX] = std::ptr::from_ref::<LocalContext>(&local) as i64;
    args[GLOBAL_CONTEXT_INDEX] = std::ptr::from_ref::<GlobalContext>(&global) as i64;
    let mark = Running::new(&p.note);
    // SAFETY: `entry` is the kernel library's `kernel_entry` (kept loaded by the payload), called
    // as simpler's ABI defines it: an array of at least 50 slots whose tensor slots point to
    // descriptors and whose slots 48 and 49 point to the contexts, all alive for the call. What
    // the kernel does with the addresses inside the descriptors is the kernel's contract, as on
    // the device.
    unsafe { (p.entry)(args.as_mut_ptr()) };
    drop(mark);
    // SAFETY: the slab is ours and the kernel has returned; it may have written it through
    // volatile pointers, so it is read the same way.
    let (count, code) = unsafe {
        (
            std::ptr::read_volatile(&slab.count),
            std::ptr::read_volatile(&slab.error_code),
        )
    };
    if code != 0 {
        return Err(code);
    }
    let n = (count as usize).min(MAX_COMPLETIONS);
    Ok((0..n)
        .map(|i| {
            // SAFETY: as above.
            let e = unsafe { std::ptr::read_volatile(&slab.entries[i]) };
            (e.addr, e.expected_value)
        })
        .collect())
}

/// "The u32 at `addr` holds at least `expected`" as a pto condition.
pub(crate) fn counter_condition(
    addr: u64,
    expected: u32,
) -> FnCondition<impl Fn() -> Poll + Send + Sync> {
    let what = format!("counter at {addr:#x} >= {expected}");
    FnCondition::new(&what, move || {
        if addr == 0 || !addr.is_multiple_of(4) {
            return Poll::Failed(format!(
                "a completion condition names address {addr:#x}, which is not a u32 counter"
            ));
        }
        // SAFETY: the kernel registered `addr` as a live u32 counter (simpler's deferred
        // completion ABI: a counter in a window or in memory that outlives the task); it is
        // aligned (checked above) and only ever accessed atomically by the ranks that raise it.
        let v = unsafe { AtomicU32::from_ptr(addr as *mut u32) }.load(Ordering::Acquire);
        if v >= expected {
            Poll::Ready
        } else {
            Poll::Pending
        }
    })
}

/// Fills a new output with its initial value (the element's bytes, repeated).
pub(crate) fn fill(d: &ChipTensor, value: u64) {
    let es = abi::element_size(d.dtype) as usize;
    if es == 0 || d.buffer.addr == 0 {
        return;
    }
    let bytes = value.to_le_bytes();
    let n = d.buffer.size as usize;
    // SAFETY: `d` describes an output the ring just allocated for a task that has not run:
    // `buffer.size` bytes at `buffer.addr` are this orchestrator's to write.
    let dst = unsafe { std::slice::from_raw_parts_mut(d.buffer.addr as *mut u8, n) };
    for chunk in dst.chunks_mut(es) {
        let k = chunk.len();
        chunk.copy_from_slice(&bytes[..k]);
    }
}

// ---- Crash notes -----------------------------------------------------------------------------
//
// A kernel or orchestration that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, abort) takes its chip
// process with it; the host sees only the signal. So that the error names what crashed, each
// thread that calls compiled code marks what it runs (`Running`), and a handler installed in the
// chip process writes one line, "pto.simpler: chip C: <what> crashed: <signal>", to stderr and
// to the file `$PTO_SIMPLER_NOTES/notes-<pid>` (the Python layer adds it to the run's
// exception). Chips that are threads of one process share the handler; each mark names its chip.
// The handler then restores the previous disposition and returns: the fault recurs (or abort
// raises again) and the process ends as it would have.

/// The signals a crash in compiled code raises.
const CRASH_SIGNALS: [libc::c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGABRT,
];

thread_local! {
    /// What this thread runs in compiled code: a note's bytes (address and length), or null.
    static RUNNING: Cell<(*const u8, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

/// The notes file (or -1) and the dispositions the handler replaced.
struct CrashNotes {
    fd: AtomicI32,
    previous: [libc::sigaction; CRASH_SIGNALS.len()],
}

static NOTES: OnceLock<CrashNotes> = OnceLock::new();

/// Marks what the calling thread runs in compiled code while it lives (nests: the previous mark
/// comes back when it drops). `note` must outlive it.
pub(crate) struct Running<'a> {
    previous: (*const u8, usize),
    _note: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Running<'a> {
    pub(crate) fn new(note: &'a [u8]) -> Running<'a> {
        let previous = RUNNING.with(|r| r.replace((note.as_ptr(), note.len())));
        Running {
            previous,
            _note: std::marker::PhantomData,
        }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(self.previous));
    }
}

/// Installs the crash handler in this process (once; later calls do nothing).
pub(crate) fn install_crash_notes() {
    NOTES.get_or_init(|| {
        let fd = std::env::var_os("PTO_SIMPLER_NOTES")
            .and_then(|dir| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(std::path::Path::new(&dir).join(format!("notes-{}", std::process::id())))
                    .ok()
            })
            .map_or(-1, std::os::fd::IntoRawFd::into_raw_fd);
        // SAFETY: a zeroed sigaction is a valid value (no handler, empty mask).
        let mut previous: [libc::sigaction; CRASH_SIGNALS.len()] = unsafe { std::mem::zeroed() };
        for (sig, old) in CRASH_SIGNALS.iter().zip(previous.iter_mut()) {
            // SAFETY: reads the current disposition into `old`, which is valid to write.
            unsafe { libc::sigaction(*sig, std::ptr::null(), old) };
        }
        CrashNotes {
            fd: AtomicI32::new(fd),
            previous,
        }
    });
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        for sig in CRASH_SIGNALS {
            // SAFETY: installs `on_crash`, which only reads `NOTES` (initialised above, before
            // the handler can run), the thread's mark, and calls write(2) and sigaction(2),
            // both async-signal-safe. SA_ONSTACK uses the thread's alternate stack when it has
            // one (Rust's threads do, for stack overflows).
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_crash as extern "C" fn(libc::c_int) as usize;
                act.sa_flags = libc::SA_ONSTACK;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(sig, &act, std::ptr::null_mut());
            }
        }
    });
}

fn signal_name(sig: libc::c_int) -> &'static [u8] {
    match sig {
        libc::SIGSEGV => b"SIGSEGV (a bad memory access)",
        libc::SIGBUS => b"SIGBUS (a bad memory access)",
        libc::SIGFPE => b"SIGFPE (an arithmetic fault)",
        libc::SIGILL => b"SIGILL (an illegal instruction)",
        libc::SIGABRT => b"SIGABRT (abort)",
        _ => b"a signal",
    }
}

extern "C" fn on_crash(sig: libc::c_int) {
    let Some(notes) = NOTES.get() else { return };
    let (ptr, len) = RUNNING.try_with(Cell::get).unwrap_or((std::ptr::null(), 0));
    if !ptr.is_null() {
        // SAFETY: a mark points to a note its `Running` keeps alive, and the thread that set it
        // is the one running this handler (inside the call the mark covers).
        let note = unsafe { std::slice::from_raw_parts(ptr, len) };
        let parts: [&[u8]; 5] = [
            b"pto.simpler: ",
            note,
            b" crashed: ",
            signal_name(sig),
            b"\n",
        ];
        for fd in [2, notes.fd.load(Ordering::Relaxed)] {
            if fd < 0 {
                continue;
            }
            for p in parts {
                // SAFETY: write(2) of a valid buffer; async-signal-safe. A short or failed
                // write loses part of the note, nothing else.
                unsafe { libc::write(fd, p.as_ptr().cast(), p.len()) };
            }
        }
    }
    if let Some(i) = CRASH_SIGNALS.iter().position(|&s| s == sig) {
        // SAFETY: restores the disposition saved at install; async-signal-safe.
        unsafe { libc::sigaction(sig, &notes.previous[i], std::ptr::null_mut()) };
    }
}
