//! `ds4-convert`: a Hugging Face checkpoint (`config.json` + `*.safetensors`) to GGUF,
//! with the tensor names and metadata keys llama.cpp uses for the architecture, for the
//! families `glm5_next` (GLM-5.3-Flash, `docs/glm5_next_gguf.md`) and `deepseek_v4`
//! (DeepSeek-V4-Flash, llama.cpp's `deepseek4`, `docs/deepseek4_gguf.md`), quantized
//! with `ds4-quant` (F32, BF16, F16, Q8_0; Q4_K, Q2_K, IQ2_XXS, MXFP4 for the routed
//! experts). The family comes from `config.json`'s `model_type` / `architectures`
//! ([`Family::detect`]).
//!
//! The binary's `convert` subcommand is [`ConvertArgs`] + [`run`]. Modules:
//! [`hf_config`] (GLM-5.3's configuration), [`source`] (safetensors reading),
//! [`glm5_next`] and [`deepseek4`] (the mappings), [`quantize`] (output types),
//! [`synth`] (a random-weight model of GLM-5.3-Flash's geometry, for benchmarks),
//! [`vocab`] (tokenizers: copied from another GGUF or built from `tokenizer.json`).
//!
//! The GGUF is assembled in memory before it is written (`ds4_gguf::GgufWriter`), so
//! the output must fit in RAM; converting the full models needs a streaming writer.

pub mod deepseek4;
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

/// The model families the converter knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// GLM-5.3-Flash (`model_type` `glm5_next`, `Glm5NextForConditionalGeneration`).
    Glm5Next,
    /// DeepSeek-V4-Flash (`model_type` `deepseek_v4`, `DeepseekV4ForCausalLM`).
    DeepSeekV4,
}

impl Family {
    /// The family of a checkpoint from its `config.json` text: `model_type` (also a
    /// nested `text_config.model_type`), else `architectures`.
    ///
    /// # Errors
    /// [`ConvertError::Config`] for malformed JSON or a family this converter does not
    /// know, naming what the config says and the families it knows.
    pub fn detect(text: &str) -> Result<Family, ConvertError> {
        let root: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| ConvertError::Config(format!("config.json: {e}")))?;
        let mt = |v: &serde_json::Value| {
            v.get("model_type")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        };
        let model_type = mt(&root).or_else(|| root.get("text_config").and_then(mt));
        let archs: Vec<String> = root
            .get("architectures")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        match model_type.as_deref() {
            Some("glm5_next" | "glm5_next_text") => return Ok(Family::Glm5Next),
            Some("deepseek_v4") => return Ok(Family::DeepSeekV4),
            _ => {}
        }
        for a in &archs {
            match a.as_str() {
                "Glm5NextForConditionalGeneration" | "Glm5NextForCausalLM" => {
                    return Ok(Family::Glm5Next);
                }
                "DeepseekV4ForCausalLM" => return Ok(Family::DeepSeekV4),
                _ => {}
            }
        }
        Err(ConvertError::Config(format!(
            "config.json: model_type {} with architectures {:?} is not a family this converter knows \
             (glm5_next: Glm5NextForConditionalGeneration; deepseek_v4: DeepseekV4ForCausalLM)",
            model_type.map_or("(none)".to_string(), |m| format!("'{m}'")),
            archs
        )))
    }
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
    /// No tokenizer was written (no `tokenizer.json` and no `--vocab-from`): the file
    /// does not run until one is added.
    pub no_tokenizer: bool,
}

