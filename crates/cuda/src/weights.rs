//! Weights on the device: quantized matrices split into field planes
//! ([`crate::layout`]) and float matrices, from the file's bytes or generated
//! synthetically on the GPU, and f32 vectors (norm weights, biases). MXFP4 matrices
//! become (exact) BF16 float matrices.

use std::sync::{Arc, OnceLock};

use ds4_gguf::{GgmlType, GgufFile, TensorInfo};
use half::{bf16, f16};

use crate::driver::{Args, DPtr, DevMem, Gpu};
use crate::error::{CudaError, Result};
use crate::kernels::Kernels;
use crate::layout::{MATRIX_TYPES, fields, plane_layout};
use crate::ops::MatRef;
use crate::synth::generate;

/// A weight tensor resident on the device.
pub enum CudaWeight {
    /// `n` stacked quantized matrices of `m.rows × m.cols` in field planes; matrix `e`
    /// of plane `p` starts `e·estride[p]` bytes after the plane.
    Matrix {
        mem: Arc<DevMem>,
        m: MatRef,
        n: u32,
        estride: [u64; 4],
    },
    /// `n` stacked float matrices (F32, F16 or BF16) of `rows × cols`, row-major.
    Float {
        mem: Arc<DevMem>,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        n: usize,
        /// An f32 copy of an F16 or BF16 matrix that a kernel takes as f32 values
        /// (DeepSeek-V4's f16 mHC mixes), made on its first use.
        f32_copy: OnceLock<Arc<DevMem>>,
    },
    /// An f32 vector.
    Vector { mem: Arc<DevMem>, len: usize },
    /// An i32 table (token-id hash routing), `len` values.
    Ints { mem: Arc<DevMem>, len: usize },
}

/// Float tensors of at most this many elements are kept as f32 on the device (the
/// kernels that take a weight's values as f32: norms, biases, convs, a compressor's
/// position bias of up to 128 × 512); larger ones in their file type, which the float
/// products read directly (a bf16 low-rank matrix of 128 × 8192 is 2 MB, not 4).
const SMALL_FLOAT: usize = 1 << 16;

// Synthetic float tensors generated on the device are all large (kept in their type).
const _: () = assert!(crate::synth::HOST_ELEMENTS >= SMALL_FLOAT as u64);

impl CudaWeight {
    fn misuse(&self, want: &str) -> CudaError {
        let have = match self {
            CudaWeight::Matrix { .. } => "a quantized matrix",
            CudaWeight::Float { .. } => "a float matrix",
            CudaWeight::Vector { .. } => "a vector",
            CudaWeight::Ints { .. } => "an integer table",
        };
        CudaError::Unsupported(format!("{have} used as {want}"))
    }

    pub(crate) fn mat(&self) -> Result<(&Arc<DevMem>, MatRef)> {
        match self {
            CudaWeight::Matrix { mem, m, .. } => Ok((mem, *m)),
            _ => Err(self.misuse("a quantized matrix")),
        }
    }

    pub(crate) fn vec(&self) -> Result<(&Arc<DevMem>, usize)> {
        match self {
            CudaWeight::Vector { mem, len } => Ok((mem, *len)),
            _ => Err(self.misuse("a vector")),
        }
    }

    /// f32 values (a vector or a float matrix: an F16 or BF16 one through its f32 copy,
    /// made on the first call) and their count.
    pub(crate) fn values(&self) -> Result<(&Arc<DevMem>, usize)> {
        match self {
            CudaWeight::Vector { mem, len } => Ok((mem, *len)),
            CudaWeight::Float {
                mem,
                ty,
                rows,
                cols,
                n,
                f32_copy,
            } => {
                let len = rows * cols * n;
                if *ty == GgmlType::F32 {
                    return Ok((mem, len));
                }
                if let Some(m) = f32_copy.get() {
                    return Ok((m, len));
                }
                let gpu = mem.gpu();
                // Made on the stream, so not while another thread captures a graph on it.
                if gpu.capturing()? {
                    return Err(CudaError::Unsupported(
                        "the f32 copy of a float matrix is made on its first use, which \
                         came while a CUDA graph was being captured"
                            .into(),
                    ));
                }
                let mut raw = vec![0u8; len * ty.type_size()];
                gpu.dtoh(&mut raw, mem.ptr())?;
                let v = floats_f32(*ty, &raw).expect("a float matrix is F32, F16 or BF16");
                let m = gpu.alloc(len * 4)?;
                gpu.htod(m.ptr(), as_bytes(&v))?;
                Ok((f32_copy.get_or_init(|| Arc::new(m)), len))
            }
            _ => Err(self.misuse("f32 values")),
        }
    }

