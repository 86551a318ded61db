//! Command-line arguments (clap derive) for the `ds4-server` subcommands this
//! crate implements, so that the binary only flattens and dispatches:
//!
//! ```text
//! Cmd::Supervise(a) => {
//!     ds4_measure::supervise::forward_signals()?;
//!     let o = ds4_measure::supervise::supervise(&a.options(), &a.command,
//!                 std::io::stdout().lock(), std::io::stderr().lock());
//!     std::process::exit(match o { Ok(o) => o.exit_code, Err(e) => { eprintln!("{e}"); e.exit_code() } })
//! }
//! Cmd::Compare(a) => { ds4_measure::args::run_compare(&a, std::io::stdout().lock())?; }
//! // bench / eval: #[command(flatten)] receipt: ReceiptArgs
//! ```

use crate::compare::{
    CompareError, CompareOptions, Comparison, compare, explicit_sides, group_sides,
};
use crate::receipt::{GpuInfo, Receipt, ReceiptContext, ReceiptError};
use crate::supervise::SuperviseOptions;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `supervise [--mem-mb N] [--start-timeout S] [--idle-timeout S] [--sample-ms MS] [--merge] -- CMD …`
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SuperviseArgs {
    /// Kill the process tree when its summed resident memory exceeds N MiB (exit 121).
    #[arg(long = "mem-mb", value_name = "N", allow_negative_numbers = true,
          value_parser = ds4_args::int::<u64>(1..))]
    pub mem_mb: Option<u64>,
    /// Kill it when nothing is printed within S seconds of the start (exit 122).
    #[arg(long = "start-timeout", value_name = "S", allow_negative_numbers = true,
          value_parser = parse_seconds)]
    pub start_timeout: Option<Duration>,
    /// Kill it when nothing is printed for S seconds (exit 123).
    #[arg(long = "idle-timeout", value_name = "S", allow_negative_numbers = true,
          value_parser = parse_seconds)]
    pub idle_timeout: Option<Duration>,
    /// Emit a JSON resource sample every MS milliseconds (0: none).
    #[arg(long = "sample-ms", value_name = "MS", default_value_t = 1000,
          allow_negative_numbers = true, value_parser = ds4_args::int::<u64>(0..))]
    pub sample_ms: u64,
    /// Send the command's stderr and the samples to stdout too (default: stderr).
    #[arg(long)]
    pub merge: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

impl SuperviseArgs {
    /// The watchdog options. Sets `subreaper`: meant for the `ds4-server` process,
    /// whose only children are the supervised ones.
    pub fn options(&self) -> SuperviseOptions {
        SuperviseOptions {
            mem_limit_mib: self.mem_mb,
            start_timeout: self.start_timeout,
            idle_timeout: self.idle_timeout,
            sample_interval: (self.sample_ms > 0).then(|| Duration::from_millis(self.sample_ms)),
            merge: self.merge,
            subreaper: true,
        }
    }
}

/// `compare A.json B.json [C.json …]` or `compare --a A1.json A2.json --b B1.json B2.json`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct CompareArgs {
    /// Receipts; sides by label, else by configuration, else two files = two sides.
    #[arg(value_name = "RECEIPT")]
    pub files: Vec<PathBuf>,
    /// Receipts of side A (the baseline), e.g. runs 1 and 4 of an A B B A order.
    #[arg(long = "a", value_name = "RECEIPT", num_args = 1..)]
    pub a: Vec<PathBuf>,
    /// Receipts of side B.
    #[arg(long = "b", value_name = "RECEIPT", num_args = 1..)]
    pub b: Vec<PathBuf>,
    /// Differences of medians within this are "within tolerance": `2%` or `0.02`.
    #[arg(long, value_name = "TOL", default_value = "2%", allow_hyphen_values = true,
          value_parser = parse_tolerance)]
    pub tolerance: f64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Reads the receipts named by `args`, compares them, and writes the table (or
/// JSON with `--json`) to `out`. Returns the comparison.
///
/// Errors: unreadable receipts (named), ambiguous or mixed sides, write failures.
pub fn run_compare(args: &CompareArgs, mut out: impl Write) -> Result<Comparison, CompareError> {
    let load = |paths: &[PathBuf]| -> Result<Vec<(String, Receipt)>, CompareError> {
        paths
            .iter()
            .map(|p| Ok((p.display().to_string(), Receipt::read(p)?)))
            .collect()
    };
    let sides = if args.a.is_empty() && args.b.is_empty() {
        group_sides(load(&args.files)?)?
    } else {
        if args.a.is_empty() || args.b.is_empty() || !args.files.is_empty() {
            return Err(CompareError::Usage(
                "with --a/--b give both, and no positional receipts".into(),
            ));
        }
        explicit_sides(vec![
            ("A".into(), load(&args.a)?),
            ("B".into(), load(&args.b)?),
        ])
    };
    let c = compare(
        &sides,
        &CompareOptions {
            tolerance: args.tolerance,
        },
    )?;
    let text = if args.json {
        c.to_json() + "\n"
    } else {
        c.to_table()
    };
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(c)
}

/// Receipt options for `bench` and `eval` (flatten into their argument structs).
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct ReceiptArgs {
    /// Write a JSON receipt of the run (also when it fails) to FILE.
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// Side label stored in the receipt, used by `compare` to group runs.
    #[arg(long, value_name = "NAME")]
    pub label: Option<String>,
    /// SHA-256 of the model file, when known, to skip hashing it.
    #[arg(long = "model-sha256", value_name = "HEX")]
    pub model_sha256: Option<String>,
}

impl ReceiptArgs {
    /// The receipt context for a run with these arguments.
    pub fn context(
        &self,
        backend: &str,
        model_path: Option<&Path>,
        settings: serde_json::Map<String, serde_json::Value>,
        gpu: Option<GpuInfo>,
    ) -> ReceiptContext {
        ReceiptContext {
            label: self.label.clone(),
            backend: backend.to_string(),
            model_path: model_path.map(Path::to_path_buf),
            model_sha256: self.model_sha256.clone(),
            settings,
            gpu,
            git_commit: None,
        }
    }

    /// Fails now when `--receipt FILE` could not be written at the end (its folder is
    /// missing or not writable), before a long run is spent; does nothing without
    /// `--receipt`.
    pub fn check_writable(&self) -> Result<(), ReceiptError> {
        match &self.receipt {
            Some(path) => crate::receipt::check_writable(path),
            None => Ok(()),
        }
    }

    /// Writes `receipt` to `--receipt FILE`; does nothing without `--receipt`.
    pub fn write(&self, receipt: &Receipt) -> Result<(), ReceiptError> {
        match &self.receipt {
            Some(path) => receipt.write(path),
            None => Ok(()),
        }
    }
}

/// Parses seconds (`1.5`) into a duration; must be positive and finite.
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    ds4_args::seconds(ds4_args::POSITIVE)(s)
}

