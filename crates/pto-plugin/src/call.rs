//! What each C entry point does, in safe Rust, on the state behind a handle: a plugin's
//! registration ([`Registration`]), one run of a program ([`ProgramCall`]) and one kernel call
//! ([`KernelCall`]). `entry` turns the C arguments into Rust values and the results back.

use std::cell::RefCell;

use pto_comm::{BufferSpec, CommContext, CommError, SignalOp, Window};
use pto_core::{
    CoreKind, DType, KernelCtx, KernelError, Orch, OrchError, RawView, RegistryError, Scalar,
    Submitted, TaskArgs, Tensor,
};

use crate::abi::{arg_kind, code, Arg, KernelFn, ProgramFn, TaskOpts, View, MAX_DIMS};

/// A failed call: its code and what went wrong.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) code: i32,
    pub(crate) msg: String,
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) fn err<T>(code: i32, msg: impl Into<String>) -> ApiResult<T> {
    Err(ApiError {
        code,
        msg: msg.into(),
    })
}

impl From<CommError> for ApiError {
    fn from(e: CommError) -> ApiError {
        let code = match &e {
            CommError::Timeout { .. } => code::TIMEOUT,
            CommError::BadRank { .. }
            | CommError::OutOfBounds { .. }
            | CommError::OutsideBuffer { .. } => code::RANGE,
            CommError::BadBuffer { .. } => code::NOT_FOUND,
            CommError::Misaligned { .. } | CommError::BadSize { .. } => code::ARG,
            _ => code::COMM,
        };
        ApiError {
            code,
            msg: e.to_string(),
        }
    }
}

impl From<KernelError> for ApiError {
    fn from(e: KernelError) -> ApiError {
        let code = match &e {
            KernelError::ArgIndex { .. } => code::RANGE,
            KernelError::Mode { .. }
            | KernelError::SpmdShared { .. }
            | KernelError::AlreadyBorrowed { .. }
            | KernelError::DataRace { .. } => code::MODE,
            KernelError::ScalarType { .. } => code::DTYPE,
            KernelError::NotDeferred { .. } | KernelError::TooManyConditions { .. } => code::STATE,
            _ => code::INTERNAL,
        };
        ApiError {
            code,
            msg: e.to_string(),
        }
    }
}

impl From<OrchError> for ApiError {
    fn from(e: OrchError) -> ApiError {
        let code = match &e {
            OrchError::Registry(RegistryError::Unknown(_)) => code::NOT_FOUND,
            OrchError::InvalidArgs { .. } | OrchError::Tensor(_) => code::ARG,
            OrchError::NoCore { .. } => code::STATE,
            OrchError::WaitTimeout { .. } | OrchError::FlowControlTimeout { .. } => code::TIMEOUT,
            OrchError::Poisoned { .. } => code::FAILED,
            _ => code::INTERNAL,
        };
        ApiError {
            code,
            msg: e.to_string(),
        }
    }
}

/// `pto_dtype` as a [`DType`].
pub(crate) fn dtype_of(v: i32) -> ApiResult<DType> {
    u8::try_from(v)
        .ok()
        .and_then(|v| DType::ALL.get(usize::from(v)).copied())
        .map_or_else(|| err(code::ARG, format!("{v} is not a pto_dtype")), Ok)
}

/// `pto_core_kind` as a [`CoreKind`].
pub(crate) fn kind_of(v: i32) -> ApiResult<CoreKind> {
    match v {
        0 => Ok(CoreKind::Aic),
        1 => Ok(CoreKind::Aiv),
        2 => Ok(CoreKind::Mix),
        _ => err(
            code::ARG,
            format!("{v} is not a core kind (PTO_AIC, PTO_AIV or PTO_MIX)"),
        ),
    }
}

/// What a plugin's `pto_plugin_register` registered.
#[derive(Default)]
pub(crate) struct Registration {
    pub(crate) kernels: Vec<(String, CoreKind, KernelFn)>,
    pub(crate) programs: Vec<(String, ProgramFn)>,
    pub(crate) buffers: Vec<BufferSpec>,
    /// The first call that failed: registration fails even if the plugin ignored it.
    pub(crate) first_error: Option<String>,
}

fn check_name(what: &str, name: &str) -> ApiResult<()> {
    if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
        return err(
            code::ARG,
            format!("{what} name {name:?} must be 1 to 255 printable characters"),
        );
    }
    Ok(())
}

