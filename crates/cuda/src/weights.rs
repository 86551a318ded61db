//! Weights on the device: quantized matrices split into field planes
//! ([`crate::layout`]) from the file's bytes or generated synthetically on the GPU, and
//! f32 vectors (norm weights, biases).

use std::sync::Arc;

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
    /// A quantized matrix (`rows × cols`) in field planes.
    Matrix { mem: Arc<DevMem>, m: MatRef },
    /// An f32 vector.
    Vector { mem: Arc<DevMem>, len: usize },
}

impl CudaWeight {
    pub(crate) fn mat(&self) -> (&Arc<DevMem>, MatRef) {
        match self {
            CudaWeight::Matrix { mem, m } => (mem, *m),
            CudaWeight::Vector { .. } => panic!(
                "a vector weight used as a matrix (the model family passed the wrong tensor)"
            ),
        }
    }

    pub(crate) fn vec(&self) -> (&Arc<DevMem>, usize) {
        match self {
            CudaWeight::Vector { mem, len } => (mem, *len),
            CudaWeight::Matrix { .. } => panic!(
                "a matrix weight used as a vector (the model family passed the wrong tensor)"
            ),
        }
    }

    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            CudaWeight::Matrix { mem, .. } | CudaWeight::Vector { mem, .. } => mem.bytes(),
        }
    }
}

/// Where the bytes of a tensor come from.
pub enum Source<'a> {
    /// The mapped file.
    File(&'a GgufFile),
    /// Generated from `seed` and the tensor's name (see [`crate::synth::generate`]).
    Synthetic(u64),
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
    if info.dims.len() == 1 || rows == 1 {
        let v = match src {
            Source::File(f) => vector_f32(info, f.tensor_data(info))?,
            Source::Synthetic(seed) => generate::vector(seed, &info.name, cols),
        };
        let mem = gpu.alloc(v.len() * 4)?;
        gpu.htod(mem.ptr(), as_bytes(&v))?;
        return Ok(CudaWeight::Vector {
            mem: Arc::new(mem),
            len: v.len(),
        });
    }
    let ty = info.dtype;
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
            let mut a = Args::new();
            a.push(stage)
                .push(ty as i32)
                .push(ty.type_size() as i32)
                .push(n_blocks as i64)
                .push(generate::tensor_key(seed, &info.name));
            gpu.launch(
                k.synth_blocks,
                grid(n_blocks as u64, gpu),
                256,
                0,
                &a,
                false,
            )?;
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
    Ok(CudaWeight::Matrix {
        mem: Arc::new(mem),
        m: MatRef {
            planes,
            ty,
            rows: rows as u32,
            cols: cols as u32,
        },
    })
}

fn grid(n: u64, gpu: &Gpu) -> (u32, u32, u32) {
    (n.div_ceil(256).clamp(1, gpu.n_sm as u64 * 16) as u32, 1, 1)
}

/// A vector tensor decoded to f32 (F32, F16 or BF16).
fn vector_f32(info: &TensorInfo, data: &[u8]) -> Result<Vec<f32>> {
    let n = info.n_elements() as usize;
    let v: Vec<f32> = match info.dtype {
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
        ty => {
            return Err(CudaError::Unsupported(format!(
                "vector tensor '{}' has type {ty}; the CUDA backend reads vectors in f32, f16 or bf16",
                info.name
            )));
        }
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

/// Generates `n_blocks` synthetic blocks of `ty` with `key` on the device and copies
/// them back (GGUF layout), to check the device generator against the host's.
pub fn synth_on_device(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    ty: GgmlType,
    key: u64,
    n_blocks: usize,
) -> Result<Vec<u8>> {
    let bytes = n_blocks * ty.type_size();
    let mem = gpu.alloc(bytes)?;
    let mut a = Args::new();
    a.push(mem.ptr())
        .push(ty as i32)
        .push(ty.type_size() as i32)
        .push(n_blocks as i64)
        .push(key);
    gpu.launch(
        k.synth_blocks,
        grid(n_blocks as u64, gpu),
        256,
        0,
        &a,
        false,
    )?;
    let mut out = vec![0u8; bytes];
    gpu.dtoh(&mut out, mem.ptr())?;
    Ok(out)
}
