//! Kernel selection: the CPU's instruction set is detected once and every product is
//! routed to the best kernel for its weight type and batch size.
//!
//! Two kernel families: row-streaming kernels for few tokens (decode: every weight is
//! read once per token) and panel kernels for many tokens (prefill: a panel of decoded
//! weight rows is reused across all tokens). All compute the arithmetic `order` defines
//! for their path, so their results are bit-identical.

#[cfg(target_arch = "x86_64")]
pub(crate) mod act_avx2;
#[cfg(target_arch = "x86_64")]
mod float_kernels;
#[cfg(target_arch = "x86_64")]
mod gemm_panel;
#[cfg(target_arch = "x86_64")]
mod gemv_q;
pub(crate) mod out;
pub(crate) mod panel;
#[cfg(target_arch = "x86_64")]
mod panel_fill;
#[cfg(target_arch = "x86_64")]
mod rowfmt;

use std::ops::Range;
use std::sync::OnceLock;

use crate::acts::QuantizedActs;
use crate::formats;
use crate::order::{self, Path};
use crate::{GgmlType, QMatrix};

use out::Out;
use panel::Panel;

/// Instruction sets the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust.
    Scalar,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// AVX-512 F/BW/VL with VNNI (plus AVX2, FMA, F16C).
    Avx512,
}

/// The instruction set the kernels use: the best this CPU has (detected once), or a
/// lower one named by the environment variable `DS4_QUANT_ISA` (`scalar`, `avx2`,
/// `avx512`) for testing and benchmarking the fallbacks. Results do not depend on it.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        let wanted = match std::env::var("DS4_QUANT_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => Isa::Avx2,
            _ => best,
        };
        wanted.min(best)
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Scalar
}

/// ggml's `vec_dot` of one weight row with token `t` (lengths checked by the caller).
pub(crate) fn dot_one(isa: Isa, ty: GgmlType, w_row: &[u8], x: &QuantizedActs, t: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: `isa` was detected on this CPU.
        if let Some(v) = unsafe { gemv_q::dot_one(isa == Isa::Avx512, ty, w_row, x, t) } {
            return v;
        }
        if formats::layout(ty).is_none() {
            let m = QMatrix {
                ty,
                rows: 1,
                cols: x.cols(),
                data: w_row,
            };
            let mut v = [0f32];
            let out = Out::new(&mut v, 1, 0).starting_at_token(t);
            gemv(isa, &m, x, 0..1, t..t + 1, Path::VecDot, &out);
            return v[0];
        }
    }
    let _ = isa;
    order::dot(Path::VecDot, ty, w_row, &x.row(t))
}

/// Rows per panel of the panel kernels.
pub(crate) fn panel_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 16,
        _ => 8,
    }
}

/// Whether the panel kernels handle `ty` along `path` (the row kernels handle
/// everything).
pub(crate) fn has_panel(isa: Isa, ty: GgmlType, path: Path) -> bool {
    // MXFP4 runs on the portable reference of `order` only (no SIMD kernels yet).
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && ty != GgmlType::MXFP4 {
        return formats::layout(ty).is_some_and(|l| gemm_panel::supports(path, &l));
    }
    let _ = (isa, ty, path);
    false
}

/// Row-streaming product: rows `rows` of `w` with tokens `tokens` of `x` along `path`.
pub(crate) fn gemv(
    isa: Isa,
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        let avx512 = isa == Isa::Avx512;
        // SAFETY (both): `isa` was detected on this CPU; ranges are checked by matmul.
        if matches!(path, Path::VecDot | Path::RepackGemv)
            && unsafe { gemv_q::gemv(avx512, w, x, rows.clone(), tokens.clone(), path, out) }
        {
            return;
        }
        let tinyblas = path == Path::TinyBlas;
        if unsafe { float_kernels::gemm(avx512, w, x, rows.clone(), tokens.clone(), tinyblas, out) }
        {
            return;
        }
    }
    let _ = isa;
    gemv_scalar(w, x, rows, tokens, path, out);
}

/// Scalar row kernel: the reference of `order` per (row, token).
pub(crate) fn gemv_scalar(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    out: &Out,
) {
    for r in rows {
        let wr = w.row(r);
        for t in tokens.clone() {
            let v = order::dot(path, w.ty, wr, &x.row(t));
            // SAFETY: the caller gives each thread its own rows.
            unsafe { out.set(t, r, v) };
        }
    }
}

/// Decodes rows `r0..r0 + nrows` of `w` into `panel` with the best instruction set.
pub(crate) fn fill_panel(isa: Isa, panel: &mut Panel, w: &QMatrix, r0: usize, nrows: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `isa` was detected on this CPU.
    if isa >= Isa::Avx2 && unsafe { panel_fill::fill(panel, w, r0, nrows) } {
        return;
    }
    let _ = isa;
    panel.fill(w, r0, nrows);
}

/// Panel product: rows `r0..r0 + nrows` (`nrows <= panel_rows(isa)`) with tokens
/// `tokens` along `path`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    isa: Isa,
    w: &QMatrix,
    x: &QuantizedActs,
    r0: usize,
    nrows: usize,
    tokens: Range<usize>,
    path: Path,
    panel: &mut Panel,
    out: &Out,
) {
    #[cfg(target_arch = "x86_64")]
    {
        panel.offset = gemm_panel::panel_offset(isa == Isa::Avx512, w.ty, &panel.layout, path);
    }
    fill_panel(isa, panel, w, r0, nrows);
    // SAFETY: `isa` was detected on this CPU; `has_panel` admitted the path.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match isa {
            Isa::Avx512 => return gemm_panel::gemm_avx512(panel, r0, x, tokens, path, out),
            Isa::Avx2 => return gemm_panel::gemm_avx2(panel, r0, x, tokens, path, out),
            Isa::Scalar => {}
        }
    }
    unreachable!("panel kernels run with AVX2 or AVX-512 only")
}

#[cfg(test)]
pub(crate) mod tests;