    /// The integer table and its length.
    pub(crate) fn ints(&self) -> Result<(&Arc<DevMem>, usize)> {
        match self {
            CudaWeight::Ints { mem, len } => Ok((mem, *len)),
            _ => Err(self.misuse("an integer table")),
        }
    }

    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            CudaWeight::Float { mem, f32_copy, .. } => {
                mem.bytes() + f32_copy.get().map_or(0, |m| m.bytes())
            }
            CudaWeight::Matrix { mem, .. }
            | CudaWeight::Vector { mem, .. }
            | CudaWeight::Ints { mem, .. } => mem.bytes(),
        }
    }
}

/// Where the bytes of a tensor come from.
pub enum Source<'a> {
    /// The mapped file.
    File(&'a GgufFile),
    /// Generated on the device from `seed` and the tensor's name (see
    /// [`crate::synth::generate`]): quantized matrices and F16/BF16 matrices.
    Synthetic(u64),
}

/// The error for a synthetic tensor the device does not generate.
fn not_on_device(info: &TensorInfo) -> CudaError {
    CudaError::Unsupported(format!(
        "synthetic tensor '{}' ({}, {} elements) is not generated on the device: \
         vectors, integer tables and f32 tensors come from the header file",
        info.name,
        info.dtype,
        info.n_elements()
    ))
}

/// Uploads (or generates) tensor `info`. `staging` is a reusable device buffer for the
/// GGUF-layout bytes before they are split into planes.
pub fn load(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    staging: &mut Option<DevMem>,
    src: Source,
    info: &TensorInfo,
) -> Result<CudaWeight> {
    let cols = info.dims.first().copied().unwrap_or(1) as usize;
    let rows = (info.n_elements() / (cols as u64).max(1)) as usize;
    if info.dtype == GgmlType::I32 {
        let v: Vec<u8> = match src {
            Source::File(f) => f.tensor_data(info).to_vec(),
            Source::Synthetic(_) => return Err(not_on_device(info)),
        };
        let mem = gpu.alloc(v.len().max(4))?;
        gpu.htod(mem.ptr(), &v)?;
        return Ok(CudaWeight::Ints {
            mem: Arc::new(mem),
            len: v.len() / 4,
        });
    }
    if info.dims.len() == 1 || rows == 1 {
        let v = match src {
            Source::File(f) => vector_f32(info, f.tensor_data(info))?,
            Source::Synthetic(_) => return Err(not_on_device(info)),
        };
        let mem = gpu.alloc(v.len() * 4)?;
        gpu.htod(mem.ptr(), as_bytes(&v))?;
        return Ok(CudaWeight::Vector {
            mem: Arc::new(mem),
            len: v.len(),
        });
    }
    let ty = info.dtype;
    // Stacked matrices (experts, per-head weights): dims {cols, rows, n}.
    let per_rows = info.dims.get(1).copied().unwrap_or(1) as usize;
    let n_mats = rows / per_rows.max(1);
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return load_float(gpu, k, src, info, per_rows, cols, n_mats);
    }
    if ty == GgmlType::MXFP4 {
        return load_mxfp4(gpu, src, info, per_rows, cols, n_mats);
    }
    if !MATRIX_TYPES.contains(&ty) {
        return Err(CudaError::Unsupported(format!(
            "tensor '{}' has type {ty}, which the CUDA backend does not run",
            info.name
        )));
    }
    let n_blocks = rows * cols / ty.block_size();
    let layout = plane_layout(ty, n_blocks).expect("supported type");
    let raw_bytes = n_blocks * ty.type_size();
    if staging.as_ref().is_none_or(|s| s.bytes() < raw_bytes) {
        *staging = None;
        *staging = Some(gpu.alloc(raw_bytes)?);
    }
    let stage = staging.as_ref().expect("just allocated").ptr();
    match src {
        Source::File(f) => {
            let data = f.tensor_data(info);
            if data.len() != raw_bytes {
                return Err(CudaError::Unsupported(format!(
                    "tensor '{}': {} bytes in the file, {raw_bytes} expected",
                    info.name,
                    data.len()
                )));
            }
            gpu.htod(stage, data)?;
        }
        Source::Synthetic(seed) => {
            let key = generate::tensor_key(seed, &info.name);
            launch_synth_blocks(gpu, k, stage, ty, n_blocks, key)?;
        }
    }
    let mem = gpu.alloc(layout.total)?;
    let mut planes = [0 as DPtr; 4];
    for (i, &(off, size)) in fields(ty).expect("supported type").iter().enumerate() {
        planes[i] = mem.ptr() + layout.offsets[i] as u64;
        let mut a = Args::new();
        a.push(stage)
            .push(planes[i])
            .push(n_blocks as i64)
            .push(ty.type_size() as i32)
            .push(off as i32)
            .push(size as i32);
        gpu.launch(
            k.split_plane,
            grid((n_blocks * size) as u64, gpu),
            256,
            0,
            &a,
            false,
        )?;
    }
    let mut estride = [0u64; 4];
    let blocks_per_mat = (per_rows * cols / ty.block_size()) as u64;
    for (i, &(_, size)) in fields(ty).expect("supported type").iter().enumerate() {
        estride[i] = blocks_per_mat * size as u64;
    }
    Ok(CudaWeight::Matrix {
        mem: Arc::new(mem),
        m: MatRef {
            planes,
            ty,
            rows: per_rows as u32,
            cols: cols as u32,
        },
        n: n_mats as u32,
        estride,
    })
}

