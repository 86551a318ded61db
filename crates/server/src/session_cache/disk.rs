//! Disk checkpoints of parked session states: one file per state in the cache
//! directory, named `IDENTITY-TOKENS.ds4c` (hashes of the engine identity and of the
//! tokens). Layout, little-endian:
//!
//! ```text
//! b"DS4CKPT1"  u32 version = 1  u32 header length
//! header: u32 identity length, identity (UTF-8: model file size and header hash,
//!         backend, context size, build — see `Engine::identity`)
//!         u64 token count, tokens (u32)
//!         u64 text length, text bytes; u64 mark count, marks (u64 bytes, u64 tokens)
//!         u8 logits known; u64 range count, reachable ranges (u64 start, u64 end)
//!         u64 payload length, u32 payload CRC-32
//! u32 header CRC-32
//! payload: the engine's state (`Engine::write_parked`)
//! ```
//!
//! Files are written to a temporary name, synced and renamed, so a crash never leaves
//! a half-written checkpoint under a real name. A file of another identity (another
//! model, backend, context size or build) is foreign and left alone; a file that does
//! not parse, is truncated or fails a checksum is corrupted. Either is logged once and
//! ignored: the request is prefilled instead, never answered from it.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::backend::{Engine, Parked};
use crate::prompt_cache::{Mark, PromptCache};

const MAGIC: &[u8; 8] = b"DS4CKPT1";
const VERSION: u32 = 1;
const EXT: &str = "ds4c";
/// Bytes before the header: magic, version, header length.
const PREAMBLE: u64 = 16;

/// FNV-1a, 64 bits (a stable hash for identities and file names).
pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A checkpoint file and what its header says.
#[derive(Debug, Clone)]
pub struct DiskEntry {
    pub path: PathBuf,
    /// The file's size.
    pub bytes: u64,
    pub modified: SystemTime,
    pub tokens: Vec<u32>,
    pub text: Vec<u8>,
    pub marks: Vec<Mark>,
    pub reachable: Vec<RangeInclusive<usize>>,
    pub logits_known: bool,
    payload_len: u64,
    payload_crc: u32,
}

/// The cache directory of one engine identity.
pub struct DiskStore {
    dir: PathBuf,
    identity: String,
    /// Files already reported as foreign or corrupted (each is logged once).
    reported: HashSet<PathBuf>,
}

/// A little-endian reader over a header.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.0.len() < n {
            return Err("the header ends early".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A count of items of `size` bytes that must fit in what is left.
    fn count(&mut self, size: usize) -> Result<usize, String> {
        let n = self.u64()?;
        if n.saturating_mul(size as u64) > self.0.len() as u64 {
            return Err(format!("a count of {n} past the header"));
        }
        Ok(n as usize)
    }
}

fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

