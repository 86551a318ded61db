//! GGUF v3: reading over mmap and writing.
//!
//! Follows the GGUF specification (ggml `docs/gguf.md`): a header (magic `GGUF`,
//! version 3, tensor count, metadata count), typed metadata key/values, the tensor
//! directory (name, dims in ggml order — `dims[0]` is the fastest-varying axis — ggml
//! type, offset relative to the aligned data section), then the tensor data.
//!
//! API CONTRACT (stub written by the lead; the gguf helper implements it and may extend
//! it, but keeps these names and signatures):
//! - `GgmlType` (complete here), `Value`, `TensorInfo`, `GgufFile`, `GgufError`, `GgufWriter`.

mod types;
pub use types::GgmlType;

use std::collections::BTreeMap;
use std::path::Path;

/// A metadata value, in the GGUF value types.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    /// Arrays may nest (an array of arrays).
    Array(Vec<Value>),
}

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

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Size of the tensor's data in bytes.
    pub fn n_bytes(&self) -> u64 {
        todo!()
    }
}

/// Errors from reading or writing GGUF; messages name the file and the field or tensor.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{0}")]
    Todo(String),
}

/// An open GGUF file (memory-mapped, or owned bytes for tests).
pub struct GgufFile {
    _private: (),
}

impl GgufFile {
    /// Opens and validates a GGUF v3 file over mmap.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let _ = path;
        todo!()
    }
    /// Parses and validates GGUF bytes held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let _ = bytes;
        todo!()
    }
    /// All metadata in file order.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        todo!()
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        let _ = key;
        todo!()
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        todo!()
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let _ = name;
        todo!()
    }
    /// The raw bytes of a tensor (validated in bounds at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let _ = info;
        todo!()
    }
}

/// Builds a GGUF v3 file: metadata in insertion order, tensors aligned to `alignment`.
pub struct GgufWriter {
    _private: (),
}
