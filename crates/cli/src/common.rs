//! Options and helpers shared by the subcommands: model resolution and loading,
//! threads, sampling flags, the stats line and progress bars.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use ds4_args::{int, real};
use ds4_cuda::CudaBackend;
use ds4_engine::generate::GenerateStats;
use ds4_engine::partition::{self, Attention, Budget, Layout, Plan};
use ds4_engine::sampler::SamplerParams;
use ds4_engine::{LoadedModel, Session, human_bytes};
use ds4_gguf::GgufFile;
use indicatif::{ProgressBar, ProgressStyle};

/// The model to load and how to run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the cached default model, smollm2-135m).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context size in tokens (default: 4096, or the model's trained context if smaller;
    /// at most the trained context).
    #[arg(long = "ctx", value_name = "N", allow_negative_numbers = true, value_parser = int::<usize>(1..))]
    pub ctx: Option<usize>,
    /// CPU threads (default or 0: all cores; at most 8 per core).
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = int::<usize>(0..))]
    pub threads: Option<usize>,
    /// Where the model runs.
    #[arg(long = "backend", value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// The GPU to run on with --backend cuda (default 0), numbered after
    /// CUDA_VISIBLE_DEVICES.
    #[arg(long = "device", value_name = "N", allow_negative_numbers = true, value_parser = int::<usize>(0..))]
    pub device: Option<usize>,
    /// GPUs to spread the model over with --backend cuda (default 1): devices 0 to N-1
    /// after CUDA_VISIBLE_DEVICES. More than 1 is not implemented yet: it checks the
    /// model's multi-GPU plan, the GPUs and NCCL, and stops with what it found.
    #[arg(long = "gpus", value_name = "N", allow_negative_numbers = true, value_parser = int::<usize>(1..))]
    pub gpus: Option<usize>,
}

/// The default context size (clamped to the model's trained context).
pub const DEFAULT_CTX: usize = 4096;

impl ModelArgs {
    /// The context size for `lm`: `--ctx`, else [`DEFAULT_CTX`] or the model's trained
    /// context if smaller.
    /// The CUDA device a one-GPU run uses (`--device`, else 0).
    pub fn ordinal(&self) -> usize {
        self.device.unwrap_or(0)
    }

    pub fn n_ctx(&self, lm: &LoadedModel) -> usize {
        let train = lm.model.info().n_ctx_train;
        self.ctx.unwrap_or(if train > 0 {
            DEFAULT_CTX.min(train)
        } else {
            DEFAULT_CTX
        })
    }
}

/// The backends a model can run on.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    /// An NVIDIA GPU (--device N, default 0; kernels compiled at run time with NVRTC).
    Cuda,
}

/// A loaded model and, on CUDA, the backend (for its statistics).
pub struct Loaded {
    pub lm: LoadedModel,
    pub cuda: Option<Arc<CudaBackend>>,
}

