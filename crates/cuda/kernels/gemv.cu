// Decode matrix-vector products over quantized weights (one token), with the
// activation quantized on the fly and the neighbouring elementwise work fused in.
//
// One launch computes up to three "segments" of output rows that share one input
// vector (q/k/v; gate/up; one matrix): every block first prefetches the first weight
// rows it will read into L2, waits for the previous kernel (programmatic dependent
// launch), then builds the activation in shared memory — optionally RMS-normalized
// (`x * 1/sqrt(mean(x²)+eps) * w`, the sum of squares in f64 as the CPU backend does)
// and quantized the way ggml's CPU backend quantizes it for the weight type's dot
// product (Q8_0/Q8_1 blocks of 32 as `quantize_row_q8_{0,1}` of ggml's x86 backend;
// Q8_K blocks of 256, `quantize_row_q8_K_ref`). Then each warp computes whole rows: lanes take 32-weight
// units of the row, decode them to int8 and accumulate integer dot products with
// `dp4a` against the int8 activation, scaled per block as ggml's `vec_dot_*` do.
//
// Epilogues: `+bias`; `acc[r] += value` (the residual add); and for a pair segment
// (gate, up) `out3[r] = silu(gate)·up`.
//
// IQ2_XXS weights decode through tables the block copies into shared memory before its
// wait (the grid and the sign masks, replicated so that gathers are free of bank
// conflicts), and the typed expert gate/up kernels issue the next half-row's loads before
// the current half-row's dots (`pipelined_rows`).
//
// One kernel, `gemv`: 8 warps, 2 blocks per SM. Variants that kept more loads in
// flight (a ring or chunks of units per lane, TMA bulk copies into shared memory) and
// other block shapes measured slower on the H200 and were removed (docs/benchmarks.md):
// the kernel is bound by the instructions it spends per weight. Every buffer the
// unfused operations would write is still written (h, q, k, v, gate, up), so the
// fused step computes the same values as the op-by-op one.

#include "common.cuh"

#define GEMV_WARPS 8
#define NEED_A32 1
#define NEED_AK 2
#define NEED_IQ2 4

// The dynamic shared memory of every GEMV launch: the IQ2_XXS tables first (when the
// launch reads IQ2_XXS weights), then the activation.
extern __shared__ __align__(16) u8 gemv_smem[];

// IQ2_XXS decoding tables in shared memory, one 32-bit word per entry: the grid's 256
// entries as eight 4-bit byte selectors (the magnitude 0x08, 0x19 or 0x2b of value j as
// 0, 1 or 2 in nibble j) and the 128 sign patterns as 4 in nibble j where value j is
// negated. A grid word or'ed with a sign word selects, through one prmt per four values,
// each signed value from the bytes of IQ2_MAGS (±0x08, ±0x19, ±0x2b). Every entry is
// stored 32 times side by side and lane l reads copy l, so a warp's gather of 32 random
// entries is one shared-memory wavefront. (The grid in global memory cost about 18 L1
// sectors per gather and kept the L1 busy; one copy in shared memory, bank conflicts.)
#define IQ2_COPIES 32
#define IQ2_ENTRY (IQ2_COPIES * 4)
static_assert(IQ2_ENTRY == 128, "UIQ2_XXS::dot shifts a table index by 7 bits");
#define IQ2_GRID_AT 0
#define IQ2_SIGNS_AT (256 * IQ2_ENTRY)
#define IQ2_TABLE_BYTES (IQ2_SIGNS_AT + 128 * IQ2_ENTRY)
#define IQ2_MAGS_LO 0x002b1908u  // selectors 0-2: +0x08, +0x19, +0x2b
#define IQ2_MAGS_HI 0x00d5e7f8u  // selectors 4-6: -0x08, -0x19, -0x2b

// Nibble j of the result: the selector of byte j of grid entry `g` (0x08 → 0, 0x19 → 1,
// 0x2b → 2).
__device__ __forceinline__ u32 iq2_grid_selectors(u64 g) {
    u32 r = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const u32 b = (u32)(g >> (8 * j)) & 0xFFu;
        r |= ((b > 0x08u) + (b > 0x19u)) << (4 * j);
    }
    return r;
}

// Nibble j of the result is 4 where bit j of the sign byte `s` is set.
__device__ __forceinline__ u32 iq2_sign_selectors(u32 s) {
    u32 r = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) r |= ((s >> j) & 1u) << (4 * j + 2);
    return r;
}

// Fills the tables (by the block of GEMV_WARPS·32 threads; visible after the next block
// barrier), all of a thread's grid loads issued before its stores. Reads nothing an
// earlier kernel writes, so it runs before the programmatic wait.
__device__ __forceinline__ void fill_iq2_tables() {
    constexpr int T = GEMV_WARPS * 32, PER = IQ2_ENTRY / 16;  // 16-byte chunks per entry
    constexpr int GRID = 256 * PER / T, SIGNS = 128 * PER / T;  // chunks per thread
    uint4* t = (uint4*)gemv_smem;
    u64 g[GRID];
#pragma unroll
    for (int k = 0; k < GRID; ++k) g[k] = IQ2XXS_GRID[(threadIdx.x + k * T) / PER];
#pragma unroll
    for (int k = 0; k < GRID; ++k) {
        const u32 w = iq2_grid_selectors(g[k]);
        t[threadIdx.x + k * T] = make_uint4(w, w, w, w);
    }
#pragma unroll
    for (int k = 0; k < SIGNS; ++k) {
        const int j = threadIdx.x + k * T;
        const u32 w = iq2_sign_selectors(iq2_signs(j / PER));
        t[IQ2_SIGNS_AT / 16 + j] = make_uint4(w, w, w, w);
    }
}

// The table word whose index is the bits of `shifted` under `mask` (the index already
// shifted to IQ2_ENTRY · index), in this lane's copy: `base` is the table's offset plus
// 4·lane. One mask-and-or gives the address.
__device__ __forceinline__ u32 iq2_entry(u32 shifted, u32 mask, u32 base) {
    return *(const u32*)(gemv_smem + ((shifted & mask) | base));
}

// Four signed IQ2_XXS values from the selectors in the low 16 bits of `sel`.
__device__ __forceinline__ u32 iq2_values4(u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(IQ2_MAGS_LO), "r"(IQ2_MAGS_HI), "r"(sel));
    return r;
}

// `v` shifted left by `s` (right when negative).
__device__ __forceinline__ u32 shl(u32 v, int s) { return s >= 0 ? v << s : v >> -s; }

struct Seg {
    Planes w;
    Planes w2;          // pair: the second matrix (up)
    const float* bias;  // optional, length rows
    float* out;         // rows values (dot + bias)
    float* out2;        // pair: second dot
    float* out3;        // pair: silu(out) * out2
    float* acc;         // optional: acc[r] += value
    i32 type;
    i32 type2;
    i32 rows;
    i32 row0;           // first global row of this segment
    float lim;          // pair: the reference's clamp (silu_ref)
    i32 silu_ref;       // pair: silu(min(gate, lim))·clamp(up) in the references' arithmetic
};

