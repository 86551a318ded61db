//! The Qwen/Hermes tool-call format:
//! `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, any number of calls.
//!
//! Small models often drop the tags; like llama.cpp's Hermes parser, a JSON object whose
//! first key is `name`, standing at the start of the answer or right after another call
//! (bare, or in a ```` ```json ```` fence), is a call too.
//!
//! The call's name is reported as soon as its JSON string is complete, and the
//! `arguments` value is streamed as raw JSON text while it is generated (so an OpenAI
//! client sees argument deltas). `parameters` is accepted for `arguments`; arguments
//! given as a JSON string are passed on as that string's content. A call whose body is
//! not a JSON object with a string `name` is released as text when nothing of it was
//! reported yet. Whitespace-only text around calls is dropped.

use super::json_scan::{Field, TopLevelScan, ValueKind};
use super::{OutputEvent, ToolCallParser};
use crate::holdback::{Scan, scan};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FENCES: [&str; 2] = ["```json", "```"];

/// How the call being read ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// At `</tool_call>`.
    Tag,
    /// Where its JSON object ends.
    Bare,
    /// Where its JSON object ends, then a closing ```` ``` ````.
    Fenced,
}

impl Close {
    /// A call's body as the text it came from (released as text when it was not a
    /// call, or kept whole when the answer was cut inside one).
    fn as_text(self, body: &str) -> String {
        match self {
            Close::Tag => format!("{OPEN}{body}"),
            Close::Bare => body.to_string(),
            Close::Fenced => format!("```json\n{body}"),
        }
    }
}

/// The streaming parser.
#[derive(Debug)]
pub struct HermesParser {
    /// Text mode: unreleased text; call mode: the call's body so far.
    buf: String,
    /// The call being read, if any.
    call: Option<Close>,
    /// Text mode: only whitespace since the start or the last call, so a bare call may
    /// begin here.
    at_boundary: bool,
    /// After a fenced call: the closing fence is still to be skipped.
    skip_fence: bool,
    scan: TopLevelScan,
    /// Calls completed or begun.
    calls: usize,
    /// Whether the current call's begin event was sent.
    begun: bool,
    /// Bytes of the current call's arguments text already sent.
    sent: usize,
    /// Whitespace-only text held until we know whether a call follows.
    pending_ws: String,
}

impl Default for HermesParser {
    fn default() -> Self {
        HermesParser {
            buf: String::new(),
            call: None,
            at_boundary: true,
            skip_fence: false,
            scan: TopLevelScan::new(),
            calls: 0,
            begun: false,
            sent: 0,
            pending_ws: String::new(),
        }
    }
}

fn args_field(scan: &TopLevelScan) -> Option<&Field> {
    scan.field("arguments").or_else(|| scan.field("parameters"))
}

/// What the start of text-mode input says about a bare call.
enum Start {
    /// Not enough text to tell.
    Wait,
    /// A bare (or fenced) JSON object begins after `skip` bytes.
    Call { skip: usize, close: Close },
    /// Ordinary text.
    Text,
}

fn bare_start(buf: &str) -> Start {
    let t = buf.trim_start();
    let lead = buf.len() - t.len();
    if t.is_empty() {
        return Start::Wait;
    }
    if t.starts_with('{') {
        return Start::Call {
            skip: lead,
            close: Close::Bare,
        };
    }
    for fence in FENCES {
        if let Some(rest) = t.strip_prefix(fence) {
            let body = rest.trim_start();
            if body.is_empty() {
                return Start::Wait;
            }
            if body.starts_with('{') && rest.starts_with(['\n', '\r', ' ']) {
                return Start::Call {
                    skip: buf.len() - body.len(),
                    close: Close::Fenced,
                };
            }
        } else if fence.starts_with(t) {
            return Start::Wait;
        }
    }
    Start::Text
}

impl HermesParser {
    pub fn new() -> Self {
        Self::default()
    }

    fn emit_text(&mut self, t: &str, out: &mut Vec<OutputEvent>) {
        if t.is_empty() {
            return;
        }
        if t.trim().is_empty() {
            self.pending_ws.push_str(t);
            return;
        }
        self.at_boundary = false;
        let mut s = std::mem::take(&mut self.pending_ws);
        s.push_str(t);
        out.push(OutputEvent::Text(s));
    }

