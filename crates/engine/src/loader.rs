//! Loading a model from a GGUF file: architecture dispatch, hyperparameters
//! (`{arch}.*` metadata keys as llama.cpp names them) and tensors with shape checks, for
//! every family.

use std::path::Path;
use std::sync::Arc;

use ds4_gguf::{GgufFile, TensorInfo, Value};

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::families::deepseek4::DeepSeek4;
use crate::families::glm5_next::Glm5Next;
use crate::families::llama::{Llama, Variant};
use crate::model::Model;
use crate::{EngineError, Result};

/// Architectures this build can run.
pub const SUPPORTED_ARCHITECTURES: &[&str] =
    &["llama", "qwen2", "glm5-next", "glm5next", "deepseek4"];

/// Loads the model in `file` on the CPU backend, with as many threads as rayon's
/// global pool has (the CLI sizes it with `--threads`).
pub fn load_model(file: &Arc<GgufFile>, path: &Path) -> Result<Arc<dyn Model>> {
    load_model_with(
        Arc::new(CpuBackend::new(rayon::current_num_threads())?),
        file,
        path,
    )
}

/// Loads the model in `file` on `backend` (the CLI picks the backend; backends living
/// in other crates, such as CUDA, call this without the engine depending on them).
pub fn load_model_with<B: Backend>(
    backend: Arc<B>,
    file: &Arc<GgufFile>,
    path: &Path,
) -> Result<Arc<dyn Model>> {
    let hp = Hparams::new(file)?;
    let name = match file.get("general.name") {
        Some(Value::String(s)) => s.clone(),
        _ => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let _span =
        tracing::info_span!("load", arch = hp.arch(), backend = backend.name(), %name).entered();
    let model: Arc<dyn Model> = match hp.arch() {
        "llama" => Arc::new(Llama::load(backend, file, Variant::Llama, name)?),
        "qwen2" => Arc::new(Llama::load(backend, file, Variant::Qwen2, name)?),
        a if crate::families::glm5_next::ARCH_NAMES.contains(&a) => {
            Arc::new(Glm5Next::load(backend, file, name)?)
        }
        crate::families::deepseek4::ARCH => Arc::new(DeepSeek4::load(backend, file, name)?),
        other => return Err(EngineError::UnknownArchitecture(other.to_string())),
    };
    Ok(model)
}

/// Reads `{arch}.*` hyperparameters.
pub struct Hparams<'a> {
    file: &'a GgufFile,
    arch: String,
}

impl<'a> Hparams<'a> {
    /// Reads `general.architecture`.
    pub fn new(file: &'a GgufFile) -> Result<Self> {
        match file.get("general.architecture") {
            Some(Value::String(a)) => Ok(Hparams {
                file,
                arch: a.clone(),
            }),
            other => Err(EngineError::Metadata {
                key: "general.architecture".into(),
                detail: other
                    .map(|v| format!(" (found {})", v.describe()))
                    .unwrap_or_default(),
            }),
        }
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The file.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The full name of key `k` (`{arch}.k`).
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// An error naming key `k` with `detail` (e.g. `" (must be positive)"`).
    pub fn err(&self, k: &str, detail: impl Into<String>) -> EngineError {
        EngineError::Metadata {
            key: self.key(k),
            detail: detail.into(),
        }
    }

    /// The value of `{arch}.k`, if present.
    pub fn get(&self, k: &str) -> Option<&'a Value> {
        self.file.get(&self.key(k))
    }

    /// An unsigned integer `{arch}.k`.
    pub fn usize(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?.ok_or_else(|| self.err(k, ""))
    }

    /// An unsigned integer `{arch}.k`, or `default` when absent.
    pub fn usize_or(&self, k: &str, default: usize) -> Result<usize> {
        Ok(self.usize_opt(k)?.unwrap_or(default))
    }