impl Registration {
    pub(crate) fn kernel(&mut self, name: &str, kind: i32, f: Option<KernelFn>) -> ApiResult<()> {
        check_name("kernel", name)?;
        let kind = kind_of(kind)?;
        let Some(f) = f else {
            return err(code::ARG, format!("kernel {name:?}: the function is NULL"));
        };
        if self.kernels.iter().any(|k| k.0 == name) {
            return err(
                code::DUPLICATE,
                format!("kernel {name:?} is registered twice"),
            );
        }
        self.kernels.push((name.to_string(), kind, f));
        Ok(())
    }

    pub(crate) fn program(&mut self, name: &str, f: Option<ProgramFn>) -> ApiResult<()> {
        check_name("program", name)?;
        let Some(f) = f else {
            return err(code::ARG, format!("program {name:?}: the function is NULL"));
        };
        if self.programs.iter().any(|p| p.0 == name) {
            return err(
                code::DUPLICATE,
                format!("program {name:?} is registered twice"),
            );
        }
        self.programs.push((name.to_string(), f));
        Ok(())
    }

    pub(crate) fn buffer(&mut self, name: &str, dtype: i32, count: u64) -> ApiResult<()> {
        check_name("buffer", name)?;
        let dtype = dtype_of(dtype)?;
        let count = usize::try_from(count)
            .ok()
            .filter(|&c| c > 0 && c.checked_mul(dtype.size()).is_some_and(|b| b <= 1 << 40))
            .map_or_else(
                || {
                    err(
                        code::RANGE,
                        format!("buffer {name:?}: {count} elements of {dtype} (1 to 1 TiB)"),
                    )
                },
                Ok,
            )?;
        if let Some(b) = self.buffers.iter().find(|b| b.name == name) {
            if b.dtype == dtype && b.count == count {
                return Ok(());
            }
            return err(
                code::DUPLICATE,
                format!(
                    "buffer {name:?} is declared twice: {} elements of {} and {count} elements of {dtype}",
                    b.count, b.dtype
                ),
            );
        }
        self.buffers.push(BufferSpec::new(name, dtype, count));
        Ok(())
    }
}

/// The window's buffer `name`, checked to hold `bytes` bytes at `offset`: the window and the
/// offset in it.
fn span<'w>(
    w: Option<&'w Window>,
    buffer: &str,
    offset: u64,
    bytes: u64,
) -> ApiResult<(&'w Window, usize)> {
    let Some(w) = w else {
        return err(
            code::STATE,
            "the chip has no window: the plugin declared no buffers (pto_declare_buffer)",
        );
    };
    Ok((w, w.buffer_range(buffer, offset, bytes)?))
}

fn check_rank(rank: u32, size: usize) -> ApiResult<usize> {
    let r = rank as usize;
    if r >= size {
        return err(
            code::RANGE,
            format!("rank {rank} out of range: the job has {size} rank(s)"),
        );
    }
    Ok(r)
}

