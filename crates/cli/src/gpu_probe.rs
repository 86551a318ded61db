//! The GPU responsiveness probe (issue 6, item 6): `ds4-server gpu-probe` standalone,
//! and `--gpu-probe FILE` on `run`, `eval` and `bench`.
//!
//! Every interval (default 100 ms) a thread submits a 4 KiB device-to-device copy on
//! its own stream ([`ds4_cuda::probe`]) and records, per sample:
//!
//! - `wait_ms`: from the host's submission to the GPU starting the copy;
//! - `gpu_ms`: the copy on the GPU (start to end event);
//! - `return_ms`: from the GPU finishing to the host seeing it;
//! - `total_ms`: submission to return, on the host clock alone;
//!
//! labelled with the phase at submission (`calibrate`, `load`, `prefill`, `decode`,
//! `idle`, or any label given on the standalone probe's stdin). This shows how much
//! inference stalls other GPU work (a desktop, another model).
//!
//! Host and GPU clocks are related by an offset estimated from the samples themselves:
//! each sample bounds it from above by `return − gpu_end` (the true offset plus that
//! sample's return latency, which depends on the host, not on how busy the GPU is), so
//! the minimum over the last [`WINDOW`] samples is taken as the offset. The quietest
//! return in the window thus counts as 0 and its few microseconds go to `wait_ms`;
//! `total_ms` needs no estimate. Ten calibration samples 10 ms apart, taken before the
//! probe reports ready (and so before the engine starts), seed the window.
//!
//! Output: one JSON object per line — the samples, then a summary with, per phase,
//! the sample count, failures (driver errors, copies not back within 1 s) and the p95
//! (nearest rank) and maximum of each time. Without a GPU the probe reports that none
//! is present (`{"probe":"no_gpu","reason":…}`): the standalone command exits with
//! status 2, the options on other commands print a notice and run without it.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use clap::Args;
use ds4_cuda::probe::{Probe, RawSample};
use serde::Serialize;
use serde_json::json;

/// Samples over which the clock offset is estimated (5 s at 100 ms).
pub const WINDOW: usize = 50;
/// Calibration samples taken before the probe reports ready.
const CALIBRATION: usize = 10;
const CALIBRATION_GAP: Duration = Duration::from_millis(10);
/// A copy not back within this long is a failed sample.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(1);

/// `--gpu-probe FILE` and its interval, for commands that run an engine.
#[derive(Args, Debug, Clone, Default)]
pub struct GpuProbeArgs {
    /// Run the GPU responsiveness probe alongside, writing its samples and summary
    /// (JSON lines) to FILE; the summary is also printed on stderr.
    #[arg(long = "gpu-probe", value_name = "FILE")]
    pub gpu_probe: Option<PathBuf>,
    /// Milliseconds between probe samples.
    #[arg(long = "gpu-probe-interval-ms", value_name = "MS", default_value_t = 100,
          allow_negative_numbers = true, value_parser = ds4_args::int::<u64>(1..))]
    pub interval_ms: u64,
}

impl GpuProbeArgs {
    /// Starts the probe on device `ordinal` when `--gpu-probe` was given and waits until
    /// it is ready. Without a GPU prints a notice on stderr and returns `None`.
    ///
    /// Errors: the file cannot be created, a zero interval.
    pub fn start(&self, ordinal: usize) -> Result<Option<ProbeHandle>> {
        let Some(path) = &self.gpu_probe else {
            return Ok(None);
        };
        let create = || {
            std::fs::File::create(path)
                .with_context(|| format!("creating --gpu-probe file {}", path.display()))
        };
        let sink: Box<dyn Write + Send> = Box::new(std::io::BufWriter::new(create()?));
        match ProbeHandle::start(ordinal, self.interval(), sink) {
            Ok(h) => Ok(Some(h)),
            Err(StartError::NoGpu(why)) => {
                eprintln!("gpu-probe: no GPU present ({why}); running without the probe");
                writeln!(create()?, "{}", json!({ "probe": "no_gpu", "reason": why }))?;
                Ok(None)
            }
            Err(StartError::Other(e)) => Err(e),
        }
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.max(1))
    }
}

