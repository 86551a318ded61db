//! A toy model for testing the HTTP layer without weights: byte-level tokens plus a few
//! merged tokens (so re-tokenized answers differ from generated ids, as with BPE), a
//! ChatML template, and replies chosen by a function of the prompt text.

use std::any::Any;
use std::io::{Read, Write};
use std::ops::{ControlFlow, RangeInclusive};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{
    BackendError, ChatTurn, Engine, GenOutcome, GenSettings, GenStop, ModelParts, Parked,
    RenderRequest, Sampled, SyncOutcome, Vocab, reusable_prefix,
};

/// `<|im_start|>`.
pub const IM_START: u32 = 256;
/// `<|im_end|>`, the end-of-generation token.
pub const IM_END: u32 = 257;
const SPECIALS: [(&str, u32); 2] = [("<|im_start|>", IM_START), ("<|im_end|>", IM_END)];
/// Merged tokens (ids 300…): what `tokenize` produces for these strings.
const MERGES: [&str; 4] = ["Hello", " world", "<tool_call>", "</tool_call>"];
const N_VOCAB: usize = 300 + MERGES.len();

/// Chooses the reply text from the rendered prompt.
pub type Responder = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Settings of the toy model.
#[derive(Clone)]
pub struct FakeConfig {
    pub n_ctx: usize,
    /// Whether the template renders `tools` (if not, it also fails on null content,
    /// like SmolLM2's).
    pub supports_tools: bool,
    /// Time per prompt token evaluated.
    pub prefill_delay: Duration,
    /// Time per generated token.
    pub token_delay: Duration,
    pub responder: Responder,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            n_ctx: 4096,
            supports_tools: false,
            prefill_delay: Duration::ZERO,
            token_delay: Duration::ZERO,
            responder: Arc::new(|_| "Hello world".to_string()),
        }
    }
}

impl FakeConfig {
    /// The default toy model, answering `reply(prompt)`.
    pub fn replying(reply: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        FakeConfig {
            responder: Arc::new(reply),
            ..Default::default()
        }
    }
}

/// The last user message in a ChatML prompt.
pub fn last_user_message(prompt: &str) -> &str {
    prompt
        .rsplit("<|im_start|>user\n")
        .next()
        .and_then(|s| s.split("<|im_end|>").next())
        .unwrap_or("")
}

/// The toy vocabulary and template.
pub struct FakeVocab {
    config: FakeConfig,
}

impl FakeVocab {
    pub fn new(config: FakeConfig) -> Self {
        FakeVocab { config }
    }
}

fn render_turn(out: &mut String, m: &ChatTurn, supports_tools: bool) -> Result<(), BackendError> {
    let content = match (&m.content, supports_tools) {
        (Some(c), _) => c.as_str(),
        (None, true) => "",
        (None, false) => {
            return Err(BackendError::Template(
                "can only concatenate str (not \"NoneType\") to str".into(),
            ));
        }
    };
    // Like Qwen 2.5's template: a turn with tool calls writes its content (if any) and
    // each call on a new line after the role.
    out.push_str("<|im_start|>");
    out.push_str(&m.role);
    if m.tool_calls.is_empty() || !content.is_empty() {
        out.push('\n');
        out.push_str(content);
    }
    for c in &m.tool_calls {
        out.push_str("\n<tool_call>\n{\"name\": \"");
        out.push_str(&c.name);
        out.push_str("\", \"arguments\": ");
        out.push_str(&crate::pyjson::to_string(&c.arguments));
        out.push_str("}\n</tool_call>");
    }
    out.push_str("<|im_end|>\n");
    Ok(())
}

impl Vocab for FakeVocab {
    fn model_id(&self) -> String {
        "fake-model".into()
    }

    fn model_display_name(&self) -> Option<String> {
        Some("Fake Model 1B".into())
    }

    fn n_ctx_train(&self) -> Option<usize> {
        Some(8192)
    }