/// One call of a plugin kernel: the kernel's context and what the kernel asked for.
pub(crate) struct KernelCall<'c, 'k> {
    ctx: &'c KernelCtx<'k>,
    comm: Option<&'c CommContext>,
    /// The argument views taken so far (inline: no allocation for a kernel's first few).
    views: RefCell<smallvec::SmallVec<[(u32, bool, RawView<'c>); 4]>>,
    failed: RefCell<Option<String>>,
    last: RefCell<Option<ApiError>>,
}

impl<'c, 'k> KernelCall<'c, 'k> {
    pub(crate) fn new(ctx: &'c KernelCtx<'k>) -> Self {
        KernelCall {
            ctx,
            comm: ctx.ext::<CommContext>(),
            views: RefCell::new(smallvec::SmallVec::new()),
            failed: RefCell::new(None),
            last: RefCell::new(None),
        }
    }

    /// Remembers a failed call, for the task's error when the kernel returns non-zero.
    pub(crate) fn note(&self, e: &ApiError) {
        *self.last.borrow_mut() = Some(ApiError {
            code: e.code,
            msg: e.msg.clone(),
        });
    }

    /// The task's result from the kernel's return code.
    pub(crate) fn finish(self, rc: i32) -> Result<(), KernelError> {
        if let Some(m) = self.failed.into_inner() {
            return Err(KernelError::msg(m));
        }
        if rc == code::OK {
            return Ok(());
        }
        let last = self
            .last
            .into_inner()
            // Only a failed call that gave the code returned explains it (an earlier call may
            // have failed on purpose).
            .filter(|e| e.code == rc)
            .map(|e| format!(": last failed call: {}", e.msg))
            .unwrap_or_default();
        Err(KernelError::msg(format!(
            "the kernel returned {rc} ({}){last}",
            code::name(rc)
        )))
    }

    fn window(&self) -> Option<&'c Window> {
        self.comm.and_then(|c| c.window(0).ok())
    }

    pub(crate) fn rank(&self) -> u32 {
        self.comm.map_or(0, |c| c.rank() as u32)
    }

    pub(crate) fn nranks(&self) -> u32 {
        self.comm.map_or(1, |c| c.size() as u32)
    }

    pub(crate) fn block(&self) -> (u32, u32) {
        (self.ctx.block_idx(), self.ctx.block_num())
    }

    pub(crate) fn num_args(&self) -> (u32, u32) {
        (self.ctx.num_tensors() as u32, self.ctx.num_scalars() as u32)
    }

    pub(crate) fn tensor(&self, index: u32, chunk: bool) -> ApiResult<View> {
        let mut views = self.views.borrow_mut();
        let at = match views.iter().position(|v| v.0 == index && v.1 == chunk) {
            Some(at) => at,
            None => {
                let v = self.ctx.raw_view(index as usize, chunk)?;
                if v.shape().len() > MAX_DIMS {
                    return err(
                        code::RANGE,
                        format!("tensor argument {index} has more than {MAX_DIMS} dims"),
                    );
                }
                views.push((index, chunk, v));
                views.len() - 1
            }
        };
        let v = &views[at].2;
        let mut out = View {
            data: if v.is_empty() {
                std::ptr::null_mut()
            } else {
                v.as_ptr().cast()
            },
            dtype: v.dtype() as i32,
            ndim: v.shape().len() as u32,
            count: v.len() as u64,
            writable: u32::from(v.writable()),
            contiguous: u32::from(v.is_contiguous()),
            ..View::default()
        };
        for (i, (s, t)) in v.shape().iter().zip(v.strides()).enumerate() {
            out.shape[i] = *s as u64;
            out.strides[i] = t as u64;
        }
        Ok(out)
    }

    /// Scalar argument `index`, which must have dtype `want`.
    pub(crate) fn scalar(&self, index: u32, want: i32) -> ApiResult<Scalar> {
        let want = dtype_of(want)?;
        let s = self
            .ctx
            .scalars()
            .get(index as usize)
            .copied()
            .map_or_else(
                || {
                    err(
                        code::RANGE,
                        format!(
                            "scalar argument {index} out of range: the task has {}",
                            self.ctx.num_scalars()
                        ),
                    )
                },
                Ok,
            )?;
        if s.dtype() != want {
            return err(
                code::DTYPE,
                format!("scalar argument {index} is {}, read as {want}", s.dtype()),
            );
        }
        Ok(s)
    }

    /// This rank's part of `buffer`: its address and size.
    pub(crate) fn window_ptr(&self, buffer: &str) -> ApiResult<(*mut u8, u64)> {
        let (w, _) = span(self.window(), buffer, 0, 0)?;
        let (p, bytes) = w.buffer_ptr(buffer, "window pointer")?;
        Ok((p, bytes as u64))
    }

    pub(crate) fn put(&self, rank: u32, buffer: &str, offset: u64, src: &[u8]) -> ApiResult<()> {
        let r = check_rank(rank, self.nranks() as usize)?;
        let (w, off) = span(self.window(), buffer, offset, src.len() as u64)?;
        Ok(w.put(r, off, src)?)
    }

    pub(crate) fn get(
        &self,
        rank: u32,
        buffer: &str,
        offset: u64,
        dst: &mut [u8],
    ) -> ApiResult<()> {
        let r = check_rank(rank, self.nranks() as usize)?;
        let (w, off) = span(self.window(), buffer, offset, dst.len() as u64)?;
        Ok(w.get(r, off, dst)?)
    }

    pub(crate) fn notify(&self, rank: u32, buffer: &str, offset: u64, value: u32) -> ApiResult<()> {
        let r = check_rank(rank, self.nranks() as usize)?;
        let (w, off) = span(self.window(), buffer, offset, 4)?;
        // Every put this kernel made is visible at the target before the signal.
        w.fence();
        Ok(w.notify(r, off, value, SignalOp::Add)?)
    }

    pub(crate) fn wait_until(&self, buffer: &str, offset: u64, value: u32) -> ApiResult<()> {
        let (w, off) = span(self.window(), buffer, offset, 4)?;
        w.wait_until(off, value)?;
        Ok(())
    }

    pub(crate) fn barrier(&self) -> ApiResult<()> {
        match (self.window(), self.comm) {
            (Some(w), _) => Ok(w.barrier()?),
            (None, Some(c)) => Ok(c.comm().barrier()?),
            (None, None) => Ok(()),
        }
    }

    pub(crate) fn fail(&self, message: &str) {
        let mut f = self.failed.borrow_mut();
        if f.is_none() {
            *f = Some(message.to_string());
        }
    }

    pub(crate) fn defer_until(&self, buffer: &str, offset: u64, value: u32) -> ApiResult<()> {
        let (w, off) = span(self.window(), buffer, offset, 4)?;
        let c = w.signal_condition(off, value)?;
        Ok(self.ctx.defer(c)?)
    }
}

/// One run of a plugin program on a chip: the orchestration, and the tensors and tasks the
/// program holds handles to (handle `i + 1` is entry `i`).
pub(crate) struct ProgramCall<'o, 'a> {
    orch: RefCell<&'o mut Orch<'a>>,
    rank: u32,
    size: u32,
    window: Option<Window>,
    tensors: RefCell<Vec<Tensor>>,
    tasks: RefCell<Vec<Submitted>>,
    last: RefCell<Option<ApiError>>,
}

/// The largest element count of a tensor a program creates (16 GiB of bytes at most).
const MAX_TENSOR_BYTES: u64 = 1 << 34;

fn shape_of(ndim: u32, shape: &[u64], dtype: DType) -> ApiResult<Vec<usize>> {
    if ndim == 0 || ndim as usize > MAX_DIMS {
        return err(code::RANGE, format!("ndim {ndim}: 1 to {MAX_DIMS}"));
    }
    let shape: Vec<usize> = shape[..ndim as usize].iter().map(|&d| d as usize).collect();
    let bytes = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64));
    if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
        return err(
            code::RANGE,
            format!("shape {shape:?} of {dtype} is larger than 16 GiB"),
        );
    }
    Ok(shape)
}

