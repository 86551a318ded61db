//! `ds4-convert`: a Hugging Face checkpoint (`config.json` + `*.safetensors`) of the
//! `glm5_next` family (GLM-5.3-Flash) to GGUF, with the tensor names and metadata keys
//! llama.cpp uses for this architecture (`docs/glm5_next_gguf.md`), quantized with
//! `ds4-quant` (F32, BF16, F16, Q8_0; Q4_K, Q2_K, IQ2_XXS for the routed experts).
//!
//! The binary's `convert` subcommand is [`ConvertArgs`] + [`run`]. Modules:
//! [`hf_config`] (the checkpoint's configuration), [`source`] (safetensors reading),
//! [`glm5_next`] (the mapping), [`quantize`] (output types), [`synth`] (a random-weight
//! model of GLM-5.3-Flash's geometry, for benchmarks), [`vocab`] (copying a tokenizer
//! from another GGUF).
//!
//! The GGUF is assembled in memory before it is written (`ds4_gguf::GgufWriter`), so
//! the output must fit in RAM; converting the full GLM-5.3-Flash needs a streaming
//! writer.

pub mod glm5_next;
pub mod hf_config;
pub mod quantize;
pub mod source;
pub mod synth;
pub mod vocab;

use std::path::{Path, PathBuf};

use ds4_gguf::{GgmlType, GgufFile, GgufWriter};

pub use glm5_next::Options;
pub use hf_config::TextConfig;
pub use quantize::OutType;

/// Errors of the converter; each names the file, key or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Tensor(String),
    #[error(transparent)]
    Gguf(#[from] ds4_gguf::GgufError),
}

/// What a conversion wrote.
#[derive(Debug, Default, Clone)]
pub struct ConvertReport {
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data.
    pub bytes: u64,
    /// Tensors written in another type than asked: (name, asked, written), because their
    /// rows are not a whole number of the asked type's blocks.
    pub fallbacks: Vec<(String, GgmlType, GgmlType)>,
    /// Checkpoint tensors not used (besides the vision tower, `shared_head` and the MTP
    /// layer, which the text model ignores).
    pub unused: Vec<String>,
}

impl ConvertReport {
    /// What a user is told after writing `output`: the totals, then one line per
    /// fallback and one for unused checkpoint tensors (lines end with `\n`).
    pub fn summary(&self, output: &std::path::Path) -> String {
        let mut s = format!(
            "wrote {} ({} tensors, {:.1} MB of tensor data)\n",
            output.display(),
            self.tensors,
            self.bytes as f64 / 1e6
        );
        for (name, asked, written) in &self.fallbacks {
            s += &format!("  {name}: written as {written} (rows are not whole {asked} blocks)\n");
        }
        if !self.unused.is_empty() {
            s += &format!(
                "  {} checkpoint tensors were not used: {}\n",
                self.unused.len(),
                self.unused.join(", ")
            );
        }
        s
    }
}

/// `ds4-server convert`: checkpoint directory (or a synthetic model) to GGUF.
#[derive(clap::Args, Debug, Clone)]
pub struct ConvertArgs {
    /// The checkpoint directory (`config.json` and `*.safetensors`); not needed with
    /// `--synthetic`.
    pub input: Option<PathBuf>,
    /// The GGUF file to write.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Type of the weight matrices.
    #[arg(long = "outtype", value_enum, default_value = "bf16")]
    pub outtype: OutType,
    /// Type of the routed experts' matrices (default: `--outtype`).
    #[arg(long = "expert-type", value_enum)]
    pub expert_type: Option<OutType>,
    /// Copy the tokenizer (`tokenizer.*` metadata) from this GGUF file (default: build it
    /// from the checkpoint's `tokenizer.json` when there is one).
    #[arg(long = "vocab-from")]
    pub vocab_from: Option<PathBuf>,
    /// `general.name` (default: the input directory's name).
    #[arg(long = "name")]
    pub name: Option<String>,
    /// Write a random-weight model of this preset instead of converting a checkpoint.
    #[arg(long = "synthetic", value_enum)]
    pub synthetic: Option<synth::Preset>,
    /// Seed of the synthetic weights.
    #[arg(long = "seed", default_value_t = 1, allow_negative_numbers = true,
          value_parser = ds4_args::int::<u64>(..))]
    pub seed: u64,
}

/// Runs the `convert` subcommand: reads, converts, writes `args.output`.
///
/// # Errors
/// [`ConvertError`] from reading the checkpoint, converting or writing.
pub fn run(args: &ConvertArgs) -> Result<ConvertReport, ConvertError> {
    let vocab = match &args.vocab_from {
        Some(p) => Some(GgufFile::open(p)?),
        None => None,
    };
    let mut w = GgufWriter::new();
    let report = if let Some(preset) = args.synthetic {
        let n_vocab = vocab.as_ref().map(vocab::token_count).transpose()?;
        let (cfg, src) = synth::model(preset, n_vocab, args.seed)?;
        let opts = Options {
            outtype: args.outtype,
            expert_type: args.expert_type,
            name: args
                .name
                .clone()
                .unwrap_or_else(|| format!("glm5next-synthetic-{}", preset.name())),
        };
        glm5_next::convert(&src, &cfg, &opts, &mut w)?
    } else {
        let dir = args.input.as_deref().ok_or_else(|| {
            ConvertError::Config("give a checkpoint directory or --synthetic".into())
        })?;
        let name = args.name.clone().unwrap_or_else(|| {
            dir.file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "glm5next".into())
        });
        let opts = Options {
            outtype: args.outtype,
            expert_type: args.expert_type,
            name,
        };
        let report = convert_dir(dir, &opts, &mut w)?;
        if vocab.is_none() {
            let n_vocab = w
                .metadata()
                .get(&format!("{}.vocab_size", glm5_next::ARCH))
                .and_then(|v| v.as_u64())
                .unwrap_or(0) as usize;
            for (k, v) in vocab::from_hf(dir, n_vocab)?.unwrap_or_default() {
                w.add_metadata(k, v)?;
            }
        }
        report
    };
    if let Some(v) = &vocab {
        vocab::copy(v, &mut w)?;
    }
    w.write_file(&args.output)?;
    Ok(report)
}

/// Converts the checkpoint in `dir` into `w`.
///
/// # Errors
/// As [`run`].
pub fn convert_dir(
    dir: &Path,
    opts: &Options,
    w: &mut GgufWriter,
) -> Result<ConvertReport, ConvertError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ConvertError::Io {
        path: cfg_path.display().to_string(),
        source: e,
    })?;
    let cfg = TextConfig::parse(&text)?;
    let src = source::SafetensorsDir::open(dir)?;
    let _span = tracing::info_span!("convert", dir = %dir.display()).entered();
    glm5_next::convert(&src, &cfg, opts, w)
}
