//! Tensors: strided views over buffers, and the overlap test the dependency engine uses.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::buffer::{AllocError, Buffer};
use crate::dtype::{DType, Element};
use crate::TaskId;

/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 5;

/// Errors from building, viewing or accessing tensors.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A tensor needs 1 to [`MAX_DIMS`] dimensions.
    #[error("a tensor has 1 to {MAX_DIMS} dimensions, not {ndims}")]
    BadRank {
        /// The rank asked for.
        ndims: usize,
    },
    /// Strides must be positive.
    #[error("stride of dimension {dim} is 0; strides must be positive")]
    ZeroStride {
        /// The dimension.
        dim: usize,
    },
    /// The view reaches past the end of its buffer.
    #[error("view needs bytes up to {needed} but its buffer has {len}")]
    OutOfBuffer {
        /// One past the last byte the view touches.
        needed: usize,
        /// The buffer's length.
        len: usize,
    },
    /// Sizes overflow `usize`.
    #[error("tensor size overflows")]
    Overflow,
    /// A sub-view or index falls outside the tensor.
    #[error("{what}: {detail}")]
    OutOfRange {
        /// Which operation.
        what: &'static str,
        /// What was out of range.
        detail: String,
    },
    /// Reshape needs the same number of elements and a contiguous tensor.
    #[error("cannot reshape {from:?} into {to:?}: {why}")]
    Reshape {
        /// Old shape.
        from: Vec<usize>,
        /// New shape.
        to: Vec<usize>,
        /// Why not.
        why: &'static str,
    },
    /// Typed access with the wrong element type.
    #[error("tensor has dtype {actual}, accessed as {expected}")]
    DTypeMismatch {
        /// The type the access asked for.
        expected: DType,
        /// The tensor's dtype.
        actual: DType,
    },
    /// A slice of data does not match the tensor's element count.
    #[error("tensor has {expected} elements, data has {actual}")]
    LengthMismatch {
        /// Elements in the tensor.
        expected: usize,
        /// Elements supplied.
        actual: usize,
    },
    /// The memory is in use by a task that overlaps this access.
    #[error("buffer {buffer} is in use by a running task that overlaps this access")]
    Busy {
        /// The buffer's id.
        buffer: u64,
    },
    /// The runtime-allocated output was reclaimed after its scope ended.
    #[error("tensor produced by task {task} was reclaimed when its scope ended; read it inside the scope")]
    Stale {
        /// The producer.
        task: TaskId,
    },
    /// Allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
}

/// The geometry of a view: dtype, shape, element strides and element offset. `Copy`, so it can be
/// stored in tables and shared memory.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    pub(crate) dtype: DType,
    pub(crate) ndims: u8,
    pub(crate) shape: [usize; MAX_DIMS],
    pub(crate) strides: [usize; MAX_DIMS],
    pub(crate) offset: usize,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{:?}@{}/{:?}",
            self.dtype,
            self.shape(),
            self.offset,
            self.strides()
        )
    }
}

/// How two regions of one buffer relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// No element in common.
    Disjoint,
    /// The first contains every element of the second.
    Covers,
    /// They may share elements (the test is conservative: unknown counts as overlapping).
    Partial,
}