    fn begin_call(&mut self, close: Close) {
        self.pending_ws.clear();
        self.call = Some(close);
        self.begun = false;
        self.sent = 0;
        self.scan = TopLevelScan::new();
    }

    /// Reports what the scan of the body (up to `limit` bytes) has made known.
    fn stream_call(&mut self, limit: usize, out: &mut Vec<OutputEvent>) {
        self.scan.feed(&self.buf[..limit]);
        if !self.begun {
            let name = self
                .scan
                .field("name")
                .filter(|f| f.kind == ValueKind::String)
                .and_then(|f| f.end.map(|e| (f.start, e)));
            match name.and_then(|(s, e)| serde_json::from_str::<String>(&self.buf[s..e]).ok()) {
                Some(name) => {
                    out.push(OutputEvent::ToolCallBegin {
                        index: self.calls,
                        name,
                    });
                    self.begun = true;
                }
                None => return,
            }
        }
        if let Some(f) = args_field(&self.scan)
            && f.kind != ValueKind::String
        {
            let end = f.end.unwrap_or(self.scan.pos());
            let from = f.start + self.sent;
            if end > from {
                out.push(OutputEvent::ToolCallArgs {
                    index: self.calls,
                    delta: self.buf[from..end].to_string(),
                });
                self.sent = end - f.start;
            }
        }
    }

    /// Completes the current call from its whole body (`buf[..body_len]`); `raw` is how
    /// to release it as text if it is not a call.
    fn finish_call(
        &mut self,
        body_len: usize,
        raw: impl FnOnce(&str) -> String,
        out: &mut Vec<OutputEvent>,
    ) {
        self.stream_call(body_len, out);
        let body = &self.buf[..body_len];
        let parsed = serde_json::from_str::<serde_json::Value>(body.trim()).ok();
        let call = parsed.as_ref().and_then(|v| {
            let name = v.get("name")?.as_str()?.to_string();
            let args = v
                .get("arguments")
                .or_else(|| v.get("parameters"))
                .cloned()
                .unwrap_or(serde_json::json!({}));
            Some((name, args))
        });
        match call {
            Some((name, args)) => {
                let full = match &args {
                    serde_json::Value::String(s) => s.clone(),
                    _ => {
                        match args_field(&self.scan).and_then(|f| f.end.map(|e| &body[f.start..e]))
                        {
                            Some(raw) => raw.to_string(),
                            None => serde_json::to_string(&args).unwrap_or_default(),
                        }
                    }
                };
                if !self.begun {
                    out.push(OutputEvent::ToolCallBegin {
                        index: self.calls,
                        name,
                    });
                    self.begun = true;
                }
                if self.sent < full.len() && full.is_char_boundary(self.sent) {
                    out.push(OutputEvent::ToolCallArgs {
                        index: self.calls,
                        delta: full[self.sent..].to_string(),
                    });
                }
                out.push(OutputEvent::ToolCallEnd { index: self.calls });
                self.calls += 1;
                self.at_boundary = true;
            }
            None if self.begun => {
                out.push(OutputEvent::ToolCallEnd { index: self.calls });
                self.calls += 1;
                self.at_boundary = true;
            }
            None => {
                let text = raw(body);
                self.emit_text(&text, out);
            }
        }
        self.call = None;
    }

    /// Text mode; returns false when it needs more input.
    fn step_text(&mut self, out: &mut Vec<OutputEvent>) -> bool {
        if self.skip_fence {
            let t = self.buf.trim_start();
            if t.is_empty() || "```".starts_with(t) {
                return false;
            }
            let t = t.strip_prefix("```").unwrap_or(t).to_string();
            self.buf = t;
            self.skip_fence = false;
        }
        if self.at_boundary {
            match bare_start(&self.buf) {
                Start::Wait => return false,
                Start::Call { skip, close } => {
                    self.buf.drain(..skip);
                    self.begin_call(close);
                    return true;
                }
                Start::Text => {}
            }
        }
        match scan(&self.buf, OPEN) {
            Scan::Found(pos) => {
                let before = self.buf[..pos].to_string();
                self.buf.drain(..pos + OPEN.len());
                self.emit_text(&before, out);
                self.begin_call(Close::Tag);
                true
            }
            Scan::Safe(n) => {
                let before: String = self.buf.drain(..n).collect();
                self.emit_text(&before, out);
                false
            }
        }
    }

