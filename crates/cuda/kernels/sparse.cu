// Cached rows, window compression, the DSA indexer's selection and multi-head latent
// attention on the device, in the CPU backend's arithmetic
// (`engine/src/backend/cpu/{dsa,mla}.rs`). Positions come from the step buffer, so a
// captured decode graph stays valid as the sequence grows.

#include "common.cuh"

// Where value i of the step's rows (`row_len` values each, the first at position pos0)
// goes in a ring of `cap` rows: row (pos0 + r) mod cap.
__device__ __forceinline__ i64 ring_at(i64 i, int pos0, int row_len, int cap) {
    const i64 r = i / row_len;
    return ((pos0 + r) % cap) * row_len + (i - r * row_len);
}

// dst[(pos0 + i) mod cap] = src[i] for the step's rows of `row_len` values.
extern "C" __global__ void store_rows(const StoreRows S) {
    pdl_wait();
    pdl_trigger();
    const i64 n = (i64)S.rows * S.row_len;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        S.dst[ring_at(i, S.step->pos0, S.row_len, S.cap)] = S.src[i];
}

struct CompressParams {
    const StepInfo* step;
    const float* src_kv;    // [n_tok, row_len] the step's source rows
    const float* src_gate;  // same
    float* kv;              // [cap, row_len] source rows, slot pos mod cap
    float* gate;            // same
    const float* ape;   // [m, row_len]
    const float* norm;  // optional [c]
    float* entries;     // [·, c]
    const float* inv_freq;  // optional RoPE inverse frequencies [rope_dims/2]
    i32 cap, m, c, overlap, rope_dims, rb;
    float eps, mscale;
    // Optional (null w): the LayerNorm whose output is src_kv, one row (decode), formed by
    // every block from its input (its output also written, by block 0).
    LayerNorm ln;
};

// With `P.ln.w` each block first normalises the step's one key row into shared memory
// (`layer_norm_ref`'s arithmetic) and reads it there instead of `src_kv`.
// The step's source rows go into the rings (`store_rows`, over the whole grid); then one
// block per window that may close in this step (blockIdx.x counts from pos0/m):
// entries[w][d] = round(Σ_slots round(round(softmax(gate + ape)) · kv)), then the
// optional RMS norm (f32 weight, one rounding) and RoPE at position w·m on the trailing
// rope_dims (interleaved pairs). A window reads the step's rows from the source (the
// values the rings get) and older ones from the rings, whose slots this step does not
// write (the rings hold the step and a window's span).
// Two compressors in one launch: blockIdx.y picks P0 or P1.
extern "C" __global__ void compress_windows(const __grid_constant__ CompressParams P0,
                                            const __grid_constant__ CompressParams P1) {
    const CompressParams& P = blockIdx.y ? P1 : P0;
    extern __shared__ float ent[];  // c values (with P.ln.w: then the normalised row)
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    const float* src_kv = P.src_kv;
    if (P.ln.w) {
        float* row = ent + P.c;
        layer_norm_row(P.ln, 0, row, red);
        __syncthreads();
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < P.c; i += blockDim.x) P.ln.out[i] = row[i];
        src_kv = row;
    }
    const int pos0 = P.step->pos0, n = P.step->n_tok;
    const int rl = P.overlap ? 2 * P.c : P.c;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (i64)n * rl; i += (i64)gridDim.x * blockDim.x) {
        const i64 slot = ring_at(i, pos0, rl, P.cap);
        P.kv[slot] = src_kv[i];
        P.gate[slot] = P.src_gate[i];
    }
    // Source value `col` of position pos.
    auto at = [&](const float* ring, const float* src, int pos, int col) {
        return pos >= pos0 ? src[(i64)(pos - pos0) * rl + col] : ring[(i64)(pos % P.cap) * rl + col];
    };
    const int w = pos0 / P.m + blockIdx.x;
    if (w >= (pos0 + n) / P.m) return;
    for (int d = threadIdx.x; d < P.c; d += blockDim.x) {
        // Slots: (position, ape row, column).
        const int n_slots = P.overlap ? (w > 0 ? 2 * P.m : P.m) : P.m;
        float logit[256];
        float mx = -INFINITY;
        for (int s = 0; s < n_slots; ++s) {
            int pos, j, col;
            if (P.overlap && w > 0 && s < P.m) { pos = (w - 1) * P.m + s; j = s; col = d; }
            else { const int ss = (P.overlap && w > 0) ? s - P.m : s; pos = w * P.m + ss; j = ss; col = P.overlap ? P.c + d : d; }
            logit[s & 255] = __fadd_rn(at(P.gate, P.src_gate, pos, col), P.ape[(i64)j * rl + col]);
            mx = fmaxf(mx, logit[s & 255]);
        }
        double z = 0.0;
        for (int s = 0; s < n_slots; ++s) {
            logit[s & 255] = expf(__fsub_rn(logit[s & 255], mx));
            z += (double)logit[s & 255];
        }
        const float inv = (float)(1.0 / z);
        float acc = 0.f;
        for (int s = 0; s < n_slots; ++s) {
            int pos, col;
            if (P.overlap && w > 0 && s < P.m) { pos = (w - 1) * P.m + s; col = d; }
            else { const int ss = (P.overlap && w > 0) ? s - P.m : s; pos = w * P.m + ss; col = P.overlap ? P.c + d : d; }
            const float a = rnd(__fmul_rn(logit[s & 255], inv), P.rb);
            acc = __fadd_rn(acc, rnd(__fmul_rn(a, at(P.kv, src_kv, pos, col)), P.rb));
        }
        ent[d] = rnd(acc, P.rb);
    }
    __syncthreads();
    if (P.norm) {
        double ss = 0.0;
        for (int d = threadIdx.x; d < P.c; d += blockDim.x) ss += (double)ent[d] * (double)ent[d];
        ss = block_sum_d(ss, red);
        const float r = inv_rms(ss, P.c, P.eps);
        for (int d = threadIdx.x; d < P.c; d += blockDim.x) ent[d] = rnd(__fmul_rn(P.norm[d], __fmul_rn(ent[d], r)), P.rb);
        __syncthreads();
    }
    if (P.inv_freq) {
        const int start = P.c - P.rope_dims;
        for (int i = threadIdx.x; i < P.rope_dims / 2; i += blockDim.x)
            rotate_torch(ent + start, i, P.rope_dims / 2, 0, __fmul_rn((float)(w * P.m), P.inv_freq[i]), P.mscale,
                         1.f, P.rb);
        __syncthreads();
    }
    for (int d = threadIdx.x; d < P.c; d += blockDim.x) P.entries[(i64)w * P.c + d] = ent[d];
}

