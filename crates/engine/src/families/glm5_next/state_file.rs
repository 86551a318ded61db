//! A `glm5_next` sequence state on disk: a versioned little-endian file holding
//! everything [`Glm5NextCache`] holds (latents, indexer rows, pooled keys, KDA live and
//! base states and the rewind journal), so a restored cache rewinds exactly as the
//! saved one would. Buffers are read from and written to the backend.
//!
//! Layout, version 2:
//!
//! ```text
//! b"DS4GLMST"  u32 version=2  u64 model fingerprint
//! u64 len  u64 n_ctx  u64 base  u64 window  u32 n_layers
//! per layer: u8 tag (0 KDA, 1 MLA)
//!   KDA: f32 arrays live.conv, live.s, base.conv, base.s, then the journal entries of
//!        positions base..len in order: f32 arrays pre, k, v, g, beta
//!   MLA: f32 array latent (len rows), u8 has_indexer, [f32 arrays k, gs (len rows),
//!        pooled (len / P rows)]
//! u32 n_anchors; per anchor: u64 base, u64 end, per KDA layer: f32 arrays
//!   conv, s, then journal entries of positions base..end: pre, k, v, g, beta
//! f32 array = u64 count, then count × f32
//! ```
//!
//! Version 1 (the CPU-only cache before the backend interface) is not read: its
//! journal layout differs.

use std::io::{Read, Write};
use std::path::Path;

use super::Glm5Next;
use super::state::{Glm5NextCache, LayerState, journal_widths};
use crate::EngineError;
use crate::backend::{Backend, DeltaJournal};

const MAGIC: &[u8; 8] = b"DS4GLMST";
/// The version this build writes and reads.
pub const VERSION: u32 = 2;

/// Errors reading or writing a state file.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("state file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a glm5_next state file (bad magic)")]
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

struct W<'a, T: Write>(&'a mut T);

impl<T: Write> W<'_, T> {
    fn u8(&mut self, v: u8) -> std::io::Result<()> {
        self.0.write_all(&[v])
    }
    fn u32(&mut self, v: u32) -> std::io::Result<()> {
        self.0.write_all(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> std::io::Result<()> {
        self.0.write_all(&v.to_le_bytes())
    }
    fn arr(&mut self, v: &[f32]) -> std::io::Result<()> {
        self.u64(v.len() as u64)?;
        let mut buf = Vec::with_capacity(v.len() * 4);
        for x in v {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        self.0.write_all(&buf)
    }
}

struct R<'a, T: Read>(&'a mut T);

impl<T: Read> R<'_, T> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b)?;
        Ok(b)
    }
    fn u8(&mut self) -> std::io::Result<u8> {
        Ok(self.bytes::<1>()?[0])
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    /// An array of at most `max` values.
    fn arr(&mut self, max: usize) -> std::io::Result<Vec<f32>> {
        let n = self.u64()? as usize;
        if n > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("array of {n} values exceeds {max}"),
            ));
        }
        let mut b = vec![0u8; n * 4];
        self.0.read_exact(&mut b)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// `len` values of `buf` from the backend.
fn fetch<B: Backend>(b: &B, buf: &B::Buf, len: usize) -> std::io::Result<Vec<f32>> {
    let mut v = Vec::with_capacity(len);
    b.read(buf, 0, len, &mut v)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(v)
}

/// The journal entries of positions `range`, per buffer, in position order.
fn journal_entries<B: Backend>(
    b: &B,
    j: &DeltaJournal<B>,
    widths: [usize; 5],
    range: std::ops::Range<usize>,
) -> std::io::Result<Vec<Vec<f32>>> {
    let bufs = [&j.pre, &j.k, &j.v, &j.g, &j.beta];
    let mut out = Vec::with_capacity(5);
    for (buf, w) in bufs.into_iter().zip(widths) {
        let ring = fetch(b, buf, j.cap * w)?;
        let mut e = Vec::with_capacity(range.len() * w);
        for pos in range.clone() {
            let slot = pos % j.cap;
            e.extend_from_slice(&ring[slot * w..(slot + 1) * w]);
        }
        out.push(e);
    }
    Ok(out)
}