/// Sets the phase of an optional probe (a no-op without one).
pub fn set_phase(probe: &Option<ProbeHandle>, phase: &str) {
    if let Some(p) = probe {
        p.set_phase(phase);
    }
}

/// Ends an optional probe and prints its summary on stderr.
pub fn finish(probe: Option<ProbeHandle>) {
    if let Some(p) = probe {
        match p.finish() {
            Ok(s) => eprint!("{}", s.table()),
            Err(e) => eprintln!("gpu-probe: {}", crate::common::error_text(&e)),
        }
    }
}

/// Why the probe did not start.
#[derive(Debug)]
pub enum StartError {
    /// No usable GPU (the driver is missing, no device…): the reason.
    NoGpu(String),
    Other(anyhow::Error),
}

/// A running probe thread.
pub struct ProbeHandle {
    phase: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<ProbeSummary>>,
    /// The device's name.
    pub device: String,
}

impl ProbeHandle {
    /// Starts sampling device `ordinal` every `interval`, writing JSON lines to `sink`;
    /// returns once the probe is calibrated and ready (phase `idle`).
    pub fn start(
        ordinal: usize,
        interval: Duration,
        sink: Box<dyn Write + Send>,
    ) -> Result<ProbeHandle, StartError> {
        let phase = Arc::new(Mutex::new("calibrate".to_string()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<String, StartError>>();
        let thread = {
            let (phase, stop) = (phase.clone(), stop.clone());
            std::thread::Builder::new()
                .name("gpu-probe".into())
                .spawn(move || sampler(ordinal, interval, sink, &phase, &stop, ready_tx))
                .map_err(|e| StartError::Other(anyhow!("starting the probe thread: {e}")))?
        };
        match ready_rx.recv() {
            Ok(Ok(device)) => Ok(ProbeHandle {
                phase,
                stop,
                thread,
                device,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(StartError::Other(match thread.join() {
                Ok(Err(e)) => e,
                _ => anyhow!("the probe thread ended before it was ready"),
            })),
        }
    }

    /// A shareable setter of the phase label, for another thread (the server's
    /// engine worker).
    pub fn phase_hook(&self) -> Arc<dyn Fn(&'static str) + Send + Sync> {
        let phase = self.phase.clone();
        Arc::new(move |p| {
            if let Ok(mut cur) = phase.lock() {
                p.clone_into(&mut cur);
            }
        })
    }

    /// Labels the samples submitted from now on.
    pub fn set_phase(&self, phase: &str) {
        if let Ok(mut p) = self.phase.lock() {
            phase.clone_into(&mut p);
        }
    }

    /// Stops sampling, writes the summary line and returns the summary.
    pub fn finish(self) -> Result<ProbeSummary> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .join()
            .map_err(|_| anyhow!("the probe thread panicked"))?
    }
}

/// The probe thread: open, calibrate, report ready, sample until stopped.
fn sampler(
    ordinal: usize,
    interval: Duration,
    mut sink: Box<dyn Write + Send>,
    phase: &Mutex<String>,
    stop: &AtomicBool,
    ready: mpsc::Sender<Result<String, StartError>>,
) -> Result<ProbeSummary> {
    let mut probe = match Probe::new(ordinal) {
        Ok(p) => p,
        Err(e @ ds4_cuda::CudaError::NoDevice(_)) => {
            let _ = ready.send(Err(StartError::NoGpu(e.to_string())));
            return Err(anyhow!("{e}"));
        }
        Err(e) => {
            let _ = ready.send(Err(StartError::Other(anyhow!("gpu-probe: {e}"))));
            return Err(anyhow!("{e}"));
        }
    };
    let t0 = Instant::now();
    let now_ms = || t0.elapsed().as_secs_f64() * 1e3;
    let mut est = Estimator::default();
    let mut summary = Summarizer::default();
    let mut emit = |s: &Sample, sink: &mut Box<dyn Write + Send>| -> Result<()> {
        summary.add(s);
        writeln!(sink, "{}", serde_json::to_string(s)?)?;
        sink.flush()?;
        Ok(())
    };
    for _ in 0..CALIBRATION {
        let s = est.measure(probe.sample(SAMPLE_TIMEOUT), "calibrate", now_ms());
        emit(&s, &mut sink)?;
        std::thread::sleep(CALIBRATION_GAP);
    }
    if let Ok(mut p) = phase.lock() {
        *p = "idle".into();
    }
    let _ = ready.send(Ok(probe.device_name.clone()));
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(20)));
            continue;
        }
        let label = phase.lock().map(|p| p.clone()).unwrap_or_default();
        let s = est.measure(probe.sample(SAMPLE_TIMEOUT), &label, now_ms());
        emit(&s, &mut sink)?;
        next += interval;
        if next < Instant::now() {
            next = Instant::now() + interval;
        }
    }
    let out = summary.finish(&probe.device_name, interval);
    writeln!(
        sink,
        "{}",
        serde_json::to_string(&json!({ "summary": out }))?
    )?;
    sink.flush()?;
    Ok(out)
}

