// Routed experts of a multi-token step on tensor cores: the (token, expert) pairs are
// grouped by expert on the device (`moe_sort`), then each block multiplies one tile of
// up to MM_TM pairs of one expert by mm_tn rows of that expert's matrix
// (`moe_mma_gate_up`: gate and up with the SwiGLU epilogue; `moe_mma_down`). Weights are
// dequantized chunk by chunk (ggml's arithmetic, `dequant_chunk`) to bf16 in shared
// memory, activations arrive in bf16 (the tokens rounded once by `f32_to_bf16`, gate_up's
// output written in bf16), products accumulated in f32 by `mma.sync.m16n8k16`. Each
// block reads its pairs' whole rows of activations, so their bytes, not the weights',
// are most of the traffic. Each output element's accumulation order is fixed by the K loop,
// so the result does not depend on which other pairs share its tile.

#include "common.cuh"

#define MM_TM 64   // pairs per tile
// Matrix rows per tile and threads per block: gate_up 64 rows of each matrix on 128
// threads, down 128 rows on 256 (more rows per tile: fewer blocks read each pair's
// activations).
template <bool PAIR>
constexpr int mm_tn = PAIR ? 64 : 128;
template <bool PAIR>
constexpr int mm_threads = PAIR ? 128 : 256;
#define MM_KC 32   // K per step (one dequantized chunk)
#define MM_LD (MM_KC + 8)  // shared row stride in bf16 (pads banks)
#define MM_MAX_E 1024

// The pairs grouped by expert: `offs[e] .. offs[e+1]` index `perm` (pair ids of expert
// e), `tiles[e]` the first tile of expert e (tiles[E] tiles in all).
struct MoeSorted {
    i32* offs;   // E + 1
    i32* tiles;  // E + 1
    i32* perm;   // pairs
};

// One block: counts per expert, prefix sums, then each pair placed at its expert's
// cursor (the order inside a group is arbitrary; see the header).
extern "C" __global__ void moe_sort(const i32* ids, i32 pairs, i32 n_expert, MoeSorted S) {
    __shared__ int cnt[MM_MAX_E], cur[MM_MAX_E];
    pdl_wait();
    pdl_trigger();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, t = 0;
        for (int e = 0; e < n_expert; ++e) {
            S.offs[e] = o;
            S.tiles[e] = t;
            cur[e] = o;
            o += cnt[e];
            t += (cnt[e] + MM_TM - 1) / MM_TM;
        }
        S.offs[n_expert] = o;
        S.tiles[n_expert] = t;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert) S.perm[atomicAdd(&cur[e], 1)] = p;
    }
}

struct MoeMma {
    Planes w, w2;  // gate and up (gate_up) or down
    i64 estride[MAX_PLANES], estride2[MAX_PLANES];
    i32 type, type2;
    const u16* x;  // bf16. gate_up: tokens × n_in; down: sorted pairs × n_in (gate_up's output)
    MoeSorted S;
    void* out;     // gate_up: sorted pairs × rows, bf16 (the down product's input); down:
                   // pairs × rows (by pair id), f32
    i32 k, n_expert, n_in, rows, rb;
    float lim;     // SwiGLU clamp (INFINITY: none)
};