impl<'o, 'a> ProgramCall<'o, 'a> {
    pub(crate) fn new(orch: &'o mut Orch<'a>) -> Self {
        let comm = orch.ext::<CommContext>();
        let rank = comm.map_or(0, |c| c.rank() as u32);
        let size = comm.map_or(1, |c| c.size() as u32);
        let window = comm.and_then(|c| c.window(0).ok()).cloned();
        ProgramCall {
            orch: RefCell::new(orch),
            rank,
            size,
            window,
            tensors: RefCell::new(Vec::new()),
            tasks: RefCell::new(Vec::new()),
            last: RefCell::new(None),
        }
    }

    pub(crate) fn note(&self, e: &ApiError) {
        *self.last.borrow_mut() = Some(ApiError {
            code: e.code,
            msg: e.msg.clone(),
        });
    }

    /// The run's result from the program's return code.
    pub(crate) fn finish(self, program: &str, rc: i32) -> Result<(), OrchError> {
        if rc == code::OK {
            return Ok(());
        }
        let last = self
            .last
            .into_inner()
            // Only a failed call that gave the code returned explains it (an earlier call may
            // have failed on purpose).
            .filter(|e| e.code == rc)
            .map(|e| format!(": last failed call: {}", e.msg))
            .unwrap_or_default();
        Err(OrchError::msg(format!(
            "program {program} returned {rc} ({}){last}",
            code::name(rc)
        )))
    }

    pub(crate) fn rank(&self) -> u32 {
        self.rank
    }

    pub(crate) fn nranks(&self) -> u32 {
        self.size
    }

    fn keep(&self, t: Tensor) -> u64 {
        let mut ts = self.tensors.borrow_mut();
        ts.push(t);
        ts.len() as u64
    }

    fn tensor(&self, h: u64) -> ApiResult<Tensor> {
        let ts = self.tensors.borrow();
        usize::try_from(h)
            .ok()
            .and_then(|h| h.checked_sub(1))
            .and_then(|i| ts.get(i))
            .cloned()
            .map_or_else(
                || {
                    err(
                        code::NOT_FOUND,
                        format!("{h} is not a tensor of this program"),
                    )
                },
                Ok,
            )
    }

    pub(crate) fn window_tensor(&self, buffer: &str) -> ApiResult<u64> {
        let Some(w) = &self.window else {
            return err(
                code::STATE,
                "the chip has no window: the plugin declared no buffers (pto_declare_buffer)",
            );
        };
        Ok(self.keep(w.local_tensor(buffer)?))
    }

    pub(crate) fn tensor_new(&self, dtype: i32, ndim: u32, shape: &[u64]) -> ApiResult<u64> {
        let dtype = dtype_of(dtype)?;
        let shape = shape_of(ndim, shape, dtype)?;
        let t = Tensor::zeros(&shape, dtype).map_err(|e| ApiError {
            code: code::ARG,
            msg: e.to_string(),
        })?;
        Ok(self.keep(t))
    }

