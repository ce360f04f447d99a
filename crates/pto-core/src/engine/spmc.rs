//! The orchestrating thread's ready queue: a bounded ring with one producer and many consumers.
//!
//! A task found ready at submit is queued by the orchestrating thread alone, so its queue needs
//! no locked instruction on the producer's side: the producer writes the entry, then raises
//! `tail` with a plain release store. A consumer reads `head` and `tail`, reads the entry at
//! `head`, and claims it by moving `head` on with a compare-and-swap; the counters only grow,
//! so a consumer that read an entry the producer has since overwritten (the ring wrapped) fails
//! its swap and retries. The producer never overwrites an entry not yet claimed: it keeps at
//! most `capacity` entries in flight, checking against a copy of `head` that it refreshes only
//! when the ring looks full (so it does not read the line consumers write on every claim), and
//! reports a full ring to the caller, which queues the task elsewhere.
//!
//! Compared with a multi-producer queue, a push is two plain stores instead of two locked
//! instructions on lines the consumers keep writing.
//!
//! The producer may also *stage* entries: write them and count them in `staged`, a word on its
//! own line that consumers read only before they park, and make them visible later, several at
//! once, by raising `tail` to `staged` ([`Spmc::publish`]): the lines consumers read (`tail`,
//! the entries) then move to them once per batch instead of once per entry. Any thread may
//! publish what is staged ([`Spmc::publish_staged`], a maximum on `tail`), so a thread about
//! to park never leaves staged work behind. Modelled with loom in `tests/loom.rs`. See
//! `docs/design/chip-scheduler.md`.

use crossbeam_utils::CachePadded;

use super::sync::{AtomicU32, AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug)]
pub struct Spmc {
    /// The next entry to claim (consumers).
    head: CachePadded<AtomicU64>,
    /// Entries below it are visible to consumers. Raised by the producer when it publishes,
    /// or by a consumer about to park ([`Spmc::publish_staged`]); never past `staged`.
    tail: CachePadded<AtomicU64>,
    /// The producer's line: the next entry to write (`staged`), and its copy of `head`.
    /// Consumers read `staged` only before they park, so while the producer stages entries
    /// the line stays with it.
    prod: CachePadded<(AtomicU64, AtomicU64)>,
    entries: Box<[AtomicU32]>,
    mask: u64,
}

impl Spmc {
    /// A ring of `capacity` entries (rounded up to a power of two, at least 2).
    pub fn new(capacity: usize) -> Spmc {
        let cap = capacity.max(2).next_power_of_two();
        Spmc {
            head: CachePadded::new(AtomicU64::new(0)),
            tail: CachePadded::new(AtomicU64::new(0)),
            prod: CachePadded::new((AtomicU64::new(0), AtomicU64::new(0))),
            entries: (0..cap).map(|_| AtomicU32::new(0)).collect(),
            mask: cap as u64 - 1,
        }
    }

    /// Queues `v` and publishes it with every entry staged before; gives it back when the ring
    /// is full. Only one thread may push or stage (the producer); any thread may pop.
    pub fn push(&self, v: u32) -> Result<(), u32> {
        self.stage(v)?;
        self.publish();
        Ok(())
    }

    /// Writes `v` into the ring without making it visible to consumers yet (see
    /// [`Spmc::publish`]); gives it back when the ring is full. Producer only.
    pub fn stage(&self, v: u32) -> Result<(), u32> {
        let (staged, seen_head) = &*self.prod;
        let t = staged.load(Ordering::Relaxed);
        if t - seen_head.load(Ordering::Relaxed) > self.mask {
            // Looks full: look at where the consumers are now.
            let h = self.head.load(Ordering::Acquire);
            seen_head.store(h, Ordering::Relaxed);
            if t - h > self.mask {
                return Err(v);
            }
        }
        // The entry at `t` was claimed (its consumer moved `head` past it, with the Acquire
        // load above or an earlier one ordering that before this store).
        self.entries[(t & self.mask) as usize].store(v, Ordering::Relaxed);
        // Release: a consumer that reads this count (to publish it) sees the entry.
        staged.store(t + 1, Ordering::Release);
        Ok(())
    }

