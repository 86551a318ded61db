//! Chat templates (placeholder).
pub struct ChatMessage;
pub struct ChatTemplate;
pub struct RenderOptions;
pub struct ToolCall;
