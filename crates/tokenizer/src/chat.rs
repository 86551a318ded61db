//! Chat templates: rendering a GGUF's `tokenizer.chat_template` (Jinja) into a prompt.
//!
//! Follows llama.cpp `common/chat.cpp` (`common_chat_msg::to_json_oaicompat`,
//! `common_chat_templates_apply_jinja`, `common_chat_template_direct_apply_impl`) and its
//! Jinja engine (`common/jinja`): the template sees `messages` (role, content — an empty
//! string when there is none —, `reasoning_content`, `name`, `tool_call_id`, `tool_calls`
//! as `{type: "function", function: {name, arguments}, id}`), `tools` (OpenAI tool objects,
//! only when tools are given), `add_generation_prompt` (only when true), `bos_token`,
//! `eos_token`, `enable_thinking`, `datetime`, `date_string` and any extra variables.
//! Blocks trim their newline and strip leading indentation (`trim_blocks`,
//! `lstrip_blocks`), a single trailing newline is dropped, and `tojson` writes JSON the way
//! llama.cpp does (`", "` and `": "` separators, keys in their given order, no HTML
//! escaping).
//!
//! Templates that read tool-call arguments as objects (`arguments | tojson`, as Qwen2.5's
//! does) get them parsed from the JSON string; llama.cpp decides this by probing the
//! template, and so does [`ChatTemplate::new`].

use std::time::{SystemTime, UNIX_EPOCH};

use ds4_gguf::{GgufFile, Value as GgufValue};
use minijinja::value::{Kwargs, Rest, Serde};
use minijinja::{Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json, json};

use crate::TokenizerError;
use crate::unicode::char_byte;

/// One tool call made by the assistant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id (`call_…`), if the client gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The function name.
    pub name: String,
    /// The arguments as a JSON text (an object, as OpenAI's API sends it).
    pub arguments: String,
}

/// One chat message, in the shape of OpenAI's chat API.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (other roles pass through unchanged).
    pub role: String,
    /// The text; `None` renders as an empty string.
    #[serde(default)]
    pub content: Option<String>,
    /// The assistant's reasoning, for templates that show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For a `tool` message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(content.into()),
            ..ChatMessage::default()
        }
    }
}

/// What to render besides the messages.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// Open an assistant turn at the end (default `true`).
    pub add_generation_prompt: bool,
    /// OpenAI tool objects (`{"type": "function", "function": {name, description,
    /// parameters}}`); `None` leaves `tools` undefined in the template.
    pub tools: Option<Vec<Json>>,
    /// `enable_thinking` (default `true`, as in llama.cpp).
    pub enable_thinking: bool,
    /// Extra template variables (`chat_template_kwargs`); they override the defaults.
    pub extra: Map<String, Json>,
    /// Drop a leading `bos_token` from the result (set it when the tokenizer adds BOS
    /// itself, as llama.cpp does).
    pub strip_bos: bool,
    /// Drop a trailing `eos_token` from the result (when the tokenizer adds EOS).
    pub strip_eos: bool,
    /// The time for `strftime_now`, `datetime` and `date_string` (default: now, UTC).
    pub now: Option<SystemTime>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            tools: None,
            enable_thinking: true,
            extra: Map::new(),
            strip_bos: false,
            strip_eos: false,
            now: None,
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    uses_tools: bool,
    object_arguments: bool,
}

const TEMPLATE_NAME: &str = "chat";