struct SelectParams {
    const StepInfo* step;
    const float* q;        // [rows, heads·dim]
    const float* w;        // [rows, heads]
    const float* entries;  // [·, dim]
    float* scores;         // scratch [rows, max_entries]
    i32* ids;              // [rows, top_k]
    i32 rows, heads, dim, rate, top_k, max_entries;
    float scale, wscale;
};

// Entries per block of `dsa_scores`.
#define DSA_EPB 32

// grid (rows, ceil(entries/DSA_EPB)), 256 threads: I = Σ_h (w_h·ws)·relu(q_h·K·scale).
// The query's heads sit in shared memory (rows padded by 4 floats: the heads' 16-byte
// reads of one column fall in different banks); thread (entry, head) takes one dot in
// column order, 256/heads entries at a time; one thread per entry then sums its heads'
// terms in head order.
extern "C" __global__ void dsa_scores(const SelectParams P) {
    extern __shared__ float4 sm4[];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x;
    const int t = P.step->pos0 + i;
    const int visible = min((t + 1) / P.rate, (P.step->pos0 + P.step->n_tok) / P.rate);
    const int e0 = blockIdx.y * DSA_EPB, e_end = min(e0 + DSA_EPB, visible);
    if (e0 >= e_end) return;
    const int ld = P.dim + 4, per = blockDim.x / P.heads;
    float* qs = (float*)sm4;
    float* ws = qs + P.heads * ld;
    float* terms = ws + P.heads;
    stage_rows(qs, ld, P.q + (i64)i * P.heads * P.dim, P.heads, P.dim);
    for (int h = threadIdx.x; h < P.heads; h += blockDim.x) ws[h] = __fmul_rn(P.w[(i64)i * P.heads + h], P.wscale);
    __syncthreads();
    const int h = threadIdx.x % P.heads, el = threadIdx.x / P.heads;
    for (int eb = e0; eb < e_end; eb += per) {
        const int e = eb + el;
        if (el < per) {
            float term = 0.f;
            if (e < e_end) {
                const float4* k4 = (const float4*)(P.entries + (i64)e * P.dim);
                const float4* q4 = (const float4*)(qs + h * ld);
                float d = 0.f;
#pragma unroll 8
                for (int c = 0; c < P.dim / 4; ++c) {
                    const float4 kv = k4[c], qv = q4[c];
                    d = __fadd_rn(d, __fmul_rn(qv.x, kv.x));
                    d = __fadd_rn(d, __fmul_rn(qv.y, kv.y));
                    d = __fadd_rn(d, __fmul_rn(qv.z, kv.z));
                    d = __fadd_rn(d, __fmul_rn(qv.w, kv.w));
                }
                term = __fmul_rn(ws[h], fmaxf(__fmul_rn(d, P.scale), 0.f));
            }
            terms[el * P.heads + h] = term;
        }
        __syncthreads();
        if (threadIdx.x < per && eb + (int)threadIdx.x < e_end) {
            const float* tr = terms + threadIdx.x * P.heads;
            float acc = 0.f;
            for (int g = 0; g < P.heads; ++g) acc = __fadd_rn(acc, tr[g]);
            P.scores[(i64)i * P.max_entries + eb + threadIdx.x] = acc;
        }
        __syncthreads();
    }
}