/// One probe sample as written (times in ms; host time since the probe started).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub t_ms: f64,
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<f64>,
    /// Why the sample failed (then the times are absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The clock-offset estimate over a sliding window (see the module docs).
#[derive(Debug, Default)]
pub struct Estimator {
    /// `return_ms − gpu_end_ms` of the last [`WINDOW`] samples.
    upper: VecDeque<f64>,
}

impl Estimator {
    /// Turns a raw sample (or its error, which is stamped `now_ms`) into a labelled
    /// [`Sample`].
    pub fn measure(
        &mut self,
        raw: ds4_cuda::Result<RawSample>,
        phase: &str,
        now_ms: f64,
    ) -> Sample {
        let raw = match raw {
            Ok(r) => r,
            Err(e) => {
                return Sample {
                    t_ms: (now_ms * 1e3).round() / 1e3,
                    phase: phase.into(),
                    wait_ms: None,
                    gpu_ms: None,
                    return_ms: None,
                    total_ms: None,
                    error: Some(e.to_string()),
                };
            }
        };
        if self.upper.len() == WINDOW {
            self.upper.pop_front();
        }
        self.upper.push_back(raw.return_ms - raw.gpu_end_ms);
        let offset = self.upper.iter().copied().fold(f64::INFINITY, f64::min);
        let r3 = |x: f64| (x * 1e3).round() / 1e3;
        Sample {
            t_ms: r3(raw.submit_ms),
            phase: phase.into(),
            wait_ms: Some(r3((raw.gpu_start_ms + offset - raw.submit_ms).max(0.0))),
            gpu_ms: Some(r3(raw.gpu_end_ms - raw.gpu_start_ms)),
            return_ms: Some(r3(raw.return_ms - raw.gpu_end_ms - offset)),
            total_ms: Some(r3(raw.return_ms - raw.submit_ms)),
            error: None,
        }
    }
}

/// p95 (nearest rank) and maximum of one time, ms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tail {
    pub p95: f64,
    pub max: f64,
}

impl Tail {
    /// Nearest-rank p95 (the ⌈0.95·n⌉-th smallest) and the maximum; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Tail> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let rank = (v.len() * 95).div_ceil(100).max(1);
        Some(Tail {
            p95: v[rank - 1],
            max: v[v.len() - 1],
        })
    }
}

/// The summary of one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseSummary {
    pub count: usize,
    pub failures: usize,
    pub wait_ms: Option<Tail>,
    pub gpu_ms: Option<Tail>,
    pub return_ms: Option<Tail>,
    pub total_ms: Option<Tail>,
}

/// The probe's summary: device, interval and per-phase figures (phases by name).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeSummary {
    pub device: String,
    pub interval_ms: f64,
    pub phases: BTreeMap<String, PhaseSummary>,
}

impl ProbeSummary {
    /// A text table: one row per phase.
    pub fn table(&self) -> String {
        let mut s = format!(
            "gpu-probe on {} every {} ms: p95 / max in ms\n{:<10} {:>6} {:>5} {:>17} {:>17} {:>17} {:>17}\n",
            self.device,
            self.interval_ms,
            "phase",
            "count",
            "fail",
            "wait",
            "gpu",
            "return",
            "total"
        );
        let cell = |t: &Option<Tail>| {
            t.map_or("-".to_string(), |t| format!("{:.3} / {:.3}", t.p95, t.max))
        };
        for (name, p) in &self.phases {
            s.push_str(&format!(
                "{name:<10} {:>6} {:>5} {:>17} {:>17} {:>17} {:>17}\n",
                p.count,
                p.failures,
                cell(&p.wait_ms),
                cell(&p.gpu_ms),
                cell(&p.return_ms),
                cell(&p.total_ms)
            ));
        }
        s
    }
}

