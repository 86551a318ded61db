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
// (gate, up) `out3[r] = silu(gate)·up`. Every buffer the unfused operations would
// write is still written (h, q, k, v, gate, up), so the fused step computes the same
// values as the op-by-op one.

#include "common.cuh"

#define GEMV_WARPS 8
#define NEED_A32 1
#define NEED_AK 2

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
    i32 prefetch;         // rows each warp prefetches into L2 ahead of the one it computes
};

// The activation in shared memory.
struct Act {
    const i8* q32;   // int8 values, Q8_0/Q8_1 scaling
    const i8* qk;    // int8 values, Q8_K scaling
    const float* d32;
    const float* s32;
    const float* dk;
    const i32* bs;   // Q8_K sums of 16
};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }

__device__ __forceinline__ void prefetch_l2(const void* p, u32 bytes) {
    // Bulk prefetch needs a 16-byte aligned start and a multiple of 16 bytes.
    u64 a = (u64)p;
    u64 b = a + bytes;
    a &= ~15ull;
    b = (b + 15) & ~15ull;
    if (b > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((u32)(b - a)) : "memory");
}

__device__ __forceinline__ int byte_of(u32 s0, u32 s1, u32 s2, int k) {
    const u32 w = k < 4 ? s0 : (k < 8 ? s1 : s2);
    return (w >> (8 * (k & 3))) & 0xFF;
}