// Order-preserving map of a float to an unsigned int.
__device__ __forceinline__ u32 fkey(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// One block per query: the top_k entries by score (ties: lower id), ascending, -1-padded;
// every visible entry when at most top_k are visible. The k-th largest key is found by
// a bitwise search over the order-preserving keys; the winners are then written in id
// order with a block scan.
extern "C" __global__ void dsa_topk(const SelectParams P) {
    __shared__ u32 cnt;
    __shared__ int warp_cnt[32];
    __shared__ int base;
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x;
    const int t = P.step->pos0 + i;
    const int visible = min((t + 1) / P.rate, (P.step->pos0 + P.step->n_tok) / P.rate);
    i32* out = P.ids + (i64)i * P.top_k;
    const float* sc = P.scores + (i64)i * P.max_entries;
    if (visible <= P.top_k) {
        for (int j = threadIdx.x; j < P.top_k; j += blockDim.x) out[j] = j < visible ? j : -1;
        return;
    }
    // The largest threshold T with count(key ≥ T) ≥ top_k is the k-th largest key.
    u32 thr = 0;
    for (int bit = 31; bit >= 0; --bit) {
        const u32 cand = thr | (1u << bit);
        if (threadIdx.x == 0) cnt = 0;
        __syncthreads();
        u32 local = 0;
        for (int e = threadIdx.x; e < visible; e += blockDim.x) local += fkey(sc[e]) >= cand;
        atomicAdd(&cnt, local);
        __syncthreads();
        if (cnt >= (u32)P.top_k) thr = cand;
        __syncthreads();
    }
    // Entries above the threshold all win; ties at it fill the rest by lower id.
    if (threadIdx.x == 0) cnt = 0;
    __syncthreads();
    u32 above = 0;
    for (int e = threadIdx.x; e < visible; e += blockDim.x) above += fkey(sc[e]) > thr;
    atomicAdd(&cnt, above);
    __syncthreads();
    const int need_eq = P.top_k - (int)cnt;
    if (threadIdx.x == 0) base = 0;
    __syncthreads();
    int eq_seen = 0;  // ties at the threshold before this chunk
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int c0 = 0; c0 < visible; c0 += blockDim.x) {
        const int e = c0 + threadIdx.x;
        const u32 key = e < visible ? fkey(sc[e]) : 0;
        const bool eq = e < visible && key == thr;
        // Rank of this tie among the ties (scan over the block).
        const u32 eq_ballot = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_cnt[warp] = __popc(eq_ballot);
        __syncthreads();
        int eq_before = eq_seen;
        for (int w2 = 0; w2 < warp; ++w2) eq_before += warp_cnt[w2];
        eq_before += __popc(eq_ballot & ((1u << lane) - 1));
        int eq_total = 0;
        for (int w2 = 0; w2 < nw; ++w2) eq_total += warp_cnt[w2];
        const bool win = e < visible && (key > thr || (eq && eq_before < need_eq));
        __syncthreads();
        const u32 win_ballot = __ballot_sync(0xffffffffu, win);
        if (lane == 0) warp_cnt[warp] = __popc(win_ballot);
        __syncthreads();
        int before = base;
        for (int w2 = 0; w2 < warp; ++w2) before += warp_cnt[w2];
        before += __popc(win_ballot & ((1u << lane) - 1));
        if (win) out[before] = e;
        __syncthreads();
        if (threadIdx.x == 0) {
            int tot = 0;
            for (int w2 = 0; w2 < nw; ++w2) tot += warp_cnt[w2];
            base += tot;
        }
        eq_seen += eq_total;
        __syncthreads();
    }
}

struct MlaParams {
    const StepInfo* step;
    const float* q;     // queries [rows, heads, kdim]
    const float* keys;  // token j, head h at keys + j·k_ts + h·k_hs (kdim values)
    const float* vals;  // token j, head h at vals + j·v_ts + h·v_hs (vdim values)
    const i32* sel;     // optional pool ids [rows, per_q]
    float* out;         // [rows, heads, vdim]
    i64 k_ts, v_ts;
    i32 k_hs, v_hs, kdim, vdim;
    i32 rows, heads, pool, per_q, tail, rb;
    float scale;
};

#define MLA_TILE 128
#define MLA_CH 4     // value channels per thread: vdim ≤ MLA_CH · blockDim
#define MLA_QMAX 1024
#define MLA_VB 8     // tokens whose values a thread loads before adding them

