//! GGUF parsing and validation over a byte slice (the mapped file).
//!
//! Layout (ggml `docs/gguf.md`, little-endian): magic `GGUF`, `u32` version, `u64` tensor
//! count, `u64` metadata count; the metadata entries (string key, `u32` value type, value);
//! the tensor infos (string name, `u32` n_dims, `u64` dims, `u32` ggml type, `u64` offset
//! relative to the data section); zero padding up to `general.alignment` (default 32); the
//! data section. A string is a `u64` byte length and UTF-8 bytes without a terminator; an
//! array is a `u32` element type, a `u64` count and the elements. Version 2 has the same
//! layout as version 3 for little-endian files, so both are read.
//!
//! Robustness: every read is bounds-checked; every count is checked against the bytes left
//! (each item takes at least a known number of bytes) before anything is allocated for it;
//! array nesting and the total number of metadata values are bounded. A corrupted file
//! therefore gives a [`GgufError`], never a panic or an allocation out of proportion to it.
//! Tensor offsets must be aligned, in bounds and non-overlapping, but may come in any order
//! (llama.cpp additionally requires directory order).

use std::collections::HashMap;

use crate::error::clip;
use crate::tensor::{MAX_DIMS, MAX_TENSOR_NAME_LEN, ShapeError, checked_n_bytes};
use crate::{GgmlType, GgufError, Metadata, TensorInfo, Value, ValueType};

/// The four bytes a GGUF file starts with.
pub(crate) const MAGIC: &[u8; 4] = b"GGUF";

/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;

/// Deepest array nesting read or written (an array of arrays is 2 levels).
pub const MAX_ARRAY_NESTING: usize = 16;

/// Most metadata values (every array element counts) in one file: 2^24, about 16 times the
/// largest vocabulary metadata in use (tokens, merges, scores and types of a 256k vocab).
pub const MAX_METADATA_VALUES: u64 = 1 << 24;

/// Largest number of items reserved ahead of parsing them.
const PREALLOC_CAP: usize = 1 << 20;

/// Fewest bytes of one metadata entry: key length, value type, a one-byte value.
const MIN_KV_LEN: u64 = 8 + 4 + 1;

/// Fewest bytes of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_LEN: u64 = 8 + 4 + 4 + 8;

/// The parsed and validated structure of a GGUF file.
#[derive(Debug)]
pub(crate) struct Layout {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_start: u64,
}

/// Parses and validates `bytes`; `file` names the file in errors.
pub(crate) fn parse(bytes: &[u8], file: &str) -> Result<Layout, GgufError> {
    let mut cur = Cursor {
        buf: bytes,
        pos: 0,
        file,
    };

    let magic = cur.take(4, &|| "the magic".to_owned())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            file: file.to_owned(),
            found: magic.escape_ascii().to_string(),
        });
    }
    let version = cur.u32(&|| "the version".to_owned())?;
    match version {
        2 | 3 => {}
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(GgufError::BigEndian {
                file: file.to_owned(),
                version: v.swap_bytes(),
            });
        }
        v => {
            return Err(GgufError::UnsupportedVersion {
                file: file.to_owned(),
                version: v,
            });
        }
    }
    let n_tensors = cur.u64(&|| "the tensor count".to_owned())?;
    let n_kv = cur.u64(&|| "the metadata count".to_owned())?;

    // The counts were read at bytes 8 and 16.
    let n_kv = cur.check_count(n_kv, 16, MIN_KV_LEN, &|| "the metadata count".to_owned())?;
    let mut metadata = Metadata::new();
    let mut budget = MAX_METADATA_VALUES;
    for i in 0..n_kv {
        let key = cur.string(&|| format!("the key of metadata entry #{i}"))?;
        let type_at = cur.pos;
        let type_id = cur.u32(&|| format!("the value type of '{}'", clip(key)))?;
        let ty = value_type(type_id, key, type_at, file)?;
        let value = cur.value(ty, key, 0, &mut budget)?;
        metadata
            .push_new(key, value)
            .map_err(|_| GgufError::DuplicateKey {
                file: file.to_owned(),
                key: clip(key),
            })?;
    }
    let alignment = alignment(&metadata, file)?;

    let n_tensors = cur.check_count(n_tensors, 8, MIN_TENSOR_INFO_LEN, &|| {
        "the tensor count".to_owned()
    })?;
    let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC_CAP));
    let mut sizes = Vec::with_capacity(n_tensors.min(PREALLOC_CAP));
    let mut tensor_index = HashMap::with_capacity(n_tensors.min(PREALLOC_CAP));
    for i in 0..n_tensors {
        let (info, size) = cur.tensor_info(i)?;
        if tensor_index.insert(info.name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor {
                file: file.to_owned(),
                tensor: clip(&info.name),
            });
        }
        tensors.push(info);
        sizes.push(size);
    }

    let len = bytes.len() as u64;
    let data_start = (cur.pos as u64).next_multiple_of(alignment);
    if !tensors.is_empty() && data_start > len {
        return Err(GgufError::DataSectionMissing {
            file: file.to_owned(),
            data_start,
            len,
        });
    }
    check_placement(
        &tensors,
        &sizes,
        alignment,
        len.saturating_sub(data_start),
        file,
    )?;

    Ok(Layout {
        version,
        metadata,
        tensors,
        tensor_index,
        alignment,
        data_start,
    })
}

