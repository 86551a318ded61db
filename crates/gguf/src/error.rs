//! Errors from reading, querying and writing GGUF.
//!
//! Every variant names the file it is about (`file`: the path given to
//! [`GgufFile::open`](crate::GgufFile::open), `<memory>` for bytes parsed in memory,
//! `<writer>` for [`GgufWriter`](crate::GgufWriter)) and the metadata key, tensor or header
//! field at fault. Names taken from a file are clipped to a few hundred characters so that a
//! corrupted file cannot make a huge message.

use crate::GgmlType;

/// Errors from reading or writing GGUF; messages name the file and the field or tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening, mapping or writing the file failed.
    #[error("{file}: {error}")]
    Io {
        file: String,
        /// Shown in the message (not as a separate `source`, which would print it twice
        /// in an error chain).
        error: std::io::Error,
    },
    /// The file ends before a field that the format requires.
    #[error(
        "{file}: truncated: {what} at byte {offset} needs {needed} bytes, only {available} left"
    )]
    Truncated {
        file: String,
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("{file}: not a GGUF file: magic is {found:?}, expected \"GGUF\"")]
    BadMagic { file: String, found: String },
    /// A version other than 2 or 3 (version 1 used 32-bit counts and is not read).
    #[error("{file}: unsupported GGUF version {version} (this reader accepts 2 and 3)")]
    UnsupportedVersion { file: String, version: u32 },
    /// The version reads as 2 or 3 byte-swapped: a big-endian GGUF.
    #[error("{file}: big-endian GGUF (version {version} byte-swapped) is not supported")]
    BigEndian { file: String, version: u32 },
    /// A count that the remaining bytes cannot possibly hold (a corrupted count).
    #[error(
        "{file}: {what} = {count} at byte {offset} is impossible: the {remaining} bytes left \
         hold at most {max} (the file is truncated or corrupted)"
    )]
    CountTooLarge {
        file: String,
        what: String,
        count: u64,
        offset: u64,
        remaining: u64,
        max: u64,
    },
    /// The metadata holds more values (array elements included) than this reader accepts.
    #[error(
        "{file}: metadata key '{key}': the metadata would hold more than {max} values \
         (array elements included)"
    )]
    MetadataTooLarge { file: String, key: String, max: u64 },
    /// A metadata value type id outside the GGUF value types.
    #[error("{file}: metadata key '{key}': unknown value type id {type_id} at byte {offset}")]
    UnknownValueType {
        file: String,
        key: String,
        type_id: u32,
        offset: u64,
    },
    /// A string (key, value or tensor name) that is not UTF-8.
    #[error("{file}: {what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        file: String,
        what: String,
        offset: u64,
    },
    /// A bool byte other than 0 or 1.
    #[error("{file}: metadata key '{key}': bool byte {byte} at byte {offset} is neither 0 nor 1")]
    InvalidBool {
        file: String,
        key: String,
        byte: u8,
        offset: u64,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_NESTING`](crate::MAX_ARRAY_NESTING).
    #[error("{file}: metadata key '{key}': arrays nested deeper than {max} levels")]
    NestingTooDeep {
        file: String,
        key: String,
        max: usize,
    },
    /// The same metadata key twice.
    #[error("{file}: duplicate metadata key '{key}'")]
    DuplicateKey { file: String, key: String },
    /// `general.alignment` is not a `u32` power of two.
    #[error("{file}: general.alignment: {problem}")]
    BadAlignment { file: String, problem: String },
    /// A tensor with more than [`MAX_DIMS`](crate::MAX_DIMS) dimensions.
    #[error("{file}: tensor '{tensor}': {n_dims} dimensions, at most {max} allowed")]
    TooManyDims {
        file: String,
        tensor: String,
        n_dims: u64,
        max: usize,
    },
    /// A tensor name longer than [`MAX_TENSOR_NAME_LEN`](crate::MAX_TENSOR_NAME_LEN) bytes.
    #[error("{file}: tensor name '{tensor}' is {len} bytes, at most {max} allowed")]
    NameTooLong {
        file: String,
        tensor: String,
        len: u64,
        max: usize,
    },
    /// A ggml type id that is not one of [`GgmlType::ALL`].
    #[error("{file}: tensor '{tensor}': unknown ggml type id {type_id}")]
    UnknownTensorType {
        file: String,
        tensor: String,
        type_id: u32,
    },
    /// The same tensor name twice.
    #[error("{file}: duplicate tensor '{tensor}'")]
    DuplicateTensor { file: String, tensor: String },
    /// The element count or byte size of a tensor exceeds `i64::MAX`.
    #[error("{file}: tensor '{tensor}': dims {dims:?} overflow (elements or bytes past 2^63 - 1)")]
    DimsOverflow {
        file: String,
        tensor: String,
        dims: Vec<u64>,
    },
    /// A row length (`dims[0]`) that is not a multiple of the type's block size.
    #[error(
        "{file}: tensor '{tensor}': row length {row} is not a multiple of the {dtype} block \
         size {block}"
    )]
    RowNotBlockMultiple {
        file: String,
        tensor: String,
        row: u64,
        dtype: GgmlType,
        block: usize,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error(
        "{file}: tensor '{tensor}': offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        file: String,
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    /// A tensor whose bytes end past the end of the data section.
    #[error(
        "{file}: tensor '{tensor}': offset {offset} + size {size} is past the end of the data \
         section ({data_len} bytes): the file is truncated or corrupt (fetch it again; \
         `ds4-server pull --verify` checks a pulled model)"
    )]
    OffsetOutOfRange {
        file: String,
        tensor: String,
        offset: u64,
        size: u64,
        data_len: u64,
    },
    /// Two tensors whose byte ranges overlap.
    #[error("{file}: tensors '{first}' and '{second}' overlap in the data section")]
    OverlappingTensors {
        file: String,
        first: String,
        second: String,
    },
    /// The file has tensors but ends before its (aligned) data section starts.
    #[error(
        "{file}: the data section would start at byte {data_start}, past the end of the file ({len} bytes): the file is truncated (fetch it again; `ds4-server pull --verify` checks a pulled model)"
    )]
    DataSectionMissing {
        file: String,
        data_start: u64,
        len: u64,
    },
    /// A metadata key that a typed getter asked for is absent.
    #[error("{file}: metadata key '{key}' is missing")]
    MissingKey { file: String, key: String },
    /// A metadata value of another type (or out of range) than a typed getter asked for.
    #[error("{file}: metadata key '{key}' is {found}, expected {expected}")]
    WrongType {
        file: String,
        key: String,
        expected: String,
        found: String,
    },
    /// A tensor name that is not in the directory.
    #[error("{file}: tensor '{tensor}' not found")]
    MissingTensor { file: String, tensor: String },
    /// A typed view asked for an element type that does not match the tensor's type.
    #[error("{file}: tensor '{tensor}' is {dtype}, cannot view it as {requested}")]
    TensorTypeMismatch {
        file: String,
        tensor: String,
        dtype: GgmlType,
        requested: GgmlType,
    },
    /// A typed view whose bytes are not aligned for the element type (alignment below 8).
    #[error("{file}: tensor '{tensor}': data is not aligned for a view as {requested}")]
    TensorDataMisaligned {
        file: String,
        tensor: String,
        requested: GgmlType,
    },
    /// The writer was given an array whose elements differ in type.
    #[error("{file}: metadata key '{key}': array mixes {first} and {other} elements")]
    MixedArray {
        file: String,
        key: String,
        first: &'static str,
        other: &'static str,
    },
    /// The writer was given tensor data whose length does not match the dims and type.
    #[error("{file}: tensor '{tensor}': data is {got} bytes, its dims and type need {expected}")]
    TensorDataSize {
        file: String,
        tensor: String,
        expected: u64,
        got: u64,
    },
}

/// Longest name (in chars) that an error message repeats from a file.
const CLIP_CHARS: usize = 200;

/// A name from a file, clipped for an error message.
pub(crate) fn clip(name: &str) -> String {
    match name.char_indices().nth(CLIP_CHARS) {
        None => name.to_owned(),
        Some((at, _)) => format!("{}…", &name[..at]),
    }
}
