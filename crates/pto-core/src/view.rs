//! Typed access to tensor memory: the views kernels receive and the host's copy in and out.
//!
//! One of the two modules of `pto-core` allowed to use `unsafe` (see [`crate::buffer`] for why
//! access is sound). Every view is created only inside an admitted borrow of its region, is tied
//! by lifetime to the object that holds that borrow, and touches only the elements of its region.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use crate::args::ArgMode;
use crate::buffer::BorrowSet;
use crate::dtype::Element;
use crate::kernel::{KernelCtx, KernelError};
use crate::tensor::{Region, Tensor, TensorError};

/// Calls `f` with the element offset (relative to the region's first element) of every element,
/// in row-major logical order.
/// The element offsets of a region in logical row-major order, lazily (what
/// [`for_each_offset`] visits, as an iterator; allocates nothing).
struct Offsets {
    shape: [usize; crate::tensor::MAX_DIMS],
    strides: [usize; crate::tensor::MAX_DIMS],
    ndims: usize,
    idx: [usize; crate::tensor::MAX_DIMS],
    off: usize,
    left: usize,
}

impl Offsets {
    fn new(region: &Region) -> Offsets {
        Offsets {
            shape: region.shape().padded(),
            strides: region.strides().padded(),
            ndims: usize::from(region.ndims),
            idx: [0; crate::tensor::MAX_DIMS],
            off: 0,
            left: region.numel(),
        }
    }
}

impl Iterator for Offsets {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let here = self.off;
        // Step to the next element (the last step runs past the end, unused).
        for d in (0..self.ndims).rev() {
            self.idx[d] += 1;
            self.off += self.strides[d];
            if self.idx[d] < self.shape[d] {
                break;
            }
            self.off -= self.strides[d] * self.shape[d];
            self.idx[d] = 0;
        }
        Some(here)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

pub(crate) fn for_each_offset(region: &Region, mut f: impl FnMut(usize)) {
    let n = usize::from(region.ndims);
    if region.numel() == 0 {
        return;
    }
    if region.is_contiguous() {
        (0..region.numel()).for_each(f);
        return;
    }
    let shape = region.shape();
    let strides = region.strides();
    let mut idx = [0usize; crate::tensor::MAX_DIMS];
    let mut off = 0usize;
    loop {
        f(off);
        let mut d = n;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

fn flat_offset(region: &Region, index: &[usize]) -> Option<usize> {
    if index.len() != usize::from(region.ndims) {
        return None;
    }
    let mut off = 0;
    for (&i, (n, s)) in index.iter().zip(region.dims()) {
        if i >= n {
            return None;
        }
        off += i * s;
    }
    Some(off)
}

fn check_dtype<T: Element>(region: &Region) -> Result<(), TensorError> {
    if region.dtype != T::DTYPE {
        return Err(TensorError::DTypeMismatch {
            expected: T::DTYPE,
            actual: region.dtype,
        });
    }
    Ok(())
}

/// Releases a kernel argument's borrow flag when its view drops.
pub(crate) struct FlagGuard<'a> {
    flag: &'a Cell<isize>,
    write: bool,
}

impl<'a> FlagGuard<'a> {
    /// Takes a shared (`write == false`) or exclusive borrow of a kernel argument; `None` when it
    /// conflicts with a view still alive.
    #[inline]
    pub(crate) fn take(flag: &'a Cell<isize>, write: bool) -> Option<FlagGuard<'a>> {
        let v = flag.get();
        if write {
            if v != 0 {
                return None;
            }
            flag.set(-1);
        } else {
            if v < 0 {
                return None;
            }
            flag.set(v + 1);
        }
        Some(FlagGuard { flag, write })
    }
}

impl Drop for FlagGuard<'_> {
    fn drop(&mut self) {
        if self.write {
            self.flag.set(0);
        } else {
            self.flag.set(self.flag.get() - 1);
        }
    }
}

/// A read-only typed view of a kernel's tensor argument.
pub struct TensorRef<'a, T: Element> {
    ptr: *const T,
    region: Region,
    _guard: FlagGuard<'a>,
    _marker: PhantomData<&'a T>,
}

/// A writable typed view of a kernel's tensor argument.
pub struct TensorMut<'a, T: Element> {
    ptr: *mut T,
    region: Region,
    _guard: FlagGuard<'a>,
    _marker: PhantomData<&'a mut T>,
}