struct GemvParams {
    Seg seg[3];
    const float* x;       // input, n_in values
    const float* norm_w;  // optional RMSNorm weight (n_in)
    float* h_out;         // optional: the normalized input, written by block 0
    i32 n_in;
    i32 total_rows;
    i32 nseg;
    i32 need;             // NEED_A32 | NEED_AK
    float eps;
    i32 prefetch;         // rows each warp prefetches into L2 ahead
};

// The activation in shared memory.
struct Act {
    const i8* q32;   // int8 values, Q8_0/Q8_1 scaling
    const i8* qk;    // int8 values, Q8_K scaling
    const float* d32;
    const float* s32;
    const float* dk;
    const i32* bs;   // Q8_K sums of 16
    u32 grid_at, signs_at;  // IQ2_XXS tables: offset + 4·lane, this lane's copy
};

// ggml get_scale_min_k4 for the sub-block pair (2j, 2j+1) over the 12 scale bytes held
// as three words, without branches: the pair's bytes sit at the same 16-bit position
// (16·(j&1)) of each word. For j < 2: scales = bytes 2j, 2j+1 & 63, mins = bytes
// 2j+4, 2j+5 & 63. For j ≥ 2 the low four bits come from bytes 2j+4, 2j+5 (the scale's
// low nibble, the min's high nibble) and the top two bits from the top bits of bytes
// 2j-4, 2j-3 (scales) and 2j, 2j+1 (mins).
__device__ __forceinline__ void scale_min_pair(int j, u32 s0, u32 s1, u32 s2, int* sc0, int* m0, int* sc1, int* m1) {
    const u32 sh = 16 * (j & 1);
    const u32 a = s0 >> sh, b = s1 >> sh, c = s2 >> sh;
    const bool hi = j >= 2;
    const u32 lo_mask = hi ? 0x0F0Fu : 0x3F3Fu, top_mask = hi ? 0x3030u : 0u;
    const u32 sc = ((hi ? c : a) & lo_mask) | ((a >> 2) & top_mask);
    const u32 m = ((hi ? c >> 4 : b) & lo_mask) | ((b >> 2) & top_mask);
    *sc0 = sc & 0xFF;
    *sc1 = (sc >> 8) & 0xFF;
    *m0 = m & 0xFF;
    *m1 = (m >> 8) & 0xFF;
}

__device__ __forceinline__ int dot4(uint4 w, int4 a, int s) {
    s = __dp4a((int)w.x, a.x, s);
    s = __dp4a((int)w.y, a.y, s);
    s = __dp4a((int)w.z, a.z, s);
    s = __dp4a((int)w.w, a.w, s);
    return s;
}

__device__ __forceinline__ uint4 map4(uint4 v, u32 mask, int shift) {
    return make_uint4((v.x >> shift) & mask, (v.y >> shift) & mask, (v.z >> shift) & mask, (v.w >> shift) & mask);
}

__device__ __forceinline__ uint4 or4(uint4 a, uint4 b) { return make_uint4(a.x | b.x, a.y | b.y, a.z | b.z, a.w | b.w); }

__device__ __forceinline__ uint4 sub4(uint4 a, u32 c) {
    return make_uint4(__vsub4(a.x, c), __vsub4(a.y, c), __vsub4(a.z, c), __vsub4(a.w, c));
}

__device__ __forceinline__ int4 lds16(const i8* p) { return *(const int4*)p; }

// ---- one 32-weight unit per type: load (global) then dot (with the shared activation)

// One unit of 32 weights per type: `load` (global) then `dot` (with the shared
// activation). UPB units per block; `u` is the unit within its block.

// Q4_0: unit = block of 32. Elements 0..15 are low nibbles, 16..31 high nibbles.
struct UQ4_0 {
    static constexpr int UPB = 1;
    uint4 q; u16 d;
    __device__ void load(const Planes& w, i64 gb, int) {
        q = *(const uint4*)(w.p[1] + gb * 16);
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b, int) const {
        const i8* x = a.q32 + b * 32;
        int s = dot4(sub4(map4(q, 0x0F0F0F0Fu, 0), 0x08080808u), lds16(x), 0);
        s = dot4(sub4(map4(q, 0x0F0F0F0Fu, 4), 0x08080808u), lds16(x + 16), s);
        return __fmul_rn(h2f(d), a.d32[b]) * (float)s;
    }
};

struct UQ4_1 {
    static constexpr int UPB = 1;
    uint4 q; u32 dm;
    __device__ void load(const Planes& w, i64 gb, int) {
        q = *(const uint4*)(w.p[1] + gb * 16);
        dm = ld_u32(w.p[0] + gb * 4);
    }
    __device__ float dot(const Act& a, int b, int) const {
        const i8* x = a.q32 + b * 32;
        int s = dot4(map4(q, 0x0F0F0F0Fu, 0), lds16(x), 0);
        s = dot4(map4(q, 0x0F0F0F0Fu, 4), lds16(x + 16), s);
        return __fmul_rn(h2f(dm & 0xFFFF), a.d32[b]) * (float)s + h2f(dm >> 16) * a.s32[b];
    }
};

struct UQ5_0 {
    static constexpr int UPB = 1;
    uint4 q; u32 qh; u16 d;
    __device__ void load(const Planes& w, i64 gb, int) {
        q = *(const uint4*)(w.p[2] + gb * 16);
        qh = ld_u32(w.p[1] + gb * 4);
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b, int) const {
        const i8* x = a.q32 + b * 32;
        const uint4 hl = make_uint4(spread4(qh) << 4, spread4(qh >> 4) << 4, spread4(qh >> 8) << 4, spread4(qh >> 12) << 4);
        const uint4 hh = make_uint4(spread4(qh >> 16) << 4, spread4(qh >> 20) << 4, spread4(qh >> 24) << 4,
                                    spread4(qh >> 28) << 4);
        int s = dot4(sub4(or4(map4(q, 0x0F0F0F0Fu, 0), hl), 0x10101010u), lds16(x), 0);
        s = dot4(sub4(or4(map4(q, 0x0F0F0F0Fu, 4), hh), 0x10101010u), lds16(x + 16), s);
        return __fmul_rn(h2f(d), a.d32[b]) * (float)s;
    }
};

struct UQ8_0 {
    static constexpr int UPB = 1;
    uint4 q0, q1; u16 d;
    __device__ void load(const Planes& w, i64 gb, int) {
        q0 = *(const uint4*)(w.p[1] + gb * 32);
        q1 = *(const uint4*)(w.p[1] + gb * 32 + 16);
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b, int) const {
        const i8* x = a.q32 + b * 32;
        int s = dot4(q0, lds16(x), 0);
        s = dot4(q1, lds16(x + 16), s);
        return __fmul_rn(h2f(d), a.d32[b]) * (float)s;
    }
};

