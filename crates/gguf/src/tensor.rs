//! [`TensorInfo`]: one entry of the tensor directory, and the shape rules shared by the
//! reader and the writer (ggml: at most 4 dims, element count and byte size within `i64`,
//! rows a whole number of blocks).

use crate::GgmlType;

/// Most dimensions a tensor may have (ggml `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Longest tensor name in bytes (the GGUF spec's limit; llama.cpp allows one byte less).
pub const MAX_TENSOR_NAME_LEN: usize = 64;

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (fastest-varying).
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Byte offset relative to the start of the data section.
    pub offset: u64,
}

/// Why a shape is not valid for a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShapeError {
    TooManyDims,
    Overflow,
    RowNotBlockMultiple,
}

/// Byte size of a tensor of `dims` and `dtype`, checking the ggml shape rules.
pub(crate) fn checked_n_bytes(dims: &[u64], dtype: GgmlType) -> Result<u64, ShapeError> {
    if dims.len() > MAX_DIMS {
        return Err(ShapeError::TooManyDims);
    }
    let limit = i64::MAX as u64;
    let mut elements: u64 = 1;
    for &d in dims {
        elements = elements
            .checked_mul(d)
            .filter(|&n| n <= limit && d <= limit)
            .ok_or(ShapeError::Overflow)?;
    }
    let row = dims.first().copied().unwrap_or(1);
    let block = dtype.block_size() as u64;
    if !row.is_multiple_of(block) {
        return Err(ShapeError::RowNotBlockMultiple);
    }
    let rows = elements.checked_div(row).unwrap_or(0);
    (row / block)
        .checked_mul(dtype.type_size() as u64)
        .and_then(|row_bytes| row_bytes.checked_mul(rows))
        .filter(|&n| n <= limit)
        .ok_or(ShapeError::Overflow)
}

impl TensorInfo {
    /// Number of elements (saturates at `u64::MAX` for dims that overflow, which the reader
    /// and writer reject).
    pub fn n_elements(&self) -> u64 {
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Size of the tensor's data in bytes, or `None` if the shape breaks the ggml rules
    /// (more than 4 dims, overflow, row not a whole number of blocks).
    pub fn try_n_bytes(&self) -> Option<u64> {
        checked_n_bytes(&self.dims, self.dtype).ok()
    }

    /// Size of the tensor's data in bytes. Exact for every tensor of a
    /// [`GgufFile`](crate::GgufFile) or [`GgufWriter`](crate::GgufWriter) (their shapes are
    /// validated); `u64::MAX` for an invalid shape built by hand (see [`Self::try_n_bytes`]).
    pub fn n_bytes(&self) -> u64 {
        self.try_n_bytes().unwrap_or(u64::MAX)
    }

    /// Row length in elements (`dims[0]`, 1 for a tensor without dims).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of `dims[1..]`; saturates like [`Self::n_elements`]).
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Bytes of one row (`None` if the row is not a whole number of blocks).
    pub fn row_bytes(&self) -> Option<u64> {
        let block = self.dtype.block_size() as u64;
        let row = self.row_len();
        row.is_multiple_of(block)
            .then(|| row / block * self.dtype.type_size() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(dims: &[u64], dtype: GgmlType) -> TensorInfo {
        TensorInfo {
            name: "t".into(),
            dims: dims.to_vec(),
            dtype,
            offset: 0,
        }
    }

    #[test]
    fn sizes_follow_ggml_block_layout() {
        // Q4_K: 256 elements in 144 bytes (ggml type_traits); 896 x 151936 Q8_0 is the
        // output.weight of Qwen2.5-0.5B, 144643072 bytes per gguf-py.
        assert_eq!(info(&[512, 3], GgmlType::Q4_K).n_bytes(), 2 * 144 * 3);
        assert_eq!(info(&[896, 151936], GgmlType::Q8_0).n_bytes(), 144_643_072);
        assert_eq!(info(&[7], GgmlType::F32).n_bytes(), 28);
        assert_eq!(info(&[], GgmlType::F32).n_bytes(), 4);
        assert_eq!(info(&[0, 5], GgmlType::Q4_0).n_bytes(), 0);
    }

    #[test]
    fn invalid_shapes_are_reported() {
        assert_eq!(
            checked_n_bytes(&[33], GgmlType::Q4_0),
            Err(ShapeError::RowNotBlockMultiple)
        );
        assert_eq!(
            checked_n_bytes(&[1 << 32, 1 << 32], GgmlType::F32),
            Err(ShapeError::Overflow)
        );
        assert_eq!(
            checked_n_bytes(&[1 << 62], GgmlType::F32),
            Err(ShapeError::Overflow)
        );
        assert_eq!(
            checked_n_bytes(&[1, 1, 1, 1, 1], GgmlType::F32),
            Err(ShapeError::TooManyDims)
        );
        assert_eq!(info(&[u64::MAX, 2], GgmlType::F32).n_elements(), u64::MAX);
        assert_eq!(info(&[33], GgmlType::Q4_0).n_bytes(), u64::MAX);
    }
}