impl<T: Element> fmt::Debug for TensorRef<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorRef({:?})", self.region)
    }
}

impl<T: Element> fmt::Debug for TensorMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorMut({:?})", self.region)
    }
}

impl<'a, T: Element> TensorRef<'a, T> {
    /// # Safety
    ///
    /// The caller holds an admitted read borrow of `tensor`'s region for at least `'a`, and the
    /// tensor's buffer outlives `'a`.
    pub(crate) unsafe fn new(
        tensor: &'a Tensor,
        region: Region,
        guard: FlagGuard<'a>,
    ) -> Result<Self, TensorError> {
        check_dtype::<T>(&region)?;
        // SAFETY: `region` fits the buffer (checked when the tensor was built) so the offset is
        // in bounds of the allocation.
        let ptr = unsafe { tensor.buffer.base_ptr().cast::<T>().add(region.offset) };
        Ok(TensorRef {
            ptr,
            region,
            _guard: guard,
            _marker: PhantomData,
        })
    }
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// # Safety
    ///
    /// The caller holds an admitted write borrow of `region` (a sub-view of `tensor`) for at
    /// least `'a`, and the tensor's buffer outlives `'a`.
    pub(crate) unsafe fn new(
        tensor: &'a Tensor,
        region: Region,
        guard: FlagGuard<'a>,
    ) -> Result<Self, TensorError> {
        check_dtype::<T>(&region)?;
        // SAFETY: as in `TensorRef::new`.
        let ptr = unsafe { tensor.buffer.base_ptr().cast::<T>().add(region.offset) };
        Ok(TensorMut {
            ptr,
            region,
            _guard: guard,
            _marker: PhantomData,
        })
    }

    /// Every element, in logical row-major order.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        // Lazily, as `TensorRef::iter` (no list of offsets allocated per call). While the
        // iterator borrows `self`, nothing writes through this view.
        // SAFETY: each offset lies inside the borrowed region.
        Offsets::new(&self.region).map(move |o| unsafe { self.ptr.add(o).read() })
    }

    /// The elements as one mutable slice, when the view is contiguous.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        if !self.region.is_contiguous() {
            return None;
        }
        // SAFETY: a contiguous region is exactly `numel` consecutive elements from `ptr`, all
        // inside our exclusive borrow; `&mut self` prevents a second alias.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.region.numel()) })
    }

    /// Writes one element.
    ///
    /// # Errors
    ///
    /// [`TensorError::OutOfRange`] for an index outside the shape.
    pub fn set(&mut self, index: &[usize], value: T) -> Result<(), TensorError> {
        let o = flat_offset(&self.region, index).ok_or_else(|| TensorError::OutOfRange {
            what: "set",
            detail: format!("index {index:?} for shape {:?}", self.region.shape()),
        })?;
        // SAFETY: `o` is inside the region, which we borrow exclusively.
        unsafe { self.ptr.add(o).write(value) };
        Ok(())
    }

    /// Calls `f` on every element in logical order.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut T)) {
        let ptr = self.ptr;
        // SAFETY: each offset is a distinct element inside our exclusive borrow.
        for_each_offset(&self.region, |o| f(unsafe { &mut *ptr.add(o) }));
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) {
        self.for_each_mut(|x| *x = value);
    }

    /// Copies `data` in, in logical order.
    ///
    /// # Errors
    ///
    /// [`TensorError::LengthMismatch`] unless `data` has one value per element.
    pub fn assign(&mut self, data: &[T]) -> Result<(), TensorError> {
        if data.len() != self.region.numel() {
            return Err(TensorError::LengthMismatch {
                expected: self.region.numel(),
                actual: data.len(),
            });
        }
        if let Some(s) = self.as_mut_slice() {
            s.copy_from_slice(data);
        } else {
            let mut it = data.iter();
            self.for_each_mut(|x| {
                if let Some(v) = it.next() {
                    *x = *v;
                }
            });
        }
        Ok(())
    }
}

