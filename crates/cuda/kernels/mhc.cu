// Manifold hyper-connections (GLM-5.3, DeepSeek-V4) on the device, in the CPU backend's
// arithmetic (`engine/src/backend/cpu/mhc.rs`): the mixes `m = fn · (x / rms(x))` over
// the N·D streams of a token (an f32 island), then per token the pre/post weights, the
// Sinkhorn-normalised comb matrix and the collapse; the write-back; the final head.

#include "common.cuh"

#define HC_MAX_N 8
// Columns per thread whose loads are issued together (collapse).
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
    const float r = inv_rms(ss, nd, eps);
    double acc = 0.0;
    for (int c = threadIdx.x; c < nd; c += blockDim.x) acc += (double)f[c] * (double)__fmul_rn(xt[c], r);
    acc = block_sum_d(acc, red);
    if (threadIdx.x == 0) m[(i64)t * n_mix + i] = (float)acc;
}

// `hc_mixes`' tokens and mix rows per block, the columns staged per step and the
// shared-memory row length (one float of padding keeps column reads conflict-free).
#define HC_MT 16
#define HC_MI 24
#define HC_KC 128
#define HC_LD (HC_KC + 1)
static_assert(HC_MT == 16 && HC_MI == 24 && HC_KC == 128,
              "256 threads: 8 column groups of 16 columns x 32 tiles of 2 tokens x 6 mix rows");

// r[t] = 1/sqrt(mean(x_t²) + eps) (the sum in double), one block per token.
extern "C" __global__ void __launch_bounds__(256) hc_rms(const float* x, float* r, int nd, float eps) {
    __shared__ double red[8];
    pdl_wait();
    pdl_trigger();
    const float* xt = x + (i64)blockIdx.x * nd;
    double ss = 0.0;
    if ((nd & 3) == 0 && ((u64)xt & 15) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(xt);
#pragma unroll 8
        for (int c = threadIdx.x; c < nd >> 2; c += blockDim.x) {
            const float4 v = x4[c];
            ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
        }
    } else {
        for (int c = threadIdx.x; c < nd; c += blockDim.x) ss += (double)xt[c] * (double)xt[c];
    }
    ss = block_sum_d(ss, red);
    if (threadIdx.x == 0) r[blockIdx.x] = inv_rms(ss, nd, eps);
}

// Loads the HC_KC columns from c0 (below c1) of `rows` rows (ld floats apart) into
// v[0..PER): thread slot s = threadIdx.x + 256·k holds row s / 32, columns 4·(s % 32)..+3;
// rows at or past `rows` and columns at or past c1 read as zero.
template <int PER>
__device__ __forceinline__ void hc_chunk_load(float4 (&v)[PER], const float* base, int rows, int nd, int c0, int c1,
                                              bool vec) {
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int s = threadIdx.x + 256 * k, row = s >> 5, c = c0 + 4 * (s & 31);
        float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row < rows) {
            const float* p = base + (i64)row * nd + c;
            if (vec && c + 3 < c1)
                t = *reinterpret_cast<const float4*>(p);
            else {
                if (c < c1) t.x = p[0];
                if (c + 1 < c1) t.y = p[1];
                if (c + 2 < c1) t.z = p[2];
                if (c + 3 < c1) t.w = p[3];
            }
        }
        v[k] = t;
    }
}

