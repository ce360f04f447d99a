//! The geometry of a tensor view, and how two views of one buffer relate.
//!
//! A [`Region`] is a dtype, a shape, element strides and an element offset: a view's metadata,
//! `Copy`, stored in tables and in shared memory. [`overlap`] is the dependency engine's
//! conservative test; [`intersects`] is the exact one the borrow table uses.

use std::fmt;

use crate::dtype::DType;
use crate::error::TensorError;

/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 5;

/// The largest size of one dimension, and the largest element stride, a view may have
/// (`u32::MAX`): a region keeps them in 32 bits, as upstream's tensors do, which keeps the
/// records the engine moves between threads small. A tensor may still span more elements in
/// all (its offset and extent are `usize`).
pub const MAX_DIM_LEN: usize = u32::MAX as usize;

mod dims;
mod intersect;
pub use dims::Dims;
pub use intersect::intersects;

/// The geometry of a view: dtype, shape, element strides and element offset. `Copy`, so it can be
/// stored in tables and shared memory. 56 bytes: shapes and strides are 32-bit (at most
/// [`MAX_DIM_LEN`]); read them as [`Dims`] of `usize`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    pub(crate) dtype: DType,
    pub(crate) ndims: u8,
    pub(crate) shape: [u32; MAX_DIMS],
    pub(crate) strides: [u32; MAX_DIMS],
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

/// Row-major element strides of `shape` (unused dimensions 0), or the first dimension whose
/// size or stride is larger than [`MAX_DIM_LEN`].
pub(crate) fn row_major_strides(shape: &[usize]) -> Result<[u32; MAX_DIMS], TensorError> {
    let mut s = [0; MAX_DIMS];
    let mut acc = 1usize;
    for dim in (0..shape.len().min(MAX_DIMS)).rev() {
        s[dim] = narrow(acc, "row-major stride", dim)?;
        narrow(shape[dim], "size", dim)?;
        acc = acc.saturating_mul(shape[dim].max(1));
    }
    Ok(s)
}

/// `value` as the 32-bit field a region keeps it in.
pub(crate) fn narrow(value: usize, what: &'static str, dim: usize) -> Result<u32, TensorError> {
    u32::try_from(value).map_err(|_| TensorError::DimTooLarge { what, dim, value })
}

/// The bytes a contiguous tensor of `shape` and `dtype` takes, once the shape is checked: 1 to
/// [`MAX_DIMS`] dimensions, a row-major layout whose dimensions and strides fit in
/// [`MAX_DIM_LEN`], and a size that fits `usize`.
pub(crate) fn byte_size(shape: &[usize], dtype: DType) -> Result<usize, TensorError> {
    Region::try_contiguous(dtype, 0, shape)?;
    shape
        .iter()
        .try_fold(dtype.size(), |a, &d| a.checked_mul(d))
        .ok_or(TensorError::Overflow)
}

impl Region {
    /// A contiguous row-major region starting at element `offset`, or why `shape` cannot have
    /// one (a bad rank, or a dimension or stride past [`MAX_DIM_LEN`]).
    pub(crate) fn try_contiguous(
        dtype: DType,
        offset: usize,
        shape: &[usize],
    ) -> Result<Region, TensorError> {
        if shape.is_empty() || shape.len() > MAX_DIMS {
            return Err(TensorError::BadRank { ndims: shape.len() });
        }
        let strides = row_major_strides(shape)?;
        let mut sh = [1; MAX_DIMS];
        for (d, &n) in sh.iter_mut().zip(shape) {
            // Checked by `row_major_strides`.
            *d = n as u32;
        }
        Ok(Region {
            dtype,
            ndims: shape.len() as u8,
            shape: sh,
            strides,
            offset,
        })
    }

    /// [`Region::try_contiguous`] of a shape known to fit.
    ///
    /// # Panics
    ///
    /// If it does not (an internal helper for shapes [`byte_size`] accepted, or smaller than
    /// a region's; public builders validate first).
    pub(crate) fn contiguous(dtype: DType, offset: usize, shape: &[usize]) -> Region {
        Region::try_contiguous(dtype, offset, shape).expect("a checked shape")
    }

    /// True when this is a region [`Region::contiguous`] makes for one dimension (stride 1,
    /// and that constructor's padding of the unused dimensions), which its dtype and byte
    /// range therefore rebuild exactly.
    pub(crate) fn is_run(&self) -> bool {
        self.ndims == 1
            && self.strides[0] == 1
            && self.strides[1..].iter().all(|&s| s == 0)
            && self.shape[1..].iter().all(|&n| n == 1)
    }