// The tokens a query attends with a selection (pool ids `s[0..per_q)`, −1 where none):
// each pool whose id differs from the last valid id before it (a repeated id counts
// once), its `pool` tokens in order, then (with `tail`) the incomplete pool up to t.
// By the whole block, `per_q` entries at a time; returns the count (on every thread).
__device__ int mla_tokens(const MlaParams& P, const i32* s, int t, int* toks) {
    __shared__ int wlast[32], wkept[32];
    __shared__ int carry_idx, carry_n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (threadIdx.x == 0) {
        carry_idx = -1;
        carry_n = 0;
    }
    __syncthreads();
    for (int c0 = 0; c0 < P.per_q; c0 += blockDim.x) {
        const int j = c0 + threadIdx.x;
        const int v = j < P.per_q ? s[j] : -1;
        // The last valid index at or before j (a max-scan over the warp, then the block).
        int idx = v >= 0 ? j : -1;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, idx, o);
            if (lane >= o) idx = max(idx, u);
        }
        if (lane == 31) wlast[warp] = idx;
        __syncthreads();
        int before = carry_idx;
        for (int w = 0; w < warp; ++w) before = max(before, wlast[w]);
        const int up = __shfl_up_sync(0xffffffffu, idx, 1);
        const int prev = max(before, lane > 0 ? up : -1);
        const bool keep = v >= 0 && (prev < 0 || s[prev] != v);
        const u32 ballot = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) wkept[warp] = __popc(ballot);
        __syncthreads();
        int at = carry_n + __popc(ballot & ((1u << lane) - 1));
        for (int w = 0; w < warp; ++w) at += wkept[w];
        if (keep)
            for (int k = 0; k < P.pool; ++k) toks[at * P.pool + k] = v * P.pool + k;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 0; w < nw; ++w) {
                carry_idx = max(carry_idx, wlast[w]);
                carry_n += wkept[w];
            }
        }
        __syncthreads();
    }
    int n = carry_n * P.pool;
    if (P.tail) {
        const int first = P.pool * ((t + 1) / P.pool);
        for (int k = first + threadIdx.x; k <= t; k += blockDim.x) toks[n + k - first] = k;
        n += t + 1 - first;
    }
    __syncthreads();
    return n;
}

// One block per (query, head): the attended tokens (the selected pools' tokens then the
// tail, kept in dynamic shared memory; or 0..t without a selection) in tiles of
// MLA_TILE: scores (a warp per two tokens), then an online softmax — the running
// maximum, the f64 running sum and each thread's MLA_CH value channels rescaled when the
// maximum grows — so no score buffer of the context's length is needed. Absorbed
// (keys = values = the latents, q the absorbed queries) or expanded (per-head keys and
// values) by the strides. The loads are batched across tokens; every sum runs in the
// order of one token at a time.
extern "C" __global__ void mla_attend(const MlaParams P) {
    extern __shared__ int toks[];
    __shared__ float qs[MLA_QMAX], sc[MLA_TILE];
    __shared__ float redf[32];
    __shared__ double redd[32];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x / P.heads, h = blockIdx.x % P.heads;
    const int t = P.step->pos0 + i;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int n = P.sel ? mla_tokens(P, P.sel + (i64)i * P.per_q, t, toks) : t + 1;
    const float* q = P.q + ((i64)i * P.heads + h) * P.kdim;
    for (int x = threadIdx.x; x < P.kdim; x += blockDim.x) qs[x] = q[x];
    __syncthreads();
    float m = -INFINITY;
    double l = 0.0;
    float acc[MLA_CH];
#pragma unroll
    for (int c = 0; c < MLA_CH; ++c) acc[c] = 0.f;
    for (int base = 0; base < n; base += MLA_TILE) {
        const int nt = min(MLA_TILE, n - base);
        // Tokens k and k + nw by one warp, their dots side by side.
        for (int k = warp; k < nt; k += 2 * nw) {
            const int k2 = min(k + nw, nt - 1);
            const int tok = P.sel ? toks[base + k] : base + k;
            const int tok2 = P.sel ? toks[base + k2] : base + k2;
            const float* kr = P.keys + (i64)tok * P.k_ts + (i64)h * P.k_hs;
            const float* kr2 = P.keys + (i64)tok2 * P.k_ts + (i64)h * P.k_hs;
            float d = 0.f, d2 = 0.f;
            for (int x = lane; x < P.kdim; x += 32) {
                d = __fadd_rn(d, __fmul_rn(qs[x], kr[x]));
                d2 = __fadd_rn(d2, __fmul_rn(qs[x], kr2[x]));
            }
            d = warp_sum(d);
            d2 = warp_sum(d2);
            if (lane == 0) {
                sc[k] = __fmul_rn(d, P.scale);
                if (k + nw < nt) sc[k2] = __fmul_rn(d2, P.scale);
            }
        }
        __syncthreads();
        float tm = -INFINITY;
        for (int k = threadIdx.x; k < nt; k += blockDim.x) tm = fmaxf(tm, sc[k]);
        const float nm = fmaxf(m, block_max_f(tm, redf));
        const float corr = expf(__fsub_rn(m, nm));
        double z = 0.0;
        for (int k = threadIdx.x; k < nt; k += blockDim.x) {
            const float e = expf(__fsub_rn(sc[k], nm));
            sc[k] = e;
            z += (double)e;
        }
        l = l * (double)corr + block_sum_d(z, redd);
        __syncthreads();
        // Each channel: acc·corr, then the tokens' weighted values one token at a time;
        // the values of MLA_VB tokens (every channel) loaded before their adds.
#pragma unroll
        for (int c = 0; c < MLA_CH; ++c) acc[c] = __fmul_rn(acc[c], corr);
        for (int k0 = 0; k0 < nt; k0 += MLA_VB) {
            float v[MLA_VB][MLA_CH];
#pragma unroll
            for (int j = 0; j < MLA_VB; ++j) {
                const int k = min(k0 + j, nt - 1);
                const int tok = P.sel ? toks[base + k] : base + k;
                const float* vr = P.vals + (i64)tok * P.v_ts + (i64)h * P.v_hs;
#pragma unroll
                for (int c = 0; c < MLA_CH; ++c) {
                    const int x = threadIdx.x + c * blockDim.x;
                    v[j][c] = x < P.vdim ? vr[x] : 0.f;
                }
            }
#pragma unroll
            for (int j = 0; j < MLA_VB; ++j) {
                if (k0 + j >= nt) break;
                const float e = sc[k0 + j];
#pragma unroll
                for (int c = 0; c < MLA_CH; ++c) acc[c] = __fadd_rn(acc[c], __fmul_rn(e, v[j][c]));
            }
        }
        m = nm;
        __syncthreads();
    }
    const float inv = n ? (float)(1.0 / l) : 0.f;
    float* o = P.out + ((i64)i * P.heads + h) * P.vdim;
#pragma unroll
    for (int c = 0; c < MLA_CH; ++c) {
        const int x = threadIdx.x + c * blockDim.x;
        if (x < P.vdim) o[x] = rnd(__fmul_rn(acc[c], inv), P.rb);
    }
}

