//! Collects output events into a whole message (for non-streaming responses).

use super::OutputEvent;

/// A tool call, complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedCall {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// A whole generated message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<CollectedCall>,
}

impl Collected {
    /// Adds events in order.
    pub fn extend(&mut self, events: impl IntoIterator<Item = OutputEvent>) {
        for e in events {
            match e {
                OutputEvent::Text(t) => self.text.push_str(&t),
                OutputEvent::Reasoning(t) => self.reasoning.push_str(&t),
                OutputEvent::ToolCallBegin { name, .. } => self.tool_calls.push(CollectedCall {
                    name,
                    arguments: String::new(),
                }),
                OutputEvent::ToolCallArgs { index, delta } => {
                    if let Some(c) = self.tool_calls.get_mut(index) {
                        c.arguments.push_str(&delta);
                    }
                }
                OutputEvent::ToolCallEnd { .. } => {}
            }
        }
    }
}
