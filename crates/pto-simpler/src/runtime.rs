//! One run of a callable on a chip: what the orchestration's calls do, in safe Rust.
//!
//! Every submit becomes a pto task in a manual scope, with the dependencies simpler's rules give
//! (computed here, not by pto's own inference): a tensor's creator; for INPUT and INOUT, every
//! earlier writer of overlapping bytes of the same allocation (read-after-write, and
//! write-after-write for INOUT); nothing for OUTPUT_EXISTING (it is only recorded as a writer)
//! and NO_DEP; no write-after-read at all; only explicit dependencies in a manual scope or for a
//! `manual_dep` tensor. Addresses the orchestration hands in are resolved to the pto buffers
//! that hold them (host tensors, domain windows, runtime outputs), so the tasks' tensors are
//! pto tensors and pto's liveness, traces and failure handling apply.

use std::collections::HashMap;
use std::sync::Arc;

use pto_core::{ArgMode, Buffer, CoreKind, DType, Orch, TaskArgs, TaskId, Tensor};

use crate::abi::{self, tag, ChipTensor, TensorCreateInfo, INVALID_TASK, MAX_DIMS};
use crate::kernel::{self, Payload};
use crate::library::Library;

/// A kernel of the callable: its library, entry and core kind.
#[derive(Clone, Debug)]
pub(crate) struct Kernel {
    pub(crate) lib: Arc<Library>,
    pub(crate) entry: abi::KernelEntry,
    /// The core type it was compiled for, when known (else the submit decides).
    pub(crate) core: Option<CoreKind>,
    pub(crate) source: String,
}

/// A tensor argument as the orchestration gave it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ArgDesc {
    /// An existing tensor and its tag.
    Existing(ChipTensor, i32),
    /// An output the runtime allocates.
    Create(TensorCreateInfo),
}

/// A submit, decoded from the C structure.
#[derive(Debug)]
pub(crate) struct SubmitSpec {
    pub(crate) kind: i32,
    pub(crate) kernel_ids: [i32; 3],
    pub(crate) tensors: Vec<ArgDesc>,
    pub(crate) scalars: Vec<u64>,
    pub(crate) deps: Vec<u64>,
    pub(crate) block_num: i32,
    pub(crate) has_predicate: bool,
}

/// What a submit returns to the orchestration.
#[derive(Debug, Default)]
pub(crate) struct Submitted {
    pub(crate) task_id: u64,
    /// The runtime-allocated outputs' descriptors (owned by the session, stable addresses).
    pub(crate) outputs: Vec<*const ChipTensor>,
}

/// A recorded writer of bytes of one allocation (simpler's tensor map entry).
#[derive(Clone, Copy, Debug)]
struct Writer {
    start: u64,
    end: u64,
    contiguous: bool,
    task: usize,
}

/// A memory region the session can resolve addresses in.
#[derive(Debug)]
struct Region {
    start: u64,
    end: u64,
    buffer: Buffer,
}

/// One run's state.
pub(crate) struct Session<'o, 'a> {
    pub(crate) orch: &'o mut Orch<'a>,
    pub(crate) kernels: HashMap<i32, Kernel>,
    pub(crate) callable: String,
    regions: Vec<Region>,
    /// pto's task for each simpler task (the local id is the index).
    tasks: Vec<Option<TaskId>>,
    /// Writers by allocation address.
    writers: HashMap<u64, Vec<Writer>>,
    /// Scopes the orchestration opened: true for manual ones.
    scopes: Vec<bool>,
    /// Output descriptors handed out (boxed: the orchestration holds their addresses, which a
    /// growing vector of values would move).
    #[allow(clippy::vec_box)]
    outputs: Vec<Box<ChipTensor>>,
    /// Payloads registered for this run's kernels (removed when the session ends).
    payloads: Vec<u64>,
    pub(crate) fatal: Option<String>,
    pub(crate) cores: (u32, u32),
    chip: usize,
}

impl std::fmt::Debug for Session<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("callable", &self.callable)
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Session<'_, '_> {
    fn drop(&mut self) {
        // The tasks may not have run yet: their payloads stay until this chip's next run.
        kernel::retire(self.chip, std::mem::take(&mut self.payloads));
    }
}

