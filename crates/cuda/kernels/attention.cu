// Causal grouped-query attention over the f16 KV cache.
//
// Decode (one query row): split-K ("flash decoding"). `attn_decode_split` runs one
// block per (KV head, split); the split covers a contiguous range of positions whose
// length is derived on the device from the step's position, so the grid is fixed and
// a captured graph stays valid as the cache grows. Each block keeps a running max,
// sum and weighted V per query head of its group; `attn_decode_reduce` merges the
// splits; `attn_decode_fused` (opt-in, measured slower) does RoPE, the KV store, the
// splits and their merge in one launch (the last block of each KV head merges).
// Prefill (many query rows): `attn_prefill`, a flash-attention kernel on the tensor
// cores (mma.sync m16n8k16, f16 inputs, f32 accumulation) with the online softmax in
// registers; one warp per 16 query rows, 64 keys per tile.
//
// As in the CPU backend (llama.cpp's f16-cache path), the query is rounded to f16
// before the products with f16 keys and the softmax runs in f32 with scale
// 1/sqrt(head_dim). Unlike it, the attention weights are rounded to f16 (for the
// tensor cores) only in prefill and before normalization.

#include "common.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))


#define DEC_WARPS 4
#define MAX_GROUP 8
#define MAX_SPLITS 64  // lower.rs decode_splits

// Partial results of split s of KV head g: m[h][s], l[h][s], o[h][s][hd] for the group's
// query heads h. `qg` points at the group's query heads (group x HD, already rotated);
// positions p0 .. p1-1 of the cache. Each warp takes every DEC_WARPS-th position, B
// positions per memory round trip (the keys and values of B positions are loaded before
// the first is used; the softmax updates run in the same order for any B).
template <int HD, int B>
__device__ void split_partials(const float* qg, const u16* kc, const u16* vc, float* pm, float* pl, float* po, int g,
                               int s, int S, int p0, int p1, int group, int kv_dim, float scale) {
    constexpr int E = HD / 32;  // elements per lane
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    float qr[MAX_GROUP][E], o[MAX_GROUP][E], m[MAX_GROUP], l[MAX_GROUP];
#pragma unroll
    for (int j = 0; j < MAX_GROUP; ++j) {
        m[j] = NEG_INF;
        l[j] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            o[j][e] = 0.f;
            qr[j][e] = j < group ? round_f16(qg[j * HD + lane * E + e]) : 0.f;
        }
    }
    for (int pb = p0 + warp; pb < p1; pb += DEC_WARPS * B) {
        u16 kh[B][E], vh[B][E];
#pragma unroll
        for (int b = 0; b < B; ++b) {
            const int p = pb + b * DEC_WARPS;
            if (p < p1) {
                const u16* kp = kc + (i64)p * kv_dim + g * HD + lane * E;
                const u16* vp = vc + (i64)p * kv_dim + g * HD + lane * E;
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    kh[b][e] = kp[e];
                    vh[b][e] = vp[e];
                }
            }
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
            if (pb + b * DEC_WARPS >= p1) break;
            float kr[E], vr[E];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                kr[e] = h2f(kh[b][e]);
                vr[e] = h2f(vh[b][e]);
            }
#pragma unroll
            for (int j = 0; j < MAX_GROUP; ++j) {
                if (j < group) {
                    float d = 0.f;
#pragma unroll
                    for (int e = 0; e < E; ++e) d += qr[j][e] * kr[e];
                    const float sc = warp_sum(d) * scale;
                    const float mn = fmaxf(m[j], sc);
                    const float corr = expf(m[j] - mn), pw = expf(sc - mn);
                    l[j] = l[j] * corr + pw;
#pragma unroll
                    for (int e = 0; e < E; ++e) o[j][e] = o[j][e] * corr + pw * vr[e];
                    m[j] = mn;
                }
            }
        }
    }
    // Merge the warps of the block.
    __shared__ float sm[DEC_WARPS][MAX_GROUP], sl[DEC_WARPS][MAX_GROUP];
    __shared__ float so[DEC_WARPS][MAX_GROUP][HD];
#pragma unroll
    for (int j = 0; j < MAX_GROUP; ++j) {
        if (lane == 0) {
            sm[warp][j] = m[j];
            sl[warp][j] = l[j];
        }
#pragma unroll
        for (int e = 0; e < E; ++e) so[warp][j][lane * E + e] = o[j][e];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * HD; idx += blockDim.x) {
        const int j = idx / HD, d = idx % HD;
        float M = NEG_INF;
        for (int w = 0; w < DEC_WARPS; ++w) M = fmaxf(M, sm[w][j]);
        float L = 0.f, O = 0.f;
        if (M != NEG_INF) {
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float c = expf(sm[w][j] - M);
                L += c * sl[w][j];
                O += c * so[w][j][d];
            }
        }
        const int h = g * group + j;
        po[((i64)h * S + s) * HD + d] = O;
        if (d == 0) {
            pm[h * S + s] = M;
            pl[h * S + s] = L;
        }
    }
}