/// Writes `cache` to `out` in the format of the module header.
///
/// # Errors
/// I/O errors of `out`, or the backend failing to read a buffer.
pub fn write_state<B: Backend, T: Write>(
    cache: &Glm5NextCache<B>,
    out: &mut T,
) -> std::io::Result<()> {
    let b = &*cache.backend;
    let sh = &cache.shape;
    let d = &sh.delta;
    let widths = journal_widths(d);
    let mut w = W(out);
    w.0.write_all(MAGIC)?;
    w.u32(VERSION)?;
    w.u64(sh.fingerprint)?;
    for v in [cache.len, cache.n_ctx, cache.base, cache.window] {
        w.u64(v as u64)?;
    }
    w.u32(cache.layers.len() as u32)?;
    let len = cache.len;
    for l in &cache.layers {
        match l {
            LayerState::Kda(k) => {
                w.u8(0)?;
                for st in [&k.live, &k.base] {
                    w.arr(&fetch(b, &st.conv, d.conv_len())?)?;
                    w.arr(&fetch(b, &st.s, d.state_len())?)?;
                }
                for a in journal_entries(b, &k.journal, widths, cache.base..len)? {
                    w.arr(&a)?;
                }
            }
            LayerState::Mla(m) => {
                w.u8(1)?;
                w.arr(&fetch(b, &m.latent, len * sh.rkv)?)?;
                match &m.indexer {
                    Some(ix) => {
                        w.u8(1)?;
                        let di = sh.index_head_dim;
                        w.arr(&fetch(b, &ix.k, len * di)?)?;
                        w.arr(&fetch(b, &ix.gs, len * di)?)?;
                        w.arr(&fetch(b, &ix.pooled, len / sh.kpool * di)?)?;
                    }
                    None => w.u8(0)?,
                }
            }
        }
    }
    w.u32(cache.anchors.len() as u32)?;
    for a in &cache.anchors {
        w.u64(a.base as u64)?;
        w.u64(a.end as u64)?;
        for (st, j) in a.states.iter().zip(&a.journals) {
            w.arr(&fetch(b, &st.conv, d.conv_len())?)?;
            w.arr(&fetch(b, &st.s, d.state_len())?)?;
            for e in journal_entries(b, j, widths, a.base..a.end)? {
                w.arr(&e)?;
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
/// fingerprint or shapes), truncated or malformed data, the backend failing.
pub fn read_state<B: Backend, T: Read>(
    model: &Glm5Next<B>,
    input: &mut T,
    label: &str,
) -> Result<Glm5NextCache<B>, StateFileError> {
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
    let mut r = R(input);
    let magic: [u8; 8] = r.bytes().map_err(io)?;
    if &magic != MAGIC {
        return Err(StateFileError::BadMagic {
            path: label.to_string(),
        });
    }
    let version = r.u32().map_err(io)?;
    if version != VERSION {
        return Err(StateFileError::Version {
            path: label.to_string(),
            found: version,
        });
    }
    let fp = r.u64().map_err(io)?;
    let len = r.u64().map_err(io)? as usize;
    let n_ctx = r.u64().map_err(io)? as usize;
    let base = r.u64().map_err(io)? as usize;
    let window = r.u64().map_err(io)? as usize;
    let n_layers = r.u32().map_err(io)? as usize;
    let cfg = model.config();
    if fp != model.fingerprint {
        return Err(mismatch(format!(
            "fingerprint {fp:#x}, model {:#x}",
            model.fingerprint
        )));
    }
    if n_layers != cfg.n_layer() || base > len || len > n_ctx || n_ctx > cfg.n_ctx_train.max(1) {
        return Err(mismatch(format!(
            "{n_layers} layers, len {len}, base {base}, n_ctx {n_ctx}"
        )));
    }
    let mut cache = model.new_glm_cache(n_ctx).map_err(engine)?;
    cache.set_rewind_window(window).map_err(engine)?;
    if len - base > cache_journal_cap(&cache) {
        return Err(mismatch(format!("a journal of {} entries", len - base)));
    }
    let b = cache.backend.clone();
    let sh = cache.shape.clone();
    let d = sh.delta;
    let widths = journal_widths(&d);
    // Reads an array that must hold exactly `n` values.
    let exact = |r: &mut R<T>, n: usize, what: &str| -> Result<Vec<f32>, StateFileError> {
        let v = r.arr(n).map_err(io)?;
        if v.len() != n {
            return Err(mismatch(format!(
                "{what}: {} values, expected {n}",
                v.len()
            )));
        }
        Ok(v)
    };
    // Fills journal slots of positions `range` from arrays in position order.
    let put_journal = |r: &mut R<T>,
                       j: &mut DeltaJournal<B>,
                       range: std::ops::Range<usize>,
                       what: &str|
     -> Result<(), StateFileError> {
        let bufs = [&mut j.pre, &mut j.k, &mut j.v, &mut j.g, &mut j.beta];
        for (buf, w) in bufs.into_iter().zip(widths) {
            let e = exact(r, range.len() * w, what)?;
            for (k, pos) in range.clone().enumerate() {
                let slot = pos % j.cap;
                b.write(buf, slot * w, &e[k * w..(k + 1) * w])
                    .map_err(engine)?;
            }
        }
        Ok(())
    };
    for (i, l) in cache.layers.iter_mut().enumerate() {
        let tag = r.u8().map_err(io)?;
        let what = format!("layer {i}");
        match (l, tag) {
            (LayerState::Kda(k), 0) => {
                for st in [&mut k.live, &mut k.base] {
                    let conv = exact(&mut r, d.conv_len(), &what)?;
                    b.write(&mut st.conv, 0, &conv).map_err(engine)?;
                    let s = exact(&mut r, d.state_len(), &what)?;
                    b.write(&mut st.s, 0, &s).map_err(engine)?;
                }
                put_journal(&mut r, &mut k.journal, base..len, &what)?;
            }
            (LayerState::Mla(m), 1) => {
                let latent = exact(&mut r, len * sh.rkv, &what)?;
                b.write(&mut m.latent, 0, &latent).map_err(engine)?;
                let has = r.u8().map_err(io)? != 0;
                if has != m.indexer.is_some() {
                    return Err(mismatch(format!("layer {i}: indexer")));
                }
                if let Some(ix) = &mut m.indexer {
                    let di = sh.index_head_dim;
                    let k = exact(&mut r, len * di, &what)?;
                    b.write(&mut ix.k, 0, &k).map_err(engine)?;
                    let gs = exact(&mut r, len * di, &what)?;
                    b.write(&mut ix.gs, 0, &gs).map_err(engine)?;
                    let pooled = exact(&mut r, len / sh.kpool * di, &what)?;
                    b.write(&mut ix.pooled, 0, &pooled).map_err(engine)?;
                }
            }
            _ => return Err(mismatch(format!("layer {i}: kind tag {tag}"))),
        }
    }
    let n_anchors = r.u32().map_err(io)? as usize;
    if n_anchors > super::DEFAULT_ANCHORS {
        return Err(mismatch(format!("{n_anchors} anchors")));
    }
    for _ in 0..n_anchors {
        let (a_base, a_end) = (r.u64().map_err(io)? as usize, r.u64().map_err(io)? as usize);
        if a_base > a_end || a_end > len || a_end - a_base > cache_journal_cap(&cache) {
            return Err(mismatch(format!("anchor {a_base}..={a_end}")));
        }
        // Record the live base as an anchor to get buffers, then overwrite them.
        let (saved_base, saved_len) = (cache.base, cache.len);
        cache.base = a_base;
        cache.len = a_end;
        cache.anchors.retain(|a| a.end != a_end);
        cache.push_anchor().map_err(engine)?;
        cache.base = saved_base;
        cache.len = saved_len;
        let a = cache.anchors.last_mut().expect("just pushed");
        for (st, j) in a.states.iter_mut().zip(a.journals.iter_mut()) {
            let conv = exact(&mut r, d.conv_len(), "anchor")?;
            b.write(&mut st.conv, 0, &conv).map_err(engine)?;
            let s = exact(&mut r, d.state_len(), "anchor")?;
            b.write(&mut st.s, 0, &s).map_err(engine)?;
            put_journal(&mut r, j, a_base..a_end, "anchor")?;
        }
    }
    cache.len = len;
    cache.base = base;
    Ok(cache)
}

fn cache_journal_cap<B: Backend>(c: &Glm5NextCache<B>) -> usize {
    super::state::journal_cap(c.window)
}

/// Saves `cache` to `path` (created or truncated).
///
/// # Errors
/// [`StateFileError::Io`].
pub fn save<B: Backend>(cache: &Glm5NextCache<B>, path: &Path) -> Result<(), StateFileError> {
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
    model: &Glm5Next<B>,
    path: &Path,
) -> Result<Glm5NextCache<B>, StateFileError> {
    let label = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| StateFileError::Io {
        path: label.clone(),
        source,
    })?;
    read_state(model, &mut std::io::BufReader::new(f), &label)
}
