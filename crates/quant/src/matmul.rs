//! Matrix products `out[t·rows + r] = dot(w.row(r), x.row(t))`, split across rayon's
//! current pool by rows, with the arithmetic of llama.cpp's CPU backend.
//!
//! ggml's result for one output depends on the kernel it picks, which depends on the
//! weight type, on whether it repacked the weights at load ([`Layout`]) and on the number
//! of tokens in the product (see the `order` module). The tokens of a product are split
//! into the runs ggml treats alike and each run goes to our kernel for that path. Few
//! tokens stream each weight row once per call (the product is bound by memory); many
//! tokens decode panels of rows once and reuse them for every token. Work is split into
//! row ranges, one rayon task each, so the engine's choice of pool
//! (`ThreadPool::install` or the global pool) decides the threads used; results do not
//! depend on it.

use std::ops::Range;

use rayon::prelude::*;

use crate::acts::QuantizedActs;
use crate::error::QuantError;
use crate::kernels::{self, Isa, out::Out, panel::Panel};
use crate::order::{self, Path};
use crate::{QMatrix, vec_dot_type};

/// From this many tokens on, quantized products use the panel kernels.
const PANEL_MIN_TOKENS: usize = 4;
/// Products with fewer multiply-adds than this run on the calling thread: below it
/// (about 2 µs of one core's work) handing half of the rows to another thread costs
/// more than it saves, when that thread is awake (the engine's CPU backend keeps its
/// pool spinning through a step; waking a parked rayon worker costs tens of µs).
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// How llama.cpp's CPU backend holds a weight matrix, which decides its kernels and so
/// the rounding of its products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// As llama.cpp holds the weights of a model's matrix products on an x86 CPU with
    /// AVX2/AVX-512: repacked at load when ggml repacks the type and shape (Q4_0, Q4_K and
    /// Q2_K with a multiple of 8 rows), plain otherwise.
    #[default]
    Auto,
    /// Never repacked: a tensor llama.cpp keeps in a plain CPU buffer (for example a
    /// token embedding that is also the output matrix).
    Plain,
}

/// `out[t·w.rows + r] = dot(w.row(r), x.row(t))` for every token `t` and row `r`,
/// multi-threaded with rayon, for weights in [`Layout::Auto`].
///
/// # Panics
/// If the shapes or types disagree (see [`try_matmul`] for the conditions); these are
/// programming errors in the caller.
pub fn matmul(w: &QMatrix, x: &QuantizedActs, out: &mut [f32]) {
    matmul_as(w, Layout::Auto, x, out);
}

/// As [`matmul`] for weights held as `layout`.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_as(w: &QMatrix, layout: Layout, x: &QuantizedActs, out: &mut [f32]) {
    if let Err(e) = matmul_rows_as(w, layout, x, 0..w.rows, out) {
        panic!("matmul: {e}");
    }
}

/// As [`matmul`], reporting bad arguments as errors.
///
/// # Errors
/// [`QuantError::Unsupported`]/[`QuantError::BadLength`]/[`QuantError::ShapeMismatch`]
/// for a malformed matrix, [`QuantError::ActivationMismatch`] if `x` was not quantized
/// to `vec_dot_type(w.ty)`, [`QuantError::ShapeMismatch`] if `x.cols() != w.cols` or
/// `out.len() != x.n_tokens()·w.rows`.
pub fn try_matmul(w: &QMatrix, x: &QuantizedActs, out: &mut [f32]) -> Result<(), QuantError> {
    matmul_rows_as(w, Layout::Auto, x, 0..w.rows, out)
}

/// As [`try_matmul`], with every token along the kernel path ggml takes for a product
/// of one token (a decode step): a token's result does not depend on how many tokens
/// are multiplied with it, at the price of matching ggml's batched products only where
/// its batched path has the same arithmetic (plain quantized weights).
///
/// # Errors
/// As [`try_matmul`].
pub fn try_matmul_per_token(
    w: &QMatrix,
    x: &QuantizedActs,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let rows = 0..w.rows;
    check(w, x, &rows, out)?;
    run_with(w, Layout::Auto, x, rows, out, true, true);
    Ok(())
}

/// Rows `rows` of `w` only: `out[t·rows.len() + (r - rows.start)]`. Useful for splitting
/// a large output (a vocabulary projection) or picking experts' rows. The results are
/// those of the whole product.
///
/// # Errors
/// As [`try_matmul`], with `out.len() == x.n_tokens()·rows.len()`, and
/// [`QuantError::ShapeMismatch`] if `rows` goes past `w.rows`.
pub fn matmul_rows(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    matmul_rows_as(w, Layout::Auto, x, rows, out)
}