// The positions of split s of S over a cache of len positions.
__device__ __forceinline__ void split_range(int len, int s, int S, int* p0, int* p1) {
    const int chunk = (len + S - 1) / S;
    *p0 = s * chunk;
    *p1 = min(len, *p0 + chunk);
}

#define DECODE_KERNEL(HD)                                                                                     \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32)                                                 \
        attn_decode_split_##HD(const float* q, const u16* kc, const u16* vc, float* pm, float* pl, float* po,   \
                               const StepInfo* step, int group, int kv_dim, float scale) {                       \
        pdl_wait();                                                                                              \
        pdl_trigger();                                                                                           \
        const int g = blockIdx.x, s = blockIdx.y, S = gridDim.y;                                                 \
        int p0, p1;                                                                                              \
        split_range(step->pos0 + step->n_tok, s, S, &p0, &p1);                                                   \
        split_partials<HD, 1>(q + g * group * HD, kc, vc, pm, pl, po, g, s, S, p0, p1, group, kv_dim, scale);    \
    }
DECODE_KERNEL(64)
DECODE_KERNEL(128)

// One block per query head, head_dim threads: merges the S splits into out[h*hd..].
extern "C" __global__ void attn_decode_reduce(const float* pm, const float* pl, const float* po, float* out,
                                             int head_dim, int S) {
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x;
    float M = NEG_INF;
    for (int s = 0; s < S; ++s) M = fmaxf(M, pm[h * S + s]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float L = 0.f, O = 0.f;
        for (int s = 0; s < S; ++s) {
            const float ms = pm[h * S + s];
            if (ms == NEG_INF) continue;
            const float c = expf(ms - M);
            L += c * pl[h * S + s];
            O += c * po[((i64)h * S + s) * head_dim + d];
        }
        out[h * head_dim + d] = O / L;
    }
}

