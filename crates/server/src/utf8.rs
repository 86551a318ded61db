//! UTF-8 assembly of streamed token bytes: a token may end in the middle of a
//! character, so incomplete trailing bytes are held back until the next token
//! completes them; invalid bytes become U+FFFD. A character left incomplete when the
//! stream ends (a token limit cut it) is dropped, never turned into U+FFFD.

/// Turns a stream of byte pieces into text.
#[derive(Debug, Default)]
pub struct Utf8Assembler {
    pending: Vec<u8>,
}

impl Utf8Assembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `bytes` and returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default(),
                    );
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            start = valid;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + n;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Ends the stream: held bytes (the start of a character that never completed)
    /// are dropped.
    pub fn finish(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let mut a = Utf8Assembler::new();
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(a.push(b"a"), "a");
        assert_eq!(a.push(&euro[..1]), "");
        assert_eq!(a.push(&euro[1..2]), "");
        assert_eq!(a.push(&[euro[2], b'b']), "€b");
    }

    #[test]
    fn replaces_invalid_bytes() {
        let mut a = Utf8Assembler::new();
        assert_eq!(a.push(&[b'x', 0xff, b'y']), "x\u{fffd}y");
        assert_eq!(a.push(&[0xe2, 0x82]), "");
        // Cut inside a character: the incomplete bytes are dropped.
        a.finish();
        assert_eq!(a.push(b"z"), "z");
    }
}