// The bf16 reference's keys and values, expanded from the latents of every cached
// token: k[j, h] = round(k_b[h]ᵀ c_j), v[j, h] = round(v_b[h] c_j) (f32 products of
// the upcast weights). Grid (capacity, heads); tokens past the step's end exit. Parity
// arithmetic only (bf16 models): it recomputes the whole cache each call.
extern "C" __global__ void mla_expand(const StepInfo* step, const float* latent, const u8* kb, const u8* vb,
                                      i32 wty, float* kexp, float* vexp, i32 heads, i32 rank, i32 dn, i32 dv) {
    pdl_wait();
    pdl_trigger();
    const int j = blockIdx.x, h = blockIdx.y;
    if (j >= step->pos0 + step->n_tok) return;
    const float* c = latent + (i64)j * rank;
    for (int d = threadIdx.x; d < dn; d += blockDim.x) {
        float a = 0.f;
        for (int cc = 0; cc < rank; ++cc)
            a = __fadd_rn(a, __fmul_rn(wval(kb, wty, ((i64)h * rank + cc) * dn + d), c[cc]));
        kexp[((i64)j * heads + h) * dn + d] = bf2f(f2bf(a));
    }
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        float a = 0.f;
        for (int cc = 0; cc < rank; ++cc)
            a = __fadd_rn(a, __fmul_rn(wval(vb, wty, ((i64)h * dv + e) * rank + cc), c[cc]));
        vexp[((i64)j * heads + h) * dv + e] = bf2f(f2bf(a));
    }
}