// Q4_K: 8 units per 256-block; unit u covers qs bytes [32j+16h, +16) with j = u/2,
// h = u%2: low nibbles are elements 64j+16h.. (sub-block 2j), high nibbles elements
// 64j+32+16h.. (sub-block 2j+1).
struct UQ4_K {
    static constexpr int UPB = 8;
    uint4 q; u32 dm, s0, s1, s2;
    __device__ void load(const Planes& w, i64 gb, int u) {
        q = *(const uint4*)(w.p[2] + gb * 128 + 16 * u);
        dm = ld_u32(w.p[0] + gb * 4);
        const u8* sp = w.p[1] + gb * 12;
        s0 = ld_u32(sp); s1 = ld_u32(sp + 4); s2 = ld_u32(sp + 8);
    }
    __device__ float dot(const Act& a, int b, int u) const {
        const int j = u >> 1, h = u & 1;
        int sc0, m0, sc1, m1;
        scale_min_pair(j, s0, s1, s2, &sc0, &m0, &sc1, &m1);
        const i8* x = a.qk + b * 256 + 64 * j + 16 * h;
        const int i0 = dot4(map4(q, 0x0F0F0F0Fu, 0), lds16(x), 0);
        const int i1 = dot4(map4(q, 0x0F0F0F0Fu, 4), lds16(x + 32), 0);
        const i32* bs = a.bs + b * 16 + 4 * j + h;
        const float da = a.dk[b];
        return da * (h2f(dm & 0xFFFF) * (float)(sc0 * i0 + sc1 * i1) - h2f(dm >> 16) * (float)(m0 * bs[0] + m1 * bs[2]));
    }
};

struct UQ5_K {
    static constexpr int UPB = 8;
    uint4 q, qh; u32 dm, s0, s1, s2;
    __device__ void load(const Planes& w, i64 gb, int u) {
        q = *(const uint4*)(w.p[3] + gb * 128 + 16 * u);
        qh = *(const uint4*)(w.p[2] + gb * 32 + 16 * (u & 1));
        dm = ld_u32(w.p[0] + gb * 4);
        const u8* sp = w.p[1] + gb * 12;
        s0 = ld_u32(sp); s1 = ld_u32(sp + 4); s2 = ld_u32(sp + 8);
    }
    __device__ float dot(const Act& a, int b, int u) const {
        const int j = u >> 1, h = u & 1;
        int sc0, m0, sc1, m1;
        scale_min_pair(j, s0, s1, s2, &sc0, &m0, &sc1, &m1);
        const uint4 lo = or4(map4(q, 0x0F0F0F0Fu, 0), make_uint4(((qh.x >> (2 * j)) & 0x01010101u) << 4,
            ((qh.y >> (2 * j)) & 0x01010101u) << 4, ((qh.z >> (2 * j)) & 0x01010101u) << 4, ((qh.w >> (2 * j)) & 0x01010101u) << 4));
        const uint4 hi = or4(map4(q, 0x0F0F0F0Fu, 4), make_uint4(((qh.x >> (2 * j + 1)) & 0x01010101u) << 4,
            ((qh.y >> (2 * j + 1)) & 0x01010101u) << 4, ((qh.z >> (2 * j + 1)) & 0x01010101u) << 4,
            ((qh.w >> (2 * j + 1)) & 0x01010101u) << 4));
        const i8* x = a.qk + b * 256 + 64 * j + 16 * h;
        const int i0 = dot4(lo, lds16(x), 0);
        const int i1 = dot4(hi, lds16(x + 32), 0);
        const i32* bs = a.bs + b * 16 + 4 * j + h;
        const float da = a.dk[b];
        return da * (h2f(dm & 0xFFFF) * (float)(sc0 * i0 + sc1 * i1) - h2f(dm >> 16) * (float)(m0 * bs[0] + m1 * bs[2]));
    }
};

// Q6_K: unit u: half n = u/4, t = u%4: ql bytes [64n+16t, +16), qh bytes
// [32n+16(t&1), +16). Low nibbles are elements e = 128n + 32(t>>1) + 16(t&1) + i with
// qh bits 2(t>>1); high nibbles elements e+64 with qh bits 2(t>>1)+4.
struct UQ6_K {
    static constexpr int UPB = 8;
    uint4 ql, qh; i8 sc0, sc1; u16 d;
    __device__ void load(const Planes& w, i64 gb, int u) {
        const int n = u >> 2, t = u & 3;
        ql = *(const uint4*)(w.p[0] + gb * 128 + 64 * n + 16 * t);
        qh = *(const uint4*)(w.p[1] + gb * 64 + 32 * n + 16 * (t & 1));
        const int e = 128 * n + 32 * (t >> 1) + 16 * (t & 1);
        const i8* sc = (const i8*)(w.p[2] + gb * 16);
        sc0 = sc[e >> 4];
        sc1 = sc[(e + 64) >> 4];
        d = ld_u16(w.p[3] + gb * 2);
    }
    __device__ float dot(const Act& a, int b, int u) const {
        const int n = u >> 2, t = u & 3;
        const int e = 128 * n + 32 * (t >> 1) + 16 * (t & 1);
        const int hs = 2 * (t >> 1);
        const uint4 lo = sub4(or4(map4(ql, 0x0F0F0F0Fu, 0), make_uint4(((qh.x >> hs) & 0x03030303u) << 4,
            ((qh.y >> hs) & 0x03030303u) << 4, ((qh.z >> hs) & 0x03030303u) << 4, ((qh.w >> hs) & 0x03030303u) << 4)), 0x20202020u);
        const uint4 hi = sub4(or4(map4(ql, 0x0F0F0F0Fu, 4), make_uint4(((qh.x >> (hs + 4)) & 0x03030303u) << 4,
            ((qh.y >> (hs + 4)) & 0x03030303u) << 4, ((qh.z >> (hs + 4)) & 0x03030303u) << 4,
            ((qh.w >> (hs + 4)) & 0x03030303u) << 4)), 0x20202020u);
        const i8* x = a.qk + b * 256 + e;
        const int i0 = dot4(lo, lds16(x), 0);
        const int i1 = dot4(hi, lds16(x + 64), 0);
        return a.dk[b] * h2f(d) * (float)(sc0 * i0 + sc1 * i1);
    }
};