__device__ __forceinline__ u32 pack_bf16(float a, float b) {
    return (u32)f2bf(a) | ((u32)f2bf(b) << 16);
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Row n0 + i of `w` (expert planes), K chunk `kc`, to bf16 in row i of `dst` (zeros past
// the matrix).
__device__ __forceinline__ void load_w(int ty, const Planes& w, int n0, int rows, int n_in, int kc, int i,
                                       u16* dst) {
    float y[32];
    const int n = n0 + i;
    if (n < rows) {
        const int be = block_elems(ty);
        const int e0 = kc * MM_KC;
        dequant_chunk(ty, w, (i64)n * (n_in / be) + e0 / be, (e0 % be) / 32, y);
    } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = 0.f;
    }
    u32* d = (u32*)(dst + i * MM_LD);
#pragma unroll
    for (int j = 0; j < 16; ++j) d[j] = pack_bf16(y[2 * j], y[2 * j + 1]);
}

// The q2 mix's expert types (ggml's arithmetic, `dequant_chunk`'s, bit for bit) in
// registers from vector loads, in two parts so that a step's loads can be issued a step
// ahead of their use: `fetch16` loads what values [16·half, 16·half + 16) of chunk c
// (elements 32c .. 32c+31) of block blk need, `decode16` turns it into the 16 floats.
// `dequant_chunk` (any type) returns its 32 values through memory and reads Q2_K's quants
// a byte at a time.
template <int TY>
struct Raw16;
template <>
struct Raw16<T_Q2_K> {
    u32 dd, sc;  // the block's d and dmin (two halves), the sub-block's scale byte
    uint4 q;     // 16 bytes of 2-bit quants
};
template <>
struct Raw16<T_IQ2_XXS> {
    u32 d;    // the block's scale (f16)
    uint2 a;  // the chunk's grid indices and signs
};

template <int TY>
__device__ __forceinline__ Raw16<TY> fetch16(const Planes& w, i64 blk, int c, int half) {
    Raw16<TY> r;
    if constexpr (TY == T_Q2_K) {
        const int n = c >> 2, j = c & 3;
        r.dd = ld_u32(w.p[2] + blk * 4);
        r.sc = w.p[0][blk * 16 + 8 * n + 2 * j + half];
        r.q = *(const uint4*)(w.p[1] + blk * 64 + 32 * n + 16 * half);
    } else {
        static_assert(TY == T_IQ2_XXS, "typed tensor-core experts: Q2_K or IQ2_XXS");
        r.d = ld_u16(w.p[0] + blk * 2);
        r.a = *(const uint2*)(w.p[1] + blk * 64 + c * 8);
    }
    return r;
}

template <int TY>
__device__ __forceinline__ void decode16(const Raw16<TY>& r, int c, int half, float* y) {
    if constexpr (TY == T_Q2_K) {
        const int j = c & 3;
        const float d = h2f((u16)(r.dd & 0xFFFFu)), dmin = h2f((u16)(r.dd >> 16));
        const u32 qw[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const float dl = __fmul_rn(d, (float)(r.sc & 0xF)), ml = __fmul_rn(dmin, (float)(r.sc >> 4));
#pragma unroll
        for (int l = 0; l < 16; ++l)
            y[l] = __fsub_rn(__fmul_rn(dl, (float)((qw[l >> 2] >> (8 * (l & 3) + 2 * j)) & 3)), ml);
    } else {
        const float d = h2f((u16)r.d);
        const float db = __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)(r.a.y >> 28))), 0.25f);
#pragma unroll
        for (int l2 = 0; l2 < 2; ++l2) {
            const int l = 2 * half + l2;
            const u64 grid = IQ2XXS_GRID[(r.a.x >> (8 * l)) & 0xFF];
            const u32 signs = iq2_signs((r.a.y >> (7 * l)) & 127);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float g = (float)((grid >> (8 * j)) & 0xFF);
                const float sg = (signs >> j) & 1 ? -1.f : 1.f;
                y[8 * l2 + j] = __fmul_rn(__fmul_rn(db, g), sg);
            }
        }
    }
}

// Activations per thread per K step (16 or 8), as 16-byte loads.
template <bool PAIR>
constexpr int mm_xv = MM_TM * MM_KC / mm_threads<PAIR>;

// What one thread stages for one K step: mm_xv activations (zeros past the pairs) and,
// for a typed kernel, the raw weights of its half rows (PAIR: both halves of one gate or
// up row; else one half of a down row). A generic kernel (TY < 0) leaves `w` unused: it
// dequantizes from global memory when it stores the step.
template <bool PAIR, int TY>
struct Stage {
    uint4 x[mm_xv<PAIR> / 8];
    Raw16<TY < 0 ? T_IQ2_XXS : TY> w[PAIR ? 2 : 1];
};

// Thread `tid`'s weight row for a typed kernel: PAIR: gate row tid (< mm_tn) or up row
// tid − mm_tn, both halves; else row tid / 2, half tid % 2.
template <bool PAIR>
__device__ __forceinline__ int stage_row(int tid) {
    return PAIR ? tid % mm_tn<PAIR> : tid >> 1;
}

// Thread `tid`'s activation row (its first value is (tid % per row)·mm_xv).
template <bool PAIR>
__device__ __forceinline__ int stage_xrow(int tid) {
    return tid / (MM_KC / mm_xv<PAIR>);
}