// Grid (ceil(rows/HC_MT), ceil(n_mix/HC_MI), splits), 256 threads: m[t, i] = Σ_c fn[i, c]
// · round(x[t, c] · r_t), the products summed in double — `mix_row`'s arithmetic in
// another order of the double sums (the f32 mixes equal mix_row's unless the two double
// sums round to different floats). Block z takes the columns of steps z·steps.. of its
// token tile; x and fn pass through shared memory HC_KC columns at a time, the next
// step's loads in flight while the current one multiplies. Warp g sums columns
// 16g..16g+15 of each step; its lane holds two tokens × six mix rows; the eight warps'
// sums are added in order. With several splits each writes its sums in double and the
// last to arrive adds them in split order, so the result does not depend on the timing.
// r: `hc_rms`'s; part: splits × rows × n_mix (splits > 1); count: per (token tile, mix
// tile), the splits arrived (zero between launches); steps: HC_KC-column steps per split.
extern "C" __global__ void __launch_bounds__(256) hc_mixes(const float* x, const float* r, const float* fn, float* m,
                                                          double* part, u32* count, int rows, int nd, int n_mix,
                                                          int steps) {
    __shared__ float xs[HC_MT][HC_LD];
    __shared__ float fs[HC_MI][HC_LD];
    __shared__ float rs[HC_MT];
    __shared__ double red[8][HC_MT * HC_MI];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = blockIdx.x * HC_MT, i0 = blockIdx.y * HC_MI;
    const int nt = min(HC_MT, rows - t0), ni = min(HC_MI, n_mix - i0);
    const int c_lo = blockIdx.z * steps * HC_KC, c_hi = min(nd, c_lo + steps * HC_KC);
    const float* xb = x + (i64)t0 * nd;
    const float* fb = fn + (i64)i0 * nd;
    const bool vec = (nd & 3) == 0 && ((u64)x & 15) == 0 && ((u64)fn & 15) == 0;
    // fn is a weight: its first step is loaded before the wait for the previous kernel.
    float4 fv[3], xv[2];
    hc_chunk_load(fv, fb, ni, nd, c_lo, c_hi, vec);
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x < HC_MT) rs[threadIdx.x] = threadIdx.x < nt ? r[t0 + threadIdx.x] : 0.f;
    hc_chunk_load(xv, xb, nt, nd, c_lo, c_hi, vec);
    __syncthreads();
    const int tp = lane >> 2, mg = lane & 3;  // tokens 2·tp, 2·tp + 1; mix rows 6·mg..+5
    double acc[2][6];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int j = 0; j < 6; ++j) acc[a][j] = 0.0;
    for (int c0 = c_lo; c0 < c_hi; c0 += HC_KC) {
        // Store the loaded step (x scaled by its token's r, rounded as the reference's
        // normalised input), then issue the next step's loads.
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int s = threadIdx.x + 256 * k, row = s >> 5, c = 4 * (s & 31);
            const float rt = rs[row];
            xs[row][c] = __fmul_rn(xv[k].x, rt);
            xs[row][c + 1] = __fmul_rn(xv[k].y, rt);
            xs[row][c + 2] = __fmul_rn(xv[k].z, rt);
            xs[row][c + 3] = __fmul_rn(xv[k].w, rt);
        }
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            const int s = threadIdx.x + 256 * k, row = s >> 5, c = 4 * (s & 31);
            fs[row][c] = fv[k].x;
            fs[row][c + 1] = fv[k].y;
            fs[row][c + 2] = fv[k].z;
            fs[row][c + 3] = fv[k].w;
        }
        __syncthreads();
        if (c0 + HC_KC < c_hi) {
            hc_chunk_load(xv, xb, nt, nd, c0 + HC_KC, c_hi, vec);
            hc_chunk_load(fv, fb, ni, nd, c0 + HC_KC, c_hi, vec);
        }