// Q2_K: 8 units per 256-block; unit u: half n = u/4, pair j = u%4: elements
// 128n + 32j .. +32 are bits 2j of qs[32n .. 32n+32); sub-blocks of 16 with scale bytes
// 8n+2j and 8n+2j+1 (low nibble: scale, high nibble: min), as ggml's
// vec_dot_q2_K_q8_K: d·Σ sc·q·x − dmin·Σ m·bsum.
struct UQ2_K {
    static constexpr int UPB = 8;
    uint4 q0, q1; u32 dm; u16 sc;
    __device__ void load(const Planes& w, i64 gb, int u) {
        const int n = u >> 2, j = u & 3;
        q0 = *(const uint4*)(w.p[1] + gb * 64 + 32 * n);
        q1 = *(const uint4*)(w.p[1] + gb * 64 + 32 * n + 16);
        dm = ld_u32(w.p[2] + gb * 4);
        sc = ld_u16(w.p[0] + gb * 16 + 8 * n + 2 * j);
    }
    __device__ float dot(const Act& a, int b, int u) const {
        const int n = u >> 2, j = u & 3;
        const int e = 128 * n + 32 * j;
        const i8* x = a.qk + b * 256 + e;
        const int s0 = dot4(map4(q0, 0x03030303u, 2 * j), lds16(x), 0);
        const int s1 = dot4(map4(q1, 0x03030303u, 2 * j), lds16(x + 16), 0);
        const int sc0 = sc & 0xFF, sc1 = sc >> 8;
        const i32* bs = a.bs + b * 16 + e / 16;
        const int isum = (sc0 & 0xF) * s0 + (sc1 & 0xF) * s1;
        const int msum = (sc0 >> 4) * bs[0] + (sc1 >> 4) * bs[1];
        return a.dk[b] * (h2f(dm & 0xFFFF) * (float)isum - h2f(dm >> 16) * (float)msum);
    }
};

// IQ2_XXS: unit = one 32-element sub-block (8 bytes of qs): four groups of 8 values,
// each a grid entry (8 magnitudes) with its 7 sign bits (the eighth makes the parity
// even), both decoded through the shared-memory tables.
struct UIQ2_XXS {
    static constexpr int UPB = 8;
    u32 aux0, aux1; u16 d;
    __device__ void load(const Planes& w, i64 gb, int u) {
        const uint2 v = *(const uint2*)(w.p[1] + gb * 64 + 8 * u);
        aux0 = v.x; aux1 = v.y;
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b, int u) const {
        const int4* x = (const int4*)(a.qk + b * 256 + 32 * u);
        const int4 x0 = x[0], x1 = x[1];
        const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        int s = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 sel = iq2_entry(shl(aux0, 7 - 8 * l), 0xFFu * IQ2_ENTRY, a.grid_at) |
                            iq2_entry(shl(aux1, 7 - 7 * l), 0x7Fu * IQ2_ENTRY, a.signs_at);
            s = __dp4a((int)iq2_values4(sel), xs[2 * l], s);
            s = __dp4a((int)iq2_values4(sel >> 16), xs[2 * l + 1], s);
        }
        const int ls = 2 * (int)(aux1 >> 28) + 1;
        return 0.125f * h2f(d) * a.dk[b] * (float)(s * ls);
    }
};

// The loads of G steps of M matrices: unit u of blocks b, b + BS, … (BS = 32 / UPB
// blocks per step) of the row starting at block g0.
template <class U, int G, int M>
__device__ __forceinline__ void load_group(U (&x)[M][G], const Planes& w0, const Planes& w1, i64 g0, int b, int u) {
    constexpr int BS = 32 / U::UPB;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int k = 0; k < G; ++k) x[m][k].load(m ? w1 : w0, g0 + b + BS * k, u);
}

// Row dots of M matrices (one, or a gate/up pair read together) for one output row:
// lane l takes units l, l+32, …; as 32 is a multiple of UPB, a lane's unit within its
// blocks is the same at every step and its block advances by 32/UPB per step, so
// addresses are a base plus constants. Each group of steps issues all its loads (of
// every matrix) before the first dot: 4 steps while they last, then 2, then 1.
template <class U, int G, int M>
__device__ __forceinline__ void dot_group(const Planes& w0, const Planes& w1, i64 g0, const Act& a, int i, int u,
                                          float* acc) {
    constexpr int BS = 32 / U::UPB;  // blocks per step
    const int b = i / U::UPB;
    U x[M][G];
    load_group<U, G, M>(x, w0, w1, g0, b, u);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float s = x[m][0].dot(a, b, u);
#pragma unroll
        for (int k = 1; k < G; ++k) s += x[m][k].dot(a, b + BS * k, u);
        acc[m] += s;
    }
}

template <class U, int M, int GMAX>
__device__ __forceinline__ void row_units(const Planes& w0, const Planes& w1, i64 row, int nb, const Act& a,
                                          int lane, float* acc) {
    const i64 g0 = row * nb;
    const int n = nb * U::UPB, u = lane % U::UPB;
    int i = lane;
    if constexpr (GMAX >= 4)
        for (; i + 96 < n; i += 128) dot_group<U, 4, M>(w0, w1, g0, a, i, u, acc);
    if constexpr (GMAX >= 2) {
        for (; i + 32 < n; i += 64) dot_group<U, 2, M>(w0, w1, g0, a, i, u, acc);
    }
    for (; i < n; i += 32) dot_group<U, 1, M>(w0, w1, g0, a, i, u, acc);
}

// The unit of each weight type (and its block size in elements).
template <int TY> struct UnitOf;
template <> struct UnitOf<T_Q4_0> { using U = UQ4_0; static constexpr int BE = 32; };
template <> struct UnitOf<T_Q4_1> { using U = UQ4_1; static constexpr int BE = 32; };
template <> struct UnitOf<T_Q5_0> { using U = UQ5_0; static constexpr int BE = 32; };
template <> struct UnitOf<T_Q8_0> { using U = UQ8_0; static constexpr int BE = 32; };
template <> struct UnitOf<T_Q4_K> { using U = UQ4_K; static constexpr int BE = 256; };
template <> struct UnitOf<T_Q5_K> { using U = UQ5_K; static constexpr int BE = 256; };
template <> struct UnitOf<T_Q6_K> { using U = UQ6_K; static constexpr int BE = 256; };
template <> struct UnitOf<T_IQ2_XXS> { using U = UIQ2_XXS; static constexpr int BE = 256; };
template <> struct UnitOf<T_Q2_K> { using U = UQ2_K; static constexpr int BE = 256; };

// out[m] = row `row` of matrix m (w0, and w1 when M = 2, both of type TY) · activation;
// loads are issued in groups of up to GMAX steps per matrix.
template <int TY, int M, int GMAX = 4>
__device__ __forceinline__ void row_dot_t(const Planes& w0, const Planes& w1, i64 row, int n_in, const Act& a,
                                          int lane, float* out) {
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    row_units<typename UnitOf<TY>::U, M, GMAX>(w0, w1, row, n_in / UnitOf<TY>::BE, a, lane, acc);
#pragma unroll
    for (int m = 0; m < M; ++m) out[m] = warp_sum(acc[m]);
}

// The same for a type known only at run time.
template <int M>
__device__ void row_dot(int ty, const Planes& w0, const Planes& w1, i64 row, int n_in, const Act& a, int lane,
                        float* out) {
    switch (ty) {
    case T_Q4_0: row_dot_t<T_Q4_0, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q4_1: row_dot_t<T_Q4_1, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q5_0: row_dot_t<T_Q5_0, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q8_0: row_dot_t<T_Q8_0, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q4_K: row_dot_t<T_Q4_K, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q5_K: row_dot_t<T_Q5_K, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q6_K: row_dot_t<T_Q6_K, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_IQ2_XXS: row_dot_t<T_IQ2_XXS, M>(w0, w1, row, n_in, a, lane, out); break;
    case T_Q2_K: row_dot_t<T_Q2_K, M>(w0, w1, row, n_in, a, lane, out); break;
    default:
#pragma unroll
        for (int m = 0; m < M; ++m) out[m] = 0.f;
        break;
    }
}

