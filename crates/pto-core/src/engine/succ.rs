//! A producer's list of consumers, and the "finished" bit that closes it.
//!
//! Only the orchestrating thread appends (an edge is wired when a consumer is submitted); the
//! thread that finishes the producer closes the list and reads it once. Both act on one word,
//! `count | FINISHED`: the appender writes the entry, then publishes it by raising the count
//! with a compare-and-swap that fails if the producer finished meanwhile (then the edge does
//! not exist and the appender treats the producer as done); the finisher sets `FINISHED` with
//! one `fetch_or`, which also tells it how many entries were published. So no edge is ever
//! added to a finished producer, and no published edge is missed (libomp's scheme, with the
//! per-task lock replaced by that one word). Modelled with loom in `tests/loom.rs`.

use smallvec::SmallVec;

use super::sync::{AtomicU32, Mutex, Ordering};

const FINISHED: u32 = 1 << 31;
/// Entries held in the node itself; more go to an overflow vector.
const INLINE: usize = 4;

/// See the module docs.
#[derive(Debug)]
pub struct SuccList {
    word: AtomicU32,
    inline: [AtomicU32; INLINE],
    overflow: Mutex<Vec<u32>>,
}

impl Default for SuccList {
    fn default() -> Self {
        SuccList {
            word: AtomicU32::new(0),
            inline: std::array::from_fn(|_| AtomicU32::new(0)),
            overflow: Mutex::new(Vec::new()),
        }
    }
}

impl SuccList {
    /// Makes the list empty and open again, for a new task in this slot (orchestrator, while
    /// no other thread can reach the slot).
    pub fn reset(&self) {
        if self.word.load(Ordering::Relaxed) & !FINISHED > INLINE as u32 {
            self.overflow
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clear();
        }
        self.word.store(0, Ordering::Release);
    }

    /// Adds consumer `c` unless the producer already finished; false when it had (the edge
    /// then does not exist). Only one thread may append.
    pub fn push(&self, c: u32) -> bool {
        let w = self.word.load(Ordering::Acquire);
        if w & FINISHED != 0 {
            return false;
        }
        let n = w as usize;
        if n < INLINE {
            self.inline[n].store(c, Ordering::Relaxed);
        } else {
            self.overflow
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(c);
        }
        match self
            .word
            .compare_exchange(w, w + 1, Ordering::Release, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(_) => {
                // Finished meanwhile: the finisher read `n` entries, not this one.
                if n >= INLINE {
                    self.overflow
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .pop();
                }
                false
            }
        }
    }

    /// Closes the list (the producer finished) and returns every consumer published before.
    /// Called once per task.
    pub fn finish(&self) -> SmallVec<[u32; 8]> {
        let mut out = SmallVec::new();
        self.finish_each(|c| out.push(c));
        out
    }

    /// [`SuccList::finish`], handing each consumer to `f` in order instead of collecting
    /// them (the path of every finishing task: no list is built).
    pub fn finish_each(&self, mut f: impl FnMut(u32)) {
        let w = self.word.fetch_or(FINISHED, Ordering::AcqRel);
        debug_assert!(w & FINISHED == 0, "a task finished twice");
        let n = (w & !FINISHED) as usize;
        for e in &self.inline[..n.min(INLINE)] {
            f(e.load(Ordering::Relaxed));
        }
        if n > INLINE {
            // Copied out first: `f` may take other locks.
            let rest: Vec<u32> = self
                .overflow
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)[..n - INLINE]
                .to_vec();
            rest.into_iter().for_each(f);
        }
    }

    /// Calls `f` with each consumer held in the node that was published so far: a hint for
    /// the thread about to run the producer (more may be published later, and the list is not
    /// closed). Any thread may call it.
    pub fn peek_each(&self, mut f: impl FnMut(u32)) {
        let n = (self.word.load(Ordering::Acquire) & !FINISHED) as usize;
        for e in &self.inline[..n.min(INLINE)] {
            f(e.load(Ordering::Relaxed));
        }
    }

    /// True once [`SuccList::finish`] ran.
    pub fn is_finished(&self) -> bool {
        self.word.load(Ordering::Acquire) & FINISHED != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_before_finish_are_seen_and_after_are_refused() {
        let l = SuccList::default();
        for c in 0..10 {
            assert!(l.push(c));
        }
        assert_eq!(l.finish().as_slice(), &(0..10).collect::<Vec<_>>()[..]);
        assert!(!l.push(99));
        assert!(l.is_finished());
        l.reset();
        assert!(!l.is_finished());
        assert!(l.push(5));
        assert_eq!(l.finish().as_slice(), &[5]);
    }
}
