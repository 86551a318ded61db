//! From generated text to structured output: reasoning split off (`<think>…</think>`),
//! tool calls parsed into names and argument deltas, the rest as answer text.
//!
//! The pipeline is streaming: text arrives in arbitrary pieces and every parser holds
//! back only what might begin a tag. Tool-call formats plug in behind
//! [`ToolCallParser`]; [`ToolFormat`] names the formats and picks one from a chat
//! template. Implemented: Qwen/Hermes `<tool_call>{json}</tool_call>`
//! ([`hermes::HermesParser`]) and GLM's
//! `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`
//! ([`glm::GlmParser`]). DeepSeek's DSML would be one more implementation of the trait.

pub mod collect;
pub mod glm;
pub mod hermes;
pub mod json_scan;
pub mod reasoning;

use reasoning::ReasoningSplitter;

/// One piece of structured output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputEvent {
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Reasoning(String),
    /// Tool call number `index` (from 0) begins; its function name.
    ToolCallBegin { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text); the deltas of a call concatenate
    /// to its complete arguments.
    ToolCallArgs { index: usize, delta: String },
    /// Call `index` is complete.
    ToolCallEnd { index: usize },
}

/// A streaming parser of one tool-call format. It sees answer text only (reasoning is
/// split off before) and passes text outside tool calls through as
/// [`OutputEvent::Text`].
pub trait ToolCallParser: Send {
    /// Feeds the next piece of text, appending events to `out`.
    fn push(&mut self, text: &str, out: &mut Vec<OutputEvent>);
    /// Ends the stream: held text is released, an unterminated call is closed (or,
    /// when it never became a call, released as text).
    fn finish(&mut self, out: &mut Vec<OutputEvent>);
    /// When the text ends inside a call (the stream was cut, e.g. by `max_tokens`): the
    /// call's raw text, its opening included, which the parser then forgets, so that
    /// [`ToolCallParser::finish`] neither closes it nor releases it again.
    fn take_open_call(&mut self) -> Option<String>;
}

