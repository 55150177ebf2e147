//! A buffer that the tasks of one parallel section write in disjoint parts (each its own rows,
//! channels or heads), where the parts are strided and cannot be split into `&mut` slices.

use std::marker::PhantomData;
use std::ops::Range;

/// Shared access to a `&mut [f32]` for the length of a parallel section. Every method is
/// `unsafe`: the caller promises that no other task touches the indices it uses.
#[derive(Clone, Copy)]
pub(crate) struct Disjoint<'a> {
    ptr: *mut f32,
    len: usize,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: tasks touch only indices no other task touches (the contract of every method).
unsafe impl Send for Disjoint<'_> {}
unsafe impl Sync for Disjoint<'_> {}

impl<'a> Disjoint<'a> {
    pub(crate) fn new(buf: &'a mut [f32]) -> Disjoint<'a> {
        Disjoint {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: PhantomData,
        }
    }

    /// # Safety
    /// No other task reads or writes index `i`.
    pub(crate) unsafe fn write(&self, i: usize, v: f32) {
        assert!(i < self.len, "index {i} past {}", self.len);
        // SAFETY: in bounds (asserted); exclusive by the caller's promise.
        unsafe { *self.ptr.add(i) = v }
    }

    /// # Safety
    /// No other task writes index `i`.
    pub(crate) unsafe fn read(&self, i: usize) -> f32 {
        assert!(i < self.len, "index {i} past {}", self.len);
        // SAFETY: in bounds (asserted); no concurrent writer by the caller's promise.
        unsafe { *self.ptr.add(i) }
    }

    /// # Safety
    /// No other task reads or writes `range` while the slice lives.
    #[allow(clippy::mut_from_ref)] // exclusive by the caller's promise, as for `write`
    pub(crate) unsafe fn slice_mut(&self, range: Range<usize>) -> &'a mut [f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds (asserted); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}