// Decode attention of one token in one launch (grid: KV heads x splits): RoPE of q and
// k, the KV store, the split-K pass and the merge. Every block rotates its group's
// query heads into shared memory; the block whose split holds the new position rotates
// its key head, stores k and v at that position (before reading the cache) and writes
// the rotated key back; each block then counts itself done on its KV head's counter,
// and the last one merges the splits, writes the rotated query heads back (every block
// of the group has read them by then) and resets the counter for the next launch. The
// values equal rope_qk_store + attn_decode_split + attn_decode_reduce's.
template <int HD>
__device__ void decode_fused(float* q, float* k, const float* v, u16* kc, u16* vc, float* pm, float* pl, float* po,
                             float* out, u32* cnt, const StepInfo* step, int group, int kv_dim, float scale,
                             int n_dims, int neox, float theta_scale) {
    __shared__ float sq[MAX_GROUP * HD];
    __shared__ float sk[HD];
    __shared__ int last;
    const int g = blockIdx.x, s = blockIdx.y, S = gridDim.y, tid = threadIdx.x;
    const int pos = step->pos0, len = pos + 1;
    const int half = n_dims / 2;
    const float fpos = (float)pos;
    int p0, p1;
    split_range(len, s, S, &p0, &p1);
    float* qg = q + g * group * HD;
    for (int i = tid; i < group * HD; i += blockDim.x) sq[i] = qg[i];
    const bool holds_new = p0 <= pos && pos < p1;
    if (holds_new)
        for (int i = tid; i < HD; i += blockDim.x) sk[i] = k[g * HD + i];
    __syncthreads();
    for (int p = tid; p < group * half; p += blockDim.x) rotate(sq + (p / half) * HD, p % half, half, neox, fpos, theta_scale);
    if (holds_new)
        for (int p = tid; p < half; p += blockDim.x) rotate(sk, p, half, neox, fpos, theta_scale);
    __syncthreads();
    if (holds_new) {
        const i64 at = (i64)pos * kv_dim + g * HD;
        for (int i = tid; i < HD; i += blockDim.x) {
            kc[at + i] = f2h(sk[i]);
            vc[at + i] = f2h(v[g * HD + i]);
            k[g * HD + i] = sk[i];
        }
        __syncthreads();
    }
    split_partials<HD, 4>(sq, kc, vc, pm, pl, po, g, s, S, p0, p1, group, kv_dim, scale);
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(cnt + g, 1u) == (u32)(S - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (tid == 0) cnt[g] = 0;
    // The merge (attn_decode_reduce's arithmetic) with every load of a phase in flight
    // at once: the splits' maxima and sums, then each head's weights, then the outputs.
    __shared__ float wm[MAX_GROUP * MAX_SPLITS], wl[MAX_GROUP * MAX_SPLITS], wL[MAX_GROUP];
    for (int i = tid; i < group * S; i += blockDim.x) {
        wm[i] = __ldcg(pm + g * group * S + i);
        wl[i] = __ldcg(pl + g * group * S + i);
    }
    __syncthreads();
    if (tid < group) {
        float M = NEG_INF;
        for (int t = 0; t < S; ++t) M = fmaxf(M, wm[tid * S + t]);
        float L = 0.f;
        for (int t = 0; t < S; ++t) {
            const float ms = wm[tid * S + t];
            const float c = ms == NEG_INF ? 0.f : expf(ms - M);
            if (ms != NEG_INF) L += c * wl[tid * S + t];
            wm[tid * S + t] = c;  // now the split's weight (0: empty split)
        }
        wL[tid] = L;
    }
    __syncthreads();
    constexpr int PER = MAX_GROUP * HD / (DEC_WARPS * 32);
    float O[PER];
#pragma unroll
    for (int m = 0; m < PER; ++m) {
        const int idx = tid + m * DEC_WARPS * 32;
        O[m] = 0.f;
        if (idx < group * HD) {
            const int j = idx / HD, d = idx % HD, h = g * group + j;
            for (int t = 0; t < S; ++t) {
                const float c = wm[j * S + t];
                if (c != 0.f) O[m] += c * __ldcg(po + ((i64)h * S + t) * HD + d);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < PER; ++m) {
        const int idx = tid + m * DEC_WARPS * 32;
        if (idx < group * HD) {
            const int j = idx / HD, d = idx % HD, h = g * group + j;
            out[h * HD + d] = O[m] / wL[j];
            qg[idx] = sq[idx];
        }
    }
}

#define FUSED_KERNEL(HD)                                                                                        \
    extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_decode_fused_##HD(                         \
        float* q, float* k, const float* v, u16* kc, u16* vc, float* pm, float* pl, float* po, float* out,       \
        u32* cnt, const StepInfo* step, int group, int kv_dim, float scale, int n_dims, int neox,                \
        float theta_scale) {                                                                                     \
        pdl_wait();                                                                                              \
        pdl_trigger();                                                                                           \
        decode_fused<HD>(q, k, v, kc, vc, pm, pl, po, out, cnt, step, group, kv_dim, scale, n_dims, neox,        \
                         theta_scale);                                                                           \
    }
FUSED_KERNEL(64)
FUSED_KERNEL(128)

// ---- prefill: flash attention on mma.sync

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack_h2(float lo, float hi) { return (u32)f2h(lo) | ((u32)f2h(hi) << 16); }

#define FA_ROWS 64
#define FA_KEYS 64

// Query rows t (positions pos0 + t) of head h attend to keys 0 ..= pos0 + t.
// q: n_tok x n_head*HD (f32), caches: n_ctx x kv_dim (f16), out like q.
template <int HD>
__device__ void prefill_flash(const float* q, const u16* kc, const u16* vc, float* out, const StepInfo* step,
                              int n_head, int group, int kv_dim, float scale) {
    __shared__ __align__(16) u16 Ks[FA_KEYS][HD + 8];
    __shared__ __align__(16) u16 Vt[HD][FA_KEYS + 8];
    const int n_tok = step->n_tok, pos0 = step->pos0;
    const int qt0 = blockIdx.x * FA_ROWS;
    if (qt0 >= n_tok) return;
    const int h = blockIdx.y, g = h / group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    const int q_dim = n_head * HD;
    const int r0 = qt0 + warp * 16 + gid, r1 = r0 + 8;  // query rows of this thread

    u32 qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        const int c = 16 * kk + 2 * tig;
        const float* q0 = q + (i64)r0 * q_dim + h * HD;
        const float* q1 = q + (i64)r1 * q_dim + h * HD;
        const bool v0 = r0 < n_tok, v1 = r1 < n_tok;
        qa[kk][0] = v0 ? pack_h2(q0[c], q0[c + 1]) : 0u;
        qa[kk][1] = v1 ? pack_h2(q1[c], q1[c + 1]) : 0u;
        qa[kk][2] = v0 ? pack_h2(q0[c + 8], q0[c + 9]) : 0u;
        qa[kk][3] = v1 ? pack_h2(q1[c + 8], q1[c + 9]) : 0u;
    }
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
    const int qp0 = pos0 + r0, qp1 = pos0 + r1;
    const int kv_len = pos0 + n_tok;
    const int last_key = min(kv_len - 1, pos0 + qt0 + FA_ROWS - 1);
    const int n_tiles = last_key / FA_KEYS + 1;

    for (int kt = 0; kt < n_tiles; ++kt) {
        __syncthreads();
        for (int c = tid; c < FA_KEYS * HD / 8; c += blockDim.x) {
            const int row = c / (HD / 8), c8 = (c % (HD / 8)) * 8;
            const int key = kt * FA_KEYS + row;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (key < kv_len) {
                kv = *(const uint4*)(kc + (i64)key * kv_dim + g * HD + c8);
                vv = *(const uint4*)(vc + (i64)key * kv_dim + g * HD + c8);
            }
            *(uint4*)&Ks[row][c8] = kv;
            const u32 w[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int e = 0; e < 8; ++e) Vt[c8 + e][row] = (u16)(w[e >> 1] >> (16 * (e & 1)));
        }
        __syncthreads();

        float s[FA_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk) {
                const u32 b0 = *(const u32*)&Ks[8 * j + gid][16 * kk + 2 * tig];
                const u32 b1 = *(const u32*)&Ks[8 * j + gid][16 * kk + 2 * tig + 8];
                mma16816(s[j], qa[kk], b0, b1);
            }
        }
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = kt * FA_KEYS + 8 * j + 2 * tig + (e & 1);
                const int qp = e < 2 ? qp0 : qp1;
                const float v = (key > qp || key >= kv_len) ? NEG_INF : s[j][e] * scale;
                s[j][e] = v;
                if (e < 2) mx0 = fmaxf(mx0, v); else mx1 = fmaxf(mx1, v);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float c0 = mx0 == NEG_INF ? 1.f : expf(m0 - mx0);
        const float c1 = mx1 == NEG_INF ? 1.f : expf(m1 - mx1);
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int j = 0; j < FA_KEYS / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float mref = e < 2 ? mx0 : mx1;
                const float p = s[j][e] == NEG_INF ? 0.f : expf(s[j][e] - mref);
                s[j][e] = p;
                if (e < 2) sum0 += p; else sum1 += p;
            }
        }
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
        sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
        sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
        m0 = mx0;
        m1 = mx1;
