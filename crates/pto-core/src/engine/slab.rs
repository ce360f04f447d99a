//! Task nodes: slots allocated once, in chunks, and reused by later tasks.
//!
//! A slot's shared state is atomics (dependency count, references, state, successor list) that
//! any thread may touch. Its *body* (kernel, arguments, the producers it retains) is written by
//! the orchestrating thread before the task is published, only read while the task can run
//! (but for the bytes its finishing thread writes back unchanged, to take the lines into its
//! cache: [`Slot::take_lines`]), and dropped by the orchestrating thread when it reclaims the
//! slot; the protocol, not a lock,
//! keeps those phases apart, which is why this module may use `unsafe` (see each block).
//! Chunks never move once allocated, so a slot index stays valid for every thread.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::gate::ReaderGate;
use super::succ::SuccList;
use crate::buffer::BorrowSet;
use crate::kernel::{CoreId, Kernel, Payload, Registrations};

/// Slots per chunk.
const CHUNK: usize = 256;

/// A slot that holds no task.
pub(crate) const FREE: u64 = u64::MAX;

/// What a slot's task is doing. Stored in [`Slot::state`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum State {
    Waiting = 0,
    Ready = 1,
    Running = 2,
    /// The kernel returned; completion waits for registered conditions.
    Deferred = 3,
    Done = 4,
    Failed = 5,
    Poisoned = 6,
}

impl State {
    pub(crate) fn from_u32(v: u32) -> State {
        match v {
            0 => State::Waiting,
            1 => State::Ready,
            2 => State::Running,
            3 => State::Deferred,
            4 => State::Done,
            5 => State::Failed,
            _ => State::Poisoned,
        }
    }

    pub(crate) fn finished(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Poisoned)
    }
}

/// What the orchestrating thread writes before publishing a task. It stays in its slot from
/// one task to the next (emptied, not freed), so that publishing a task moves no large value.
///
/// `repr(C)`, in the order a task touches it: the fields every task uses (kernel, token, the
/// producers it retains, its first tensor arguments) share the lines right after the node's
/// shared state; the vectors most tasks leave empty (explicit initialisations, scalars, the
/// producers' ids for traces) come last and are only touched when `extras` says they hold
/// something. A task thus touches about five lines of its node instead of ten: every line is a
/// cache miss when the orchestrator runs thousands of tasks ahead.
#[derive(Default)]
#[repr(C)]
pub(crate) struct Body {
    /// `None` for a dependency-only (dummy) task.
    pub(crate) kernel: Option<Arc<Kernel>>,
    /// Borrow and completion token: `nonce << 40 | id`.
    pub(crate) token: u64,
    /// Bit `i` set: tensor argument `i` needs a registered borrow when the task runs (an
    /// untracked argument, or a buffer another run also uses); the others are ordered by the
    /// engine and only announced (see `docs/design/dependency-engine.md`).
    pub(crate) registered: u64,
    /// Producer slots this task keeps alive until it finishes.
    pub(crate) retains: SmallVec<[u32; 4]>,
    pub(crate) payload: Payload,
    /// The ids of producers that had failed and retired when it was submitted (they poison
    /// it; traces list them beside the retained ones).
    pub(crate) deps: SmallVec<[u64; 4]>,
}

/// The lines from a node's start to the end of its body: what the orchestrating thread writes
/// when it fills a node (a task of four tensors reaches the last of them).
const BODY_LINES: usize =
    (std::mem::offset_of!(Slot, body) + std::mem::size_of::<Body>()).div_ceil(64);

/// One task node. `repr(C)` with the fields every task touches first, and aligned to a cache
/// line, so that a task's hot state spans two lines and no two nodes share one.
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// The task id in this slot, or [`FREE`].
    pub(crate) id: AtomicU64,
    /// `1 + id` of the failed task this one is poisoned by (its own, if it failed), or 0.
    pub(crate) root: AtomicU64,
    /// Producers whose edges are wired (or about to be) and that have not finished.
    pub(crate) fanin: AtomicU32,
    /// Why the slot must stay: one while the task is unfinished, one per consumer that retains
    /// it and has not finished. Reclaimable at zero once its scope has ended (which only the
    /// orchestrating thread tracks, so that ending a scope touches no shared line).
    pub(crate) refs: AtomicU32,
    /// A [`State`].
    pub(crate) state: AtomicU32,
    /// Next SPMD block to hand out, and blocks finished.
    pub(crate) blocks_next: AtomicU32,
    pub(crate) blocks_done: AtomicU32,
    /// True once `error`, `regs` or `borrows` holds something (so the common path locks none).
    pub(crate) extra: AtomicBool,
    /// Threads that read the body of the running task without running it (the borrow
    /// table's scan), closed by the thread that finishes it (see [`super::gate`]).
    pub(crate) readers: ReaderGate,
    pub(crate) succ: SuccList,
    /// Trace: start of the first block (f64 bits; 0 = none yet), and its core
    /// (`queue << 16 | index`).
    pub(crate) first_start: AtomicU64,
    pub(crate) first_core: AtomicU32,
    body: UnsafeCell<Body>,
    // Rarely used (a failure, deferred completion, untracked arguments: `extra` says when),
    // so after the body, away from the lines every task touches.
    /// The first failing block: (block, core, message).
    pub(crate) error: Mutex<Option<(u32, Option<CoreId>, String)>>,
    /// What its blocks registered for deferred completion.
    pub(crate) regs: Mutex<Registrations>,
    /// Borrows registered for its untracked arguments, released when it finishes.
    pub(crate) borrows: Mutex<Option<BorrowSet>>,
}

