//! Communication domains as simpler's kernels see them: a pto window over the domain's members
//! and, per chip process, a `CommContext` whose `windowsIn[i]` is member i's part of the window
//! as mapped in this process. The context's address is what the host passes kernels as
//! `device_ctx`.

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;
use pto_comm::{Comm, Window, WindowSpec};
use pto_core::Buffer;

use crate::abi::{CommContext, COMM_MAX_RANKS};
use crate::request::{DomainRequest, DOMAIN_ROW};
use crate::SimplerError;

/// A domain this chip is a member of.
pub(crate) struct Domain {
    pub(crate) name: String,
    window: Window,
    /// Boxed: kernels hold its address.
    ctx: Box<CommContext>,
    /// This chip's part of the window, as one pto buffer (every tensor over it shares it, so
    /// that dependencies between them are seen).
    pub(crate) buffer: Buffer,
    /// Its address in this process.
    pub(crate) base: u64,
    pub(crate) len: usize,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Domains by (chip, id): the chips of a Worker may share this process (in-process children).
fn domains() -> &'static Mutex<HashMap<(usize, u64), Domain>> {
    static DOMAINS: OnceLock<Mutex<HashMap<(usize, u64), Domain>>> = OnceLock::new();
    DOMAINS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Where each named buffer starts in a member's window: back to back in order, as simpler
/// carves them (the host computes the same offsets).
pub fn buffer_offsets(sizes: &[u64]) -> Vec<u64> {
    let mut at = 0u64;
    sizes
        .iter()
        .map(|&n| {
            let o = at;
            at += n;
            o
        })
        .collect()
}

/// Allocates domain `req` over `world` (collective over its members) on chip `chip` and returns
/// this member's row: `[CommContext address, window base, window bytes, domain rank, domain
/// size, 0, 0, 0]`.
pub(crate) fn alloc(
    chip: usize,
    world: &Comm,
    req: &DomainRequest,
) -> Result<[u64; DOMAIN_ROW], SimplerError> {
    let bad = |why: String| SimplerError::Domain {
        name: req.name.clone(),
        why,
    };
    if req.members.len() > COMM_MAX_RANKS {
        return Err(bad(format!(
            "{} members: a CommContext holds at most {COMM_MAX_RANKS}",
            req.members.len()
        )));
    }
    if domains().lock().contains_key(&(chip, req.id)) {
        return Err(bad(format!("domain id {} is allocated already", req.id)));
    }
    let total: u64 = req.buffers.iter().map(|b| b.nbytes).sum();
    if total > req.window_size {
        return Err(bad(format!(
            "its buffers need {total} bytes, more than its window_size {}",
            req.window_size
        )));
    }
    let comm = world.domain(&req.members).map_err(|e| bad(e.to_string()))?;
    // Zeroed on every member before the allocation's barrier (pto's windows always are).
    let window = comm
        .alloc_window(&WindowSpec::new((req.window_size as usize).max(1)))
        .map_err(|e| bad(e.to_string()))?;
    let mut ctx = Box::new(CommContext {
        work_space: 0,
        work_space_size: 0,
        rank_id: comm.rank() as u32,
        rank_num: comm.size() as u32,
        win_size: req.window_size,
        windows_in: [0; COMM_MAX_RANKS],
        windows_out: [0; COMM_MAX_RANKS],
    });
    for r in 0..comm.size() {
        let p = window.peer_ptr(r).map_err(|e| bad(e.to_string()))? as u64;
        ctx.windows_in[r] = p;
        ctx.windows_out[r] = p;
    }
    let base = ctx.windows_in[comm.rank()];
    let len = window.len();
    let row = [
        std::ptr::from_ref::<CommContext>(&ctx) as u64,
        base,
        len as u64,
        comm.rank() as u64,
        comm.size() as u64,
        0,
        0,
        0,
    ];
    let buffer = window.local_buffer();
    tracing::debug!(
        domain = req.name,
        id = req.id,
        rank = comm.rank(),
        "simpler domain allocated"
    );
    domains().lock().insert(
        (chip, req.id),
        Domain {
            name: req.name.clone(),
            window,
            ctx,
            buffer,
            base,
            len,
        },
    );
    Ok(row)
}

/// Frees domain `id` on chip `chip` (collective over its members: a barrier, then the window
/// goes).
pub(crate) fn free(chip: usize, id: u64) -> Result<(), SimplerError> {
    let d = domains()
        .lock()
        .remove(&(chip, id))
        .ok_or_else(|| SimplerError::Domain {
            name: format!("#{id}"),
            why: "no such domain on this chip".into(),
        })?;
    let Domain {
        name, window, ctx, ..
    } = d;
    let r = window.release().map_err(|e| SimplerError::Domain {
        name,
        why: e.to_string(),
    });
    // Kernels of finished runs held the context's address: it goes only now.
    drop(ctx);
    r
}

/// The buffer and base address of domain `id`'s part on chip `chip`.
pub(crate) fn local_part(chip: usize, id: u64) -> Option<(Buffer, u64, usize)> {
    domains()
        .lock()
        .get(&(chip, id))
        .map(|d| (d.buffer.clone(), d.base, d.len))
}

/// Every domain's part on chip `chip`, for resolving addresses.
pub(crate) fn all_parts(chip: usize) -> Vec<(Buffer, u64, usize)> {
    domains()
        .lock()
        .iter()
        .filter(|((c, _), _)| *c == chip)
        .map(|(_, d)| (d.buffer.clone(), d.base, d.len))
        .collect()
}