/// The value type with id `type_id`, read at byte `at` for `key`.
fn value_type(type_id: u32, key: &str, at: usize, file: &str) -> Result<ValueType, GgufError> {
    ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        file: file.to_owned(),
        key: clip(key),
        type_id,
        offset: at as u64,
    })
}

/// `general.alignment`: a `u32` power of two, [`DEFAULT_ALIGNMENT`] when absent.
pub(crate) fn alignment(metadata: &Metadata, file: &str) -> Result<u64, GgufError> {
    let problem = match metadata.get("general.alignment") {
        None => return Ok(DEFAULT_ALIGNMENT.into()),
        Some(Value::U32(a)) if a.is_power_of_two() => return Ok((*a).into()),
        Some(Value::U32(a)) => format!("{a} is not a power of two"),
        Some(other) => format!("is {}, expected a u32", other.describe()),
    };
    Err(GgufError::BadAlignment {
        file: file.to_owned(),
        problem,
    })
}

/// Checks that every tensor is aligned, inside the data section (`data_len` bytes) and
/// disjoint from the others (tensors of zero bytes overlap nothing).
fn check_placement(
    tensors: &[TensorInfo],
    sizes: &[u64],
    alignment: u64,
    data_len: u64,
    file: &str,
) -> Result<(), GgufError> {
    for (t, &size) in tensors.iter().zip(sizes) {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedOffset {
                file: file.to_owned(),
                tensor: clip(&t.name),
                offset: t.offset,
                alignment,
            });
        }
        if t.offset.checked_add(size).is_none_or(|end| end > data_len) {
            return Err(GgufError::OffsetOutOfRange {
                file: file.to_owned(),
                tensor: clip(&t.name),
                offset: t.offset,
                size,
                data_len,
            });
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).filter(|&i| sizes[i] > 0).collect();
    order.sort_unstable_by_key(|&i| tensors[i].offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // In bounds was checked above, so the sum cannot overflow.
        if tensors[a].offset + sizes[a] > tensors[b].offset {
            return Err(GgufError::OverlappingTensors {
                file: file.to_owned(),
                first: clip(&tensors[a].name),
                second: clip(&tensors[b].name),
            });
        }
    }
    Ok(())
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

