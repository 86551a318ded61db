//! Loading a model from a GGUF file: architecture dispatch, hyperparameters
//! (`{arch}.*` metadata keys as llama.cpp names them) and tensors with shape checks.

use std::path::Path;
use std::sync::Arc;

use ds4_gguf::{GgufFile, Value};

use crate::backend::Backend;
use crate::backend::cpu::CpuBackend;
use crate::families::llama::{Llama, Variant};
use crate::model::Model;
use crate::{EngineError, Result};

/// Architectures this build can run.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "glm5next", "glm5-next"];

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
        "glm5next" | "glm5-next" => {
            Arc::new(crate::families::glm5_next::Glm5Next::load(file, name)?)
        }
        other => return Err(EngineError::UnknownArchitecture(other.to_string())),
    };
    Ok(model)
}

/// Reads `{arch}.*` hyperparameters.
pub struct Hparams<'a> {
    file: &'a GgufFile,
    arch: String,
}

fn as_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x as u64),
        Value::U16(x) => Some(x as u64),
        Value::U32(x) => Some(x as u64),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

impl<'a> Hparams<'a> {
    /// Reads `general.architecture`.
    pub fn new(file: &'a GgufFile) -> Result<Self> {
        match file.get("general.architecture") {
            Some(Value::String(a)) => Ok(Hparams {
                file,
                arch: a.clone(),
            }),
            _ => Err(EngineError::Metadata {
                key: "general.architecture".into(),
                detail: String::new(),
            }),
        }
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn missing(&self, k: &str, detail: &str) -> EngineError {
        EngineError::Metadata {
            key: self.key(k),
            detail: detail.to_string(),
        }
    }

    /// An unsigned integer `{arch}.k`.
    pub fn usize(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?.ok_or_else(|| self.missing(k, ""))
    }

    /// An unsigned integer `{arch}.k`, or `default` when absent.
    pub fn usize_or(&self, k: &str, default: usize) -> Result<usize> {
        Ok(self.usize_opt(k)?.unwrap_or(default))
    }

    fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.file.get(&self.key(k)) {
            None => Ok(None),
            Some(v) => as_u64(v)
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.missing(k, &format!(" (expected an unsigned integer, found {v:?})"))
                }),
        }
    }

    /// A float `{arch}.k`.
    pub fn f32(&self, k: &str) -> Result<f32> {
        self.f32_opt(k)?.ok_or_else(|| self.missing(k, ""))
    }

    /// A float `{arch}.k`, or `default` when absent.
    pub fn f32_or(&self, k: &str, default: f32) -> Result<f32> {
        Ok(self.f32_opt(k)?.unwrap_or(default))
    }

    fn f32_opt(&self, k: &str) -> Result<Option<f32>> {
        match self.file.get(&self.key(k)) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(v) => Err(self.missing(k, &format!(" (expected a float, found {v:?})"))),
        }
    }
}

/// Loads tensors onto a backend with shape checks, counting parameters and the bytes
/// a decode step reads.
pub struct TensorLoader<'a, B: Backend> {
    backend: Arc<B>,
    file: &'a Arc<GgufFile>,
    n_params: u64,
    decode_bytes: u64,
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

    fn load(&mut self, name: &str, expected: &[Option<usize>]) -> Result<Option<B::Weight>> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let ok = info.dims.len() == expected.len()
            && info
                .dims
                .iter()
                .zip(expected)
                .all(|(&d, e)| e.is_none_or(|e| d == e as u64));
        if !ok {
            return Err(EngineError::TensorShape {
                name: name.to_string(),
                got: info.dims.clone(),
                expected: expected.iter().map(|e| e.map_or(0, |e| e as u64)).collect(),
            });
        }
        self.n_params += info.n_elements();
        self.decode_bytes += info.n_bytes();
        Ok(Some(self.backend.weight(self.file, info)?))
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
        self.load(name, &[Some(cols), rows])
    }

    /// An embedding table: only one row of it is read per decode step.
    pub fn embedding(&mut self, name: &str, cols: usize) -> Result<B::Weight> {
        let w = self.matrix(name, cols, None)?;
        let info = self.file.tensor(name).expect("just loaded");
        let rows = info.dims[1].max(1);
        self.decode_bytes -= info.n_bytes() - info.n_bytes() / rows;
        Ok(w)
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
        self.load(name, &[Some(len)])
    }

    /// The number of rows of a 2-D tensor.
    pub fn rows_of(&self, name: &str) -> Result<usize> {
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| EngineError::MissingTensor(name.into()))?;
        Ok(info.dims.get(1).copied().unwrap_or(1) as usize)
    }

    pub fn n_params(&self) -> u64 {
        self.n_params
    }

    pub fn decode_bytes(&self) -> u64 {
        self.decode_bytes
    }
}
