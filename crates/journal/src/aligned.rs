//! A growable byte buffer whose memory is aligned to the journal block size, so that it can be
//! handed to `O_DIRECT` writes without a copy.

use crate::record::{Sink, BLOCK_SIZE};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the initialised prefix.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(BLOCK_SIZE).next_multiple_of(BLOCK_SIZE);
        AlignedBuf { ptr: Self::allocate(capacity), len: 0, capacity }
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, BLOCK_SIZE).expect("block-aligned layout")
    }

    fn allocate(capacity: usize) -> NonNull<u8> {
        // SAFETY: the layout has a non-zero size (capacity >= BLOCK_SIZE).
        let ptr = unsafe { alloc_zeroed(Self::layout(capacity)) };
        NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(capacity)))
    }

    fn reserve(&mut self, additional: usize) {
        let needed = self.len + additional;
        if needed <= self.capacity {
            return;
        }
        let capacity = needed.max(self.capacity * 2).next_multiple_of(BLOCK_SIZE);
        let ptr = Self::allocate(capacity);
        // SAFETY: both regions are valid for `len` bytes and do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), ptr.as_ptr(), self.len) };
        // SAFETY: the old pointer was allocated with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
        self.ptr = ptr;
        self.capacity = capacity;
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are initialised (allocation is zeroed, writes only extend).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole allocation (initialised: it was zeroed when allocated).
    pub fn as_capacity_slice(&self) -> &[u8] {
        // SAFETY: all `capacity` bytes are initialised (allocation is zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    /// The whole allocation, to read into (an `O_DIRECT` read needs the aligned start).
    pub fn as_capacity_slice_mut(&mut self) -> &mut [u8] {
        // SAFETY: all `capacity` bytes are initialised and this is the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Sink for AlignedBuf {
    fn len(&self) -> usize {
        self.len
    }

    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        // SAFETY: reserve made room for `bytes.len()` bytes after `len`; regions are distinct.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(self.len),
                bytes.len(),
            )
        };
        self.len += bytes.len();
    }

    fn extend_zeros(&mut self, count: usize) {
        self.reserve(count);
        // SAFETY: reserve made room for `count` bytes after `len`.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, count) };
        self.len += count;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: the pointer was allocated with this layout and is not used afterwards.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_aligned_while_growing() {
        let mut buf = AlignedBuf::with_capacity(10);
        for i in 0..100_000u32 {
            buf.extend_from_slice(&i.to_le_bytes());
            assert_eq!(buf.as_slice().as_ptr() as usize % BLOCK_SIZE, 0);
        }
        buf.extend_zeros(3);
        assert_eq!(buf.len(), 400_003);
        assert_eq!(&buf.as_slice()[4..8], &1u32.to_le_bytes());
        assert_eq!(&buf.as_slice()[400_000..], &[0, 0, 0]);
    }
}