    fn check_bytes(t: &Tensor, h: u64, bytes: u64) -> ApiResult<()> {
        if bytes != t.nbytes() as u64 {
            return err(
                code::RANGE,
                format!("tensor {h} holds {} bytes, not {bytes}", t.nbytes()),
            );
        }
        Ok(())
    }

    pub(crate) fn tensor_write(&self, h: u64, src: &[u8]) -> ApiResult<()> {
        let t = self.tensor(h)?;
        Self::check_bytes(&t, h, src.len() as u64)?;
        Ok(self.orch.borrow_mut().write_bytes(&t, src)?)
    }

    /// The tensor's bytes, after its producers finished; `bytes` must be its size.
    pub(crate) fn tensor_read(&self, h: u64, bytes: u64) -> ApiResult<Vec<u8>> {
        let t = self.tensor(h)?;
        Self::check_bytes(&t, h, bytes)?;
        Ok(self.orch.borrow_mut().read_bytes(&t)?)
    }

    pub(crate) fn task_output(&self, task: u64, index: u32) -> ApiResult<u64> {
        let t = {
            let tasks = self.tasks.borrow();
            let s = usize::try_from(task)
                .ok()
                .and_then(|h| h.checked_sub(1))
                .and_then(|i| tasks.get(i))
                .map_or_else(
                    || {
                        err(
                            code::NOT_FOUND,
                            format!("{task} is not a task of this program"),
                        )
                    },
                    Ok,
                )?;
            s.out(index as usize).map_err(|e| ApiError {
                code: code::RANGE,
                msg: e.to_string(),
            })?
        };
        Ok(self.keep(t))
    }

    fn push_arg(&self, t: TaskArgs, i: usize, a: &Arg) -> ApiResult<TaskArgs> {
        let bad = |m: String| ApiError {
            code: code::ARG,
            msg: format!("argument {i}: {m}"),
        };
        Ok(match a.kind {
            arg_kind::IN => t.input(&self.tensor(a.tensor)?),
            arg_kind::OUT => t.output_existing(&self.tensor(a.tensor)?),
            arg_kind::INOUT => t.inout(&self.tensor(a.tensor)?),
            arg_kind::NO_DEP => t.no_dep(&self.tensor(a.tensor)?),
            arg_kind::OUT_NEW => {
                let dtype = dtype_of(a.dtype).map_err(|e| bad(e.msg))?;
                let shape = shape_of(a.ndim, &a.shape, dtype).map_err(|e| bad(e.msg))?;
                t.output(&shape, dtype)
            }
            arg_kind::SCALAR => {
                let dtype = dtype_of(a.dtype).map_err(|e| bad(e.msg))?;
                let bits = a.scalar;
                match dtype {
                    DType::F64 => t.scalar(f64::from_bits(bits)),
                    DType::F32 => t.scalar(f64::from_bits(bits) as f32),
                    DType::I64 => t.scalar(bits as i64),
                    DType::I32 => t.scalar(bits as i64 as i32),
                    DType::U64 => t.scalar(bits),
                    DType::U32 => t.scalar(bits as u32),
                    d => {
                        return Err(bad(format!(
                            "scalar dtype {d}: use F64, F32, I64, I32, U64 or U32"
                        )))
                    }
                }
            }
            k => return Err(bad(format!("{k} is not a pto_arg_kind"))),
        })
    }

    /// Submits `kernel` with `args` and the options; returns the task's handle.
    pub(crate) fn submit(
        &self,
        kernel: &str,
        args: &[Arg],
        opts: Option<(&TaskOpts, &[u64])>,
    ) -> ApiResult<u64> {
        let mut t = TaskArgs::new();
        for (i, a) in args.iter().enumerate() {
            t = self.push_arg(t, i, a)?;
        }
        if let Some((o, after)) = opts {
            if o.blocks > 1 {
                t = t.blocks(o.blocks);
            }
            if o.deferred != 0 {
                t = t.deferred();
            }
            let tasks = self.tasks.borrow();
            for &h in after {
                let s = usize::try_from(h)
                    .ok()
                    .and_then(|h| h.checked_sub(1))
                    .and_then(|i| tasks.get(i))
                    .map_or_else(
                        || {
                            err(
                                code::NOT_FOUND,
                                format!("after: {h} is not a task of this program"),
                            )
                        },
                        Ok,
                    )?;
                t = t.after(s.task);
            }
        }
        let s = self.orch.borrow_mut().submit(kernel, t)?;
        let mut tasks = self.tasks.borrow_mut();
        tasks.push(s);
        Ok(tasks.len() as u64)
    }
}
