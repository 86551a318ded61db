// Manifold hyper-connections (GLM-5.3, DeepSeek-V4) on the device, in the CPU backend's
// arithmetic (`engine/src/backend/cpu/mhc.rs`): the mixes `m = fn · (x / rms(x))` over
// the N·D streams of a token (an f32 island), then per token the pre/post weights, the
// Sinkhorn-normalised comb matrix and the collapse; the write-back; the final head.

#include "common.cuh"

#define HC_MAX_N 8
// Columns per thread whose loads are issued together (collapse, partial sums).
#define HC_UNROLL 8

// m[t, i] = Σ_c fn[i, c] · (x[t, c] · r_t) with r_t = 1/sqrt(mean(x_t²) + eps), by one
// block.
__device__ __forceinline__ void mix_row(const float* x, const float* fn, float* m, int nd, int n_mix, float eps,
                                        int t, int i, double* red) {
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

// One block per (token, mix row).
extern "C" __global__ void hc_mixes(const float* x, const float* fn, float* m, int nd, int n_mix, float eps) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    mix_row(x, fn, m, nd, n_mix, eps, blockIdx.x, blockIdx.y, red);
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

// out[k] = round(Σₙ preₙ·x[n, k]) over the first n ≤ N streams, HC_UNROLL columns per
// thread at a time with all their loads issued before the sums (the loop would otherwise
// wait one memory latency per column). N known at compile time keeps the loads in
// registers.
template <int N>
__device__ __forceinline__ void collapse(const float* pre, const float* xt, float* out, int n, int d, int rb) {
    for (int k0 = threadIdx.x; k0 < d; k0 += HC_UNROLL * blockDim.x) {
        float v[HC_UNROLL][N];
#pragma unroll
        for (int u = 0; u < HC_UNROLL; ++u) {
            const int k = k0 + u * blockDim.x;
#pragma unroll
            for (int i = 0; i < N; ++i) v[u][i] = k < d && i < n ? __ldcg(xt + (i64)i * d + k) : 0.f;
        }
#pragma unroll
        for (int u = 0; u < HC_UNROLL; ++u) {
            const int k = k0 + u * blockDim.x;
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < N; ++i)
                if (i < n) acc = __fadd_rn(acc, __fmul_rn(pre[i], v[u][i]));
            if (k < d) out[k] = rnd(acc, rb);
        }
    }
}

// Token t by one block: pre, post and comb from the mixes, Sinkhorn, then
// out[t] = round(Σₙ preₙ·x[t, n]) and mix[t] = round(post), round(comb). Thread i < n
// owns pre/post i and comb row i's softmax; in the Sinkhorn iterations thread e < n²
// owns comb element e and sums its row (then column) in the serial order.
__device__ __forceinline__ void pre_finish(const float* m, const float* x, const float* base, const float* scale,
                                           float* out, float* mix, int n, int d, int iters, float eps, int rb,
                                           int t) {
    __shared__ float pre[HC_MAX_N];
    __shared__ float c[HC_MAX_N * HC_MAX_N];
    const int nm = (2 + n) * n, ml = n + n * n, tid = threadIdx.x;
    const float* mt = m + (i64)t * nm;  // (L2 reads: other blocks wrote it)
    float* mx = mix + (i64)t * ml;
    if (tid < n) {
        pre[tid] = __fadd_rn(sigmoidf_ref(__fadd_rn(__fmul_rn(__ldcg(mt + tid), scale[0]), base[tid])), eps);
        mx[tid] = rnd(__fmul_rn(2.0f, sigmoidf_ref(__fadd_rn(__fmul_rn(__ldcg(mt + n + tid), scale[1]), base[n + tid]))),
                      rb);
        float* row = c + tid * n;
        for (int j = 0; j < n; ++j)
            row[j] = __fadd_rn(__fmul_rn(__ldcg(mt + 2 * n + tid * n + j), scale[2]), base[2 * n + tid * n + j]);
        softmax_row(row, n);
        for (int j = 0; j < n; ++j) row[j] = __fadd_rn(row[j], eps);
    }
    __syncthreads();
    const int ei = tid / n, ej = tid % n;
    const bool own = tid < n * n;
    // Up to 32 comb elements live in warp 0, which then synchronises alone.
    const bool one_warp = n * n <= 32;
    auto sync = [one_warp] {
        if (one_warp)
            __syncwarp();
        else
            __syncthreads();
    };
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            float s = 0.f;
            if (own) {
                for (int j = 0; j < n; ++j) s = __fadd_rn(s, c[ei * n + j]);
                s = __fadd_rn(s, eps);
            }
            sync();
            if (own) c[tid] = __fdiv_rn(c[tid], s);
            sync();
        }
        float s = 0.f;
        if (own) {
            for (int i = 0; i < n; ++i) s = __fadd_rn(s, c[i * n + ej]);
            s = __fadd_rn(s, eps);
        }
        sync();
        if (own) c[tid] = __fdiv_rn(c[tid], s);
        sync();
    }
    if (own) mx[n + tid] = rnd(c[tid], rb);
    __syncthreads();
    const float* xt = x + (i64)t * n * d;
    if (n == 4)
        collapse<4>(pre, xt, out + (i64)t * d, n, d, rb);
    else
        collapse<HC_MAX_N>(pre, xt, out + (i64)t * d, n, d, rb);
}

