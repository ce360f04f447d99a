//! Observing kernels as they run, for checkers (`pto check`): a process-wide observer is told
//! when a kernel block starts and ends, with its [`KernelCtx`] (task, kernel, arguments,
//! extension). Off by default: the engine then pays one relaxed atomic load per block.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::kernel::KernelCtx;

/// Told about every kernel block of every chip of this process while installed.
pub trait KernelObserver: Send + Sync {
    /// A block of a kernel is about to run on this thread.
    fn kernel_start(&self, ctx: &KernelCtx<'_>);
    /// The block returned (`ok` false when it failed or panicked).
    fn kernel_end(&self, ctx: &KernelCtx<'_>, ok: bool);
}

static ON: AtomicBool = AtomicBool::new(false);
static OBSERVER: RwLock<Option<Arc<dyn KernelObserver>>> = RwLock::new(None);

/// Installs `o` for every chip of this process (replacing any other), or removes it (`None`).
pub fn set_observer(o: Option<Arc<dyn KernelObserver>>) {
    let on = o.is_some();
    *OBSERVER.write() = o;
    ON.store(on, Ordering::Release);
}

/// The installed observer, if any.
pub(crate) fn observer() -> Option<Arc<dyn KernelObserver>> {
    if !ON.load(Ordering::Relaxed) {
        return None;
    }
    OBSERVER.read().clone()
}
