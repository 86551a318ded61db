//! An incremental scan of one JSON object's top level: where each top-level value
//! begins and ends, fed as text streams in. Lets a tool-call parser learn a call's
//! `name` early and stream its `arguments` text before the object is complete.
//!
//! Structural JSON characters are ASCII and never occur inside a UTF-8 multi-byte
//! sequence, so the scan works on bytes.

/// The kind of a top-level value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    String,
    /// An object or an array.
    Container,
    /// A number, `true`, `false` or `null`.
    Scalar,
}

/// One top-level field of the scanned object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The key, decoded.
    pub key: String,
    pub kind: ValueKind,
    /// Byte offset of the value's first character.
    pub start: usize,
    /// Byte offset just past the value, once it is complete.
    pub end: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the opening `{`.
    Outside,
    ExpectKey,
    InKey,
    ExpectColon,
    ExpectValue,
    InValue,
    AfterValue,
    /// After the closing `}` (or on input that is not an object).
    Done,
}

/// Scans a growing buffer; call [`TopLevelScan::feed`] with the whole buffer so far.
#[derive(Debug, Clone)]
pub struct TopLevelScan {
    pos: usize,
    depth: u32,
    in_string: bool,
    escape: bool,
    state: State,
    key_start: usize,
    key: String,
    fields: Vec<Field>,
}

impl Default for TopLevelScan {
    fn default() -> Self {
        TopLevelScan {
            pos: 0,
            depth: 0,
            in_string: false,
            escape: false,
            state: State::Outside,
            key_start: 0,
            key: String::new(),
            fields: Vec::new(),
        }
    }
}

impl TopLevelScan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes scanned so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The fields seen so far, in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The first field named `key`.
    pub fn field(&self, key: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.key == key)
    }

    /// Whether the outer object has closed (or the input is not an object).
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    fn end_value(&mut self, at: usize) {
        if let Some(f) = self.fields.last_mut()
            && f.end.is_none()
        {
            f.end = Some(at);
        }
        self.state = State::AfterValue;
    }

    fn begin_value(&mut self, kind: ValueKind, at: usize) {
        self.fields.push(Field {
            key: std::mem::take(&mut self.key),
            kind,
            start: at,
            end: None,
        });
        self.state = State::InValue;
    }

    fn scalar_open(&self) -> bool {
        self.state == State::InValue
            && self.depth == 1
            && self
                .fields
                .last()
                .is_some_and(|f| f.kind == ValueKind::Scalar)
    }

    /// Scans `buf[self.pos()..]`; `buf` must extend the text given before.
    pub fn feed(&mut self, buf: &str) {
        let bytes = buf.as_bytes();
        while self.pos < bytes.len() && self.state != State::Done {
            let i = self.pos;
            let c = bytes[i];
            self.pos += 1;
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if c == b'\\' {
                    self.escape = true;
                } else if c == b'"' {
                    self.in_string = false;
                    if self.depth == 1 && self.state == State::InKey {
                        self.key =
                            serde_json::from_str(&buf[self.key_start..=i]).unwrap_or_default();
                        self.state = State::ExpectColon;
                    } else if self.depth == 1 && self.state == State::InValue {
                        self.end_value(i + 1);
                    }
                }
                continue;
            }
            match c {
                b' ' | b'\t' | b'\n' | b'\r' => {
                    if self.scalar_open() {
                        self.end_value(i);
                    }
                }
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 {
                        match self.state {
                            State::ExpectKey => {
                                self.state = State::InKey;
                                self.key_start = i;
                            }
                            State::ExpectValue => self.begin_value(ValueKind::String, i),
                            _ => {}
                        }
                    }
                }
                b'{' | b'[' => {
                    if self.depth == 0 {
                        if c == b'{' {
                            self.depth = 1;
                            self.state = State::ExpectKey;
                        } else {
                            self.state = State::Done;
                        }
                    } else {
                        if self.depth == 1 && self.state == State::ExpectValue {
                            self.begin_value(ValueKind::Container, i);
                        }
                        self.depth += 1;
                    }
                }
                b'}' | b']' => {
                    if self.depth == 1 {
                        if self.scalar_open() {
                            self.end_value(i);
                        }
                        self.depth = 0;
                        self.state = State::Done;
                    } else if self.depth > 1 {
                        self.depth -= 1;
                        if self.depth == 1 && self.state == State::InValue {
                            self.end_value(i + 1);
                        }
                    }
                }
                b':' => {
                    if self.depth == 1 && self.state == State::ExpectColon {
                        self.state = State::ExpectValue;
                    }
                }
                b',' => {
                    if self.depth == 1 {
                        if self.scalar_open() {
                            self.end_value(i);
                        }
                        self.state = State::ExpectKey;
                    }
                }
                _ => {
                    if self.depth == 0 {
                        self.state = State::Done;
                    } else if self.depth == 1 && self.state == State::ExpectValue {
                        self.begin_value(ValueKind::Scalar, i);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice<'a>(buf: &'a str, f: &Field) -> &'a str {
        &buf[f.start..f.end.unwrap()]
    }

    #[test]
    fn finds_top_level_values() {
        let buf = r#" {"name": "get_weather", "n": 12, "arguments": {"city": "Paris", "x": [1, {"y": "}"}]}, "t": true}"#;
        let mut s = TopLevelScan::new();
        s.feed(buf);
        assert!(s.done());
        assert_eq!(slice(buf, s.field("name").unwrap()), r#""get_weather""#);
        assert_eq!(slice(buf, s.field("n").unwrap()), "12");
        assert_eq!(
            slice(buf, s.field("arguments").unwrap()),
            r#"{"city": "Paris", "x": [1, {"y": "}"}]}"#
        );
        assert_eq!(slice(buf, s.field("t").unwrap()), "true");
    }

    #[test]
    fn streams_in_pieces() {
        let full = r#"{"name": "f\"q", "arguments": {"a": "b\\"}}"#;
        let mut s = TopLevelScan::new();
        for end in 1..=full.len() {
            s.feed(&full[..end]);
            if end < full.find("arguments").unwrap() {
                assert!(s.field("arguments").is_none());
            }
        }
        assert!(s.done());
        assert_eq!(s.field("name").unwrap().key, "name");
        assert_eq!(slice(full, s.field("name").unwrap()), r#""f\"q""#);
        assert_eq!(
            slice(full, s.field("arguments").unwrap()),
            r#"{"a": "b\\"}"#
        );
    }

    #[test]
    fn open_value_has_no_end() {
        let mut s = TopLevelScan::new();
        s.feed(r#"{"name": "f", "arguments": {"a": 1"#);
        let f = s.field("arguments").unwrap();
        assert_eq!(f.kind, ValueKind::Container);
        assert_eq!(f.end, None);
        assert!(!s.done());
    }

    #[test]
    fn non_objects_end_the_scan() {
        let mut s = TopLevelScan::new();
        s.feed("[1, 2]");
        assert!(s.done());
        assert!(s.fields().is_empty());
    }
}