/// The built-in GLM-5 template (see its header comment).
const GLM5_TEMPLATE: &str = include_str!("../templates/glm5.jinja");
/// ChatML.
const CHATML_TEMPLATE: &str = include_str!("../templates/chatml.jinja");

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, with `bos_token`/`eos_token` set to the
    /// vocabulary's BOS/EOS pieces; `Ok(None)` when the GGUF has no template.
    ///
    /// Errors: a mistyped key, or a template that does not parse.
    pub fn from_gguf(file: &GgufFile) -> Result<Option<ChatTemplate>, TokenizerError> {
        let key = "tokenizer.chat_template";
        let source = match file.get(key) {
            None => return Ok(None),
            Some(GgufValue::String(s)) => s.clone(),
            Some(other) => {
                return Err(TokenizerError::WrongType {
                    file: file.label().to_owned(),
                    key: key.to_owned(),
                    expected: "a string",
                    found: other.describe(),
                });
            }
        };
        let (bos, eos) = bos_eos_pieces(file);
        ChatTemplate::new(source, bos, eos).map(Some)
    }

    /// The template to use for a model: the GGUF's own `tokenizer.chat_template`, else a
    /// built-in one for its architecture (GLM-5 for `glm5next`), else ChatML (llama.cpp's
    /// fallback).
    ///
    /// Errors: as [`ChatTemplate::from_gguf`].
    pub fn for_gguf(file: &GgufFile) -> Result<ChatTemplate, TokenizerError> {
        if let Some(t) = ChatTemplate::from_gguf(file)? {
            return Ok(t);
        }
        let arch = file
            .get("general.architecture")
            .and_then(GgufValue::as_str)
            .unwrap_or_default();
        let source = match arch {
            "glm5next" | "glm5-next" => GLM5_TEMPLATE,
            _ => CHATML_TEMPLATE,
        };
        let (bos, eos) = bos_eos_pieces(file);
        ChatTemplate::new(source, bos, eos)
    }

    /// Compiles `source` with the given `bos_token` and `eos_token` texts.
    ///
    /// Errors: [`TokenizerError::TemplateSyntax`] with the parser's message and line.
    pub fn new(
        source: impl Into<String>,
        bos: impl Into<String>,
        eos: impl Into<String>,
    ) -> Result<ChatTemplate, TokenizerError> {
        let source = source.into();
        let env = environment(&source)?;
        let uses_tools = env
            .get_template(TEMPLATE_NAME)
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false);
        let mut template = ChatTemplate {
            env,
            source,
            bos: bos.into(),
            eos: eos.into(),
            uses_tools,
            object_arguments: false,
        };
        template.object_arguments = template.probe_object_arguments();
        Ok(template)
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the template reads the `tools` variable. When it does not (SmolLM2's), tools
    /// must be described some other way, e.g. in a system message.
    pub fn uses_tools(&self) -> bool {
        self.uses_tools
    }

    /// Whether tool-call arguments reach the template as objects rather than JSON strings.
    pub fn object_arguments(&self) -> bool {
        self.object_arguments
    }

    /// The `bos_token` and `eos_token` texts the template sees.
    pub fn bos_eos(&self) -> (&str, &str) {
        (&self.bos, &self.eos)
    }

    /// Renders `messages` into a prompt.
    ///
    /// Tool-call arguments that are not JSON reach a template that wants objects as the
    /// raw string.
    ///
    /// Errors: [`TokenizerError::TemplateRender`] for failures inside the template
    /// (including its `raise_exception(..)` calls), with the line.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &RenderOptions,
    ) -> Result<String, TokenizerError> {
        let messages = messages
            .iter()
            .map(|m| message_json(m, self.object_arguments))
            .collect();
        let tools = opts.tools.as_ref().map(|t| normalize_tools(t));
        let mut out = self.render_json(Json::Array(messages), tools, opts)?;
        if opts.strip_bos && !self.bos.is_empty() && out.starts_with(&self.bos) {
            out.drain(..self.bos.len());
        }
        if opts.strip_eos && !self.eos.is_empty() && out.ends_with(&self.eos) {
            out.truncate(out.len() - self.eos.len());
        }
        Ok(out)
    }

    fn render_json(
        &self,
        messages: Json,
        tools: Option<Json>,
        opts: &RenderOptions,
    ) -> Result<String, TokenizerError> {
        let now = opts.now.unwrap_or_else(SystemTime::now);
        let mut ctx = Map::new();
        ctx.insert("messages".into(), messages);
        ctx.insert("bos_token".into(), Json::String(self.bos.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos.clone()));
        ctx.insert("enable_thinking".into(), Json::Bool(opts.enable_thinking));
        if let Some(tools) = tools {
            ctx.insert("tools".into(), tools);
        }
        ctx.insert("datetime".into(), Json::String(strftime("%b %d %Y", now)));
        ctx.insert(
            "date_string".into(),
            Json::String(strftime("%d %b %Y", now)),
        );
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        if opts.add_generation_prompt {
            ctx.insert("add_generation_prompt".into(), Json::Bool(true));
        }
        let template = self.env.get_template(TEMPLATE_NAME).map_err(render_error)?;
        let mut ctx = Value::from(Serde(Json::Object(ctx)));
        let now_secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        ctx = minijinja::context! { __now => now_secs, ..ctx };
        template.render(ctx).map_err(render_error)
    }

    /// Renders llama.cpp's tool-call probe with object arguments and with string arguments:
    /// objects are needed when the object's contents show up but the string itself does
    /// not.
    fn probe_object_arguments(&self) -> bool {
        let probe = |arguments: Json| {
            let messages = json!([
                {"role": "user", "content": "User message"},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "type": "function",
                    "function": {"name": "tool1", "arguments": arguments},
                    "id": "call00001"
                }]},
                {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                {"role": "assistant", "content": "The tool response was 'tool response'"},
                {"role": "user", "content": "User message"}
            ]);
            let tools = json!([{"type": "function", "function": {
                "name": "tool1",
                "description": "Tool description",
                "parameters": {"type": "object", "properties": {
                    "arg": {"type": "string", "description": "Arg description"}
                }, "required": ["arg"]}
            }}]);
            let opts = RenderOptions {
                now: Some(UNIX_EPOCH),
                ..RenderOptions::default()
            };
            self.render_json(messages, Some(tools), &opts).ok()
        };
        let as_string = r#"{"arg": "ARG_PROBE_7"}"#;
        let string_out = probe(Json::String(as_string.into()));
        let object_out = probe(json!({"arg": "ARG_PROBE_7"}));
        let string_shown = string_out.is_some_and(|s| s.contains(as_string));
        let object_shown = object_out.is_some_and(|s| s.contains("ARG_PROBE_7"));
        object_shown && !string_shown
    }
}

