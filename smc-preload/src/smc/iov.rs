//! A cursor over an iovec array, for copying between the rings and the application's buffers.

use libc::iovec;

pub struct IovCursor<'a> {
    iov: &'a [iovec],
    idx: usize,
    off: usize,
    total: usize,
}

impl<'a> IovCursor<'a> {
    pub fn new(iov: &'a [iovec]) -> Self {
        let total = iov.iter().fold(0usize, |a, v| a.saturating_add(v.iov_len));
        let mut c = IovCursor {
            iov,
            idx: 0,
            off: 0,
            total,
        };
        c.skip_empty();
        c
    }

    /// Bytes not yet filled / consumed.
    pub fn remaining(&self) -> usize {
        self.total
    }

    fn skip_empty(&mut self) {
        while self.idx < self.iov.len() && self.off >= self.iov[self.idx].iov_len {
            self.idx += 1;
            self.off = 0;
        }
    }

    /// Copy `len` bytes from `src` into the iovecs (the caller ensures `len <= remaining`).
    ///
    /// # Safety
    /// `src` valid for `len` reads; the iovecs valid for writes.
    pub unsafe fn fill_from(&mut self, mut src: *const u8, mut len: usize) {
        while len > 0 && self.idx < self.iov.len() {
            let v = &self.iov[self.idx];
            let n = (v.iov_len - self.off).min(len);
            // SAFETY: the caller's contract; the ring and the app buffer never overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, (v.iov_base as *mut u8).add(self.off), n) };
            // SAFETY: `n <= len`, so `src + n` stays within (or one past) the caller's `len`
            // readable bytes.
            src = unsafe { src.add(n) };
            len -= n;
            self.off += n;
            self.total -= n;
            self.skip_empty();
        }
    }

    /// Copy `len` bytes out of the iovecs into `dst`.
    ///
    /// # Safety
    /// `dst` valid for `len` writes; the iovecs valid for reads.
    pub unsafe fn drain_to(&mut self, mut dst: *mut u8, mut len: usize) {
        while len > 0 && self.idx < self.iov.len() {
            let v = &self.iov[self.idx];
            let n = (v.iov_len - self.off).min(len);
            // SAFETY: the caller's contract.
            unsafe {
                std::ptr::copy_nonoverlapping((v.iov_base as *const u8).add(self.off), dst, n)
            };
            // SAFETY: `n <= len`, so `dst + n` stays within (or one past) the caller's `len`
            // writable bytes.
            dst = unsafe { dst.add(n) };
            len -= n;
            self.off += n;
            self.total -= n;
            self.skip_empty();
        }
    }
}
