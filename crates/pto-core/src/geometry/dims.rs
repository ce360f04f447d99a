//! [`Dims`]: a shape or strides, read as a slice of `usize`.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use super::MAX_DIMS;

/// A view's shape or element strides: up to [`MAX_DIMS`] values, returned by value and read
/// as a `[usize]` slice (it dereferences to one).
///
/// Regions keep their dimensions in 32 bits; `Dims` widens them, so callers index, iterate and
/// compare as with a slice.
///
/// ```
/// use pto_core::{DType, Tensor};
/// let t = Tensor::zeros(&[2, 3], DType::F32)?;
/// let shape = t.shape();
/// assert_eq!(shape, [2, 3]);
/// assert_eq!(shape[1], 3);
/// assert_eq!(shape.iter().product::<usize>(), 6);
/// assert_eq!(t.strides().to_vec(), vec![3, 1]);
/// # Ok::<(), pto_core::TensorError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Dims {
    len: u8,
    d: [usize; MAX_DIMS],
}

impl Dims {
    pub(crate) fn new(v: &[u32; MAX_DIMS], len: u8) -> Dims {
        let mut d = [0; MAX_DIMS];
        for (o, &i) in d.iter_mut().zip(v) {
            *o = i as usize;
        }
        Dims { len, d }
    }

    /// All [`MAX_DIMS`] values, the unused ones as stored.
    pub(crate) fn padded(&self) -> [usize; MAX_DIMS] {
        self.d
    }

    /// The values as a slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.d[..usize::from(self.len)]
    }
}

impl Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        self.as_slice()
    }
}

impl AsRef<[usize]> for Dims {
    fn as_ref(&self) -> &[usize] {
        self.as_slice()
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl PartialEq for Dims {
    fn eq(&self, o: &Dims) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl Eq for Dims {}

impl Hash for Dims {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h);
    }
}

impl PartialEq<[usize]> for Dims {
    fn eq(&self, o: &[usize]) -> bool {
        self.as_slice() == o
    }
}

impl PartialEq<&[usize]> for Dims {
    fn eq(&self, o: &&[usize]) -> bool {
        self.as_slice() == *o
    }
}

impl<const N: usize> PartialEq<[usize; N]> for Dims {
    fn eq(&self, o: &[usize; N]) -> bool {
        self.as_slice() == o
    }
}

impl<const N: usize> PartialEq<&[usize; N]> for Dims {
    fn eq(&self, o: &&[usize; N]) -> bool {
        self.as_slice() == *o
    }
}

impl PartialEq<Vec<usize>> for Dims {
    fn eq(&self, o: &Vec<usize>) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl PartialEq<Dims> for [usize] {
    fn eq(&self, o: &Dims) -> bool {
        self == o.as_slice()
    }
}

impl PartialEq<Dims> for &[usize] {
    fn eq(&self, o: &Dims) -> bool {
        *self == o.as_slice()
    }
}

impl PartialEq<Dims> for Vec<usize> {
    fn eq(&self, o: &Dims) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl<'a> IntoIterator for &'a Dims {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl IntoIterator for Dims {
    type Item = usize;
    type IntoIter = std::iter::Take<std::array::IntoIter<usize, MAX_DIMS>>;
    fn into_iter(self) -> Self::IntoIter {
        self.d.into_iter().take(usize::from(self.len))
    }
}

impl From<Dims> for Vec<usize> {
    fn from(d: Dims) -> Vec<usize> {
        d.to_vec()
    }
}