// Issues step kc's loads into registers.
template <bool PAIR, int TY>
__device__ __forceinline__ void stage_fetch(Stage<PAIR, TY>& st, const MoeMma& P, const Planes& wp, int src, int n0,
                                            int kc, int tid) {
    constexpr int XV = mm_xv<PAIR>;
    if (src >= 0) {
        const uint4* x8 = (const uint4*)(P.x + (i64)src * P.n_in + kc * MM_KC + tid % (MM_KC / XV) * XV);
#pragma unroll
        for (int j = 0; j < XV / 8; ++j) st.x[j] = x8[j];
    }
    if constexpr (TY >= 0) {
        const int n = n0 + stage_row<PAIR>(tid);
        if (n < P.rows) {
            const int e0 = kc * MM_KC;
            const i64 blk = (i64)n * (P.n_in / 256) + e0 / 256;
#pragma unroll
            for (int q = 0; q < (PAIR ? 2 : 1); ++q)
                st.w[q] = fetch16<TY>(wp, blk, (e0 % 256) / 32, PAIR ? q : tid & 1);
        }
    }
}

// Writes step kc's staged values to shared memory as bf16 (a generic kernel dequantizes
// its rows here, from global memory).
template <bool PAIR, int TY>
__device__ __forceinline__ void stage_store(const Stage<PAIR, TY>& st, const MoeMma& P, const Planes& w0,
                                            const Planes& w1, int src, int n0, int kc, int tid, u16* As, u16* Bs) {
    constexpr int XV = mm_xv<PAIR>, TN = mm_tn<PAIR>;
    {
        u32* d = (u32*)(As + stage_xrow<PAIR>(tid) * MM_LD + tid % (MM_KC / XV) * XV);
#pragma unroll
        for (int j = 0; j < XV / 8; ++j) {
            d[4 * j] = src >= 0 ? st.x[j].x : 0u;
            d[4 * j + 1] = src >= 0 ? st.x[j].y : 0u;
            d[4 * j + 2] = src >= 0 ? st.x[j].z : 0u;
            d[4 * j + 3] = src >= 0 ? st.x[j].w : 0u;
        }
    }
    if constexpr (TY < 0) {
        if (tid < TN) load_w(P.type, w0, n0, P.rows, P.n_in, kc, tid, Bs);
        else if (PAIR) load_w(P.type2, w1, n0, P.rows, P.n_in, kc, tid - TN, Bs + TN * MM_LD);
    } else {
        const int i = stage_row<PAIR>(tid);
        const bool ok = n0 + i < P.rows;
        u16* dst = (PAIR && tid >= TN ? Bs + TN * MM_LD : Bs) + i * MM_LD;
#pragma unroll
        for (int q = 0; q < (PAIR ? 2 : 1); ++q) {
            const int half = PAIR ? q : tid & 1;
            float y[16];
            if (ok)
                decode16<TY>(st.w[q], (kc * MM_KC % 256) / 32, half, y);
            else
#pragma unroll
                for (int j = 0; j < 16; ++j) y[j] = 0.f;
            u32* d = (u32*)(dst + 16 * half);
#pragma unroll
            for (int j = 0; j < 8; ++j) d[j] = pack_bf16(y[2 * j], y[2 * j + 1]);
        }
    }
}

// TY: the weights' ggml type for a typed kernel (`fetch16`), −1 for any (P.type). Two
// shared-memory stages: while the warps multiply step kc, each thread's loads of step
// kc + 1 are in flight, then it converts them into the other stage (one barrier a step).
template <bool PAIR, int TY>
__device__ __forceinline__ void mma_body(const MoeMma& P) {
    __shared__ __align__(16) u16 As[2][MM_TM * MM_LD];
    constexpr int TN = mm_tn<PAIR>, NW = TN / 32;  // warps along the rows
    __shared__ __align__(16) u16 Bs[2][(PAIR ? 2 : 1) * TN * MM_LD];
    __shared__ int rowsrc[MM_TM];
    pdl_wait();
    pdl_trigger();
    const int tile = blockIdx.y;
    if (tile >= P.S.tiles[P.n_expert]) return;
    int lo = 0, hi = P.n_expert;  // the last e with tiles[e] <= tile
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (P.S.tiles[mid] <= tile) lo = mid; else hi = mid;
    }
    const int e = lo;
    const int r0 = P.S.offs[e] + (tile - P.S.tiles[e]) * MM_TM;
    const int nrows = min(MM_TM, P.S.offs[e + 1] - r0);
    const int n0 = blockIdx.x * TN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < MM_TM) {
        const int r = r0 + tid;
        // gate_up reads the pair's token row; down the sorted pair's own row.
        rowsrc[tid] = tid < nrows ? (PAIR ? P.S.perm[r] / P.k : r) : -1;
    }
    const Planes w0 = expert_planes(P.w, P.estride, e);
    const Planes w1 = PAIR ? expert_planes(P.w2, P.estride2, e) : w0;
    // A typed kernel's thread reads one matrix: gate (tid < TN) or up.
    Planes wp;