// The causal softmax of MLA's prefill scores in place: row r = (query i, head h) of
// `s` [rows·heads, ld] holds the dots with keys 0 .. ld−1; key j is seen when j ≤ pos + i
// and, with a selection (`sel` [rows, per_q] pool ids, ascending, −1-padded), when its
// pool is selected or (with `tail`) it is in the incomplete pool [P·⌊(t+1)/P⌋, t] — the
// tokens `mla_attend` attends. p_j = exp(s_j·scale − max) / Σ (f64 sum), 0 where not
// seen. Dynamic shared memory: with a selection, one bit per pool of the ld keys.
extern "C" __global__ void mla_softmax(float* s, i32 heads, i32 ld, i32 pos, float scale, const i32* sel,
                                       i32 per_q, i32 pool, i32 tail) {
    extern __shared__ u32 picked[];
    __shared__ float redf[32];
    __shared__ double redd[32];
    pdl_wait();
    pdl_trigger();
    const int r = blockIdx.x, i = r / heads, t = pos + i;
    float* row = s + (i64)r * ld;
    const int n = min(ld, t + 1);
    if (sel) {
        const int words = ld / pool / 32 + 1;
        for (int w = threadIdx.x; w < words; w += blockDim.x) picked[w] = 0u;
        __syncthreads();
        for (int x = threadIdx.x; x < per_q; x += blockDim.x) {
            const int id = sel[(i64)i * per_q + x];
            if (id >= 0 && id < 32 * words) atomicOr(picked + (id >> 5), 1u << (id & 31));
        }
        __syncthreads();
    }
    const int tail0 = sel && tail ? pool * ((t + 1) / pool) : (sel ? n : 0);
    auto seen = [&](int j) {
        if (j >= n) return false;
        if (!sel || j >= tail0) return true;
        const int p = j / pool;
        return ((picked[p >> 5] >> (p & 31)) & 1u) != 0u;
    };
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (seen(j)) mx = fmaxf(mx, __fmul_rn(row[j], scale));
    mx = block_max_f(mx, redf);
    double z = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        if (seen(j)) z += (double)expf(__fsub_rn(__fmul_rn(row[j], scale), mx));
    z = block_sum_d(z, redd);
    const float inv = z > 0.0 ? (float)(1.0 / z) : 0.f;
    for (int j = threadIdx.x; j < ld; j += blockDim.x)
        row[j] = seen(j) ? __fmul_rn(expf(__fsub_rn(__fmul_rn(row[j], scale), mx)), inv) : 0.f;
}

struct SinkParams {
    const StepInfo* step;
    const float* q;        // [rows, heads·hd]
    const float* kv;       // [rows, hd]: this step's keys (= values)
    const float* window;   // [cap, hd]: earlier keys, slot pos mod cap
    const float* entries;  // optional [·, hd] compressed entries
    const i32* sel;        // optional [rows, per_q] selected entry ids (-1: none)
    const float* sinks;    // [heads]
    float* out;            // [rows, heads·hd]
    float* scores;         // scratch [rows, heads, n_stride]
    i32 cap, heads, hd, window_len, rate, per_q, rb, n_stride;
    float scale;
};

// Key j of query i at position t (window positions lo.. first, then entries), or null
// when a selected id is padding or not yet visible.
__device__ __forceinline__ const float* sink_key(const SinkParams& P, int i, int t, int lo, int n_win, int visible,
                                                 int j) {
    if (j < n_win) {
        const int pos = lo + j, pos0 = P.step->pos0;
        return pos >= pos0 ? P.kv + (i64)(pos - pos0) * P.hd : P.window + (i64)(pos % P.cap) * P.hd;
    }
    int e = j - n_win;
    if (P.sel) {
        e = P.sel[(i64)i * P.per_q + e];
        if (e < 0 || e >= visible) return nullptr;
    }
    return P.entries + (i64)e * P.hd;
}

// The keys query i sees: window positions lo..t, then (with entries) the selected or
// the visible compressed entries.
struct SinkRow {
    int t, lo, n_win, visible, n;
};

__device__ __forceinline__ SinkRow sink_row(const SinkParams& P, int i) {
    SinkRow r;
    r.t = P.step->pos0 + i;
    r.lo = max(0, r.t + 1 - P.window_len);
    r.n_win = r.t + 1 - r.lo;
    r.visible = P.rate > 0 ? (r.t + 1) / P.rate : 0;
    r.n = r.n_win + (P.entries ? (P.sel ? P.per_q : r.visible) : 0);
    return r;
}

// DeepSeek-V4's attention (`Backend::sink_attention`, the CPU backend's `sink.rs`) in two
// launches that read each key once for many heads: `sink_scores` writes every score, then
// `sink_mix` takes each head's softmax and the probability-weighted sum of the keys.

// Heads per block, keys per warp and the largest head dim (in registers, 32 values per
// lane-step) of `sink_scores`.
#define SINK_HG 16
#define SINK_KPW 4
#define SINK_MAXC 16
static_assert(SINK_HG == 16, "sink_scores' warp_sums leave head h in lanes 2h, 2h+1");

