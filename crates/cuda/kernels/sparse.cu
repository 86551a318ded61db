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

// Entries per block of `dsa_scores`, and the most a thread takes side by side.
#define DSA_EPB 16
#define DSA_ILP 8

// grid (rows, ceil(entries/DSA_EPB)), 256 threads: I = Σ_h (w_h·ws)·relu(q_h·K·scale).
// The query's heads sit in shared memory (rows padded by 4 floats: the heads' 16-byte
// reads of one column fall in different banks), and so do the block's entry rows,
// unpadded (a warp's threads read one entry's column: one address), asked of L2 before
// the queries are staged and staged after them, so that every load of the dots is from
// shared memory; thread (slot, head) takes the dots of entries slot, slot +
// 256/heads, … of the block (up to DSA_ILP at once, side by side), each in column order;
// one thread per entry then sums its heads' terms in head order.
extern "C" __global__ void dsa_scores(const SelectParams P) {
    extern __shared__ float4 sm4[];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x;
    const int t = P.step->pos0 + i;
    const int visible = min((t + 1) / P.rate, (P.step->pos0 + P.step->n_tok) / P.rate);
    const int e0 = blockIdx.y * DSA_EPB, n = min(DSA_EPB, visible - e0);
    if (n <= 0) return;
    const int ld = P.dim + 4, per = blockDim.x / P.heads;
    float* qs = (float*)sm4;
    float* ws = qs + P.heads * ld;
    float* terms = ws + P.heads;  // [DSA_EPB][heads]
    float* ks = qs + ((P.heads * ld + P.heads + DSA_EPB * P.heads + 3) & ~3);  // [DSA_EPB][dim]
    if ((int)threadIdx.x < n) prefetch_l2(P.entries + (i64)(e0 + threadIdx.x) * P.dim, P.dim * 4);
    stage_rows(qs, ld, P.q + (i64)i * P.heads * P.dim, P.heads, P.dim);
    stage_rows(ks, P.dim, P.entries + (i64)e0 * P.dim, n, P.dim);
    for (int h = threadIdx.x; h < P.heads; h += blockDim.x) ws[h] = __fmul_rn(P.w[(i64)i * P.heads + h], P.wscale);
    __syncthreads();
    const int h = threadIdx.x % P.heads, el = threadIdx.x / P.heads;
    const float4* q4 = (const float4*)(qs + h * ld);
    for (int s0 = el; el < per && s0 < n; s0 += per * DSA_ILP) {
        // Slots s0 + per·u below n (u < cnt): their entries' rows and dots.
        const int cnt = min(DSA_ILP, (n - s0 + per - 1) / per);
        const float4* k4[DSA_ILP];
        float d[DSA_ILP];
#pragma unroll
        for (int u = 0; u < DSA_ILP; ++u) {
            k4[u] = (const float4*)(ks + (s0 + per * min(u, cnt - 1)) * P.dim);
            d[u] = 0.f;
        }
#pragma unroll 2
        for (int c = 0; c < P.dim / 4; ++c) {
            const float4 qv = q4[c];
#pragma unroll
            for (int u = 0; u < DSA_ILP; ++u) {
                if (u >= cnt) break;
                const float4 kv = k4[u][c];
                d[u] = __fadd_rn(d[u], __fmul_rn(qv.x, kv.x));
                d[u] = __fadd_rn(d[u], __fmul_rn(qv.y, kv.y));
                d[u] = __fadd_rn(d[u], __fmul_rn(qv.z, kv.z));
                d[u] = __fadd_rn(d[u], __fmul_rn(qv.w, kv.w));
            }
        }
#pragma unroll
        for (int u = 0; u < DSA_ILP; ++u)
            if (u < cnt) terms[(s0 + per * u) * P.heads + h] = __fmul_rn(ws[h], fmaxf(__fmul_rn(d[u], P.scale), 0.f));
    }
    __syncthreads();
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
        const float* tr = terms + s * P.heads;
        float acc = 0.f;
        for (int g = 0; g < P.heads; ++g) acc = __fadd_rn(acc, tr[g]);
        P.scores[(i64)i * P.max_entries + e0 + s] = acc;
    }
}

// Order-preserving map of a float to an unsigned int.
__device__ __forceinline__ u32 fkey(float f) {
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The calling thread's rank among the threads of its block (NW warps) whose `flag` is
// set (those of lower warps, then of lower lanes) and the block's count of them: one
// ballot per warp, its count in `cnt[warp]` (shared, a slot per warp), one barrier. The
// caller puts a barrier between this call and the next write of `cnt`.
template <int NW>
__device__ __forceinline__ int2 block_rank(bool flag, int* cnt) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 b = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) cnt[warp] = __popc(b);
    __syncthreads();
    int before = __popc(b & ((1u << lane) - 1)), total = 0;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
        before += w < warp ? cnt[w] : 0;
        total += cnt[w];
    }
    return make_int2(before, total);
}

