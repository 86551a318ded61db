//! A `glm5_next` sequence state on disk: a versioned little-endian file holding
//! everything [`Glm5NextCache`] holds (latents, indexer rows, pooled keys, KDA live and
//! base states and the rewind journal), so a restored cache rewinds exactly as the
//! saved one would.
//!
//! Layout, version 1:
//!
//! ```text
//! b"DS4GLMST"  u32 version=1  u64 model fingerprint
//! u64 len  u64 n_ctx  u64 base  u64 window  u32 n_layers
//! per layer: u8 tag (0 KDA, 1 MLA)
//!   KDA: f32 arrays live.conv, live.s, base.conv, base.s, journal.{pre,k,v,g,beta}
//!   MLA: f32 array latent, u8 has_indexer, [f32 arrays k, gs, pooled]
//! u32 n_anchors; per anchor: u64 base, u64 end, per KDA layer: f32 arrays
//!   conv, s, journal.{pre,k,v,g,beta}
//! f32 array = u64 count, then count × f32
//! ```

use std::io::{Read, Write};
use std::path::Path;

use super::Glm5Next;
use super::state::{Anchor, Glm5NextCache, IndexerState, Journal, KdaState, LayerState, MlaLayer};

const MAGIC: &[u8; 8] = b"DS4GLMST";
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
    #[error("{path} is not a glm5_next state file (bad magic)")]
    BadMagic { path: String },
    #[error(
        "{path}: state file version {found} is not supported (this build reads version {VERSION})"
    )]
    Version { path: String, found: u32 },
    #[error("{path}: the state belongs to another model ({detail})")]
    Mismatch { path: String, detail: String },
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

