//! Every conformance case on the CPU backend with several draws of its inputs: each
//! case's error over the seeds (smallest, largest) beside its tolerance, to check that a
//! tolerance holds for inputs other than the default draw.
//!
//!     cargo run --release -p ds4-conformance --example seeds -- [SEEDS] [FILTER]

use ds4_conformance::{Outcome, run_seeded};
use ds4_engine::backend::cpu::CpuBackend;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seeds: u64 = match args.first().map(|s| s.parse()) {
        None => 8,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: seeds [SEEDS > 0] [FILTER]");
            std::process::exit(2);
        }
    };
    let filter = args.get(1).map_or("", String::as_str);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let b = match CpuBackend::new(threads) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let runs: Vec<Vec<Outcome>> = (0..seeds)
        .map(|s| run_seeded(&b, filter, ds4_conformance::SEED + s))
        .collect();
    let mut over = 0;
    for (i, first) in runs[0].iter().enumerate() {
        // A draw that could not run (its error NaN) is reported, not folded into the range.
        if let Some(e) = runs.iter().find_map(|r| r[i].failure.as_ref()) {
            let failed = runs.iter().filter(|r| r[i].failure.is_some()).count();
            over += failed;
            println!(
                "{:14} {:70} FAILED in {failed} of {seeds}: {e}",
                first.op, first.case
            );
            continue;
        }
        let errs: Vec<f64> = runs.iter().map(|r| r[i].err).collect();
        let lo = errs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = errs.iter().copied().fold(0f64, f64::max);
        let bad = runs.iter().filter(|r| !r[i].ok()).count();
        over += bad;
        println!(
            "{:14} {:70} err {lo:9.2e} .. {hi:9.2e}  tol {:8.1e}  {}",
            first.op,
            first.case,
            first.tol,
            if bad == 0 {
                "ok".to_string()
            } else {
                format!("OVER in {bad} of {seeds}")
            }
        );
    }
    if over > 0 {
        std::process::exit(1);
    }
}