/// As [`matmul_rows`] for weights held as `layout`.
///
/// # Errors
/// As [`matmul_rows`].
pub fn matmul_rows_as(
    w: &QMatrix,
    layout: Layout,
    x: &QuantizedActs,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<(), QuantError> {
    check(w, x, &rows, out)?;
    run(w, layout, x, rows, out, true);
    Ok(())
}

/// As [`try_matmul`] on the calling thread only (for callers that parallelize at a
/// higher level, e.g. across experts).
///
/// # Errors
/// As [`try_matmul`].
pub fn matmul_single_thread(
    w: &QMatrix,
    x: &QuantizedActs,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let rows = 0..w.rows;
    check(w, x, &rows, out)?;
    run(w, Layout::Auto, x, rows, out, false);
    Ok(())
}

/// Checks that `x` pairs with `w`.
pub(crate) fn check_acts(w: &QMatrix, x: &QuantizedActs) -> Result<(), QuantError> {
    let expected = vec_dot_type(w.ty);
    if x.dot_type() != expected {
        return Err(QuantError::ActivationMismatch {
            weights: w.ty,
            expected,
            got: x.dot_type(),
        });
    }
    if x.cols() != w.cols {
        return Err(QuantError::ShapeMismatch {
            what: "activation columns",
            expected: w.cols,
            got: x.cols(),
        });
    }
    Ok(())
}

fn check(
    w: &QMatrix,
    x: &QuantizedActs,
    rows: &Range<usize>,
    out: &[f32],
) -> Result<(), QuantError> {
    QMatrix::new(w.ty, w.rows, w.cols, w.data)?;
    check_acts(w, x)?;
    if rows.start > rows.end || rows.end > w.rows {
        return Err(QuantError::ShapeMismatch {
            what: "row range end",
            expected: w.rows,
            got: rows.end,
        });
    }
    let want = x.n_tokens() * rows.len();
    if out.len() != want {
        return Err(QuantError::ShapeMismatch {
            what: "output length",
            expected: want,
            got: out.len(),
        });
    }
    Ok(())
}

/// Runs of consecutive tokens that ggml computes along one path (with `per_token`,
/// every token along the path of a one-token product).
fn segments(w: &QMatrix, repacked: bool, n: usize, per_token: bool) -> Vec<(Range<usize>, Path)> {
    let tiled = order::tiled_enabled();
    let m = (w.ty, w.rows, w.cols);
    if per_token {
        return vec![(0..n, order::path(m, repacked, tiled, 1, 0))];
    }
    let mut segs = Vec::with_capacity(2);
    let mut t = 0;
    while t < n {
        let p = order::path(m, repacked, tiled, n, t);
        let mut end = t + 1;
        while end < n && order::path(m, repacked, tiled, n, end) == p {
            end += 1;
        }
        segs.push((t..end, p));
        t = end;
    }
    segs
}

fn run(
    w: &QMatrix,
    layout: Layout,
    x: &QuantizedActs,
    rows: Range<usize>,
    out: &mut [f32],
    parallel: bool,
) {
    run_with(w, layout, x, rows, out, parallel, false);
}

fn run_with(
    w: &QMatrix,
    layout: Layout,
    x: &QuantizedActs,
    rows: Range<usize>,
    out: &mut [f32],
    parallel: bool,
    per_token: bool,
) {
    let isa = kernels::isa();
    let repacked = layout == Layout::Auto && order::repacks(w.ty, w.rows);
    let o = Out::new(out, rows.len(), rows.start);
    for (tokens, path) in segments(w, repacked, x.n_tokens(), per_token) {
        let macs = rows.len() * w.cols * tokens.len();
        let par = parallel && macs >= PARALLEL_MIN_MACS && rayon::current_num_threads() > 1;
        if tokens.len() >= PANEL_MIN_TOKENS && kernels::has_panel(isa, w.ty, path) {
            run_panels(isa, w, x, rows.clone(), tokens, path, &o, par);
        } else {
            run_rows(isa, w, x, rows.clone(), tokens, path, &o, par);
        }
    }
}

/// Panel kernels over row panels, one rayon task per panel.
#[allow(clippy::too_many_arguments)]
fn run_panels(
    isa: Isa,
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    o: &Out,
    parallel: bool,
) {
    let pr = kernels::panel_rows(isa);
    let job = |r0: usize| {
        let n = pr.min(rows.end - r0);
        with_panel(w.ty, pr, |panel| {
            kernels::gemm(isa, w, x, r0, n, tokens.clone(), path, panel, o)
        });
    };
    if parallel {
        rows.clone().into_par_iter().step_by(pr).for_each(job);
    } else {
        rows.clone().step_by(pr).for_each(job);
    }
}

/// Runs `f` with this thread's panel buffer (kept between calls, so steady-state
/// prefill allocates nothing).
fn with_panel<R>(ty: crate::GgmlType, pr: usize, f: impl FnOnce(&mut Panel) -> R) -> R {
    thread_local! {
        static PANEL: std::cell::RefCell<Option<Panel>> = const { std::cell::RefCell::new(None) };
    }
    PANEL.with(|cell| {
        let mut slot = cell.borrow_mut();
        let panel = match slot.as_mut() {
            Some(p) if p.ty == ty && p.pr == pr => p,
            _ => slot.insert(Panel::new(ty, pr)),
        };
        f(panel)
    })
}

/// Row-streaming kernels over row chunks (multiples of 16 rows, about four per thread).
#[allow(clippy::too_many_arguments)]
fn run_rows(
    isa: Isa,
    w: &QMatrix,
    x: &QuantizedActs,
    rows: Range<usize>,
    tokens: Range<usize>,
    path: Path,
    o: &Out,
    parallel: bool,
) {
    if !parallel {
        kernels::gemv(isa, w, x, rows, tokens, path, o);
        return;
    }
    let chunks = 4 * rayon::current_num_threads();
    let chunk = rows.len().div_ceil(chunks).next_multiple_of(16).max(16);
    let starts: Vec<usize> = rows.clone().step_by(chunk).collect();
    starts.into_par_iter().for_each(|r0| {
        let r1 = (r0 + chunk).min(rows.end);
        kernels::gemv(isa, w, x, r0..r1, tokens.clone(), path, o);
    });
}
