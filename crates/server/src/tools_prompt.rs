//! Tools for chat templates that do not render them (SmolLM2's, plain ChatML): the
//! tool definitions go into the system message, assistant tool calls and tool results
//! into message text, all in the Hermes format the server's parser reads back
//! (`<tools>`, `<tool_call>`, `<tool_response>`, as Qwen 2.5 and Hermes 2 Pro document
//! it). Null content becomes empty text, which such templates need.

use serde_json::Value;

use crate::backend::ChatTurn;
use crate::pyjson;

/// The system-message section describing `tools` (OpenAI function definitions).
pub fn tools_system_text(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to help with the user's request. \
         The available functions are described in JSON inside <tools></tools>:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&pyjson::to_string(t));
    }
    s.push_str(
        "\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments \
         inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

/// One call as the model writes it.
pub fn tool_call_text(name: &str, arguments: &Value) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
        pyjson::to_string(name),
        pyjson::to_string(arguments)
    )
}

/// Rewrites a conversation for a template without tool support: tool definitions in
/// the (first) system message, calls and results as text, no null content.
pub fn inline_tools(messages: &[ChatTurn], tools: &[Value]) -> Vec<ChatTurn> {
    let mut out: Vec<ChatTurn> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        match m.role.as_str() {
            "tool" => {
                let block = format!(
                    "<tool_response>\n{}\n</tool_response>",
                    m.content.as_deref().unwrap_or("")
                );
                // Consecutive results share one user turn, as Qwen's template does it.
                match out.last_mut() {
                    Some(prev)
                        if prev.role == "user"
                            && prev
                                .content
                                .as_deref()
                                .is_some_and(|c| c.ends_with("</tool_response>")) =>
                    {
                        let c = prev.content.get_or_insert_with(String::new);
                        c.push('\n');
                        c.push_str(&block);
                    }
                    _ => out.push(ChatTurn::text("user", &block)),
                }
            }
            _ => {
                let mut text = m.content.clone().unwrap_or_default();
                for c in &m.tool_calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&tool_call_text(&c.name, &c.arguments));
                }
                out.push(ChatTurn {
                    role: m.role.clone(),
                    content: Some(text),
                    reasoning_content: m.reasoning_content.clone(),
                    ..Default::default()
                });
            }
        }
    }
    if !tools.is_empty() {
        let section = tools_system_text(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                let c = first.content.get_or_insert_with(String::new);
                if !c.is_empty() {
                    c.push_str("\n\n");
                }
                c.push_str(&section);
            }
            _ => out.insert(0, ChatTurn::text("system", &section)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::TurnToolCall;
    use serde_json::json;

    #[test]
    fn calls_results_and_tools_become_text() {
        let msgs = vec![
            ChatTurn::text("system", "Be brief."),
            ChatTurn::text("user", "Weather?"),
            ChatTurn {
                role: "assistant".into(),
                content: None,
                tool_calls: vec![TurnToolCall {
                    id: "c1".into(),
                    name: "get_weather".into(),
                    arguments: json!({"city": "Paris"}),
                }],
                ..Default::default()
            },
            ChatTurn {
                role: "tool".into(),
                content: Some("18C".into()),
                tool_call_id: Some("c1".into()),
                ..Default::default()
            },
            ChatTurn {
                role: "tool".into(),
                content: Some("sunny".into()),
                tool_call_id: Some("c1".into()),
                ..Default::default()
            },
        ];
        let tools = vec![json!({"type": "function", "function": {"name": "get_weather"}})];
        let out = inline_tools(&msgs, &tools);
        assert_eq!(out.len(), 4);
        let sys = out[0].content.as_deref().unwrap();
        assert!(sys.starts_with("Be brief.\n\n# Tools"));
        assert!(sys.contains(
            "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}\n</tools>"
        ));
        assert_eq!(
            out[2].content.as_deref(),
            Some(
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
            )
        );
        assert_eq!(out[3].role, "user");
        assert_eq!(
            out[3].content.as_deref(),
            Some(
                "<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
            )
        );
    }
}