/// Collects samples per phase.
#[derive(Debug, Default)]
pub struct Summarizer {
    phases: BTreeMap<String, PhaseValues>,
}

#[derive(Debug, Default)]
struct PhaseValues {
    count: usize,
    failures: usize,
    wait: Vec<f64>,
    gpu: Vec<f64>,
    ret: Vec<f64>,
    total: Vec<f64>,
}

impl Summarizer {
    pub fn add(&mut self, s: &Sample) {
        let p = self.phases.entry(s.phase.clone()).or_default();
        p.count += 1;
        if s.error.is_some() {
            p.failures += 1;
        }
        for (v, x) in [
            (&mut p.wait, s.wait_ms),
            (&mut p.gpu, s.gpu_ms),
            (&mut p.ret, s.return_ms),
            (&mut p.total, s.total_ms),
        ] {
            v.extend(x);
        }
    }

    pub fn finish(&self, device: &str, interval: Duration) -> ProbeSummary {
        ProbeSummary {
            device: device.to_string(),
            interval_ms: interval.as_secs_f64() * 1e3,
            phases: self
                .phases
                .iter()
                .map(|(k, p)| {
                    (
                        k.clone(),
                        PhaseSummary {
                            count: p.count,
                            failures: p.failures,
                            wait_ms: Tail::of(&p.wait),
                            gpu_ms: Tail::of(&p.gpu),
                            return_ms: Tail::of(&p.ret),
                            total_ms: Tail::of(&p.total),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// `ds4-server gpu-probe`: the probe on its own, phases read from stdin.
#[derive(Args, Debug)]
pub struct GpuProbeCmd {
    /// CUDA device ordinal.
    #[arg(long = "device", default_value_t = 0, allow_negative_numbers = true,
          value_parser = ds4_args::int::<usize>(0..))]
    pub device: usize,
    /// Milliseconds between samples.
    #[arg(long = "interval-ms", value_name = "MS", default_value_t = 100,
          allow_negative_numbers = true, value_parser = ds4_args::int::<u64>(1..))]
    pub interval_ms: u64,
    /// Write the samples and summary to FILE instead of stdout (the ready line still
    /// goes to stdout).
    #[arg(long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Exit status of the standalone probe when no GPU is present.
pub const EXIT_NO_GPU: i32 = 2;

/// Runs the standalone probe: prints `{"probe":"ready",…}` on stdout once calibrated,
/// then takes each non-empty stdin line as the new phase label until end of input,
/// then writes the summary (JSON line, and the table on stderr).
pub fn main(args: GpuProbeCmd) -> Result<()> {
    let sink: Box<dyn Write + Send> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(LineOut),
    };
    let interval = Duration::from_millis(args.interval_ms.max(1));
    let probe = match ProbeHandle::start(args.device, interval, sink) {
        Ok(p) => p,
        Err(StartError::NoGpu(why)) => {
            println!("{}", json!({ "probe": "no_gpu", "reason": why }));
            eprintln!("gpu-probe: no GPU present ({why})");
            std::process::exit(EXIT_NO_GPU);
        }
        Err(StartError::Other(e)) => return Err(e),
    };
    LineOut.write_line(
        &json!({ "probe": "ready", "device": probe.device, "interval_ms": interval.as_secs_f64() * 1e3 })
            .to_string(),
    )?;
    for line in std::io::stdin().lock().lines() {
        let line = line.context("reading phase labels from stdin")?;
        let label = line.trim();
        if !label.is_empty() {
            probe.set_phase(label);
        }
    }
    let summary = probe.finish()?;
    eprint!("{}", summary.table());
    Ok(())
}

/// Stdout, one locked write per line (so the ready line and samples never interleave).
struct LineOut;

impl LineOut {
    fn write_line(&self, line: &str) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        out.write_all(format!("{line}\n").as_bytes())?;
        out.flush()
    }
}

impl Write for LineOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut out = std::io::stdout().lock();
        out.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw sample from known truths: host = GPU + `offset`.
    fn raw(offset: f64, submit: f64, wait: f64, gpu: f64, ret: f64) -> RawSample {
        let gpu_start = submit + wait - offset;
        RawSample {
            submit_ms: submit,
            gpu_start_ms: gpu_start,
            gpu_end_ms: gpu_start + gpu,
            return_ms: submit + wait + gpu + ret,
        }
    }

    #[test]
    fn estimator_recovers_known_waits() {
        // True offset 1000 ms; returns vary 0.010..0.030 ms; the quietest return
        // (0.010) counts as zero, so estimated waits are true waits + 0.010 and
        // returns are true returns − 0.010.
        let mut e = Estimator::default();
        let truth = [
            (0.0, 0.005, 0.003, 0.020),
            (100.0, 0.004, 0.003, 0.010),
            (200.0, 7.5, 0.003, 0.030),
            (300.0, 0.006, 0.003, 0.015),
        ];
        let mut out = Vec::new();
        for &(t, w, g, r) in &truth {
            out.push(e.measure(Ok(raw(1000.0, t, w, g, r)), "decode", 0.0));
        }
        let close = |a: f64, b: f64| (a - b).abs() < 1.5e-3;
        // After the second sample the window holds the minimum return 0.010.
        for (s, &(t, w, g, r)) in out.iter().zip(&truth).skip(1) {
            assert!(close(s.wait_ms.unwrap(), w + 0.010), "{s:?}");
            assert!(close(s.gpu_ms.unwrap(), g), "{s:?}");
            assert!(close(s.return_ms.unwrap(), r - 0.010), "{s:?}");
            assert!(close(s.total_ms.unwrap(), w + g + r), "{s:?}");
            assert_eq!(s.t_ms, t);
        }
        let failed = e.measure(
            Err(ds4_cuda::CudaError::Unsupported("boom".into())),
            "prefill",
            412.5,
        );
        assert_eq!(failed.error.as_deref(), Some("boom"));
        assert_eq!(failed.wait_ms, None);
        assert_eq!(failed.t_ms, 412.5);
    }

    #[test]
    fn p95_is_nearest_rank() {
        // 20 values 1..=20: rank ceil(0.95 * 20) = 19 -> 19. 21 values: rank 20 -> 20.
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(
            Tail::of(&v),
            Some(Tail {
                p95: 19.0,
                max: 20.0
            })
        );
        let v: Vec<f64> = (1..=21).map(f64::from).collect();
        assert_eq!(Tail::of(&v).unwrap().p95, 20.0);
        assert_eq!(Tail::of(&[3.0]), Some(Tail { p95: 3.0, max: 3.0 }));
        assert_eq!(Tail::of(&[]), None);
    }

    #[test]
    fn summary_counts_per_phase() {
        let mut s = Summarizer::default();
        let ok = |phase: &str, w: f64| Sample {
            t_ms: 0.0,
            phase: phase.into(),
            wait_ms: Some(w),
            gpu_ms: Some(0.003),
            return_ms: Some(0.0),
            total_ms: Some(w + 0.003),
            error: None,
        };
        s.add(&ok("decode", 1.0));
        s.add(&ok("decode", 3.0));
        s.add(&ok("idle", 0.01));
        s.add(&Sample {
            error: Some("timeout".into()),
            wait_ms: None,
            gpu_ms: None,
            return_ms: None,
            total_ms: None,
            ..ok("decode", 0.0)
        });
        let sum = s.finish("test", Duration::from_millis(100));
        let d = &sum.phases["decode"];
        assert_eq!((d.count, d.failures), (3, 1));
        assert_eq!(d.wait_ms, Some(Tail { p95: 3.0, max: 3.0 }));
        assert_eq!(sum.phases["idle"].count, 1);
        assert!(sum.table().contains("decode"));
        let v = serde_json::to_value(&sum).unwrap();
        assert_eq!(v["phases"]["decode"]["failures"], 1);
        assert_eq!(v["interval_ms"], 100.0);
    }
}