// One block per token.
extern "C" __global__ void hc_pre_finish(const float* m, const float* x, const float* base, const float* scale,
                                         float* out, float* mix, int n, int d, int iters, float eps, int rb) {
    pdl_wait();
    pdl_trigger();
    pre_finish(m, x, base, scale, out, mix, n, d, iters, eps, rb, blockIdx.x);
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

// The write-back of one sublayer and the next sublayer's pre for one token (decode) in one
// launch. Block b owns columns [b·HC_COLS, (b+1)·HC_COLS) of every stream: it writes
// their new values (`hc_post`'s arithmetic) and the partial sums of their squares and of
// their products with each fn row; the last block sums the partials in block order,
// forms the mixes as r·Σ fn·x (the mix kernels round x·r first: within an f32 ulp), then
// runs `pre_finish`.
#define HC_COLS 128
#define HC_MAX_MIX ((2 + HC_MAX_N) * HC_MAX_N)

struct HcPostArgs {
    float* x;
    const float* y;
    const float* mix;
    i32 n, d, rb;
};

struct HcPreArgs {
    const float* fn;     // [(2+n)·n, n·d]
    float* m;            // scratch [(2+n)·n]
    double* partials;    // scratch [blocks, 1 + (2+n)·n]
    u32* counter;        // zero between launches
    const float* base;
    const float* scale;
    float* out;
    float* mix;
    i32 n, d, iters, rb;
    float eps, norm_eps;
};

// The warp's partial sums of Σ x² (slot 0) and of each fn row · x (slots 1..) over its
// columns, for N streams known at compile time: every fn load of the thread is issued
// before the sums (one memory latency instead of one per row). Same order of additions
// as the general loop.
template <int N>
__device__ __forceinline__ void hc_partials(const float* fn, const float* nv, int nd, int d, int k, int lane,
                                            double* slots) {
    constexpr int M = (2 + N) * N;
    float f[M][N];
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) f[i][j] = k < d ? __ldg(fn + (i64)i * nd + (i64)j * d + k) : 0.f;
#pragma unroll
    for (int i = -1; i < M; ++i) {
        double v = 0.0;
#pragma unroll
        for (int j = 0; j < N; ++j)
            v += i < 0 ? (double)nv[j] * (double)nv[j] : (k < d ? (double)f[i][j] * (double)nv[j] : 0.0);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) slots[i + 1] = v;
    }
}