// SAFETY: every field but `body` is thread-safe. `body` is written by the orchestrating
// thread while no other thread can reach the slot (before the task is published, or after it
// was reclaimed), and read by other threads only between those points; the one other write,
// `Slot::take_lines` (bytes written back unchanged), comes from the task's finishing thread
// while it alone accesses the body (its reference keeps the orchestrating thread out, the
// closed reader gate every other reader); see the module docs and `Slot::body`.
unsafe impl Sync for Slot {}
// SAFETY: as above; `Body` is `Send` (its fields are).
unsafe impl Send for Slot {}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            id: AtomicU64::new(FREE),
            fanin: AtomicU32::new(0),
            refs: AtomicU32::new(0),
            root: AtomicU64::new(0),
            state: AtomicU32::new(State::Done as u32),
            succ: SuccList::default(),
            blocks_next: AtomicU32::new(0),
            blocks_done: AtomicU32::new(0),
            error: Mutex::new(None),
            regs: Mutex::new(Registrations::default()),
            borrows: Mutex::new(None),
            extra: AtomicBool::new(false),
            readers: ReaderGate::default(),
            first_start: AtomicU64::new(0),
            first_core: AtomicU32::new(0),
            body: UnsafeCell::new(Body::default()),
        }
    }
}

impl Slot {
    pub(crate) fn state(&self) -> State {
        State::from_u32(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: State) {
        self.state.store(s as u32, Ordering::Release);
    }

    /// Asks for this node's lines up to the end of its body (shared state, the body's
    /// every-task fields and its inline tensor arguments: see [`Body`]) for writing, ahead of
    /// reusing it (ten lines, three tensors, before: a diamond task's third tensor store
    /// stalled, 33% of `commit`'s own samples; 4-5% faster diamond with all of them): the core
    /// thread that ran its last task holds them, and fetching them at the stores would stall
    /// the orchestrating thread (a full store buffer, or its next locked instruction waiting
    /// for them). Measured: the chain's submit costs about half as much with it.
    pub(crate) fn prefetch(&self) {
        self.prefetch_lines(BODY_LINES);
    }

    /// Asks for the node's first `lines` lines for writing (see [`Slot::prefetch`]).
    pub(crate) fn prefetch_lines(&self, lines: usize) {
        let p = (self as *const Slot).cast::<u8>();
        for line in 0..lines {
            pto_shm::sync::prefetch_write(p.wrapping_add(line * 64));
        }
    }

    /// Asks for the lines of the node's tensor arguments (a vector of their own, which core
    /// threads read when the task runs) for writing: retiring the task drops them, and the
    /// emptied vector then takes the arguments of a task to come.
    ///
    /// # Safety
    ///
    /// Only the orchestrating thread calls it (the one thread that writes the vector).
    pub(crate) unsafe fn prefetch_args(&self) {
        // SAFETY: per the contract no other thread writes the body now.
        let t = &unsafe { self.body() }.payload.tensors;
        let bytes = t.len() * std::mem::size_of::<crate::args::TensorArg>();
        for line in 0..bytes.div_ceil(64).min(5) {
            pto_shm::sync::prefetch_write(t.as_ptr().cast::<u8>().wrapping_add(line * 64));
        }
    }

    /// The body of the task in this slot.
    ///
    /// # Safety
    ///
    /// The caller holds the task published and not reclaimed: it runs (or finishes) the task,
    /// holds a reference counted in `refs`, or is the orchestrating thread.
    pub(crate) unsafe fn body(&self) -> &Body {
        // SAFETY: per the contract no thread writes the body now.
        unsafe { &*self.body.get() }
    }

    /// The body, to fill in place before [`Slot::install`].
    ///
    /// # Safety
    ///
    /// Only the orchestrating thread calls it, on a free slot (no other thread can reach it),
    /// and holds no other reference to the body meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn body_mut(&self) -> &mut Body {
        // SAFETY: per the contract this is the only reference to the body.
        unsafe { &mut *self.body.get() }
    }

