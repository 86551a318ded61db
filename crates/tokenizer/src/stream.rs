//! UTF-8-safe streaming detokenization.
//!
//! Token pieces are bytes, and a multi-byte character can be split across tokens (byte
//! fallback tokens, or BPE tokens that end inside a character). [`StreamDecoder`] holds an
//! incomplete trailing sequence until the bytes that complete it arrive.

/// Turns a stream of token pieces into text, emitting only complete UTF-8.
///
/// Bytes that can never form a character (an invalid sequence, not merely an unfinished
/// one) come out as U+FFFD at once, one per invalid sequence as `String::from_utf8_lossy`
/// counts them; [`StreamDecoder::flush`] turns an unfinished tail into U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` (e.g. [`crate::Tokenizer::piece`]) and returns the text that is now
    /// complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `valid` is valid UTF-8 by `valid_up_to`.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &after[n..];
                        }
                        None => {
                            rest = after; // an unfinished character: keep it
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        self.pending.drain(..self.pending.len() - keep);
        out
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: returns the held-back bytes as text (U+FFFD for an unfinished
    /// character) and empties the decoder.
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::StreamDecoder;

    #[test]
    fn holds_split_characters() {
        let mut d = StreamDecoder::new();
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(d.push(b"a"), "a");
        assert_eq!(d.push(&euro[..1]), "");
        assert!(d.has_pending());
        assert_eq!(d.push(&euro[1..2]), "");
        assert_eq!(d.push(&[euro[2], b'b']), "€b");
        assert_eq!(d.flush(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_at_once() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        assert_eq!(d.push(&[0xF0, 0x9F]), "");
        assert_eq!(d.push(b"z"), "\u{FFFD}z");
        assert_eq!(d.push(&[0xE2, 0x82]), "");
        assert_eq!(d.flush(), "\u{FFFD}");
        assert!(!d.has_pending());
    }

    #[test]
    fn matches_lossy_decoding_of_the_whole() {
        let bytes: Vec<u8> = "héllo wörld 😀 ok"
            .bytes()
            .chain([0xC3, b'!', 0xE2, 0x82])
            .collect();
        for split in 1..bytes.len() {
            let mut d = StreamDecoder::new();
            let mut s = String::new();
            for chunk in bytes.chunks(split) {
                s += &d.push(chunk);
            }
            s += &d.flush();
            assert_eq!(s, String::from_utf8_lossy(&bytes), "chunk size {split}");
        }
    }
}