fn dims(shapes: &[u32; MAX_DIMS], ndims: u32) -> Result<Vec<usize>, String> {
    if ndims == 0 || ndims as usize > MAX_DIMS {
        return Err(format!("ndims {ndims} is not in 1..={MAX_DIMS}"));
    }
    Ok(shapes[..ndims as usize]
        .iter()
        .map(|&s| s as usize)
        .collect())
}

/// The descriptor of a contiguous tensor of `shape` at `addr`.
pub(crate) fn descriptor(addr: u64, shape: &[usize], code: u8, owner: u64) -> ChipTensor {
    let mut t = ChipTensor {
        buffer: abi::BufferHandle {
            addr,
            size: shape.iter().product::<usize>() as u64 * abi::element_size(code),
        },
        owner_task_id: owner,
        ndims: shape.len() as u32,
        dtype: code,
        is_contiguous: true,
        ..ChipTensor::default()
    };
    let mut s = 1u64;
    for i in (0..shape.len()).rev() {
        t.shapes[i] = shape[i] as u32;
        t.strides[i] = s as u32;
        s *= shape[i] as u64;
    }
    t.extent_elem_cache = s;
    t
}

impl<'o, 'a> Session<'o, 'a> {
    pub(crate) fn new(
        orch: &'o mut Orch<'a>,
        chip: usize,
        callable: String,
        kernels: HashMap<i32, Kernel>,
        cores: (u32, u32),
    ) -> Self {
        kernel::forget_previous(chip);
        Session {
            chip,
            orch,
            kernels,
            callable,
            regions: Vec::new(),
            tasks: Vec::new(),
            writers: HashMap::new(),
            scopes: Vec::new(),
            outputs: Vec::new(),
            payloads: Vec::new(),
            fatal: None,
            cores,
        }
    }

    /// Makes `[start, start + len)` resolvable to `buffer` (whose base is `start`).
    pub(crate) fn add_region(&mut self, buffer: Buffer, start: u64, len: usize) {
        if self
            .regions
            .iter()
            .any(|r| r.start == start && r.buffer == buffer)
        {
            return;
        }
        self.regions.push(Region {
            start,
            end: start + len as u64,
            buffer,
        });
    }

    /// The first fatal error wins; later calls become no-ops (as upstream's rt_report_fatal).
    pub(crate) fn fail(&mut self, message: String) {
        if self.fatal.is_none() {
            tracing::debug!(
                callable = self.callable,
                message,
                "simpler orchestration fatal"
            );
            self.fatal = Some(message);
        }
    }

    pub(crate) fn scope_begin(&mut self, manual: bool) {
        match self.orch.begin_scope(true) {
            Ok(()) => self.scopes.push(manual),
            Err(e) => self.fail(format!("scope: {e}")),
        }
    }

    pub(crate) fn scope_end(&mut self) {
        if self.scopes.pop().is_none() {
            self.fail("rt_scope_end without a scope the orchestration opened".into());
            return;
        }
        if let Err(e) = self.orch.end_scope() {
            self.fail(format!("scope: {e}"));
        }
    }

    fn manual(&self) -> bool {
        self.scopes.last().copied().unwrap_or(false)
    }

    /// The pto tensor over the bytes `t` describes.
    fn tensor(&self, t: &ChipTensor, i: usize) -> Result<Tensor, String> {
        let dtype = abi::dtype(t.dtype)
            .ok_or_else(|| format!("tensor argument {i}: unknown DataType {}", t.dtype))?;
        let es = dtype.size() as u64;
        let shape = dims(&t.shapes, t.ndims).map_err(|e| format!("tensor argument {i}: {e}"))?;
        let strides: Vec<usize> = t.strides[..shape.len()]
            .iter()
            .map(|&s| s as usize)
            .collect();
        let addr = t.buffer.addr;
        let r = self
            .regions
            .iter()
            .find(|r| addr >= r.start && addr < r.end.max(r.start + 1))
            .ok_or_else(|| {
                format!(
                    "tensor argument {i}: address {addr:#x} is in no memory this chip knows (a host \
                     tensor of the task, a domain window, or an output of this run)"
                )
            })?;
        let from_base = addr - r.start;
        if !from_base.is_multiple_of(es) {
            return Err(format!(
                "tensor argument {i}: address {addr:#x} is not aligned to its {es}-byte elements"
            ));
        }
        let offset = (from_base / es + t.start_offset) as usize;
        Tensor::strided(r.buffer.clone(), dtype, &shape, &strides, offset).map_err(|e| {
            format!(
                "tensor argument {i}: {e} (buffer of {} bytes)",
                r.end - r.start
            )
        })
    }