    /// Makes every staged entry visible; true when some were not yet. Producer only. (A
    /// plain store: a consumer raising `tail` concurrently read a `staged` no larger than
    /// the one stored here, and raises it with a maximum, so `tail` never moves back.)
    pub fn publish(&self) -> bool {
        let s = self.prod.0.load(Ordering::Relaxed);
        if self.tail.load(Ordering::Relaxed) >= s {
            return false;
        }
        self.tail.store(s, Ordering::Release);
        true
    }

    /// True when entries are staged but not visible (a snapshot).
    pub fn has_staged(&self) -> bool {
        self.prod.0.load(Ordering::Acquire) > self.tail.load(Ordering::Acquire)
    }

    /// Makes the staged entries visible, from any thread (a consumer about to park, so that
    /// entries the producer left staged while it does something else are not stranded); true
    /// when it published some.
    pub fn publish_staged(&self) -> bool {
        let s = self.prod.0.load(Ordering::Acquire);
        // Nothing staged (the common case): no locked instruction.
        if self.tail.load(Ordering::Acquire) >= s {
            return false;
        }
        self.tail.fetch_max(s, Ordering::AcqRel) < s
    }

    /// Claims the oldest entry, if any.
    pub fn pop(&self) -> Option<u32> {
        loop {
            let h = self.head.load(Ordering::Acquire);
            let t = self.tail.load(Ordering::Acquire);
            if h >= t {
                return None;
            }
            let v = self.entries[(h & self.mask) as usize].load(Ordering::Relaxed);
            if self
                .head
                .compare_exchange_weak(h, h + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(v);
            }
        }
    }

    /// Entries waiting (a snapshot).
    pub fn len(&self) -> usize {
        let h = self.head.load(Ordering::Acquire);
        self.tail.load(Ordering::Acquire).saturating_sub(h) as usize
    }

    /// True when no entry is waiting (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) >= self.tail.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_come_out_in_order_and_a_full_ring_refuses() {
        let q = Spmc::new(3);
        assert!(q.is_empty());
        for v in 0..4 {
            assert_eq!(q.push(v), Ok(()));
        }
        assert_eq!(q.push(9), Err(9));
        assert_eq!(q.pop(), Some(0));
        assert_eq!(q.push(4), Ok(()));
        let got: Vec<u32> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(q.is_empty());
        // Around the ring many times.
        for v in 0..100 {
            assert_eq!(q.push(v), Ok(()));
            assert_eq!(q.pop(), Some(v));
        }
    }

    #[test]
    fn every_entry_is_claimed_once_by_racing_consumers() {
        let q = std::sync::Arc::new(Spmc::new(8));
        let n = 20_000u32;
        let consumers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                    while std::time::Instant::now() < deadline {
                        match q.pop() {
                            Some(u32::MAX) => break,
                            Some(v) => got.push(v),
                            None => std::thread::yield_now(),
                        }
                    }
                    got
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut refused = Vec::new();
        for v in (0..n).chain([u32::MAX; 3]) {
            loop {
                match q.push(v) {
                    Ok(()) => break,
                    // Full: what a caller does (queue it elsewhere) unless it must go here.
                    Err(v) if v != u32::MAX && refused.len() < 1_000 => {
                        refused.push(v);
                        break;
                    }
                    Err(_) => {
                        assert!(std::time::Instant::now() < deadline, "consumers stalled");
                        std::thread::yield_now();
                    }
                }
            }
        }
        let mut all: Vec<u32> = consumers
            .into_iter()
            .flat_map(|c| c.join().unwrap_or_default())
            .chain(refused)
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>());
    }
}
