//! Collects output events into a whole message (for non-streaming responses), keeping
//! the order in which answer text and tool calls were generated.

use super::OutputEvent;

/// A tool call, complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedCall {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// One part of the answer, in generation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    /// Index into [`Collected::tool_calls`].
    Call(usize),
}

/// A whole generated message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    /// All answer text.
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<CollectedCall>,
    /// Answer text and calls in the order they were generated.
    pub parts: Vec<Part>,
    /// The call begun and not yet ended, if any.
    open: Option<usize>,
}

impl Collected {
    /// Adds events in order.
    pub fn extend(&mut self, events: impl IntoIterator<Item = OutputEvent>) {
        for e in events {
            match e {
                OutputEvent::Text(t) => self.push_text(&t),
                OutputEvent::Reasoning(t) => self.reasoning.push_str(&t),
                OutputEvent::ToolCallBegin { name, .. } => {
                    self.open = Some(self.tool_calls.len());
                    self.parts.push(Part::Call(self.tool_calls.len()));
                    self.tool_calls.push(CollectedCall {
                        name,
                        arguments: String::new(),
                    });
                }
                OutputEvent::ToolCallArgs { index, delta } => {
                    if let Some(c) = self.tool_calls.get_mut(index) {
                        c.arguments.push_str(&delta);
                    }
                }
                OutputEvent::ToolCallEnd { .. } => self.open = None,
            }
        }
    }

    fn push_text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        self.text.push_str(t);
        match self.parts.last_mut() {
            Some(Part::Text(s)) => s.push_str(t),
            _ => self.parts.push(Part::Text(t.to_string())),
        }
    }

    /// The answer was cut inside a tool call whose raw text is `raw` (see
    /// `OutputParser::finish_cut`): a call begun for it is dropped and the text is
    /// kept as answer text.
    pub fn cut_call(&mut self, raw: &str) {
        if let Some(i) = self.open.take()
            && i + 1 == self.tool_calls.len()
        {
            self.tool_calls.pop();
            self.parts.retain(|p| *p != Part::Call(i));
        }
        self.push_text(raw);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{OutputParser, ToolFormat};

    #[test]
    fn text_after_a_call_stays_after_it() {
        let mut p = OutputParser::new(false, Some(ToolFormat::Hermes));
        let mut c = Collected::default();
        c.extend(
            p.push("Let me look.<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
        );
        c.extend(p.push("Done."));
        c.extend(p.finish());
        assert_eq!(
            c.parts,
            vec![
                Part::Text("Let me look.".into()),
                Part::Call(0),
                Part::Text("Done.".into())
            ]
        );
    }

    #[test]
    fn a_cut_call_becomes_text() {
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"path\": \"src/ma";
        for format in [ToolFormat::Hermes, ToolFormat::Glm] {
            let text = match format {
                ToolFormat::Hermes => text.to_string(),
                ToolFormat::Glm => "<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call><tool_call>b<arg_key>path</arg_key><arg_value>src/ma".to_string(),
            };
            let mut p = OutputParser::new(false, Some(format));
            let mut c = Collected::default();
            for ch in text.chars() {
                c.extend(p.push(&ch.to_string()));
            }
            let (events, raw) = p.finish_cut();
            c.extend(events);
            let raw = raw.expect("an open call");
            c.cut_call(&raw);
            assert_eq!(c.tool_calls.len(), 1, "{format:?}: {c:?}");
            assert_eq!(c.tool_calls[0].name, "a");
            let second = text.rfind("<tool_call>").unwrap();
            assert_eq!(c.text.trim_start(), &text[second..], "{format:?}");
        }
    }
}