/// A float matrix (stack): small ones as f32, large ones in their file type.
fn load_float(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    src: Source,
    info: &TensorInfo,
    rows: usize,
    cols: usize,
    n: usize,
) -> Result<CudaWeight> {
    let elems = info.n_elements() as usize;
    let (ty, mem) = match src {
        Source::File(f) => {
            let (ty, bytes): (GgmlType, Vec<u8>) = if elems > SMALL_FLOAT {
                (info.dtype, f.tensor_data(info).to_vec())
            } else {
                (
                    GgmlType::F32,
                    as_bytes(&vector_f32(info, f.tensor_data(info))?).to_vec(),
                )
            };
            let mem = gpu.alloc(bytes.len().max(4))?;
            gpu.htod(mem.ptr(), &bytes)?;
            (ty, mem)
        }
        Source::Synthetic(seed) => {
            if !matches!(info.dtype, GgmlType::F16 | GgmlType::BF16) {
                return Err(not_on_device(info));
            }
            let mem = gpu.alloc(elems * 2)?;
            let key = generate::tensor_key(seed, &info.name);
            launch_synth_floats(gpu, k, mem.ptr(), info.dtype, elems, key)?;
            (info.dtype, mem)
        }
    };
    Ok(CudaWeight::Float {
        mem: Arc::new(mem),
        ty,
        rows,
        cols,
        n,
        f32_copy: OnceLock::new(),
    })
}

/// An MXFP4 matrix (stack) as a BF16 float matrix: every MXFP4 value (an E2M1 value
/// times a power of two) is a bf16 value, so the conversion is exact, and the
/// references multiply these weights as floats (DeepSeek-V4's routed experts, as the
/// CPU backend does).
fn load_mxfp4(
    gpu: &Arc<Gpu>,
    src: Source,
    info: &TensorInfo,
    rows: usize,
    cols: usize,
    n: usize,
) -> Result<CudaWeight> {
    let Source::File(f) = src else {
        return Err(not_on_device(info));
    };
    let elems = info.n_elements() as usize;
    let mut v = vec![0f32; elems];
    ds4_quant::dequantize_row(GgmlType::MXFP4, f.tensor_data(info), &mut v)
        .map_err(|e| CudaError::Unsupported(format!("tensor '{}': {e}", info.name)))?;
    let bytes: Vec<u8> = v
        .iter()
        .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
        .collect();
    let mem = gpu.alloc(bytes.len().max(4))?;
    gpu.htod(mem.ptr(), &bytes)?;
    Ok(CudaWeight::Float {
        mem: Arc::new(mem),
        ty: GgmlType::BF16,
        rows,
        cols,
        n,
        f32_copy: OnceLock::new(),
    })
}