    /// Call mode; returns false when it needs more input.
    fn step_call(&mut self, close: Close, out: &mut Vec<OutputEvent>) -> bool {
        if close == Close::Tag {
            return match scan(&self.buf, CLOSE) {
                Scan::Found(pos) => {
                    self.finish_call(pos, |b| format!("{}{CLOSE}", close.as_text(b)), out);
                    self.buf.drain(..pos + CLOSE.len());
                    true
                }
                Scan::Safe(n) => {
                    self.stream_call(n, out);
                    false
                }
            };
        }
        let n = self.buf.len();
        self.stream_call(n, out);
        // A bare object is a call only when its first key is "name".
        if !self.begun && self.scan.fields().first().is_some_and(|f| f.key != "name") {
            let text = std::mem::take(&mut self.buf);
            self.call = None;
            self.emit_text(&text, out);
            self.at_boundary = false;
            return false;
        }
        if !self.scan.done() {
            return false;
        }
        let end = self.scan.pos();
        self.finish_call(end, |b| close.as_text(b), out);
        self.buf.drain(..end);
        self.skip_fence = close == Close::Fenced && self.calls > 0 && self.at_boundary;
        true
    }
}

impl ToolCallParser for HermesParser {
    fn push(&mut self, text: &str, out: &mut Vec<OutputEvent>) {
        self.buf.push_str(text);
        loop {
            let more = match self.call {
                None => self.step_text(out),
                Some(close) => self.step_call(close, out),
            };
            if !more {
                return;
            }
        }
    }

    fn take_open_call(&mut self) -> Option<String> {
        let close = self.call.take()?;
        let raw = close.as_text(&self.buf);
        if self.begun {
            self.calls += 1;
        }
        self.buf.clear();
        self.begun = false;
        self.sent = 0;
        self.scan = TopLevelScan::new();
        Some(raw)
    }