// Bins of one digit of `dsa_topk`'s radix search (8 bits; blockDim.x == DSA_BINS).
#define DSA_BINS 256

// One block of DSA_BINS threads per query: the top_k entries by score (ties: lower id),
// ascending, -1-padded; every visible entry when at most top_k are visible. The k-th
// largest order-preserving key is found a byte at a time, most significant first: a
// histogram of the byte over the keys that match the bytes found so far (each warp adds
// its lanes of one bin at once), then the bin where the count from the top reaches the
// rank still wanted. The winners are then written in id order with a block scan.
extern "C" __global__ void __launch_bounds__(DSA_BINS) dsa_topk(const SelectParams P) {
    __shared__ int warp_cnt[32];
    __shared__ u32 hist[DSA_BINS];
    __shared__ u32 found[2];  // the digit, and the keys above its bin
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
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // thr: the bytes found so far (those under `known`); want: the rank of the k-th
    // largest key among the keys that match them (at least that many do).
    u32 thr = 0, known = 0, want = (u32)P.top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        hist[threadIdx.x] = 0;
        __syncthreads();
        for (int c0 = 0; c0 < visible; c0 += blockDim.x) {
            const int e = c0 + threadIdx.x;
            const u32 key = e < visible ? fkey(sc[e]) : 0;
            const bool in = e < visible && (key & known) == thr;
            const u32 digit = in ? (key >> shift) & (DSA_BINS - 1) : DSA_BINS;
            const u32 same = __match_any_sync(0xffffffffu, digit);
            if (in && lane == __ffs(same) - 1) atomicAdd(&hist[digit], __popc(same));
        }
        __syncthreads();
        // Bin b = DSA_BINS-1-threadIdx.x: a scan from the top bin gives the keys at or
        // above it (incl) and above it (incl - n); one bin holds the wanted rank.
        const u32 n = hist[DSA_BINS - 1 - threadIdx.x];
        u32 incl = n;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 u = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += u;
        }
        if (lane == 31) warp_cnt[warp] = (int)incl;
        __syncthreads();
        for (int w = 0; w < warp; ++w) incl += (u32)warp_cnt[w];
        if (incl - n < want && incl >= want) {
            found[0] = DSA_BINS - 1 - threadIdx.x;
            found[1] = incl - n;
        }
        __syncthreads();
        thr |= found[0] << shift;
        known |= (u32)(DSA_BINS - 1) << shift;
        want -= found[1];
    }
    // Entries above the threshold all win; the `want` ties at it fill the rest by lower id.
    const int need_eq = (int)want;
    int eq_seen = 0, written = 0;  // ties at the threshold and winners before this chunk
    for (int c0 = 0; c0 < visible; c0 += blockDim.x) {
        const int e = c0 + threadIdx.x;
        const u32 key = e < visible ? fkey(sc[e]) : 0;
        const bool eq = e < visible && key == thr;
        const int2 tie = block_rank<DSA_BINS / 32>(eq, warp_cnt);
        const bool win = e < visible && (key > thr || (eq && eq_seen + tie.x < need_eq));
        __syncthreads();
        const int2 at = block_rank<DSA_BINS / 32>(win, warp_cnt);
        if (win) out[written + at.x] = e;
        eq_seen += tie.y;
        written += at.y;
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
    float* part_o;      // [rows, heads, chunks, vdim]: each chunk's unnormalised output
    float* part_m;      // [rows, heads, chunks]: its maximum score (−inf: no tokens)
    double* part_l;     // [rows, heads, chunks]: its sum of weights
    u32* counters;      // [rows, head groups], zero between launches
    i64 k_ts, v_ts;
    i32 k_hs, v_hs, kdim, vdim;
    i32 rows, heads, pool, per_q, tail, rb;
    float scale;
    i32 stage;          // keys = values, rows of kdim floats 16-byte aligned: staged in shared memory
};

