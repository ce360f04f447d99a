//! Chip memory the host allocated on a chip (simpler's `alloc_child_tensor`): pto buffers in the
//! chip process, kept until freed (or until the chip ends), named by the host's id. Tasks name
//! them by id and offset; the host copies into and out of them with chip tasks.

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;
use pto_core::{Buffer, DType, Tensor};

use crate::SimplerError;

/// Allocations by (chip, id): the chips of a Worker may share this process (in-process
/// children).
fn memory() -> &'static Mutex<HashMap<(usize, u64), Buffer>> {
    static MEMORY: OnceLock<Mutex<HashMap<(usize, u64), Buffer>>> = OnceLock::new();
    MEMORY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn bad(id: u64, why: impl Into<String>) -> SimplerError {
    SimplerError::Device {
        id,
        why: why.into(),
    }
}

/// Allocates `nbytes` of zeroed chip memory as `id` on chip `chip`; its address in this process.
pub(crate) fn alloc(chip: usize, id: u64, nbytes: u64) -> Result<u64, SimplerError> {
    if nbytes == 0 {
        return Err(bad(id, "an allocation of 0 bytes"));
    }
    let n = usize::try_from(nbytes).map_err(|_| bad(id, format!("{nbytes} bytes")))?;
    let b = Buffer::zeroed(n).map_err(|e| bad(id, format!("{nbytes} bytes: {e}")))?;
    let addr = b.addr() as u64;
    let mut m = memory().lock();
    if m.contains_key(&(chip, id)) {
        return Err(bad(id, "allocated already"));
    }
    m.insert((chip, id), b);
    Ok(addr)
}

/// Frees `id` on chip `chip`.
pub(crate) fn free(chip: usize, id: u64) -> Result<(), SimplerError> {
    memory()
        .lock()
        .remove(&(chip, id))
        .map(drop)
        .ok_or_else(|| bad(id, "no such allocation on this chip"))
}

/// The buffer of `id` on chip `chip`, its address and length.
pub(crate) fn get(chip: usize, id: u64) -> Option<(Buffer, u64, usize)> {
    memory()
        .lock()
        .get(&(chip, id))
        .map(|b| (b.clone(), b.addr() as u64, b.len()))
}

/// Every allocation on chip `chip`, for resolving addresses.
pub(crate) fn all(chip: usize) -> Vec<(Buffer, u64, usize)> {
    memory()
        .lock()
        .iter()
        .filter(|((c, _), _)| *c == chip)
        .map(|(_, b)| (b.clone(), b.addr() as u64, b.len()))
        .collect()
}

/// `nbytes` bytes of allocation `id` on chip `chip` from byte `offset`, as a byte tensor.
pub(crate) fn bytes(
    chip: usize,
    id: u64,
    offset: u64,
    nbytes: u64,
) -> Result<Tensor, SimplerError> {
    let (b, _, len) = get(chip, id).ok_or_else(|| bad(id, "no such allocation on this chip"))?;
    let end = offset.checked_add(nbytes).filter(|&e| e <= len as u64);
    if end.is_none() || nbytes == 0 {
        return Err(bad(
            id,
            format!("{nbytes} bytes at {offset} do not fit its {len} bytes"),
        ));
    }
    Tensor::new(b, DType::U8, &[nbytes as usize], offset as usize)
        .map_err(|e| bad(id, e.to_string()))
}