    fn finish(&mut self, out: &mut Vec<OutputEvent>) {
        match self.call.take() {
            // The answer ended inside a call (a forced call ends without its closing
            // tag): completed from what was generated, as at its close.
            Some(close) => {
                // Up to a closing tag the answer stopped inside of.
                let n = match (close, scan(&self.buf, CLOSE)) {
                    (Close::Tag, Scan::Safe(n)) => n,
                    _ => self.buf.len(),
                };
                let tag = self.buf[n..].to_string();
                self.finish_call(n, |b| close.as_text(b) + &tag, out);
                self.buf.clear();
            }
            None => {
                let rest = std::mem::take(&mut self.buf);
                let rest = if self.skip_fence {
                    rest.trim_start().trim_start_matches("```").to_string()
                } else {
                    rest
                };
                self.emit_text(&rest, out);
            }
        }
        if self.calls == 0 && !self.pending_ws.is_empty() {
            out.push(OutputEvent::Text(std::mem::take(&mut self.pending_ws)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::collect::Collected;

    fn parse(pieces: &[&str]) -> (Collected, Vec<OutputEvent>) {
        let mut p = HermesParser::new();
        let mut events = Vec::new();
        for piece in pieces {
            p.push(piece, &mut events);
        }
        p.finish(&mut events);
        let mut c = Collected::default();
        c.extend(events.clone());
        (c, events)
    }

    /// [`parse`] with the text fed one character at a time.
    fn parse_chars(text: &str) -> (Collected, Vec<OutputEvent>) {
        let pieces: Vec<String> = text.chars().map(|c| c.to_string()).collect();
        let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
        parse(&refs)
    }

    #[test]
    fn streams_name_then_argument_deltas() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
        let (c, events) = parse_chars(text);
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        assert_eq!(
            c.tool_calls[0].arguments,
            "{\"city\": \"Paris\", \"days\": 3}"
        );
        let deltas = events
            .iter()
            .filter(|e| matches!(e, OutputEvent::ToolCallArgs { .. }))
            .count();
        assert!(deltas > 5, "arguments were not streamed: {deltas} deltas");
        assert_eq!(
            events.first(),
            Some(&OutputEvent::ToolCallBegin {
                index: 0,
                name: "get_weather".into()
            })
        );
        assert_eq!(events.last(), Some(&OutputEvent::ToolCallEnd { index: 0 }));
    }

    #[test]
    fn text_and_two_calls() {
        let (c, _) = parse(&[
            "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n",
            "<tool_call>\n{\"arguments\": {\"x\": 1}, \"name\": \"b\"}\n</tool_call>\n",
        ]);
        assert_eq!(c.text, "Let me check.\n");
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(
            (
                c.tool_calls[1].name.as_str(),
                c.tool_calls[1].arguments.as_str()
            ),
            ("b", "{\"x\": 1}")
        );
    }

    #[test]
    fn string_arguments_and_parameters_key() {
        let (c, _) =
            parse(&["<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"q\\\": 2}\"}</tool_call>"]);
        assert_eq!(c.tool_calls[0].arguments, "{\"q\": 2}");
        let (c, _) =
            parse(&["<tool_call>{\"name\": \"a\", \"parameters\": {\"q\": 2}}</tool_call>"]);
        assert_eq!(c.tool_calls[0].arguments, "{\"q\": 2}");
    }

    #[test]
    fn a_call_the_answer_ends_in_is_completed() {
        // A forced call: the prompt ends with the call's opening, the model writes the
        // rest and stops without the closing tag.
        let (c, _) = parse(&["<tool_call>\n{\"name\": \"f\", \"arguments\":", " \"{}\"}"]);
        assert_eq!(
            (
                c.tool_calls[0].name.as_str(),
                c.tool_calls[0].arguments.as_str()
            ),
            ("f", "{}")
        );
        let (c, _) = parse(&["<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_c"]);
        assert_eq!(c.tool_calls[0].arguments, "{}");
        assert_eq!(c.text, "");
    }

    #[test]
    fn malformed_call_is_text() {
        let (c, _) = parse(&["<tool_call>not json</tool_call> ok"]);
        assert_eq!(c.text, "<tool_call>not json</tool_call> ok");
        assert!(c.tool_calls.is_empty());
        let (c, _) = parse(&["<tool_call>not json</tool_c"]);
        assert_eq!(c.text, "<tool_call>not json</tool_c");
        let (c, _) = parse(&["<tool_call>{\"na"]);
        assert_eq!(c.text, "<tool_call>{\"na");
    }

    #[test]
    fn truncated_call_is_closed() {
        let (c, events) = parse(&["<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": "]);
        assert_eq!(c.tool_calls[0].arguments, "{\"x\": ");
        assert_eq!(events.last(), Some(&OutputEvent::ToolCallEnd { index: 0 }));
    }

    #[test]
    fn plain_text_passes_through() {
        let (c, _) = parse(&["Hello <b>world</b>", " <tool", "s> are fine"]);
        assert_eq!(c.text, "Hello <b>world</b> <tools> are fine");
    }

    #[test]
    fn bare_and_fenced_calls() {
        let bare = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
        let (c, events) = parse_chars(bare);
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
        assert!(
            events
                .iter()
                .filter(|e| matches!(e, OutputEvent::ToolCallArgs { .. }))
                .count()
                > 3
        );
        let (c, _) = parse(&["\n```json\n{\"name\": \"a\", \"arguments\": {}}\n```\n"]);
        assert_eq!((c.text.as_str(), c.tool_calls.len()), ("", 1));
        let (c, _) = parse(&[
            "{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {\"x\": 1}}",
        ]);
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(c.tool_calls[1].name, "b");
    }

    #[test]
    fn other_json_and_later_objects_stay_text() {
        let (c, _) = parse(&["{\"answer\": 42}"]);
        assert_eq!(
            (c.text.as_str(), c.tool_calls.len()),
            ("{\"answer\": 42}", 0)
        );
        let (c, _) = parse(&["Here: {\"name\": \"a\"}"]);
        assert_eq!(
            (c.text.as_str(), c.tool_calls.len()),
            ("Here: {\"name\": \"a\"}", 0)
        );
        let (c, _) = parse(&["```python\nprint(1)\n```"]);
        assert_eq!(c.text, "```python\nprint(1)\n```");
        let (c, _) = parse(&["{\"name\": \"a\", \"argu"]);
        assert_eq!(c.tool_calls.len(), 1, "a begun call is closed at the end");
    }
}
