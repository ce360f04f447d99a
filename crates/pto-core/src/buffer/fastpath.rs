//! The two words of a buffer that let a registered borrow and an engine-ordered task find each
//! other without a lock (see the parent module's docs and `docs/design/dependency-engine.md`,
//! "The borrow table").
//!
//! * `owner`: the run whose engine-ordered tasks use the buffer without registering (the
//!   *fast path*), 0 when none. A run claims it at the first submit that names the buffer and
//!   gives it back when the run is over (not after a stalled run, whose tasks may still run).
//! * `registered`: how many borrows are registered in the buffer's table now.
//!
//! A task on the fast path announces itself (its thread's `current` word, `SeqCst`), then reads
//! `registered` ([`FastPath::any_registered`]). A borrower counts itself in `registered`, issues
//! a `SeqCst` fence and then reads `owner` ([`FastPath::register`]): only when a run owns the
//! buffer does it scan the announced tasks. Of the two sequences one comes first:
//!
//! * the borrower read `owner == 0`: the claim came later in the single total order of `SeqCst`
//!   operations, and the task's announcement and its read of `registered` come after the claim
//!   (the task was submitted after it), so that read sees the count: the task looks in the
//!   table;
//! * the borrower read an owner: it scans, and either sees the announcement or the task's read
//!   of `registered` sees the count.
//!
//! So a buffer no run owns costs a borrower no scan of every engine's running tasks (a global
//! lock and a reference count per engine, then a pinned node per busy thread). Modelled with
//! loom in `tests/loom.rs` (`a_registered_borrow_and_an_announced_task_never_miss`).

use pto_shm::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug, Default)]
pub struct FastPath {
    registered: AtomicU32,
    owner: AtomicU64,
}

impl FastPath {
    /// Counts a borrow the caller registered in the table; true when a run owns the buffer,
    /// and the caller must look at the running tasks announced on the fast path.
    pub fn register(&self) -> bool {
        self.registered.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.owner.load(Ordering::SeqCst) != 0
    }

    /// `n` registered borrows ended.
    pub fn unregister(&self, n: u32) {
        if n > 0 {
            self.registered.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// For a task on the fast path, after it announced itself: whether any borrow is
    /// registered (then it must look in the table). One load.
    pub fn any_registered(&self) -> bool {
        self.registered.load(Ordering::SeqCst) != 0
    }

    /// Registered borrows now (tests).
    pub fn registered(&self) -> u32 {
        self.registered.load(Ordering::SeqCst)
    }

    /// Lets run `nonce` use the buffer on the fast path: `Some(true)` when it just claimed it,
    /// `Some(false)` when it had it, `None` when another run has it.
    pub fn claim(&self, nonce: u64) -> Option<bool> {
        // A load first: the common answer ("ours already") writes nothing, so the line stays
        // shared with the core threads that read `registered`.
        match self.owner.load(Ordering::Acquire) {
            o if o == nonce => return Some(false),
            0 => {}
            _ => return None,
        }
        // `SeqCst`: a borrower that reads `owner` before this claim must be ordered before
        // the tasks submitted after it (see the module docs).
        match self
            .owner
            .compare_exchange(0, nonce, Ordering::SeqCst, Ordering::Acquire)
        {
            Ok(_) => Some(true),
            Err(o) if o == nonce => Some(false),
            Err(_) => None,
        }
    }

    /// Run `nonce` is over (every task of it finished): another run may claim the buffer.
    pub fn release(&self, nonce: u64) {
        let _ = self
            .owner
            .compare_exchange(nonce, 0, Ordering::SeqCst, Ordering::Relaxed);
    }
}
