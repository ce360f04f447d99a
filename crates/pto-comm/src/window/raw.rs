//! Raw access to this rank's part of a named buffer, for kernels that read and write window
//! memory directly (a C plugin's `pto_window_ptr`, Python's `ctx.window(name)`).

use super::Window;
use crate::check;
use crate::error::CommError;

impl Window {
    /// This rank's part of buffer `name`: its address and size in bytes, for reading and
    /// writing it directly.
    ///
    /// Under `pto check` the checker cannot see what is done through the pointer, so it takes
    /// the pointer as a write of the whole buffer by the running task, somewhere between the
    /// moment the pointer is taken and the kernel's end (outside a kernel: now). See
    /// `docs/design/check.md`. `op` names the access in its reports (`window pointer`,
    /// `window view`).
    ///
    /// # Errors
    ///
    /// No such buffer, or this rank's part is not mapped ([`Window::peer_ptr`]).
    pub fn buffer_ptr(&self, name: &str, op: &'static str) -> Result<(*mut u8, usize), CommError> {
        let b = self.buffer(name)?;
        let (off, bytes) = (b.offset, b.bytes);
        let base = self.peer_ptr(self.rank())?;
        if let Some(c) = check::active() {
            c.raw(self.comm().world_rank(), self.name(), (off, bytes), op);
        }
        Ok((base.wrapping_add(off), bytes))
    }
}
