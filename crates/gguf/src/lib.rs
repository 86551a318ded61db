//! GGUF v3: reading over mmap and writing.
//!
//! Follows the GGUF specification (ggml `docs/gguf.md`): a header (magic `GGUF`,
//! version 3, tensor count, metadata count), typed metadata key/values, the tensor
//! directory (name, dims in ggml order — `dims[0]` is the fastest-varying axis — ggml
//! type, offset relative to the aligned data section), then the tensor data.
//!
//! - [`GgufFile`] opens and validates a file ([`GgufFile::open`] maps it; tensor data is never
//!   copied) and gives metadata ([`Metadata`], typed getters through [`FromValue`]), the
//!   tensor directory ([`TensorInfo`]) and tensor bytes or typed views ([`TensorElement`]).
//! - [`GgufWriter`] builds a file from metadata and tensors.
//! - [`GgufError`] names the file and the field or tensor at fault.
//!
//! Modules: `reader` (parsing, validation), `writer`, `value` ([`Value`], [`ValueType`]),
//! `convert` ([`FromValue`]), `metadata`, `tensor`, `types` ([`GgmlType`]), `view`, `file`,
//! `error`.

mod convert;
mod error;
mod file;
mod metadata;
mod reader;
mod tensor;
mod types;
mod value;
mod view;
mod writer;

pub use convert::FromValue;
pub use error::GgufError;
pub use file::GgufFile;
pub use metadata::Metadata;
pub use reader::{DEFAULT_ALIGNMENT, MAX_ARRAY_NESTING, MAX_METADATA_VALUES};
pub use tensor::{MAX_DIMS, MAX_TENSOR_NAME_LEN, TensorInfo};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use view::TensorElement;
pub use writer::GgufWriter;