/// Sampling flags, with ds4's defaults (temperature 1, top-p 1, min-p 0.05, top-k off).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature, 0 to 100; 0 is greedy.
    #[arg(long = "temp", default_value_t = 1.0, allow_negative_numbers = true, value_parser = real::<f32>(0.0..=100.0))]
    pub temp: f32,
    /// Keep the k most likely tokens (0: off).
    #[arg(long = "top-k", default_value_t = 0, allow_negative_numbers = true, value_parser = int::<i32>(0..))]
    pub top_k: i32,
    /// Nucleus sampling threshold, 0 to 1 (as in ds4, 0 and 1 both turn it off).
    #[arg(long = "top-p", default_value_t = 1.0, allow_negative_numbers = true, value_parser = real::<f32>(0.0..=1.0))]
    pub top_p: f32,
    /// Drop tokens less likely than min-p × the top token's probability (0 to 1).
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true, value_parser = real::<f32>(0.0..=1.0))]
    pub min_p: f32,
    /// RNG seed, a non-negative integer (default: from the clock).
    #[arg(long = "seed", allow_negative_numbers = true, value_parser = int::<u64>(..))]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplerParams {
        SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.as_nanos() as u64 | 1
        })
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default: warnings; the server also logs
/// its requests and prefills).
pub fn init_tracing(server: bool) {
    let default = if server { "warn,ds4_http=info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Sets rayon's global pool size: `threads` (0 or `None`: one per core), at most 8 per
/// core (more only adds switching; a mistyped count could start thousands).
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = match threads {
        None | Some(0) => cores,
        Some(n) if n > 8 * cores => {
            bail!(
                "--threads {n}: at most {} (8 per core; this machine has {cores})",
                8 * cores
            )
        }
        Some(n) => n,
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .context("starting the thread pool")?;
    Ok(())
}

/// Resolves the model path: `-m FILE`, else the cached default model.
pub fn model_path(args: &ModelArgs) -> Result<PathBuf> {
    if let Some(p) = &args.model {
        if !p.exists() {
            bail!("model file {} does not exist", p.display());
        }
        return Ok(p.clone());
    }
    let name = crate::pull::DEFAULT_MODEL;
    match crate::pull::model_path(name) {
        Some(p) => Ok(p),
        None => bail!(
            "no model given and the default model is not in {} — run `ds4-server pull {name}` (or `make chat`), or pass -m FILE",
            ds4_dirs::models_dir().display()
        ),
    }
}

/// Loads the model named by `args`, with a spinner on a terminal.
pub fn load(args: &ModelArgs) -> Result<LoadedModel> {
    Ok(load_on(args)?.lm)
}

/// Loads the model named by `args` on the chosen backend.
pub fn load_on(args: &ModelArgs) -> Result<Loaded> {
    check_backend_flags(args)?;
    init_threads(args.threads)?;
    let path = model_path(args)?;
    let cuda = match args.backend {
        BackendKind::Cpu => None,
        BackendKind::Cuda => {
            let ordinal = gpu_ordinal(args, || {
                Ok(Layout::from_gguf(
                    &GgufFile::open(&path)
                        .with_context(|| format!("reading {}", path.display()))?,
                )?)
            })?;
            Some(cuda_backend(ordinal)?)
        }
    };
    let bar = spinner(&format!("loading {}", path.display()));
    let lm = match &cuda {
        None => LoadedModel::open(&path),
        Some(b) => LoadedModel::open_with(&path, |f, p| ds4_cuda::load_model(b.clone(), f, p)),
    };
    bar.finish_and_clear();
    // The loader's errors name the file.
    let lm = lm.context("loading the model")?;
    // A `--ctx` the model cannot take is refused before the report prices it.
    let n_ctx = args.n_ctx(&lm);
    Session::check_ctx(lm.model.info(), n_ctx)?;
    eprintln!("{}", memory_report(&lm, n_ctx));
    Ok(Loaded { lm, cuda })
}

/// The load report: where the model runs, its weights, the memory one `n_ctx`-token
/// sequence takes by part and the backend's free memory after loading, e.g.
/// `glm.gguf on cuda: weights 96.3 GB; a 4096-token context takes 1.2 GB (KDA state
/// 0.9 GB, …); 39.8 GB free`.
pub fn memory_report(lm: &LoadedModel, n_ctx: usize) -> String {
    let info = lm.model.info();
    let weights: u64 = lm.gguf.tensors().iter().map(|t| t.n_bytes()).sum();
    let name = lm.path.file_name().unwrap_or(lm.path.as_os_str());
    let mut line = format!(
        "{} on {}: weights {}",
        name.to_string_lossy(),
        info.backend,
        human_bytes(weights)
    );
    let parts = lm.model.state_parts(n_ctx);
    if !parts.is_empty() {
        let total: u64 = parts.iter().map(|(_, b)| b).sum();
        let each: Vec<String> = parts
            .iter()
            .map(|(what, b)| format!("{what} {}", human_bytes(*b)))
            .collect();
        line += &format!(
            "; a {n_ctx}-token context takes {} ({})",
            human_bytes(total),
            each.join(", ")
        );
    }
    if let Some(free) = lm.model.memory_available() {
        line += &format!("; {} free", human_bytes(free));
    }
    line
}

/// `--device` and `--gpus` choose GPUs: an error without `--backend cuda`.
pub fn check_backend_flags(args: &ModelArgs) -> Result<()> {
    if args.backend == BackendKind::Cuda {
        return Ok(());
    }
    for (flag, given) in [
        ("--device", args.device.map(|d| d.to_string())),
        ("--gpus", args.gpus.map(|n| n.to_string())),
    ] {
        if let Some(v) = given {
            bail!("{flag} {v} chooses GPUs: it needs --backend cuda");
        }
    }
    Ok(())
}

/// The device of a one-GPU run, after checking `--device` and `--gpus` (with
/// `--backend cuda`). `--gpus N` with N > 1 always ends in an error: one naming what does
/// not fit (the model's family has no multi-GPU plan, too few GPUs, too little memory,
/// no NCCL), else the "not yet" error naming what was checked ([`multi_gpu_not_yet`]).
/// `layout` reads the model's partition layout (only for N > 1).
pub fn gpu_ordinal(args: &ModelArgs, layout: impl FnOnce() -> Result<Layout>) -> Result<usize> {
    let n = args.gpus.unwrap_or(1);
    if n == 1 {
        return Ok(args.ordinal());
    }
    if let Some(d) = args.device {
        bail!(
            "--device {d} picks one GPU and --gpus {n} uses devices 0 to {}: choose which GPUs with CUDA_VISIBLE_DEVICES instead",
            n - 1
        );
    }
    let flag = format!("--gpus {n}");
    let layout = layout().context(flag.clone())?;
    let visible = ds4_cuda::driver::visible_devices().context(flag.clone())?;
    check_gpu_count(n, visible)?;
    let mem = (0..n)
        .map(ds4_cuda::driver::device_memory)
        .try_fold(u64::MAX, |m, b| b.map(|b| m.min(b)))
        .context(flag.clone())?;
    let budget = Budget {
        mem_per_gpu: mem,
        reserve: mem / 10,
    };
    let plan = partition::plan(&layout, n, budget, Attention::Replicated).context(flag.clone())?;
    let nccl = ds4_cuda::nccl::version().context(flag)?;
    Err(multi_gpu_not_yet(&layout, &plan, nccl))
}

/// `--gpus N` against the `visible` GPUs.
fn check_gpu_count(n: usize, visible: usize) -> Result<()> {
    if n <= visible {
        return Ok(());
    }
    let mask = std::env::var("CUDA_VISIBLE_DEVICES")
        .map(|m| format!(" (CUDA_VISIBLE_DEVICES={m})"))
        .unwrap_or_default();
    bail!("--gpus {n}: {} visible{mask}", partition::gpus(visible))
}

/// The error of a `--gpus N` run whose checks all passed: multi-GPU decode does not
/// exist yet, and this is what was found.
fn multi_gpu_not_yet(layout: &Layout, plan: &Plan, nccl: (u32, u32, u32)) -> anyhow::Error {
    let n = plan.n_gpus;
    let experts = plan
        .experts
        .iter()
        .find(|r| r.iter().any(|r| !r.is_empty()))
        .map(|r| r[0].len())
        .unwrap_or(0);
    let attention = match plan.attention {
        Attention::Replicated => "attention on every GPU",
        Attention::Heads => "attention split by heads",
    };
    anyhow::anyhow!(
        "--gpus {n}: running on several GPUs is not implemented yet; nothing was run. \
         Checked: {} visible, a {} plan (about {experts} of {} routed experts per layer on each GPU, {attention}, {} of weights on the fullest of {} GPUs), NCCL {}.{}.{} loads. \
         Leave out --gpus to run on one GPU",
        partition::gpus(n),
        layout.arch,
        layout.n_expert,
        human_bytes(plan.max_weights()),
        human_bytes(plan.budget.mem_per_gpu),
        nccl.0,
        nccl.1,
        nccl.2
    )
}

/// Checks that CUDA device `ordinal` can be used, with a clear message when there is
/// no GPU or it is not one of the visible ones.
pub fn check_device(ordinal: usize) -> Result<()> {
    if let Err(why) = ds4_cuda::gpu_available() {
        bail!("--backend cuda: no usable GPU ({why})");
    }
    let visible = ds4_cuda::driver::visible_devices()?;
    if ordinal >= visible {
        bail!(
            "--device {ordinal}: {}",
            ds4_cuda::driver::out_of_range(ordinal, visible)
        );
    }
    Ok(())
}

/// Opens CUDA device `ordinal` ([`check_device`] first).
pub fn cuda_backend(ordinal: usize) -> Result<Arc<CudaBackend>> {
    check_device(ordinal)?;
    Ok(Arc::new(CudaBackend::new(ordinal).with_context(|| {
        format!("opening CUDA device {ordinal}")
    })?))
}

fn spinner(msg: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_message(msg.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

/// A progress bar for prefills long enough to notice (shown on a terminal only).
pub struct PrefillProgress {
    bar: Option<ProgressBar>,
}

impl PrefillProgress {
    /// Tokens below which no bar is shown.
    const MIN_TOKENS: usize = 1024;

    pub fn new() -> Self {
        PrefillProgress { bar: None }
    }

    /// The callback for [`ds4_engine::Session::sync`] and friends.
    pub fn update(&mut self, done: usize, total: usize) {
        if total < Self::MIN_TOKENS || !std::io::stderr().is_terminal() {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            b.set_style(
                ProgressStyle::with_template("prefill {bar:30} {pos}/{len} tokens {per_sec}")
                    .expect("static template"),
            );
            b
        });
        bar.set_position(done as u64);
        if done == total {
            bar.finish_and_clear();
        }
    }
}

/// An error and its causes on one line, `outer: inner: …`, each text once. Some library
/// errors print their source in their own message (`{path}: {source}`) and also return
/// it from `source()`, and a context may be added twice on the way up; printing the
/// chain as is would repeat them (`… (os error 2): No such file … (os error 2)`).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The one-line summary printed on stderr after each answer.
pub fn stats_line(s: &GenerateStats) -> String {
    let rate = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.1}"));
    format!(
        "[prompt {} tokens ({} cached), prefill {} tok/s, generated {} tokens, decode {} tok/s, stop: {}]",
        s.prompt_tokens,
        s.cached_tokens,
        rate(s.prefill_tps()),
        s.generated_tokens,
        rate(s.decode_tps()),
        s.stop.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapping {
        source: std::io::Error,
    }

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "receipt /x/r.json: {}", self.source)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    fn args(backend: BackendKind, device: Option<usize>, gpus: Option<usize>) -> ModelArgs {
        ModelArgs {
            model: None,
            ctx: None,
            threads: None,
            backend,
            device,
            gpus,
        }
    }

    #[test]
    fn device_and_gpus_need_the_cuda_backend() {
        let e = |a: &ModelArgs| check_backend_flags(a).unwrap_err().to_string();
        assert_eq!(
            e(&args(BackendKind::Cpu, Some(1), None)),
            "--device 1 chooses GPUs: it needs --backend cuda"
        );
        assert_eq!(
            e(&args(BackendKind::Cpu, None, Some(2))),
            "--gpus 2 chooses GPUs: it needs --backend cuda"
        );
        check_backend_flags(&args(BackendKind::Cpu, None, None)).unwrap();
        check_backend_flags(&args(BackendKind::Cuda, Some(1), Some(2))).unwrap();
    }

    #[test]
    fn one_gpu_runs_on_the_chosen_device_and_several_check_the_model_first() {
        let never = || -> Result<Layout> { panic!("the layout is only read for --gpus > 1") };
        assert_eq!(
            gpu_ordinal(&args(BackendKind::Cuda, None, None), never).unwrap(),
            0
        );
        assert_eq!(
            gpu_ordinal(&args(BackendKind::Cuda, Some(3), Some(1)), never).unwrap(),
            3
        );
        let e = gpu_ordinal(&args(BackendKind::Cuda, Some(1), Some(2)), never).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--device 1 picks one GPU and --gpus 2 uses devices 0 to 1: choose which GPUs with CUDA_VISIBLE_DEVICES instead"
        );
        // A family without a plan is refused before any GPU is looked at.
        let dense = || -> Result<Layout> {
            Err(partition::PlanError::NoPlan {
                arch: "llama".into(),
            }
            .into())
        };
        let e = gpu_ordinal(&args(BackendKind::Cuda, None, Some(4)), dense).unwrap_err();
        assert_eq!(
            error_text(&e),
            "--gpus 4: the llama family has no multi-GPU plan (plans exist for glm5-next, glm5next, deepseek4)"
        );
    }

    #[test]
    fn too_many_gpus_names_how_many_are_visible() {
        check_gpu_count(2, 2).unwrap();
        let e = check_gpu_count(2, 1).unwrap_err().to_string();
        assert!(e.starts_with("--gpus 2: 1 GPU visible"), "{e}");
        let e = check_gpu_count(8, 0).unwrap_err().to_string();
        assert!(e.starts_with("--gpus 8: 0 GPUs visible"), "{e}");
    }

    #[test]
    fn error_text_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let io_text = io.to_string();
        let e = anyhow::Error::new(Wrapping { source: io }).context("writing the receipt");
        // anyhow's own chain repeats the source the message already holds.
        assert_eq!(
            format!("{e:#}"),
            format!("writing the receipt: receipt /x/r.json: {io_text}: {io_text}")
        );
        assert_eq!(
            error_text(&e),
            format!("writing the receipt: receipt /x/r.json: {io_text}")
        );
        let twice = anyhow::anyhow!("not a GGUF file")
            .context("loading the model")
            .context("loading the model");
        assert_eq!(error_text(&twice), "loading the model: not a GGUF file");
        let distinct = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&distinct), "outer: inner");
    }
}