#define MLA_HG 8   // heads per block: one warp each in the softmax (blockDim.x = 256)
#define MLA_TT 32  // tokens per tile: four per warp in the scores
#define MLA_VCH 4  // value channels per thread and head: vdim ≤ MLA_VCH · 256
#define MLA_CHUNKS 16  // at most this many blocks share a (query, head group)'s tokens
#define MLA_MERGE 2    // chunks whose partial outputs the merge loads at once
static_assert(MLA_CHUNKS <= 32, "the merge weighs a chunk per lane");
static_assert(MLA_HG * 32 == 256, "mla_attend's blocks are MLA_HG warps (a warp per head in the softmax)");

// Selection entries per thread of each pass of `mla_pools` (a multiple of 4: loaded as
// int4 where aligned).
#define MLA_PPT 8

// The pools a query attends with a selection (pool ids `s[0..per_q)`, −1 where none):
// each pool whose id differs from the last valid id before it (a repeated id counts
// once), in order, written to `kept`. By the whole block (MLA_HG warps), in passes of
// blockDim.x · MLA_PPT entries: thread i takes MLA_PPT consecutive ones, all loaded at
// once; a scan over the threads gives each the last valid id before its entries (the
// previous pass's carried in) and where its kept pools go. Returns their count (on every
// thread); `kept` is complete after it.
__device__ int mla_pools(const MlaParams& P, const i32* s, int* kept) {
    __shared__ int wlast[MLA_HG], wkept[MLA_HG];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int carry_v = -1, carry_n = 0;  // the last valid id so far and the pools kept so far
    for (int c0 = 0; c0 < P.per_q; c0 += blockDim.x * MLA_PPT) {
        const int j0 = c0 + threadIdx.x * MLA_PPT;
        __align__(16) int v[MLA_PPT];
        if (j0 + MLA_PPT <= P.per_q && ((u64)(s + j0) & 15) == 0) {
#pragma unroll
            for (int k = 0; k < MLA_PPT; k += 4) *(int4*)(v + k) = *(const int4*)(s + j0 + k);
        } else {
#pragma unroll
            for (int k = 0; k < MLA_PPT; ++k) v[k] = j0 + k < P.per_q ? s[j0 + k] : -1;
        }
        // The thread's last valid id, then the warp's inclusive scan of "the latest valid".
        int last = -1;
#pragma unroll
        for (int k = 0; k < MLA_PPT; ++k) last = v[k] >= 0 ? v[k] : last;
        int y = last;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, y, o);
            if (lane >= o && y < 0) y = u;
        }
        const int up = __shfl_up_sync(0xffffffffu, y, 1);
        if (lane == 31) wlast[warp] = y;
        __syncthreads();
        int cur = carry_v;  // the last valid id before the thread's first entry
#pragma unroll
        for (int w = 0; w < MLA_HG; ++w) {
            if (w < warp && wlast[w] >= 0) cur = wlast[w];
            if (wlast[w] >= 0) carry_v = wlast[w];
        }
        if (lane > 0 && up >= 0) cur = up;
        bool keep[MLA_PPT];
        int nk = 0;
#pragma unroll
        for (int k = 0; k < MLA_PPT; ++k) {
            keep[k] = v[k] >= 0 && v[k] != cur;
            cur = v[k] >= 0 ? v[k] : cur;
            nk += keep[k];
        }
        // Where the thread's kept pools go: an exclusive sum over the block.
        int at = nk;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, at, o);
            if (lane >= o) at += u;
        }
        if (lane == 31) wkept[warp] = at;
        at -= nk;
        __syncthreads();
        int total = 0;
#pragma unroll
        for (int w = 0; w < MLA_HG; ++w) {
            at += w < warp ? wkept[w] : 0;
            total += wkept[w];
        }
#pragma unroll
        for (int k = 0; k < MLA_PPT; ++k)
            if (keep[k]) kept[carry_n + at++] = v[k];
        carry_n += total;
        __syncthreads();
    }
    return carry_n;
}

// f(v, x) for the calling thread's value channels x = threadIdx.x + 256·v below vdim.
template <class F>
__device__ __forceinline__ void mla_channels(int vdim, F f) {
#pragma unroll
    for (int v = 0; v < MLA_VCH; ++v) {
        const int x = threadIdx.x + v * 256;
        if (x >= vdim) break;
        f(v, x);
    }
}