// Bytes of one row in each plane of a type (for the L2 prefetch).
__device__ void plane_row_bytes(int ty, int n_in, u32* b) {
    const int n32 = n_in / 32, n256 = n_in / 256;
    b[0] = b[1] = b[2] = b[3] = 0;
    switch (ty) {
    case T_Q4_0: b[0] = 2 * n32; b[1] = 16 * n32; break;
    case T_Q4_1: b[0] = 4 * n32; b[1] = 16 * n32; break;
    case T_Q5_0: b[0] = 2 * n32; b[1] = 4 * n32; b[2] = 16 * n32; break;
    case T_Q8_0: b[0] = 2 * n32; b[1] = 32 * n32; break;
    case T_Q4_K: b[0] = 4 * n256; b[1] = 12 * n256; b[2] = 128 * n256; break;
    case T_Q5_K: b[0] = 4 * n256; b[1] = 12 * n256; b[2] = 32 * n256; b[3] = 128 * n256; break;
    case T_Q6_K: b[0] = 128 * n256; b[1] = 64 * n256; b[2] = 16 * n256; b[3] = 2 * n256; break;
    case T_IQ2_XXS: b[0] = 2 * n256; b[1] = 64 * n256; break;
    case T_Q2_K: b[0] = 16 * n256; b[1] = 64 * n256; b[2] = 4 * n256; break;
    default: break;
    }
}

__device__ void prefetch_row(int ty, const Planes& w, i64 row, int n_in) {
    u32 b[4];
    plane_row_bytes(ty, n_in, b);
#pragma unroll
    for (int p = 0; p < 4; ++p)
        if (b[p]) prefetch_l2(w.p[p] + row * b[p], b[p]);
}

__device__ __forceinline__ int find_seg(const GemvParams& P, int gr) {
    int s = 0;
    while (s + 1 < P.nseg && gr >= P.seg[s + 1].row0) ++s;
    return s;
}

// Prefetches global row `gr` (both matrices of a pair) into L2.
__device__ void prefetch_global_row(const GemvParams& P, int gr, int n) {
    if (gr >= P.total_rows) return;
    const Seg& s = P.seg[find_seg(P, gr)];
    const int r = gr - s.row0;
    prefetch_row(s.type, s.w, r, n);
    if (s.out3) prefetch_row(s.type2, s.w2, r, n);
}

// Shared-memory bytes for an input of n values (the host computes the same), after the
// IQ2_XXS tables when the launch needs them.
__device__ __forceinline__ int act_smem_offsets(int n, int need, int* o) {
    o[0] = need & NEED_IQ2 ? IQ2_TABLE_BYTES : 0;  // q32: n bytes
    o[1] = o[0] + n;                   // qk: n bytes
    o[2] = o[0] + 2 * n;               // d32: n/32 floats
    o[3] = o[2] + 4 * (n / 32);        // s32: n/32 floats
    o[4] = o[3] + 4 * (n / 32);        // bs: n/16 ints (16-byte aligned when 256 | n)
    o[5] = o[4] + 4 * (n / 16);        // dk: n/256 (+1) floats
    return o[5] + 4 * (n / 256 + 1);
}

// Writes row r's results: a pair's gate, up and silu(gate)·up; otherwise the value
// (+bias), also added to `acc` when the launch fuses the residual add.
__device__ __forceinline__ void epilogue(const Seg& s, int r, float v, float u) {
    if (s.out3) {
        s.out[r] = v;
        s.out2[r] = u;
        s.out3[r] = s.silu_ref ? __fmul_rn(siluf_ref(fminf(v, s.lim)), fmaxf(fminf(u, s.lim), -s.lim))
                               : __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), u);
    } else {
        if (s.bias) v = __fadd_rn(v, s.bias[r]);
        s.out[r] = v;
        if (s.acc) s.acc[r] = __fadd_rn(s.acc[r], v);
    }
}

