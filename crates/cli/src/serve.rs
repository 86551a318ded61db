//! `ds4-server serve`: the OpenAI- and Anthropic-compatible HTTP server (`ds4-http`).

use anyhow::Result;
use clap::Args;

use crate::common::{ModelArgs, load};
use crate::gpu_probe::{self, GpuProbeArgs, set_phase};

#[derive(Args, Debug)]
pub struct ServeCmd {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub server: ds4_http::ServeArgs,
    #[command(flatten)]
    pub probe: GpuProbeArgs,
}

pub fn main(a: ServeCmd) -> Result<()> {
    // The address first: a busy port is said before a model of many GB is loaded.
    let config = a.server.config();
    let listener = ds4_http::bind(&config)?;
    let everywhere = matches!(config.host.as_str(), "0.0.0.0" | "::" | "[::]");
    if everywhere && config.api_key.is_none() {
        eprintln!(
            "warning: listening on every interface without --api-key: anyone who can reach this machine can use the model"
        );
    }
    let probe = a.probe.start(a.model.ordinal())?;
    set_phase(&probe, "load");
    let lm = load(&a.model)?;
    let n_ctx = a.model.n_ctx(&lm);
    set_phase(&probe, "idle");
    let hook = probe.as_ref().map(|p| p.phase_hook());
    let served = ds4_http::serve_with(
        listener,
        config,
        lm,
        n_ctx,
        |addr| {
            eprintln!(
                "serving on http://{addr} (OpenAI base URL http://{addr}/v1, Anthropic http://{addr})"
            )
        },
        hook,
    );
    gpu_probe::finish(probe);
    served
}
