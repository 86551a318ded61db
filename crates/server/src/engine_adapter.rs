//! The worker's traits over `ds4_engine`: a [`LoadedModel`] (chat template, tokenizer)
//! as [`Vocab`], a [`Session`] as [`Engine`]; and [`serve`], the blocking entry point
//! of `ds4-server serve`.
//!
//! Generation goes through `ds4_engine::generate::generate`, the loop `ds4-server run`
//! uses, so a fixed seed gives the same text; log-probabilities are read from the
//! logits row `generate` hands to its per-token callback.

use std::any::Any;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::ops::{ControlFlow, RangeInclusive};
use std::sync::Arc;
use std::time::Instant;

use ds4_engine::generate::{GenerateParams, StopReason, generate};
use ds4_engine::logprobs::{logprob, top_logprobs};
use ds4_engine::sampler::SamplerParams;
use ds4_engine::session::{PREFILL_CHUNK, Snapshot};
use ds4_engine::{EngineError, LoadedModel, Session};
use ds4_tokenizer::{ChatMessage, RenderOptions, Tokenizer, ToolCall};
use serde_json::Value;

use crate::args::ServeArgs;
use crate::backend::{
    BackendError, Engine, GenOutcome, GenSettings, GenStop, ModelParts, Parked, RenderRequest,
    Sampled, SamplerSettings, SyncOutcome, Vocab, reusable_prefix,
};
use crate::config::ServerConfig;
use crate::session_cache::disk::fnv64;

/// A loaded model's text side.
pub struct EngineVocab {
    lm: Arc<LoadedModel>,
    id: String,
    display_name: Option<String>,
}

impl EngineVocab {
    /// The id is the slug of the GGUF file's stem; `general.name` is the display name.
    pub fn new(lm: Arc<LoadedModel>) -> Self {
        let stem = lm
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let id = crate::state::slug(&stem);
        let name = lm.model.info().name.trim().to_string();
        let display_name = (!name.is_empty()).then_some(name);
        EngineVocab {
            lm,
            id,
            display_name,
        }
    }
}

fn chat_message(m: &crate::backend::ChatTurn) -> ChatMessage {
    ChatMessage {
        role: m.role.clone(),
        content: m.content.clone(),
        reasoning_content: m.reasoning_content.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                id: (!c.id.is_empty()).then(|| c.id.clone()),
                name: c.name.clone(),
                arguments: match &c.arguments {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                },
            })
            .collect(),
        tool_call_id: m.tool_call_id.clone(),
        name: m.name.clone(),
    }
}

impl Vocab for EngineVocab {
    fn model_id(&self) -> String {
        self.id.clone()
    }

    fn model_display_name(&self) -> Option<String> {
        self.display_name.clone()
    }

    fn n_ctx_train(&self) -> Option<usize> {
        Some(self.lm.model.info().n_ctx_train)
    }

    fn n_vocab(&self) -> usize {
        self.lm.model.info().n_vocab
    }

    fn chat_template_source(&self) -> String {
        self.lm.template.source().to_string()
    }

    fn template_supports_tools(&self) -> bool {
        self.lm.template.uses_tools()
    }

    fn render(&self, req: &RenderRequest<'_>) -> Result<String, BackendError> {
        let messages: Vec<ChatMessage> = req.messages.iter().map(chat_message).collect();
        let mut opts = RenderOptions {
            add_generation_prompt: req.add_generation_prompt,
            tools: (!req.tools.is_empty()).then(|| req.tools.to_vec()),
            extra: req.vars.clone(),
            ..RenderOptions::default()
        };
        if let Some(b) = req.vars.get("enable_thinking").and_then(Value::as_bool) {
            opts.enable_thinking = b;
        }
        self.lm
            .template
            .render(&messages, &opts)
            .map_err(|e| BackendError::Template(e.to_string()))
    }

    fn tokenize(&self, text: &str, add_bos: bool) -> Vec<u32> {
        if add_bos {
            self.lm.tokenize_rendered(text)
        } else {
            self.lm.tokenizer.encode(text, false, true)
        }
    }

    fn piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        self.lm.tokenizer.piece(id, render_special)
    }

    fn is_eog(&self, id: u32) -> bool {
        self.lm.tokenizer.is_eog(id)
    }
}

/// The live session.
pub struct EngineSession {
    session: Session,
    tokenizer: Arc<Tokenizer>,
    phase: Option<PhaseHook>,
    identity: String,
}

/// A parked session state: an engine snapshot.
struct ParkedSnapshot(Snapshot);