#pragma unroll 4
        for (int cc = 0; cc < 16; ++cc) {
            const int c = 16 * warp + cc;
            const double x0 = (double)xs[2 * tp][c], x1 = (double)xs[2 * tp + 1][c];
#pragma unroll
            for (int j = 0; j < 6; ++j) {
                const double f = (double)fs[6 * mg + j][c];
                acc[0][j] += f * x0;
                acc[1][j] += f * x1;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int j = 0; j < 6; ++j) red[warp][(2 * tp + a) * HC_MI + 6 * mg + j] = acc[a][j];
    __syncthreads();
    const int splits = gridDim.z;
    for (int v = threadIdx.x; v < HC_MT * HC_MI; v += blockDim.x) {
        const int u = v / HC_MI, i = v % HC_MI;
        double t = 0.0;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += red[k][v];
        if (u >= nt || i >= ni) continue;
        const i64 o = (i64)(t0 + u) * n_mix + i0 + i;
        if (splits == 1)
            m[o] = (float)t;
        else
            part[(i64)blockIdx.z * rows * n_mix + o] = t;
    }
    if (splits == 1) return;
    __threadfence();
    __syncthreads();
    u32* cnt = count + blockIdx.x * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (u32)splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *cnt = 0u;
    for (int v = threadIdx.x; v < HC_MT * HC_MI; v += blockDim.x) {
        const int u = v / HC_MI, i = v % HC_MI;
        if (u >= nt || i >= ni) continue;
        const i64 o = (i64)(t0 + u) * n_mix + i0 + i;
        double t = 0.0;
        for (int z = 0; z < splits; ++z) t += __ldcg(part + (i64)z * rows * n_mix + o);
        m[o] = (float)t;
    }
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

// Token t's coefficients from its mixes `mt(i)`: pre into `pre`, and post and the
// Sinkhorn-normalised comb into `mx` (rounded) when `write`. Thread i < n owns pre/post
// i and comb row i's softmax; in the Sinkhorn iterations thread e < n² owns comb element
// e and sums its row (then column) in the serial order.
// pre_i = sigmoid(m_i·scale₀ + base_i) + eps.
__device__ __forceinline__ float hc_pre_coef(float m, float scale, float base, float eps) {
    return __fadd_rn(sigmoidf_ref(__fadd_rn(__fmul_rn(m, scale), base)), eps);
}

template <class M>
__device__ __forceinline__ void hc_coeffs(M mt, const float* base, const float* scale, float* pre, float* mx, int n,
                                          int iters, float eps, int rb, bool write) {
    __shared__ float c[HC_MAX_N * HC_MAX_N];
    const int tid = threadIdx.x;
    if (tid < n) {
        pre[tid] = hc_pre_coef(mt(tid), scale[0], base[tid], eps);
        if (write)
            mx[tid] =
                rnd(__fmul_rn(2.0f, sigmoidf_ref(__fadd_rn(__fmul_rn(mt(n + tid), scale[1]), base[n + tid]))), rb);
        float* row = c + tid * n;
        for (int j = 0; j < n; ++j)
            row[j] = __fadd_rn(__fmul_rn(mt(2 * n + tid * n + j), scale[2]), base[2 * n + tid * n + j]);
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
    if (own && write) mx[n + tid] = rnd(c[tid], rb);
    __syncthreads();
}

// Token t by one block: the coefficients from the mixes in `m`, then
// out[t] = round(Σₙ preₙ·x[t, n]) and mix[t] = round(post), round(comb).
__device__ __forceinline__ void pre_finish(const float* m, const float* x, const float* base, const float* scale,
                                           float* out, float* mix, int n, int d, int iters, float eps, int rb,
                                           int t) {
    __shared__ float pre[HC_MAX_N];
    const float* mt = m + (i64)t * (2 + n) * n;  // (L2 reads: other blocks wrote it)
    hc_coeffs([mt](int i) { return __ldcg(mt + i); }, base, scale, pre, mix + (i64)t * (n + n * n), n, iters, eps,
              rb, true);
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
// launch (without `A.y`, the pre alone: the first sublayer's). Block b owns columns
// [b·HC_COLS, (b+1)·HC_COLS) of every stream: it writes their new values (`hc_post`'s
// arithmetic) and the partial sums of their squares and of their products with each fn
// row; after a grid barrier every block sums the partials in block order, forms the mixes
// as r·Σ fn·x (the mix kernels round x·r first: within an f32 ulp) and pre (`hc_coeffs`'
// arithmetic, the same in every block), and collapses its own columns. Block 0 leaves the
// mixes in B.m for `hc_sinkhorn` (post and comb). The grid is one wave (d / HC_COLS
// blocks), so the barrier cannot wait on a block that is not resident.
#define HC_COLS 128
#define HC_MAX_MIX ((2 + HC_MAX_N) * HC_MAX_N)
// Blocks' partials loaded at a time in the sums after the barrier.
#define HC_SUM_LOADS 32

struct HcPostArgs {
    float* x;
    const float* y;
    const float* mix;
    i32 n, d, rb;
};

struct HcPreArgs {
    const float* fn;     // [(2+n)·n, n·d]
    float* m;            // scratch [(2+n)·n]: hc_pre_one's mixes; hc_post_pre's for hc_sinkhorn
    double* partials;    // scratch [blocks, 1 + (2+n)·n]
    u32* counter;        // grid_sync's word: arrivals (zero between launches), generation
    const float* base;
    const float* scale;
    float* out;
    float* mix;
    i32 n, d, iters, rb;
    float eps, norm_eps;
};

// Column k of every fn row for N streams known at compile time, in registers: loaded
// before the kernel waits for the previous one (the weights do not depend on it).
template <int N>
__device__ __forceinline__ void hc_fn_col(const float* fn, int d, int k, float (&f)[(2 + N) * N][N]) {
#pragma unroll
    for (int i = 0; i < (2 + N) * N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) f[i][j] = 0.f;
    if (k >= d) return;
    // Element (i, j·d + k) of fn [(2+N)·N, N·d]: a 32-bit offset (fn has fewer than 2³¹
    // values), one multiply per load.
    const float* p = fn + k;
#pragma unroll
    for (int i = 0; i < (2 + N) * N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) f[i][j] = __ldg(p + (i * N + j) * d);
}

// The warp's partial sums of Σ x² (slot 0) and of each fn row · x (slots 1..) over its
// columns from `hc_fn_col`'s values. Same order of additions as the general loop; the
// warp's sums in one butterfly (`warp_sums`), lane s writing slot s.
template <int N>
__device__ __forceinline__ void hc_partials(const float (&f)[(2 + N) * N][N], const float* nv, int d, int k,
                                            int lane, double* slots) {
    constexpr int M = (2 + N) * N;
    static_assert(M + 1 <= 32, "one slot per lane");
    double v[32];
#pragma unroll
    for (int i = -1; i < 31; ++i) {
        double a = 0.0;
        if (i < M)
#pragma unroll
            for (int j = 0; j < N; ++j)
                a += i < 0 ? (double)nv[j] * (double)nv[j] : (k < d ? (double)f[i][j] * (double)nv[j] : 0.0);
        v[i + 1] = a;
    }
    const double s = warp_sums(v, lane);
    if (lane <= M) slots[lane] = s;
}

// N: the streams, 4 (every index known at compile time, the fn column held in
// registers from before the wait) or up to HC_MAX_N (A.n at run time).
template <int N>
__device__ __forceinline__ void post_pre(const HcPostArgs& A, const HcPreArgs& B) {
    __shared__ double wred[HC_COLS / 32][HC_MAX_MIX + 1];
    __shared__ float coef[HC_MAX_MIX + 3];  // base, then the three scales
    __shared__ float ms[HC_MAX_MIX];
    __shared__ float pre[HC_MAX_N];
    constexpr bool FN_REGS = N == 4;
    const int n = N == 4 ? 4 : A.n, d = A.d, nd = n * d, n_mix = (2 + n) * n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k = blockIdx.x * HC_COLS + threadIdx.x;
    // Weights first: they do not depend on the previous kernel.
    float f[FN_REGS ? (2 + N) * N : 1][N];
    if constexpr (FN_REGS) hc_fn_col<N>(B.fn, d, k, f);
    if (threadIdx.x < n_mix) coef[threadIdx.x] = B.base[threadIdx.x];
    if (threadIdx.x < 3) coef[n_mix + threadIdx.x] = B.scale[threadIdx.x];
    pdl_wait();
    pdl_trigger();
    float nv[N];
#pragma unroll
    for (int j = 0; j < N; ++j) nv[j] = 0.f;
    if (k < d && !A.y) {
        // No write-back (the first sublayer's pre): the streams as they are.
#pragma unroll
        for (int j = 0; j < N; ++j) nv[j] = j < n ? A.x[(i64)j * d + k] : 0.f;
    } else if (k < d) {
        // post and comb loaded before the stores to x (the compiler cannot know that they
        // do not alias).
        float pc[N + N * N], old[N];
#pragma unroll
        for (int i = 0; i < N + N * N; ++i) pc[i] = i < n + n * n ? A.mix[i] : 0.f;
#pragma unroll
        for (int i = 0; i < N; ++i) old[i] = i < n ? A.x[(i64)i * d + k] : 0.f;
        const float yv = A.y[k];
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if (j >= n) break;
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < N; ++i)
                if (i < n) acc = __fadd_rn(acc, __fmul_rn(pc[n + i * n + j], old[i]));
            const float a = rnd(__fmul_rn(pc[j], yv), A.rb);
            nv[j] = rnd(__fadd_rn(a, rnd(acc, A.rb)), A.rb);
        }
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (j < n) A.x[(i64)j * d + k] = nv[j];
    }
    if constexpr (FN_REGS) {
        hc_partials<N>(f, nv, d, k, lane, wred[warp]);
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
    grid_sync(B.counter);
    // Every block: the partials summed in block order (HC_SUM_LOADS blocks' loads issued
    // at a time), the mixes, the coefficients (block 0 writes post and comb), then its
    // own columns of out from the new stream values it holds.
    if (threadIdx.x <= n_mix) {
        const int nb = (int)gridDim.x;
        double v = 0.0;
        for (int b0 = 0; b0 < nb; b0 += HC_SUM_LOADS) {
            double q[HC_SUM_LOADS];
#pragma unroll
            for (int u = 0; u < HC_SUM_LOADS; ++u)
                q[u] = b0 + u < nb ? __ldcg(B.partials + (i64)(b0 + u) * (n_mix + 1) + threadIdx.x) : 0.0;
#pragma unroll
            for (int u = 0; u < HC_SUM_LOADS; ++u)
                if (b0 + u < nb) v += q[u];
        }
        wred[0][threadIdx.x] = v;
    }
    __syncthreads();
    if (threadIdx.x < n_mix) {
        const float r = inv_rms(wred[0][0], nd, B.norm_eps);
        ms[threadIdx.x] = (float)((double)r * wred[0][threadIdx.x + 1]);
    }
    __syncthreads();
    // pre; post and comb are `hc_sinkhorn`'s, from the mixes block 0 leaves in B.m.
    if (threadIdx.x < n) pre[threadIdx.x] = hc_pre_coef(ms[threadIdx.x], coef[n_mix], coef[threadIdx.x], B.eps);
    if (blockIdx.x == 0 && threadIdx.x < n_mix) B.m[threadIdx.x] = ms[threadIdx.x];
    __syncthreads();
    if (k < d) {
        float acc = 0.f;
#pragma unroll
        for (int i = 0; i < N; ++i)
            if (i < n) acc = __fadd_rn(acc, __fmul_rn(pre[i], nv[i]));
        B.out[k] = rnd(acc, B.rb);
    }
}

extern "C" __global__ void __launch_bounds__(HC_COLS) hc_post_pre(const HcPostArgs A, const HcPreArgs B) {
    if (A.n == 4)
        post_pre<4>(A, B);
    else
        post_pre<HC_MAX_N>(A, B);
}

// post and the Sinkhorn-normalised comb into B.mix from the mixes `hc_post_pre` left in
// B.m, by one block of HC_SINKHORN_THREADS. The lowering launches it after a later
// kernel of the sublayer (a long GEMV, `place_sinkhorn` in lower.rs, else the first
// kernel), so that when it starts — once that kernel has passed its own wait —
// `hc_post_pre` has finished. It lets the next kernel start at once (that one may then
// start before the kernel between has finished: it reads only weights before its wait,
// and its wait covers this kernel, which waits for the kernel between before it ends),
// runs beside the kernel between (in a block slot that GEMV leaves free), and so takes
// the 39 dependent divisions out of the chain of launches. The next reader of B.mix is
// the next write-back, later in the stream.
// `wait_first`: launched right after `hc_post_pre` (no kernel between), it waits for it
// before reading.
#define HC_SINKHORN_THREADS 64
extern "C" __global__ void __launch_bounds__(HC_SINKHORN_THREADS) hc_sinkhorn(const HcPreArgs B, int wait_first) {
    __shared__ float pre[HC_MAX_N];
    if (wait_first) pdl_wait();
    pdl_trigger();
    const float* m = B.m;
    hc_coeffs([m](int i) { return __ldcg(m + i); }, B.base, B.scale, pre, B.mix, B.n, B.iters, B.eps, B.rb, true);
    if (!wait_first) pdl_wait();
}

// One token's pre (decode) in one launch: block i computes mix row i; the last block to
// finish runs `pre_finish`. The arithmetic of `hc_mixes` + `hc_pre_finish`.
extern "C" __global__ void hc_pre_one(const float* x, const HcPreArgs B) {
    __shared__ double red[32];
    __shared__ bool last;
    pdl_wait();
    pdl_trigger();
    const int n_mix = (2 + B.n) * B.n;
    mix_row(x, B.fn, B.m, B.n * B.d, n_mix, B.norm_eps, 0, blockIdx.x, red);
    __threadfence();
    // The low 16 bits count arrivals (the word is `grid_sync`'s, whose generation may be
    // set above them).
    if (threadIdx.x == 0) last = (atomicAdd(B.counter, 1u) & 0xFFFFu) == (u32)n_mix - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *B.counter = 0u;
    pre_finish(B.m, x, B.base, B.scale, B.out, B.mix, B.n, B.d, B.iters, B.eps, B.rb, 0);
}