#pragma unroll
    for (int q = 0; q < MAX_PLANES; ++q) wp.p[q] = PAIR && tid >= TN ? w1.p[q] : w0.p[q];
    const int g = lane >> 2, t4 = lane & 3;
    const int wm = (warp / NW) * 32, wn = (warp % NW) * 32;
    float acc[PAIR ? 2 : 1][2][4][4];
#pragma unroll
    for (int s = 0; s < (PAIR ? 2 : 1); ++s)
#pragma unroll
        for (int a = 0; a < 2; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[s][a][b][c] = 0.f;
    __syncthreads();
    const int src = rowsrc[stage_xrow<PAIR>(tid)];
    const int n_kc = P.n_in / MM_KC;
    Stage<PAIR, TY> st;
    stage_fetch(st, P, wp, src, n0, 0, tid);
    stage_store(st, P, w0, w1, src, n0, 0, tid, As[0], Bs[0]);
    __syncthreads();
    for (int kc = 0; kc < n_kc; ++kc) {
        const int cur = kc & 1;
        if (kc + 1 < n_kc) stage_fetch(st, P, wp, src, n0, kc + 1, tid);
#pragma unroll
        for (int ks = 0; ks < MM_KC; ks += 16) {
            u32 af[2][4];
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                const u16* base = As[cur] + (wm + a * 16 + g) * MM_LD + ks + 2 * t4;
                af[a][0] = *(const u32*)base;
                af[a][1] = *(const u32*)(base + 8 * MM_LD);
                af[a][2] = *(const u32*)(base + 8);
                af[a][3] = *(const u32*)(base + 8 * MM_LD + 8);
            }
#pragma unroll
            for (int s = 0; s < (PAIR ? 2 : 1); ++s)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const u16* base = Bs[cur] + s * TN * MM_LD + (wn + b * 8 + g) * MM_LD + ks + 2 * t4;
                    const u32 bf[2] = {*(const u32*)base, *(const u32*)(base + 8)};
#pragma unroll
                    for (int a = 0; a < 2; ++a) mma_bf16(acc[s][a][b], af[a], bf);
                }
        }
        if (kc + 1 < n_kc) stage_store(st, P, w0, w1, src, n0, kc + 1, tid, As[cur ^ 1], Bs[cur ^ 1]);
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int m = wm + a * 16 + g + (c >> 1) * 8;
                const int n = n0 + wn + b * 8 + 2 * t4 + (c & 1);
                if (m >= nrows || n >= P.rows) continue;
                if (PAIR) {
                    const float gv = fminf(rnd(acc[0][a][b][c], P.rb), P.lim);
                    const float uv = fmaxf(fminf(rnd(acc[PAIR ? 1 : 0][a][b][c], P.rb), P.lim), -P.lim);
                    const float o = rnd(__fmul_rn(rnd(siluf_ref(gv), P.rb), uv), P.rb);
                    ((u16*)P.out)[(i64)(r0 + m) * P.rows + n] = f2bf(o);
                } else {
                    ((float*)P.out)[(i64)P.S.perm[r0 + m] * P.rows + n] = rnd(acc[0][a][b][c], P.rb);
                }
            }
}

extern "C" __global__ void __launch_bounds__(128) moe_mma_gate_up(const MoeMma P) { mma_body<true, -1>(P); }

extern "C" __global__ void __launch_bounds__(256) moe_mma_down(const MoeMma P) { mma_body<false, -1>(P); }

// The q2 mix (routed gate/up IQ2_XXS, down Q2_K) and its neighbours.
extern "C" __global__ void __launch_bounds__(128) moe_mma_gate_up_iq2_xxs(const MoeMma P) {
    mma_body<true, T_IQ2_XXS>(P);
}
extern "C" __global__ void __launch_bounds__(256) moe_mma_down_iq2_xxs(const MoeMma P) {
    mma_body<false, T_IQ2_XXS>(P);
}
extern "C" __global__ void __launch_bounds__(128) moe_mma_gate_up_q2_k(const MoeMma P) {
    mma_body<true, T_Q2_K>(P);
}
extern "C" __global__ void __launch_bounds__(256) moe_mma_down_q2_k(const MoeMma P) { mma_body<false, T_Q2_K>(P); }