    pub(crate) fn checked(
        dtype: DType,
        offset: usize,
        shape: &[usize],
        strides: &[usize],
    ) -> Result<Region, TensorError> {
        if strides.len() != shape.len() {
            return Err(TensorError::BadRank {
                ndims: shape.len().max(strides.len()),
            });
        }
        let mut r = Region::try_contiguous(dtype, offset, shape)?;
        for (i, &s) in strides.iter().enumerate() {
            if s == 0 {
                return Err(TensorError::ZeroStride { dim: i });
            }
            r.strides[i] = narrow(s, "stride", i)?;
        }
        r.byte_end().ok_or(TensorError::Overflow)?;
        Ok(r)
    }

    /// Sets the stride of dimension `i` to `s` elements.
    pub(crate) fn set_stride(&mut self, i: usize, s: usize) -> Result<(), TensorError> {
        self.strides[i] = narrow(s, "stride", i)?;
        Ok(())
    }

    /// Dimension `i`'s size.
    #[inline]
    pub(crate) fn dim(&self, i: usize) -> usize {
        self.shape[i] as usize
    }

    /// Dimension `i`'s stride.
    #[inline]
    pub(crate) fn stride(&self, i: usize) -> usize {
        self.strides[i] as usize
    }

    /// The used dimensions as `(size, stride)` pairs.
    #[inline]
    pub(crate) fn dims(&self) -> impl DoubleEndedIterator<Item = (usize, usize)> + '_ {
        let n = usize::from(self.ndims);
        self.shape[..n]
            .iter()
            .zip(&self.strides[..n])
            .map(|(&a, &b)| (a as usize, b as usize))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> Dims {
        Dims::new(&self.shape, self.ndims)
    }

    /// Element strides.
    pub fn strides(&self) -> Dims {
        Dims::new(&self.strides, self.ndims)
    }

    /// The number of dimensions.
    pub fn ndims(&self) -> usize {
        usize::from(self.ndims)
    }

    /// Element offset of the first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims().map(|(n, _)| n).product()
    }

    /// Elements from the first to one past the last that the view touches (0 for an empty view).
    pub fn extent(&self) -> usize {
        // One pass (this runs for argument pairs of every submitted task).
        let mut last = 0;
        for (n, s) in self.dims() {
            if n == 0 {
                return 0;
            }
            last += (n - 1) * s;
        }
        1 + last
    }

    pub(crate) fn byte_end(&self) -> Option<usize> {
        let mut ext = 0usize;
        if self.numel() > 0 {
            ext = 1;
            for (n, s) in self.dims() {
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
        for (n, s) in self.dims().rev() {
            if n != 1 && s != acc {
                return false;
            }
            acc *= n;
        }
        true
    }

    /// Per-dimension start coordinates and the final remainder, when the layout is a clean
    /// nesting (each dimension's tail fits inside the next outer stride); `None` otherwise.
    pub(crate) fn lattice(&self) -> Option<([usize; MAX_DIMS], usize)> {
        let n = usize::from(self.ndims);
        let mut c = [0; MAX_DIMS];
        let mut o = self.offset;
        for (ci, &s) in c.iter_mut().zip(&self.strides[..n]) {
            let s = s as usize;
            *ci = o / s;
            o %= s;
        }
        // Injectivity: for every i >= 1, the largest offset reachable in dims i.. stays below
        // the stride of dim i-1.
        let mut tail = o;
        for i in (1..n).rev() {
            tail += (c[i] + self.dim(i) - 1) * self.stride(i);
            if tail >= self.stride(i - 1) {
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
    // Disjoint byte extents first: the cheapest test, and the common answer for the tiles of
    // one tensor.
    let (a0, a1) = a.byte_range();
    let (b0, b1) = b.byte_range();
    if a1 <= b0 || b1 <= a0 {
        return Overlap::Disjoint;
    }
    if a.numel() == 0 || b.numel() == 0 {
        return Overlap::Disjoint;
    }
    if a == b {
        // The same view again (a chain of updates of one tensor): the common case.
        return Overlap::Covers;
    }
    if a.is_contiguous() && b.is_contiguous() {
        return if a0 <= b0 && b1 <= a1 {
            Overlap::Covers
        } else {
            Overlap::Partial
        };
    }
    let n = a.ndims();
    if a.dtype != b.dtype || a.ndims != b.ndims || a.strides[..n] != b.strides[..n] {
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
        let (lo_a, hi_a) = (ca[i], ca[i] + a.dim(i));
        let (lo_b, hi_b) = (cb[i], cb[i] + b.dim(i));
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

// The engine moves regions between threads inside every task's argument records; keep them to
// the 56 bytes the 32-bit dimensions allow.
const _: () = assert!(std::mem::size_of::<Region>() == 56);
