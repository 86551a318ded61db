//! A `deepseek4` sequence state on disk: a versioned little-endian file holding
//! everything [`DeepSeek4Cache`] holds (sliding-window and compressor rings, compressed
//! entries, prefill-end anchors), so a restored cache continues and rewinds exactly as
//! the saved one would. Buffers are read from and written to the backend.
//!
//! Layout, version 1:
//!
//! ```text
//! b"DS4DSV4S"  u32 version=1  u64 model fingerprint
//! u64 len  u64 n_ctx  u64 high  u64 rewind window R  u32 n_layers
//! per layer: u8 kind (0 sliding, 1 CSA, 2 HCA), u64 rate
//!   f32 arrays: the rings whole (window, then kv and gate of the compressor and of the
//!   indexer when present), then the entries of the compressor and the indexer
//!   (len / rate rows each)
//! u32 n_anchors; per anchor: u64 high, u64 end, per layer its rings as above
//! f32 array = u64 count, then count × f32
//! ```

use std::io::{Read, Write};
use std::path::Path;

use super::DeepSeek4;
use super::config::AttnKind;
use super::state::{DEFAULT_ANCHORS, DeepSeek4Cache};
use crate::EngineError;
use crate::backend::Backend;

const MAGIC: &[u8; 8] = b"DS4DSV4S";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;

/// Errors reading or writing a state file.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("state file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a deepseek4 state file (bad magic)")]
    BadMagic { path: String },
    #[error(
        "{path}: state file version {found} is not supported (this build reads version {VERSION})"
    )]
    Version { path: String, found: u32 },
    #[error("{path}: the state belongs to another model ({detail})")]
    Mismatch { path: String, detail: String },
    #[error("{path}: {source}")]
    Engine { path: String, source: EngineError },
}

fn kind_tag(k: AttnKind) -> (u8, u64) {
    match k {
        AttnKind::Sliding => (0, 0),
        AttnKind::Csa { rate } => (1, rate as u64),
        AttnKind::Hca { rate } => (2, rate as u64),
    }
}

fn put_arr<T: Write>(w: &mut T, v: &[f32]) -> std::io::Result<()> {
    w.write_all(&(v.len() as u64).to_le_bytes())?;
    let mut buf = Vec::with_capacity(v.len() * 4);
    for x in v {
        buf.extend_from_slice(&x.to_le_bytes());
    }
    w.write_all(&buf)
}

fn get<const N: usize, T: Read>(r: &mut T) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn get_u64<T: Read>(r: &mut T) -> std::io::Result<u64> {
    Ok(u64::from_le_bytes(get(r)?))
}

/// An array that must hold exactly `n` values.
fn get_arr<T: Read>(r: &mut T, n: usize) -> std::io::Result<Vec<f32>> {
    let got = get_u64(r)? as usize;
    if got != n {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("an array of {got} values where {n} were expected"),
        ));
    }
    let mut b = vec![0u8; n * 4];
    r.read_exact(&mut b)?;
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// `len` values of `buf` from the backend.
fn fetch<B: Backend>(b: &B, buf: &B::Buf, len: usize) -> std::io::Result<Vec<f32>> {
    let mut v = Vec::with_capacity(len);
    b.read(buf, 0, len, &mut v)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(v)
}

/// Writes `cache` to `out` in the format of the module header.
///
/// # Errors
/// I/O errors of `out`, or the backend failing to read a buffer.
pub fn write_state<B: Backend, T: Write>(
    cache: &DeepSeek4Cache<B>,
    out: &mut T,
) -> std::io::Result<()> {
    let b = &*cache.backend;
    out.write_all(MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&cache.shape.fingerprint.to_le_bytes())?;
    for v in [cache.len, cache.n_ctx, cache.high, cache.window] {
        out.write_all(&(v as u64).to_le_bytes())?;
    }
    out.write_all(&(cache.layers.len() as u32).to_le_bytes())?;
    for (l, &k) in cache.layers.iter().zip(&cache.shape.layers) {
        let (tag, rate) = kind_tag(k);
        out.write_all(&[tag])?;
        out.write_all(&rate.to_le_bytes())?;
        for (buf, n) in l.rings() {
            put_arr(out, &fetch(b, buf, n)?)?;
        }
        for (buf, dim, rate) in l.entries() {
            put_arr(out, &fetch(b, buf, cache.len / rate * dim)?)?;
        }
    }
    out.write_all(&(cache.anchors.len() as u32).to_le_bytes())?;
    for a in &cache.anchors {
        out.write_all(&(a.high as u64).to_le_bytes())?;
        out.write_all(&(a.end as u64).to_le_bytes())?;
        for (l, rings) in cache.layers.iter().zip(&a.rings) {
            for ((_, n), buf) in l.rings().into_iter().zip(rings) {
                put_arr(out, &fetch(b, buf, n)?)?;
            }
        }
    }
    Ok(())
}