// Grid (chunks, head groups, queries), 256 threads. A query attends its tokens: the
// selected pools' tokens then the tail (`mla_pools`), or 0..t without a selection. They
// are cut into at most gridDim.x (≤ MLA_CHUNKS) contiguous chunks of whole tiles (MLA_TT
// tokens); each block takes MLA_HG heads and one chunk (blocks past the last chunk return
// at once), tile by tile: the scores (a warp per four tokens against every head of the group, so a key
// row is read once for all of them), an online softmax per head (its running maximum and
// f64 sum, a warp per head), each thread's value channels of every head rescaled and the
// tile's weighted values added one token at a time. With `stage` (absorbed: keys = values
// = the latent rows, shared by every head) each tile's rows are copied into shared memory
// asynchronously while the tile before is computed. A single chunk writes the output; else
// each chunk's unnormalised outputs, maxima and sums go to `part_*` and the group's last
// block to finish combines them: out = Σ_c e^(m_c − M)·o_c / Σ_c e^(m_c − M)·l_c.
// Expanded (per-head keys and values: the bf16 reference's arithmetic) by the strides.
// Each dot is a lane-strided sum then `warp_sum`'s tree.
extern "C" __global__ void __launch_bounds__(256) mla_attend(const MlaParams P) {
    extern __shared__ __align__(16) float qs[];  // [MLA_HG, kdim], staged rows, kept pools
    __shared__ __align__(16) float ps[MLA_TT][MLA_HG];
    __shared__ float corr_s[MLA_HG], inv_s[MLA_HG];
    __shared__ float wc[MLA_HG][32];
    __shared__ int tk[2][MLA_TT];
    __shared__ bool last;
    pdl_wait();
    pdl_trigger();
    const int c = blockIdx.x, g = blockIdx.y, i = blockIdx.z;
    const int t = P.step->pos0 + i;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h0 = g * MLA_HG, hn = min(MLA_HG, P.heads - h0);
    float* rows = qs + MLA_HG * P.kdim;  // [2, MLA_TT, kdim] with `stage`
    int* pools = (int*)(rows + (P.stage ? 2 * MLA_TT * P.kdim : 0));
    int n = t + 1, np = 0, first = 0;
    if (P.sel) {
        np = mla_pools(P, P.sel + (i64)i * P.per_q, pools);
        n = np * P.pool;
        if (P.tail) {
            first = P.pool * ((t + 1) / P.pool);
            n += t + 1 - first;
        }
    }
    const int per = max(MLA_TT, ((n + gridDim.x - 1) / gridDim.x + MLA_TT - 1) / MLA_TT * MLA_TT);
    const int nch = max(1, (n + per - 1) / per);  // chunks with tokens (one when none)
    if (c >= nch) return;
    // The attended token at index j of the list.
    auto token = [&](int j) {
        if (!P.sel) return j;
        const int in = np * P.pool;
        return j < in ? pools[j / P.pool] * P.pool + j % P.pool : first + j - in;
    };
    const int j0 = c * per, j1 = min(n, j0 + per);
    const i64 rh = (i64)i * P.heads + h0;  // the group's first (query, head) row
    // The tile at list index b into buffer `buf`: its token ids (the last repeated past
    // the end) and, staged, its rows (one copy group per tile).
    auto fill = [&](int b, int buf) {
        const int nt = min(MLA_TT, j1 - b);
        if (threadIdx.x < MLA_TT) tk[buf][threadIdx.x] = token(b + min((int)threadIdx.x, nt - 1));
        if (P.stage) {
            __syncthreads();
            const int c4 = P.kdim >> 2;
            for (int e = threadIdx.x; e < MLA_TT * c4; e += blockDim.x) {
                const int u = e / c4, x = 4 * (e - u * c4);
                cp_async16(rows + (buf * MLA_TT + u) * P.kdim + x, P.keys + (i64)tk[buf][u] * P.k_ts + x);
            }
            cp_async_commit();
        }
    };
    if (j0 < j1) fill(j0, 0);
    stage_rows(qs, P.kdim, P.q + rh * P.kdim, hn, P.kdim);
    for (int x = hn * P.kdim + threadIdx.x; x < MLA_HG * P.kdim; x += blockDim.x) qs[x] = 0.f;
    float m = -INFINITY;  // warp w's head: running maximum and sum
    double l = 0.0;
    float acc[MLA_VCH][MLA_HG];
#pragma unroll
    for (int v = 0; v < MLA_VCH; ++v)
#pragma unroll
        for (int h = 0; h < MLA_HG; ++h) acc[v][h] = 0.f;
    for (int b = j0, buf = 0; b < j1; b += MLA_TT, buf ^= 1) {
        const int nt = min(MLA_TT, j1 - b);
        if (b + MLA_TT < j1) {
            fill(b + MLA_TT, buf ^ 1);
            if (P.stage) cp_async_wait_but_one();
        } else if (P.stage) {
            cp_async_wait_all();
        }
        __syncthreads();
        {
            // Tokens 4·warp .. 4·warp + 3 of the tile against every head: d[u·MLA_HG + h].
            float d[4 * MLA_HG];
#pragma unroll
            for (int k = 0; k < 4 * MLA_HG; ++k) d[k] = 0.f;
            const float* kr[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                kr[u] = P.stage ? rows + (buf * MLA_TT + 4 * warp + u) * P.kdim
                                : P.keys + (i64)tk[buf][4 * warp + u] * P.k_ts;
            if (P.k_hs == 0) {
                // Keys shared by every head: one load per token.
#pragma unroll 2
                for (int x = lane; x < P.kdim; x += 32) {
                    float kv[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) kv[u] = kr[u][x];
#pragma unroll
                    for (int h = 0; h < MLA_HG; ++h) {
                        const float qv = qs[h * P.kdim + x];
#pragma unroll
                        for (int u = 0; u < 4; ++u)
                            d[u * MLA_HG + h] = __fadd_rn(d[u * MLA_HG + h], __fmul_rn(qv, kv[u]));
                    }
                }
            } else {
                // Per-head keys: the group's heads h0 + h (none past the last).
                for (int x = lane; x < P.kdim; x += 32)
#pragma unroll
                    for (int h = 0; h < MLA_HG; ++h) {
                        if (h >= hn) break;
                        const float qv = qs[h * P.kdim + x];
#pragma unroll
                        for (int u = 0; u < 4; ++u)
                            d[u * MLA_HG + h] = __fadd_rn(d[u * MLA_HG + h],
                                                          __fmul_rn(qv, kr[u][(i64)(h0 + h) * P.k_hs + x]));
                    }
            }
            const float sc = warp_sums<4 * MLA_HG>(d, lane);
            const int u = lane / MLA_HG, h = lane % MLA_HG;
            ps[4 * warp + u][h] = 4 * warp + u < nt && h < hn ? __fmul_rn(sc, P.scale) : -INFINITY;
        }
        __syncthreads();
        {
            // Warp w: head w's softmax over the tile (lane = token).
            const float sv = ps[lane][warp];
            const float nm = fmaxf(m, warp_max(sv));
            const bool live = nm != -INFINITY;  // false only for a head past the last
            const float corr = live ? expf(__fsub_rn(m, nm)) : 1.f;
            const float e = live ? expf(__fsub_rn(sv, nm)) : 0.f;
            double z = (double)e;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
            l = l * (double)corr + z;
            m = nm;
            ps[lane][warp] = e;
            if (lane == 0) corr_s[warp] = corr;
        }
        __syncthreads();
        // Each thread's channels x = tid + 256·v of every head: acc·corr, then the
        // tile's tokens one at a time.
#pragma unroll
        for (int v = 0; v < MLA_VCH; ++v) {
            if (v * 256 >= P.vdim) break;
#pragma unroll
            for (int h = 0; h < MLA_HG; ++h) acc[v][h] = __fmul_rn(acc[v][h], corr_s[h]);
        }
        if (P.v_hs == 0) {
            // Values shared by every head: one load per token and channel, four tokens'
            // loaded before their adds.
            for (int u0 = 0; u0 < nt; u0 += 4) {
                float val[4][MLA_VCH];
#pragma unroll
                for (int uu = 0; uu < 4; ++uu) {
                    const int u = min(u0 + uu, nt - 1);
                    const float* vr = P.stage ? rows + (buf * MLA_TT + u) * P.kdim : P.vals + (i64)tk[buf][u] * P.v_ts;
#pragma unroll
                    for (int v = 0; v < MLA_VCH; ++v) {
                        const int x = threadIdx.x + v * 256;
                        val[uu][v] = x < P.vdim ? vr[x] : 0.f;
                    }
                }
#pragma unroll
                for (int uu = 0; uu < 4; ++uu) {
                    if (u0 + uu >= nt) break;
                    const float4 e0 = *(const float4*)&ps[u0 + uu][0], e1 = *(const float4*)&ps[u0 + uu][4];
                    const float e[MLA_HG] = {e0.x, e0.y, e0.z, e0.w, e1.x, e1.y, e1.z, e1.w};
#pragma unroll
                    for (int v = 0; v < MLA_VCH; ++v) {
                        if (v * 256 >= P.vdim) break;
#pragma unroll
                        for (int h = 0; h < MLA_HG; ++h)
                            acc[v][h] = __fadd_rn(acc[v][h], __fmul_rn(e[h], val[uu][v]));
                    }
                }
            }
        } else {
            // Per-head values: the group's heads h0 + h (none past the last).
            for (int u = 0; u < nt; ++u) {
                const float* vr = P.vals + (i64)tk[buf][u] * P.v_ts;
                mla_channels(P.vdim, [&](int v, int x) {
#pragma unroll
                    for (int h = 0; h < MLA_HG; ++h) {
                        if (h >= hn) break;
                        acc[v][h] = __fadd_rn(acc[v][h], __fmul_rn(ps[u][h], vr[(i64)(h0 + h) * P.v_hs + x]));
                    }
                });
            }
        }
        __syncthreads();
    }
    if (nch == 1) {
        // The only chunk: out = acc / l (0 without tokens).
        if (lane == 0 && warp < hn) inv_s[warp] = m == -INFINITY ? 0.f : (float)(1.0 / l);
        __syncthreads();
        mla_channels(P.vdim, [&](int v, int x) {
#pragma unroll
            for (int h = 0; h < MLA_HG; ++h)
                if (h < hn) P.out[(rh + h) * P.vdim + x] = rnd(__fmul_rn(acc[v][h], inv_s[h]), P.rb);
        });
        return;
    }
    // This chunk's partial results, then the group's last block combines them (reading
    // them from L2: other blocks wrote them).
    const i64 pc = (i64)gridDim.x * P.vdim;
    if (lane == 0 && warp < hn) {
        P.part_m[(rh + warp) * gridDim.x + c] = m;
        P.part_l[(rh + warp) * gridDim.x + c] = l;
    }
    mla_channels(P.vdim, [&](int v, int x) {
#pragma unroll
        for (int h = 0; h < MLA_HG; ++h)
            if (h < hn) P.part_o[(rh + h) * pc + (i64)c * P.vdim + x] = acc[v][h];
    });
    __threadfence();
    __syncthreads();
    u32* counter = P.counters + (i64)i * gridDim.y + g;
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == (u32)nch - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) *counter = 0u;
    // Warp w, head w: the chunks' weights e^(m_c − M) (lane = chunk) and
    // 1 / Σ_c weight·l_c.
    if (warp < hn) {
        const float mc = lane < nch ? __ldcg(P.part_m + (rh + warp) * gridDim.x + lane) : -INFINITY;
        const float M = warp_max(mc);
        const float w = mc == -INFINITY ? 0.f : expf(__fsub_rn(mc, M));
        double lw = w == 0.f ? 0.0 : (double)w * __ldcg(P.part_l + (rh + warp) * gridDim.x + lane);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) lw += __shfl_xor_sync(0xffffffffu, lw, o);
        wc[warp][lane] = w;
        if (lane == 0) inv_s[warp] = M == -INFINITY ? 0.f : (float)(1.0 / lw);
    }
    __syncthreads();
    // Each thread's channels of every head, summed over the chunks in order, the values
    // of MLA_MERGE chunks loaded before their adds (each chunk below nch has tokens, so
    // its partials are written).
    float o[MLA_VCH][MLA_HG];
