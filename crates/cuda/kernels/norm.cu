// Row norms in the PyTorch references' arithmetic (`Prec::F32`/`Bf16`): RMSNorm with
// the reference's two roundings (`round(round(x·r)·w)`), LayerNorm, and the gated
// output norm of delta-rule layers. Sums of squares and statistics in f64, as the CPU
// backend (`engine/src/backend/cpu/torch_math.rs`, `delta.rs`); `rb` rounds to bf16
// at the reference's cast points.

#include "common.cuh"

// One block per row of `cols`. cast_once = 0 (GLM-5.3's RMSNorm): out =
// round(round(x·r)·w), w optional. cast_once = 1 (DeepSeek-V4's norms,
// `Backend::rms_norm_cast_once`): round(w·(x·r)), or without w round(x·round(r)).
extern "C" __global__ void rms_norm_ref(const float* x, const float* w, float* out, int cols, float eps, int rb,
                                        int cast_once) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    const float* xr = x + (i64)blockIdx.x * cols;
    float* yr = out + (i64)blockIdx.x * cols;
    double ss = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = block_sum_d(ss, red);
    const float r = inv_rms(ss, cols, eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v;
        if (!cast_once) {
            v = rnd(__fmul_rn(xr[i], r), rb);
            if (w) v = rnd(__fmul_rn(v, w[i]), rb);
        } else {
            v = w ? rnd(__fmul_rn(w[i], __fmul_rn(xr[i], r)), rb) : rnd(__fmul_rn(xr[i], rnd(r, rb)), rb);
        }
        yr[i] = v;
    }
}

// One block per row: out = round(((x − mean)·rsqrt(var + eps))·w + b), statistics in f64.
extern "C" __global__ void layer_norm_ref(const float* x, const float* w, const float* b, float* out, int cols,
                                          float eps, int rb) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    const float* xr = x + (i64)blockIdx.x * cols;
    float* yr = out + (i64)blockIdx.x * cols;
    double s = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += (double)xr[i];
    const double mean = block_sum_d(s, red) / (double)cols;
    double v = 0.0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    const double var = block_sum_d(v, red) / (double)cols;
    const double r = 1.0 / sqrt(var + (double)eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float n = (float)(((double)xr[i] - mean) * r);
        yr[i] = rnd(__fadd_rn(__fmul_rn(n, w[i]), b[i]), rb);
    }
}

// The gated output norm per head of `dv` values: one warp per (row, head).
// silu = 0: KDA, round(w·(o·r)·sigmoid(z)); silu = 1: gated delta net,
// round(w·round(o·r)·silu(z)).
extern "C" __global__ void gated_norm(const float* o, const float* z, const float* w, float* out, i64 n_heads,
                                      int dv, float eps, int silu, int rb) {
    pdl_wait();
    pdl_trigger();
    const i64 hw = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (hw >= n_heads) return;
    const float* orow = o + hw * dv;
    const float* zrow = z + hw * dv;
    float* dst = out + hw * dv;
    const float r = gated_inv_rms(orow, dv, eps);
    for (int j = lane; j < dv; j += 32) dst[j] = gated_value(orow[j], r, w[j], zrow[j], silu, rb);
}