// Quantizes chunk c (elements 256c .. 256c+255; lane l holds 8l .. 8l+7) of the
// input, optionally normalized, into the formats the launch needs; block 0 writes the
// normalized values to h_out.
__device__ __forceinline__ void quantize_chunk(const GemvParams& P, const Act& a, int c, int lane, const float4* xa,
                                               const float4* wa, float scale, bool write_h) {
    const int n = P.n_in;
    const int i0 = c * 256 + lane * 8;
    const bool valid = i0 < n;
    float v[8] = {xa[0].x, xa[0].y, xa[0].z, xa[0].w, xa[1].x, xa[1].y, xa[1].z, xa[1].w};
    if (P.norm_w) {
        const float w[8] = {wa[0].x, wa[0].y, wa[0].z, wa[0].w, wa[1].x, wa[1].y, wa[1].z, wa[1].w};
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(__fmul_rn(v[k], scale), w[k]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = valid ? v[k] : 0.f;
    if (write_h && valid) {
        *(float4*)(P.h_out + i0) = make_float4(v[0], v[1], v[2], v[3]);
        *(float4*)(P.h_out + i0 + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
    if (P.need & NEED_A32) {
        // ggml's x86 quantize_row_q8_0/q8_1 over blocks of 32 (4 lanes): multiplier
        // 127/amax, ties to even.
        float am = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) am = fmaxf(am, fabsf(v[k]));
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
        const float d = am / 127.f;
        const float id = am != 0.f ? 127.f / am : 0.f;
        int sum = 0;
        u32 packed[2] = {0, 0};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = max(-128, min(127, __float2int_rn(__fmul_rn(v[k], id))));
            sum += q;
            packed[k >> 2] |= (u32)(q & 0xFF) << (8 * (k & 3));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (valid) {
            *(uint2*)(a.q32 + i0) = make_uint2(packed[0], packed[1]);
            if ((lane & 3) == 0) {
                ((float*)a.d32)[i0 / 32] = round_f16(d);
                ((float*)a.s32)[i0 / 32] = round_f16(__fmul_rn((float)sum, d));
            }
        }
    }
    if (P.need & NEED_AK) {
        // ggml's quantize_row_q8_K_ref over the chunk: the first element of largest
        // magnitude gives the scale.
        float amax = 0.f, mx = 0.f;
        int idx = 0x7fffffff;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float ax = fabsf(v[k]);
            if (ax > amax) { amax = ax; mx = v[k]; idx = lane * 8 + k; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
            const float om = __shfl_xor_sync(0xffffffffu, mx, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
        }
        int sum = 0;
        u32 packed[2] = {0, 0};
        if (amax != 0.f) {
            const float iscale = -127.f / mx;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int q = min(127, __float2int_rn(__fmul_rn(iscale, v[k])));
                sum += q;
                packed[k >> 2] |= (u32)(q & 0xFF) << (8 * (k & 3));
            }
            if (lane == 0) ((float*)a.dk)[c] = 1.0f / iscale;
        } else if (lane == 0) {
            ((float*)a.dk)[c] = 0.f;
        }
        *(uint2*)(a.qk + i0) = make_uint2(packed[0], packed[1]);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        if ((lane & 1) == 0) ((i32*)a.bs)[c * 16 + (lane >> 1)] = sum;
    }
}

// The shared-memory activation: the input (RMS-normalized when the launch fuses a
// norm) quantized to the formats the segments' types need. Loads are issued for up to
// CB chunks per warp before any is processed, so the prologue costs one or two
// memory round trips. Ends with a block barrier.
template <int CB = 4>
__device__ __forceinline__ Act build_act(const GemvParams& P, double* red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = P.n_in;
    u8* smem = gemv_smem;
    int off[6];
    act_smem_offsets(n, P.need, off);
    Act a;
    a.grid_at = IQ2_GRID_AT + 4 * (lane % IQ2_COPIES);
    a.signs_at = IQ2_SIGNS_AT + 4 * (lane % IQ2_COPIES);
    a.q32 = (const i8*)(smem + off[0]);
    a.qk = (const i8*)(smem + off[1]);
    a.d32 = (const float*)(smem + off[2]);
    a.s32 = (const float*)(smem + off[3]);
    a.bs = (const i32*)(smem + off[4]);
    a.dk = (const float*)(smem + off[5]);

    const bool write_h = P.h_out && blockIdx.x == 0;
    const int nch = (n + 255) / 256;
    const int nw = blockDim.x >> 5;
    // The input (and the norm weight) of chunks base, base + nw, … (CB of them; lane l
    // holds elements 8l .. 8l+7 of each), loads issued together.
    auto load = [&](int base, float4 (&xa)[CB][2], float4 (&wa)[CB][2]) {
#pragma unroll
        for (int k = 0; k < CB; ++k) {
            const int i = (base + k * nw) * 256 + lane * 8;
            xa[k][0] = xa[k][1] = wa[k][0] = wa[k][1] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (base + k * nw < nch && i < n) {
                xa[k][0] = *(const float4*)(P.x + i);
                xa[k][1] = *(const float4*)(P.x + i + 4);
                if (P.norm_w) {
                    wa[k][0] = *(const float4*)(P.norm_w + i);
                    wa[k][1] = *(const float4*)(P.norm_w + i + 4);
                }
            }
        }
    };
    float4 xa[CB][2], wa[CB][2];
    load(warp, xa, wa);

    // RMSNorm scale (f64 sum of f32 squares, as the CPU backend): the warp's first CB
    // chunks from the registers the quantization then uses (the whole input when
    // n ≤ 256·CB·warps), any further ones loaded for the sum alone.
    float scale = 1.f;
    if (P.norm_w) {
        double ss = 0.0;
        auto squares = [&](const float4 (&v)[CB][2]) {
#pragma unroll
            for (int k = 0; k < CB; ++k)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    ss += (double)__fmul_rn(v[k][h].x, v[k][h].x) + (double)__fmul_rn(v[k][h].y, v[k][h].y) +
                          (double)__fmul_rn(v[k][h].z, v[k][h].z) + (double)__fmul_rn(v[k][h].w, v[k][h].w);
        };
        squares(xa);
        for (int base = warp + CB * nw; base < nch; base += CB * nw) {
            float4 ya[CB][2], yw[CB][2];
            load(base, ya, yw);
            squares(ya);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        if (tid == 0) {
            double t = 0.0;
            for (int w = 0; w < nw; ++w) t += red[w];
            red[0] = t;
        }
        __syncthreads();
        const float mean = (float)(red[0] / (double)n);
        scale = 1.0f / sqrtf(mean + P.eps);
    }
    for (int base = warp; base < nch; base += CB * nw) {
        if (base != warp) load(base, xa, wa);
#pragma unroll
        for (int k = 0; k < CB; ++k)
            if (base + k * nw < nch) quantize_chunk(P, a, base + k * nw, lane, xa[k], wa[k], scale, write_h);
    }
    __syncthreads();
    return a;
}

// The kernel body. TY < 0: any mix of types (q/k/v of different types, a gate/up
// pair of two types); otherwise every segment is of type TY, and PAIR says whether
// it is a gate/up pair (one segment) or plain segments. A typed kernel holds one type's
// registers only, so more blocks fit on a multiprocessor; GMAX bounds its load groups
// (steps per matrix) and CB the input chunks a warp loads at once in the prologue, both
// to stay within those registers.
template <int TY, bool PAIR, int GMAX, int CB>
__device__ __forceinline__ void gemv_body(const GemvParams& P) {
    __shared__ double red[GEMV_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wpb = blockDim.x >> 5;
    const int gwarp = blockIdx.x * wpb + warp, nwarps = gridDim.x * wpb;
    const int n = P.n_in;

    // Weights do not depend on earlier kernels: start pulling this warp's first rows
    // into L2 while the previous kernel finishes.
    if (lane == 0)
        for (int k = 0; k < max(1, P.prefetch); ++k) prefetch_global_row(P, gwarp + k * nwarps, n);
    if (P.need & NEED_IQ2) fill_iq2_tables();
    pdl_wait();
    pdl_trigger();

    const Act a = build_act<CB>(P, red);
    // Plain typed segments: a plane's row bytes, to reach the row nwarps further on.
    u32 rb_[4];
    if constexpr (TY >= 0 && !PAIR) plane_row_bytes(TY, n, rb_);

    for (int gr = gwarp; gr < P.total_rows; gr += nwarps) {
        if (lane == 0 && P.prefetch > 0) prefetch_global_row(P, gr + P.prefetch * nwarps, n);
        const Seg& s = P.seg[find_seg(P, gr)];
        const int r = gr - s.row0;
        float v[2] = {0.f, 0.f};
        if constexpr (TY >= 0 && !PAIR) {
            // Rows gr and gr + nwarps of one segment together, their loads in flight at
            // once (the second "matrix" is the first moved down by nwarps rows); each row's
            // sum runs in the single row's order.
            const int r2 = r + nwarps;
            if (r2 < s.rows) {
                if (lane == 0 && P.prefetch > 0) prefetch_global_row(P, gr + (P.prefetch + 1) * nwarps, n);
                row_dot_t<TY, 2, GMAX>(s.w, expert_planes(s.w, rb_, nwarps), r, n, a, lane, v);
                if (lane == 0) {
                    epilogue(s, r, v[0], 0.f);
                    epilogue(s, r2, v[1], 0.f);
                }
                gr += nwarps;
                continue;
            }
        }
        if constexpr (TY >= 0) {
            if constexpr (PAIR) row_dot_t<TY, 2, GMAX>(s.w, s.w2, r, n, a, lane, v);
            else row_dot_t<TY, 1, GMAX>(s.w, s.w, r, n, a, lane, v);
        } else if (s.out3 && s.type2 == s.type) {
            row_dot<2>(s.type, s.w, s.w2, r, n, a, lane, v);
        } else {
            row_dot<1>(s.type, s.w, s.w, r, n, a, lane, v);
            if (s.out3) row_dot<1>(s.type2, s.w2, s.w2, r, n, a, lane, v + 1);
        }
        if (lane == 0) epilogue(s, r, v[0], v[1]);
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, 2) gemv(const GemvParams P) {
    gemv_body<-1, false, 4, 4>(P);
}

// Typed kernels gemv_<type>[_pair] (src/kernels.rs names them): plain segments with
// MINB blocks per SM and load groups of up to G steps; a gate/up pair with MINB2 blocks
// and groups of G2 steps per matrix; prologue chunks CB. Plain segments take two rows
// per warp at once while the segment has them (three blocks per SM: 80 registers, Q5_K,
// Q6_K and Q8_0 spill 4–16 bytes; at four blocks and one row, 64 registers, GLM-5.3 and
// DeepSeek-V4 decoded 3–4 % slower, docs/benchmarks.md); pairs 76–80 registers. Measured
// against the generic kernel on the H200: faster on rows of 4096 inputs, slower on 14336
// (groups of 2 steps cost round trips there), so lower.rs uses them for rows of at most
// 8192 inputs and launches of plain segments of at most 64M weights.
#define GEMV_KERNEL(NAME, TY, PAIR, MINB, G, CB)                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB) NAME(const GemvParams P) {     \
        gemv_body<TY, PAIR, G, CB>(P);                                                                 \
    }
#define GEMV_TYPED(SUF, MINB, G, MINB2, G2, CB)                                                        \
    GEMV_KERNEL(gemv_q4_0##SUF, T_Q4_0, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q4_0_pair##SUF, T_Q4_0, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_q4_1##SUF, T_Q4_1, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q4_1_pair##SUF, T_Q4_1, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_q5_0##SUF, T_Q5_0, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q5_0_pair##SUF, T_Q5_0, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_q8_0##SUF, T_Q8_0, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q8_0_pair##SUF, T_Q8_0, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_q4_k##SUF, T_Q4_K, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q4_k_pair##SUF, T_Q4_K, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_q5_k##SUF, T_Q5_K, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q5_k_pair##SUF, T_Q5_K, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_q6_k##SUF, T_Q6_K, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q6_k_pair##SUF, T_Q6_K, true, MINB2, G2, CB)                                     \
    GEMV_KERNEL(gemv_iq2_xxs##SUF, T_IQ2_XXS, false, MINB, G, CB)                                     \
    GEMV_KERNEL(gemv_iq2_xxs_pair##SUF, T_IQ2_XXS, true, MINB2, G2, CB)                               \
    GEMV_KERNEL(gemv_q2_k##SUF, T_Q2_K, false, MINB, G, CB)                                           \
    GEMV_KERNEL(gemv_q2_k_pair##SUF, T_Q2_K, true, MINB2, G2, CB)

GEMV_TYPED(, 3, 2, 3, 2, 2)

// ---- routed experts: one launch for every (token, chosen expert) pair ----

// The experts of an MoE layer as one stacked tensor per projection: matrix `e` of a
// plane starts `e·estride[p]` bytes after plane p's start.
struct ExpertGemv {
    Planes w, w2;       // gate (and up) or down
    i64 estride[MAX_PLANES], estride2[MAX_PLANES];
    i32 type, type2;
    const float* x;     // activations: tokens × x_tstride (gate/up) or (token, slot) rows (down)
    i32 x_tstride;
    const i32* ids;     // n_tok × k chosen experts (null: matrix j for slot j, per-head weights)
    i32 k, n_in, rows, need, rb;
    float lim;          // SwiGLU clamp (INFINITY: none)
    float* out;         // gate/up: (token, slot) × rows of silu(gate)·up; down: (token, slot) × rows
};

// Pair mode (gate/up): blockIdx.y = t·k + j; each warp computes rows of the chosen
// expert's gate and up for token t and writes round(round(silu(min(g, lim)))·clamp(u)).
// Down mode (`w2` unused): the activation is row t·k + j of `x` and the output its
// product with the expert's down matrix.
// Row dots of an expert launch: of type TY, or (TY < 0) of a type known at run time.
template <int TY, int M>
__device__ __forceinline__ void expert_dot(int ty, const Planes& w0, const Planes& w1, i64 row, int n_in,
                                           const Act& a, int lane, float* out) {
    if constexpr (TY >= 0) row_dot_t<TY, M>(w0, w1, row, n_in, a, lane, out);
    else row_dot<M>(ty, w0, w1, row, n_in, a, lane, out);
}

// Rows r0, r0 + stride, … below `rows` of M matrices (w0, and w1 for a gate/up pair) for
// one warp, each row's units in groups of G steps, with the loads of the next group issued
// before the dots of the current one, across rows: the warp always has weight loads in
// flight. Each row's per-lane sum runs over its units in step order, as `dot_group`'s over
// one group. `emit(r, v)` gets row r's M sums (on every lane). The caller checks that a
// row is whole groups: nb % (BS·G) == 0.
template <class U, int G, int M, class Emit>
__device__ __forceinline__ void pipelined_rows(const Planes& w0, const Planes& w1, int nb, int r0, int stride,
                                               int rows, const Act& a, int lane, Emit emit) {
    constexpr int BS = 32 / U::UPB;
    const int u = lane % U::UPB, b0 = lane / U::UPB;
    const int gpr = nb / (BS * G);  // groups per row
    int lr = r0, lg = 0;            // the next group to load
    int cr = r0, cg = 0;            // the next group to compute
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.f;
    U x0[M][G], x1[M][G];
    auto load = [&](U (&x)[M][G]) {
        load_group<U, G, M>(x, w0, w1, (i64)lr * nb, b0 + lg * BS * G, u);
        if (++lg == gpr) { lg = 0; lr += stride; }
    };
    auto compute = [&](const U (&x)[M][G]) {
        const int b = b0 + cg * BS * G;
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int k = 0; k < G; ++k) acc[m] += x[m][k].dot(a, b + BS * k, u);
        if (++cg < gpr) return;
        float v[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            v[m] = warp_sum(acc[m]);
            acc[m] = 0.f;
        }
        emit(cr, v);
        cg = 0;
        cr += stride;
    };
    if (lr < rows) load(x0);
    while (cr < rows) {
        if (lr < rows) load(x1);
        compute(x0);
        if (cr >= rows) break;
        if (lr < rows) load(x0);
        compute(x1);
    }
}

template <int TY, bool PAIR>
__device__ __forceinline__ void expert_body(const ExpertGemv& E) {
    __shared__ double red[GEMV_WARPS];
    if (E.need & NEED_IQ2) fill_iq2_tables();
    pdl_wait();
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int pair = blockIdx.y;
    const int t = pair / E.k;
    const int e = E.ids ? E.ids[pair] : pair % E.k;  // no ids: pair j of a row uses matrix j
    GemvParams G;
    G.x = E.x + (PAIR ? (i64)t * E.x_tstride : (i64)pair * E.x_tstride);
    G.norm_w = nullptr;
    G.h_out = nullptr;
    G.n_in = E.n_in;
    G.need = E.need;
    G.eps = 0.f;
    const Planes w0 = expert_planes(E.w, E.estride, e);
    const Planes w1 = PAIR ? expert_planes(E.w2, E.estride2, e) : w0;
    const int wpb = blockDim.x >> 5, stride = gridDim.x * wpb;
    // The warp's first rows (both matrices of a pair, or the two rows of a down step)
    // start into L2 while the activation is built.
    const int r0 = blockIdx.x * wpb + warp;
    if (lane == 0 && r0 < E.rows) {
        prefetch_row(E.type, w0, r0, E.n_in);
        if (PAIR) prefetch_row(E.type2, w1, r0, E.n_in);
        else if (r0 + stride < E.rows) prefetch_row(E.type, w0, r0 + stride, E.n_in);
    }
    const Act a = build_act<4>(G, red);
    // Row r's value: round(round(silu(min(g, lim)))·clamp(u)) of a pair, else the dot.
    auto emit = [&](int r, const float* v) {
        if (lane != 0) return;
        float o;
        if (PAIR) {
            const float g = fminf(rnd(v[0], E.rb), E.lim);
            const float u = fmaxf(fminf(rnd(v[1], E.rb), E.lim), -E.lim);
            o = rnd(__fmul_rn(rnd(siluf_ref(g), E.rb), u), E.rb);
        } else {
            o = rnd(v[0], E.rb);
        }
        E.out[(i64)pair * E.rows + r] = o;
    };
    // Typed gate/up pairs pipeline their rows (experts_gate_up 31.1 → 28.4 µs on the H200);
    // the down products keep two rows' loads at once below (pipelined they measured
    // 21.3–21.8 µs against 19.7–20.5).
    if constexpr (TY >= 0 && PAIR) {
        using U = typename UnitOf<TY>::U;
        constexpr int G = 2;
        const int nb = E.n_in / UnitOf<TY>::BE;
        if (nb % (32 / U::UPB * G) == 0) {
            pipelined_rows<U, G, 2>(w0, w1, nb, r0, stride, E.rows, a, lane, emit);
            return;
        }
    }
    u32 rb_[4];
    if (!PAIR) plane_row_bytes(E.type, E.n_in, rb_);
    for (int r = r0; r < E.rows; r += PAIR ? stride : 2 * stride) {
        float v[2] = {0.f, 0.f};
        if (PAIR && (TY >= 0 || E.type == E.type2)) {
            expert_dot<TY, 2>(E.type, w0, w1, r, E.n_in, a, lane, v);
        } else if (PAIR) {
            row_dot<1>(E.type, w0, w0, r, E.n_in, a, lane, v);
            row_dot<1>(E.type2, w1, w1, r, E.n_in, a, lane, v + 1);
        } else if (r + stride < E.rows) {
            // Rows r and r + stride together (their loads in flight at once): the second
            // "matrix" is the first moved down by `stride` rows.
            expert_dot<TY, 2>(E.type, w0, expert_planes(w0, rb_, stride), r, E.n_in, a, lane, v);
            if (lane == 0) E.out[(i64)pair * E.rows + r + stride] = rnd(v[1], E.rb);
        } else {
            expert_dot<TY, 1>(E.type, w0, w0, r, E.n_in, a, lane, v);
        }
        emit(r, v);
    }
}


// The down products of one token's experts and, in the last of the k blocks of each row
// block to finish, the weighted sum over the experts (moe_reduce's arithmetic) plus an
// optional addend (the shared expert's output): decode's experts down, sum and add in one
// launch.
struct ReduceTail {
    const float* w;     // routing weights [k]
    float* out;         // [rows]
    const float* add;   // optional [rows], added after the rounding
    u32* counters;      // [gridDim.x], zero between launches
    i32 rb;
    i32 wrb;            // round each weighted expert output (bf16 routing weights)
};

template <int TY>
__device__ __forceinline__ void experts_down_sum(const ExpertGemv& E, const ReduceTail& R) {
    __shared__ bool last;
    __shared__ int order[32];  // k ≤ 32 (moe_route_op refuses more)
    expert_body<TY, false>(E);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(R.counters + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x == 0) {
        R.counters[blockIdx.x] = 0u;
        slot_order(E.ids, E.k, order);
    }
    __syncthreads();
    // The rows this block's warps computed (blockIdx.x·wpb + warp plus multiples of the
    // grid's warps), one per thread; r grows with q, so the first past the end ends the
    // loop.
    const int wpb = blockDim.x >> 5, stride = gridDim.x * wpb;
    for (int q = threadIdx.x;; q += blockDim.x) {
        const int r = blockIdx.x * wpb + q % wpb + (q / wpb) * stride;
        if (r >= E.rows) break;
        float o = rnd(sum_sorted(E.out, E.rows, order, R.w, E.k, r, R.wrb), R.rb);
        if (R.add) o = __fadd_rn(o, R.add[r]);
        R.out[r] = o;
    }
}

// The expert kernels: any type (TY < 0, two blocks per SM), or typed gemv_experts_*_<type>
// holding one type's registers (src/kernels.rs names them): gate/up pairs MINB blocks per
// SM, down products MINB_DOWN. Q2_K (the q2 mix's down type) takes four blocks of down
// products in 64 registers without spills (ptxas -v); Q5_0, Q5_K, Q6_K and Q8_0 would
// spill 64–240 bytes, IQ2_XXS 76 inside its row loop (the prmt decode holds two constant
// registers), and a pair at four blocks 96–160.
#define EXPERT_KERNELS(SUF, TY, MINB, MINB_DOWN)                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)                               \
        gemv_experts_gate_up##SUF(const ExpertGemv E) {                                                \
        expert_body<TY, true>(E);                                                                      \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB_DOWN)                          \
        gemv_experts_down##SUF(const ExpertGemv E) {                                                   \
        expert_body<TY, false>(E);                                                                     \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB_DOWN)                          \
        gemv_experts_down_sum##SUF(const ExpertGemv E, const ReduceTail R) {                           \
        experts_down_sum<TY>(E, R);                                                                    \
    }

EXPERT_KERNELS(, -1, 2, 2)
EXPERT_KERNELS(_q4_0, T_Q4_0, 3, 3)
EXPERT_KERNELS(_q4_1, T_Q4_1, 3, 3)
EXPERT_KERNELS(_q5_0, T_Q5_0, 3, 3)
EXPERT_KERNELS(_q8_0, T_Q8_0, 3, 3)
EXPERT_KERNELS(_q4_k, T_Q4_K, 3, 3)
EXPERT_KERNELS(_q5_k, T_Q5_K, 3, 3)
EXPERT_KERNELS(_q6_k, T_Q6_K, 3, 3)
EXPERT_KERNELS(_iq2_xxs, T_IQ2_XXS, 3, 3)
EXPERT_KERNELS(_q2_k, T_Q2_K, 3, 4)
