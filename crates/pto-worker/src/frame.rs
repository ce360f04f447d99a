//! Task frames and results: the bytes a parent writes into a child's mailbox and the bytes the
//! child writes back. Decoding checks every length and value, so a corrupt frame is an error,
//! never a panic or an out-of-bounds read.

use pto_core::{ArgMode, DType, MAX_DIMS};
use smallvec::SmallVec;

const MAGIC: u32 = u32::from_le_bytes(*b"PTOF");
const VERSION: u16 = 1;

/// What a frame asks the child to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A chip program (by index).
    Chip = 0,
    /// A sub-worker closure (by index).
    Sub = 1,
    /// A closure run on a child Worker (L4), by index.
    Worker = 2,
}

/// A tensor argument: a view of a shared-memory segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    /// The segment's name.
    pub segment: String,
    /// Offset of the buffer in the segment.
    pub buffer_offset: u64,
    /// Length of the buffer in bytes.
    pub buffer_len: u64,
    /// Element offset of the view in the buffer.
    pub offset: u64,
    /// Element type.
    pub dtype: DType,
    /// Access mode.
    pub mode: ArgMode,
    /// Shape.
    pub shape: Vec<u64>,
    /// Element strides.
    pub strides: Vec<u64>,
}

impl TensorDesc {
    /// The descriptor as a borrowed view.
    pub(crate) fn view(&self) -> TensorView<'_> {
        TensorView {
            segment: &self.segment,
            buffer_offset: self.buffer_offset,
            buffer_len: self.buffer_len,
            offset: self.offset,
            dtype: self.dtype,
            mode: self.mode,
            dims: self
                .shape
                .iter()
                .copied()
                .zip(self.strides.iter().copied())
                .collect(),
        }
    }
}

/// A task frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Chip program or sub-worker closure.
    pub kind: FrameKind,
    /// Which one.
    pub index: u32,
    /// Tensor arguments.
    pub tensors: Vec<TensorDesc>,
    /// Scalars: raw bits and dtype.
    pub scalars: Vec<(u64, DType)>,
    /// Record a trace.
    pub trace: bool,
}

/// A tensor argument as decoded in place: the segment's name borrowed from the frame's bytes.
#[derive(Clone, Debug)]
pub(crate) struct TensorView<'a> {
    pub(crate) segment: &'a str,
    pub(crate) buffer_offset: u64,
    pub(crate) buffer_len: u64,
    pub(crate) offset: u64,
    pub(crate) dtype: DType,
    pub(crate) mode: ArgMode,
    /// (extent, stride) per dimension.
    pub(crate) dims: SmallVec<[(u64, u64); MAX_DIMS]>,
}

/// A frame decoded without allocating (for a few arguments): what a child serves.
/// [`Frame::decode`] is this, copied out.
#[derive(Clone, Debug)]
pub(crate) struct FrameView<'a> {
    pub(crate) kind: FrameKind,
    pub(crate) index: u32,
    pub(crate) tensors: SmallVec<[TensorView<'a>; 4]>,
    pub(crate) scalars: SmallVec<[(u64, DType); 8]>,
    pub(crate) trace: bool,
}

impl<'a> FrameView<'a> {
    /// Decodes a frame, validating every field.
    ///
    /// # Errors
    ///
    /// [`FrameError`] naming the byte where decoding failed.
    pub(crate) fn parse(b: &'a [u8]) -> Result<FrameView<'a>, FrameError> {
        let mut r = R { b, at: 0 };
        if r.u32()? != MAGIC {
            return Err(r.err("bad magic"));
        }
        let v = r.u16()?;
        if v != VERSION {
            return Err(r.err(format!("version {v}, expected {VERSION}")));
        }
        let kind = match r.u8()? {
            0 => FrameKind::Chip,
            1 => FrameKind::Sub,
            2 => FrameKind::Worker,
            k => return Err(r.err(format!("unknown frame kind {k}"))),
        };
        let trace = match r.u8()? {
            0 => false,
            1 => true,
            t => return Err(r.err(format!("trace flag {t}"))),
        };
        let index = r.u32()?;
        let nt = r.u32()? as usize;
        if nt > MAX_ARGS {
            return Err(r.err(format!("{nt} tensors exceed {MAX_ARGS}")));
        }
        let mut tensors = SmallVec::with_capacity(nt);
        for _ in 0..nt {
            let segment = r.str_ref(200)?;
            let buffer_offset = r.u64()?;
            let buffer_len = r.u64()?;
            let offset = r.u64()?;
            let dt = r.u8()?;
            let dtype = DType::from_u8(dt).ok_or_else(|| r.err(format!("unknown dtype {dt}")))?;
            let mc = r.u8()?;
            let mode = mode_of(mc).ok_or_else(|| r.err(format!("unknown mode {mc}")))?;
            let nd = r.u8()? as usize;
            if nd == 0 || nd > MAX_DIMS {
                return Err(r.err(format!("{nd} dimensions")));
            }
            let mut dims = SmallVec::new();
            for _ in 0..nd {
                dims.push((r.u64()?, r.u64()?));
            }
            tensors.push(TensorView {
                segment,
                buffer_offset,
                buffer_len,
                offset,
                dtype,
                mode,
                dims,
            });
        }
        let ns = r.u32()? as usize;
        if ns > MAX_ARGS {
            return Err(r.err(format!("{ns} scalars exceed {MAX_ARGS}")));
        }
        let mut scalars = SmallVec::with_capacity(ns);
        for _ in 0..ns {
            let bits = r.u64()?;
            let dt = r.u8()?;
            let d =
                DType::from_u8(dt).ok_or_else(|| r.err(format!("unknown scalar dtype {dt}")))?;
            scalars.push((bits, d));
        }
        if r.at != b.len() {
            return Err(r.err(format!("{} trailing bytes", b.len() - r.at)));
        }
        Ok(FrameView {
            kind,
            index,
            tensors,
            scalars,
            trace,
        })
    }
}

/// A result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// 0 success, 1 the task failed, 2 the frame was invalid, 3 the task failed because of
    /// another child (a peer died, failed or aborted), 4 a wait on the others ran out.
    pub status: u32,
    /// Tasks the chip ran.
    pub tasks: u64,
    /// The error message (empty on success).
    pub message: String,
    /// Chrome trace events (JSON text, empty unless asked for).
    pub trace: String,
}

