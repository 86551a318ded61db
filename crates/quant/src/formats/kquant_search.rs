//! Scale searches of ggml's reference K-quant quantizers, reproduced operation for
//! operation (same f32 expression order) so the quantized bytes match ggml's
//! `quantize_row_*_ref` exactly.
//!
//! Source: ggml `ggml-quants.c` (`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`,
//! `get_scale_min_k4`).

use crate::fp::nearest_int;

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this are all-zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Signed value of largest magnitude (the first one on ties) and that magnitude.
fn signed_max(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants` with `rmse_type = 1` and no importance weights (weights `x²`):
/// symmetric levels `-nmax..nmax-1`, stored in `l` offset by `nmax`; tries 19 scales
/// around `-nmax/max` and keeps the best weighted least-squares fit. Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |v: i32| v.clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &xi) in x.iter().enumerate() {
        let l = clamp(nearest_int(iscale * xi));
        l_out[i] = (l + nmax) as i8;
        let w = xi * xi;
        sumlx += w * xi * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in x {
            let l = clamp(nearest_int(iscale * xi));
            let w = xi * xi;
            sumlx += w * xi * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (i, &xi) in x.iter().enumerate() {
                l_out[i] = (nmax + clamp(nearest_int(iscale * xi))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse = true`: start from `-nmax/max`, then up to five
/// rounds of coordinate descent on the weighted (`x²`) fit. Levels offset by `nmax`.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let clamp = |v: i32| v.clamp(-nmax, nmax - 1);
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &xi) in x.iter().enumerate() {
        let l = clamp(nearest_int(iscale * xi));
        l_out[i] = l as i8;
        let w = xi * xi;
        sumlx += w * xi * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, &xi) in x.iter().enumerate() {
            let w = xi * xi;
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * xi * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = clamp(nearest_int(xi * sl2 / slx));
                if new_l != l_out[i] as i32 {
                    slx += w * xi * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in l_out.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Parameters of one `make_qkx2_quants` search.
pub(crate) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// `make_qkx2_quants`: asymmetric levels `0..=nmax` with a minimum; returns
/// `(scale, min)` where `min >= 0` is subtracted (value = `scale·l - min`).
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// 6-bit scale and minimum of sub-block `j` (0..8) from the 12 packed bytes of Q4_K
/// and Q5_K (`get_scale_min_k4`).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs eight 6-bit scales and minimums into Q4_K/Q5_K's 12 bytes (inverse of
/// [`scale_min_k4`]).
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8]) {
    out[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}