extern "C" __global__ void __launch_bounds__(HC_COLS) hc_post_pre(const HcPostArgs A, const HcPreArgs B) {
    __shared__ double wred[HC_COLS / 32][HC_MAX_MIX + 1];
    __shared__ bool last;
    pdl_wait();
    pdl_trigger();
    const int n = A.n, d = A.d, nd = n * d, n_mix = (2 + n) * n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k = blockIdx.x * HC_COLS + threadIdx.x;
    float nv[HC_MAX_N];
    for (int j = 0; j < n; ++j) nv[j] = 0.f;
    if (k < d) {
        const float* post = A.mix;
        const float* comb = post + n;
        float old[HC_MAX_N];
        for (int i = 0; i < n; ++i) old[i] = A.x[(i64)i * d + k];
        const float yv = A.y[k];
        for (int j = 0; j < n; ++j) {
            float acc = 0.f;
            for (int i = 0; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(comb[i * n + j], old[i]));
            const float a = rnd(__fmul_rn(post[j], yv), A.rb);
            nv[j] = rnd(__fadd_rn(a, rnd(acc, A.rb)), A.rb);
            A.x[(i64)j * d + k] = nv[j];
        }
    }
    if (n == 4) {
        hc_partials<4>(B.fn, nv, nd, d, k, lane, wred[warp]);
    } else {
        for (int i = -1; i < n_mix; ++i) {
            double v = 0.0;
            for (int j = 0; j < n; ++j)
                v += i < 0 ? (double)nv[j] * (double)nv[j]
                           : (k < d ? (double)B.fn[(i64)i * nd + (i64)j * d + k] * (double)nv[j] : 0.0);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) wred[warp][i + 1] = v;
        }
    }
    __syncthreads();
    if (threadIdx.x <= n_mix) {
        double v = 0.0;
        for (int w = 0; w < HC_COLS / 32; ++w) v += wred[w][threadIdx.x];
        B.partials[(i64)blockIdx.x * (n_mix + 1) + threadIdx.x] = v;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(B.counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x <= n_mix) {
        // In block order, HC_UNROLL blocks' partials loaded at a time.
        const int nb = (int)gridDim.x;
        double v = 0.0;
        for (int b0 = 0; b0 < nb; b0 += HC_UNROLL) {
            double q[HC_UNROLL];
#pragma unroll
            for (int u = 0; u < HC_UNROLL; ++u)
                q[u] = b0 + u < nb ? __ldcg(B.partials + (i64)(b0 + u) * (n_mix + 1) + threadIdx.x) : 0.0;
#pragma unroll
            for (int u = 0; u < HC_UNROLL; ++u)
                if (b0 + u < nb) v += q[u];
        }
        wred[0][threadIdx.x] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) *B.counter = 0u;
    if (threadIdx.x < n_mix) {
        const float mean = (float)(wred[0][0] / (double)nd);
        const float r = __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean, B.norm_eps)));
        B.m[threadIdx.x] = (float)((double)r * wred[0][threadIdx.x + 1]);
    }
    __syncthreads();
    pre_finish(B.m, A.x, B.base, B.scale, B.out, B.mix, n, d, B.iters, B.eps, B.rb, 0);
}

// One token's pre (decode) in one launch: block i computes mix row i; the last block to
// finish runs `pre_finish`. The same arithmetic as `hc_mixes` + `hc_pre_finish`.
extern "C" __global__ void hc_pre_one(const float* x, const HcPreArgs B) {
    __shared__ double red[32];
    __shared__ bool last;
    pdl_wait();
    pdl_trigger();
    const int n_mix = (2 + B.n) * B.n;
    mix_row(x, B.fn, B.m, B.n * B.d, n_mix, B.norm_eps, 0, blockIdx.x, red);
    __threadfence();
    if (threadIdx.x == 0) last = atomicAdd(B.counter, 1u) == (u32)n_mix - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *B.counter = 0u;
    pre_finish(B.m, x, B.base, B.scale, B.out, B.mix, B.n, B.d, B.iters, B.eps, B.rb, 0);
}