/// Generates `n_blocks` random blocks of `ty` with `key` at `dst` (GGUF layout) with
/// `synth_blocks` ([`crate::synth::generate::blocks`] on the host).
fn launch_synth_blocks(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    dst: DPtr,
    ty: GgmlType,
    n_blocks: usize,
    key: u64,
) -> Result<()> {
    let mut a = Args::new();
    a.push(dst)
        .push(ty as i32)
        .push(ty.type_size() as i32)
        .push(n_blocks as i64)
        .push(key);
    let g = grid(n_blocks as u64, gpu);
    gpu.launch(k.synth_blocks, g, 256, 0, &a, false)
}

/// Generates `n` random floats of `ty` (F16 or BF16) with `key` at `dst` with
/// `synth_floats` ([`crate::synth::generate::floats`] on the host).
fn launch_synth_floats(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    dst: DPtr,
    ty: GgmlType,
    n: usize,
    key: u64,
) -> Result<()> {
    let mut a = Args::new();
    a.push(dst).push(ty as i32).push(n as i64).push(key);
    gpu.launch(k.synth_floats, grid(n as u64, gpu), 256, 0, &a, false)
}

/// A float weight built from values at load time (`Backend::weight_f32`), ggml dims
/// `{cols, rows[, n]}`.
pub fn from_values(gpu: &Arc<Gpu>, dims: &[usize], values: &[f32]) -> Result<CudaWeight> {
    let cols = dims.first().copied().unwrap_or(1);
    let rows = dims.get(1).copied().unwrap_or(1);
    let n = dims.iter().skip(2).product::<usize>().max(1);
    let mem = gpu.alloc((values.len() * 4).max(4))?;
    gpu.htod(mem.ptr(), as_bytes(values))?;
    let mem = Arc::new(mem);
    Ok(if dims.len() == 1 {
        CudaWeight::Vector {
            mem,
            len: values.len(),
        }
    } else {
        CudaWeight::Float {
            mem,
            ty: GgmlType::F32,
            rows,
            cols,
            n,
            f32_copy: OnceLock::new(),
        }
    })
}

fn grid(n: u64, gpu: &Gpu) -> (u32, u32, u32) {
    (n.div_ceil(256).clamp(1, gpu.n_sm as u64 * 16) as u32, 1, 1)
}

/// F32, F16 or BF16 values decoded to f32 (None: another type).
fn floats_f32(ty: GgmlType, data: &[u8]) -> Option<Vec<f32>> {
    Some(match ty {
        GgmlType::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::F16 => data
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        GgmlType::BF16 => data
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// A vector tensor decoded to f32 (F32, F16 or BF16).
fn vector_f32(info: &TensorInfo, data: &[u8]) -> Result<Vec<f32>> {
    let n = info.n_elements() as usize;
    let Some(v) = floats_f32(info.dtype, data) else {
        return Err(CudaError::Unsupported(format!(
            "vector tensor '{}' has type {}; the CUDA backend reads vectors in f32, f16 or bf16",
            info.name, info.dtype
        )));
    };
    if v.len() != n {
        return Err(CudaError::Unsupported(format!(
            "tensor '{}': {} values in the file, {n} expected",
            info.name,
            v.len()
        )));
    }
    Ok(v)
}

pub(crate) fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; the byte view covers the same memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

/// Generates `n` synthetic blocks of a quantized `ty`, or `n` random floats of F16 or
/// BF16, with `key` on the device and copies them back (GGUF layout), to check the
/// device generators against the host's.
pub fn synth_on_device(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    ty: GgmlType,
    key: u64,
    n: usize,
) -> Result<Vec<u8>> {
    let bytes = n * ty.type_size();
    let mem = gpu.alloc(bytes)?;
    if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
        launch_synth_floats(gpu, k, mem.ptr(), ty, n, key)?;
    } else {
        launch_synth_blocks(gpu, k, mem.ptr(), ty, n, key)?;
    }
    let mut out = vec![0u8; bytes];
    gpu.dtoh(&mut out, mem.ptr())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mxfp4_value_is_a_bf16_value() {
        // One block per scale exponent, its 32 nibbles every E2M1 code twice: each
        // dequantized value survives the bf16 rounding unchanged (`load_mxfp4`).
        for e in 0..=255u8 {
            let mut block = vec![e];
            block.extend((0..16u8).map(|i| i | (15 - i) << 4));
            let mut v = vec![0f32; 32];
            ds4_quant::dequantize_row(GgmlType::MXFP4, &block, &mut v).unwrap();
            for x in v {
                assert_eq!(bf16::from_f32(x).to_f32().to_bits(), x.to_bits(), "{x:e}");
            }
        }
    }
}
