//! [`GgufWriter`]: builds a GGUF v3 file (little-endian) with the layout that
//! [`crate::reader`] describes.
//!
//! Metadata is written in insertion order. Tensors are written in insertion order, each at
//! an offset that is a multiple of the alignment (`general.alignment`, default 32), with zero
//! padding after the tensor infos and after every tensor's data; this is the layout gguf-py
//! and llama.cpp write, so llama.cpp's stricter offset check holds too. Everything the
//! reader rejects is rejected here when it is added, so a written file always reads back.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use crate::error::clip;
use crate::reader::{MAGIC, MAX_ARRAY_NESTING, MAX_METADATA_VALUES, alignment, shape_error};
use crate::tensor::{MAX_TENSOR_NAME_LEN, checked_n_bytes};
use crate::{GgmlType, GgufError, Metadata, TensorInfo, Value, ValueType};

/// Names the writer in errors about what was added to it.
const LABEL: &str = "<writer>";

/// The version written.
const VERSION: u32 = 3;

/// Builds a GGUF v3 file: metadata in insertion order, tensors aligned to `alignment`.
#[derive(Debug, Default, Clone)]
pub struct GgufWriter {
    metadata: Metadata,
    /// Array elements in `metadata`, bounded like the reader's count.
    n_values: u64,
    tensors: Vec<(TensorInfo, Vec<u8>)>,
    tensor_names: HashSet<String>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> Self {
        Self::default()
    }

    /// The metadata added so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The alignment that will be used (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        // Validated when set, so the default only stands for an absent key.
        alignment(&self.metadata, LABEL).unwrap_or(crate::DEFAULT_ALIGNMENT.into())
    }

    /// Sets `general.alignment` (a power of two).
    ///
    /// Errors: [`GgufError::BadAlignment`].
    pub fn set_alignment(&mut self, alignment: u32) -> Result<(), GgufError> {
        self.set_metadata("general.alignment", Value::U32(alignment))
            .map(drop)
    }

    /// Appends metadata `key`.
    ///
    /// Errors: [`GgufError::DuplicateKey`], and those of [`GgufWriter::set_metadata`].
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        let key = key.into();
        if self.metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                file: LABEL.to_owned(),
                key: clip(&key),
            });
        }
        self.set_metadata(key, value).map(drop)
    }

    /// Sets metadata `key`, replacing an existing value in place (its position is kept) and
    /// returning it.
    ///
    /// Errors: [`GgufError::MixedArray`] for an array whose elements differ in type,
    /// [`GgufError::NestingTooDeep`], [`GgufError::MetadataTooLarge`], and
    /// [`GgufError::BadAlignment`] for a `general.alignment` that is not a `u32` power of two.
    pub fn set_metadata(
        &mut self,
        key: impl Into<String>,
        value: Value,
    ) -> Result<Option<Value>, GgufError> {
        let key = key.into();
        let added = check_value(&key, &value, 0)?;
        if key == "general.alignment" {
            let mut probe = Metadata::new();
            probe.insert(key.clone(), value.clone());
            alignment(&probe, LABEL)?;
        }
        let removed = self.metadata.get(&key).map_or(0, count_elements);
        let total = self.n_values - removed + added;
        if total > MAX_METADATA_VALUES {
            return Err(GgufError::MetadataTooLarge {
                file: LABEL.to_owned(),
                key: clip(&key),
                max: MAX_METADATA_VALUES,
            });
        }
        self.n_values = total;
        Ok(self.metadata.insert(key, value))
    }

    /// Appends a tensor: `dims` in ggml order (`dims[0]` is the row length), `data` exactly
    /// the tensor's bytes in `dtype`'s layout.
    ///
    /// Errors: [`GgufError::NameTooLong`], [`GgufError::DuplicateTensor`],
    /// [`GgufError::TooManyDims`], [`GgufError::DimsOverflow`],
    /// [`GgufError::RowNotBlockMultiple`], [`GgufError::TensorDataSize`].
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        dtype: GgmlType,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        if name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::NameTooLong {
                file: LABEL.to_owned(),
                tensor: clip(&name),
                len: name.len() as u64,
                max: MAX_TENSOR_NAME_LEN,
            });
        }
        if self.tensor_names.contains(&name) {
            return Err(GgufError::DuplicateTensor {
                file: LABEL.to_owned(),
                tensor: clip(&name),
            });
        }
        let size =
            checked_n_bytes(dims, dtype).map_err(|e| shape_error(e, LABEL, &name, dims, dtype))?;
        let data = data.into();
        if data.len() as u64 != size {
            return Err(GgufError::TensorDataSize {
                file: LABEL.to_owned(),
                tensor: clip(&name),
                expected: size,
                got: data.len() as u64,
            });
        }
        self.tensor_names.insert(name.clone());
        let info = TensorInfo {
            name,
            dims: dims.to_vec(),
            dtype,
            offset: 0,
        };
        self.tensors.push((info, data));
        Ok(())
    }

    /// The tensor directory as it will be written, with offsets at the current alignment.
    pub fn tensor_infos(&self) -> Vec<TensorInfo> {
        let alignment = self.alignment();
        let mut offset = 0u64;
        self.tensors
            .iter()
            .map(|(info, data)| {
                let placed = TensorInfo {
                    offset,
                    ..info.clone()
                };
                offset += (data.len() as u64).next_multiple_of(alignment);
                placed
            })
            .collect()
    }

    /// Writes the file to `out`; returns the number of bytes written.
    ///
    /// Errors: [`GgufError::Io`] from `out` (named `<writer>`).
    pub fn write_to<W: Write>(&self, out: W) -> Result<u64, GgufError> {
        self.write_labelled(out, LABEL)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write_to(&mut out);
        out
    }

    /// Writes the file to `path` (created or truncated).
    ///
    /// Errors: [`GgufError::Io`] naming `path`.
    pub fn write_file(&self, path: &Path) -> Result<(), GgufError> {
        let label = path.display().to_string();
        let io = |error| GgufError::Io {
            file: label.clone(),
            error,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut buffered = std::io::BufWriter::new(file);
        self.write_labelled(&mut buffered, &label)?;
        buffered.flush().map_err(io)?;
        buffered.get_ref().sync_all().map_err(io)
    }

    fn write_labelled<W: Write>(&self, out: W, label: &str) -> Result<u64, GgufError> {
        let mut out = Out {
            inner: out,
            written: 0,
        };
        self.write_all(&mut out).map_err(|error| GgufError::Io {
            file: label.to_owned(),
            error,
        })?;
        Ok(out.written)
    }

    fn write_all<W: Write>(&self, out: &mut Out<W>) -> std::io::Result<()> {
        let alignment = self.alignment();
        out.bytes(MAGIC)?;
        out.bytes(&VERSION.to_le_bytes())?;
        out.bytes(&(self.tensors.len() as u64).to_le_bytes())?;
        out.bytes(&(self.metadata.len() as u64).to_le_bytes())?;
        for (key, value) in &self.metadata {
            out.string(key)?;
            out.bytes(&value.value_type().id().to_le_bytes())?;
            out.value(value)?;
        }
        for info in self.tensor_infos() {
            out.string(&info.name)?;
            out.bytes(&(info.dims.len() as u32).to_le_bytes())?;
            for d in &info.dims {
                out.bytes(&d.to_le_bytes())?;
            }
            out.bytes(&(info.dtype as u32).to_le_bytes())?;
            out.bytes(&info.offset.to_le_bytes())?;
        }
        out.pad(alignment)?;
        for (_, data) in &self.tensors {
            out.bytes(data)?;
            out.pad(alignment)?;
        }
        Ok(())
    }
}