impl Parked for ParkedSnapshot {
    fn tokens(&self) -> &[u32] {
        self.0.tokens()
    }

    fn bytes(&self) -> u64 {
        self.0.bytes()
    }

    fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        self.0.reachable()
    }

    fn logits_known(&self) -> bool {
        self.0.logits_known()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What a state's numbers depend on besides the tokens: the model file (its size and
/// header: metadata and tensor directory), the backend, the context size, the build,
/// and the environment switches that change the arithmetic.
fn identity(lm: &LoadedModel, n_ctx: usize) -> String {
    let bytes = lm.gguf.as_bytes();
    let header = &bytes[..(lm.gguf.data_offset() as usize).min(bytes.len())];
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    format!(
        "ds4-http {}; model {} bytes, header {:016x}; backend {}; n_ctx {n_ctx}; DS4_GGML_TILED={}; DS4_CUDA_FUSE={}",
        env!("CARGO_PKG_VERSION"),
        bytes.len(),
        fnv64(header),
        lm.model.info().backend,
        env("DS4_GGML_TILED"),
        env("DS4_CUDA_FUSE"),
    )
}

/// Told the engine's phase (`prefill`, `decode`, `idle`) as it changes, e.g. by a GPU
/// responsiveness probe that labels its samples.
pub type PhaseHook = Arc<dyn Fn(&'static str) + Send + Sync>;

impl EngineSession {
    /// Runs `f` with the phase hook told `phase` before and `idle` after.
    fn in_phase<R>(&mut self, phase: &'static str, f: impl FnOnce(&mut Self) -> R) -> R {
        let hook = self.phase.clone();
        let tell = |p| {
            if let Some(h) = &hook {
                h(p);
            }
        };
        tell(phase);
        let r = f(self);
        tell("idle");
        r
    }
}

fn engine_error(e: EngineError) -> BackendError {
    match e {
        EngineError::ContextFull { needed, n_ctx } => BackendError::ContextFull { needed, n_ctx },
        other => BackendError::Engine(other.to_string()),
    }
}

fn sampler_params(s: &SamplerSettings) -> SamplerParams {
    SamplerParams {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
    }
}

fn gen_stop(s: StopReason) -> GenStop {
    match s {
        StopReason::Eog => GenStop::Eog,
        StopReason::Length => GenStop::Length,
        StopReason::Stopped => GenStop::Stopped,
        StopReason::ContextFull => GenStop::ContextFull,
    }
}

impl Engine for EngineSession {
    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn tokens(&self) -> &[u32] {
        self.session.tokens()
    }

    fn sync(
        &mut self,
        prompt: &[u32],
        cancel: &dyn Fn() -> bool,
    ) -> Result<SyncOutcome, BackendError> {
        self.in_phase("prefill", |s| s.sync_chunks(prompt, cancel))
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        settings: &GenSettings,
        on_token: &mut dyn FnMut(Sampled) -> ControlFlow<()>,
    ) -> Result<GenOutcome, BackendError> {
        self.in_phase("decode", |s| s.generate_inner(prompt, settings, on_token))
    }

    fn logits_known(&self) -> bool {
        self.session.logits().is_some()
    }

    fn reachable(&self) -> Vec<RangeInclusive<usize>> {
        self.session.reachable()
    }

    fn park(&self) -> Result<Box<dyn Parked>, BackendError> {
        let snap = self.session.snapshot().map_err(engine_error)?;
        Ok(Box::new(ParkedSnapshot(snap)))
    }

    fn unpark(&mut self, parked: &dyn Parked) -> Result<(), BackendError> {
        let snap = downcast(parked)?;
        self.session.restore(&snap.0).map_err(engine_error)
    }

    fn write_parked(&self, parked: &dyn Parked, out: &mut dyn Write) -> Result<(), BackendError> {
        let snap = downcast(parked)?;
        self.session
            .write_snapshot(&snap.0, out)
            .map_err(engine_error)
    }

    fn read_parked(&self, input: &mut dyn Read) -> Result<Box<dyn Parked>, BackendError> {
        let snap = self.session.read_snapshot(input).map_err(engine_error)?;
        Ok(Box::new(ParkedSnapshot(snap)))
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }
}

fn downcast(parked: &dyn Parked) -> Result<&ParkedSnapshot, BackendError> {
    parked
        .as_any()
        .downcast_ref::<ParkedSnapshot>()
        .ok_or_else(|| BackendError::Engine("a parked state of another engine".into()))
}

impl EngineSession {
    /// `Session::sync` in steps of [`PREFILL_CHUNK`] tokens (the chunks one `sync`
    /// call would evaluate), polling `cancel` between them.
    fn sync_chunks(
        &mut self,
        prompt: &[u32],
        cancel: &dyn Fn() -> bool,
    ) -> Result<SyncOutcome, BackendError> {
        let keep = reusable_prefix(
            self.session.tokens(),
            prompt,
            self.session.n_ctx(),
            self.session.logits().is_some(),
        )?;
        let t0 = Instant::now();
        // A recurrent state rewinds only to its checkpoints: the tokens between the
        // checkpoint and `keep` are evaluated again, and not counted as reused.
        let keep = if keep < self.session.tokens().len() {
            crate::backend::reach(&self.session.reachable(), keep)
        } else {
            keep
        };
        let mut evaluated = 0;
        let mut end = keep;
        while end + PREFILL_CHUNK < prompt.len() {
            if cancel() {
                return Err(BackendError::Cancelled);
            }
            end += PREFILL_CHUNK;
            evaluated += self
                .session
                .sync(&prompt[..end], &mut |_, _| {})
                .map_err(engine_error)?
                .evaluated;
        }
        if cancel() {
            return Err(BackendError::Cancelled);
        }
        evaluated += self
            .session
            .sync(prompt, &mut |_, _| {})
            .map_err(engine_error)?
            .evaluated;
        Ok(SyncOutcome::timed(keep, evaluated, t0))
    }

    fn generate_inner(
        &mut self,
        prompt: &[u32],
        settings: &GenSettings,
        on_token: &mut dyn FnMut(Sampled) -> ControlFlow<()>,
    ) -> Result<GenOutcome, BackendError> {
        let params = GenerateParams {
            max_tokens: settings.max_tokens,
            sampler: sampler_params(&settings.sampler),
            seed: settings.seed,
            needs_logits: settings.top_logprobs.is_some(),
        };
        let tok = self.tokenizer.clone();
        let k = settings.top_logprobs;
        let stats = generate(
            &mut self.session,
            prompt,
            &params,
            &|t| tok.is_eog(t),
            &mut |_, _| {},
            &mut |id, logits| {
                on_token(Sampled {
                    id,
                    logprob: k.map(|_| logprob(logits, id)),
                    top: k.map_or_else(Vec::new, |k| top_logprobs(logits, k)),
                })
            },
        )
        .map_err(engine_error)?;
        Ok(GenOutcome {
            generated: stats.generated_tokens,
            decode_time: stats.decode_time,
            stop: gen_stop(stats.stop),
        })
    }
}

/// The worker's view of a loaded model with a session of `n_ctx` tokens.
pub fn engine_model(
    model: LoadedModel,
    n_ctx: usize,
    phase: Option<PhaseHook>,
) -> Result<ModelParts, BackendError> {
    let session = Session::new(model.model.clone(), n_ctx).map_err(engine_error)?;
    let tokenizer = model.tokenizer.clone();
    let identity = identity(&model, n_ctx);
    let vocab: Arc<dyn Vocab> = Arc::new(EngineVocab::new(Arc::new(model)));
    Ok((
        vocab,
        Box::new(EngineSession {
            session,
            tokenizer,
            phase,
            identity,
        }),
    ))
}

/// Serves `model` as `config` says on `listener` (from [`crate::bind`], bound before
/// the model was loaded) until SIGINT/SIGTERM (blocking). `ready` is called with the
/// bound address once the server listens (the CLI prints it); `phase` hears the
/// engine's phases.
pub fn serve_with(
    listener: std::net::TcpListener,
    config: ServerConfig,
    model: LoadedModel,
    n_ctx: usize,
    ready: impl FnOnce(SocketAddr) + Send + 'static,
    phase: Option<PhaseHook>,
) -> anyhow::Result<()> {
    let (vocab, engine) = engine_model(model, n_ctx, phase)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ds4-http")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let handle = crate::server::start_on(listener, config, vocab, engine).await?;
        ready(handle.addr());
        handle.run_until_signal().await?;
        anyhow::Ok(())
    })
}

/// [`serve_with`] on `args`' address, without a ready callback.
pub fn serve(args: ServeArgs, model: LoadedModel, n_ctx: usize) -> anyhow::Result<()> {
    let config = args.config();
    let listener = crate::bind(&config)?;
    serve_with(listener, config, model, n_ctx, |_| {}, None)
}
