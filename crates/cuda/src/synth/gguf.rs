//! GGUF files of synthetic models: the full file ([`write_gguf`], weights generated on
//! the host one tensor at a time) and the header file of the GPU path ([`header_file`]:
//! the same file with only the tensors the host generates, the rest a sparse hole).

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use ds4_gguf::{GgufFile, GgufWriter, TensorInfo};

use super::{Spec, Tensor, generate, on_host};
use crate::error::{CudaError, Result};

/// Keeps the first `keep` bytes written and counts the rest without reading them.
struct Prefix {
    keep: usize,
    bytes: Vec<u8>,
}

impl Write for Prefix {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.keep.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&buf[..room.min(buf.len())]);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The layout of `spec`'s file: its header (everything before the data section), the
/// total length, and each tensor with its directory entry (offsets from the data
/// section).
struct Layout {
    header: Vec<u8>,
    total: u64,
    tensors: Vec<(Tensor, TensorInfo)>,
}

fn layout(spec: &Spec) -> Result<Layout> {
    let mut w = GgufWriter::new();
    for (k, v) in spec.metadata() {
        w.add_metadata(k, v)?;
    }
    let tensors = spec.tensors();
    for t in &tensors {
        // Zeroed vectors are lazily mapped pages: nothing is touched or written.
        w.add_tensor(&t.name, &t.dims, t.ty, vec![0u8; t.n_bytes() as usize])?;
    }
    let infos = w.tensor_infos();
    let align = w.alignment();
    let data_len = infos.last().map_or(0, |t| {
        t.offset + t.try_n_bytes().unwrap_or(0).next_multiple_of(align)
    });
    let total = w.write_to(Prefix {
        keep: 0,
        bytes: Vec::new(),
    })?;
    let mut header = Prefix {
        keep: (total - data_len) as usize,
        bytes: Vec::new(),
    };
    w.write_to(&mut header)?;
    Ok(Layout {
        header: header.bytes,
        total,
        tensors: tensors.into_iter().zip(infos).collect(),
    })
}

/// The bytes of `spec`'s GGUF file before its data section: metadata and tensor
/// directory, zero-padded to the alignment.
pub fn header_bytes(spec: &Spec) -> Result<Vec<u8>> {
    Ok(layout(spec)?.header)
}

/// Writes `spec`'s file at `path` with the tensors `keep` selects generated (the others
/// a sparse hole, reading as zeros).
fn write(spec: &Spec, path: &Path, keep: impl Fn(&Tensor) -> bool) -> Result<()> {
    let io = |e| CudaError::Io {
        path: path.display().to_string(),
        source: e,
    };
    let l = layout(spec)?;
    let f = std::fs::File::create(path).map_err(io)?;
    f.write_all_at(&l.header, 0).map_err(io)?;
    let data = l.header.len() as u64;
    for (t, info) in l.tensors.iter().filter(|(t, _)| keep(t)) {
        let bytes = generate::tensor_bytes(spec.seed, t);
        f.write_all_at(&bytes, data + info.offset).map_err(io)?;
    }
    f.set_len(l.total).map_err(io)?;
    f.sync_all().map_err(io)
}

/// Writes `spec` as a GGUF file at `path`, one tensor in memory at a time (the same
/// bytes [`crate::CudaBackend::synthetic`] builds on the GPU).
pub fn write_gguf(spec: &Spec, path: &Path) -> Result<()> {
    write(spec, path, |_| true)
}

/// The GGUF of `spec` with the tensors the host generates ([`on_host`]) and the others
/// a sparse hole reading as zeros, as a temporary file (removed once mapped). For
/// [`crate::CudaBackend::synthetic`], which reads the former from it and generates the
/// latter on the device.
pub fn header_file(spec: &Spec) -> Result<GgufFile> {
    let path = std::env::temp_dir().join(format!(
        "ds4-synth-{}-{}.gguf",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let written = write(spec, &path, |t| on_host(t.ty, t.n_elements()));
    let file = written.and_then(|()| GgufFile::open(&path).map_err(CudaError::from));
    let _ = std::fs::remove_file(&path);
    file
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_file_matches_the_full_file() {
        let dir = std::env::temp_dir().join(format!("ds4-cuda-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["small-llama:q4_k", "tiny-glm5:q2"] {
            let spec = Spec::parse(name).unwrap();
            let full_path = dir.join("full.gguf");
            write_gguf(&spec, &full_path).unwrap();
            let full = GgufFile::open(&full_path).unwrap();
            let head = header_file(&spec).unwrap();
            assert_eq!(full.tensors(), head.tensors());
            assert_eq!(full.metadata(), head.metadata());
            assert_eq!(full.data_offset(), head.data_offset());
            assert_eq!(full.as_bytes().len(), head.as_bytes().len());
            let n = full.data_offset() as usize;
            assert_eq!(full.as_bytes()[..n], head.as_bytes()[..n]);
            assert_eq!(header_bytes(&spec).unwrap(), full.as_bytes()[..n]);
            // In-header tensors hold the full file's bytes; the rest reads as zeros.
            let mut in_header = [0, 0];
            for t in full.tensors() {
                let (a, b) = (full.tensor_data(t), head.tensor_data(t));
                if on_host(t.dtype, t.n_elements()) {
                    assert_eq!(a, b, "{name}: {}", t.name);
                    in_header[0] += 1;
                } else {
                    assert!(b.iter().all(|&x| x == 0), "{name}: {}", t.name);
                    in_header[1] += 1;
                }
            }
            // small-llama's embedding and FFN matrices are generated on the device.
            assert!(in_header[0] > 0, "{name}");
            assert_eq!(in_header[1] > 0, name.starts_with("small"), "{name}");
            // The full file's tensors are the generator's.
            for t in spec.tensors() {
                let info = full.tensor(&t.name).unwrap();
                assert_eq!(
                    full.tensor_data(info),
                    &generate::tensor_bytes(spec.seed, &t)[..],
                    "{name}: {}",
                    t.name
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