/// Reads a state written by [`write_state`] for `model`; `label` names the source in
/// errors.
///
/// # Errors
/// [`StateFileError`]: bad magic, another version, a state of another model (different
/// fingerprint, layer kinds or sizes), truncated or malformed data, the backend failing.
pub fn read_state<B: Backend, T: Read>(
    model: &DeepSeek4<B>,
    input: &mut T,
    label: &str,
) -> Result<DeepSeek4Cache<B>, StateFileError> {
    let io = |source| StateFileError::Io {
        path: label.to_string(),
        source,
    };
    let mismatch = |detail: String| StateFileError::Mismatch {
        path: label.to_string(),
        detail,
    };
    let engine = |source| StateFileError::Engine {
        path: label.to_string(),
        source,
    };
    let magic: [u8; 8] = get(input).map_err(io)?;
    if &magic != MAGIC {
        return Err(StateFileError::BadMagic {
            path: label.to_string(),
        });
    }
    let version = u32::from_le_bytes(get(input).map_err(io)?);
    if version != VERSION {
        return Err(StateFileError::Version {
            path: label.to_string(),
            found: version,
        });
    }
    let fp = get_u64(input).map_err(io)?;
    if fp != model.fingerprint {
        return Err(mismatch(format!(
            "fingerprint {fp:#x}, model {:#x}",
            model.fingerprint
        )));
    }
    let mut h = [0usize; 4];
    for v in &mut h {
        *v = get_u64(input).map_err(io)? as usize;
    }
    let [len, n_ctx, high, window] = h;
    let n_layers = u32::from_le_bytes(get(input).map_err(io)?) as usize;
    let cfg = model.config();
    if n_layers != cfg.n_layer()
        || len > n_ctx
        || high < len
        || n_ctx > cfg.n_ctx_train.max(1)
        || window == 0
        || window > n_ctx.max(1) + super::DEFAULT_REWIND_WINDOW
    {
        return Err(mismatch(format!(
            "{n_layers} layers, len {len}, high {high}, n_ctx {n_ctx}, rewind window {window}"
        )));
    }
    let mut cache =
        DeepSeek4Cache::with_window(model.backend().clone(), model.cache_shape(), n_ctx, window)
            .map_err(engine)?;
    let b = cache.backend.clone();
    for (i, (l, &k)) in cache.layers.iter_mut().zip(&cache.shape.layers).enumerate() {
        let tag = get::<1, _>(input).map_err(io)?[0];
        let rate = get_u64(input).map_err(io)?;
        if (tag, rate) != kind_tag(k) {
            return Err(mismatch(format!("layer {i}: kind {tag}, rate {rate}")));
        }
        for (buf, n) in l.rings_mut() {
            let v = get_arr(input, n).map_err(io)?;
            b.write(buf, 0, &v).map_err(engine)?;
        }
        for (buf, dim, rate) in l.entries_mut() {
            let v = get_arr(input, len / rate * dim).map_err(io)?;
            b.write(buf, 0, &v).map_err(engine)?;
        }
    }
    let n_anchors = u32::from_le_bytes(get(input).map_err(io)?) as usize;
    if n_anchors > DEFAULT_ANCHORS {
        return Err(mismatch(format!("{n_anchors} anchors")));
    }
    for _ in 0..n_anchors {
        let (a_high, a_end) = (
            get_u64(input).map_err(io)? as usize,
            get_u64(input).map_err(io)? as usize,
        );
        if a_end > len || a_end > a_high {
            return Err(mismatch(format!("anchor high {a_high}, end {a_end}")));
        }
        // Take anchor buffers by recording the live rings, then overwrite them.
        cache.len = a_end;
        cache.push_anchor().map_err(engine)?;
        let a = cache.anchors.last_mut().expect("just pushed");
        a.high = a_high;
        for (l, rings) in cache.layers.iter().zip(a.rings.iter_mut()) {
            for ((_, n), buf) in l.rings().into_iter().zip(rings.iter_mut()) {
                let v = get_arr(input, n).map_err(io)?;
                b.write(buf, 0, &v).map_err(engine)?;
            }
        }
    }
    cache.len = len;
    cache.high = high;
    Ok(cache)
}

/// Saves `cache` to `path` (created or truncated).
///
/// # Errors
/// [`StateFileError::Io`].
pub fn save<B: Backend>(cache: &DeepSeek4Cache<B>, path: &Path) -> Result<(), StateFileError> {
    let label = path.display().to_string();
    let io = |source| StateFileError::Io {
        path: label.clone(),
        source,
    };
    let f = std::fs::File::create(path).map_err(io)?;
    let mut bw = std::io::BufWriter::new(f);
    write_state(cache, &mut bw).map_err(io)?;
    bw.flush().map_err(io)
}

/// Loads a state saved by [`save`] for `model`.
///
/// # Errors
/// As [`read_state`].
pub fn load<B: Backend>(
    model: &DeepSeek4<B>,
    path: &Path,
) -> Result<DeepSeek4Cache<B>, StateFileError> {
    let label = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| StateFileError::Io {
        path: label.clone(),
        source,
    })?;
    read_state(model, &mut std::io::BufReader::new(f), &label)
}
