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

mod intersect;
pub use intersect::intersects;

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

pub(crate) fn row_major_strides(shape: &[usize]) -> [usize; MAX_DIMS] {
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
        // One pass (this runs for argument pairs of every submitted task).
        let mut last = 0;
        for (&n, &s) in self.shape().iter().zip(self.strides()) {
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
    pub(crate) fn lattice(&self) -> Option<([usize; MAX_DIMS], usize)> {
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