/// The geometry of a view (anything with a `region`): shape, strides, element count.
macro_rules! geometry_methods {
    () => {
        /// The shape.
        pub fn shape(&self) -> $crate::Dims {
            self.region.shape()
        }
        /// Element strides.
        pub fn strides(&self) -> $crate::Dims {
            self.region.strides()
        }
        /// Number of elements.
        pub fn len(&self) -> usize {
            self.region.numel()
        }
        /// True when the view has no elements.
        pub fn is_empty(&self) -> bool {
            self.region.numel() == 0
        }
        /// True when the view is row-major without gaps.
        pub fn is_contiguous(&self) -> bool {
            self.region.is_contiguous()
        }
    };
}

macro_rules! read_methods {
    ($ty:ident) => {
        impl<T: Element> $ty<'_, T> {
            geometry_methods!();
            /// One element, or `None` outside the shape.
            pub fn get(&self, index: &[usize]) -> Option<T> {
                let o = flat_offset(&self.region, index)?;
                // SAFETY: `o` is inside the borrowed region.
                Some(unsafe { self.ptr.add(o).read() })
            }
            /// The elements as one slice, when the view is contiguous.
            pub fn as_slice(&self) -> Option<&[T]> {
                if !self.region.is_contiguous() {
                    return None;
                }
                // SAFETY: a contiguous region is `numel` consecutive elements inside the borrow.
                Some(unsafe { std::slice::from_raw_parts(self.ptr, self.region.numel()) })
            }
            /// The elements copied out in logical order.
            pub fn to_vec(&self) -> Vec<T> {
                if let Some(s) = self.as_slice() {
                    return s.to_vec();
                }
                let mut v = Vec::with_capacity(self.region.numel());
                // SAFETY: each offset is inside the borrowed region.
                for_each_offset(&self.region, |o| v.push(unsafe { self.ptr.add(o).read() }));
                v
            }
        }
    };
}
read_methods!(TensorRef);
read_methods!(TensorMut);

impl<'a, T: Element> TensorRef<'a, T> {
    /// Every element, in logical row-major order.
    pub fn iter(&self) -> impl Iterator<Item = T> + '_ {
        // SAFETY: each offset lies inside the borrowed region.
        Offsets::new(&self.region).map(move |o| unsafe { self.ptr.add(o).read() })
    }
}

fn busy(t: &Tensor) -> TensorError {
    TensorError::Busy {
        buffer: t.buffer.id(),
    }
}

impl Tensor {
    /// Copies the elements out, in logical row-major order.
    ///
    /// Outside a run this is a plain copy. During a run, read a task's output through
    /// [`crate::Orch::read`], which waits for its producers; reading here memory that a running
    /// task writes is refused with [`TensorError::Busy`].
    ///
    /// # Errors
    ///
    /// A dtype other than `T`'s, a busy region, or a reclaimed runtime output.
    pub fn read<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        check_dtype::<T>(&self.region)?;
        let mut set = BorrowSet::new();
        set.add(&self.buffer, &self.region, false)
            .map_err(|_| busy(self))?;
        self.check_live()?;
        let base = self.buffer.base_ptr().cast::<T>();
        let mut v = Vec::with_capacity(self.numel());
        for_each_offset(&self.region, |o| {
            // SAFETY: we hold a read borrow of the region, which fits the buffer.
            v.push(unsafe { base.add(self.region.offset + o).read() })
        });
        Ok(v)
    }

    /// Copies `data` in, in logical row-major order.
    ///
    /// # Errors
    ///
    /// A dtype other than `T`'s, a length other than the element count, a busy region, or a
    /// reclaimed runtime output.
    pub fn write<T: Element>(&self, data: &[T]) -> Result<(), TensorError> {
        check_dtype::<T>(&self.region)?;
        if data.len() != self.numel() {
            return Err(TensorError::LengthMismatch {
                expected: self.numel(),
                actual: data.len(),
            });
        }
        let mut set = BorrowSet::new();
        set.add(&self.buffer, &self.region, true)
            .map_err(|_| busy(self))?;
        self.check_live()?;
        let base = self.buffer.base_ptr().cast::<T>();
        let mut it = data.iter();
        for_each_offset(&self.region, |o| {
            if let Some(v) = it.next() {
                // SAFETY: we hold an exclusive borrow of the region, which fits the buffer.
                unsafe { base.add(self.region.offset + o).write(*v) }
            }
        });
        Ok(())
    }

    /// Copies the raw bytes of the view out, in logical order.
    ///
    /// # Errors
    ///
    /// A busy region, or a reclaimed runtime output.
    pub fn read_bytes(&self) -> Result<Vec<u8>, TensorError> {
        let mut set = BorrowSet::new();
        set.add(&self.buffer, &self.region, false)
            .map_err(|_| busy(self))?;
        self.check_live()?;
        let sz = self.dtype().size();
        let base = self.buffer.base_ptr();
        let mut v = Vec::with_capacity(self.nbytes());
        for_each_offset(&self.region, |o| {
            let at = (self.region.offset + o) * sz;
            // SAFETY: the element's bytes lie inside the borrowed region.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(base.add(at), sz) });
        });
        Ok(v)
    }
}