// grid (rows, ceil(n_stride/(8·SINK_KPW)), ceil(heads/SINK_HG)), 256 threads, shared
// memory SINK_HG·hd + 32 floats (the block's queries, the heads past the last zero, and a
// zero tail that the lanes past hd read). Each warp scores SINK_KPW keys against the
// block's heads: s = round(round(q·k)·scale) (−inf for a padded selection), each dot
// summed lane-strided then across the warp, the key held in registers. A block whose keys
// are all padding only writes −inf. The code is kept small (one key per iteration, no
// per-head or per-column branches): unrolled over the keys and guarded per head and
// column it was 69 KB, and the launch's time went to fetching it.
extern "C" __global__ void sink_scores(const SinkParams P) {
    extern __shared__ float4 qs4[];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x;
    if (i >= P.step->n_tok) return;
    const SinkRow R = sink_row(P, i);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nk = (blockDim.x >> 5) * SINK_KPW;
    const int j0 = blockIdx.y * nk;
    if (j0 >= R.n) return;
    const int h0 = blockIdx.z * SINK_HG, hg = min(SINK_HG, P.heads - h0);
    float* score0 = P.scores + ((i64)i * P.heads + h0) * P.n_stride;
    const int jw = j0 + warp * SINK_KPW;
    const float* kp = lane < SINK_KPW && jw + lane < R.n ? sink_key(P, i, R.t, R.lo, R.n_win, R.visible, jw + lane)
                                                         : nullptr;
    if (!__syncthreads_or(kp != nullptr)) {
        for (int x = threadIdx.x; x < hg * nk; x += blockDim.x)
            if (j0 + x % nk < R.n) score0[(i64)(x / nk) * P.n_stride + j0 + x % nk] = -INFINITY;
        return;
    }
    float* qs = (float*)qs4;
    stage_rows(qs, P.hd, P.q + ((i64)i * P.heads + h0) * P.hd, hg, P.hd);
    for (int x = hg * P.hd + threadIdx.x; x < SINK_HG * P.hd + 32; x += blockDim.x) qs[x] = 0.f;
    __syncthreads();
    const int n_m = (P.hd + 31) >> 5;
#pragma unroll 1
    for (int u = 0; u < SINK_KPW; ++u) {
        const int j = jw + u;
        if (j >= R.n) break;
        const float* k = (const float*)__shfl_sync(0xffffffffu, (unsigned long long)kp, u);
        if (!k) {
            if (lane < hg) score0[(i64)lane * P.n_stride + j] = -INFINITY;
            continue;
        }
        float kr[SINK_MAXC];
#pragma unroll
        for (int m = 0; m < SINK_MAXC; ++m) kr[m] = m < n_m && lane + 32 * m < P.hd ? k[lane + 32 * m] : 0.f;
        float d[SINK_HG];
#pragma unroll
        for (int h = 0; h < SINK_HG; ++h) d[h] = 0.f;
        // A column past hd adds the product of a zero key value: the sums are unchanged.
#pragma unroll
        for (int m = 0; m < SINK_MAXC; ++m) {
            if (m >= n_m) break;
            const float* qc = qs + lane + 32 * m;
#pragma unroll
            for (int h = 0; h < SINK_HG; ++h) d[h] = __fadd_rn(d[h], __fmul_rn(qc[h * P.hd], kr[m]));
        }
        // Lanes 2h and 2h+1 end with head h's sum.
        const float dh = warp_sums(d, lane);
        const int h = lane >> 1;
        if (!(lane & 1) && h < hg) score0[(i64)h * P.n_stride + j] = rnd(__fmul_rn(rnd(dh, P.rb), P.scale), P.rb);
    }
}

// Keys per batch of `sink_mix`'s weighted sum (their loads issued together).
#define SINK_MIX_U 16
static_assert(32 % SINK_MIX_U == 0 && SINK_MIX_U < 32, "a batch is part of a 32-key chunk's ballot");

// One batch of `sink_mix`: SINK_MIX_U keys' probabilities and the block's two columns of
// their rows.
struct SinkBatch {
    float p[SINK_MIX_U], v0[SINK_MIX_U], v1[SINK_MIX_U];
};