fn row_major_strides(shape: &[usize]) -> [usize; MAX_DIMS] {
    let mut s = [0; MAX_DIMS];
    let mut acc = 1usize;
    for i in (0..shape.len().min(MAX_DIMS)).rev() {
        s[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    s
}

impl Region {
    /// A contiguous row-major region starting at element `offset`.
    ///
    /// # Panics
    ///
    /// If `shape` has more than [`MAX_DIMS`] dimensions (an internal helper; public builders
    /// validate first).
    pub(crate) fn contiguous(dtype: DType, offset: usize, shape: &[usize]) -> Region {
        assert!(shape.len() <= MAX_DIMS);
        let mut sh = [1; MAX_DIMS];
        sh[..shape.len()].copy_from_slice(shape);
        Region {
            dtype,
            ndims: shape.len() as u8,
            shape: sh,
            strides: row_major_strides(shape),
            offset,
        }
    }

    fn checked(
        dtype: DType,
        offset: usize,
        shape: &[usize],
        strides: &[usize],
    ) -> Result<Region, TensorError> {
        if shape.is_empty() || shape.len() > MAX_DIMS || strides.len() != shape.len() {
            return Err(TensorError::BadRank {
                ndims: shape.len().max(strides.len()),
            });
        }
        let mut r = Region::contiguous(dtype, offset, shape);
        for (i, &s) in strides.iter().enumerate() {
            if s == 0 {
                return Err(TensorError::ZeroStride { dim: i });
            }
            r.strides[i] = s;
        }
        r.byte_end().ok_or(TensorError::Overflow)?;
        Ok(r)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape[..usize::from(self.ndims)]
    }

    /// Element strides.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..usize::from(self.ndims)]
    }

    /// Element offset of the first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Elements from the first to one past the last that the view touches (0 for an empty view).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        1 + self
            .shape()
            .iter()
            .zip(self.strides())
            .map(|(&n, &s)| (n - 1) * s)
            .sum::<usize>()
    }

    fn byte_end(&self) -> Option<usize> {
        let mut ext = 0usize;
        if self.numel() > 0 {
            ext = 1;
            for (&n, &s) in self.shape().iter().zip(self.strides()) {
                ext = ext.checked_add((n - 1).checked_mul(s)?)?;
            }
        }
        self.offset.checked_add(ext)?.checked_mul(self.dtype.size())
    }

    /// Byte range `[start, end)` of the extent.
    pub fn byte_range(&self) -> (usize, usize) {
        let sz = self.dtype.size();
        (self.offset * sz, (self.offset + self.extent()) * sz)
    }

    /// Bytes of data (`numel × dtype size`).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// True when the elements are laid out row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for i in (0..usize::from(self.ndims)).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i];
        }
        true
    }

    /// Per-dimension start coordinates and the final remainder, when the layout is a clean
    /// nesting (each dimension's tail fits inside the next outer stride); `None` otherwise.
    fn lattice(&self) -> Option<([usize; MAX_DIMS], usize)> {
        let n = usize::from(self.ndims);
        let mut c = [0; MAX_DIMS];
        let mut o = self.offset;
        for (ci, &s) in c.iter_mut().zip(&self.strides[..n]) {
            *ci = o / s;
            o %= s;
        }
        // Injectivity: for every i >= 1, the largest offset reachable in dims i.. stays below
        // the stride of dim i-1.
        let mut tail = o;
        for i in (1..n).rev() {
            tail += (c[i] + self.shape[i] - 1) * self.strides[i];
            if tail >= self.strides[i - 1] {
                return None;
            }
        }
        Some((c, o))
    }
}

/// Tests how region `a` relates to region `b` of the same buffer.
///
/// Conservative: when the layouts cannot be compared exactly (different strides or dtypes over
/// non-contiguous views) any intersection of byte extents counts as [`Overlap::Partial`]. The
/// dependency engine uses it; the borrow table uses the exact [`intersects`], because the
/// engine's pruning of covered entries is only transitive for exact answers (see there).
pub fn overlap(a: &Region, b: &Region) -> Overlap {
    if a.numel() == 0 || b.numel() == 0 {
        return Overlap::Disjoint;
    }
    if a == b {
        // The same view again (a chain of updates of one tensor): the common case.
        return Overlap::Covers;
    }
    let (a0, a1) = a.byte_range();
    let (b0, b1) = b.byte_range();
    if a1 <= b0 || b1 <= a0 {
        return Overlap::Disjoint;
    }
    if a.is_contiguous() && b.is_contiguous() {
        return if a0 <= b0 && b1 <= a1 {
            Overlap::Covers
        } else {
            Overlap::Partial
        };
    }
    if a.dtype != b.dtype || a.ndims != b.ndims || a.strides() != b.strides() {
        return Overlap::Partial;
    }
    let (Some((ca, ra)), Some((cb, rb))) = (a.lattice(), b.lattice()) else {
        return Overlap::Partial;
    };
    if ra != rb {
        return Overlap::Disjoint;
    }
    let mut covers = true;
    for i in 0..usize::from(a.ndims) {
        let (lo_a, hi_a) = (ca[i], ca[i] + a.shape[i]);
        let (lo_b, hi_b) = (cb[i], cb[i] + b.shape[i]);
        if hi_a <= lo_b || hi_b <= lo_a {
            return Overlap::Disjoint;
        }
        covers &= lo_a <= lo_b && hi_b <= hi_a;
    }
    if covers {
        Overlap::Covers
    } else {
        Overlap::Partial
    }
}

/// Marks whether a runtime-allocated output's memory is still reserved for it.
#[derive(Debug, Default)]
pub(crate) struct Lease {
    reclaimed: AtomicBool,
}