    fn task_of(&self, id: u64) -> Result<Option<TaskId>, String> {
        if id == INVALID_TASK {
            return Ok(None);
        }
        match self.tasks.get((id & 0xffff_ffff) as usize) {
            Some(t) if id >> 32 == 0 => Ok(*t),
            _ => Err(format!(
                "task id {id:#x} was not returned by a submit of this run"
            )),
        }
    }

    /// Simpler's dependencies of existing tensor `t` (tag `tag`), recording it as a writer if it
    /// writes.
    fn track(&mut self, t: &ChipTensor, tag: i32, me: usize, deps: &mut Vec<TaskId>) {
        let es = abi::element_size(t.dtype);
        let extent = if t.is_contiguous {
            t.shapes[..t.ndims as usize]
                .iter()
                .map(|&s| u64::from(s))
                .product::<u64>()
        } else {
            t.extent_elem_cache
        };
        let start = t.buffer.addr + t.start_offset * es;
        let probe = Writer {
            start,
            end: start + extent * es,
            contiguous: t.is_contiguous,
            task: me,
        };
        if probe.start == probe.end {
            return;
        }
        let list = self.writers.entry(t.buffer.addr).or_default();
        if tag == tag::INPUT || tag == tag::INOUT {
            for w in list.iter() {
                if w.start < probe.end && probe.start < w.end {
                    if let Some(Some(p)) = self.tasks.get(w.task) {
                        deps.push(*p);
                    }
                }
            }
        }
        if tag == tag::INOUT {
            // A writer whose bytes this one covers is ordered before it: later readers need
            // only this one.
            list.retain(|w| {
                !(probe.contiguous && w.contiguous && probe.start <= w.start && w.end <= probe.end)
            });
        }
        if tag == tag::INOUT || tag == tag::OUTPUT_EXISTING {
            list.push(probe);
        }
    }