impl DiskStore {
    /// The store in `dir` (created if needed) for engine `identity`.
    pub fn new(dir: PathBuf, identity: &str) -> Self {
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!("prompt cache: cannot create {}: {e}", dir.display());
        }
        DiskStore {
            dir,
            identity: identity.to_string(),
            reported: HashSet::new(),
        }
    }

    /// Logs `why` for `path` unless it was logged before.
    fn report(&mut self, path: &Path, why: &str) {
        if self.reported.insert(path.to_path_buf()) {
            tracing::warn!("prompt cache: ignoring {}: {why}", path.display());
        }
    }

    /// The checkpoints of this identity in the directory (others are reported once).
    pub fn scan(&mut self) -> Vec<DiskEntry> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for item in dir.flatten() {
            let path = item.path();
            if path.extension().and_then(|e| e.to_str()) != Some(EXT) {
                continue;
            }
            match self.read_header(&path) {
                Ok(Some(e)) => found.push(e),
                Ok(None) => self.report(&path, "a checkpoint of another model or settings"),
                Err(why) => self.report(&path, &format!("corrupted checkpoint ({why})")),
            }
        }
        found
    }

    /// The header of `path`: `None` for another identity.
    fn read_header(&self, path: &Path) -> Result<Option<DiskEntry>, String> {
        let mut f = File::open(path).map_err(|e| e.to_string())?;
        let meta = f.metadata().map_err(|e| e.to_string())?;
        let mut pre = [0u8; PREAMBLE as usize];
        f.read_exact(&mut pre)
            .map_err(|e| format!("preamble: {e}"))?;
        if &pre[..8] != MAGIC {
            return Err("bad magic".into());
        }
        let version = u32::from_le_bytes(pre[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(format!(
                "format version {version}, this build reads {VERSION}"
            ));
        }
        let header_len = u32::from_le_bytes(pre[12..16].try_into().expect("4 bytes")) as u64;
        if PREAMBLE + header_len + 4 > meta.len() {
            return Err("truncated header".into());
        }
        let mut header = vec![0u8; header_len as usize + 4];
        f.read_exact(&mut header)
            .map_err(|e| format!("header: {e}"))?;
        let (header, crc) = header.split_at(header_len as usize);
        if crc32fast::hash(header) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err("header checksum mismatch".into());
        }
        let mut c = Cursor(header);
        let n = c.u32()? as usize;
        let identity = c.take(n)?;
        if identity != self.identity.as_bytes() {
            return Ok(None);
        }
        let n = c.count(4)?;
        let tokens = (0..n).map(|_| c.u32()).collect::<Result<Vec<_>, _>>()?;
        let n = c.count(1)?;
        let text = c.take(n)?.to_vec();
        let n = c.count(16)?;
        let marks = (0..n)
            .map(|_| {
                Ok(Mark {
                    bytes: c.u64()? as usize,
                    tokens: c.u64()? as usize,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let logits_known = c.u8()? == 1;
        let n = c.count(16)?;
        let reachable = (0..n)
            .map(|_| Ok(c.u64()? as usize..=c.u64()? as usize))
            .collect::<Result<Vec<_>, String>>()?;
        let payload_len = c.u64()?;
        let payload_crc = c.u32()?;
        if PREAMBLE + header_len + 4 + payload_len != meta.len() {
            return Err(format!(
                "{} bytes, the header says {}",
                meta.len(),
                PREAMBLE + header_len + 4 + payload_len
            ));
        }
        if marks.last().is_some_and(|m| m.tokens > tokens.len()) {
            return Err("marks past the tokens".into());
        }
        Ok(Some(DiskEntry {
            path: path.to_path_buf(),
            bytes: meta.len(),
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            tokens,
            text,
            marks,
            reachable,
            logits_known,
            payload_len,
            payload_crc,
        }))
    }

    /// Reads and checks the state of `d`.
    pub fn load(&mut self, d: &DiskEntry, engine: &dyn Engine) -> Result<Box<dyn Parked>, String> {
        let read = || -> Result<Box<dyn Parked>, String> {
            let mut f = File::open(&d.path).map_err(|e| e.to_string())?;
            let len = f.metadata().map_err(|e| e.to_string())?.len();
            if len != d.bytes {
                return Err(format!("{len} bytes, {} when indexed", d.bytes));
            }
            f.seek(SeekFrom::Start(d.bytes - d.payload_len))
                .map_err(|e| e.to_string())?;
            let mut payload = vec![0u8; d.payload_len as usize];
            f.read_exact(&mut payload)
                .map_err(|e| format!("payload: {e}"))?;
            if crc32fast::hash(&payload) != d.payload_crc {
                return Err("payload checksum mismatch".into());
            }
            let parked = engine
                .read_parked(&mut &payload[..])
                .map_err(|e| e.to_string())?;
            if parked.tokens() != d.tokens {
                return Err("the state holds other tokens than its header".into());
            }
            Ok(parked)
        };
        match read() {
            Ok(p) => {
                // Mark it used (the least recently used files go first at startup).
                if let Ok(f) = File::options().write(true).open(&d.path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Ok(p)
            }
            Err(why) => {
                self.report(&d.path, &format!("corrupted checkpoint ({why})"));
                Err(why)
            }
        }
    }

    /// Writes a checkpoint of `parked` atomically.
    pub fn save(
        &mut self,
        engine: &dyn Engine,
        parked: &dyn Parked,
        tokens: &[u32],
        text: &PromptCache,
        reachable: &[RangeInclusive<usize>],
        logits_known: bool,
    ) -> Result<DiskEntry, String> {
        let mut payload = Vec::new();
        engine
            .write_parked(parked, &mut payload)
            .map_err(|e| e.to_string())?;
        let (text_bytes, marks) = text.parts();
        let mut h = Vec::new();
        h.extend_from_slice(&(self.identity.len() as u32).to_le_bytes());
        h.extend_from_slice(self.identity.as_bytes());
        put_u64(&mut h, tokens.len() as u64);
        for t in tokens {
            h.extend_from_slice(&t.to_le_bytes());
        }
        put_u64(&mut h, text_bytes.len() as u64);
        h.extend_from_slice(text_bytes);
        put_u64(&mut h, marks.len() as u64);
        for m in marks {
            put_u64(&mut h, m.bytes as u64);
            put_u64(&mut h, m.tokens as u64);
        }
        h.push(u8::from(logits_known));
        put_u64(&mut h, reachable.len() as u64);
        for r in reachable {
            put_u64(&mut h, *r.start() as u64);
            put_u64(&mut h, *r.end() as u64);
        }
        put_u64(&mut h, payload.len() as u64);
        let payload_crc = crc32fast::hash(&payload);
        h.extend_from_slice(&payload_crc.to_le_bytes());
        let header_len = u32::try_from(h.len()).map_err(|_| "header too large".to_string())?;
        let token_bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let name = format!(
            "{:016x}-{:016x}.{EXT}",
            fnv64(self.identity.as_bytes()),
            fnv64(&token_bytes)
        );
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!(".tmp-{}-{name}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            let mut pre = Vec::with_capacity(PREAMBLE as usize);
            pre.extend_from_slice(MAGIC);
            pre.extend_from_slice(&VERSION.to_le_bytes());
            pre.extend_from_slice(&header_len.to_le_bytes());
            f.write_all(&pre)?;
            f.write_all(&h)?;
            f.write_all(&crc32fast::hash(&h).to_le_bytes())?;
            f.write_all(&payload)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            // The rename is durable once the directory is synced.
            File::open(&self.dir)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("{}: {e}", path.display()));
        }
        let bytes = PREAMBLE + 4 + h.len() as u64 + payload.len() as u64;
        self.reported.remove(&path);
        Ok(DiskEntry {
            path,
            bytes,
            modified: SystemTime::now(),
            tokens: tokens.to_vec(),
            text: text_bytes.to_vec(),
            marks: marks.to_vec(),
            reachable: reachable.to_vec(),
            logits_known,
            payload_len: payload.len() as u64,
            payload_crc,
        })
    }

    /// Deletes a checkpoint (evicted, or superseded by a longer one).
    pub fn delete(&mut self, path: &Path) {
        if let Err(e) = std::fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("prompt cache: cannot delete {}: {e}", path.display());
        }
    }

    /// Stops using a corrupted checkpoint (the file stays, reported once).
    pub fn forget(&mut self, path: &Path) {
        self.report(path, "corrupted checkpoint");
    }
}