impl Tensor {
    /// Copies `data` (the view's raw bytes, in logical order) in.
    ///
    /// # Errors
    ///
    /// A length other than [`Tensor::nbytes`], a busy region, or a reclaimed runtime output.
    pub fn write_bytes(&self, data: &[u8]) -> Result<(), TensorError> {
        let sz = self.dtype().size();
        if data.len() != self.nbytes() {
            return Err(TensorError::LengthMismatch {
                expected: self.numel(),
                actual: data.len() / sz.max(1),
            });
        }
        let mut set = BorrowSet::new();
        set.add(&self.buffer, &self.region, true)
            .map_err(|_| busy(self))?;
        self.check_live()?;
        let base = self.buffer.base_ptr();
        let mut chunks = data.chunks_exact(sz);
        for_each_offset(&self.region, |o| {
            if let Some(c) = chunks.next() {
                let at = (self.region.offset + o) * sz;
                // SAFETY: we hold an exclusive borrow of the region; the element's `sz` bytes
                // lie inside it, and `c` is `sz` bytes of caller memory (no overlap: the
                // caller's slice cannot alias a region we borrow exclusively).
                unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), base.add(at), sz) };
            }
        });
        Ok(())
    }
}

/// An untyped view of a kernel's tensor argument, for kernels written in another language
/// (C plugins, Python): the address of its first element, its geometry, and whether the task
/// may write it. The argument stays borrowed (as with [`TensorRef`] / [`TensorMut`]) while the
/// view lives; the pointers are only valid that long.
pub struct RawView<'a> {
    ptr: *mut u8,
    region: Region,
    writable: bool,
    _guard: FlagGuard<'a>,
}

impl fmt::Debug for RawView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawView({:?}, writable: {})", self.region, self.writable)
    }
}

impl RawView<'_> {
    /// The first element's address (dereferencing it is the foreign kernel's business: it may
    /// read `len()` elements at the strides given, and write them when [`RawView::writable`]).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// True when the task may write the argument.
    pub fn writable(&self) -> bool {
        self.writable
    }
    /// The element type.
    pub fn dtype(&self) -> crate::DType {
        self.region.dtype
    }
    geometry_methods!();
}

/// Zeroes the bytes of `t`'s elements. The caller holds a write borrow of its region (the
/// dispatcher calls this for a task's `output_zeroed` arguments right after registering them).
pub(crate) fn zero_fill(t: &Tensor) {
    let sz = t.dtype().size();
    let base = t.buffer.base_ptr();
    if t.region.is_contiguous() {
        // SAFETY: a contiguous region is `nbytes` bytes from its first element, inside the
        // buffer, and the caller holds a write borrow of it.
        unsafe { std::ptr::write_bytes(base.add(t.region.offset * sz), 0, t.nbytes()) };
        return;
    }
    for_each_offset(&t.region, |o| {
        // SAFETY: each element lies inside the borrowed region.
        unsafe { std::ptr::write_bytes(base.add((t.region.offset + o) * sz), 0, sz) }
    });
}

