//! Reading the `glm5_next` tensors of a GGUF file with shape and type checks
//! (`docs/glm5_next_gguf.md` has the name table). Names follow llama.cpp's
//! (`blk.{i}.ssm_*` for KDA as in `kimi-linear`, `blk.{i}.hc_{attn,ffn}_{fn,base,scale}`
//! as in `deepseek4`, `blk.{i}.indexer.*` / `indexer_compressor_*` for the DSA indexer,
//! `attn_k_b`/`attn_v_b` for MLA); accepted alternatives are listed next to each.

use std::sync::Arc;

use ds4_gguf::{GgmlType, GgufFile, TensorInfo};

use super::linear::Linear;
use crate::{EngineError, Result};

/// Loads tensors, counting parameters and the bytes a decode step reads.
pub struct Loader<'a> {
    pub file: &'a Arc<GgufFile>,
    pub n_params: u64,
    pub decode_bytes: u64,
}

fn shape_err(info: &TensorInfo, expected: &[usize]) -> EngineError {
    EngineError::TensorShape {
        name: info.name.clone(),
        got: info.dims.clone(),
        expected: expected.iter().map(|&e| e as u64).collect(),
    }
}

impl<'a> Loader<'a> {
    pub fn new(file: &'a Arc<GgufFile>) -> Self {
        Loader {
            file,
            n_params: 0,
            decode_bytes: 0,
        }
    }

    /// The first of `names` present in the file.
    pub fn find(&self, names: &[&str]) -> Option<&'a TensorInfo> {
        names.iter().find_map(|n| self.file.tensor(n))
    }

    fn require(&self, names: &[&str]) -> Result<&'a TensorInfo> {
        self.find(names)
            .ok_or_else(|| EngineError::MissingTensor(names.join("' or '")))
    }

    fn check_type(&self, info: &TensorInfo) -> Result<()> {
        if !ds4_quant::is_supported(info.dtype) {
            return Err(EngineError::UnsupportedTensorType {
                name: info.name.clone(),
                ty: info.dtype,
            });
        }
        Ok(())
    }

    /// Dims with trailing 1s removed (ggml pads shapes with 1).
    fn dims(info: &TensorInfo) -> Vec<usize> {
        let mut d: Vec<usize> = info.dims.iter().map(|&x| x as usize).collect();
        while d.len() > 1 && d.last() == Some(&1) {
            d.pop();
        }
        d
    }

    /// A matrix `[rows, cols]` (ggml dims `{cols, rows}`), counted as read once per
    /// decode step.
    pub fn matrix(&mut self, names: &[&str], rows: usize, cols: usize) -> Result<Linear> {
        let info = self.require(names)?;
        self.check_type(info)?;
        if Self::dims(info) != [cols, rows] {
            return Err(shape_err(info, &[cols, rows]));
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes();
        Ok(Linear::mapped(self.file, info, 0, rows, cols))
    }

    /// An embedding table `[rows, cols]`: one row is read per token.
    pub fn embedding(&mut self, name: &str, cols: usize) -> Result<Linear> {
        let info = self.require(&[name])?;
        self.check_type(info)?;
        let d = Self::dims(info);
        if d.len() != 2 || d[0] != cols {
            return Err(shape_err(info, &[cols, 0]));
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes() / d[1].max(1) as u64;
        Ok(Linear::mapped(self.file, info, 0, d[1], cols))
    }

    /// `n` stacked matrices `[n, rows, cols]` (ggml `{cols, rows, n}`), of which
    /// `used` are read per decode step.
    pub fn stacked(
        &mut self,
        names: &[&str],
        n: usize,
        rows: usize,
        cols: usize,
        used: usize,
    ) -> Result<Vec<Linear>> {
        let info = self.require(names)?;
        self.check_type(info)?;
        let d = Self::dims(info);
        let ok = d == [cols, rows, n] || (n == 1 && d == [cols, rows]);
        if !ok {
            return Err(shape_err(info, &[cols, rows, n]));
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes() / n.max(1) as u64 * used as u64;
        Ok((0..n)
            .map(|e| Linear::mapped(self.file, info, e * rows, rows, cols))
            .collect())
    }

    /// A vector of `len` values, decoded to f32 (any dims whose product is `len` and
    /// whose first is `len`, e.g. `{len}` or `{len, 1}`).
    pub fn vector(&mut self, names: &[&str], len: usize) -> Result<Vec<f32>> {
        let info = self.require(names)?;
        self.values(info, &[len])
    }

    /// Like [`Loader::vector`], `None` when absent.
    pub fn opt_vector(&mut self, names: &[&str], len: usize) -> Result<Option<Vec<f32>>> {
        match self.find(names) {
            None => Ok(None),
            Some(info) => self.values(info, &[len]).map(Some),
        }
    }

    /// A small tensor of exactly `dims` (ggml order), decoded to f32 row-major.
    pub fn values(&mut self, info: &TensorInfo, dims: &[usize]) -> Result<Vec<f32>> {
        self.check_type(info)?;
        if Self::dims(info) != dims {
            return Err(shape_err(info, dims));
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes();
        let n = info.n_elements() as usize;
        let mut out = vec![0f32; n];
        let rb = info.row_bytes().unwrap_or(0) as usize;
        let row = info.dims[0] as usize;
        let data = self.file.tensor_data(info);
        for (r, o) in out.chunks_exact_mut(row.max(1)).enumerate() {
            ds4_quant::dequantize_row(info.dtype, &data[r * rb..(r + 1) * rb], o).map_err(|e| {
                EngineError::Config(format!("tensor '{}' cannot be decoded: {e}", info.name))
            })?;
        }
        Ok(out)
    }

    /// A small tensor found under any of `names`, of exactly `dims` (or `alt` dims).
    pub fn values_any(&mut self, names: &[&str], dims: &[&[usize]]) -> Result<Vec<f32>> {
        let info = self.require(names)?;
        let d = Self::dims(info);
        let pick = dims
            .iter()
            .find(|x| **x == d.as_slice())
            .copied()
            .unwrap_or(dims[0]);
        self.values(info, pick)
    }

    /// The type of a present tensor.
    pub fn type_of(&self, name: &str) -> Option<GgmlType> {
        self.file.tensor(name).map(|i| i.dtype)
    }
}
