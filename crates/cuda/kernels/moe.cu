// MoE routing and the weighted sum of the routed experts' outputs, on the device (no
// host synchronisation inside a step). Routing follows the CPU backend
// (`engine/src/backend/cpu/moe.rs`): scores by sigmoid / softmax / sqrt-softplus,
// choice scores with the correction bias, group-limited top-k (a group scores its two
// best), ties to the lower id, or experts from a token-id hash table; weights are the
// unbiased scores, renormalised (`/ (Σ + 1e-20)`) and scaled.

#include "common.cuh"

#define SCORE_SIGMOID 0
#define SCORE_SOFTMAX 1
#define SCORE_SQRT_SOFTPLUS 2
#define ROUTE_MAX_E 1024
#define ROUTE_MAX_K 32

struct RouteParams {
    const float* logits;  // rows × E
    const float* bias;    // optional, E
    const i32* hash;      // optional, vocab × k
    const StepInfo* step;
    i32* ids;             // rows × k
    float* weights;       // rows × k
    i32 rows, n_expert, k, scoring, n_group, topk_group, norm, rb, vocab;
    float scale;
};

// Argmax of v[0..n) (ties: lower index) by one warp; every lane gets it.
__device__ int warp_argmax(const float* v, int n) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x & 31; i < n; i += 32)
        if (v[i] > best || (v[i] == best && i < bi)) { best = v[i]; bi = i; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    return bi;
}

// Token t's experts and weights, by one block (logits read from L2: in the fused
// router they were written by other blocks of the same launch).
__device__ void route_row(const RouteParams& P, int t) {
    __shared__ float score[ROUTE_MAX_E], choice[ROUTE_MAX_E];
    __shared__ float redv[32];
    __shared__ int chosen[ROUTE_MAX_K];
    __shared__ double dred[32];
    const int E = P.n_expert, k = P.k;
    const float* l = P.logits + (i64)t * E;
    if (P.scoring == SCORE_SOFTMAX) {
        float m = -INFINITY;
        for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, __ldcg(l + e));
        m = block_max_f(m, redv);
        double s = 0.0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            const float x = expf(__fsub_rn(__ldcg(l + e), m));
            score[e] = x;
            s += (double)x;
        }
        s = block_sum_d(s, dred);
        const float inv = (float)(1.0 / s);
        for (int e = threadIdx.x; e < E; e += blockDim.x) score[e] = rnd(__fmul_rn(score[e], inv), P.rb);
    } else {
        // Each score function is one tensor operation of the router's dtype.
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            score[e] = P.scoring == SCORE_SIGMOID ? rnd(sigmoidf_ref(__ldcg(l + e)), P.rb)
                                                  : rnd(sqrtf(rnd(softplusf_ref(__ldcg(l + e)), P.rb)), P.rb);
    }
    __syncthreads();
    if (P.hash) {
        if (threadIdx.x < k) {
            const u32 tok = step_tokens(P.step)[t];
            chosen[threadIdx.x] = tok < (u32)P.vocab ? P.hash[(i64)tok * k + threadIdx.x] : 0;
        }
        __syncthreads();
    } else {
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            choice[e] = P.bias ? __fadd_rn(score[e], P.bias[e]) : score[e];
        __syncthreads();
        if (P.n_group > 1) {
            // Groups scored by their two best choice scores; keep topk_group of them.
            __shared__ float gscore[64];
            __shared__ int keep[64];
            const int per = E / P.n_group;
            if (threadIdx.x < P.n_group) {
                const float* c = choice + threadIdx.x * per;
                float a = -INFINITY, b = -INFINITY;
                for (int i = 0; i < per; ++i) {
                    if (c[i] > a) { b = a; a = c[i]; } else if (c[i] > b) { b = c[i]; }
                }
                gscore[threadIdx.x] = __fadd_rn(a, b);
                keep[threadIdx.x] = 0;
            }
            __syncthreads();
            if (threadIdx.x == 0)
                for (int r = 0; r < P.topk_group; ++r) {
                    int bi = -1;
                    for (int g = 0; g < P.n_group; ++g)
                        if (!keep[g] && (bi < 0 || gscore[g] > gscore[bi])) bi = g;
                    keep[bi] = 1;
                }
            __syncthreads();
            for (int e = threadIdx.x; e < E; e += blockDim.x)
                if (!keep[e / per]) choice[e] = -INFINITY;
            __syncthreads();
        }
        // The k best by warp 0 alone (no block barriers between the rounds).
        if (threadIdx.x < 32)
            for (int r = 0; r < k; ++r) {
                const int bi = warp_argmax(choice, E);
                if (threadIdx.x == 0) {
                    chosen[r] = bi;
                    choice[bi] = -INFINITY;
                }
                __syncwarp();
            }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float w[ROUTE_MAX_K];
        float sum = 0.f;
        for (int r = 0; r < k; ++r) {
            w[r] = score[chosen[r]];
            sum = __fadd_rn(sum, w[r]);
        }
        // w / (w.sum() + 1e-20): the sum accumulated in f32, each step a tensor of the
        // router's dtype.
        sum = rnd(__fadd_rn(rnd(sum, P.rb), 1e-20f), P.rb);
        for (int r = 0; r < k; ++r) {
            const float v = P.norm ? rnd(__fdiv_rn(w[r], sum), P.rb) : w[r];
            P.ids[(i64)t * k + r] = chosen[r];
            P.weights[(i64)t * k + r] = rnd(__fmul_rn(v, P.scale), P.rb);
        }
    }
}

// One block per token.
extern "C" __global__ void moe_route(const RouteParams P) {
    pdl_wait();
    pdl_trigger();
    route_row(P, blockIdx.x);
}

// The router's logits (a float product, `float_row`'s groups) and, in the last block to
// finish, the routing of the one token (decode): one launch for both. `float_row` waits
// for the previous kernel; with `beside` (the lowering's `router_beside`: the previous
// kernel is a GEMV that touches none of this launch's buffers and lets it start once
// its own wait has passed, when everything before it has finished) the products run
// beside that GEMV and each block waits for it only before its sums are counted.
extern "C" __global__ void __launch_bounds__(FG_THREADS) router_route(const FloatSeg S, const RouteParams P,
                                                                      u32* counter, int beside) {
    __shared__ bool last;
    const int r = float_row_index(blockIdx.x, S.lanes);
    if (beside) pdl_trigger();
    const int bytes = S.ty == T_F32 ? 4 : 2;
    float_row(S.w + (i64)r * S.n_in * bytes, S.ty, S.x, S.n_in, S.n_in, 1, S.out, S.n_out, S.bias, r, S.rb, S.lanes,
              r < S.n_out, !beside);
    if (beside) pdl_wait();
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *counter = 0u;
    route_row(P, 0);
}

// out[t, d] = round(Σ_j wround(w[t, j]·y[t, j, d])) over the token's k experts in
// increasing expert id (the order the CPU backend sums them), one thread per (t, d);
// `wrb` rounds each weighted output (bf16 routing weights).
extern "C" __global__ void moe_reduce(const float* y, const i32* ids, const float* w, float* out, i32 rows, i32 k,
                                      i32 d, i32 rb, i32 wrb) {
    pdl_wait();
    pdl_trigger();
    const i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i >= (i64)rows * d) return;
    const int t = (int)(i / d), c = (int)(i - (i64)t * d);
    out[i] = rnd(sum_slots(y + (i64)t * k * d, d, ids + (i64)t * k, w + (i64)t * k, k, c, wrb), rb);
}
