//! `ds4-server serve`: the OpenAI- and Anthropic-compatible HTTP server (`ds4-http`).

use anyhow::Result;
use clap::Args;

use crate::common::{ModelArgs, load};

#[derive(Args, Debug)]
pub struct ServeCmd {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub server: ds4_http::ServeArgs,
}

pub fn main(a: ServeCmd) -> Result<()> {
    let lm = load(&a.model)?;
    ds4_http::serve_with(a.server, lm, a.model.ctx, |addr| {
        eprintln!(
            "serving on http://{addr} (OpenAI base URL http://{addr}/v1, Anthropic http://{addr})"
        )
    })
}
