//! Row panels for the matrix-matrix kernels: a few weight rows decoded once to int8 and
//! interleaved so that one vector holds 4 consecutive values of each of `pr` rows.
//!
//! A prefill product reuses every weight block for many tokens, so decoding the weights
//! of `pr` rows once (any format, through [`formats::unpack`]) and then running one
//! format-independent integer kernel over all tokens costs little and keeps one kernel
//! for all formats. Layout, for scale block `b` of a panel:
//! `vals[((b·G + g)·pr + lane)·4 + i]` = value `4g + i` of the block in row `lane`
//! (`G = block/4` groups); `sub`, `min` are `[b][sub-block][lane]`, `d`, `aux` are
//! `[b][lane]`. Lanes past the matrix's last row hold zeros.

use crate::GgmlType;
use crate::QMatrix;
use crate::acts::QuantizedActs;
use crate::formats::{self, Layout, Unpacked};

use super::out::Out;

/// Decoded weights of up to `pr` consecutive rows.
pub(crate) struct Panel {
    pub ty: GgmlType,
    pub pr: usize,
    pub nrows: usize,
    pub nblk: usize,
    pub layout: Layout,
    pub vals: Vec<i8>,
    pub sub: Vec<i32>,
    pub min: Vec<i32>,
    pub d: Vec<f32>,
    pub aux: Vec<f32>,
}

impl Panel {
    /// An empty panel of `pr` lanes for weight type `ty` (which must have a layout).
    pub(crate) fn new(ty: GgmlType, pr: usize) -> Self {
        let layout = formats::layout(ty).expect("panel for a type without integer layout");
        Panel {
            ty,
            pr,
            nrows: 0,
            nblk: 0,
            layout,
            vals: Vec::new(),
            sub: Vec::new(),
            min: Vec::new(),
            d: Vec::new(),
            aux: Vec::new(),
        }
    }

    /// Sub-blocks per scale block.
    #[inline]
    pub(crate) fn nsub(&self) -> usize {
        self.layout.block / self.layout.sub
    }

    /// Sizes the panel for `nrows` rows of `w`, all entries zero (so lanes past the
    /// last row contribute nothing).
    pub(crate) fn prepare(&mut self, w: &QMatrix, nrows: usize) {
        let (pr, lay) = (self.pr, self.layout);
        let nblk = w.cols / lay.block;
        let nsub = lay.block / lay.sub;
        self.nrows = nrows;
        self.nblk = nblk;
        self.vals.clear();
        self.vals.resize(nblk * lay.block * pr, 0);
        for v in [&mut self.sub, &mut self.min] {
            v.clear();
            v.resize(nblk * nsub * pr, 0);
        }
        for v in [&mut self.d, &mut self.aux] {
            v.clear();
            v.resize(nblk * pr, 0.0);
        }
    }

    /// Decodes rows `r0..r0 + nrows` (`nrows <= pr`) of `w` (portable version).
    pub(crate) fn fill(&mut self, w: &QMatrix, r0: usize, nrows: usize) {
        self.prepare(w, nrows);
        let (pr, lay, nblk) = (self.pr, self.layout, self.nblk);
        let nsub = lay.block / lay.sub;
        let groups = lay.block / 4;
        let bytes = w.ty.type_size();
        let mut u = Unpacked::default();
        for lane in 0..nrows {
            let row = w.row(r0 + lane);
            for b in 0..nblk {
                formats::unpack(w.ty, &row[b * bytes..(b + 1) * bytes], &mut u);
                let base = b * lay.block * pr;
                for g in 0..groups {
                    let o = base + (g * pr + lane) * 4;
                    self.vals[o..o + 4].copy_from_slice(&u.vals[4 * g..4 * g + 4]);
                }
                for j in 0..nsub {
                    self.sub[(b * nsub + j) * pr + lane] = u.sub[j];
                    self.min[(b * nsub + j) * pr + lane] = u.min[j];
                }
                self.d[b * pr + lane] = u.d;
                self.aux[b * pr + lane] = u.aux;
            }
        }
    }

    /// Activation sum of sub-block `j` of scale block `b` for a token: the `A_j` of the
    /// definition (sums of 16 or of 32 values).
    #[inline]
    pub(crate) fn act_sum(&self, sum16: &[i16], sum32: &[i32], b: usize, j: usize) -> i32 {
        let nsub = self.nsub();
        if self.layout.sub == 16 {
            sum16[b * nsub + j] as i32
        } else {
            sum32[b * nsub + j]
        }
    }
}

/// Scalar panel kernel: every (row, token) of the panel, straight from the definition.
/// The fallback for CPUs without AVX2 and the reference the SIMD panel kernels are
/// tested against.
pub(crate) fn gemm_scalar(
    p: &Panel,
    r0: usize,
    x: &QuantizedActs,
    tokens: std::ops::Range<usize>,
    out: &Out,
) {
    let lay = p.layout;
    let nsub = p.nsub();
    for t in tokens {
        let a = x.row(t);
        for lane in 0..p.nrows {
            let mut acc = 0.0f32;
            for b in 0..p.nblk {
                let (mut isum, mut msum) = (0i32, 0i32);
                for j in 0..nsub {
                    let mut s = 0i32;
                    for e in j * lay.sub..(j + 1) * lay.sub {
                        let v = p.vals[b * lay.block * p.pr + ((e / 4) * p.pr + lane) * 4 + e % 4];
                        s += v as i32 * a.qs[b * lay.block + e] as i32;
                    }
                    let k = (b * nsub + j) * p.pr + lane;
                    isum += if lay.subscale { p.sub[k] * s } else { s };
                    if lay.imin {
                        msum += p.min[k] * p.act_sum(a.sum16, a.sum32, b, j);
                    }
                }
                let da = a.d[b];
                acc = (p.d[b * p.pr + lane] * da).mul_add(isum as f32, acc);
                if lay.imin {
                    acc = (-(p.aux[b * p.pr + lane] * da)).mul_add(msum as f32, acc);
                }
                if lay.fmin {
                    acc = p.aux[b * p.pr + lane].mul_add(a.s[b], acc);
                }
            }
            // SAFETY: this panel's rows belong to the calling thread only.
            unsafe { out.set(t, r0 + lane, acc * lay.final_scale) };
        }
    }
}