impl<'a> KernelCtx<'a> {
    /// Argument `index` borrowed for this block: its tensor and the flag guard, taken
    /// exclusively with `write` (after an exclusive borrow of a NO_DEP argument's region, which
    /// the dispatcher registered as a read). The caller takes the region with
    /// [`KernelCtx::arg_region`], straight into its view (a region is 56 bytes: one copy, not
    /// two, per argument of every task).
    #[inline]
    fn borrow_arg(
        &self,
        index: usize,
        chunk: bool,
        write: bool,
    ) -> Result<(&'a Tensor, FlagGuard<'_>), KernelError> {
        let (t, mode) = self.arg(index)?;
        // Blocks of an SPMD task may not share a writable argument whole.
        if !chunk && (write || mode.writable()) && self.payload.block_num > 1 {
            return Err(KernelError::SpmdShared {
                index,
                blocks: self.payload.block_num,
            });
        }
        if write && mode == ArgMode::NoDep {
            t.buffer()
                .try_borrow(self.token, &self.arg_region(t, chunk), true)
                .map_err(|_| KernelError::DataRace {
                    index,
                    buffer: t.buffer().id(),
                })?;
        }
        // `let .. else` builds the error only on failure: an eager `ok_or` constructs and drops
        // a `KernelError` for every argument of every task.
        let Some(guard) = FlagGuard::take(&self.flags[index], write) else {
            return Err(KernelError::AlreadyBorrowed { index });
        };
        Ok((t, guard))
    }

    /// The region of `t` a view of this block covers: the whole tensor, or with `chunk` this
    /// block's rows of dimension 0.
    #[inline]
    fn arg_region(&self, t: &Tensor, chunk: bool) -> Region {
        if chunk {
            self.chunk_region(t)
        } else {
            *t.region()
        }
    }

    /// Tensor argument `index` as an untyped view (for foreign kernels): writable when its mode
    /// allows writing, else read-only; the whole tensor, or with `chunk` this block's rows of
    /// dimension 0 (an SPMD task's blocks must take chunks of what they write).
    ///
    /// # Errors
    ///
    /// As [`KernelCtx::input`] / [`KernelCtx::output`], without the dtype check.
    pub fn raw_view(&self, index: usize, chunk: bool) -> Result<RawView<'_>, KernelError> {
        let write = self.arg(index)?.1.writable();
        let (t, guard) = self.borrow_arg(index, chunk, write)?;
        let region = self.arg_region(t, chunk);
        // SAFETY: as in `read_view` / `write_view`: the dispatcher holds a borrow of every
        // argument's region (in its mode) until the kernel returns, and `region` fits the
        // buffer, so the offset is in bounds of the allocation.
        let ptr = unsafe { t.buffer.base_ptr().add(region.offset * region.dtype.size()) };
        Ok(RawView {
            ptr,
            region,
            writable: write,
            _guard: guard,
        })
    }

    pub(crate) fn read_view<T: Element>(
        &self,
        index: usize,
        chunk: bool,
    ) -> Result<TensorRef<'_, T>, KernelError> {
        let mode = self.arg(index)?.1;
        if !mode.readable() {
            return Err(KernelError::Mode {
                index,
                mode,
                wanted: "read",
            });
        }
        let (t, guard) = self.borrow_arg(index, chunk, false)?;
        // SAFETY: the dispatcher registered a borrow of every tensor argument's region for this
        // task before calling the kernel and releases it only after the kernel returns; the
        // payload (and so the buffer) outlives `self`. Chunks of SPMD blocks are disjoint.
        unsafe { TensorRef::new(t, self.arg_region(t, chunk), guard) }
            .map_err(|source| KernelError::Tensor { index, source })
    }

    pub(crate) fn write_view<T: Element>(
        &self,
        index: usize,
        chunk: bool,
    ) -> Result<TensorMut<'_, T>, KernelError> {
        let mode = self.arg(index)?.1;
        if !mode.writable() {
            return Err(KernelError::Mode {
                index,
                mode,
                wanted: "written",
            });
        }
        let (t, guard) = self.borrow_arg(index, chunk, true)?;
        // SAFETY: the dispatcher registered a write borrow of this region for the task (or
        // `borrow_arg` just did, for NO_DEP) that lasts until the kernel returns; the flag guard
        // makes this the only live view of the argument in this block, and blocks of one task
        // write disjoint chunks. The payload outlives `self`.
        unsafe { TensorMut::new(t, self.arg_region(t, chunk), guard) }
            .map_err(|source| KernelError::Tensor { index, source })
    }
}