#pragma unroll
    for (int v = 0; v < MLA_VCH; ++v)
#pragma unroll
        for (int h = 0; h < MLA_HG; ++h) o[v][h] = 0.f;
    const float* po = P.part_o + rh * pc + threadIdx.x;  // head 0, chunk 0, channel tid
    for (int c0 = 0; c0 < nch; c0 += MLA_MERGE) {
        float pv[MLA_MERGE][MLA_VCH][MLA_HG];
#pragma unroll
        for (int cc = 0; cc < MLA_MERGE; ++cc)
#pragma unroll
            for (int v = 0; v < MLA_VCH; ++v) {
                if (v * 256 >= P.vdim) break;
#pragma unroll
                for (int h = 0; h < MLA_HG; ++h)
                    pv[cc][v][h] = c0 + cc < nch && h < hn && threadIdx.x + v * 256 < P.vdim
                                       ? __ldcg(po + h * pc + (i64)(c0 + cc) * P.vdim + v * 256)
                                       : 0.f;
            }
#pragma unroll
        for (int cc = 0; cc < MLA_MERGE; ++cc) {
            if (c0 + cc >= nch) break;
#pragma unroll
            for (int v = 0; v < MLA_VCH; ++v) {
                if (v * 256 >= P.vdim) break;
#pragma unroll
                for (int h = 0; h < MLA_HG; ++h) o[v][h] = __fadd_rn(o[v][h], __fmul_rn(wc[h][c0 + cc], pv[cc][v][h]));
            }
        }
    }
    mla_channels(P.vdim, [&](int v, int x) {
#pragma unroll
        for (int h = 0; h < MLA_HG; ++h)
            if (h < hn) P.out[(rh + h) * P.vdim + x] = rnd(__fmul_rn(o[v][h], inv_s[h]), P.rb);
    });
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
    i32 kpw;               // sink_scores: keys per warp
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