/// The Jinja environment: llama.cpp's whitespace rules, Python string methods, and the
/// `tojson`, `raise_exception` and `strftime_now` of llama.cpp's engine.
fn environment(source: &str) -> Result<Environment<'static>, TokenizerError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(syntax_error)?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson_filter);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("raise_exception: {msg}"),
            ))
        },
    );
    env.add_function(
        "strftime_now",
        |state: &minijinja::State, format: String| -> String {
            let secs = state
                .lookup("__now")
                .and_then(|v| v.as_i64())
                .unwrap_or_default();
            strftime(
                &format,
                UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64),
            )
        },
    );
    env.add_template_owned(TEMPLATE_NAME, source.to_owned())
        .map_err(syntax_error)?;
    Ok(env)
}

fn describe(e: &minijinja::Error) -> String {
    let mut message = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        message.push_str(&format!(" (template line {line})"));
    }
    message
}

fn syntax_error(e: minijinja::Error) -> TokenizerError {
    TokenizerError::TemplateSyntax {
        message: describe(&e),
    }
}

fn render_error(e: minijinja::Error) -> TokenizerError {
    TokenizerError::TemplateRender {
        message: describe(&e),
    }
}

/// One message as llama.cpp's `to_json_oaicompat` writes it.
fn message_json(m: &ChatMessage, object_arguments: bool) -> Json {
    let mut msg = Map::new();
    msg.insert("role".into(), Json::String(m.role.clone()));
    msg.insert(
        "content".into(),
        Json::String(m.content.clone().unwrap_or_default()),
    );
    let non_empty = |s: &Option<String>| s.as_ref().filter(|s| !s.is_empty()).cloned();
    if let Some(r) = non_empty(&m.reasoning_content) {
        msg.insert("reasoning_content".into(), Json::String(r));
    }
    if let Some(n) = non_empty(&m.name) {
        msg.insert("name".into(), Json::String(n));
    }
    if let Some(id) = non_empty(&m.tool_call_id) {
        msg.insert("tool_call_id".into(), Json::String(id));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|call| {
                // Templates that want objects get the parsed arguments; arguments that
                // are not JSON (a model's malformed call kept in the history) pass as
                // the raw string, as llama.cpp's template polyfill does, so the
                // conversation goes on.
                let arguments = if object_arguments {
                    serde_json::from_str(&call.arguments)
                        .unwrap_or_else(|_| Json::String(call.arguments.clone()))
                } else {
                    Json::String(call.arguments.clone())
                };
                let mut tc = Map::new();
                tc.insert("type".into(), Json::String("function".into()));
                tc.insert(
                    "function".into(),
                    json!({"name": call.name, "arguments": arguments}),
                );
                if let Some(id) = non_empty(&call.id) {
                    tc.insert("id".into(), Json::String(id));
                }
                Json::Object(tc)
            })
            .collect();
        msg.insert("tool_calls".into(), Json::Array(calls));
    }
    Json::Object(msg)
}

