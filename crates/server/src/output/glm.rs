//! The GLM tool-call format (GLM-4.5 … GLM-5, `glm5next`):
//! `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`, with or
//! without newlines between the parts, any number of calls.
//!
//! String arguments are written raw and other values as JSON (the chat template's
//! convention), so a value that parses as JSON is passed on as that JSON and anything
//! else as a JSON string (a string argument spelled like a JSON literal, `"42"`, comes
//! out as the literal: the format cannot tell them apart without the tool's schema).
//! The call's name is reported when it is complete (at its first `<arg_key>` or at
//! `</tool_call>`); the arguments object is streamed one argument at a time, as each
//! `</arg_value>` arrives. A call that never got a name is released as text at the end;
//! one left open is closed. Whitespace right before a call and at the end is dropped.

use super::{OutputEvent, ToolCallParser};
use crate::holdback::{Scan, scan};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY_OPEN: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE_OPEN: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";

/// Where the parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Outside calls.
    Text,
    /// Inside a call, before its name is complete.
    Name,
    /// Inside a call, between arguments.
    Args,
}

/// The streaming parser.
#[derive(Debug)]
pub struct GlmParser {
    mode: Mode,
    /// Unconsumed input of the current mode.
    buf: String,
    /// Calls begun.
    calls: usize,
    /// Arguments sent for the current call.
    args: usize,
    /// Trailing whitespace held until we know whether a call follows.
    pending_ws: String,
    /// The whitespace dropped before the current call (restored if it is released as
    /// text).
    ws_before_call: String,
    /// The current call's text consumed so far, its opening included.
    call_raw: String,
}

impl Default for GlmParser {
    fn default() -> Self {
        GlmParser {
            mode: Mode::Text,
            buf: String::new(),
            calls: 0,
            args: 0,
            pending_ws: String::new(),
            ws_before_call: String::new(),
            call_raw: String::new(),
        }
    }
}

/// A value as JSON text: itself when it parses as JSON, else a JSON string.
fn value_json(raw: &str) -> String {
    let t = raw.trim();
    match serde_json::from_str::<serde_json::Value>(t) {
        Ok(v) if !t.is_empty() => serde_json::to_string(&v).unwrap_or_else(|_| t.to_string()),
        _ => serde_json::Value::String(raw.to_string()).to_string(),
    }
}

/// Whether `buf` (after leading whitespace) could still grow into `tag`.
fn could_be(buf: &str, tag: &str) -> bool {
    let t = buf.trim_start();
    t.len() < tag.len() && tag.starts_with(t)
}

