//! From a conversation to a prompt: tool handling for the template at hand, the chat
//! template, the canonical tokenization, and what the output parser needs to know.

use crate::api::common::{Conversation, ToolChoice};
use crate::api::error::ApiError;
use crate::backend::{BackendError, ChatTurn, RenderRequest, Vocab};
use crate::output::{OutputParser, THINK_CLOSE, THINK_OPEN, ToolFormat};
use crate::tools_prompt::inline_tools;
use crate::worker::PromptInput;

/// A rendered prompt.
#[derive(Debug, Clone)]
pub struct PromptPlan {
    pub text: String,
    /// Canonical tokenization (BOS as the vocabulary asks).
    pub tokens: Vec<u32>,
    /// The template opened a reasoning block at the end of the prompt.
    pub starts_in_reasoning: bool,
    /// Parse tool calls in this format (`None` when no tools are offered).
    pub tool_format: Option<ToolFormat>,
    /// The opening of a forced tool call the prompt ends with (part of the answer).
    pub lead: Option<String>,
    /// At most one tool call: generation ends after the first call's closing tag.
    pub single_tool_call: bool,
}

impl PromptPlan {
    /// The parser for what the model generates after this prompt.
    pub fn parser(&self) -> OutputParser {
        OutputParser::new(self.starts_in_reasoning, self.tool_format)
            .with_lead(self.lead.clone())
            .with_max_calls(self.single_tool_call.then_some(1))
    }

    /// Text after which generation ends, kept in the answer (the closing tag of a call
    /// when only one call is wanted).
    pub fn end_after(&self) -> Vec<String> {
        match self.tool_format {
            Some(f) if self.single_tool_call => vec![f.call_close().to_string()],
            _ => Vec::new(),
        }
    }

    /// The prompt as the worker takes it.
    pub fn into_input(self) -> PromptInput {
        PromptInput::Text {
            text: self.text,
            tokens: self.tokens,
        }
    }
}

/// Renders and tokenizes `conv` for `vocab`. With `conv.continue_final` the last
/// message (an assistant message) is not rendered as a finished turn: the messages
/// before it are rendered with the generation prompt and its text follows, so the
/// answer continues it (llama.cpp's server prefill; vLLM's `continue_final_message`).
pub fn chat_prompt(
    vocab: &dyn Vocab,
    conv: &Conversation,
    tool_format: ToolFormat,
) -> Result<PromptPlan, ApiError> {
    check_tool_choice(conv)?;
    let offer_tools = !conv.tools.is_empty() && conv.tool_choice != ToolChoice::None;
    let tools: &[serde_json::Value] = if offer_tools { &conv.tools } else { &[] };
    let (messages, prefill) = match conv.messages.split_last() {
        Some((last, before)) if conv.continue_final => {
            if last.role != "assistant" || !last.tool_calls.is_empty() {
                return Err(ApiError::invalid_field(
                    "messages",
                    "continuing the final message needs an assistant message with text and no tool calls last",
                ));
            }
            (before, last.content.clone().unwrap_or_default())
        }
        _ => (&conv.messages[..], String::new()),
    };
    let mut text = render_messages(vocab, messages, tools, &conv.vars)?;
    let opened_reasoning = text.trim_end().ends_with(THINK_OPEN);
    let starts_in_reasoning = opened_reasoning && !prefill.contains(THINK_CLOSE);
    // `tool_choice` required or named: the answer starts with the call's opening. Not
    // when the template opened a reasoning block (the call would cut the reasoning off)
    // or when the answer continues a prefilled message.
    // With a single tool, `required` names it.
    let choice = match (&conv.tool_choice, tools) {
        (ToolChoice::Required, [only]) => match tool_name(only) {
            Some(name) => ToolChoice::Function(name.to_string()),
            None => ToolChoice::Required,
        },
        (c, _) => c.clone(),
    };
    let lead = offer_tools
        .then(|| tool_format.forced_lead(&choice))
        .flatten()
        .filter(|_| !opened_reasoning && !conv.continue_final);
    text.push_str(&prefill);
    if let Some(l) = &lead {
        text.push_str(l);
    }
    let tokens = vocab.tokenize(&text, true);
    Ok(PromptPlan {
        text,
        tokens,
        starts_in_reasoning,
        tool_format: offer_tools.then_some(tool_format),
        lead,
        single_tool_call: conv.single_tool_call,
    })
}

/// `messages` through the chat template with the generation prompt (tools inlined in
/// the system message for templates without tool support).
fn render_messages(
    vocab: &dyn Vocab,
    messages: &[ChatTurn],
    tools: &[serde_json::Value],
    vars: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, ApiError> {
    if !vocab.template_supports_tools() {
        let messages = inline_tools(messages, tools);
        let req = RenderRequest {
            messages: &messages,
            tools: &[],
            add_generation_prompt: true,
            vars,
        };
        return vocab.render(&req).map_err(|e| template_error(e, &messages));
    }
    let req = RenderRequest {
        messages,
        tools,
        add_generation_prompt: true,
        vars,
    };
    match vocab.render(&req) {
        Ok(t) => Ok(t),
        // Some templates fail on null content; retry with empty text.
        Err(_) if messages.iter().any(|m| m.content.is_none()) => {
            let filled: Vec<ChatTurn> = messages
                .iter()
                .map(|m| ChatTurn {
                    content: Some(m.content.clone().unwrap_or_default()),
                    ..m.clone()
                })
                .collect();
            vocab
                .render(&RenderRequest {
                    messages: &filled,
                    ..req
                })
                .map_err(|e| template_error(e, messages))
        }
        Err(e) => Err(template_error(e, messages)),
    }
}

/// A forced call needs tools, and a named one a tool of that name (400 otherwise, as
/// the OpenAI and Anthropic APIs answer).
fn check_tool_choice(conv: &Conversation) -> Result<(), ApiError> {
    match &conv.tool_choice {
        ToolChoice::Required | ToolChoice::Function(_) if conv.tools.is_empty() => Err(
            ApiError::invalid_field("tool_choice", "forcing a tool call needs `tools`"),
        ),
        ToolChoice::Function(name) if !conv.tools.iter().any(|t| tool_name(t) == Some(name)) => {
            Err(ApiError::invalid_field(
                "tool_choice",
                format!("names the function '{name}', which is not among the tools"),
            ))
        }
        _ => Ok(()),
    }
}

/// The name of an OpenAI function definition (`{"type": "function", "function": {"name"}}`).
fn tool_name(tool: &serde_json::Value) -> Option<&str> {
    tool["function"]["name"].as_str()
}

/// A failed render as a 400, naming the likely cause when the conversation has no user
/// message (chat templates assume one; Qwen's fails on an undefined value without it).
fn template_error(e: BackendError, messages: &[ChatTurn]) -> ApiError {
    if !messages.iter().any(|m| m.role == "user") {
        return ApiError::invalid_field(
            "messages",
            format!(
                "the conversation has no user message, which this model's chat template needs ({e})"
            ),
        );
    }
    ApiError::bad_request(e.to_string())
}
