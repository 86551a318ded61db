//! `ds4-server convert`: a Hugging Face checkpoint (or a synthetic model) to GGUF
//! (`ds4-convert`).

use anyhow::Result;

pub fn main(args: ds4_convert::ConvertArgs) -> Result<()> {
    let report = ds4_convert::run(&args)?;
    eprint!("{}", report.summary(&args.output));
    Ok(())
}
