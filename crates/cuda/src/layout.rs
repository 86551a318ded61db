//! How quantized weights lie in GPU memory: ggml's blocks split into field planes.
//!
//! A GGUF tensor is a sequence of blocks (ggml `block_q4_K` etc.), many of a size that
//! is not a multiple of 16 bytes (Q6_K: 210, Q8_0: 34), which would force byte-wise
//! loads. On the GPU each field of the block (scales, quants, high bits …) gets its own
//! plane: plane `i` holds field `i` of every block in block order (row-major: block `b`
//! of row `r` is block `r * blocks_per_row + b`), each plane starting on a 256-byte
//! boundary. The bytes are the file's, only moved, so the GEMV kernels read exactly the
//! tensor's bytes per token, with 16-byte loads. `kernels/common.cuh` reads the same
//! planes (its `dequant_chunk` and the GEMV units).

use ds4_gguf::GgmlType;

/// A field of a block: byte offset and size within the GGUF block.
pub type Field = (usize, usize);

/// Planes of a matrix type, in the order the kernels index them; `None` for types the
/// CUDA backend does not run as matrices.
pub fn fields(ty: GgmlType) -> Option<&'static [Field]> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => &[(0, 2), (2, 16)],
        Q4_1 => &[(0, 4), (4, 16)],
        Q5_0 => &[(0, 2), (2, 4), (6, 16)],
        Q8_0 => &[(0, 2), (2, 32)],
        Q4_K => &[(0, 4), (4, 12), (16, 128)],
        Q5_K => &[(0, 4), (4, 12), (16, 32), (48, 128)],
        Q6_K => &[(0, 128), (128, 64), (192, 16), (208, 2)],
        IQ2_XXS => &[(0, 2), (2, 64)],
        Q2_K => &[(0, 16), (16, 64), (80, 4)],
        _ => return None,
    })
}

/// The matrix types the CUDA backend supports (decode GEMV, embedding rows and the
/// prefill dequantization).
pub const MATRIX_TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::Q2_K,
];

/// Plane offsets within one allocation for `n_blocks` blocks of `ty`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneLayout {
    /// Byte offset of each plane (unused planes: 0).
    pub offsets: [usize; 4],
    /// Bytes of one block's field in each plane (unused planes: 0).
    pub sizes: [usize; 4],
    /// Bytes of the whole allocation.
    pub total: usize,
}

/// Alignment of each plane.
pub const PLANE_ALIGN: usize = 256;

/// The plane layout of `n_blocks` blocks of `ty`, or `None` for an unsupported type.
pub fn plane_layout(ty: GgmlType, n_blocks: usize) -> Option<PlaneLayout> {
    let f = fields(ty)?;
    let mut l = PlaneLayout {
        offsets: [0; 4],
        sizes: [0; 4],
        total: 0,
    };
    for (i, &(_, size)) in f.iter().enumerate() {
        l.offsets[i] = l.total;
        l.sizes[i] = size;
        l.total += (n_blocks * size).next_multiple_of(PLANE_ALIGN);
    }
    Some(l)
}

/// What a GEMV launch's shared memory holds for weights of type `ty` (`NEED_*` in
/// `kernels/gemv.cu`): the int8 activation in ggml's CPU `vec_dot_type` (Q8_0/Q8_1
/// blocks of 32, or Q8_K blocks of 256), and for IQ2_XXS its decoding tables.
pub fn act_need(ty: GgmlType) -> i32 {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q8_0 => NEED_A32,
        IQ2_XXS => NEED_AK | NEED_IQ2,
        _ => NEED_AK,
    }
}

/// `act_need` flags (kernels/gemv.cu).
pub const NEED_A32: i32 = 1;
pub const NEED_AK: i32 = 2;
pub const NEED_IQ2: i32 = 4;

/// Bytes of the IQ2_XXS tables (kernels/gemv.cu `IQ2_TABLE_BYTES`: 256 grid entries and
/// 128 sign patterns, 4 bytes each, 32 copies).
const IQ2_TABLE_BYTES: usize = (256 + 128) * 32 * 4;

/// Shared-memory bytes of a GEMV launch for `n` inputs and the `act_need` flags `need`
/// (mirrors `act_smem_offsets` in `kernels/gemv.cu`).
pub fn gemv_smem_bytes(n: usize, need: i32) -> usize {
    let tables = if need & NEED_IQ2 != 0 {
        IQ2_TABLE_BYTES
    } else {
        0
    };
    let d32 = tables + 2 * n;
    let s32 = d32 + 4 * (n / 32);
    let dk = s32 + 4 * (n / 32);
    let bs = dk + 4 * (n / 256 + 1);
    bs + 4 * (n / 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_tile_each_block_exactly() {
        for ty in MATRIX_TYPES {
            let f = fields(ty).unwrap();
            let mut at = 0;
            for &(off, size) in f {
                assert_eq!(off, at, "{ty}: fields must be contiguous");
                at += size;
            }
            assert_eq!(at, ty.type_size(), "{ty}: fields must cover the block");
        }
    }

    #[test]
    fn planes_are_aligned_and_disjoint() {
        let l = plane_layout(GgmlType::Q6_K, 16 * 4096).unwrap();
        assert_eq!(l.offsets, [0, 128 * 65536, 192 * 65536, 208 * 65536]);
        assert!(l.offsets.iter().all(|o| o % PLANE_ALIGN == 0));
        assert_eq!(l.total, 210 * 65536);
        let odd = plane_layout(GgmlType::Q8_0, 3).unwrap();
        assert_eq!(odd.offsets[..2], [0, 256]);
        assert_eq!(odd.total, 512);
    }
}
