// Routed experts of a multi-token step on tensor cores: the (token, expert) pairs are
// grouped by expert on the device (`moe_sort`), then each block multiplies one tile of
// up to MM_TM pairs of one expert by MM_TN rows of that expert's matrix
// (`moe_mma_gate_up`: gate and up with the SwiGLU epilogue; `moe_mma_down`). Weights are
// dequantized chunk by chunk (ggml's arithmetic, `dequant_chunk`) to bf16 in shared
// memory, activations rounded to bf16, products accumulated in f32 by
// `mma.sync.m16n8k16`. Each output element's accumulation order is fixed by the K loop,
// so the result does not depend on which other pairs share its tile.

#include "common.cuh"

#define MM_TM 64   // pairs per tile
#define MM_TN 64   // matrix rows per tile
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
    const float* x;  // gate_up: tokens × n_in; down: sorted pairs × n_in (gate_up's output)
    MoeSorted S;
    float* out;      // gate_up: sorted pairs × rows; down: pairs × rows (by pair id)
    i32 k, n_expert, n_in, rows, rb;
    float lim;       // SwiGLU clamp (INFINITY: none)
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

// Rows [n0, n0 + MM_TN) of `w` (expert planes), K chunk `kc`, to bf16 in `dst`: thread
// `i` (< MM_TN) dequantizes row n0 + i (zeros past the matrix).
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
// registers from vector loads: values [16·half, 16·half + 16) of chunk c (elements
// 32c .. 32c+31) of block blk. `dequant_chunk` (any type) returns its 32 values through
// memory and reads Q2_K's quants a byte at a time.
template <int TY>
__device__ __forceinline__ void dequant16(const Planes& w, i64 blk, int c, int half, float* y) {
    if constexpr (TY == T_Q2_K) {
        const int n = c >> 2, j = c & 3;
        const u32 dd = ld_u32(w.p[2] + blk * 4);
        const float d = h2f((u16)(dd & 0xFFFFu)), dmin = h2f((u16)(dd >> 16));
        const u32 sc = w.p[0][blk * 16 + 8 * n + 2 * j + half];
        const uint4 qv = *(const uint4*)(w.p[1] + blk * 64 + 32 * n + 16 * half);
        const u32 qw[4] = {qv.x, qv.y, qv.z, qv.w};
        const float dl = __fmul_rn(d, (float)(sc & 0xF)), ml = __fmul_rn(dmin, (float)(sc >> 4));
#pragma unroll
        for (int l = 0; l < 16; ++l)
            y[l] = __fsub_rn(__fmul_rn(dl, (float)((qw[l >> 2] >> (8 * (l & 3) + 2 * j)) & 3)), ml);
    } else {
        static_assert(TY == T_IQ2_XXS, "typed tensor-core experts: Q2_K or IQ2_XXS");
        const float d = h2f(ld_u16(w.p[0] + blk * 2));
        const uint2 a = *(const uint2*)(w.p[1] + blk * 64 + c * 8);
        const float db = __fmul_rn(__fmul_rn(d, __fadd_rn(0.5f, (float)(a.y >> 28))), 0.25f);
#pragma unroll
        for (int l2 = 0; l2 < 2; ++l2) {
            const int l = 2 * half + l2;
            const u64 grid = IQ2XXS_GRID[(a.x >> (8 * l)) & 0xFF];
            const u32 signs = iq2_signs((a.y >> (7 * l)) & 127);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float g = (float)((grid >> (8 * j)) & 0xFF);
                const float sg = (signs >> j) & 1 ? -1.f : 1.f;
                y[8 * l2 + j] = __fmul_rn(__fmul_rn(db, g), sg);
            }
        }
    }
}

// `load_w`'s half row for a typed kernel: values [16·half, 16·half + 16) of row n0 + i's
// K chunk `kc` (both types have 256-value blocks).
template <int TY>
__device__ __forceinline__ void load_w16(const Planes& w, int n0, int rows, int n_in, int kc, int i, int half,
                                         u16* dst) {
    float y[16];
    const int n = n0 + i;
    if (n < rows) {
        const int e0 = kc * MM_KC;
        dequant16<TY>(w, (i64)n * (n_in / 256) + e0 / 256, (e0 % 256) / 32, half, y);
    } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) y[j] = 0.f;
    }
    u32* d = (u32*)(dst + i * MM_LD + 16 * half);
#pragma unroll
    for (int j = 0; j < 8; ++j) d[j] = pack_bf16(y[2 * j], y[2 * j + 1]);
}