impl Lease {
    pub(crate) fn reclaim(&self) {
        self.reclaimed.store(true, Ordering::Release);
    }
    pub(crate) fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire)
    }
}

/// The task that produced a runtime-allocated output, and its memory lease.
#[derive(Clone, Debug)]
pub(crate) struct Origin {
    pub(crate) task: TaskId,
    pub(crate) lease: Arc<Lease>,
}

/// A strided view over a [`Buffer`]: up to five dimensions, element strides and an element offset.
///
/// Views, slices, reshapes and transposes only rewrite metadata. A tensor returned as a task's
/// output remembers the task, so that later tasks reading it depend on it.
///
/// ```
/// use pto_core::{DType, Tensor};
/// let t = Tensor::from_slice(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
/// let tt = t.transpose(0, 1)?;            // shape [3, 2], no copy
/// assert_eq!(tt.shape(), &[3, 2]);
/// assert_eq!(tt.read::<f32>()?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// let row = t.view(&[1, 3], &[1, 0])?;   // the second row
/// assert_eq!(row.read::<f32>()?, vec![4.0, 5.0, 6.0]);
/// assert_eq!(t.dtype(), DType::F32);
/// # Ok::<(), pto_core::TensorError>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) buffer: Buffer,
    pub(crate) region: Region,
    pub(crate) origin: Option<Origin>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Tensor");
        d.field("buffer", &self.buffer.id())
            .field("region", &self.region);
        if let Some(o) = &self.origin {
            d.field("task", &o.task);
        }
        d.finish()
    }
}

