//! `ds4-server convert`: a Hugging Face checkpoint (or a synthetic model) to GGUF
//! (`ds4-convert`).

use anyhow::Result;

pub fn main(args: ds4_convert::ConvertArgs) -> Result<()> {
    let report = ds4_convert::run(&args)?;
    eprintln!(
        "wrote {} ({} tensors, {:.1} MB of tensor data)",
        args.output.display(),
        report.tensors,
        report.bytes as f64 / 1e6
    );
    for (name, asked, written) in &report.fallbacks {
        eprintln!("  {name}: written as {written} (rows are not whole {asked} blocks)");
    }
    if !report.unused.is_empty() {
        eprintln!(
            "  {} checkpoint tensors were not used: {}",
            report.unused.len(),
            report.unused.join(", ")
        );
    }
    Ok(())
}