// TY: the weights' ggml type for a typed kernel (`dequant16`), −1 for any (P.type).
template <bool PAIR, int TY>
__device__ __forceinline__ void mma_body(const MoeMma& P) {
    __shared__ __align__(16) u16 As[MM_TM * MM_LD];
    __shared__ __align__(16) u16 Bs[(PAIR ? 2 : 1) * MM_TN * MM_LD];
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
    const int n0 = blockIdx.x * MM_TN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < MM_TM) {
        const int r = r0 + tid;
        // gate_up reads the pair's token row; down the sorted pair's own row.
        rowsrc[tid] = tid < nrows ? (PAIR ? P.S.perm[r] / P.k : r) : -1;
    }
    const Planes w0 = expert_planes(P.w, P.estride, e);
    const Planes w1 = PAIR ? expert_planes(P.w2, P.estride2, e) : w0;
    const int g = lane >> 2, t4 = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
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
    const int n_kc = P.n_in / MM_KC;
    for (int kc = 0; kc < n_kc; ++kc) {
        {   // activations: thread → (row tid/2, 16 values)
            const int m = tid >> 1, h = (tid & 1) * 16;
            const int src = rowsrc[m];
            u32* d = (u32*)(As + m * MM_LD + h);
            if (src >= 0) {
                const float4* x4 = (const float4*)(P.x + (i64)src * P.n_in + kc * MM_KC + h);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float4 v = x4[j];
                    d[2 * j] = pack_bf16(v.x, v.y);
                    d[2 * j + 1] = pack_bf16(v.z, v.w);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) d[j] = 0u;
            }
        }
        if constexpr (TY < 0) {
            if (tid < MM_TN) load_w(P.type, w0, n0, P.rows, P.n_in, kc, tid, Bs);
            else if (PAIR) load_w(P.type2, w1, n0, P.rows, P.n_in, kc, tid - MM_TN, Bs + MM_TN * MM_LD);
        } else if constexpr (PAIR) {
            // Thread i < MM_TN: gate row i, else up row i − MM_TN.
            Planes wp;
#pragma unroll
            for (int q = 0; q < MAX_PLANES; ++q) wp.p[q] = tid < MM_TN ? w0.p[q] : w1.p[q];
            u16* dst = tid < MM_TN ? Bs : Bs + MM_TN * MM_LD;
            load_w16<TY>(wp, n0, P.rows, P.n_in, kc, tid % MM_TN, 0, dst);
            load_w16<TY>(wp, n0, P.rows, P.n_in, kc, tid % MM_TN, 1, dst);
        } else {
            // Two threads per row.
            load_w16<TY>(w0, n0, P.rows, P.n_in, kc, tid >> 1, tid & 1, Bs);
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < MM_KC; ks += 16) {
            u32 af[2][4];
#pragma unroll
            for (int a = 0; a < 2; ++a) {
                const u16* base = As + (wm + a * 16 + g) * MM_LD + ks + 2 * t4;
                af[a][0] = *(const u32*)base;
                af[a][1] = *(const u32*)(base + 8 * MM_LD);
                af[a][2] = *(const u32*)(base + 8);
                af[a][3] = *(const u32*)(base + 8 * MM_LD + 8);
            }
#pragma unroll
            for (int s = 0; s < (PAIR ? 2 : 1); ++s)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    const u16* base = Bs + s * MM_TN * MM_LD + (wn + b * 8 + g) * MM_LD + ks + 2 * t4;
                    const u32 bf[2] = {*(const u32*)base, *(const u32*)(base + 8)};
#pragma unroll
                    for (int a = 0; a < 2; ++a) mma_bf16(acc[s][a][b], af[a], bf);
                }
        }
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
                float o;
                i64 row;
                if (PAIR) {
                    const float gv = fminf(rnd(acc[0][a][b][c], P.rb), P.lim);
                    const float uv = fmaxf(fminf(rnd(acc[PAIR ? 1 : 0][a][b][c], P.rb), P.lim), -P.lim);
                    o = rnd(__fmul_rn(rnd(siluf_ref(gv), P.rb), uv), P.rb);
                    row = r0 + m;
                } else {
                    o = rnd(acc[0][a][b][c], P.rb);
                    row = P.S.perm[r0 + m];
                }
                P.out[row * P.rows + n] = o;
            }
}

extern "C" __global__ void __launch_bounds__(128) moe_mma_gate_up(const MoeMma P) { mma_body<true, -1>(P); }

extern "C" __global__ void __launch_bounds__(128) moe_mma_down(const MoeMma P) { mma_body<false, -1>(P); }

// The q2 mix (routed gate/up IQ2_XXS, down Q2_K) and its neighbours.
extern "C" __global__ void __launch_bounds__(128) moe_mma_gate_up_iq2_xxs(const MoeMma P) {
    mma_body<true, T_IQ2_XXS>(P);
}
extern "C" __global__ void __launch_bounds__(128) moe_mma_down_iq2_xxs(const MoeMma P) {
    mma_body<false, T_IQ2_XXS>(P);
}
extern "C" __global__ void __launch_bounds__(128) moe_mma_gate_up_q2_k(const MoeMma P) {
    mma_body<true, T_Q2_K>(P);
}
extern "C" __global__ void __launch_bounds__(128) moe_mma_down_q2_k(const MoeMma P) { mma_body<false, T_Q2_K>(P); }
