//! Measurements for `ds4-server bench --backend cuda`: the device's copy bandwidth (the
//! ceiling of batch-1 decode), and the figures derived from it.

use std::sync::Arc;

use crate::driver::{Args, Gpu};
use crate::error::Result;
use crate::kernels::Kernels;

/// A device-to-device copy bandwidth measurement.
#[derive(Debug, Clone)]
pub struct CopyBandwidth {
    /// Bytes read plus bytes written per second, median of the runs.
    pub bytes_per_s: f64,
    /// Each run's figure.
    pub runs: Vec<f64>,
    /// Bytes copied per run (each way).
    pub bytes: usize,
}

/// Copies `bytes` between two device buffers `runs` times (after one warm-up) with the
/// `copy_f32` kernel and the driver's memcpy, timing each with events; the better of
/// the two methods is reported for each run, counting bytes read plus written.
pub fn copy_bandwidth(
    gpu: &Arc<Gpu>,
    k: &Kernels,
    bytes: usize,
    runs: usize,
) -> Result<CopyBandwidth> {
    let src = gpu.alloc(bytes)?;
    let dst = gpu.alloc(bytes)?;
    let (start, end) = (gpu.event()?, gpu.event()?);
    let n = (bytes / 4) as i64;
    let mut a = Args::new();
    a.push(src.ptr()).push(dst.ptr()).push(n);
    let grid = (gpu.n_sm * 8, 1, 1);
    gpu.launch(k.copy_f32, grid, 256, 0, &a, false)?;
    gpu.dtod(dst.ptr(), src.ptr(), bytes)?;
    gpu.sync()?;
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        start.record()?;
        gpu.dtod(dst.ptr(), src.ptr(), bytes)?;
        end.record()?;
        let memcpy = end_rate(&start, &end, bytes)?;
        start.record()?;
        gpu.launch(k.copy_f32, grid, 256, 0, &a, false)?;
        end.record()?;
        let kernel = end_rate(&start, &end, bytes)?;
        out.push(memcpy.max(kernel));
    }
    Ok(CopyBandwidth {
        bytes_per_s: median(&out),
        runs: out,
        bytes,
    })
}

fn end_rate(start: &crate::driver::Event, end: &crate::driver::Event, bytes: usize) -> Result<f64> {
    let ms = start.elapsed_ms(end)? as f64;
    Ok(2.0 * bytes as f64 / (ms / 1e3))
}

/// The median of `v` (the mean of the two middle values for an even count).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Decode figures for a model: weight bytes per token and the achieved bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeFigures {
    pub tokens_per_s: f64,
    /// `ModelInfo::decode_weight_bytes`.
    pub weight_bytes_per_token: u64,
    /// weight bytes × tokens/s.
    pub achieved_bytes_per_s: f64,
    /// Of the measured copy bandwidth.
    pub fraction_of_copy: f64,
}

impl DecodeFigures {
    pub fn new(tokens_per_s: f64, weight_bytes_per_token: u64, copy_bytes_per_s: f64) -> Self {
        let achieved = weight_bytes_per_token as f64 * tokens_per_s;
        DecodeFigures {
            tokens_per_s,
            weight_bytes_per_token,
            achieved_bytes_per_s: achieved,
            fraction_of_copy: if copy_bytes_per_s > 0.0 {
                achieved / copy_bytes_per_s
            } else {
                0.0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_follow_the_definitions() {
        // llama.cpp's peer figure from the issue: 258 tok/s × 4.88 GB ≈ 1.26 TB/s ≈ 29 %.
        let f = DecodeFigures::new(258.0, 4_880_000_000, 4.3e12);
        assert!((f.achieved_bytes_per_s - 1.259e12).abs() < 1e9);
        assert!((f.fraction_of_copy - 0.2928).abs() < 1e-3);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