    /// Publishes the task filled in with [`Slot::body_mut`]: resets the shared state and sets
    /// its id. `fanin` counts the edges about to be wired (see `Orchestrator::commit`).
    ///
    /// # Safety
    ///
    /// Only the orchestrating thread calls it, on a free slot whose body it just filled.
    pub(crate) unsafe fn install(&self, id: u64, fanin: u32) {
        self.succ.reset();
        self.fanin.store(fanin, Ordering::Relaxed);
        // Unfinished (the open scope is counted by the orchestrating thread alone).
        self.refs.store(1, Ordering::Relaxed);
        self.root.store(0, Ordering::Relaxed);
        self.blocks_next.store(0, Ordering::Relaxed);
        self.blocks_done.store(0, Ordering::Relaxed);
        self.first_start.store(0, Ordering::Relaxed);
        self.readers.reset();
        // A load and a store, not a swap: a locked instruction here would wait for the stores
        // above, to a line the core thread that ran this slot's last task still holds.
        if self.extra.load(Ordering::Relaxed) {
            self.extra.store(false, Ordering::Relaxed);
            *self.error.lock() = None;
            *self.regs.lock() = Registrations::default();
            *self.borrows.lock() = None;
        }
        self.state.store(State::Waiting as u32, Ordering::Relaxed);
        // Publishes the fields above to whoever reads the id with Acquire.
        self.id.store(id, Ordering::Release);
    }

    /// Takes the cache lines of the body and of the argument vector into this thread's cache
    /// for writing, by writing each line's first byte back unchanged.
    ///
    /// The orchestrating thread wrote them when it filled the node, and the core threads
    /// that ran the task only read them: the lines are then shared by two caches, and the
    /// orchestrating thread's next stores to them (when it fills the node and reuses the
    /// vector for a later task) must first invalidate the other copy, one line at a time
    /// between its locked instructions (about 45 ns a line on this machine, against 7 ns for
    /// a line that one other cache holds modified). Done by the finishing core thread, which
    /// has time to spare while the orchestrating thread is the bottleneck. See
    /// `docs/design/chip-scheduler.md`.
    ///
    /// # Safety
    ///
    /// The caller alone accesses the body: it runs the task's last block, holds the task's
    /// reference (so the orchestrating thread does not reclaim the node), and
    /// `readers.close()` returned true.
    pub(crate) unsafe fn take_lines(&self) {
        // The line the body starts in also holds the node's last shared atomics: take it with
        // an atomic store of a trace field's own value (its writer, the task's first block,
        // is done).
        self.first_core
            .store(self.first_core.load(Ordering::Relaxed), Ordering::Relaxed);
        let body = self.body.get();
        // The body's other lines, up to the end of the argument vector's header (the rarely
        // used vectors after it are only read).
        let at = std::mem::offset_of!(Slot, body);
        let start = at.next_multiple_of(64) - at;
        let end = std::mem::offset_of!(Body, payload) + std::mem::offset_of!(Payload, scalars);
        let base = body.cast::<u8>();
        for off in (start..end).step_by(64) {
            // SAFETY: inside the body, which the caller alone accesses.
            unsafe { touch(base.add(off)) };
        }
        // SAFETY: as above; the vector's buffer belongs to the body.
        let v = unsafe { &mut (*body).payload.tensors };
        let bytes = std::mem::size_of_val(v.as_slice());
        let p = v.as_mut_ptr().cast::<u8>();
        // Every line the elements cover: one byte every 64, and the last byte.
        for off in (0..bytes).step_by(64).chain(bytes.checked_sub(1)) {
            // SAFETY: inside the vector's initialised elements.
            unsafe { touch(p.add(off)) };
        }
    }

    /// Frees the slot and empties its body in place (dropping the task's tensors and kernel).
    ///
    /// # Safety
    ///
    /// Only the orchestrating thread calls it, once `refs` is zero (no other thread uses the
    /// slot any more, and none can start to: the task finished and nothing retains it).
    pub(crate) unsafe fn reclaim(&self) {
        self.id.store(FREE, Ordering::Release);
        // SAFETY: per the contract nobody else reads the body now.
        let b = unsafe { &mut *self.body.get() };
        // The kernel stays: the next task in this node most likely runs the same one (the
        // orchestrator drops it when the run ends, `Slot::forget_kernel`).
        b.payload.tensors.clear();
        b.retains.clear();
        // The rarely used vectors, only when they hold something (their lines stay cold).
        if b.payload.extras != 0 {
            b.payload.scalars.clear();
            b.payload.inits.clear();
            b.deps.clear();
            b.payload.extras = 0;
        }
    }
}

