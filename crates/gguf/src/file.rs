//! [`GgufFile`]: an open, validated GGUF file over a memory map (or owned bytes), with typed
//! metadata getters and tensor data access without copying.

use std::fmt;
use std::ops::Range;
use std::path::Path;

use memmap2::Mmap;

use crate::error::clip;
use crate::reader::{Layout, parse};
use crate::view::TensorElement;
use crate::{FromValue, GgufError, Metadata, TensorInfo, Value};

/// An open GGUF file (memory-mapped, or owned bytes for tests).
///
/// Opening parses the header, metadata and tensor directory and validates every tensor's
/// placement; tensor data stays in the map and is only read when used. `Send + Sync`.
pub struct GgufFile {
    label: String,
    bytes: Bytes,
    layout: Layout,
}

/// The file's bytes.
enum Bytes {
    Mapped(Mmap),
    /// Held as `u64` words so that the data section is 8-byte aligned, as in a map.
    Owned {
        words: Vec<u64>,
        len: usize,
    },
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }

    fn owned(bytes: &[u8]) -> Self {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Bytes::Owned {
            words,
            len: bytes.len(),
        }
    }
}

impl GgufFile {
    /// Opens and validates a GGUF file (version 3, or 2) over mmap.
    ///
    /// The map is read-only. As with any memory-mapped loader, the file must not be truncated
    /// or rewritten while open (the reads would then see the new bytes or fault).
    ///
    /// Errors: [`GgufError::Io`] if the file cannot be opened or mapped, and every format
    /// error of [`GgufFile::from_bytes`].
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let label = path.display().to_string();
        let _span = tracing::debug_span!("gguf_open", file = %label).entered();
        let io = |error| GgufError::Io {
            file: label.clone(),
            error,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "is a directory, not a GGUF file",
            )));
        }
        let len = meta.len();
        let bytes = if len == 0 {
            Bytes::owned(&[])
        } else {
            // SAFETY: a read-only private map of a file we opened; the only hazard is another
            // process changing the file underneath, documented above.
            Bytes::Mapped(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        let layout = parse(bytes.as_slice(), &label)?;
        tracing::debug!(
            tensors = layout.tensors.len(),
            metadata = layout.metadata.len(),
            "gguf opened"
        );
        Ok(Self {
            label,
            bytes,
            layout,
        })
    }

    /// Parses and validates GGUF bytes held in memory (named `<memory>` in errors). The bytes
    /// are copied once into 8-byte-aligned storage.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let label = "<memory>".to_owned();
        let bytes = Bytes::owned(&bytes);
        let layout = parse(bytes.as_slice(), &label)?;
        Ok(Self {
            label,
            bytes,
            layout,
        })
    }

    /// The path the file was opened from (`<memory>` for [`GgufFile::from_bytes`]).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The GGUF version (3, or 2).
    pub fn version(&self) -> u32 {
        self.layout.version
    }

    /// The alignment of the data section and tensor offsets in bytes (`general.alignment`,
    /// default 32).
    pub fn alignment(&self) -> u64 {
        self.layout.alignment
    }

    /// Absolute byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.layout.data_start
    }

    /// The whole file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.layout.metadata
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.layout.metadata.get(key)
    }

    /// The value of metadata `key` as `T` (see [`FromValue`] for what converts).
    ///
    /// Errors: [`GgufError::MissingKey`], [`GgufError::WrongType`].
    pub fn get_as<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<T, GgufError> {
        self.get_opt(key)?.ok_or_else(|| GgufError::MissingKey {
            file: self.label.clone(),
            key: clip(key),
        })
    }

    /// Like [`GgufFile::get_as`], but `Ok(None)` for a missing key.
    ///
    /// Errors: [`GgufError::WrongType`].
    pub fn get_opt<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<Option<T>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        T::from_value(value)
            .map(Some)
            .ok_or_else(|| GgufError::WrongType {
                file: self.label.clone(),
                key: clip(key),
                expected: T::expected(),
                found: value.describe(),
            })
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.get_as(key)
    }

    /// An integer value that fits `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_as(key)
    }

    /// An integer value that fits `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_as(key)
    }

    /// An integer value that fits `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        self.get_as(key)
    }

    /// An `f32` value.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.get_as(key)
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.get_as(key)
    }

    /// An array's elements.
    pub fn get_arr(&self, key: &str) -> Result<&[Value], GgufError> {
        self.get_as(key)
    }

    /// An array of strings.
    pub fn get_arr_str(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_as(key)
    }

    /// `general.architecture` (`llama`, `qwen2`, …).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// The tensor directory in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.layout.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = *self.layout.tensor_index.get(name)?;
        Some(&self.layout.tensors[i])
    }

    /// The tensor named `name`, or [`GgufError::MissingTensor`].
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            file: self.label.clone(),
            tensor: clip(name),
        })
    }

    /// Byte range of `info`'s data in the file, if it is in bounds.
    fn data_range(&self, info: &TensorInfo) -> Option<Range<usize>> {
        let start = self.layout.data_start.checked_add(info.offset)?;
        let end = start.checked_add(info.try_n_bytes()?)?;
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        (range.end <= self.as_bytes().len()).then_some(range)
    }

    /// The raw bytes of a tensor (`info.n_bytes()` bytes, validated in bounds at open).
    ///
    /// For a `TensorInfo` that is not from this file and lies out of bounds, returns an empty
    /// slice.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        self.data_range(info)
            .map_or(&[][..], |range| &self.as_bytes()[range])
    }

    /// A tensor's data as a slice of `T` (`info.n_elements()` long), without copying.
    ///
    /// Errors: [`GgufError::TensorTypeMismatch`] if `info.dtype` is not `T::DTYPE`;
    /// [`GgufError::TensorDataMisaligned`] if the bytes are not aligned for `T` (only possible
    /// with a `general.alignment` below `align_of::<T>()`); [`GgufError::OffsetOutOfRange`]
    /// for a `TensorInfo` out of this file's bounds.
    pub fn tensor_as<T: TensorElement>(&self, info: &TensorInfo) -> Result<&[T], GgufError> {
        if info.dtype != T::DTYPE {
            return Err(GgufError::TensorTypeMismatch {
                file: self.label.clone(),
                tensor: clip(&info.name),
                dtype: info.dtype,
                requested: T::DTYPE,
            });
        }
        let range = self
            .data_range(info)
            .ok_or_else(|| GgufError::OffsetOutOfRange {
                file: self.label.clone(),
                tensor: clip(&info.name),
                offset: info.offset,
                size: info.n_bytes(),
                data_len: (self.as_bytes().len() as u64).saturating_sub(self.layout.data_start),
            })?;
        bytemuck::try_cast_slice(&self.as_bytes()[range]).map_err(|_| {
            GgufError::TensorDataMisaligned {
                file: self.label.clone(),
                tensor: clip(&info.name),
                requested: T::DTYPE,
            }
        })
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("label", &self.label)
            .field("version", &self.layout.version)
            .field("len", &self.as_bytes().len())
            .field("metadata", &self.layout.metadata.len())
            .field("tensors", &self.layout.tensors.len())
            .field("alignment", &self.layout.alignment)
            .finish()
    }
}