impl GlmParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Passes text on, holding back trailing whitespace until non-whitespace text
    /// follows (whitespace before a call or at the end is dropped), so the result does
    /// not depend on how the text was split into pieces.
    fn emit_text(&mut self, t: &str, out: &mut Vec<OutputEvent>) {
        let body = t.trim_end();
        if body.is_empty() {
            self.pending_ws.push_str(t);
            return;
        }
        let mut s = std::mem::take(&mut self.pending_ws);
        s.push_str(body);
        out.push(OutputEvent::Text(s));
        self.pending_ws.push_str(&t[body.len()..]);
    }

    fn index(&self) -> usize {
        self.calls - 1
    }

    /// Ends the current call (closing its arguments object).
    fn end_call(&mut self, out: &mut Vec<OutputEvent>) {
        let delta = if self.args == 0 { "{}" } else { "}" };
        out.push(OutputEvent::ToolCallArgs {
            index: self.index(),
            delta: delta.into(),
        });
        out.push(OutputEvent::ToolCallEnd {
            index: self.index(),
        });
        self.mode = Mode::Text;
        self.call_raw.clear();
    }

    /// Consumes as much of `buf` as the current mode can decide.
    fn step(&mut self, out: &mut Vec<OutputEvent>) -> bool {
        match self.mode {
            Mode::Text => match scan(&self.buf, OPEN) {
                Scan::Found(p) => {
                    let before = self.buf[..p].to_string();
                    self.emit_text(&before, out);
                    self.ws_before_call = std::mem::take(&mut self.pending_ws);
                    self.buf.drain(..p + OPEN.len());
                    self.call_raw = OPEN.to_string();
                    self.mode = Mode::Name;
                    true
                }
                Scan::Safe(n) => {
                    let t: String = self.buf.drain(..n).collect();
                    self.emit_text(&t, out);
                    false
                }
            },
            Mode::Name => {
                let end = [KEY_OPEN, CLOSE]
                    .iter()
                    .filter_map(|t| self.buf.find(t))
                    .min();
                let Some(end) = end else { return false };
                let name = self.buf[..end].trim().to_string();
                self.call_raw.extend(self.buf.drain(..end));
                self.calls += 1;
                self.args = 0;
                out.push(OutputEvent::ToolCallBegin {
                    index: self.index(),
                    name,
                });
                self.mode = Mode::Args;
                true
            }
            Mode::Args => {
                let t = self.buf.trim_start();
                let lead = self.buf.len() - t.len();
                if t.starts_with(CLOSE) {
                    self.buf.drain(..lead + CLOSE.len());
                    self.end_call(out);
                    return true;
                }
                if t.starts_with(KEY_OPEN) {
                    let Some(kc) = t.find(KEY_CLOSE) else {
                        return false;
                    };
                    let key = t[KEY_OPEN.len()..kc].trim().to_string();
                    let rest = t[kc + KEY_CLOSE.len()..].trim_start();
                    let (value, consumed) = if let Some(body) = rest.strip_prefix(VALUE_OPEN) {
                        let Some(vc) = body.find(VALUE_CLOSE) else {
                            return false;
                        };
                        (
                            value_json(&body[..vc]),
                            self.buf.len() - body.len() + vc + VALUE_CLOSE.len(),
                        )
                    } else if could_be(rest, VALUE_OPEN) {
                        return false;
                    } else {
                        // A key without a value: an empty string.
                        ("\"\"".to_string(), self.buf.len() - rest.len())
                    };
                    self.push_arg(&key, &value, out);
                    self.call_raw.extend(self.buf.drain(..consumed));
                    return true;
                }
                if t.is_empty() || could_be(t, CLOSE) || could_be(t, KEY_OPEN) {
                    return false;
                }
                // Something else inside a call: end the call, the rest is text.
                self.end_call(out);
                true
            }
        }
    }

    fn push_arg(&mut self, key: &str, value: &str, out: &mut Vec<OutputEvent>) {
        let sep = if self.args == 0 { "{" } else { ", " };
        let delta = format!(
            "{sep}{}: {value}",
            serde_json::Value::String(key.to_string())
        );
        out.push(OutputEvent::ToolCallArgs {
            index: self.index(),
            delta,
        });
        self.args += 1;
    }
}

impl ToolCallParser for GlmParser {
    fn push(&mut self, text: &str, out: &mut Vec<OutputEvent>) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    fn take_open_call(&mut self) -> Option<String> {
        if self.mode == Mode::Text {
            return None;
        }
        self.mode = Mode::Text;
        let mut raw = std::mem::take(&mut self.call_raw);
        raw.push_str(&std::mem::take(&mut self.buf));
        Some(raw)
    }

