//! A bounded multi-producer, single-consumer completion queue with sequence-number
//! publication, usable between threads and, placed in shared memory, between processes.
//!
//! Layout (`#[repr(C)]`, all atomics, zero-initialisable except the sequence numbers, which
//! [`CompletionQueue::init`] sets): a header `{capacity, head, tail}` on separate cache lines,
//! then `capacity` slots `{seq, token, status}`. A producer claims position `p` by
//! compare-and-swap on `head` when slot `p % capacity` has `seq == p` (free for this lap), writes
//! the payload, then release-stores `seq = p + 1`. The consumer pops position `t` when
//! `seq == t + 1`, reads the payload, then release-stores `seq = t + capacity` (free for the next
//! lap) and advances `tail`. A full queue is an error for the producer, never a wait.
//! Design note: `docs/design/completion-queue.md`; model-checked in `tests/loom.rs`.

#![allow(unsafe_code)]

use crate::sync::{AtomicU64, Ordering};

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("capacity", &self.capacity.0.load(Ordering::Relaxed))
            .field("head", &self.head.0.load(Ordering::Relaxed))
            .field("tail", &self.tail.0.load(Ordering::Relaxed))
            .finish()
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slot(seq {})", self.seq.load(Ordering::Relaxed))
    }
}

/// One completion: the token of the task it completes and a status (0 = success).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The task token.
    pub token: u64,
    /// 0 for success; anything else fails the task with that code.
    pub status: u64,
}

#[repr(C, align(64))]
struct Line(AtomicU64);

/// A queue slot.
#[repr(C)]
pub struct Slot {
    seq: AtomicU64,
    token: AtomicU64,
    status: AtomicU64,
}

/// The queue header; `capacity` slots follow it in memory.
#[repr(C)]
pub struct CompletionQueue {
    capacity: Line,
    head: Line,
    tail: Line,
}

/// Posting failed: the queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("completion queue of {capacity} entries is full (token {token:#x} not posted)")]
pub struct QueueFull {
    /// The queue's capacity.
    pub capacity: u64,
    /// The token that was not posted.
    pub token: u64,
}

impl CompletionQueue {
    /// Bytes needed for a queue of `capacity` entries.
    pub const fn bytes(capacity: usize) -> usize {
        std::mem::size_of::<CompletionQueue>() + capacity * std::mem::size_of::<Slot>()
    }

    fn slots(&self) -> &[Slot] {
        let n = self.capacity.0.load(Ordering::Relaxed) as usize;
        // SAFETY: `init` (or `attach`) established that `n` slots follow the header in the
        // same allocation; slots are atomics, valid when shared.
        unsafe {
            std::slice::from_raw_parts((self as *const CompletionQueue).add(1).cast::<Slot>(), n)
        }
    }

    /// Initialises a queue of `capacity` entries (a power of two, at least 2) in `mem`.
    ///
    /// # Safety
    ///
    /// `mem` points to at least [`CompletionQueue::bytes`]`(capacity)` writable bytes, aligned
    /// to 64, that nothing else uses while this runs and that outlive every reference returned
    /// now or later by [`CompletionQueue::attach`].
    pub unsafe fn init<'a>(mem: *mut u8, capacity: usize) -> &'a CompletionQueue {
        assert!(
            capacity.is_power_of_two() && capacity >= 2,
            "capacity {capacity}"
        );
        let q = mem.cast::<CompletionQueue>();
        // SAFETY: per the contract, `mem` is valid, aligned and exclusively ours.
        unsafe {
            q.write(CompletionQueue {
                capacity: Line(AtomicU64::new(capacity as u64)),
                head: Line(AtomicU64::new(0)),
                tail: Line(AtomicU64::new(0)),
            });
            let slots = q.add(1).cast::<Slot>();
            for i in 0..capacity {
                slots.add(i).write(Slot {
                    seq: AtomicU64::new(i as u64),
                    token: AtomicU64::new(0),
                    status: AtomicU64::new(0),
                });
            }
            &*q
        }
    }

    /// A reference to a queue another party initialised.
    ///
    /// # Safety
    ///
    /// `mem` points to a queue made by [`CompletionQueue::init`] whose memory outlives `'a`
    /// (for example inside a mapped segment); its capacity is validated against `max_bytes`.
    pub unsafe fn attach<'a>(mem: *mut u8, max_bytes: usize) -> Option<&'a CompletionQueue> {
        // SAFETY: per the contract the header is valid.
        let q = unsafe { &*mem.cast::<CompletionQueue>() };
        let cap = q.capacity.0.load(Ordering::Acquire) as usize;
        (cap.is_power_of_two() && cap >= 2 && Self::bytes(cap) <= max_bytes).then_some(q)
    }

    /// Capacity in entries.
    pub fn capacity(&self) -> usize {
        self.capacity.0.load(Ordering::Relaxed) as usize
    }

