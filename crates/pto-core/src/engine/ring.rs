//! Per-scope-depth rings: a window of live tasks and a circular heap for their outputs.
//!
//! Tasks enter a ring in submission order and leave it in the same order, when the oldest is
//! consumed (finished, its scope ended, and every consumer that retains it finished). Output
//! bytes are bump-allocated and never straddle the end of the heap. See
//! `docs/design/dependency-engine.md` ("Rings and back-pressure").

use std::collections::VecDeque;

use super::TaskRef;
use crate::buffer::{AllocError, Buffer};

/// Alignment of every runtime-allocated output inside a ring heap.
pub(crate) const OUT_ALIGN: usize = 64;

#[derive(Debug)]
pub(crate) struct Ring {
    pub(crate) window: usize,
    pub(crate) heap_size: usize,
    heap: Option<Buffer>,
    /// Live tasks in submission order.
    pub(crate) live: VecDeque<TaskRef>,
    /// `(task, start, end)` of live allocations, oldest first.
    allocs: VecDeque<(u64, usize, usize)>,
    pub(crate) peak_bytes: usize,
    pub(crate) peak_tasks: usize,
}

/// Why an allocation cannot be made now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// The task window is full.
    Tasks,
    /// The heap has no room.
    Heap,
}

impl Ring {
    pub(crate) fn new(window: usize, heap_size: usize) -> Ring {
        Ring {
            window: window.max(2),
            heap_size,
            heap: None,
            live: VecDeque::new(),
            allocs: VecDeque::new(),
            peak_bytes: 0,
            peak_tasks: 0,
        }
    }

    /// True when this ring was made for a window of `window` tasks and a heap of `heap_size`
    /// bytes (a ring left by the last run serves the next one then).
    pub(crate) fn fits(&self, window: usize, heap_size: usize) -> bool {
        self.window == window.max(2) && self.heap_size == heap_size
    }

    /// Empties the ring for the next run (its task and allocation queues keep their memory,
    /// its heap stays). Only once every task left it: a live task's bytes stay its own.
    pub(crate) fn reset(&mut self) {
        debug_assert!(self.live.is_empty());
        self.live.clear();
        self.allocs.clear();
        self.peak_bytes = 0;
        self.peak_tasks = 0;
    }

    /// The heap buffer, allocated on first use (zeroed pages are mapped lazily by the OS).
    pub(crate) fn heap(
        &mut self,
        alloc: Option<&crate::buffer::BufferAllocator>,
    ) -> Result<Buffer, AllocError> {
        if let Some(b) = &self.heap {
            return Ok(b.clone());
        }
        let b = match alloc {
            Some(f) => f(self.heap_size)?,
            None => Buffer::zeroed(self.heap_size)?,
        };
        self.heap = Some(b.clone());
        Ok(b)
    }

    fn used_bytes(&self) -> usize {
        match (self.allocs.front(), self.allocs.back()) {
            (Some(f), Some(b)) if b.1 >= f.1 => b.2 - f.1,
            (Some(f), Some(b)) => self.heap_size - f.1 + b.2,
            _ => 0,
        }
    }

    /// Where `bytes` of outputs would go now, or why they cannot.
    pub(crate) fn try_place(&self, bytes: usize) -> Result<usize, Full> {
        if self.live.len() + 1 >= self.window {
            return Err(Full::Tasks);
        }
        if bytes == 0 {
            return Ok(0);
        }
        let (Some(front), Some(back)) = (self.allocs.front(), self.allocs.back()) else {
            return if bytes <= self.heap_size {
                Ok(0)
            } else {
                Err(Full::Heap)
            };
        };
        if back.1 >= front.1 {
            // Not wrapped: free space is [back.end, size) and [0, front.start).
            if back.2 + bytes <= self.heap_size {
                Ok(back.2)
            } else if bytes <= front.1 {
                Ok(0)
            } else {
                Err(Full::Heap)
            }
        } else if back.2 + bytes <= front.1 {
            Ok(back.2)
        } else {
            Err(Full::Heap)
        }
    }

    /// Commits a placement returned by [`Ring::try_place`] for `task`.
    pub(crate) fn commit(&mut self, task: TaskRef, start: usize, bytes: usize) {
        self.live.push_back(task);
        if bytes > 0 {
            self.allocs.push_back((task.id, start, start + bytes));
        }
        self.peak_tasks = self.peak_tasks.max(self.live.len());
        self.peak_bytes = self.peak_bytes.max(self.used_bytes());
    }

    /// Removes the oldest task, which must be `task`, and frees its bytes.
    pub(crate) fn pop_front(&mut self, task: TaskRef) {
        debug_assert_eq!(self.live.front(), Some(&task));
        self.live.pop_front();
        if self.allocs.front().map(|a| a.0) == Some(task.id) {
            self.allocs.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64) -> TaskRef {
        TaskRef {
            slot: id as u32,
            id,
        }
    }

    #[test]
    fn wraps_without_straddling() {
        let mut r = Ring::new(100, 256);
        assert_eq!(r.try_place(100), Ok(0));
        r.commit(t(1), 0, 100);
        assert_eq!(r.try_place(100), Ok(100));
        r.commit(t(2), 100, 100);
        // 56 bytes left at the end; 100 do not fit there nor before the oldest (start 0).
        assert_eq!(r.try_place(100), Err(Full::Heap));
        r.pop_front(t(1));
        // Now [0, 100) is free: wrap to 0.
        assert_eq!(r.try_place(100), Ok(0));
        r.commit(t(3), 0, 100);
        // Wrapped: only [100, 100) between back.end and front.start.
        assert_eq!(r.try_place(1), Err(Full::Heap));
        r.pop_front(t(2));
        assert_eq!(r.try_place(156), Ok(100));
        assert_eq!(r.try_place(157), Err(Full::Heap));
        r.pop_front(t(3));
        assert_eq!(r.try_place(256), Ok(0));
        assert_eq!(r.try_place(257), Err(Full::Heap));
    }

    #[test]
    fn window_limits_live_tasks() {
        let mut r = Ring::new(4, 0);
        for n in 0..3 {
            assert_eq!(r.try_place(0), Ok(0));
            r.commit(t(n), 0, 0);
        }
        assert_eq!(r.try_place(0), Err(Full::Tasks));
        r.pop_front(t(0));
        assert_eq!(r.try_place(0), Ok(0));
    }
}