// ggml get_scale_min_k4 over the 12 scale bytes held as three words.
__device__ __forceinline__ void scale_min_w(int j, u32 s0, u32 s1, u32 s2, int* sc, int* m) {
    if (j < 4) {
        *sc = byte_of(s0, s1, s2, j) & 63;
        *m = byte_of(s0, s1, s2, j + 4) & 63;
    } else {
        *sc = (byte_of(s0, s1, s2, j + 4) & 0xF) | ((byte_of(s0, s1, s2, j - 4) >> 6) << 4);
        *m = (byte_of(s0, s1, s2, j + 4) >> 4) | ((byte_of(s0, s1, s2, j) >> 6) << 4);
    }
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

// Q4_0: unit = block of 32. Elements 0..15 are low nibbles, 16..31 high nibbles.
struct UQ4_0 {
    uint4 q; u16 d;
    __device__ void load(const Planes& w, i64 gb) {
        q = *(const uint4*)(w.p[1] + gb * 16);
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b) const {
        const i8* x = a.q32 + b * 32;
        int s = dot4(sub4(map4(q, 0x0F0F0F0Fu, 0), 0x08080808u), lds16(x), 0);
        s = dot4(sub4(map4(q, 0x0F0F0F0Fu, 4), 0x08080808u), lds16(x + 16), s);
        return __fmul_rn(h2f(d), a.d32[b]) * (float)s;
    }
};

struct UQ4_1 {
    uint4 q; u32 dm;
    __device__ void load(const Planes& w, i64 gb) {
        q = *(const uint4*)(w.p[1] + gb * 16);
        dm = ld_u32(w.p[0] + gb * 4);
    }
    __device__ float dot(const Act& a, int b) const {
        const i8* x = a.q32 + b * 32;
        int s = dot4(map4(q, 0x0F0F0F0Fu, 0), lds16(x), 0);
        s = dot4(map4(q, 0x0F0F0F0Fu, 4), lds16(x + 16), s);
        return __fmul_rn(h2f(dm & 0xFFFF), a.d32[b]) * (float)s + h2f(dm >> 16) * a.s32[b];
    }
};

struct UQ5_0 {
    uint4 q; u32 qh; u16 d;
    __device__ void load(const Planes& w, i64 gb) {
        q = *(const uint4*)(w.p[2] + gb * 16);
        qh = ld_u32(w.p[1] + gb * 4);
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b) const {
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
    uint4 q0, q1; u16 d;
    __device__ void load(const Planes& w, i64 gb) {
        q0 = *(const uint4*)(w.p[1] + gb * 32);
        q1 = *(const uint4*)(w.p[1] + gb * 32 + 16);
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b) const {
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
        scale_min_w(2 * j, s0, s1, s2, &sc0, &m0);
        scale_min_w(2 * j + 1, s0, s1, s2, &sc1, &m1);
        const i8* x = a.qk + b * 256 + 64 * j + 16 * h;
        const int i0 = dot4(map4(q, 0x0F0F0F0Fu, 0), lds16(x), 0);
        const int i1 = dot4(map4(q, 0x0F0F0F0Fu, 4), lds16(x + 32), 0);
        const i32* bs = a.bs + b * 16 + 4 * j + h;
        const float da = a.dk[b];
        return da * (h2f(dm & 0xFFFF) * (float)(sc0 * i0 + sc1 * i1) - h2f(dm >> 16) * (float)(m0 * bs[0] + m1 * bs[2]));
    }
};

struct UQ5_K {
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
        scale_min_w(2 * j, s0, s1, s2, &sc0, &m0);
        scale_min_w(2 * j + 1, s0, s1, s2, &sc1, &m1);
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

// IQ2_XXS: unit = one 32-element sub-block (8 bytes of qs).
struct UIQ2_XXS {
    u32 aux0, aux1; u16 d;
    __device__ void load(const Planes& w, i64 gb, int u) {
        const uint2 v = *(const uint2*)(w.p[1] + gb * 64 + 8 * u);
        aux0 = v.x; aux1 = v.y;
        d = ld_u16(w.p[0] + gb * 2);
    }
    __device__ float dot(const Act& a, int b, int u) const {
        const i8* x = a.qk + b * 256 + 32 * u;
        int s = 0;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u64 g = IQ2XXS_GRID[(aux0 >> (8 * l)) & 0xFF];
            const u32 signs = iq2_signs((aux1 >> (7 * l)) & 127);
            const u32 m0 = spread4(signs) * 0xFFu, m1 = spread4(signs >> 4) * 0xFFu;
            const u32 v0 = __vsub4((u32)g ^ m0, m0), v1 = __vsub4((u32)(g >> 32) ^ m1, m1);
            const int2 xa = *(const int2*)(x + 8 * l);
            s = __dp4a((int)v0, xa.x, s);
            s = __dp4a((int)v1, xa.y, s);
        }
        const int ls = 2 * (int)(aux1 >> 28) + 1;
        return 0.125f * h2f(d) * a.dk[b] * (float)(s * ls);
    }
};

// Row dot for 32-blocks (legacy types): unit = block.
template <class U>
__device__ float row_dot32(const Planes& w, i64 row, int nb, const Act& a, int lane) {
    const i64 g0 = row * nb;
    float acc = 0.f;
    int b = lane;
    for (; b + 96 < nb; b += 128) {
        U u0, u1, u2, u3;
        u0.load(w, g0 + b); u1.load(w, g0 + b + 32); u2.load(w, g0 + b + 64); u3.load(w, g0 + b + 96);
        acc += u0.dot(a, b) + u1.dot(a, b + 32) + u2.dot(a, b + 64) + u3.dot(a, b + 96);
    }
    for (; b < nb; b += 32) {
        U u0;
        u0.load(w, g0 + b);
        acc += u0.dot(a, b);
    }
    return acc;
}

// Row dot for 256-blocks (K types, IQ2_XXS): 8 units per block.
template <class U>
__device__ float row_dotk(const Planes& w, i64 row, int nb, const Act& a, int lane) {
    const i64 g0 = row * nb;
    const int n = nb * 8;
    float acc = 0.f;
    int i = lane;
    for (; i + 96 < n; i += 128) {
        U u0, u1, u2, u3;
        u0.load(w, g0 + (i >> 3), i & 7);
        u1.load(w, g0 + ((i + 32) >> 3), i & 7);
        u2.load(w, g0 + ((i + 64) >> 3), i & 7);
        u3.load(w, g0 + ((i + 96) >> 3), i & 7);
        acc += u0.dot(a, i >> 3, i & 7) + u1.dot(a, (i + 32) >> 3, i & 7) + u2.dot(a, (i + 64) >> 3, i & 7) +
               u3.dot(a, (i + 96) >> 3, i & 7);
    }
    for (; i < n; i += 32) {
        U u0;
        u0.load(w, g0 + (i >> 3), i & 7);
        acc += u0.dot(a, i >> 3, i & 7);
    }
    return acc;
}

__device__ float row_dot(int ty, const Planes& w, i64 row, int n_in, const Act& a, int lane) {
    float v = 0.f;
    switch (ty) {
    case T_Q4_0: v = row_dot32<UQ4_0>(w, row, n_in / 32, a, lane); break;
    case T_Q4_1: v = row_dot32<UQ4_1>(w, row, n_in / 32, a, lane); break;
    case T_Q5_0: v = row_dot32<UQ5_0>(w, row, n_in / 32, a, lane); break;
    case T_Q8_0: v = row_dot32<UQ8_0>(w, row, n_in / 32, a, lane); break;
    case T_Q4_K: v = row_dotk<UQ4_K>(w, row, n_in / 256, a, lane); break;
    case T_Q5_K: v = row_dotk<UQ5_K>(w, row, n_in / 256, a, lane); break;
    case T_Q6_K: v = row_dotk<UQ6_K>(w, row, n_in / 256, a, lane); break;
    case T_IQ2_XXS: v = row_dotk<UIQ2_XXS>(w, row, n_in / 256, a, lane); break;
    default: break;
    }
    return warp_sum(v);
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

// Shared-memory bytes for an input of n values (the host computes the same).
__device__ __forceinline__ int act_smem_offsets(int n, int* o) {
    o[0] = 0;                          // q32: n bytes
    o[1] = n;                          // qk: n bytes
    o[2] = 2 * n;                      // d32: n/32 floats
    o[3] = o[2] + 4 * (n / 32);        // s32: n/32 floats
    o[4] = o[3] + 4 * (n / 32);        // dk: n/256 (+1) floats
    o[5] = o[4] + 4 * (n / 256 + 1);   // bs: n/16 ints
    return o[5] + 4 * (n / 16);
}

// Writes row r's results: a pair's gate, up and silu(gate)·up; otherwise the value
// (+bias), also added to `acc` when the launch fuses the residual add.
__device__ __forceinline__ void epilogue(const Seg& s, int r, float v, float u) {
    if (s.out3) {
        s.out[r] = v;
        s.out2[r] = u;
        s.out3[r] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), u);
    } else {
        if (s.bias) v = __fadd_rn(v, s.bias[r]);
        s.out[r] = v;
        if (s.acc) s.acc[r] = __fadd_rn(s.acc[r], v);
    }
}

// The shared-memory activation: the input (RMS-normalized when the launch fuses a
// norm) quantized to the formats the segments' types need. Block 0 writes the
// normalized input to `h_out`. Ends with a block barrier.
__device__ Act build_act(const GemvParams& P, u8* smem, double* red) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = P.n_in;
    int off[6];
    act_smem_offsets(n, off);
    i8* q32 = (i8*)(smem + off[0]);
    i8* qk = (i8*)(smem + off[1]);
    float* d32 = (float*)(smem + off[2]);
    float* s32 = (float*)(smem + off[3]);
    float* dk = (float*)(smem + off[4]);
    i32* bs = (i32*)(smem + off[5]);

    // RMSNorm scale (f64 sum of f32 squares, as the CPU backend).
    float scale = 1.f;
    if (P.norm_w) {
        double ss = 0.0;
        for (int i = tid; i < n; i += blockDim.x) {
            const float v = P.x[i];
            ss += (double)__fmul_rn(v, v);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        if (tid == 0) {
            double t = 0.0;
            for (int w = 0; w < GEMV_WARPS; ++w) t += red[w];
            red[0] = t;
        }
        __syncthreads();
        const float mean = (float)(red[0] / (double)n);
        scale = 1.0f / sqrtf(mean + P.eps);
    }
    const bool write_h = P.h_out && blockIdx.x == 0;

    if (P.need & NEED_A32) {
        for (int b = warp; b < n / 32; b += GEMV_WARPS) {
            const int i = b * 32 + lane;
            float v = P.x[i];
            if (P.norm_w) v = __fmul_rn(__fmul_rn(v, scale), P.norm_w[i]);
            if (write_h) P.h_out[i] = v;
            // ggml's x86 quantize_row_q8_0/q8_1: multiplier 127/amax, ties to even.
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.f;
            const float id = amax != 0.f ? 127.f / amax : 0.f;
            const int q = max(-128, min(127, __float2int_rn(__fmul_rn(v, id))));
            q32[i] = (i8)q;
            const int sum = warp_sum_i(q);
            if (lane == 0) {
                d32[b] = round_f16(d);
                s32[b] = round_f16(__fmul_rn((float)sum, d));
            }
        }
    }
    if (P.need & NEED_AK) {
        const bool h_here = write_h && !(P.need & NEED_A32);
        for (int b = warp; b < n / 256; b += GEMV_WARPS) {
            float v[8];
            float amax = 0.f, mx = 0.f;
            int idx = 0x7fffffff;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const int i = b * 256 + lane * 8 + k;
                float t = P.x[i];
                if (P.norm_w) t = __fmul_rn(__fmul_rn(t, scale), P.norm_w[i]);
                if (h_here) P.h_out[i] = t;
                v[k] = t;
                const float ax = fabsf(t);
                if (ax > amax) { amax = ax; mx = t; idx = lane * 8 + k; }
            }
            // The first element of largest magnitude wins, as in ggml's serial scan.
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float oa = __shfl_xor_sync(0xffffffffu, amax, o);
                const float om = __shfl_xor_sync(0xffffffffu, mx, o);
                const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
                if (oa > amax || (oa == amax && oi < idx)) { amax = oa; mx = om; idx = oi; }
            }
            int sum = 0;
            if (amax == 0.f) {
#pragma unroll
                for (int k = 0; k < 8; ++k) qk[b * 256 + lane * 8 + k] = 0;
                if (lane == 0) dk[b] = 0.f;
            } else {
                const float iscale = -127.f / mx;
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    const int q = min(127, __float2int_rn(__fmul_rn(iscale, v[k])));
                    qk[b * 256 + lane * 8 + k] = (i8)q;
                    sum += q;
                }
                if (lane == 0) dk[b] = 1.0f / iscale;
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            if ((lane & 1) == 0) bs[b * 16 + (lane >> 1)] = sum;
        }
    }
    __syncthreads();

    Act a;
    a.q32 = q32; a.qk = qk; a.d32 = d32; a.s32 = s32; a.dk = dk; a.bs = bs;
    return a;
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv(const GemvParams P) {
    extern __shared__ __align__(16) u8 smem[];
    __shared__ double red[GEMV_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gwarp = blockIdx.x * GEMV_WARPS + warp, nwarps = gridDim.x * GEMV_WARPS;
    const int n = P.n_in;

    // Weights do not depend on earlier kernels: start pulling this warp's first rows
    // into L2 (bulk prefetches cost one instruction per plane and keep many bytes in
    // flight without holding registers).
    if (lane == 0)
        for (int k = 0; k < max(1, P.prefetch); ++k) prefetch_global_row(P, gwarp + k * nwarps, n);
    pdl_wait();
    pdl_trigger();

    const Act a = build_act(P, smem, red);

    for (int gr = gwarp; gr < P.total_rows; gr += nwarps) {
        if (lane == 0 && P.prefetch > 0) prefetch_global_row(P, gr + P.prefetch * nwarps, n);
        const Seg& s = P.seg[find_seg(P, gr)];
        const int r = gr - s.row0;
        const float v = row_dot(s.type, s.w, r, n, a, lane);
        const float u = s.out3 ? row_dot(s.type2, s.w2, r, n, a, lane) : 0.f;
        if (lane == 0) epilogue(s, r, v, u);
    }
}

// ---- the pipelined variant: weights stream through shared memory with cp.async
//
// Each thread keeps GEMV_PIPE units in flight in its own shared-memory slots (one unit:
// the 16-32 quant bytes plus the block's scale words), so the bytes in flight per SM
// are bounded by shared memory instead of registers. A warp walks its rows as one
// sequence of steps (each step: one unit per lane; a row is ceil(n/1024) steps, a pair
// row twice that), issuing step s + GEMV_PIPE - 1 before computing step s. The first
// steps are issued before waiting for the previous kernel, overlapping the activation
// prologue with the first weight loads.

#define GEMV_PIPE 6
#define GEMV_SLOT 64

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp8(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_pipe() { asm volatile("cp.async.wait_group %0;" ::"n"(GEMV_PIPE - 1) : "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// The aligned word holding block gb's 2-byte field, and the field from it.
__device__ __forceinline__ const u8* half_word(const u8* plane, i64 gb) { return plane + ((gb * 2) & ~3ll); }
__device__ __forceinline__ u16 pick_half(u32 w, i64 gb) { return (gb & 1) ? (u16)(w >> 16) : (u16)(w & 0xFFFF); }

// Copies unit (gb, u) into the slot at shared address dst (layouts: see slot_dot).
__device__ void issue_unit(int ty, const Planes& w, i64 gb, int u, u32 dst) {
    switch (ty) {
    case T_Q4_0: cp16(dst, w.p[1] + gb * 16); cp4(dst + 16, half_word(w.p[0], gb)); break;
    case T_Q4_1: cp16(dst, w.p[1] + gb * 16); cp4(dst + 16, w.p[0] + gb * 4); break;
    case T_Q5_0:
        cp16(dst, w.p[2] + gb * 16);
        cp4(dst + 16, w.p[1] + gb * 4);
        cp4(dst + 20, half_word(w.p[0], gb));
        break;
    case T_Q8_0:
        cp16(dst, w.p[1] + gb * 32);
        cp16(dst + 16, w.p[1] + gb * 32 + 16);
        cp4(dst + 32, half_word(w.p[0], gb));
        break;
    case T_Q4_K: {
        const u8* sc = w.p[1] + gb * 12;
        cp16(dst, w.p[2] + gb * 128 + 16 * u);
        cp4(dst + 16, w.p[0] + gb * 4);
        cp4(dst + 20, sc); cp4(dst + 24, sc + 4); cp4(dst + 28, sc + 8);
        break;
    }
    case T_Q5_K: {
        const u8* sc = w.p[1] + gb * 12;
        cp16(dst, w.p[3] + gb * 128 + 16 * u);
        cp16(dst + 16, w.p[2] + gb * 32 + 16 * (u & 1));
        cp4(dst + 32, w.p[0] + gb * 4);
        cp4(dst + 36, sc); cp4(dst + 40, sc + 4); cp4(dst + 44, sc + 8);
        break;
    }
    case T_Q6_K: {
        const int n = u >> 2, t = u & 3;
        cp16(dst, w.p[0] + gb * 128 + 64 * n + 16 * t);
        cp16(dst + 16, w.p[1] + gb * 64 + 32 * n + 16 * (t & 1));
        cp16(dst + 32, w.p[2] + gb * 16);
        cp4(dst + 48, half_word(w.p[3], gb));
        break;
    }
    case T_IQ2_XXS: cp8(dst, w.p[1] + gb * 64 + 8 * u); cp4(dst + 8, half_word(w.p[0], gb)); break;
    default: break;
    }
}

// The dot product of a unit in slot `s` (b: block within the row, for the activation).
__device__ float slot_dot(int ty, const u8* s, i64 gb, int b, int u, const Act& a) {
    switch (ty) {
    case T_Q4_0: { UQ4_0 x; x.q = *(const uint4*)s; x.d = pick_half(*(const u32*)(s + 16), gb); return x.dot(a, b); }
    case T_Q4_1: { UQ4_1 x; x.q = *(const uint4*)s; x.dm = *(const u32*)(s + 16); return x.dot(a, b); }
    case T_Q5_0: {
        UQ5_0 x;
        x.q = *(const uint4*)s; x.qh = *(const u32*)(s + 16); x.d = pick_half(*(const u32*)(s + 20), gb);
        return x.dot(a, b);
    }
    case T_Q8_0: {
        UQ8_0 x;
        x.q0 = *(const uint4*)s; x.q1 = *(const uint4*)(s + 16); x.d = pick_half(*(const u32*)(s + 32), gb);
        return x.dot(a, b);
    }
    case T_Q4_K: {
        UQ4_K x;
        x.q = *(const uint4*)s; x.dm = *(const u32*)(s + 16);
        x.s0 = *(const u32*)(s + 20); x.s1 = *(const u32*)(s + 24); x.s2 = *(const u32*)(s + 28);
        return x.dot(a, b, u);
    }
    case T_Q5_K: {
        UQ5_K x;
        x.q = *(const uint4*)s; x.qh = *(const uint4*)(s + 16); x.dm = *(const u32*)(s + 32);
        x.s0 = *(const u32*)(s + 36); x.s1 = *(const u32*)(s + 40); x.s2 = *(const u32*)(s + 44);
        return x.dot(a, b, u);
    }
    case T_Q6_K: {
        UQ6_K x;
        const int n = u >> 2, t = u & 3;
        const int e = 128 * n + 32 * (t >> 1) + 16 * (t & 1);
        const i8* sc = (const i8*)(s + 32);
        x.ql = *(const uint4*)s; x.qh = *(const uint4*)(s + 16);
        x.sc0 = sc[e >> 4]; x.sc1 = sc[(e + 64) >> 4];
        x.d = pick_half(*(const u32*)(s + 48), gb);
        return x.dot(a, b, u);
    }
    case T_IQ2_XXS: {
        UIQ2_XXS x;
        const uint2 v = *(const uint2*)s;
        x.aux0 = v.x; x.aux1 = v.y; x.d = pick_half(*(const u32*)(s + 8), gb);
        return x.dot(a, b, u);
    }
    default: return 0.f;
    }
}

// A position in a warp's step sequence: global row, part (0; 1 = a pair's second
// matrix) and step within the row.
struct Cursor {
    int gr, part, k;
};

// The unit lane `lane` handles at cursor c: its type, matrix, global block, block in
// the row and sub-unit; false when the lane has no unit there (ragged rows).
__device__ __forceinline__ bool unit_at(const GemvParams& P, const Cursor& c, int lane, int units, int* ty,
                                        const Planes** w, i64* gb, int* b, int* u) {
    const Seg& s = P.seg[find_seg(P, c.gr)];
    const int r = c.gr - s.row0;
    *ty = c.part ? s.type2 : s.type;
    *w = c.part ? &s.w2 : &s.w;
    const int ui = lane + 32 * c.k;
    if (ui >= units) return false;
    if (block_elems(*ty) == 32) {
        *b = ui; *u = 0; *gb = (i64)r * units + ui;
    } else {
        *b = ui >> 3; *u = ui & 7; *gb = (i64)r * (units / 8) + *b;
    }
    return true;
}

__device__ __forceinline__ void advance(const GemvParams& P, Cursor& c, int steps, int nwarps) {
    if (++c.k < steps) return;
    c.k = 0;
    if (P.seg[find_seg(P, c.gr)].out3 && c.part == 0) {
        c.part = 1;
    } else {
        c.part = 0;
        c.gr += nwarps;
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_pipe(const GemvParams P) {
    extern __shared__ __align__(16) u8 smem[];
    __shared__ double red[GEMV_WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gwarp = blockIdx.x * GEMV_WARPS + warp, nwarps = gridDim.x * GEMV_WARPS;
    const int n = P.n_in, units = n / 32, steps = (units + 31) / 32;
    int off[6];
    u8* pipe = smem + ((act_smem_offsets(n, off) + 15) & ~15);
    u8* my = pipe + tid * GEMV_SLOT;  // slot of stage k: my + k * blockDim.x * GEMV_SLOT
    const int stage_stride = blockDim.x * GEMV_SLOT;

    Cursor is = {gwarp, 0, 0};
    // Issues the next step into `stage` (an empty group past the end keeps counts even).
    auto issue = [&](int stage) {
        if (is.gr < P.total_rows) {
            int ty, b, u;
            const Planes* w;
            i64 gb;
            if (unit_at(P, is, lane, units, &ty, &w, &gb, &b, &u)) issue_unit(ty, *w, gb, u, smem_addr(my + stage * stage_stride));
            advance(P, is, steps, nwarps);
        }
        cp_commit();
    };
    for (int st = 0; st < GEMV_PIPE - 1; ++st) issue(st);
    pdl_wait();
    pdl_trigger();
    const Act a = build_act(P, smem, red);

    Cursor cs = {gwarp, 0, 0};
    float acc = 0.f, first = 0.f;
    int stage = 0;
    while (cs.gr < P.total_rows) {
        issue((stage + GEMV_PIPE - 1) % GEMV_PIPE);
        cp_wait_pipe();
        int ty, b, u;
        const Planes* w;
        i64 gb;
        if (unit_at(P, cs, lane, units, &ty, &w, &gb, &b, &u)) acc += slot_dot(ty, my + stage * stage_stride, gb, b, u, a);
        stage = stage + 1 == GEMV_PIPE ? 0 : stage + 1;
        if (cs.k + 1 == steps) {
            const float v = warp_sum(acc);
            acc = 0.f;
            const Seg& s = P.seg[find_seg(P, cs.gr)];
            if (s.out3 && cs.part == 0) {
                first = v;
            } else if (lane == 0) {
                const int r = cs.gr - s.row0;
                if (s.out3) epilogue(s, r, first, v); else epilogue(s, r, v, 0.f);
            }
        }
        advance(P, cs, steps, nwarps);
    }
    cp_wait_all();
}