    /// Posts a completion; any thread or process may call it.
    ///
    /// # Errors
    ///
    /// [`QueueFull`] when every slot holds an unconsumed completion.
    pub fn post(&self, c: Completion) -> Result<(), QueueFull> {
        let slots = self.slots();
        let cap = slots.len() as u64;
        let mut pos = self.head.0.load(Ordering::Relaxed);
        loop {
            let slot = &slots[(pos % cap) as usize];
            let seq = slot.seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos) as i64;
            if diff == 0 {
                match self.head.0.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        slot.token.store(c.token, Ordering::Relaxed);
                        slot.status.store(c.status, Ordering::Relaxed);
                        slot.seq.store(pos + 1, Ordering::Release);
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return Err(QueueFull {
                    capacity: cap,
                    token: c.token,
                });
            } else {
                // Another producer claimed `pos` (our `head` was stale): reload it. Loom may
                // serve the same stale value on every retry of this loop unless the thread
                // yields (a real CPU's coherence makes the newer value visible).
                #[cfg(loom)]
                loom::thread::yield_now();
                pos = self.head.0.load(Ordering::Relaxed);
            }
        }
    }

    /// Pops the oldest completion. Only one consumer may call it at a time.
    pub fn pop(&self) -> Option<Completion> {
        let slots = self.slots();
        let cap = slots.len() as u64;
        let t = self.tail.0.load(Ordering::Relaxed);
        let slot = &slots[(t % cap) as usize];
        if slot.seq.load(Ordering::Acquire) != t + 1 {
            return None;
        }
        let c = Completion {
            token: slot.token.load(Ordering::Relaxed),
            status: slot.status.load(Ordering::Relaxed),
        };
        slot.seq.store(t + cap, Ordering::Release);
        self.tail.0.store(t + 1, Ordering::Relaxed);
        Some(c)
    }

    /// True when nothing is waiting to be popped (a hint; producers may be mid-post).
    pub fn is_empty(&self) -> bool {
        let slots = self.slots();
        let t = self.tail.0.load(Ordering::Relaxed);
        slots[(t % slots.len() as u64) as usize]
            .seq
            .load(Ordering::Acquire)
            != t + 1
    }
}

/// A queue in heap memory, for threads of one process.
pub struct HeapQueue {
    mem: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the memory is only accessed through `CompletionQueue`'s atomics.
unsafe impl Send for HeapQueue {}
// SAFETY: as above.
unsafe impl Sync for HeapQueue {}

impl std::fmt::Debug for HeapQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HeapQueue({} entries)", self.queue().capacity())
    }
}

impl HeapQueue {
    /// A queue of `capacity` entries (rounded up to a power of two, at least 2).
    ///
    /// # Panics
    ///
    /// If the allocation fails or the size overflows.
    pub fn new(capacity: usize) -> HeapQueue {
        let cap = capacity.max(2).next_power_of_two();
        #[allow(clippy::unwrap_used)] // a size this small always makes a layout
        let layout = std::alloc::Layout::from_size_align(CompletionQueue::bytes(cap), 64).unwrap();
        // SAFETY: the layout has a non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        if mem.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: fresh, aligned, large enough, exclusively ours, freed only in Drop.
        unsafe { CompletionQueue::init(mem, cap) };
        HeapQueue { mem, layout }
    }

    /// The queue.
    pub fn queue(&self) -> &CompletionQueue {
        // SAFETY: initialised in `new`, lives until drop.
        unsafe { &*self.mem.cast::<CompletionQueue>() }
    }
}

impl Drop for HeapQueue {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.mem, self.layout) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_full_and_wraparound() {
        let h = HeapQueue::new(4);
        let q = h.queue();
        assert!(q.pop().is_none());
        for t in 0..4 {
            q.post(Completion {
                token: t,
                status: 0,
            })
            .unwrap();
        }
        assert_eq!(
            q.post(Completion {
                token: 9,
                status: 0
            }),
            Err(QueueFull {
                capacity: 4,
                token: 9
            })
        );
        for lap in 0..10u64 {
            let c = q.pop().unwrap();
            assert_eq!(c.token, lap);
            q.post(Completion {
                token: lap + 4,
                status: lap,
            })
            .unwrap();
        }
        assert!(!q.is_empty());
    }

    #[test]
    fn many_producers_lose_and_duplicate_nothing() {
        const P: u64 = 4;
        const N: u64 = 50_000;
        let h = Arc::new(HeapQueue::new(64));
        let hs: Vec<_> = (0..P)
            .map(|p| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..N {
                        let c = Completion {
                            token: p << 32 | i,
                            status: 0,
                        };
                        while h.queue().post(c).is_err() {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; P as usize];
        let mut got = 0;
        while got < P * N {
            if let Some(c) = h.queue().pop() {
                let (p, i) = ((c.token >> 32) as usize, c.token & 0xffff_ffff);
                assert_eq!(i, next[p], "producer {p} out of order or duplicated");
                next[p] += 1;
                got += 1;
            } else {
                std::thread::yield_now();
            }
        }
        for h in hs {
            h.join().unwrap();
        }
        assert!(h.queue().pop().is_none());
    }
}