#pragma unroll
        for (int j = 0; j < HD / 8; ++j) {
            o[j][0] *= c0; o[j][1] *= c0;
            o[j][2] *= c1; o[j][3] *= c1;
        }
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            u32 a[4];
            a[0] = pack_h2(s[2 * kk][0], s[2 * kk][1]);
            a[1] = pack_h2(s[2 * kk][2], s[2 * kk][3]);
            a[2] = pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int jd = 0; jd < HD / 8; ++jd) {
                const u32 b0 = *(const u32*)&Vt[8 * jd + gid][16 * kk + 2 * tig];
                const u32 b1 = *(const u32*)&Vt[8 * jd + gid][16 * kk + 2 * tig + 8];
                mma16816(o[jd], a, b0, b1);
            }
        }
    }
    const float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
    for (int jd = 0; jd < HD / 8; ++jd) {
        const int c = h * HD + 8 * jd + 2 * tig;
        if (r0 < n_tok) {
            out[(i64)r0 * q_dim + c] = o[jd][0] * i0;
            out[(i64)r0 * q_dim + c + 1] = o[jd][1] * i0;
        }
        if (r1 < n_tok) {
            out[(i64)r1 * q_dim + c] = o[jd][2] * i1;
            out[(i64)r1 * q_dim + c + 1] = o[jd][3] * i1;
        }
    }
}

#define PREFILL_KERNEL(HD)                                                                                    \
    extern "C" __global__ void __launch_bounds__(128)                                                            \
        attn_prefill_##HD(const float* q, const u16* kc, const u16* vc, float* out, const StepInfo* step,        \
                          int n_head, int group, int kv_dim, float scale) {                                       \
        pdl_wait();                                                                                              \
        pdl_trigger();                                                                                           \
        prefill_flash<HD>(q, kc, vc, out, step, n_head, group, kv_dim, scale);                                   \
    }
PREFILL_KERNEL(64)
PREFILL_KERNEL(128)
