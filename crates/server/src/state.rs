//! The state every handler shares.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::backend::Vocab;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::output::ToolFormat;
use crate::worker::Worker;

/// The names the served model answers to.
#[derive(Debug, Clone)]
pub struct ModelNames {
    /// The canonical id (listed first by `/v1/models`).
    pub id: String,
    pub aliases: Vec<String>,
}

impl ModelNames {
    /// Whether `name` is the id or an alias (ASCII case-insensitive).
    pub fn matches(&self, name: &str) -> bool {
        std::iter::once(&self.id)
            .chain(&self.aliases)
            .any(|n| n.eq_ignore_ascii_case(name))
    }

    /// The id and the aliases.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.id).chain(&self.aliases)
    }
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