    /// An unsigned integer `{arch}.k`, `None` when absent.
    pub fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(
                        k,
                        format!(" (expected an unsigned integer, found {})", v.describe()),
                    )
                }),
        }
    }

    /// A float `{arch}.k`.
    pub fn f32(&self, k: &str) -> Result<f32> {
        self.f32_opt(k)?.ok_or_else(|| self.err(k, ""))
    }

    /// A float `{arch}.k`, or `default` when absent.
    pub fn f32_or(&self, k: &str, default: f32) -> Result<f32> {
        Ok(self.f32_opt(k)?.unwrap_or(default))
    }

    /// A float `{arch}.k`, `None` when absent.
    pub fn f32_opt(&self, k: &str) -> Result<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.err(k, format!(" (expected a float, found {})", v.describe()))),
        }
    }

    /// A bool `{arch}.k`, `None` when absent.
    pub fn bool_opt(&self, k: &str) -> Result<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(k, format!(" (expected a bool, found {})", v.describe()))),
        }
    }

    /// A per-layer array of `n` entries, or a scalar repeated; `None` when absent.
    pub fn per_layer<T: Clone>(
        &self,
        k: &str,
        n: usize,
        conv: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        if let Some(items) = v.as_array() {
            if items.len() != n {
                return Err(self.err(
                    k,
                    format!(
                        " (array of {} entries, expected one per layer: {n})",
                        items.len()
                    ),
                ));
            }
            return items
                .iter()
                .map(|it| {
                    conv(it).ok_or_else(|| self.err(k, format!(" (bad element {})", it.describe())))
                })
                .collect::<Result<Vec<T>>>()
                .map(Some);
        }
        let x = conv(v).ok_or_else(|| self.err(k, format!(" (bad value {})", v.describe())))?;
        Ok(Some(vec![x; n]))
    }
}

/// Loads tensors onto a backend with shape checks, counting parameters and the bytes
/// a decode step reads. Names may list accepted alternatives (`&["a", "b"]`: the first
/// present one is used).
pub struct TensorLoader<'a, B: Backend> {
    backend: Arc<B>,
    file: &'a Arc<GgufFile>,
    n_params: u64,
    decode_bytes: u64,
}

/// Dims with trailing 1s removed (ggml pads shapes with 1).
fn trimmed(info: &TensorInfo) -> Vec<usize> {
    let mut d: Vec<usize> = info.dims.iter().map(|&x| x as usize).collect();
    while d.len() > 1 && d.last() == Some(&1) {
        d.pop();
    }
    d
}

impl<'a, B: Backend> TensorLoader<'a, B> {
    pub fn new(backend: Arc<B>, file: &'a Arc<GgufFile>) -> Self {
        TensorLoader {
            backend,
            file,
            n_params: 0,
            decode_bytes: 0,
        }
    }

