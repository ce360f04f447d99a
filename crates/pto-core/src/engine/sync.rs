//! The atomics the engine's lock-free protocols use: std's normally, loom's under `cfg(loom)`
//! (through `pto_shm::sync`), so that the successor list and the sleep protocol can be
//! model-checked (`tests/loom.rs`, `scripts/loom.sh`).

pub use pto_shm::sync::{fence, AsymmetricFence, AtomicU32, AtomicU64, Mutex, Ordering};
// The engine's words live in this process's memory and only its threads wait on them:
// private futexes.
pub use pto_shm::sync::ParkLocal as Park;