/// Writes `cache` to `out` in the format of the module header.
///
/// # Errors
/// I/O errors of `out`.
pub fn write_state<T: Write>(cache: &Glm5NextCache, out: &mut T) -> std::io::Result<()> {
    let mut w = W(out);
    w.0.write_all(MAGIC)?;
    w.u32(VERSION)?;
    w.u64(cache.shape.fingerprint)?;
    for v in [cache.len, cache.n_ctx, cache.base, cache.window] {
        w.u64(v as u64)?;
    }
    w.u32(cache.layers.len() as u32)?;
    for l in &cache.layers {
        match l {
            LayerState::Kda(k) => {
                w.u8(0)?;
                for a in [&k.live.conv, &k.live.s, &k.base.conv, &k.base.s] {
                    w.arr(a)?;
                }
                let j = &k.journal;
                for a in [&j.pre, &j.k, &j.v, &j.g, &j.beta] {
                    w.arr(a)?;
                }
            }
            LayerState::Mla(m) => {
                w.u8(1)?;
                w.arr(&m.latent)?;
                match &m.indexer {
                    Some(ix) => {
                        w.u8(1)?;
                        for a in [&ix.k, &ix.gs, &ix.pooled] {
                            w.arr(a)?;
                        }
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
            for arr in [&st.conv, &st.s, &j.pre, &j.k, &j.v, &j.g, &j.beta] {
                w.arr(arr)?;
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
/// fingerprint or shapes), truncated or malformed data.
pub fn read_state<T: Read>(
    model: &Glm5Next,
    input: &mut T,
    label: &str,
) -> Result<Glm5NextCache, StateFileError> {
    let io = |source| StateFileError::Io {
        path: label.to_string(),
        source,
    };
    let mismatch = |detail: String| StateFileError::Mismatch {
        path: label.to_string(),
        detail,
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
    let mut cache = model.new_glm_cache(0);
    let fp = r.u64().map_err(io)?;
    if fp != cache.shape.fingerprint {
        return Err(mismatch(format!(
            "fingerprint {fp:#x}, model {:#x}",
            cache.shape.fingerprint
        )));
    }
    let len = r.u64().map_err(io)? as usize;
    let n_ctx = r.u64().map_err(io)? as usize;
    let base = r.u64().map_err(io)? as usize;
    let window = r.u64().map_err(io)? as usize;
    let n_layers = r.u32().map_err(io)? as usize;
    if n_layers != cache.layers.len() || base > len || len > n_ctx {
        return Err(mismatch(format!(
            "{n_layers} layers, len {len}, base {base}, n_ctx {n_ctx}"
        )));
    }
    // Upper bound of any array: the largest per-token row times the context, plus states.
    let cfg = model.config();
    let row = (6 * cfg.qkv())
        .max(cfg.kv_lora_rank)
        .max(cfg.index_head_dim)
        .max(1);
    let max =
        (n_ctx + 1) * row + cfg.qkv() * cfg.kda_head_dim.max(1) + 3 * cfg.qkv() * cfg.conv_kernel;
    for (i, l) in cache.layers.iter_mut().enumerate() {
        let tag = r.u8().map_err(io)?;
        match (l, tag) {
            (LayerState::Kda(k), 0) => {
                let mut arrs = Vec::with_capacity(9);
                for _ in 0..9 {
                    arrs.push(r.arr(max).map_err(io)?);
                }
                let mut it = arrs.into_iter();
                let mut next = || it.next().unwrap_or_default();
                let live = KdaState {
                    conv: next(),
                    s: next(),
                };
                let basest = KdaState {
                    conv: next(),
                    s: next(),
                };
                if live.conv.len() != k.live.conv.len()
                    || live.s.len() != k.live.s.len()
                    || basest.conv.len() != k.base.conv.len()
                    || basest.s.len() != k.base.s.len()
                {
                    return Err(mismatch(format!("layer {i}: KDA state sizes")));
                }
                k.live = live;
                k.base = basest;
                k.journal = Journal {
                    pre: next(),
                    k: next(),
                    v: next(),
                    g: next(),
                    beta: next(),
                };
                if k.journal.beta.len() != (len - base) * k.heads {
                    return Err(mismatch(format!(
                        "layer {i}: journal of {} entries",
                        k.journal.beta.len()
                    )));
                }
            }
            (LayerState::Mla(m), 1) => {
                let latent = r.arr(max).map_err(io)?;
                let has = r.u8().map_err(io)? != 0;
                if has != m.indexer.is_some() || latent.len() != len * cfg.kv_lora_rank {
                    return Err(mismatch(format!("layer {i}: MLA state")));
                }
                let indexer = if has {
                    let (k, gs, pooled) = (
                        r.arr(max).map_err(io)?,
                        r.arr(max).map_err(io)?,
                        r.arr(max).map_err(io)?,
                    );
                    Some(IndexerState { k, gs, pooled })
                } else {
                    None
                };
                *m = MlaLayer { latent, indexer };
            }
            _ => return Err(mismatch(format!("layer {i}: kind tag {tag}"))),
        }
    }
    let n_kda = cache
        .layers
        .iter()
        .filter(|l| matches!(l, LayerState::Kda(_)))
        .count();
    let n_anchors = r.u32().map_err(io)? as usize;
    if n_anchors > 64 {
        return Err(mismatch(format!("{n_anchors} anchors")));
    }
    for _ in 0..n_anchors {
        let (a_base, a_end) = (r.u64().map_err(io)? as usize, r.u64().map_err(io)? as usize);
        if a_base > a_end || a_end > len {
            return Err(mismatch(format!("anchor {a_base}..={a_end}")));
        }
        let (mut states, mut journals) = (Vec::new(), Vec::new());
        for _ in 0..n_kda {
            let mut v = Vec::with_capacity(7);
            for _ in 0..7 {
                v.push(r.arr(max).map_err(io)?);
            }
            let mut it = v.into_iter();
            let mut next = || it.next().unwrap_or_default();
            states.push(KdaState {
                conv: next(),
                s: next(),
            });
            journals.push(Journal {
                pre: next(),
                k: next(),
                v: next(),
                g: next(),
                beta: next(),
            });
        }
        let live: Vec<&KdaState> = cache
            .layers
            .iter()
            .filter_map(|l| {
                if let LayerState::Kda(k) = l {
                    Some(&k.live)
                } else {
                    None
                }
            })
            .collect();
        let heads = cfg.kda_heads.max(1);
        let ok = states
            .iter()
            .zip(&live)
            .all(|(s, l)| s.conv.len() == l.conv.len() && s.s.len() == l.s.len())
            && journals
                .iter()
                .all(|j| j.beta.len() == (a_end - a_base) * heads);
        if !ok {
            return Err(mismatch(format!("anchor {a_base}..={a_end}: state sizes")));
        }
        cache.anchors.push(Anchor {
            base: a_base,
            end: a_end,
            states,
            journals,
        });
    }
    cache.len = len;
    cache.n_ctx = n_ctx;
    cache.base = base;
    cache.window = window;
    Ok(cache)
}

/// Saves `cache` to `path` (created or truncated).
///
/// # Errors
/// [`StateFileError::Io`].
pub fn save(cache: &Glm5NextCache, path: &Path) -> Result<(), StateFileError> {
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
pub fn load(model: &Glm5Next, path: &Path) -> Result<Glm5NextCache, StateFileError> {
    let label = path.display().to_string();
    let f = std::fs::File::open(path).map_err(|source| StateFileError::Io {
        path: label.clone(),
        source,
    })?;
    read_state(model, &mut std::io::BufReader::new(f), &label)
}