/// Checks that arrays in `value` are homogeneous and nested at most [`MAX_ARRAY_NESTING`]
/// deep (`value` itself being `depth` arrays deep); returns its array element count.
fn check_value(key: &str, value: &Value, depth: usize) -> Result<u64, GgufError> {
    let Value::Array(items) = value else {
        return Ok(0);
    };
    if depth >= MAX_ARRAY_NESTING {
        return Err(GgufError::NestingTooDeep {
            file: LABEL.to_owned(),
            key: clip(key),
            max: MAX_ARRAY_NESTING,
        });
    }
    let mut count = items.len() as u64;
    if let Some(first) = items.first() {
        let ty = first.value_type();
        for item in items {
            if item.value_type() != ty {
                return Err(GgufError::MixedArray {
                    file: LABEL.to_owned(),
                    key: clip(key),
                    first: ty.name(),
                    other: item.value_type().name(),
                });
            }
            count += check_value(key, item, depth + 1)?;
        }
    }
    Ok(count)
}

/// Array elements in `value` (nested arrays included), as the reader counts them.
fn count_elements(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items.len() as u64 + items.iter().map(count_elements).sum::<u64>(),
        _ => 0,
    }
}

/// A writer that counts its bytes, for padding.
struct Out<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Out<W> {
    fn bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Zero bytes up to the next multiple of `alignment`.
    fn pad(&mut self, alignment: u64) -> std::io::Result<()> {
        const ZEROS: [u8; 256] = [0; 256];
        let mut left = self.written.next_multiple_of(alignment) - self.written;
        while left > 0 {
            let n = left.min(ZEROS.len() as u64);
            self.bytes(&ZEROS[..n as usize])?;
            left -= n;
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> std::io::Result<()> {
        self.bytes(&(s.len() as u64).to_le_bytes())?;
        self.bytes(s.as_bytes())
    }

    /// A value without its type tag; arrays as element type, count and elements (an empty
    /// array as an array of `u8`).
    fn value(&mut self, value: &Value) -> std::io::Result<()> {
        match value {
            Value::U8(v) => self.bytes(&v.to_le_bytes()),
            Value::I8(v) => self.bytes(&v.to_le_bytes()),
            Value::U16(v) => self.bytes(&v.to_le_bytes()),
            Value::I16(v) => self.bytes(&v.to_le_bytes()),
            Value::U32(v) => self.bytes(&v.to_le_bytes()),
            Value::I32(v) => self.bytes(&v.to_le_bytes()),
            Value::U64(v) => self.bytes(&v.to_le_bytes()),
            Value::I64(v) => self.bytes(&v.to_le_bytes()),
            Value::F32(v) => self.bytes(&v.to_le_bytes()),
            Value::F64(v) => self.bytes(&v.to_le_bytes()),
            Value::Bool(v) => self.bytes(&[u8::from(*v)]),
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                let elem = items.first().map_or(ValueType::U8, Value::value_type);
                self.bytes(&elem.id().to_le_bytes())?;
                self.bytes(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|item| self.value(item))
            }
        }
    }
}
