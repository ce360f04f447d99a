//! Tensors: strided views over buffers, and the overlap test the dependency engine uses.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::buffer::Buffer;
use crate::dtype::{DType, Element};
use crate::TaskId;

pub use crate::geometry::MAX_DIMS;

/// The task that produced a runtime-allocated output, and whether its memory is still reserved
/// for it. One per task with outputs, shared by them.
#[derive(Debug)]
pub(crate) struct Lease {
    task: TaskId,
    reclaimed: AtomicBool,
}

impl Lease {
    pub(crate) fn new(task: TaskId) -> Lease {
        Lease {
            task,
            reclaimed: AtomicBool::new(false),
        }
    }
    pub(crate) fn reclaim(&self) {
        self.reclaimed.store(true, Ordering::Release);
    }
    pub(crate) fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire)
    }
}

/// A runtime-allocated output's lease: one pointer, so a tensor (and every task's argument
/// record holding one) stays small; submit reads the lease's line for its liveness anyway.
#[derive(Clone, Debug)]
pub(crate) struct Origin(pub(crate) Arc<Lease>);

impl Origin {
    pub(crate) fn task(&self) -> TaskId {
        self.0.task
    }
}

/// A strided view over a [`Buffer`]: up to five dimensions, element strides and an element offset.
/// Each dimension and each stride is at most [`MAX_DIM_LEN`] (2^32 - 1) elements, as upstream's
/// tensors keep them; [`Tensor::shape`] and [`Tensor::strides`] read them as [`Dims`], which
/// dereference to `[usize]`.
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
            d.field("task", &o.task());
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
        Self::fit(buffer, Region::try_contiguous(dtype, offset, shape)?, None)
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

    /// The bytes a contiguous tensor of `shape` and `dtype` needs, once `shape` is checked: 1 to
    /// [`MAX_DIMS`] dimensions, each dimension and each row-major stride at most
    /// [`MAX_DIM_LEN`] elements. The constructors check the same; call it to size (or reject)
    /// memory for a tensor before allocating it elsewhere.
    ///
    /// ```
    /// use pto_core::{DType, Tensor, TensorError};
    /// assert_eq!(Tensor::byte_size(&[1024, 1024], DType::F32), Ok(4 << 20));
    /// assert!(matches!(Tensor::byte_size(&[], DType::F32), Err(TensorError::BadRank { ndims: 0 })));
    /// assert!(matches!(
    ///     Tensor::byte_size(&[1 << 33], DType::U8),
    ///     Err(TensorError::DimTooLarge { dim: 0, .. })
    /// ));
    /// ```
    ///
    /// # Errors
    ///
    /// [`TensorError::BadRank`], [`TensorError::DimTooLarge`], or [`TensorError::Overflow`].
    pub fn byte_size(shape: &[usize], dtype: DType) -> Result<usize, TensorError> {
        byte_size(shape, dtype)
    }

    /// A zero-filled tensor in a buffer of its own.
    ///
    /// # Errors
    ///
    /// A bad rank, a dimension larger than [`MAX_DIM_LEN`], or a size that cannot be
    /// allocated.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor, TensorError> {
        // Before allocating: a shape the region cannot hold fails without touching memory.
        let bytes = byte_size(shape, dtype)?;
        Self::fit(
            Buffer::zeroed(bytes)?,
            Region::contiguous(dtype, 0, shape),
            None,
        )
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
    pub fn shape(&self) -> Dims {
        self.region.shape()
    }

    /// Element strides.
    pub fn strides(&self) -> Dims {
        self.region.strides()
    }

    /// The number of dimensions.
    pub fn ndims(&self) -> usize {
        self.region.ndims()
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
        self.origin.as_ref().map(Origin::task)
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
    #[inline]
    pub fn view(&self, shape: &[usize], offsets: &[usize]) -> Result<Tensor, TensorError> {
        let n = usize::from(self.region.ndims);
        if shape.len() != n || offsets.len() != n {
            return Err(self.view_error(shape, offsets));
        }
        let mut r = self.region;
        for i in 0..n {
            let (len, at, size) = (shape[i], offsets[i], self.region.dim(i));
            // `at + len <= size`, without an overflow.
            if at > size || len > size - at {
                return Err(self.view_error(shape, offsets));
            }
            if len > 0 {
                r.offset += at * r.stride(i);
            }
            // At most the old size: fits.
            r.shape[i] = len as u32;
        }
        // Every element of the box is an element of this tensor, which fits its buffer: no
        // need to check again (a view per task is common in orchestration loops).
        debug_assert!(r.byte_end().is_some_and(|e| e <= self.buffer.len()));
        Ok(Tensor {
            buffer: self.buffer.clone(),
            region: r,
            origin: self.origin.clone(),
        })
    }

    /// Why [`Tensor::view`] refused `shape` at `offsets` (out of line: the common path of a
    /// view per task keeps no formatting code).
    #[cold]
    #[inline(never)]
    fn view_error(&self, shape: &[usize], offsets: &[usize]) -> TensorError {
        let n = usize::from(self.region.ndims);
        let detail = if shape.len() != n || offsets.len() != n {
            format!("{n}-d tensor, got shape {shape:?} and offsets {offsets:?}")
        } else {
            let bad = (0..n).find(|&i| {
                offsets[i]
                    .checked_add(shape[i])
                    .is_none_or(|e| e > self.region.dim(i))
            });
            let i = bad.unwrap_or(0);
            format!(
                "dimension {i}: {}..{} exceeds size {}",
                offsets[i],
                offsets[i].saturating_add(shape[i]),
                self.region.dim(i)
            )
        };
        TensorError::OutOfRange {
            what: "view",
            detail,
        }
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
        if dim >= n || step == 0 || start > end || end > self.region.dim(dim) {
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
            r.offset += start * r.stride(dim);
        }
        // At most the old size: fits.
        r.shape[dim] = len as u32;
        if len > 1 {
            // (One element or none: the step never applies, and any step is fine.)
            let stride = r.stride(dim).checked_mul(step);
            r.set_stride(dim, stride.ok_or(TensorError::Overflow)?)?;
        }
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
        self.derive(Region::try_contiguous(
            self.region.dtype,
            self.region.offset,
            shape,
        )?)
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
            Some(o) if o.0.is_reclaimed() => Err(TensorError::Stale { task: o.task() }),
            _ => Ok(()),
        }
    }
}

pub use crate::error::TensorError;
use crate::geometry::byte_size;
pub use crate::geometry::{intersects, overlap, Dims, Overlap, Region, MAX_DIM_LEN};

#[cfg(test)]
mod tests;