impl ConvertReport {
    /// What a user is told after writing `output`: the totals, then one line per kind of
    /// fallback (asked and written type, with the first names), one for unused
    /// checkpoint tensors and a warning when no tokenizer was written (lines end with
    /// `\n`).
    pub fn summary(&self, output: &std::path::Path) -> String {
        let mut s = format!(
            "wrote {} ({} tensors, {:.1} MB of tensor data)\n",
            output.display(),
            self.tensors,
            self.bytes as f64 / 1e6
        );
        let mut kinds: Vec<(GgmlType, GgmlType, Vec<&str>)> = Vec::new();
        for (name, asked, written) in &self.fallbacks {
            match kinds.iter_mut().find(|k| k.0 == *asked && k.1 == *written) {
                Some(k) => k.2.push(name),
                None => kinds.push((*asked, *written, vec![name])),
            }
        }
        for (asked, written, names) in &kinds {
            let more = if names.len() > 3 { ", …" } else { "" };
            let plural = if names.len() == 1 { "" } else { "s" };
            s += &format!(
                "  {} tensor{plural} written as {written}, not {asked} (rows are not whole {asked} blocks): {}{more}\n",
                names.len(),
                names[..names.len().min(3)].join(", ")
            );
        }
        if !self.unused.is_empty() {
            s += &format!(
                "  {} checkpoint tensors were not used: {}\n",
                self.unused.len(),
                self.unused.join(", ")
            );
        }
        if self.no_tokenizer {
            s += "warning: no tokenizer written (no tokenizer.json in the checkpoint, no \
                  --vocab-from): the file runs only after converting again with --vocab-from \
                  FILE.gguf (a GGUF of the same vocabulary)\n";
        }
        s
    }
}

/// `ds4-server convert`: checkpoint directory (or a synthetic model) to GGUF.
#[derive(clap::Args, Debug, Clone)]
pub struct ConvertArgs {
    /// The checkpoint directory (`config.json` and `*.safetensors`); not with
    /// `--synthetic`.
    #[arg(conflicts_with = "synthetic")]
    pub input: Option<PathBuf>,
    /// The GGUF file to write.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Type of the weight matrices.
    #[arg(long = "outtype", value_enum, default_value = "bf16")]
    pub outtype: OutType,
    /// Type of the routed experts' matrices (default: `--outtype` for GLM-5.3, MXFP4 for
    /// DeepSeek-V4).
    #[arg(long = "expert-type", value_enum)]
    pub expert_type: Option<OutType>,
    /// DeepSeek-V4: also write the MTP block (`mtp.*` → llama.cpp's `blk.{L}.nextn.*`).
    #[arg(long = "mtp")]
    pub mtp: bool,
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
                .unwrap_or_else(|| format!("glm5-next-synthetic-{}", preset.name())),
        };
        glm5_next::convert(&src, &cfg, &opts, &mut w)?
    } else {
        let dir = args.input.as_deref().ok_or_else(|| {
            ConvertError::Config("give a checkpoint directory or --synthetic".into())
        })?;
        let name = args.name.clone().unwrap_or_else(|| {
            dir.file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "glm5-next".into())
        });
        let opts = Options {
            outtype: args.outtype,
            expert_type: args.expert_type,
            name,
        };
        check_output_outside(dir, &args.output)?;
        let report = convert_family(dir, &opts, args.mtp, &mut w)?;
        let text = read_config(dir)?;
        let (n_vocab, flavor) = match Family::detect(&text)? {
            Family::Glm5Next => (
                w.metadata()
                    .get(&format!("{}.vocab_size", glm5_next::ARCH))
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0) as usize,
                vocab::Flavor::GLM,
            ),
            Family::DeepSeekV4 => (
                deepseek4::Config::parse(&text)?.vocab_size,
                vocab::Flavor::DEEPSEEK,
            ),
        };
        match &vocab {
            // The embedding's rows and the tokenizer's tokens must agree (llama.cpp
            // refuses the file otherwise, and ids past either have no meaning).
            Some(v) => {
                let tokens = vocab::token_count(v)?;
                if tokens != n_vocab {
                    return Err(ConvertError::Config(format!(
                        "--vocab-from {}: {tokens} tokens, but the checkpoint's vocabulary has {n_vocab} (vocab_size); give a GGUF of the same vocabulary",
                        v.label()
                    )));
                }
            }
            None => {
                for (k, v) in vocab::from_hf_with(dir, n_vocab, &flavor)?.unwrap_or_default() {
                    w.add_metadata(k, v)?;
                }
            }
        }
        report
    };
    if let Some(v) = &vocab {
        vocab::copy(v, &mut w)?;
    }
    w.write_file(&args.output)?;
    let mut report = report;
    report.no_tokenizer = w.metadata().get("tokenizer.ggml.model").is_none();
    Ok(report)
}