/// Why a frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("corrupt frame at byte {at}: {why}")]
pub struct FrameError {
    /// Where.
    pub at: usize,
    /// What.
    pub why: String,
}

fn mode_code(m: ArgMode) -> u8 {
    match m {
        ArgMode::In => 0,
        ArgMode::Out => 1,
        ArgMode::InOut => 2,
        ArgMode::OutputExisting => 3,
        ArgMode::NoDep => 4,
    }
}

fn mode_of(c: u8) -> Option<ArgMode> {
    Some(match c {
        0 => ArgMode::In,
        1 => ArgMode::Out,
        2 => ArgMode::InOut,
        3 => ArgMode::OutputExisting,
        4 => ArgMode::NoDep,
        _ => return None,
    })
}

struct W(Vec<u8>);
impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct R<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> R<'a> {
    fn err(&self, why: impl Into<String>) -> FrameError {
        FrameError {
            at: self.at,
            why: why.into(),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                self.err(format!(
                    "needs {n} more bytes, {} left",
                    self.b.len() - self.at
                ))
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.arr::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn str(&mut self, max: usize) -> Result<String, FrameError> {
        self.str_ref(max).map(str::to_string)
    }
    fn str_ref(&mut self, max: usize) -> Result<&'a str, FrameError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(self.err(format!("string of {n} bytes exceeds {max}")));
        }
        let s = self.take(n)?;
        std::str::from_utf8(s).map_err(|_| self.err("string is not UTF-8"))
    }
}

/// Most tensors and scalars one frame carries.
pub const MAX_ARGS: usize = 256;

/// Writes a frame field by field from borrowed parts ([`Frame::encode`] and the host's
/// kernels, which encode straight from a task's arguments without building a [`Frame`]).
pub(crate) struct Encoder(W);

impl Encoder {
    /// Starts a frame that carries `tensors` tensor descriptors.
    pub(crate) fn new(kind: FrameKind, trace: bool, index: u32, tensors: usize) -> Encoder {
        Encoder::into_buffer(Vec::with_capacity(256), kind, trace, index, tensors)
    }

    /// [`Encoder::new`], writing into `buf` (emptied first): a caller that encodes a frame
    /// per task keeps one buffer instead of allocating one each time.
    pub(crate) fn into_buffer(
        mut buf: Vec<u8>,
        kind: FrameKind,
        trace: bool,
        index: u32,
        tensors: usize,
    ) -> Encoder {
        buf.clear();
        let mut w = W(buf);
        w.u32(MAGIC);
        w.u16(VERSION);
        w.u8(kind as u8);
        w.u8(u8::from(trace));
        w.u32(index);
        w.u32(tensors as u32);
        Encoder(w)
    }

    /// One tensor descriptor; `dims` yields (extent, stride) per dimension.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tensor(
        &mut self,
        segment: &str,
        buffer_offset: u64,
        buffer_len: u64,
        offset: u64,
        dtype: DType,
        mode: ArgMode,
        dims: impl ExactSizeIterator<Item = (u64, u64)>,
    ) {
        let w = &mut self.0;
        w.str(segment);
        w.u64(buffer_offset);
        w.u64(buffer_len);
        w.u64(offset);
        w.u8(dtype as u8);
        w.u8(mode_code(mode));
        w.u8(dims.len() as u8);
        for (s, st) in dims {
            w.u64(s);
            w.u64(st);
        }
    }

    /// The scalars, which end the frame.
    pub(crate) fn finish(
        mut self,
        scalars: impl ExactSizeIterator<Item = (u64, DType)>,
    ) -> Vec<u8> {
        self.0.u32(scalars.len() as u32);
        for (bits, d) in scalars {
            self.0.u64(bits);
            self.0.u8(d as u8);
        }
        self.0 .0
    }
}

