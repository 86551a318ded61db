//! Row panels for the matrix-matrix kernels: a few weight rows decoded once to int8 and
//! interleaved so that one vector holds 4 consecutive values of each of `pr` rows.
//!
//! A prefill product reuses every weight block for many tokens, so decoding the weights
//! of `pr` rows once (any format, through [`formats::unpack`]) and then running one
//! format-independent integer kernel over all tokens costs little and keeps one kernel
//! for all formats. Layout, for scale block `b` of a panel:
//! `vals[((b·G + g)·pr + lane)·4 + i]` = value `4g + i` of the block in row `lane`
//! (`G = block/4` groups); `sub`, `min` are `[b][sub-block][lane]`, `d`, `aux` are
//! `[b][lane]`. Values are stored plus the panel's `offset` (wrapping: `-128` stores
//! signed values as unsigned `v + 128` for `vpdpbusd`; `32` makes Q6_K's values the
//! unsigned `q` of its `vec_dot`). Lanes past the matrix's last row hold zeros.

use crate::GgmlType;
use crate::QMatrix;
use crate::formats::{self, Layout, Unpacked};

/// Decoded weights of up to `pr` consecutive rows.
pub(crate) struct Panel {
    pub ty: GgmlType,
    pub pr: usize,
    pub nrows: usize,
    pub nblk: usize,
    pub layout: Layout,
    /// Added (wrapping) to every value when filling.
    pub offset: i8,
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
            offset: 0,
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
                    for i in 0..4 {
                        self.vals[o + i] = u.vals[4 * g + i].wrapping_add(self.offset);
                    }
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
}