/// Refuses an output path that names a file of the checkpoint itself (its config,
/// tokenizer or weights): writing it would destroy the input.
fn check_output_outside(dir: &Path, output: &Path) -> Result<(), ConvertError> {
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (Ok(parent), Ok(dir)) = (parent.canonicalize(), dir.canonicalize()) else {
        return Ok(());
    };
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned());
    let input_file = name.is_some_and(|n| n.ends_with(".safetensors") || n.ends_with(".json"));
    if parent == dir && input_file {
        return Err(ConvertError::Config(format!(
            "-o {}: a file of the checkpoint being converted; write the GGUF elsewhere",
            output.display()
        )));
    }
    Ok(())
}

/// The text of `dir/config.json`.
fn read_config(dir: &Path) -> Result<String, ConvertError> {
    let cfg_path = dir.join("config.json");
    std::fs::read_to_string(&cfg_path).map_err(|e| ConvertError::Io {
        path: cfg_path.display().to_string(),
        source: e,
    })
}

/// Converts the checkpoint in `dir` into `w`, for the family its `config.json` names.
///
/// # Errors
/// As [`run`].
pub fn convert_dir(
    dir: &Path,
    opts: &Options,
    w: &mut GgufWriter,
) -> Result<ConvertReport, ConvertError> {
    convert_family(dir, opts, false, w)
}

/// As [`convert_dir`], with DeepSeek-V4's MTP block when `mtp`.
///
/// # Errors
/// As [`run`]; `mtp` for a family without MTP export.
pub fn convert_family(
    dir: &Path,
    opts: &Options,
    mtp: bool,
    w: &mut GgufWriter,
) -> Result<ConvertReport, ConvertError> {
    let text = read_config(dir)?;
    let family = Family::detect(&text)?;
    let src = source::SafetensorsDir::open(dir)?;
    let _span = tracing::info_span!("convert", dir = %dir.display(), ?family).entered();
    match family {
        Family::Glm5Next => {
            if mtp {
                return Err(ConvertError::Config(
                    "--mtp: the glm5_next converter does not export the MTP layer".into(),
                ));
            }
            let cfg = TextConfig::parse(&text)?;
            glm5_next::convert(&src, &cfg, opts, w)
        }
        Family::DeepSeekV4 => {
            let cfg = deepseek4::Config::parse(&text)?;
            let o = deepseek4::Options {
                outtype: opts.outtype,
                expert_type: opts.expert_type,
                name: opts.name.clone(),
                mtp,
            };
            deepseek4::convert(&src, &cfg, &o, w)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_groups_fallbacks_and_warns_without_a_tokenizer() {
        let fb = |n: &str, w| (n.to_string(), GgmlType::Q4_K, w);
        let report = ConvertReport {
            tensors: 7,
            bytes: 2_000_000,
            fallbacks: vec![
                fb("a", GgmlType::Q8_0),
                fb("b", GgmlType::F16),
                fb("c", GgmlType::Q8_0),
                fb("d", GgmlType::Q8_0),
                fb("e", GgmlType::Q8_0),
            ],
            unused: Vec::new(),
            no_tokenizer: true,
        };
        let s = report.summary(Path::new("out.gguf"));
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0],
            "wrote out.gguf (7 tensors, 2.0 MB of tensor data)"
        );
        assert_eq!(
            lines[1],
            "  4 tensors written as q8_0, not q4_K (rows are not whole q4_K blocks): a, c, d, …"
        );
        assert_eq!(
            lines[2],
            "  1 tensor written as f16, not q4_K (rows are not whole q4_K blocks): b"
        );
        assert!(lines[3].starts_with("warning: no tokenizer written"), "{s}");
        assert!(lines[3].contains("--vocab-from FILE.gguf"), "{s}");
        assert_eq!(lines.len(), 4);
    }
}
