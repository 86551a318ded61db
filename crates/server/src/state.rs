//! The state every handler shares.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::backend::Vocab;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::output::ToolFormat;
use crate::worker::Worker;

/// The names of the served model.
#[derive(Debug, Clone)]
pub struct ModelNames {
    /// The id: listed first by `/v1/models`, and the name every response carries.
    pub id: String,
    /// Further ids given with `--alias` (listed too).
    pub aliases: Vec<String>,
    /// The human-readable name (GGUF `general.name`): `display_name` in model
    /// objects; with `--strict-model` requests may use it too.
    pub display_name: Option<String>,
}

impl ModelNames {
    /// Whether `name` is the id, an alias or the display name (ASCII case-insensitive):
    /// the names `--strict-model` accepts.
    pub fn matches(&self, name: &str) -> bool {
        self.ids()
            .chain(self.display_name.as_ref())
            .any(|n| n.eq_ignore_ascii_case(name))
    }

    /// The ids `/v1/models` lists: the id, then the aliases.
    pub fn ids(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.id).chain(&self.aliases)
    }

    /// The display name, else the id.
    pub fn display(&self) -> &str {
        self.display_name.as_deref().unwrap_or(&self.id)
    }
}

/// `name` as a model id: lowercase ASCII letters, digits and `.`, `_`, `-`; every other
/// run of characters becomes one `-` (`Qwen2.5 Coder 0.5B` → `qwen2.5-coder-0.5b`).
/// Never empty (`model`).
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches(['-', '.']).to_string();
    if out.is_empty() { "model".into() } else { out }
}

/// Shared by all handlers.
pub struct AppState {
    pub vocab: Arc<dyn Vocab>,
    pub worker: Arc<Worker>,
    pub metrics: Arc<Metrics>,
    pub config: ServerConfig,
    pub names: ModelNames,
    /// The tool-call format of the model's template.
    pub tool_format: ToolFormat,
    /// Unix time the server started (the models' `created`).
    pub started: u64,
    pub shutting_down: AtomicBool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(
            slug("smollm2-135m-instruct-q4_1"),
            "smollm2-135m-instruct-q4_1"
        );
        assert_eq!(
            slug("Qwen2.5 Coder 0.5B Instruct AWQ"),
            "qwen2.5-coder-0.5b-instruct-awq"
        );
        assert_eq!(slug("  My  Model (v2)!"), "my-model-v2");
        assert_eq!(slug("模型"), "model");
        assert_eq!(slug(""), "model");
    }

    #[test]
    fn names_match_ids_aliases_and_the_display_name() {
        let n = ModelNames {
            id: "qwen2.5-coder-0.5b".into(),
            aliases: vec!["coder".into()],
            display_name: Some("Qwen2.5 Coder 0.5B".into()),
        };
        for name in [
            "qwen2.5-coder-0.5b",
            "QWEN2.5-CODER-0.5B",
            "coder",
            "qwen2.5 coder 0.5b",
        ] {
            assert!(n.matches(name), "{name}");
        }
        assert!(!n.matches("gpt-4o"));
        assert_eq!(n.ids().collect::<Vec<_>>(), ["qwen2.5-coder-0.5b", "coder"]);
        assert_eq!(n.display(), "Qwen2.5 Coder 0.5B");
    }
}