/// Tools as llama.cpp passes them: `{type: "function", function: {name, description,
/// parameters}}` rebuilt from each function tool (other fields dropped); tools of other
/// shapes pass unchanged.
fn normalize_tools(tools: &[Json]) -> Json {
    Json::Array(
        tools
            .iter()
            .map(|tool| {
                let function = tool
                    .get("function")
                    .filter(|_| tool.get("type").and_then(Json::as_str) == Some("function"));
                match function.and_then(|f| f.get("name").map(|n| (f, n))) {
                    Some((f, name)) => json!({
                        "type": "function",
                        "function": {
                            "name": name,
                            "description": f.get("description").cloned().unwrap_or(Json::String(String::new())),
                            "parameters": f.get("parameters").cloned().unwrap_or_else(|| json!({})),
                        }
                    }),
                    None => tool.clone(),
                }
            })
            .collect(),
    )
}

/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)` as
/// llama.cpp's Jinja engine writes it.
fn tojson_filter(
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<String, minijinja::Error> {
    let arg = |i: usize, name: &str| -> Result<Option<Value>, minijinja::Error> {
        if kwargs.has(name) {
            return kwargs.get::<Value>(name).map(Some);
        }
        Ok(args.0.get(i).cloned())
    };
    let ensure_ascii = arg(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = arg(1, "indent")?.and_then(|v| v.as_i64());
    let separators = arg(2, "separators")?;
    if arg(3, "sort_keys")?.is_some_and(|v| v.is_true()) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "tojson: sort_keys=true is not supported",
        ));
    }
    kwargs.assert_all_used()?;
    let sep = |i: usize| -> Option<String> {
        separators
            .as_ref()
            .and_then(|s| s.get_item_by_index(i).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
    };
    let indent = indent.map(|i| i.max(0) as usize);
    let item_sep = sep(0).unwrap_or_else(|| if indent.is_none() { ", " } else { "," }.into());
    let key_sep = sep(1).unwrap_or_else(|| ": ".into());
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_json(&mut out, &json, 0, indent, &item_sep, &key_sep);
    if ensure_ascii {
        out = out
            .chars()
            .map(|c| {
                if c.is_ascii() {
                    c.to_string()
                } else {
                    let mut units = [0u16; 2];
                    c.encode_utf16(&mut units)
                        .iter()
                        .map(|u| format!("\\u{u:04x}"))
                        .collect()
                }
            })
            .collect();
    }
    Ok(out)
}

fn write_json(
    out: &mut String,
    v: &Json,
    level: usize,
    indent: Option<usize>,
    item_sep: &str,
    key_sep: &str,
) {
    let pad = |out: &mut String, n: usize| {
        if let Some(i) = indent {
            out.push_str(&" ".repeat(i * n));
        }
    };
    let newline = |out: &mut String| {
        if indent.is_some() {
            out.push('\n');
        }
    };
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&format_g6(f)),
            _ => out.push_str("null"),
        },
        Json::String(s) => write_json_string(out, s),
        Json::Array(items) => {
            out.push('[');
            if !items.is_empty() {
                newline(out);
                for (i, item) in items.iter().enumerate() {
                    pad(out, level + 1);
                    write_json(out, item, level + 1, indent, item_sep, key_sep);
                    if i + 1 < items.len() {
                        out.push_str(item_sep);
                    }
                    newline(out);
                }
                pad(out, level);
            }
            out.push(']');
        }
        Json::Object(map) => {
            out.push('{');
            if !map.is_empty() {
                newline(out);
                for (i, (k, item)) in map.iter().enumerate() {
                    pad(out, level + 1);
                    write_json_string(out, k);
                    out.push_str(key_sep);
                    write_json(out, item, level + 1, indent, item_sep, key_sep);
                    if i + 1 < map.len() {
                        out.push_str(item_sep);
                    }
                    newline(out);
                }
                pad(out, level);
            }
            out.push('}');
        }
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A double as C++ `ostream << double` writes it (`%g`, 6 significant digits).
fn format_g6(f: f64) -> String {
    if f.is_nan() {
        return if f.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf" } else { "inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to 6 significant digits decides the style.
    let sci = format!("{f:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(&format!("{f:.decimals$}"))
    }
}

/// `strftime` in UTC for the common conversions (`%Y %y %m %d %e %H %I %M %S %p %b %B %a
/// %A %j %%`); others are written as they are.
fn strftime(format: &str, time: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_march = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_march + 2) / 153;
    let day = doy_march - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(month - 1) as usize];
    let yday = before + day + i64::from(leap && month > 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The BOS and EOS pieces (`llama_token_to_piece(.., special = true)`) from the metadata:
/// the ids from `tokenizer.ggml.{bos,eos}_token_id` or llama.cpp's defaults for the model
/// (`llama`: 1 and 2, `gpt2`: 11 and 11), empty when absent or out of range.
fn bos_eos_pieces(file: &GgufFile) -> (String, String) {
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .unwrap_or_default();
    let types = file
        .get("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array);
    let model = file
        .get("tokenizer.ggml.model")
        .and_then(GgufValue::as_str)
        .unwrap_or_default();
    let defaults = match model {
        "llama" => (Some(1), Some(2)),
        "gpt2" => (Some(11), Some(11)),
        _ => (None, None),
    };
    let piece = |key: &str, default: Option<u64>| -> String {
        let id = file
            .get(key)
            .and_then(GgufValue::as_u64)
            .filter(|&id| (id as usize) < tokens.len())
            .or(default);
        let Some(text) = id
            .and_then(|id| tokens.get(id as usize))
            .and_then(GgufValue::as_str)
        else {
            return String::new();
        };
        let kind = id
            .and_then(|id| types?.get(id as usize))
            .and_then(|t| t.as_i64())
            .unwrap_or(1);
        match (kind, model) {
            // Normal tokens are stored in the model's alphabet.
            (1, "llama") => text.replace('\u{2581}', " "),
            (1, "gpt2") => {
                let bytes: Vec<u8> = text.chars().filter_map(char_byte).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            _ => text.to_owned(),
        }
    };
    (
        piece("tokenizer.ggml.bos_token_id", defaults.0),
        piece("tokenizer.ggml.eos_token_id", defaults.1),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g6_matches_cpp_stream_output() {
        // C++ `std::ostringstream << x` with default precision (checked with g++ 12).
        for (x, want) in [
            (1.0, "1"),
            (0.1, "0.1"),
            (1.23456789, "1.23457"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (1e100, "1e+100"),
            (999999.5, "1e+06"),
        ] {
            assert_eq!(format_g6(x), want, "{x}");
        }
    }

    #[test]
    fn strftime_known_dates() {
        // Expected text from GNU `date -u -d @1709210096 "+..."`.
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_709_210_096);
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %I%p %%", t),
            "2024-02-29 12:34:56 Thu Thursday Feb February 060 24 12PM %"
        );
        assert_eq!(strftime("%d %b %Y", UNIX_EPOCH), "01 Jan 1970");
    }

    #[test]
    fn tojson_is_llama_style() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ s | tojson(ensure_ascii=true) }}",
            "",
            "",
        )
        .unwrap();
        let opts = RenderOptions {
            extra: json!({"x": {"b": [1, 2.5, null, true], "a": "q\"<\n"}, "s": "é😀"})
                .as_object()
                .unwrap()
                .clone(),
            add_generation_prompt: false,
            ..RenderOptions::default()
        };
        assert_eq!(
            t.render(&[], &opts).unwrap(),
            "{\"b\": [1, 2.5, null, true], \"a\": \"q\\\"<\\n\"}|{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"q\\\"<\\n\"\n}|\"\\u00e9\\ud83d\\ude00\""
        );
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], &RenderOptions::default()).unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
        let bad = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(
            matches!(bad, TokenizerError::TemplateSyntax { .. }),
            "{bad}"
        );
    }
}