    /// One submit: a pto task (or a dummy) with simpler's dependencies; its outputs.
    pub(crate) fn submit(&mut self, s: SubmitSpec) -> Result<Submitted, String> {
        let me = self.tasks.len();
        if me > u32::MAX as usize {
            return Err("too many tasks in one run".into());
        }
        if s.has_predicate {
            return Err("dispatch predicates (set_predicate) are not supported by pto".into());
        }
        let kernel = if s.kind == abi::submit_kind::DUMMY || s.kind == abi::submit_kind::ALLOC {
            // A dependency-only task, or outputs only (alloc_tensors): no kernel runs.
            None
        } else if s.kind == abi::submit_kind::TASK {
            let active: Vec<(usize, i32)> = s
                .kernel_ids
                .iter()
                .copied()
                .enumerate()
                .filter(|&(_, k)| k >= 0)
                .collect();
            let (slot, func) =
                match active.as_slice() {
                    [one] => *one,
                    [] => return Err("a task names no kernel (use rt_submit_dummy_task)".into()),
                    _ => return Err(
                        "MIX tasks (an AIC and AIV kernels in one task) are not supported by pto"
                            .into(),
                    ),
                };
            let k = self.kernels.get(&func).cloned().ok_or_else(|| {
                format!(
                    "func_id {func} is not a kernel of callable {} (it has {:?})",
                    self.callable,
                    {
                        let mut v: Vec<i32> = self.kernels.keys().copied().collect();
                        v.sort_unstable();
                        v
                    }
                )
            })?;
            let want = if slot == 0 {
                CoreKind::Aic
            } else {
                CoreKind::Aiv
            };
            if let Some(core) = k.core.filter(|&c| c != want) {
                return Err(format!(
                    "func_id {func} is an {} kernel ({}), submitted as an {} task",
                    core.name(),
                    k.source,
                    want.name()
                ));
            }
            Some((func, k, want, u8::from(slot == 2)))
        } else {
            return Err(format!("unknown submit kind {}", s.kind));
        };
        let mut args = TaskArgs::new();
        let mut deps = Vec::new();
        let manual = self.manual();
        let mut descs = Vec::with_capacity(s.tensors.len());
        for (i, a) in s.tensors.iter().enumerate() {
            match a {
                ArgDesc::Create(ci) => {
                    let dtype = abi::dtype(ci.dtype)
                        .ok_or_else(|| format!("output {i}: unknown DataType {}", ci.dtype))?;
                    let shape =
                        dims(&ci.shapes, ci.ndims).map_err(|e| format!("output {i}: {e}"))?;
                    args = args.output(&shape, dtype);
                    descs.push((ChipTensor::default(), tag::OUTPUT));
                }
                ArgDesc::Existing(t, tg) => {
                    let tensor = self.tensor(t, i)?;
                    if let Some(p) = self.task_of(t.owner_task_id)? {
                        deps.push(p);
                    }
                    if !manual && !t.manual_dep {
                        self.track(t, *tg, me, &mut deps);
                    }
                    let mode = match *tg {
                        tag::INPUT => ArgMode::In,
                        tag::INOUT => ArgMode::InOut,
                        tag::OUTPUT_EXISTING => ArgMode::OutputExisting,
                        tag::NO_DEP => ArgMode::NoDep,
                        other => return Err(format!("tensor argument {i}: bad tag {other}")),
                    };
                    args = args.tensor(tensor, mode);
                    descs.push((*t, *tg));
                }
            }
        }
        for d in &s.deps {
            match self.task_of(*d)? {
                Some(p) => deps.push(p),
                None => return Err("an explicit dependency is the invalid task id".into()),
            }
        }
        deps.sort_unstable_by_key(|t| t.get());
        deps.dedup();
        args = args.after_all(deps);
        let simpler_id = me as u64;
        let submitted = match kernel {
            Some((func, k, core, sub_block)) => {
                if s.scalars.len() > abi::MAX_SCALAR_ARGS || s.tensors.len() > abi::MAX_TENSOR_ARGS
                {
                    return Err("too many arguments".into());
                }
                let blocks = u32::try_from(s.block_num.max(1)).unwrap_or(1);
                let payload = kernel::register(Payload {
                    entry: k.entry,
                    lib: k.lib.clone(),
                    func_id: func,
                    source: k.source.clone(),
                    note: format!(
                        "chip {}: kernel {} (func_id {func}) of callable {}, task {me}",
                        self.chip, k.source, self.callable
                    )
                    .into_bytes()
                    .into(),
                    tensors: descs.clone(),
                    scalars: s.scalars.clone(),
                    task_id: simpler_id,
                    sub_block,
                });
                self.payloads.push(payload);
                args = args.scalar(payload).deferred().blocks(blocks);
                let name = if core == CoreKind::Aic {
                    kernel::AIC
                } else {
                    kernel::AIV
                };
                self.orch.submit(name, args).map_err(|e| e.to_string())?
            }
            None => self.orch.submit_dummy(args).map_err(|e| e.to_string())?,
        };
        self.tasks.push(Some(submitted.task));
        let mut out = Submitted {
            task_id: simpler_id,
            outputs: Vec::new(),
        };
        let mut created = submitted.outputs.iter();
        for a in &s.tensors {
            let ArgDesc::Create(ci) = a else {
                continue;
            };
            let Some(t) = created.next() else {
                return Err("internal: an output was not allocated".into());
            };
            let base = t.buffer().addr() as u64;
            self.add_region(t.buffer().clone(), base, t.buffer().len());
            let addr = base + (t.region().offset() * t.dtype().size()) as u64;
            let shape: Vec<usize> = t.shape().to_vec();
            let d = Box::new(descriptor(addr, &shape, ci.dtype, simpler_id));
            if ci.has_initial_value {
                crate::entry::fill(&d, ci.initial_value);
            }
            out.outputs.push(std::ptr::from_ref::<ChipTensor>(&d));
            self.outputs.push(d);
        }
        Ok(out)
    }

    /// `(clusters, AIV cores)` of this chip.
    pub(crate) fn counts(&self) -> (i32, i32) {
        (self.cores.0 as i32, self.cores.1 as i32)
    }
}

/// The dtype of a host or window argument, by simpler's name.
pub(crate) fn dtype_of(name: &str) -> Result<(u8, DType), String> {
    let code = abi::dtype_code(name).ok_or_else(|| format!("unknown dtype {name:?}"))?;
    let d = abi::dtype(code).ok_or_else(|| format!("dtype {name:?} has no pto element type"))?;
    Ok((code, d))
}
