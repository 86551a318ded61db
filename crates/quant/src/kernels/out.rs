//! A shared view of a matrix-product output, `out[(t - t0)·stride + (r - r0)]`, that threads
//! working on disjoint row ranges write into concurrently.

use std::marker::PhantomData;

/// Output of a matrix product: token-major, `stride` floats per token, row `r` at
/// column `r - r0`.
pub(crate) struct Out<'a> {
    ptr: *mut f32,
    len: usize,
    stride: usize,
    r0: usize,
    t0: usize,
    _buf: PhantomData<&'a mut [f32]>,
}

// SAFETY: `Out` only hands out writes through `set`, whose callers guarantee that
// concurrent writers touch disjoint (token, row) cells (each thread owns a row range).
unsafe impl Send for Out<'_> {}
// SAFETY: as above.
unsafe impl Sync for Out<'_> {}

impl<'a> Out<'a> {
    /// Wraps `buf` (`n_tokens × stride`), whose column 0 is weight row `r0`.
    pub(crate) fn new(buf: &'a mut [f32], stride: usize, r0: usize) -> Self {
        Out {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            stride,
            r0,
            t0: 0,
            _buf: PhantomData,
        }
    }

    /// The same buffer with token `t0` as its first token.
    pub(crate) fn starting_at_token(self, t0: usize) -> Self {
        Out { t0, ..self }
    }

    /// Writes `v` for token `t` and weight row `r`.
    ///
    /// # Safety
    /// No other thread may write or read cell `(t, r)` concurrently. (The index is
    /// bounds-checked.)
    #[inline]
    pub(crate) unsafe fn set(&self, t: usize, r: usize, v: f32) {
        let i = (t - self.t0) * self.stride + (r - self.r0);
        assert!(
            i < self.len,
            "output index {i} out of bounds ({})",
            self.len
        );
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe { *self.ptr.add(i) = v };
    }
}
