//! What a window is made of: its size per rank and the named buffers carved from it.

use pto_core::DType;

use crate::error::CommError;

/// Alignment of every rank's window and of every named buffer.
pub const WINDOW_ALIGN: usize = 64;
/// The largest window this build accepts per rank (1 TiB).
pub const MAX_WINDOW: usize = 1 << 40;

/// A named buffer to carve out of a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Number of elements.
    pub count: usize,
    /// Bytes reserved (at least `count × dtype size`; more leaves padding).
    pub bytes: usize,
}

impl BufferSpec {
    /// `count` elements of `dtype`, exactly `count × size` bytes.
    pub fn new(name: &str, dtype: DType, count: usize) -> BufferSpec {
        BufferSpec {
            name: name.to_string(),
            dtype,
            count,
            bytes: count.saturating_mul(dtype.size()),
        }
    }

    /// Reserves `bytes` instead (must hold the elements).
    pub fn with_bytes(mut self, bytes: usize) -> BufferSpec {
        self.bytes = bytes;
        self
    }
}

/// What to allocate: bytes per rank and the named buffers carved from them, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowSpec {
    /// Bytes per rank.
    pub bytes: usize,
    /// Named buffers.
    pub buffers: Vec<BufferSpec>,
}

impl WindowSpec {
    /// A window of `bytes` per rank with no named buffers.
    pub fn new(bytes: usize) -> WindowSpec {
        WindowSpec {
            bytes,
            buffers: Vec::new(),
        }
    }

    /// A window just big enough for `buffers` (each aligned to [`WINDOW_ALIGN`]).
    pub fn for_buffers(buffers: Vec<BufferSpec>) -> WindowSpec {
        let bytes = buffers.iter().fold(0usize, |a, b| {
            a.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN + b.bytes
        });
        WindowSpec { bytes, buffers }
    }

    /// Adds a named buffer.
    pub fn buffer(mut self, b: BufferSpec) -> WindowSpec {
        self.buffers.push(b);
        self
    }
}

/// A named buffer's place in the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferRef {
    /// Its name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Elements.
    pub count: usize,
    /// Offset in the window.
    pub offset: usize,
    /// Bytes reserved.
    pub bytes: usize,
}

/// A typed remote reference: `offset` into rank `rank`'s part of a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRef {
    /// Target rank (dense, in the window's communicator).
    pub rank: usize,
    /// Byte offset in its window.
    pub offset: usize,
}

pub(crate) fn carve(spec: &WindowSpec) -> Result<Vec<BufferRef>, CommError> {
    let mut out: Vec<BufferRef> = Vec::with_capacity(spec.buffers.len());
    let mut at = 0usize;
    for b in &spec.buffers {
        let need = b
            .count
            .checked_mul(b.dtype.size())
            .ok_or_else(|| CommError::BadBuffer {
                name: b.name.clone(),
                why: "element count overflows".into(),
            })?;
        if b.bytes < need {
            return Err(CommError::BadBuffer {
                name: b.name.clone(),
                why: format!(
                    "{} bytes cannot hold {} {} elements ({need} bytes)",
                    b.bytes, b.count, b.dtype
                ),
            });
        }
        if out.iter().any(|o| o.name == b.name) {
            return Err(CommError::BadBuffer {
                name: b.name.clone(),
                why: "name used twice".into(),
            });
        }
        let offset = at.div_ceil(WINDOW_ALIGN) * WINDOW_ALIGN;
        let end = offset.saturating_add(b.bytes);
        if end > spec.bytes {
            return Err(CommError::BadBuffer {
                name: b.name.clone(),
                why: format!(
                    "needs bytes {offset}..{end} but the window has {} bytes",
                    spec.bytes
                ),
            });
        }
        out.push(BufferRef {
            name: b.name.clone(),
            dtype: b.dtype,
            count: b.count,
            offset,
            bytes: b.bytes,
        });
        at = end;
    }
    Ok(out)
}