// Heads per block and the largest head dim (in registers, 32 values per lane-step) of
// `sink_scores`.
#define SINK_HG 16
#define SINK_MAXC 16
static_assert(SINK_HG == 16, "sink_scores' warp_sums leave head h in lanes 2h, 2h+1");

// grid (rows, ceil(n_stride/(8·kpw)), ceil(heads/SINK_HG)), 256 threads, shared memory
// SINK_HG·hd + 32 floats (the block's queries, the heads past the last zero, and a zero
// tail that the lanes past hd read). Each warp scores P.kpw (1 to 32) keys, one after
// another, against the block's heads: s = round(round(q·k)·scale) (−inf for a padded
// selection), each dot summed lane-strided then across the warp, the key held in
// registers. A block whose keys are all padding only writes −inf. The code is kept small
// (one key per iteration, no per-head or per-column branches): unrolled over the keys and
// guarded per head and column it was 69 KB, and the launch's time went to fetching it.
extern "C" __global__ void sink_scores(const SinkParams P) {
    extern __shared__ float4 qs4[];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x;
    if (i >= P.step->n_tok) return;
    const SinkRow R = sink_row(P, i);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nk = (blockDim.x >> 5) * P.kpw;
    const int j0 = blockIdx.y * nk;
    if (j0 >= R.n) return;
    const int h0 = blockIdx.z * SINK_HG, hg = min(SINK_HG, P.heads - h0);
    float* score0 = P.scores + ((i64)i * P.heads + h0) * P.n_stride;
    const int jw = j0 + warp * P.kpw;
    const float* kp = lane < P.kpw && jw + lane < R.n ? sink_key(P, i, R.t, R.lo, R.n_win, R.visible, jw + lane)
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
    for (int u = 0; u < P.kpw; ++u) {
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

// Keys listed per chunk of `sink_mix` (one a thread: blockDim.x), heads per block (a warp
// each) and keys per tile of rows staged in shared memory.
#define SINK_MIX_KC 256
#define SINK_MIX_HEADS 8
static_assert(SINK_MIX_KC == 32 * SINK_MIX_HEADS, "sink_mix's blocks are a warp per head (block_rank<SINK_MIX_HEADS>)");
#define SINK_MIX_TT 32

// grid (rows, ceil(hd/64), ceil(heads/8)), 256 threads: warp w of block (i, y, hb) owns
// head hb·8 + w and columns 64·y + lane, + 32. The softmax of the head's scores has the
// sink logit in its denominator (f32 exponentials summed in f64); out = round(Σ p_j k_j)
// in key order with p_j = round(e_j / z). The keys go by chunks of SINK_MIX_KC: the block
// lists the chunk's keys that have a row (a padded or not yet visible selection has none
// and adds nothing: the sum starts at +0 and never becomes −0), each warp writes its
// head's probabilities of them to shared memory, and the block's 64 columns of the listed
// rows are copied into shared memory by `cp.async`, a tile of SINK_MIX_TT rows ahead of
// the tile the warps add (every warp reads the same rows: one copy for the block, and a
// tile's loads all in flight at once).
// With Y.x set (= P.out) the warp that holds a head's rotated columns then rotates them
// (the rope of the next launch, `rope_torch`'s arithmetic, at the query's position).
extern "C" __global__ void __launch_bounds__(SINK_MIX_KC) sink_mix(const SinkParams P, const RopeTorch Y) {
    __shared__ const float* kp[SINK_MIX_KC];               // the chunk's listed rows
    __shared__ int kj[SINK_MIX_KC];                        // and their key indices
    __shared__ float kprob[SINK_MIX_HEADS][SINK_MIX_KC];   // each warp's probabilities of them
    __shared__ __align__(16) float tile[2][SINK_MIX_TT][64];  // the block's columns of their rows
    __shared__ int wn[SINK_MIX_HEADS];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (i >= P.step->n_tok) return;
    const int h = blockIdx.z * SINK_MIX_HEADS + warp;
    const bool head = h < P.heads;  // warps past the last head only list and copy
    const SinkRow R = sink_row(P, i);
    const float* s = P.scores + ((i64)i * P.heads + min(h, P.heads - 1)) * P.n_stride;
    float m = 0.f, inv = 0.f;
    if (head) {
        // Each lane's scores four at a time (their loads together), in its order j = lane,
        // lane + 32, …, as the f64 sum's order requires.
        const float sink = P.sinks[h];
        m = sink;
        for (int j0 = lane; j0 < R.n; j0 += 128) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = j0 + 32 * u < R.n ? s[j0 + 32 * u] : -INFINITY;
#pragma unroll
            for (int u = 0; u < 4; ++u) m = fmaxf(m, v[u]);
        }
        m = warp_max(m);
        double z = lane == 0 ? (double)expf(__fsub_rn(sink, m)) : 0.0;
        for (int j0 = lane; j0 < R.n; j0 += 128) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = j0 + 32 * u < R.n ? s[j0 + 32 * u] : 0.f;
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (j0 + 32 * u < R.n) z += (double)expf(__fsub_rn(v[u], m));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
        inv = (float)(1.0 / z);
    }
    const int cb = blockIdx.y * 64, cols = min(64, P.hd - cb);
    const bool in0 = lane < cols, in1 = lane + 32 < cols;
    float a0 = 0.f, a1 = 0.f;
    // Copies the block's columns of listed rows t·TT .. (below cnt) into tile[t & 1]: a
    // thread's two 16-byte pieces (floats one at a time where a row is not 16-byte aligned
    // or the piece ends past the last column).
    auto stage = [&](int t, int cnt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int x = threadIdx.x + r * SINK_MIX_KC, u = x >> 4, c = (x & 15) * 4;
            const int q = t * SINK_MIX_TT + u;
            if (q >= cnt || c >= cols) continue;
            const float* src = kp[q] + cb + c;
            float* dst = &tile[t & 1][u][c];
            if (c + 4 <= cols && ((u64)src & 15) == 0) {
                cp_async16(dst, src);
            } else {
                for (int e = 0; e < 4 && c + e < cols; ++e) cp_async4(dst + e, src + e);
            }
        }
        cp_async_commit();
    };
    for (int j0 = 0; j0 < R.n; j0 += SINK_MIX_KC) {
        // The chunk's keys that have a row, in key order (a scan of the block's ballots).
        const int j = j0 + threadIdx.x;
        const float* k = j < R.n ? sink_key(P, i, R.t, R.lo, R.n_win, R.visible, j) : nullptr;
        const int2 at = block_rank<SINK_MIX_HEADS>(k != nullptr, wn);
        const int cnt = at.y;
        if (k) {
            kp[at.x] = k;
            kj[at.x] = j;
        }
        __syncthreads();
        if (cnt == 0) continue;  // uniform: the next chunk's barriers follow
        const int nt = (cnt + SINK_MIX_TT - 1) / SINK_MIX_TT;
        stage(0, cnt);
        if (head) {
            for (int q0 = lane; q0 < cnt; q0 += 128) {
                float v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) v[u] = q0 + 32 * u < cnt ? s[kj[q0 + 32 * u]] : 0.f;
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (q0 + 32 * u < cnt)
                        kprob[warp][q0 + 32 * u] = rnd(__fmul_rn(expf(__fsub_rn(v[u], m)), inv), P.rb);
            }
        }
        for (int t = 0; t < nt; ++t) {
            if (t + 1 < nt) {
                stage(t + 1, cnt);
                cp_async_wait_but_one();
            } else {
                cp_async_wait_all();
            }
            __syncthreads();  // tile t copied by every thread; the probabilities written
            if (head) {
                const int q0 = t * SINK_MIX_TT, un = min(SINK_MIX_TT, cnt - q0);
                const float(*rows)[64] = tile[t & 1];
                for (int u = 0; u < un; ++u) {
                    const float p = kprob[warp][q0 + u];
                    a0 = __fadd_rn(a0, __fmul_rn(p, in0 ? rows[u][lane] : 0.f));
                    a1 = __fadd_rn(a1, __fmul_rn(p, in1 ? rows[u][lane + 32] : 0.f));
                }
            }
            __syncthreads();  // tile t & 1 is copied into again (tile t + 2), or the next chunk's
                              // lists and probabilities are written
        }
    }
    if (!head) return;
    float* o = P.out + ((i64)i * P.heads + h) * P.hd;
    if (in0) o[cb + lane] = rnd(a0, P.rb);
    if (in1) o[cb + lane + 32] = rnd(a1, P.rb);
    if (Y.x && (Y.trailing ? P.hd - Y.n_dims : 0) / 64 == (int)blockIdx.y) {
        __syncwarp();
        const float pos = (float)(P.step->pos0 + i);
        for (int j = lane; j < Y.n_dims / 2; j += 32) rope_torch_pair(Y, o, pos, j);
    }
}