/// Describes the field being read, for errors only (called on the error path).
type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// The next `n` bytes.
    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                file: self.file.to_owned(),
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let (start, end) = (self.pos, self.pos + n as usize);
        self.pos = end;
        Ok(&self.buf[start..end])
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: What) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: `u64` length, then UTF-8 bytes.
    fn string(&mut self, what: What) -> Result<&'a str, GgufError> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let start = self.pos;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            file: self.file.to_owned(),
            what: what(),
            offset: start as u64,
        })
    }

    /// Checks a count (read at byte `at`) against the bytes left, given that each item takes
    /// at least `min_len` bytes.
    fn check_count(
        &self,
        count: u64,
        at: usize,
        min_len: u64,
        what: What,
    ) -> Result<usize, GgufError> {
        let max = self.remaining() / min_len;
        if count > max {
            return Err(GgufError::CountTooLarge {
                file: self.file.to_owned(),
                what: what(),
                count,
                offset: at as u64,
                remaining: self.remaining(),
                max,
            });
        }
        // count <= remaining bytes, which fit in usize.
        Ok(count as usize)
    }

    /// A value of type `ty` for `key`, `depth` arrays deep; `budget` is the number of
    /// metadata values still allowed.
    fn value(
        &mut self,
        ty: ValueType,
        key: &str,
        depth: usize,
        budget: &mut u64,
    ) -> Result<Value, GgufError> {
        let what = || format!("the value of '{}'", clip(key));
        let what: What = &what;
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(what)?),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(self.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(self.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => {
                let at = self.pos as u64;
                match self.u8(what)? {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    byte => {
                        return Err(GgufError::InvalidBool {
                            file: self.file.to_owned(),
                            key: clip(key),
                            byte,
                            offset: at,
                        });
                    }
                }
            }
            ValueType::String => Value::String(self.string(what)?.to_owned()),
            ValueType::Array => Value::Array(self.array_value(key, depth, budget)?),
        })
    }

    /// The elements of an array value (after its value type).
    fn array_value(
        &mut self,
        key: &str,
        depth: usize,
        budget: &mut u64,
    ) -> Result<Vec<Value>, GgufError> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                file: self.file.to_owned(),
                key: clip(key),
                max: MAX_ARRAY_NESTING,
            });
        }
        let type_at = self.pos;
        let type_id = self.u32(&|| format!("the element type of array '{}'", clip(key)))?;
        let elem = value_type(type_id, key, type_at, self.file)?;
        let what = || format!("the length of array '{}'", clip(key));
        let count_at = self.pos;
        let count = self.u64(&what)?;
        let count = self.check_count(count, count_at, elem.min_encoded_len(), &what)?;
        *budget = budget
            .checked_sub(count as u64)
            .ok_or_else(|| GgufError::MetadataTooLarge {
                file: self.file.to_owned(),
                key: clip(key),
                max: MAX_METADATA_VALUES,
            })?;
        let mut items = Vec::with_capacity(count.min(PREALLOC_CAP));
        for _ in 0..count {
            items.push(self.value(elem, key, depth + 1, budget)?);
        }
        Ok(items)
    }

    /// Tensor info #`i` and its byte size (shape validated; placement is checked later).
    fn tensor_info(&mut self, i: usize) -> Result<(TensorInfo, u64), GgufError> {
        let file = self.file;
        let name = self.string(&|| format!("the name of tensor #{i}"))?;
        if name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::NameTooLong {
                file: file.to_owned(),
                tensor: clip(name),
                len: name.len() as u64,
                max: MAX_TENSOR_NAME_LEN,
            });
        }
        let n_dims = self.u32(&|| format!("the dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                file: file.to_owned(),
                tensor: name.to_owned(),
                n_dims: n_dims.into(),
                max: MAX_DIMS,
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(&|| format!("dimension {d} of tensor '{name}'"))?);
        }
        let type_id = self.u32(&|| format!("the type of tensor '{name}'"))?;
        let dtype = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            file: file.to_owned(),
            tensor: name.to_owned(),
            type_id,
        })?;
        let offset = self.u64(&|| format!("the offset of tensor '{name}'"))?;
        let size =
            checked_n_bytes(&dims, dtype).map_err(|e| shape_error(e, file, name, &dims, dtype))?;
        let info = TensorInfo {
            name: name.to_owned(),
            dims,
            dtype,
            offset,
        };
        Ok((info, size))
    }
}

/// The [`GgufError`] for a [`ShapeError`] of tensor `name` in `file`.
pub(crate) fn shape_error(
    e: ShapeError,
    file: &str,
    name: &str,
    dims: &[u64],
    dtype: GgmlType,
) -> GgufError {
    let (file, tensor) = (file.to_owned(), clip(name));
    match e {
        ShapeError::TooManyDims => GgufError::TooManyDims {
            file,
            tensor,
            n_dims: dims.len() as u64,
            max: MAX_DIMS,
        },
        ShapeError::Overflow => GgufError::DimsOverflow {
            file,
            tensor,
            dims: dims.to_vec(),
        },
        ShapeError::RowNotBlockMultiple => GgufError::RowNotBlockMultiple {
            file,
            tensor,
            row: dims.first().copied().unwrap_or(1),
            dtype,
            block: dtype.block_size(),
        },
    }
}
