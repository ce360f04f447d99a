//! The atomics shim: std atomics normally, loom's under `cfg(loom)`, so that the barrier and
//! signal protocols can be model-checked.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Parking primitives the protocols need from a 32-bit word.
pub trait Park {
    /// Sleeps while the word equals `expected`, at most `slice` (it may return early).
    fn park(&self, expected: u32, slice: std::time::Duration);
    /// Wakes every sleeper on the word.
    fn unpark_all(&self);
}

#[cfg(not(loom))]
impl Park for AtomicU32 {
    fn park(&self, expected: u32, slice: std::time::Duration) {
        crate::futex::wait(self, expected, Some(slice));
    }
    fn unpark_all(&self) {
        crate::futex::wake_all(self);
    }
}

#[cfg(loom)]
impl Park for AtomicU32 {
    fn park(&self, _expected: u32, _slice: std::time::Duration) {
        loom::thread::yield_now();
    }
    fn unpark_all(&self) {}
}