impl Slot {
    /// Drops the kernel a free node kept from its last task.
    ///
    /// # Safety
    ///
    /// As [`Slot::body_mut`]: only the orchestrating thread, on a free node.
    pub(crate) unsafe fn forget_kernel(&self) {
        // SAFETY: per the contract this is the only reference to the body.
        unsafe { self.body_mut() }.kernel = None;
    }
}

/// Writes the byte at `p` back unchanged (volatile, so that it is not elided; as
/// `MaybeUninit`, so that a padding byte may be copied).
///
/// # Safety
///
/// `p` is valid for reads and writes, and no other thread accesses it meanwhile.
unsafe fn touch(p: *mut u8) {
    let p = p.cast::<std::mem::MaybeUninit<u8>>();
    // SAFETY: per the contract.
    unsafe { std::ptr::write_volatile(p, std::ptr::read_volatile(p)) };
}

/// Every slot of one chip, in chunks that never move.
pub(crate) struct Slab {
    chunks: Box<[AtomicPtr<Slot>]>,
    /// Chunks allocated (only the orchestrating thread allocates).
    len: AtomicU32,
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slab({} chunks)", self.len.load(Ordering::Relaxed))
    }
}

impl Slab {
    /// Room for up to `max_slots` slots (allocated a chunk at a time, as needed).
    pub(crate) fn new(max_slots: usize) -> Slab {
        let n = max_slots.div_ceil(CHUNK).max(1);
        Slab {
            chunks: (0..n)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            len: AtomicU32::new(0),
        }
    }

    /// Slot `i`, which must have been handed out by [`Slab::grow`].
    pub(crate) fn get(&self, i: u32) -> &Slot {
        let (c, o) = (i as usize / CHUNK, i as usize % CHUNK);
        let p = self.chunks[c].load(Ordering::Acquire);
        assert!(!p.is_null(), "slot {i} was never allocated");
        // SAFETY: `p` points to a live array of CHUNK slots (allocated in `grow`, freed only
        // when the slab drops, which needs `&mut self`), and `o < CHUNK`.
        unsafe { &*p.add(o) }
    }

    /// Allocates one more chunk; returns the indices of its slots, or `None` when the slab is
    /// at its size. Orchestrating thread only.
    pub(crate) fn grow(&self) -> Option<std::ops::Range<u32>> {
        let c = self.len.load(Ordering::Relaxed) as usize;
        if c >= self.chunks.len() {
            return None;
        }
        let chunk: Box<[Slot]> = (0..CHUNK).map(|_| Slot::default()).collect();
        let p = Box::into_raw(chunk).cast::<Slot>();
        self.chunks[c].store(p, Ordering::Release);
        self.len.store(c as u32 + 1, Ordering::Relaxed);
        let base = (c * CHUNK) as u32;
        Some(base..base + CHUNK as u32)
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        for c in self.chunks.iter() {
            let p = c.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: `p` came from `Box::into_raw` of a boxed slice of CHUNK slots in
                // `grow`, and is freed once, here (`&mut self`: no thread uses the slab).
                drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK)) });
            }
        }
    }
}

#[cfg(test)]
mod layout {
    use super::*;
    use std::mem::offset_of;

    /// The shared state and the body's every-task fields (the tensor arguments' vector among
    /// them) of a node lie in its first four cache lines; the rarely used parts come after.
    #[test]
    fn what_every_task_touches_is_in_four_lines() {
        let body = offset_of!(Slot, body);
        let payload = body + offset_of!(Body, payload);
        for hot in [
            body + offset_of!(Body, kernel),
            body + offset_of!(Body, token),
            body + offset_of!(Body, registered),
            body + offset_of!(Body, retains),
            payload + offset_of!(Payload, block_num),
            payload + offset_of!(Payload, extras),
            payload + offset_of!(Payload, tensors),
        ] {
            assert!(hot + 8 <= 4 * 64, "a hot field at {hot}");
        }
        // `Slot::take_lines` takes the line the body starts in through `first_core`.
        assert!(body % 64 == 0 || offset_of!(Slot, first_core) / 64 == body / 64);
        for cold in [
            offset_of!(Slot, error),
            offset_of!(Slot, regs),
            offset_of!(Slot, borrows),
            body + offset_of!(Body, deps),
            payload + offset_of!(Payload, scalars),
            payload + offset_of!(Payload, inits),
        ] {
            assert!(cold >= 3 * 64, "a cold field at {cold}");
        }
    }
}
