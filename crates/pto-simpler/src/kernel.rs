//! simpler's kernels on pto's cores: two registry kernels (`simpler.aic`, `simpler.aiv`) that
//! call the task's compiled `kernel_entry` with simpler's argument array.
//!
//! A submit registers the task's payload (its kernel, tensor descriptors and scalars, as the
//! orchestration gave them) and passes its id as the pto task's one scalar. The kernel builds
//! the array a compiled kernel reads: `args[0..T)` point to the task's `ChipTensor`s,
//! `args[T..T+S)` are its scalars, `args[48]` and `args[49]` point to its `LocalContext` (block
//! index and count, and the slab deferred completions go to) and `GlobalContext`. After the
//! call, each slab entry becomes a pto deferred-completion condition.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use pto_core::{CoreKind, KernelCtx, KernelError, KernelRegistry, RegistryError};

use crate::abi::{self, ChipTensor, KernelEntry};
use crate::library::Library;

/// The registry name of the AIC kernel.
pub const AIC: &str = "simpler.aic";
/// The registry name of the AIV kernel.
pub const AIV: &str = "simpler.aiv";

/// One task's kernel and arguments.
pub(crate) struct Payload {
    pub(crate) entry: KernelEntry,
    /// Keeps the library loaded while the task may run.
    pub(crate) lib: Arc<Library>,
    pub(crate) func_id: i32,
    pub(crate) source: String,
    /// What a crash in the kernel reports (its source, func_id, callable and task).
    pub(crate) note: Box<[u8]>,
    /// Descriptors and tags, in argument order (OUTPUT slots are filled from the task's pto
    /// tensors when it runs).
    pub(crate) tensors: Vec<(ChipTensor, i32)>,
    pub(crate) scalars: Vec<u64>,
    /// The simpler task id (the deferred-completion token kernels see).
    pub(crate) task_id: u64,
    /// 1 for an AIV1 kernel, else 0.
    pub(crate) sub_block: u8,
}

fn store() -> &'static RwLock<HashMap<u64, Arc<Payload>>> {
    static STORE: OnceLock<RwLock<HashMap<u64, Arc<Payload>>>> = OnceLock::new();
    STORE.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Registers `p`; the id to pass the task.
pub(crate) fn register(p: Payload) -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    store().write().insert(id, Arc::new(p));
    id
}

/// Payloads of each chip's last run (by chip rank), dropped when that chip's next run starts:
/// the orchestration returns before its tasks run, and a chip runs one callable at a time.
fn retired() -> &'static parking_lot::Mutex<HashMap<usize, Vec<u64>>> {
    static RETIRED: OnceLock<parking_lot::Mutex<HashMap<usize, Vec<u64>>>> = OnceLock::new();
    RETIRED.get_or_init(|| parking_lot::Mutex::new(HashMap::new()))
}

/// Keeps `ids` until chip `chip`'s next run.
pub(crate) fn retire(chip: usize, ids: Vec<u64>) {
    retired().lock().entry(chip).or_default().extend(ids);
}

/// Drops the payloads of chip `chip`'s previous runs (every task of them has finished).
pub(crate) fn forget_previous(chip: usize) {
    let ids = retired().lock().remove(&chip).unwrap_or_default();
    if ids.is_empty() {
        return;
    }
    let mut s = store().write();
    for id in ids {
        s.remove(&id);
    }
}

/// A registry with the two kernels (and nothing else).
///
/// # Errors
///
/// None in practice (the names are fresh); the registry's error otherwise.
pub fn registry() -> Result<KernelRegistry, RegistryError> {
    let mut r = KernelRegistry::new();
    r.register(AIC, CoreKind::Aic, run)?;
    r.register(AIV, CoreKind::Aiv, run)?;
    Ok(r)
}

fn run(ctx: &KernelCtx<'_>) -> Result<(), KernelError> {
    let id: u64 = ctx.scalar(0)?;
    let p = store()
        .read()
        .get(&id)
        .cloned()
        .ok_or_else(|| KernelError::msg(format!("internal: no payload {id} for this task")))?;
    let mut descs: Vec<ChipTensor> = Vec::with_capacity(p.tensors.len());
    for (i, (d, tag)) in p.tensors.iter().enumerate() {
        if *tag == abi::tag::OUTPUT {
            let t = ctx.tensor(i)?;
            let addr = t.buffer().addr() as u64 + (t.region().offset() * t.dtype().size()) as u64;
            let code = descs_code(t.dtype());
            descs.push(crate::runtime::descriptor(
                addr,
                t.shape().as_slice(),
                code,
                p.task_id,
            ));
        } else {
            descs.push(*d);
        }
    }
    let blocks = (ctx.block_idx(), ctx.block_num());
    let outcome = crate::entry::call_kernel(&p, &descs, blocks);
    drop(descs);
    match outcome {
        Err(code) => Err(KernelError::msg(format!(
            "kernel func_id {} ({}, {}) set error code {code} in its completion slab",
            p.func_id,
            p.source,
            p.lib.path().display()
        ))),
        Ok(conditions) => {
            for (addr, expected) in conditions {
                ctx.defer(crate::entry::counter_condition(addr, expected))?;
            }
            Ok(())
        }
    }
}

/// The `DataType` byte of a pto dtype.
fn descs_code(d: pto_core::DType) -> u8 {
    use pto_core::DType;
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::I32 => 2,
        DType::I16 => 3,
        DType::I8 => 4,
        DType::Bf16 => 6,
        DType::I64 => 7,
        DType::U64 => 8,
        DType::U16 => 9,
        DType::U32 => 10,
        DType::Bool => 11,
        _ => 5,
    }
}
