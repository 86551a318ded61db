//! Tensor sources for the converter: a Hugging Face checkpoint directory
//! (`*.safetensors` shards, memory-mapped) or an in-memory set (the synthetic
//! benchmark model). Values are read as f32 (F32, BF16 and F16 tensors).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::ConvertError;

/// A set of named tensors, read as f32.
pub trait TensorSource: Sync {
    /// The shape of `name`, if present.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// The values of `name` (row-major), if present.
    ///
    /// # Errors
    /// [`ConvertError::Tensor`] for an unsupported dtype or unreadable data.
    fn read(&self, name: &str) -> Result<Option<Vec<f32>>, ConvertError>;
    /// Every tensor name.
    fn names(&self) -> Vec<String>;
    /// The stored dtype, shape and bytes of `name` (for the formats [`TensorSource::read`]
    /// does not decode: FP8 and FP4 weights and their scales); `None` when absent or not
    /// stored as raw bytes.
    fn raw(&self, name: &str) -> Option<Raw> {
        let _ = name;
        None
    }
}

/// A tensor as stored (see [`TensorSource::raw`]).
#[derive(Debug, Clone)]
pub struct Raw {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// The `*.safetensors` files of a checkpoint directory, memory-mapped.
pub struct SafetensorsDir {
    maps: Vec<(PathBuf, Mmap)>,
    /// name → (file index, dtype, shape, byte range within the file's data)
    index: HashMap<String, (usize, Dtype, Vec<usize>)>,
}

impl SafetensorsDir {
    /// Opens every `*.safetensors` file of `dir`.
    ///
    /// # Errors
    /// [`ConvertError::Io`] for unreadable files, [`ConvertError::Tensor`] for a file
    /// that is not valid safetensors, or a directory without any.
    pub fn open(dir: &Path) -> Result<Self, ConvertError> {
        let io = |p: &Path, e| ConvertError::Io {
            path: p.display().to_string(),
            source: e,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ConvertError::Tensor(format!(
                "no *.safetensors files in {}",
                dir.display()
            )));
        }
        let mut maps = Vec::with_capacity(files.len());
        let mut index = HashMap::new();
        for (fi, p) in files.into_iter().enumerate() {
            let f = std::fs::File::open(&p).map_err(|e| io(&p, e))?;
            // SAFETY: the file is mapped read-only; a checkpoint modified while it is
            // converted is the caller's error, as for any memory-mapped reader.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| io(&p, e))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| {
                ConvertError::Tensor(format!("{}: not a safetensors file: {e}", p.display()))
            })?;
            for (name, view) in st.tensors() {
                index.insert(name, (fi, view.dtype(), view.shape().to_vec()));
            }
            maps.push((p, map));
        }
        Ok(SafetensorsDir { maps, index })
    }
}

/// Decodes little-endian `dtype` bytes to f32.
pub fn to_f32(dtype: Dtype, bytes: &[u8], name: &str) -> Result<Vec<f32>, ConvertError> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        // Id tables (DeepSeek-V4's `tid2eid`): small integers, exact in f32.
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
            .collect(),
        other => {
            return Err(ConvertError::Tensor(format!(
                "tensor '{name}' has dtype {other:?} (F32, BF16, F16 or an integer id table expected; FP8 and \
                 FP4 weights need their `.scale`)"
            )));
        }
    })
}

impl TensorSource for SafetensorsDir {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.index.get(name).map(|(_, _, s)| s.clone())
    }

    fn read(&self, name: &str) -> Result<Option<Vec<f32>>, ConvertError> {
        let Some(&(fi, dtype, _)) = self.index.get(name) else {
            return Ok(None);
        };
        let (path, map) = &self.maps[fi];
        let st = SafeTensors::deserialize(map)
            .map_err(|e| ConvertError::Tensor(format!("{}: {e}", path.display())))?;
        let view = st
            .tensor(name)
            .map_err(|e| ConvertError::Tensor(format!("{}: {name}: {e}", path.display())))?;
        to_f32(dtype, view.data(), name).map(Some)
    }

    fn names(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }

    fn raw(&self, name: &str) -> Option<Raw> {
        let &(fi, dtype, ref shape) = self.index.get(name)?;
        let (_, map) = &self.maps[fi];
        let st = SafeTensors::deserialize(map).ok()?;
        let view = st.tensor(name).ok()?;
        Some(Raw {
            dtype,
            shape: shape.clone(),
            bytes: view.data().to_vec(),
        })
    }
}

/// Tensors held in memory (name → shape, values; or stored bytes in `raw`).
#[derive(Default)]
pub struct MemorySource {
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// Tensors as stored (FP8, FP4 and their scales).
    pub raw: BTreeMap<String, Raw>,
}

impl TensorSource for MemorySource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors
            .get(name)
            .map(|(s, _)| s.clone())
            .or_else(|| self.raw.get(name).map(|r| r.shape.clone()))
    }

    fn read(&self, name: &str) -> Result<Option<Vec<f32>>, ConvertError> {
        match (self.tensors.get(name), self.raw.get(name)) {
            (Some((_, v)), _) => Ok(Some(v.clone())),
            (None, Some(r)) => to_f32(r.dtype, &r.bytes, name).map(Some),
            (None, None) => Ok(None),
        }
    }

    fn names(&self) -> Vec<String> {
        self.tensors
            .keys()
            .chain(self.raw.keys())
            .cloned()
            .collect()
    }

    fn raw(&self, name: &str) -> Option<Raw> {
        self.raw.get(name).cloned()
    }
}
