//! Blocking without the GIL, in slices, so that the waiting thread can look for signals
//! (Ctrl-C) between them.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;

/// How long a blocking call waits without the GIL before it looks for signals (Ctrl-C).
pub(crate) const SIGNAL_SLICE: Duration = Duration::from_millis(20);

/// Receives from `rx` without the GIL, waiting at most `slice` (`None` waits until a message
/// or the last sender is gone).
pub(crate) fn recv_detached<T: Send>(
    py: Python<'_>,
    rx: &Mutex<mpsc::Receiver<T>>,
    slice: Option<Duration>,
) -> Result<T, RecvTimeoutError> {
    py.detach(|| {
        let rx = rx.lock().map_err(|_| RecvTimeoutError::Disconnected)?;
        match slice {
            Some(d) => rx.recv_timeout(d),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    })
}