    /// The backend weights are loaded onto.
    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// The first of `names` present in the file.
    pub fn find(&self, names: &[&str]) -> Option<&'a TensorInfo> {
        names.iter().find_map(|n| self.file.tensor(n))
    }

    fn require(&self, names: &[&str]) -> Result<&'a TensorInfo> {
        self.find(names)
            .ok_or_else(|| EngineError::MissingTensor(names.join("' or '")))
    }

    /// Loads `info` if its (trimmed) ggml dims are one of `shapes` (`None` entries match
    /// any size), counting `decode_fraction` of its bytes as read per decode step.
    fn load_info(
        &mut self,
        info: &TensorInfo,
        shapes: &[&[Option<usize>]],
        decode_fraction: (u64, u64),
    ) -> Result<B::Weight> {
        let d = trimmed(info);
        let fits = |s: &&[Option<usize>]| {
            let mut s: Vec<Option<usize>> = s.to_vec();
            while s.len() > 1 && s.last() == Some(&Some(1)) {
                s.pop();
            }
            s.len() == d.len() && s.iter().zip(&d).all(|(e, &g)| e.is_none_or(|e| e == g))
        };
        if !shapes.iter().any(fits) {
            return Err(EngineError::TensorShape {
                name: info.name.clone(),
                got: info.dims.clone(),
                expected: shapes[0]
                    .iter()
                    .map(|e| e.map_or(0, |e| e as u64))
                    .collect(),
            });
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes() / decode_fraction.1.max(1) * decode_fraction.0;
        self.backend.weight(self.file, info)
    }

    /// A matrix with rows of `cols` elements (and `rows` rows when given).
    pub fn matrix(&mut self, name: &str, cols: usize, rows: Option<usize>) -> Result<B::Weight> {
        self.optional_matrix(name, cols, rows)?
            .ok_or_else(|| EngineError::MissingTensor(name.into()))
    }

    /// Like [`Self::matrix`] but `None` when the tensor is absent.
    pub fn optional_matrix(
        &mut self,
        name: &str,
        cols: usize,
        rows: Option<usize>,
    ) -> Result<Option<B::Weight>> {
        match self.file.tensor(name) {
            None => Ok(None),
            Some(info) => self
                .load_info(info, &[&[Some(cols), rows]], (1, 1))
                .map(Some),
        }
    }

    /// A matrix `[rows, cols]` (ggml `{cols, rows}`) under any of `names`.
    pub fn mat(&mut self, names: &[&str], rows: usize, cols: usize) -> Result<B::Weight> {
        let info = self.require(names)?;
        self.load_info(info, &[&[Some(cols), Some(rows)]], (1, 1))
    }

    /// `n` stacked matrices `[n, rows, cols]` (ggml `{cols, rows, n}`, or `{cols, rows}`
    /// when `n` is 1) under any of `names`, of which `used` are read per decode step.
    pub fn stacked(
        &mut self,
        names: &[&str],
        n: usize,
        rows: usize,
        cols: usize,
        used: usize,
    ) -> Result<B::Weight> {
        let info = self.require(names)?;
        self.load_info(
            info,
            &[&[Some(cols), Some(rows), Some(n)]],
            (used as u64, n as u64),
        )
    }

    /// A tensor stored with ggml dims `file_dims` (checked) loaded with the same bytes as
    /// `dims` (llama.cpp's `TENSOR_ALLOW_RESHAPE`: DeepSeek-V4's grouped `attn_output_a`,
    /// `{n_in, G·ro}` in the file, `{n_in, ro, G}` as loaded), all of it read per decode
    /// step.
    pub fn reshaped(
        &mut self,
        name: &str,
        file_dims: &[usize],
        dims: &[usize],
    ) -> Result<B::Weight> {
        let info = self.require(&[name])?;
        let want: Vec<Option<usize>> = file_dims.iter().map(|&d| Some(d)).collect();
        let d = trimmed(info);
        let mut w = want.clone();
        while w.len() > 1 && w.last() == Some(&Some(1)) {
            w.pop();
        }
        if d.len() != w.len() || w.iter().zip(&d).any(|(e, &g)| *e != Some(g)) {
            return Err(EngineError::TensorShape {
                name: info.name.clone(),
                got: info.dims.clone(),
                expected: file_dims.iter().map(|&x| x as u64).collect(),
            });
        }
        if dims.iter().product::<usize>() != file_dims.iter().product::<usize>() {
            return Err(EngineError::Backend(format!(
                "reshaping '{name}' from {file_dims:?} to {dims:?} changes its size"
            )));
        }
        let mut view = info.clone();
        view.dims = dims.iter().map(|&x| x as u64).collect();
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes();
        self.backend.weight(self.file, &view)
    }

    /// The values of an I32 tensor of ggml dims `dims` (an id table), for checks at load.
    pub fn i32_values(&self, name: &str, dims: &[usize]) -> Result<Vec<i32>> {
        let info = self.require(&[name])?;
        if trimmed(info) != dims || info.dtype != ds4_gguf::GgmlType::I32 {
            return Err(EngineError::TensorShape {
                name: info.name.clone(),
                got: info.dims.clone(),
                expected: dims.iter().map(|&x| x as u64).collect(),
            });
        }
        Ok(self
            .file
            .tensor_data(info)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// A small tensor of any of `shapes` (ggml dims) under any of `names`, kept decoded
    /// by the backend (vectors, conv kernels, position biases).
    pub fn small(&mut self, names: &[&str], shapes: &[&[usize]]) -> Result<B::Weight> {
        let info = self.require(names)?;
        let shapes: Vec<Vec<Option<usize>>> = shapes
            .iter()
            .map(|s| s.iter().map(|&x| Some(x)).collect())
            .collect();
        let refs: Vec<&[Option<usize>]> = shapes.iter().map(|s| &s[..]).collect();
        self.load_info(info, &refs, (1, 1))
    }

    /// An embedding table: only one row of it is read per decode step.
    pub fn embedding(&mut self, name: &str, cols: usize) -> Result<B::Weight> {
        let info = self.require(&[name])?;
        let rows = info.dims.get(1).copied().unwrap_or(1).max(1);
        self.load_info(info, &[&[Some(cols), None]], (1, rows))
    }

    /// Counts a whole tensor as read per decode step once more (a tied output head).
    pub fn count_reuse(&mut self, name: &str) {
        if let Some(info) = self.file.tensor(name) {
            self.decode_bytes += info.n_bytes();
        }
    }

    /// A vector of `len` elements.
    pub fn vector(&mut self, name: &str, len: usize) -> Result<B::Weight> {
        self.optional_vector(name, len)?
            .ok_or_else(|| EngineError::MissingTensor(name.into()))
    }

    /// Like [`Self::vector`] but `None` when the tensor is absent.
    pub fn optional_vector(&mut self, name: &str, len: usize) -> Result<Option<B::Weight>> {
        match self.file.tensor(name) {
            None => Ok(None),
            Some(info) => self.load_info(info, &[&[Some(len)]], (1, 1)).map(Some),
        }
    }

    /// A vector of `len` elements under any of `names`.
    pub fn vec_any(&mut self, names: &[&str], len: usize) -> Result<B::Weight> {
        let info = self.require(names)?;
        self.load_info(info, &[&[Some(len)]], (1, 1))
    }

    /// The values of a small tensor on the host (decoded to f32; for weights the loader
    /// re-lays out or checks), counted like a loaded tensor.
    pub fn host_values(&mut self, names: &[&str], shapes: &[&[usize]]) -> Result<Vec<f32>> {
        let info = self.require(names)?;
        let d = trimmed(info);
        if !shapes.contains(&d.as_slice()) {
            return Err(EngineError::TensorShape {
                name: info.name.clone(),
                got: info.dims.clone(),
                expected: shapes[0].iter().map(|&x| x as u64).collect(),
            });
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes();
        decode_tensor(self.file, info)
    }

    /// A weight re-laid-out at load time from f32 values (see
    /// [`Backend::weight_f32`]).
    pub fn derived(&mut self, name: &str, dims: &[usize], values: &[f32]) -> Result<B::Weight> {
        self.backend.weight_f32(name, dims, values)
    }

    /// The number of rows of a 2-D tensor.
    pub fn rows_of(&self, name: &str) -> Result<usize> {
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        Ok(info.dims.get(1).copied().unwrap_or(1) as usize)
    }

    /// The type of a present tensor.
    pub fn type_of(&self, name: &str) -> Option<ds4_gguf::GgmlType> {
        self.file.tensor(name).map(|i| i.dtype)
    }

    pub fn n_params(&self) -> u64 {
        self.n_params
    }

    pub fn decode_bytes(&self) -> u64 {
        self.decode_bytes
    }
}

/// All values of a tensor as f32 (any type `ds4_quant` decodes).
pub fn decode_tensor(file: &GgufFile, info: &TensorInfo) -> Result<Vec<f32>> {
    let bad =
        |e: String| EngineError::Config(format!("tensor '{}' cannot be decoded: {e}", info.name));
    let n = info.n_elements() as usize;
    let row = (info.dims.first().copied().unwrap_or(1) as usize).max(1);
    let rb = info
        .row_bytes()
        .ok_or_else(|| bad("rows are not whole blocks".into()))? as usize;
    let data = file.tensor_data(info);
    let mut out = vec![0f32; n];
    for (r, o) in out.chunks_exact_mut(row).enumerate() {
        ds4_quant::dequantize_row(info.dtype, &data[r * rb..(r + 1) * rb], o)
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(out)
}