/// The tool-call formats the server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Qwen 2.5/3, Hermes,
    /// and the format the server itself describes to templates without tool support).
    Hermes,
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>` (GLM-4.5
    /// and later, GLM-5).
    Glm,
}

impl ToolFormat {
    /// The format a chat template's source uses; Hermes when it names none.
    pub fn detect(template_source: &str) -> ToolFormat {
        if template_source.contains("<arg_key>") {
            ToolFormat::Glm
        } else {
            ToolFormat::Hermes
        }
    }

    /// The text that opens the answer when the request forces a tool call (`None`: no
    /// forcing): the format's call opening, with the function's name when one is
    /// named. The model generates the rest of the call from there; there is no
    /// constrained decoding beyond that (a model may still write a name that is not
    /// among the tools, or malformed arguments).
    pub fn forced_lead(self, choice: &crate::api::common::ToolChoice) -> Option<String> {
        use crate::api::common::ToolChoice::{Function, Required};
        match (self, choice) {
            (ToolFormat::Hermes, Required) => Some("<tool_call>\n{\"name\": \"".into()),
            // No space after the colon: the model writes it with the value (` {`), as
            // the template renders the call back.
            (ToolFormat::Hermes, Function(name)) => Some(format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\":",
                serde_json::Value::from(name.as_str())
            )),
            (ToolFormat::Glm, Required) => Some("<tool_call>".into()),
            (ToolFormat::Glm, Function(name)) => Some(format!("<tool_call>{name}")),
            _ => None,
        }
    }

    /// The text that closes a call.
    pub fn call_close(self) -> &'static str {
        "</tool_call>"
    }

    /// A fresh parser for this format.
    pub fn parser(self) -> Box<dyn ToolCallParser> {
        match self {
            ToolFormat::Hermes => Box::new(hermes::HermesParser::new()),
            ToolFormat::Glm => Box::new(glm::GlmParser::new()),
        }
    }
}

/// Reasoning tags of the model families served (`<think>…</think>`).
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// The whole output pipeline of one generation.
pub struct OutputParser {
    /// `None`: raw text (no reasoning split).
    reasoning: Option<ReasoningSplitter>,
    tools: Option<Box<dyn ToolCallParser>>,
    /// Text the prompt put at the start of the answer (a forced tool call's opening),
    /// parsed before the first generated piece.
    lead: Option<String>,
    /// Tool calls past this many are dropped (`parallel_tool_calls: false`).
    max_calls: Option<usize>,
}

impl OutputParser {
    /// `starts_in_reasoning`: the prompt already opened a reasoning block (the template
    /// ended with `<think>`). `tools`: parse tool calls in this format (`None`: tool
    /// calls are plain text).
    pub fn new(starts_in_reasoning: bool, tools: Option<ToolFormat>) -> Self {
        OutputParser {
            reasoning: Some(ReasoningSplitter::new(
                THINK_OPEN,
                THINK_CLOSE,
                starts_in_reasoning,
            )),
            tools: tools.map(ToolFormat::parser),
            lead: None,
            max_calls: None,
        }
    }

    /// The same, with `lead` (text the prompt ends with, part of the answer) parsed as
    /// if it had been generated first.
    pub fn with_lead(mut self, lead: Option<String>) -> Self {
        self.lead = lead;
        self
    }

    /// The same, keeping at most `max` tool calls (`None`: all).
    pub fn with_max_calls(mut self, max: Option<usize>) -> Self {
        self.max_calls = max;
        self
    }

    /// A pass-through parser: all output is answer text (raw completions).
    pub fn plain() -> Self {
        OutputParser {
            reasoning: None,
            tools: None,
            lead: None,
            max_calls: None,
        }
    }

    /// Feeds generated text; returns the events it completes.
    pub fn push(&mut self, text: &str) -> Vec<OutputEvent> {
        let mut out = Vec::new();
        let led;
        let text = match self.lead.take() {
            Some(lead) => {
                led = lead + text;
                led.as_str()
            }
            None => text,
        };
        let pieces = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => vec![reasoning::Piece::Answer(text.to_string())],
        };
        self.route(pieces, &mut out);
        self.limit(&mut out);
        out
    }

    /// Ends the stream.
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        self.finish_inner(false).0
    }

    /// Ends a stream that was cut (by `max_tokens` or the context): as
    /// [`OutputParser::finish`], except that a tool call left open is not closed: its
    /// raw text comes back as the second value (the caller turns it into text, so no
    /// generated text is lost and no incomplete call is reported as a call).
    pub fn finish_cut(&mut self) -> (Vec<OutputEvent>, Option<String>) {
        self.finish_inner(true)
    }

    fn finish_inner(&mut self, cut: bool) -> (Vec<OutputEvent>, Option<String>) {
        let mut out = if self.lead.is_some() {
            self.push("")
        } else {
            Vec::new()
        };
        let pieces = self
            .reasoning
            .as_mut()
            .map(ReasoningSplitter::finish)
            .unwrap_or_default();
        self.route(pieces, &mut out);
        let mut open = None;
        if let Some(t) = &mut self.tools {
            if cut {
                open = t.take_open_call();
            }
            t.finish(&mut out);
        }
        self.limit(&mut out);
        (out, open)
    }

    /// Drops the events of calls past `max_calls`.
    fn limit(&self, out: &mut Vec<OutputEvent>) {
        if let Some(max) = self.max_calls {
            out.retain(|e| match e {
                OutputEvent::ToolCallBegin { index, .. }
                | OutputEvent::ToolCallArgs { index, .. }
                | OutputEvent::ToolCallEnd { index } => *index < max,
                OutputEvent::Text(_) | OutputEvent::Reasoning(_) => true,
            });
        }
    }

    fn route(&mut self, pieces: Vec<reasoning::Piece>, out: &mut Vec<OutputEvent>) {
        for p in pieces {
            match p {
                reasoning::Piece::Reasoning(t) => out.push(OutputEvent::Reasoning(t)),
                reasoning::Piece::Answer(t) => match &mut self.tools {
                    Some(parser) => parser.push(&t, out),
                    None => out.push(OutputEvent::Text(t)),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collect::Collected;

    #[test]
    fn detects_the_glm_format_from_its_template() {
        let glm = include_str!("../../../tokenizer/templates/glm5.jinja");
        assert_eq!(ToolFormat::detect(glm), ToolFormat::Glm);
        assert_eq!(
            ToolFormat::detect("{{ '<tool_call>' }}"),
            ToolFormat::Hermes
        );
        let mut p = OutputParser::new(false, Some(ToolFormat::Glm));
        let events = p.push(
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
        );
        assert!(
            events.contains(&OutputEvent::ToolCallBegin {
                index: 0,
                name: "get_weather".into()
            }),
            "{events:?}"
        );
    }

    #[test]
    fn reasoning_then_tool_call_in_tiny_pieces() {
        let text = "<think>\nweather needed\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let mut p = OutputParser::new(false, Some(ToolFormat::Hermes));
        let mut c = Collected::default();
        for ch in text.chars() {
            c.extend(p.push(&ch.to_string()));
        }
        c.extend(p.finish());
        assert_eq!(c.reasoning, "weather needed\n");
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        assert_eq!(c.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
    }

    fn collect_all(mut p: OutputParser, pieces: &[&str]) -> Collected {
        let mut c = Collected::default();
        for t in pieces {
            c.extend(p.push(t));
        }
        c.extend(p.finish());
        c
    }

    #[test]
    fn a_forced_lead_is_parsed_as_the_start_of_the_answer() {
        use crate::api::common::ToolChoice;
        let required = ToolFormat::Hermes.forced_lead(&ToolChoice::Required);
        assert_eq!(required.as_deref(), Some("<tool_call>\n{\"name\": \""));
        let p = OutputParser::new(false, Some(ToolFormat::Hermes)).with_lead(required);
        let c = collect_all(
            p,
            &[
                "get_",
                "weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            ],
        );
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        assert_eq!(c.tool_calls[0].arguments, "{\"city\": \"Paris\"}");

        // A named function: the name (JSON-escaped) is in the lead.
        let named = ToolChoice::Function("say \"hi\"".into());
        let lead = ToolFormat::Hermes.forced_lead(&named);
        assert_eq!(
            lead.as_deref(),
            Some("<tool_call>\n{\"name\": \"say \\\"hi\\\"\", \"arguments\":")
        );
        let p = OutputParser::new(false, Some(ToolFormat::Hermes)).with_lead(lead);
        let c = collect_all(p, &[" {}}\n</tool_call>"]);
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "say \"hi\"");
        assert_eq!(c.tool_calls[0].arguments, "{}");

        // GLM.
        let lead = ToolFormat::Glm.forced_lead(&ToolChoice::Function("f".into()));
        assert_eq!(lead.as_deref(), Some("<tool_call>f"));
        let p = OutputParser::new(false, Some(ToolFormat::Glm)).with_lead(lead);
        let c = collect_all(
            p,
            &["<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"],
        );
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "f");
        assert_eq!(c.tool_calls[0].arguments, "{\"x\": 1}");
        assert_eq!(ToolFormat::Glm.forced_lead(&ToolChoice::Auto), None);
    }

    #[test]
    fn without_tools_calls_stay_text() {
        let text = "<tool_call>{}</tool_call>";
        let mut p = OutputParser::new(false, None);
        let mut c = Collected::default();
        c.extend(p.push(text));
        c.extend(p.finish());
        assert_eq!(c.text, text);
        assert!(c.tool_calls.is_empty());
    }
}