impl Tensor {
    /// A contiguous view of `shape` over `buffer`, starting at element `offset`.
    ///
    /// # Errors
    ///
    /// A bad rank or a view that does not fit the buffer.
    pub fn new(
        buffer: Buffer,
        dtype: DType,
        shape: &[usize],
        offset: usize,
    ) -> Result<Tensor, TensorError> {
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(TensorError::BadRank { ndims: shape.len() });
        }
        let strides = row_major_strides(shape);
        Self::strided(buffer, dtype, shape, &strides[..shape.len()], offset)
    }

    /// A view with explicit element strides.
    ///
    /// # Errors
    ///
    /// A bad rank, a zero stride, or a view that does not fit the buffer.
    pub fn strided(
        buffer: Buffer,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Tensor, TensorError> {
        let region = Region::checked(dtype, offset, shape, strides)?;
        Self::fit(buffer, region, None)
    }

    fn fit(buffer: Buffer, region: Region, origin: Option<Origin>) -> Result<Tensor, TensorError> {
        let needed = region.byte_end().ok_or(TensorError::Overflow)?;
        if needed > buffer.len() {
            return Err(TensorError::OutOfBuffer {
                needed,
                len: buffer.len(),
            });
        }
        Ok(Tensor {
            buffer,
            region,
            origin,
        })
    }

    /// A zero-filled tensor in a buffer of its own.
    ///
    /// # Errors
    ///
    /// A bad rank, or a size that cannot be allocated.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor, TensorError> {
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .ok_or(TensorError::Overflow)?;
        let bytes = numel
            .checked_mul(dtype.size())
            .ok_or(TensorError::Overflow)?;
        Tensor::new(Buffer::zeroed(bytes)?, dtype, shape, 0)
    }

    /// A tensor holding a copy of `data`.
    ///
    /// # Errors
    ///
    /// A bad rank, or `data.len()` differs from the shape's element count.
    pub fn from_slice<T: Element>(shape: &[usize], data: &[T]) -> Result<Tensor, TensorError> {
        let t = Tensor::zeros(shape, T::DTYPE)?;
        t.write(data)?;
        Ok(t)
    }

    /// The buffer this tensor views.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The view geometry.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.region.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.region.shape()
    }

    /// Element strides.
    pub fn strides(&self) -> &[usize] {
        self.region.strides()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.region.numel()
    }

    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        self.region.nbytes()
    }

    /// The task that produced this tensor, for a runtime-allocated output.
    pub fn producer(&self) -> Option<TaskId> {
        self.origin.as_ref().map(|o| o.task)
    }

    /// True when the elements are row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        self.region.is_contiguous()
    }

    fn derive(&self, region: Region) -> Result<Tensor, TensorError> {
        Self::fit(self.buffer.clone(), region, self.origin.clone())
    }

    /// A sub-box: `shape[i]` elements from `offsets[i]` in each dimension.
    ///
    /// # Errors
    ///
    /// [`TensorError::OutOfRange`] when the box leaves the tensor.
    pub fn view(&self, shape: &[usize], offsets: &[usize]) -> Result<Tensor, TensorError> {
        let n = usize::from(self.region.ndims);
        if shape.len() != n || offsets.len() != n {
            return Err(TensorError::OutOfRange {
                what: "view",
                detail: format!("{n}-d tensor, got shape {shape:?} and offsets {offsets:?}"),
            });
        }
        let mut r = self.region;
        for i in 0..n {
            let end = offsets[i]
                .checked_add(shape[i])
                .ok_or(TensorError::Overflow)?;
            if end > self.region.shape[i] {
                return Err(TensorError::OutOfRange {
                    what: "view",
                    detail: format!(
                        "dimension {i}: {}..{end} exceeds size {}",
                        offsets[i], self.region.shape[i]
                    ),
                });
            }
            if shape[i] > 0 {
                r.offset += offsets[i] * r.strides[i];
            }
            r.shape[i] = shape[i];
        }
        self.derive(r)
    }

    /// Elements `start, start+step, ...` below `end` of dimension `dim`.
    ///
    /// # Errors
    ///
    /// [`TensorError::OutOfRange`] for a bad dimension, range or a zero step.
    pub fn slice(
        &self,
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<Tensor, TensorError> {
        let n = usize::from(self.region.ndims);
        if dim >= n || step == 0 || start > end || end > self.region.shape[dim] {
            return Err(TensorError::OutOfRange {
                what: "slice",
                detail: format!(
                    "dim {dim} of {n}, {start}..{end} step {step}, size {}",
                    self.region.shape.get(dim).copied().unwrap_or(0)
                ),
            });
        }
        let mut r = self.region;
        let len = (end - start).div_ceil(step);
        if len > 0 {
            r.offset += start * r.strides[dim];
        }
        r.shape[dim] = len;
        r.strides[dim] *= step;
        self.derive(r)
    }

    /// The same elements in a new shape. Needs a contiguous tensor.
    ///
    /// # Errors
    ///
    /// [`TensorError::Reshape`] when the counts differ or the tensor is not contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let err = |why| TensorError::Reshape {
            from: self.shape().to_vec(),
            to: shape.to_vec(),
            why,
        };
        if shape.iter().product::<usize>() != self.numel() {
            return Err(err("element counts differ"));
        }
        if !self.is_contiguous() {
            return Err(err("tensor is not contiguous"));
        }
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(TensorError::BadRank { ndims: shape.len() });
        }
        self.derive(Region::contiguous(
            self.region.dtype,
            self.region.offset,
            shape,
        ))
    }

    /// Swaps two dimensions.
    ///
    /// # Errors
    ///
    /// [`TensorError::OutOfRange`] for a dimension past the rank.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor, TensorError> {
        let mut perm: Vec<usize> = (0..usize::from(self.region.ndims)).collect();
        if a >= perm.len() || b >= perm.len() {
            return Err(TensorError::OutOfRange {
                what: "transpose",
                detail: format!("dimensions {a} and {b} of a {}-d tensor", perm.len()),
            });
        }
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Reorders dimensions: dimension `i` of the result is dimension `perm[i]` of this one.
    ///
    /// # Errors
    ///
    /// [`TensorError::OutOfRange`] unless `perm` is a permutation of `0..rank`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor, TensorError> {
        let n = usize::from(self.region.ndims);
        let mut seen = [false; MAX_DIMS];
        if perm.len() != n
            || perm
                .iter()
                .any(|&p| p >= n || std::mem::replace(&mut seen[p], true))
        {
            return Err(TensorError::OutOfRange {
                what: "permute",
                detail: format!("{perm:?} is not a permutation of 0..{n}"),
            });
        }
        let mut r = self.region;
        for (i, &p) in perm.iter().enumerate() {
            r.shape[i] = self.region.shape[p];
            r.strides[i] = self.region.strides[p];
        }
        self.derive(r)
    }

    /// Errors unless the runtime still reserves this tensor's memory for its producer.
    pub(crate) fn check_live(&self) -> Result<(), TensorError> {
        match &self.origin {
            Some(o) if o.lease.is_reclaimed() => Err(TensorError::Stale { task: o.task }),
            _ => Ok(()),
        }
    }
}

mod intersect;
pub use intersect::intersects;

#[cfg(test)]
mod tests;