impl Frame {
    /// Encodes the frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(self.kind, self.trace, self.index, self.tensors.len());
        for t in &self.tensors {
            e.tensor(
                &t.segment,
                t.buffer_offset,
                t.buffer_len,
                t.offset,
                t.dtype,
                t.mode,
                t.shape.iter().copied().zip(t.strides.iter().copied()),
            );
        }
        e.finish(self.scalars.iter().copied())
    }

    /// Decodes a frame, validating every field.
    ///
    /// # Errors
    ///
    /// [`FrameError`] naming the byte where decoding failed.
    pub fn decode(b: &[u8]) -> Result<Frame, FrameError> {
        let v = FrameView::parse(b)?;
        Ok(Frame {
            kind: v.kind,
            index: v.index,
            tensors: v
                .tensors
                .iter()
                .map(|t| TensorDesc {
                    segment: t.segment.to_string(),
                    buffer_offset: t.buffer_offset,
                    buffer_len: t.buffer_len,
                    offset: t.offset,
                    dtype: t.dtype,
                    mode: t.mode,
                    shape: t.dims.iter().map(|d| d.0).collect(),
                    strides: t.dims.iter().map(|d| d.1).collect(),
                })
                .collect(),
            scalars: v.scalars.to_vec(),
            trace: v.trace,
        })
    }
}

/// Longest error message a result carries (longer ones are cut at a character boundary).
pub const MAX_MESSAGE: usize = 1024;

/// Cuts `s` to at most `max` bytes at a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Outcome {
    /// Encodes the result; the message is truncated to [`MAX_MESSAGE`] bytes and the trace
    /// dropped if it does not fit `cap` bytes.
    pub fn encode(&self, cap: usize) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(cap, &mut v);
        v
    }

    /// [`Outcome::encode`] into `out` (its bytes replaced): a child reuses one buffer.
    pub fn encode_into(&self, cap: usize, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(24 + self.message.len().min(MAX_MESSAGE) + self.trace.len().min(cap));
        let mut w = W(std::mem::take(out));
        w.u32(self.status);
        w.u64(self.tasks);
        w.str(truncate(&self.message, MAX_MESSAGE));
        let trace = if w.0.len() + 4 + self.trace.len() <= cap {
            self.trace.as_str()
        } else {
            ""
        };
        w.str(trace);
        *out = w.0;
    }

    /// Decodes a result.
    ///
    /// # Errors
    ///
    /// [`FrameError`].
    pub fn decode(b: &[u8]) -> Result<Outcome, FrameError> {
        let mut r = R { b, at: 0 };
        let status = r.u32()?;
        if status > 4 {
            return Err(r.err(format!("unknown status {status}")));
        }
        let tasks = r.u64()?;
        let message = r.str(MAX_MESSAGE)?;
        let trace = r.str(b.len())?;
        Ok(Outcome {
            status,
            tasks,
            message,
            trace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Frame {
        Frame {
            kind: FrameKind::Chip,
            index: 3,
            tensors: vec![TensorDesc {
                segment: "/pto.1.abc.t0".into(),
                buffer_offset: 256,
                buffer_len: 4096,
                offset: 8,
                dtype: DType::F32,
                mode: ArgMode::InOut,
                shape: vec![4, 4],
                strides: vec![4, 1],
            }],
            scalars: vec![(7, DType::I64)],
            trace: true,
        }
    }

    #[test]
    fn round_trips() {
        let f = sample();
        assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        let o = Outcome {
            status: 1,
            tasks: 9,
            message: "é".repeat(2000),
            trace: "[]".into(),
        };
        let d = Outcome::decode(&o.encode(1 << 16)).unwrap();
        assert!(d.message.len() <= MAX_MESSAGE && d.message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn truncated_and_garbled_frames_are_errors() {
        let b = sample().encode();
        for n in 0..b.len() {
            assert!(
                Frame::decode(&b[..n]).is_err(),
                "prefix of {n} bytes accepted"
            );
        }
        let mut bad = b.clone();
        bad[0] ^= 1;
        assert!(Frame::decode(&bad).unwrap_err().why.contains("magic"));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoders.
        #[test]
        fn decoding_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = Frame::decode(&bytes);
            let _ = Outcome::decode(&bytes);
        }

        /// Flipping any byte of a valid frame gives an error or a valid frame, never a panic.
        #[test]
        fn mutated_frames_never_panic(pos in 0usize..200, val in any::<u8>()) {
            let mut b = sample().encode();
            let p = pos % b.len();
            b[p] = val;
            let _ = Frame::decode(&b);
        }
    }
}
