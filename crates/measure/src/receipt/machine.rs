//! What machine a measurement ran on: CPU model and logical core count from
//! `/proc/cpuinfo` (Linux), host name, OS/arch, and GPU facts the caller supplies
//! (a CUDA backend knows its device name and clocks; this crate does not).

use serde::{Deserialize, Serialize};

/// The machine a receipt was produced on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name (`model name` in `/proc/cpuinfo`); `None` when not reported.
    pub cpu_model: Option<String>,
    /// Logical CPUs online (`processor` entries in `/proc/cpuinfo`, else the
    /// standard library's available parallelism).
    pub logical_cpus: usize,
    /// `std::env::consts::OS`, e.g. `linux`.
    pub os: String,
    /// `std::env::consts::ARCH`, e.g. `x86_64`.
    pub arch: String,
    /// Host name from `/proc/sys/kernel/hostname`, when readable.
    pub hostname: Option<String>,
    /// The GPU used, when the backend ran on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuInfo>,
}

/// GPU facts as reported by the backend (e.g. CUDA device properties / NVML).
///
/// Clocks in MHz, memory in bytes, bandwidth in GB/s (10^9 bytes per second).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Device name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Driver version string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Total device memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// SM clock at the time of the run, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    /// Memory clock at the time of the run, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_clock_mhz: Option<u32>,
    /// Maximum SM clock, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sm_clock_mhz: Option<u32>,
    /// Measured device-memory bandwidth ceiling, GB/s (a copy benchmark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_bandwidth_gbs: Option<f64>,
}

impl Machine {
    /// Describes this machine; `gpu` is attached as given.
    ///
    /// Never fails: facts that cannot be read are `None` (or the standard
    /// library's parallelism for the core count).
    pub fn detect(gpu: Option<GpuInfo>) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (cpu_model, procs) = parse_cpuinfo(&cpuinfo);
        let logical_cpus = if procs > 0 {
            procs
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        };
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        Machine {
            cpu_model,
            logical_cpus,
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            hostname,
            gpu,
        }
    }
}

/// Parses `/proc/cpuinfo` text: (first `model name` value, count of `processor` lines).
///
/// On CPUs whose kernel prints no `model name` (some Arm), falls back to `Hardware`
/// or `cpu model` lines.
pub fn parse_cpuinfo(text: &str) -> (Option<String>, usize) {
    let mut model = None;
    let mut fallback = None;
    let mut processors = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => processors += 1,
            "model name" if model.is_none() && !value.is_empty() => model = Some(value.to_string()),
            "Hardware" | "cpu model" if fallback.is_none() && !value.is_empty() => {
                fallback = Some(value.to_string())
            }
            _ => {}
        }
    }
    (model.or(fallback), processors)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Excerpt in the layout the Linux kernel prints on x86 (arch/x86/kernel/cpu/proc.c).
    const X86: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu vme\n\n\
processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n\n";

    #[test]
    fn parses_x86_cpuinfo() {
        let (model, n) = parse_cpuinfo(X86);
        assert_eq!(model.as_deref(), Some("Intel(R) Xeon(R) CPU @ 2.20GHz"));
        assert_eq!(n, 2);
    }

    #[test]
    fn arm_falls_back_to_hardware() {
        let text = "processor\t: 0\nBogoMIPS\t: 48.00\nCPU part\t: 0xd0c\n\nHardware\t: BCM2835\n";
        assert_eq!(parse_cpuinfo(text), (Some("BCM2835".to_string()), 1));
    }

    #[test]
    fn detect_never_fails() {
        let m = Machine::detect(None);
        assert!(m.logical_cpus >= 1);
        assert_eq!(m.os, std::env::consts::OS);
    }
}