// grid (rows, ceil(hd/64), ceil(heads/8)), 256 threads: warp w of block (i, cb, hb) owns
// head hb·8 + w and columns cb·64 + lane, + 32. The softmax of the head's scores has the
// sink logit in its denominator (f32 exponentials summed in f64); out = round(Σ p_j k_j)
// in key order with p_j = round(e_j / z): 32 keys' probabilities and rows found a lane
// each, then broadcast. The sum runs over batches of SINK_MIX_U keys; with AHEAD the next
// batch's rows are loaded before the current batch's products are added (one batch's
// loads would otherwise wait a memory latency each: 40 batches for a CSA query's 128 +
// 512 keys). A padded selection loads nothing and adds 0·0, which leaves the sum as it is
// (it starts at +0 and never becomes −0), and a batch of padding alone is skipped (short
// contexts pad most of the 512 selections). The block's warps read the same rows (L1
// hits).
// With Y.x set (= P.out) the warp that holds a head's rotated columns then rotates them
// (the rope of the next launch, `rope_torch`'s arithmetic, at the query's position).
template <bool AHEAD>
__device__ __forceinline__ void sink_mix_body(const SinkParams& P, const RopeTorch& Y) {
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x, lane = threadIdx.x & 31;
    const int h = blockIdx.z * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (i >= P.step->n_tok || h >= P.heads) return;
    const SinkRow R = sink_row(P, i);
    const float* s = P.scores + ((i64)i * P.heads + h) * P.n_stride;
    const float sink = P.sinks[h];
    float m = sink;
    for (int j = lane; j < R.n; j += 32) m = fmaxf(m, s[j]);
    m = warp_max(m);
    double z = lane == 0 ? (double)expf(__fsub_rn(sink, m)) : 0.0;
    for (int j = lane; j < R.n; j += 32) z += (double)expf(__fsub_rn(s[j], m));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
    const float inv = (float)(1.0 / z);
    const int c0 = blockIdx.y * 64 + lane, c1 = c0 + 32;
    const bool in0 = c0 < P.hd, in1 = c1 < P.hd;
    // Key 32·cc + lane of chunk cc: its probability and row (null: padding), and the
    // chunk's keys that have a row.
    int cc = -1;
    float pc = 0.f;
    const float* kc = nullptr;
    u32 mc = 0;
    const int nb = (R.n + SINK_MIX_U - 1) / SINK_MIX_U;
    // The first batch from b on with a key that has a row (nb: none), its chunk found.
    auto next = [&](int b) {
        for (; b < nb; ++b) {
            const int c = b * SINK_MIX_U / 32;
            if (c != cc) {
                const int j = 32 * c + lane;
                pc = 0.f;
                kc = j < R.n ? sink_key(P, i, R.t, R.lo, R.n_win, R.visible, j) : nullptr;
                if (kc) pc = rnd(__fmul_rn(expf(__fsub_rn(s[j], m)), inv), P.rb);
                mc = __ballot_sync(0xffffffffu, kc != nullptr);
                cc = c;
            }
            if ((mc >> ((b * SINK_MIX_U) & 31)) & ((1u << SINK_MIX_U) - 1)) return b;
        }
        return nb;
    };
    // Issues batch b's loads from its chunk's keys.
    auto load = [&](int b, SinkBatch& B) {
        const int l0 = (b * SINK_MIX_U) & 31;
#pragma unroll
        for (int u = 0; u < SINK_MIX_U; ++u) {
            B.p[u] = __shfl_sync(0xffffffffu, pc, l0 + u);
            const float* ku = (const float*)__shfl_sync(0xffffffffu, (unsigned long long)kc, l0 + u);
            B.v0[u] = ku && in0 ? ku[c0] : 0.f;
            B.v1[u] = ku && in1 ? ku[c1] : 0.f;
        }
    };
    float a0 = 0.f, a1 = 0.f;
    auto add = [&](int b, const SinkBatch& B) {
        const int cnt = min(SINK_MIX_U, R.n - b * SINK_MIX_U);
#pragma unroll
        for (int u = 0; u < SINK_MIX_U; ++u) {
            if (u >= cnt) break;
            a0 = __fadd_rn(a0, __fmul_rn(B.p[u], B.v0[u]));
            a1 = __fadd_rn(a1, __fmul_rn(B.p[u], B.v1[u]));
        }
    };
    // Batches without a row (padded selections) add nothing and are skipped.
    SinkBatch x0;
    if constexpr (AHEAD) {
        SinkBatch x1;
        int b0 = next(0);
        if (b0 < nb) load(b0, x0);
        while (b0 < nb) {
            const int b1 = next(b0 + 1);
            if (b1 < nb) load(b1, x1);
            add(b0, x0);
            if (b1 >= nb) break;
            b0 = next(b1 + 1);
            if (b0 < nb) load(b0, x0);
            add(b1, x1);
        }
    } else {
        for (int b = next(0); b < nb; b = next(b + 1)) {
            load(b, x0);
            add(b, x0);
        }
    }
    float* o = P.out + ((i64)i * P.heads + h) * P.hd;
    if (in0) o[c0] = rnd(a0, P.rb);
    if (in1) o[c1] = rnd(a1, P.rb);
    if (Y.x && (Y.trailing ? P.hd - Y.n_dims : 0) / 64 == (int)blockIdx.y) {
        __syncwarp();
        const float pos = (float)(P.step->pos0 + i);
        for (int j = lane; j < Y.n_dims / 2; j += 32) rope_torch_pair(Y, o, pos, j);
    }
}

// One query (decode: 64 blocks, fewer than the SMs) loads a batch ahead; many queries
// (prefill) keep the registers of one batch, so that three blocks fit on an SM and the
// other blocks' warps hide the loads.
extern "C" __global__ void sink_mix(const SinkParams P, const RopeTorch Y) { sink_mix_body<true>(P, Y); }
extern "C" __global__ void sink_mix_rows(const SinkParams P, const RopeTorch Y) { sink_mix_body<false>(P, Y); }
