// Manifold hyper-connections (GLM-5.3, DeepSeek-V4) on the device, in the CPU backend's
// arithmetic (`engine/src/backend/cpu/mhc.rs`): the mixes `m = fn · (x / rms(x))` over
// the N·D streams of a token (an f32 island), then per token the pre/post weights, the
// Sinkhorn-normalised comb matrix and the collapse; the write-back; the final head.

#include "common.cuh"

#define HC_MAX_N 8

// m[t, i] = Σ_c fn[i, c] · (x[t, c] · r_t) with r_t = 1/sqrt(mean(x_t²) + eps): one block
// per (token, mix row i).
extern "C" __global__ void hc_mixes(const float* x, const float* fn, float* m, int nd, int n_mix, float eps) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, i = blockIdx.y;
    const float* xt = x + (i64)t * nd;
    const float* f = fn + (i64)i * nd;
    double ss = 0.0;
    for (int c = threadIdx.x; c < nd; c += blockDim.x) ss += (double)xt[c] * (double)xt[c];
    ss = block_sum_d(ss, red);
    const float mean = (float)(ss / (double)nd);
    const float r = __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean, eps)));
    double acc = 0.0;
    for (int c = threadIdx.x; c < nd; c += blockDim.x) acc += (double)f[c] * (double)__fmul_rn(xt[c], r);
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) m[(i64)t * n_mix + i] = (float)acc;
}

__device__ void softmax_row(float* v, int n) {
    float mx = v[0];
    for (int i = 1; i < n; ++i) mx = fmaxf(mx, v[i]);
    double s = 0.0;
    for (int i = 0; i < n; ++i) {
        v[i] = expf(__fsub_rn(v[i], mx));
        s += (double)v[i];
    }
    const float inv = (float)(1.0 / s);
    for (int i = 0; i < n; ++i) v[i] = __fmul_rn(v[i], inv);
}

// One block per token: pre, post and comb from the mixes, Sinkhorn, then
// out[t] = round(Σₙ preₙ·x[t, n]) and mix[t] = round(post), round(comb).
extern "C" __global__ void hc_pre_finish(const float* m, const float* x, const float* base, const float* scale,
                                         float* out, float* mix, int n, int d, int iters, float eps, int rb) {
    __shared__ float pre[HC_MAX_N];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const int nm = (2 + n) * n, ml = n + n * n;
    if (threadIdx.x == 0) {
        const float* mt = m + (i64)t * nm;
        float* mx = mix + (i64)t * ml;
        for (int i = 0; i < n; ++i) {
            pre[i] = __fadd_rn(sigmoidf_ref(__fadd_rn(__fmul_rn(mt[i], scale[0]), base[i])), eps);
            mx[i] = rnd(__fmul_rn(2.0f, sigmoidf_ref(__fadd_rn(__fmul_rn(mt[n + i], scale[1]), base[n + i]))), rb);
        }
        float c[HC_MAX_N * HC_MAX_N];
        for (int k = 0; k < n * n; ++k) c[k] = __fadd_rn(__fmul_rn(mt[2 * n + k], scale[2]), base[2 * n + k]);
        for (int i = 0; i < n; ++i) {
            softmax_row(c + i * n, n);
            for (int j = 0; j < n; ++j) c[i * n + j] = __fadd_rn(c[i * n + j], eps);
        }
        for (int it = 0; it < iters; ++it) {
            if (it > 0)
                for (int i = 0; i < n; ++i) {
                    float s = 0.f;
                    for (int j = 0; j < n; ++j) s = __fadd_rn(s, c[i * n + j]);
                    s = __fadd_rn(s, eps);
                    for (int j = 0; j < n; ++j) c[i * n + j] = __fdiv_rn(c[i * n + j], s);
                }
            for (int j = 0; j < n; ++j) {
                float s = 0.f;
                for (int i = 0; i < n; ++i) s = __fadd_rn(s, c[i * n + j]);
                s = __fadd_rn(s, eps);
                for (int i = 0; i < n; ++i) c[i * n + j] = __fdiv_rn(c[i * n + j], s);
            }
        }
        for (int k = 0; k < n * n; ++k) mx[n + k] = rnd(c[k], rb);
    }
    __syncthreads();
    const float* xt = x + (i64)t * n * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x) {
        float acc = 0.f;
        for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(pre[i], xt[(i64)i * d + k]));
        out[(i64)t * d + k] = rnd(acc, rb);
    }
}

// x[t, j] = round(round(post[j]·y[t]) + round(Σᵢ comb[i][j]·x[t, i])), one thread per (t, k).
extern "C" __global__ void hc_post(float* x, const float* y, const float* mix, i32 rows, int n, int d, int rb) {
    pdl_wait();
    pdl_trigger();
    const i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (idx >= (i64)rows * d) return;
    const int t = (int)(idx / d), k = (int)(idx - (i64)t * d);
    const int ml = n + n * n;
    const float* post = mix + (i64)t * ml;
    const float* comb = post + n;
    float* xt = x + (i64)t * n * d;
    float old[HC_MAX_N];
    for (int i = 0; i < n; ++i) old[i] = xt[(i64)i * d + k];
    const float yv = y[(i64)t * d + k];
    for (int j = 0; j < n; ++j) {
        float acc = 0.f;
        for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(comb[i * n + j], old[i]));
        const float a = rnd(__fmul_rn(post[j], yv), rb);
        xt[(i64)j * d + k] = rnd(__fadd_rn(a, rnd(acc, rb)), rb);
    }
}

// The final collapse: with `m` (mixes of a learned head) out = round(Σₙ preₙ·x[n]) with
// pre = sigmoid(m·scale + base) + eps; without, the mean of the streams.
extern "C" __global__ void hc_head(const float* x, const float* m, const float* base, const float* scale,
                                   float* out, i32 rows, int n, int d, float eps, int rb) {
    pdl_wait();
    pdl_trigger();
    const i64 idx = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (idx >= (i64)rows * d) return;
    const int t = (int)(idx / d), k = (int)(idx - (i64)t * d);
    const float* xt = x + (i64)t * n * d;
    float acc = 0.f;
    if (m) {
        for (int i = 0; i < n; ++i) {
            const float p = __fadd_rn(sigmoidf_ref(__fadd_rn(__fmul_rn(m[(i64)t * n + i], scale[0]), base[i])), eps);
            acc = __fadd_rn(acc, __fmul_rn(p, xt[(i64)i * d + k]));
        }
    } else {
        for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, xt[(i64)i * d + k]);
        acc = __fdiv_rn(acc, (float)n);
    }
    out[idx] = rnd(acc, rb);
}