    fn n_vocab(&self) -> usize {
        N_VOCAB
    }

    fn chat_template_source(&self) -> String {
        "{# toy ChatML #}<tool_call>".into()
    }

    fn template_supports_tools(&self) -> bool {
        self.config.supports_tools
    }

    fn render(&self, req: &RenderRequest<'_>) -> Result<String, BackendError> {
        let mut out = String::new();
        if self.config.supports_tools && !req.tools.is_empty() {
            out.push_str("<|im_start|>system\n# Tools\n<tools>");
            for t in req.tools {
                out.push('\n');
                out.push_str(&crate::pyjson::to_string(t));
            }
            out.push_str("\n</tools><|im_end|>\n");
        }
        for m in req.messages {
            render_turn(&mut out, m, self.config.supports_tools)?;
        }
        if req.add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
            if req.vars.get("enable_thinking").and_then(|v| v.as_bool()) == Some(true) {
                out.push_str("<think>\n");
            }
        }
        Ok(out)
    }

    fn tokenize(&self, text: &str, _add_bos: bool) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for (s, id) in SPECIALS {
                if let Some(r) = rest.strip_prefix(s) {
                    out.push(id);
                    rest = r;
                    continue 'outer;
                }
            }
            for (i, m) in MERGES.iter().enumerate() {
                if let Some(r) = rest.strip_prefix(m) {
                    out.push(300 + i as u32);
                    rest = r;
                    continue 'outer;
                }
            }
            let n = rest.chars().next().map_or(1, char::len_utf8);
            out.extend(rest.as_bytes()[..n].iter().map(|&b| b as u32));
            rest = &rest[n..];
        }
        out
    }

    fn piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        match id {
            0..=255 => vec![id as u8],
            IM_START | IM_END => {
                if render_special {
                    SPECIALS
                        .iter()
                        .find(|s| s.1 == id)
                        .map(|s| s.0.as_bytes().to_vec())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                }
            }
            300.. if ((id - 300) as usize) < MERGES.len() => {
                MERGES[(id - 300) as usize].as_bytes().to_vec()
            }
            _ => Vec::new(),
        }
    }

    fn is_eog(&self, id: u32) -> bool {
        id == IM_END
    }
}

/// The toy session.
pub struct FakeEngine {
    config: FakeConfig,
    vocab: FakeVocab,
    tokens: Vec<u32>,
    logits_known: bool,
}

impl FakeEngine {
    pub fn new(config: FakeConfig) -> Self {
        FakeEngine {
            vocab: FakeVocab::new(config.clone()),
            config,
            tokens: Vec::new(),
            logits_known: false,
        }
    }
}

/// A fake model: the shared vocabulary and the engine.
pub fn fake_model(config: FakeConfig) -> ModelParts {
    (
        Arc::new(FakeVocab::new(config.clone())),
        Box::new(FakeEngine::new(config)),
    )
}

/// The toy model's parked state: its tokens.
struct FakeParked {
    tokens: Vec<u32>,
    logits_known: bool,
}

impl Parked for FakeParked {
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn bytes(&self) -> u64 {
        4 * self.tokens.len() as u64
    }

    fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        vec![0..=self.tokens.len()]
    }

    fn logits_known(&self) -> bool {
        self.logits_known
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn fake_parked(p: &dyn Parked) -> Result<&FakeParked, BackendError> {
    p.as_any()
        .downcast_ref::<FakeParked>()
        .ok_or_else(|| BackendError::Engine("a parked state of another engine".into()))
}

impl Engine for FakeEngine {
    fn n_ctx(&self) -> usize {
        self.config.n_ctx
    }

    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn sync(
        &mut self,
        prompt: &[u32],
        cancel: &dyn Fn() -> bool,
    ) -> Result<SyncOutcome, BackendError> {
        let keep = reusable_prefix(&self.tokens, prompt, self.config.n_ctx, self.logits_known)?;
        self.tokens.truncate(keep);
        let t0 = Instant::now();
        for chunk in prompt[keep..].chunks(64) {
            if cancel() {
                self.logits_known = false;
                return Err(BackendError::Cancelled);
            }
            std::thread::sleep(self.config.prefill_delay * chunk.len() as u32);
            self.tokens.extend_from_slice(chunk);
        }
        self.logits_known = true;
        let evaluated = prompt.len() - keep;
        Ok(SyncOutcome::timed(keep, evaluated, t0))
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        settings: &GenSettings,
        on_token: &mut dyn FnMut(Sampled) -> ControlFlow<()>,
    ) -> Result<GenOutcome, BackendError> {
        self.sync(prompt, &|| false)?;
        let text: Vec<u8> = prompt
            .iter()
            .flat_map(|&t| self.vocab.piece(t, true))
            .collect();
        let reply = (self.config.responder)(&String::from_utf8_lossy(&text));
        let script: Vec<u32> = reply.bytes().map(u32::from).chain([IM_END]).collect();
        let mut generated = 0;
        let t0 = Instant::now();
        let mut stop = GenStop::Length;
        for &id in &script {
            if generated == settings.max_tokens {
                break;
            }
            generated += 1;
            let (logprob, top) = match settings.top_logprobs {
                Some(k) => (
                    Some(-0.25),
                    [(id, -0.25), (u32::from(b'?'), -2.0)]
                        .into_iter()
                        .take(k)
                        .collect(),
                ),
                None => (None, Vec::new()),
            };
            if on_token(Sampled { id, logprob, top }).is_break() {
                stop = GenStop::Stopped;
                break;
            }
            if id == IM_END {
                stop = GenStop::Eog;
                break;
            }
            if generated == settings.max_tokens {
                break;
            }
            if self.tokens.len() + 1 > self.config.n_ctx {
                stop = GenStop::ContextFull;
                break;
            }
            std::thread::sleep(self.config.token_delay);
            self.tokens.push(id);
        }
        let decode_time = (generated > 1).then(|| t0.elapsed());
        Ok(GenOutcome {
            generated,
            decode_time,
            stop,
        })
    }

    fn logits_known(&self) -> bool {
        self.logits_known
    }

    fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        vec![0..=self.tokens.len()]
    }

    fn park(&self) -> Result<Box<dyn Parked>, BackendError> {
        Ok(Box::new(FakeParked {
            tokens: self.tokens.clone(),
            logits_known: self.logits_known,
        }))
    }

    fn unpark(&mut self, parked: &dyn Parked) -> Result<(), BackendError> {
        let p = fake_parked(parked)?;
        self.tokens.clone_from(&p.tokens);
        self.logits_known = p.logits_known;
        Ok(())
    }

    /// u8 logits known, then the tokens as u32 LE.
    fn write_parked(&self, parked: &dyn Parked, out: &mut dyn Write) -> Result<(), BackendError> {
        let p = fake_parked(parked)?;
        let mut b = vec![u8::from(p.logits_known)];
        for t in &p.tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        out.write_all(&b)
            .map_err(|e| BackendError::Engine(e.to_string()))
    }

    fn read_parked(&self, input: &mut dyn Read) -> Result<Box<dyn Parked>, BackendError> {
        let mut b = Vec::new();
        input
            .read_to_end(&mut b)
            .map_err(|e| BackendError::Engine(e.to_string()))?;
        let Some((&known, rest)) = b.split_first().filter(|(_, r)| r.len() % 4 == 0) else {
            return Err(BackendError::Engine("a malformed toy state".into()));
        };
        let tokens = rest
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(Box::new(FakeParked {
            tokens,
            logits_known: known == 1,
        }))
    }

    fn identity(&self) -> String {
        format!("toy model; n_ctx {}", self.config.n_ctx)
    }
}
