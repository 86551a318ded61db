//! The Qwen/Hermes tool-call format:
//! `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`, any number of calls.
//!
//! The call's name is reported as soon as its JSON string is complete, and the
//! `arguments` value is streamed as raw JSON text while it is generated (so an OpenAI
//! client sees argument deltas). `parameters` is accepted for `arguments`; arguments
//! given as a JSON string are passed on as that string's content. A call whose body is
//! not a JSON object with a string `name` is released as text when nothing of it was
//! reported yet. Whitespace-only text around calls is dropped.

use super::json_scan::{TopLevelScan, ValueKind};
use super::{OutputEvent, ToolCallParser};
use crate::holdback::{Scan, scan};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The streaming parser.
#[derive(Debug, Default)]
pub struct HermesParser {
    /// Text mode: unreleased text; call mode: the call's body so far.
    buf: String,
    in_call: bool,
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

fn args_field(scan: &TopLevelScan) -> Option<&super::json_scan::Field> {
    scan.field("arguments").or_else(|| scan.field("parameters"))
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
        let mut s = std::mem::take(&mut self.pending_ws);
        s.push_str(t);
        out.push(OutputEvent::Text(s));
    }

    /// Reports what the scan of the body (up to `limit` bytes) has made known.
    fn stream_call(&mut self, limit: usize, out: &mut Vec<OutputEvent>) {
        self.scan.feed(&self.buf[..limit]);
        if !self.begun {
            let name = self.scan.field("name").filter(|f| f.kind == ValueKind::String).and_then(|f| f.end.map(|e| (f.start, e)));
            match name.and_then(|(s, e)| serde_json::from_str::<String>(&self.buf[s..e]).ok()) {
                Some(name) => {
                    out.push(OutputEvent::ToolCallBegin { index: self.calls, name });
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
                out.push(OutputEvent::ToolCallArgs { index: self.calls, delta: self.buf[from..end].to_string() });
                self.sent = end - f.start;
            }
        }
    }

    /// Completes the current call from its whole body.
    fn finish_call(&mut self, body_len: usize, out: &mut Vec<OutputEvent>) {
        self.stream_call(body_len, out);
        let body = &self.buf[..body_len];
        let parsed = serde_json::from_str::<serde_json::Value>(body.trim()).ok();
        let call = parsed.as_ref().and_then(|v| {
            let name = v.get("name")?.as_str()?.to_string();
            let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(serde_json::json!({}));
            Some((name, args))
        });
        match call {
            Some((name, args)) => {
                let full = match &args {
                    serde_json::Value::String(s) => s.clone(),
                    _ => match args_field(&self.scan).and_then(|f| f.end.map(|e| &body[f.start..e])) {
                        Some(raw) => raw.to_string(),
                        None => serde_json::to_string(&args).unwrap_or_default(),
                    },
                };
                if !self.begun {
                    out.push(OutputEvent::ToolCallBegin { index: self.calls, name });
                    self.begun = true;
                }
                if self.sent < full.len() && full.is_char_boundary(self.sent) {
                    out.push(OutputEvent::ToolCallArgs { index: self.calls, delta: full[self.sent..].to_string() });
                }
                out.push(OutputEvent::ToolCallEnd { index: self.calls });
                self.calls += 1;
            }
            None if self.begun => {
                out.push(OutputEvent::ToolCallEnd { index: self.calls });
                self.calls += 1;
            }
            None => {
                let raw = format!("{OPEN}{body}{CLOSE}");
                self.emit_text(&raw, out);
            }
        }
        self.in_call = false;
        self.begun = false;
        self.sent = 0;
        self.scan = TopLevelScan::new();
    }
}

impl ToolCallParser for HermesParser {
    fn push(&mut self, text: &str, out: &mut Vec<OutputEvent>) {
        self.buf.push_str(text);
        loop {
            if !self.in_call {
                match scan(&self.buf, OPEN) {
                    Scan::Found(pos) => {
                        let before = self.buf[..pos].to_string();
                        self.buf.drain(..pos + OPEN.len());
                        self.emit_text(&before, out);
                        self.pending_ws.clear();
                        self.in_call = true;
                    }
                    Scan::Safe(n) => {
                        let before: String = self.buf.drain(..n).collect();
                        self.emit_text(&before, out);
                        return;
                    }
                }
            } else {
                match scan(&self.buf, CLOSE) {
                    Scan::Found(pos) => {
                        self.finish_call(pos, out);
                        self.buf.drain(..pos + CLOSE.len());
                    }
                    Scan::Safe(n) => {
                        self.stream_call(n, out);
                        return;
                    }
                }
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<OutputEvent>) {
        if self.in_call {
            if self.begun {
                let n = self.buf.len();
                self.stream_call(n, out);
                out.push(OutputEvent::ToolCallEnd { index: self.calls });
                self.calls += 1;
            } else {
                let raw = format!("{OPEN}{}", self.buf);
                self.emit_text(&raw, out);
            }
            self.buf.clear();
            self.in_call = false;
        } else {
            let rest = std::mem::take(&mut self.buf);
            self.emit_text(&rest, out);
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

    fn chars(s: &str) -> Vec<String> {
        s.chars().map(|c| c.to_string()).collect()
    }

    #[test]
    fn streams_name_then_argument_deltas() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
        let pieces = chars(text);
        let refs: Vec<&str> = pieces.iter().map(|s| s.as_str()).collect();
        let (c, events) = parse(&refs);
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        assert_eq!(c.tool_calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}");
        let deltas = events.iter().filter(|e| matches!(e, OutputEvent::ToolCallArgs { .. })).count();
        assert!(deltas > 5, "arguments were not streamed: {deltas} deltas");
        assert_eq!(events.first(), Some(&OutputEvent::ToolCallBegin { index: 0, name: "get_weather".into() }));
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
        assert_eq!((c.tool_calls[1].name.as_str(), c.tool_calls[1].arguments.as_str()), ("b", "{\"x\": 1}"));
    }

    #[test]
    fn string_arguments_and_parameters_key() {
        let (c, _) = parse(&["<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"q\\\": 2}\"}</tool_call>"]);
        assert_eq!(c.tool_calls[0].arguments, "{\"q\": 2}");
        let (c, _) = parse(&["<tool_call>{\"name\": \"a\", \"parameters\": {\"q\": 2}}</tool_call>"]);
        assert_eq!(c.tool_calls[0].arguments, "{\"q\": 2}");
    }

    #[test]
    fn malformed_call_is_text() {
        let (c, _) = parse(&["<tool_call>not json</tool_call> ok"]);
        assert_eq!(c.text, "<tool_call>not json</tool_call> ok");
        assert!(c.tool_calls.is_empty());
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
}