/// Parses a tolerance: `2%` (percent) or `0.02` (a fraction below 1).
pub fn parse_tolerance(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(p) => (p.trim(), 0.01),
        None => (t, 1.0),
    };
    let must = "must be a percentage from 0% to less than 100%, or a fraction from 0 to less than 1 (2% or 0.02)";
    let v: f64 = num.parse().map_err(|_| must.to_string())?;
    let v = v * scale;
    if !v.is_finite() || !(0.0..1.0).contains(&v) {
        return Err(must.to_string());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::DEFAULT_TOLERANCE;
    use clap::Parser;

    #[derive(Parser)]
    enum Cli {
        Supervise(SuperviseArgs),
        Compare(CompareArgs),
        Bench {
            #[command(flatten)]
            receipt: ReceiptArgs,
        },
    }

    #[test]
    fn supervise_args_parse() {
        let Cli::Supervise(a) = Cli::try_parse_from([
            "x",
            "supervise",
            "--mem-mb",
            "512",
            "--start-timeout",
            "2.5",
            "--sample-ms",
            "0",
            "--",
            "sh",
            "-c",
            "echo --hi",
        ])
        .unwrap() else {
            panic!("wrong subcommand")
        };
        let o = a.options();
        assert_eq!(o.mem_limit_mib, Some(512));
        assert_eq!(o.start_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.idle_timeout, None);
        assert_eq!(o.sample_interval, None);
        assert_eq!(a.command, ["sh", "-c", "echo --hi"].map(OsString::from));
        assert!(
            Cli::try_parse_from(["x", "supervise", "--idle-timeout", "0", "--", "true"]).is_err()
        );
    }

    #[test]
    fn compare_args_parse() {
        let Cli::Compare(c) = Cli::try_parse_from([
            "x",
            "compare",
            "--a",
            "a1",
            "a2",
            "--b",
            "b1",
            "b2",
            "--tolerance",
            "5%",
            "--json",
        ])
        .unwrap() else {
            panic!("wrong subcommand")
        };
        assert_eq!(c.a.len(), 2);
        assert_eq!(c.b.len(), 2);
        assert!(c.files.is_empty());
        assert!((c.tolerance - 0.05).abs() < 1e-12);
        let Cli::Compare(c) = Cli::try_parse_from(["x", "compare", "a.json", "b.json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.tolerance, DEFAULT_TOLERANCE);
        assert_eq!(c.files.len(), 2);
    }

    #[test]
    fn receipt_args_flatten() {
        let Cli::Bench { receipt } =
            Cli::try_parse_from(["x", "bench", "--receipt", "r.json", "--label", "B"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(receipt.receipt.as_deref(), Some(Path::new("r.json")));
        assert_eq!(receipt.label.as_deref(), Some("B"));
    }

    #[test]
    fn tolerance_forms() {
        assert_eq!(parse_tolerance("2%"), Ok(0.02));
        assert_eq!(parse_tolerance("0.05"), Ok(0.05));
        assert!(parse_tolerance("2").is_err());
        assert!(parse_tolerance("x").is_err());
    }
}