    fn finish(&mut self, out: &mut Vec<OutputEvent>) {
        while self.step(out) {}
        match self.mode {
            Mode::Text => {
                let t = std::mem::take(&mut self.buf);
                self.emit_text(&t, out);
            }
            Mode::Name => {
                let t = format!(
                    "{}{OPEN}{}",
                    std::mem::take(&mut self.ws_before_call),
                    std::mem::take(&mut self.buf)
                );
                self.emit_text(&t, out);
            }
            Mode::Args => {
                self.buf.clear();
                self.end_call(out);
            }
        }
        self.pending_ws.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::collect::Collected;

    fn parse_pieces(text: &str, piece: usize) -> Collected {
        let mut p = GlmParser::new();
        let mut out = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for c in chars.chunks(piece) {
            p.push(&c.iter().collect::<String>(), &mut out);
        }
        p.finish(&mut out);
        let mut col = Collected::default();
        col.extend(out);
        col
    }

    fn parse(text: &str) -> Collected {
        let a = parse_pieces(text, 1);
        for piece in [2, 5, 1000] {
            assert_eq!(parse_pieces(text, piece), a, "piece size {piece}");
        }
        a
    }

    #[test]
    fn one_call_with_newlines() {
        let c = parse(
            "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        );
        assert_eq!(c.text, "Let me check.");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        assert_eq!(c.tool_calls[0].arguments, r#"{"city": "Paris", "days": 3}"#);
    }

    #[test]
    fn two_compact_calls_and_json_values() {
        let c = parse(
            "<tool_call>a<arg_key>x</arg_key><arg_value>{\"k\": [1, true]}</arg_value></tool_call><tool_call>b</tool_call>",
        );
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls.len(), 2);
        assert_eq!(c.tool_calls[0].arguments, r#"{"x": {"k":[1,true]}}"#);
        assert_eq!(
            (
                c.tool_calls[1].name.as_str(),
                c.tool_calls[1].arguments.as_str()
            ),
            ("b", "{}")
        );
    }

    #[test]
    fn strings_are_escaped_and_multiline() {
        let c = parse(
            "<tool_call>write<arg_key>text</arg_key><arg_value>line \"1\"\nline 2</arg_value></tool_call>",
        );
        assert_eq!(
            c.tool_calls[0].arguments,
            r#"{"text": "line \"1\"\nline 2"}"#
        );
        let v: serde_json::Value = serde_json::from_str(&c.tool_calls[0].arguments).unwrap();
        assert_eq!(v["text"], "line \"1\"\nline 2");
    }

    #[test]
    fn unterminated_and_false_starts() {
        let c = parse("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].arguments, r#"{"a": 1}"#);
        let c = parse("a <tool_ thing and <tool_call>never named");
        assert_eq!(c.text, "a <tool_ thing and <tool_call>never named");
        assert!(c.tool_calls.is_empty());
    }

    #[cfg(feature = "engine")]
    #[test]
    fn round_trip_through_the_builtin_template() {
        use ds4_tokenizer::{ChatMessage, ChatTemplate, RenderOptions, ToolCall};
        let src = include_str!("../../../tokenizer/templates/glm5.jinja");
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert!(t.uses_tools() && t.object_arguments());
        let call = ToolCall {
            id: None,
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris", "days": 3, "units": {"t": "C"}}"#.into(),
        };
        let msgs = vec![
            ChatMessage::new("user", "Weather?"),
            ChatMessage {
                role: "assistant".into(),
                content: Some(String::new()),
                reasoning_content: Some("need the tool".into()),
                tool_calls: vec![call.clone()],
                ..ChatMessage::default()
            },
        ];
        let text = t.render(&msgs, &RenderOptions::default()).unwrap();
        let answer = text.split("<|assistant|>").nth(1).unwrap();
        assert!(answer.starts_with("<think>need the tool</think>"), "{text}");
        let mut p = crate::output::OutputParser::new(false, None);
        let mut col = Collected::default();
        col.extend(p.push(answer));
        col.extend(p.finish());
        assert_eq!(col.reasoning, "need the tool");
        let c = parse(&col.text);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        let got: serde_json::Value = serde_json::from_str(&c.tool_calls[0].arguments).unwrap();
        let want: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
        assert_eq!(got, want);
    }

    #[cfg(feature = "engine")]
    #[test]
    fn builtin_template_renders_a_tool_conversation() {
        use ds4_tokenizer::{ChatMessage, ChatTemplate, RenderOptions, ToolCall};
        let t = ChatTemplate::new(
            include_str!("../../../tokenizer/templates/glm5.jinja"),
            "",
            "",
        )
        .unwrap();
        let tools = vec![
            serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {}}}),
        ];
        let msgs = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage {
                role: "assistant".into(),
                content: Some("Calling.".into()),
                reasoning_content: Some("old thought".into()),
                tool_calls: vec![ToolCall {
                    id: None,
                    name: "f".into(),
                    arguments: r#"{"a": "x", "b": 2}"#.into(),
                }],
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: Some("ok".into()),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: Some("ok2".into()),
                ..ChatMessage::default()
            },
            ChatMessage::new("user", "Thanks"),
        ];
        let opts = RenderOptions {
            tools: Some(tools),
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let text = t.render(&msgs, &opts).unwrap();
        let tail = "<|system|>Be brief.<|user|>Hi<|assistant|></think>Calling.\
                    <tool_call>f<arg_key>a</arg_key><arg_value>x</arg_value><arg_key>b</arg_key><arg_value>2</arg_value></tool_call>\
                    <|observation|><tool_response>ok</tool_response><tool_response>ok2</tool_response>\
                    <|user|>Thanks<|assistant|><think>";
        assert!(
            text.starts_with("[gMASK]<sop><|system|>\n# Tools\n"),
            "{text}"
        );
        assert!(text.contains("<tools>\n{\"type\": \"function\""), "{text}");
        assert!(text.ends_with(tail), "{text}");
        let no_think = RenderOptions {
            enable_thinking: false,
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        let text = t
            .render(&[ChatMessage::new("user", "Hi")], &no_think)
            .unwrap();
        assert_eq!(text, "[gMASK]<sop><|user|>Hi<|assistant|></think>");
    }
}
