//! SHA-256 digests as lowercase hex: of files (streamed, for multi-GiB model files),
//! of byte strings (generated text) and of token id sequences (session frontiers).

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Read size for streaming file digests.
const CHUNK: usize = 1 << 20;

/// SHA-256 of the file at `path`, read in 1 MiB chunks (constant memory).
///
/// Errors: the I/O error of opening or reading `path`, with the path in its message.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut file = File::open(path).map_err(with_path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(with_path(e)),
        };
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// SHA-256 of `bytes` (e.g. the UTF-8 of a generated text).
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 of a token id sequence, each id as 4 little-endian bytes.
///
/// Two sessions whose committed tokens (frontiers) are equal hash equal.
pub fn sha256_tokens(tokens: &[u32]) -> String {
    let mut hasher = Sha256::new();
    for t in tokens {
        hasher.update(t.to_le_bytes());
    }
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference digests from `printf ... | sha256sum` (FIPS 180-2 test vector "abc").
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn bytes_match_reference() {
        assert_eq!(sha256_bytes(b"abc"), ABC);
        assert_eq!(sha256_bytes(b""), EMPTY);
    }

    #[test]
    fn file_digest_streams_across_chunks() {
        let dir = std::env::temp_dir().join(format!("ds4-measure-hash-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("abc.bin");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(sha256_file(&path).unwrap(), ABC);
        // 3 MiB + 1 of 'a': digest from `head -c 3145729 /dev/zero | tr '\0' a | sha256sum`.
        std::fs::write(&path, vec![b'a'; 3 * CHUNK + 1]).unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "2b98b70051781969f52a33c9cd0e8392bb7a634a92a3be4597b25e13feb41ee6"
        );
        let err = sha256_file(&dir.join("missing")).unwrap_err();
        assert!(err.to_string().contains("missing"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_digest_is_little_endian_u32() {
        // [1, 256] -> bytes 01 00 00 00 00 01 00 00; `printf '\x01\0\0\0\0\x01\0\0' | sha256sum`.
        assert_eq!(
            sha256_tokens(&[1, 256]),
            "242045e2f1bb37769b514f182fd91b3d215324cb57f187cced1e9c62921dbac3"
        );
    }
}
