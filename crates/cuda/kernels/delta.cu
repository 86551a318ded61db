// Delta-rule linear attention (Kimi delta attention of GLM-5.3, the gated delta net of
// Qwen3.5) on the device, in the CPU backend's arithmetic
// (`engine/src/backend/cpu/delta.rs`):
//
// 1. `delta_conv`: the causal depthwise conv of the pre-conv q|k|v rows continuing the
//    conv state, SiLU, rounded (`rb`); the pre-conv rows go to the journal.
// 2. `delta_inputs`: per token and value head the kernel inputs — q, k L2-normalised
//    (q times dk^-½), v, the log decays g from the gate projection + dt_bias, beta —
//    into scratch and the journal.
// 3. `delta_conv_state`: the conv state moves to the call's last Kc−1 pre-conv rows.
// 4. `delta_recurrent_<dk>`: the recurrence token by token, one block per value head,
//    thread j holding column j of the head's state `[dk, dv]` in registers, the inputs
//    staged in shared memory a chunk of tokens ahead:
//    S ← S·exp(g), δ = (v − kᵀS)·β, S ← S + k⊗δ, o = qᵀS. The chunked form of the
//    references is not used: the recurrence computes the same up to f32 rounding
//    (doc §4.6). `delta_replay_conv` and `delta_replay_<dk>` run steps 3 and 4 from the
//    journal (no output) for several layers in one launch each.
// 5. `delta_step`: one token with as many key as value heads (KDA's decode step) as one
//    launch: 1-4 per value head in the same arithmetic, bit for bit, the state in shared
//    memory; optionally preceded by the float products that form the head's gate inputs
//    and followed by the gated output norm of the head (`gated_norm`).

#include "common.cuh"

#define GATE_LOWER_BOUND 0
#define GATE_SOFTPLUS 1
// The largest conv kernel and head size (the host checks them), and the largest conv
// kernel of `delta_step` (its conv inputs live in registers).
#define DELTA_KC 9
#define DELTA_D 256
#define STEP_KC 4
// The most threads of a `delta_step` block (a head's gate products take rows × lanes).
#define DELTA_STEP_THREADS 512

struct DeltaParams {
    // Inputs of the call, rows row0 .. row0+n of: q, k [·, hk·dk], v [·, hv·dv],
    // g0 [·, hv·gc], b [·, hv].
    const float* q;
    const float* k;
    const float* v;
    const float* g0;
    const float* b;
    const float* conv_w[3];  // q, k, v kernels [channels, kc]
    const float* dt_bias;    // [hv·gc]
    const float* decay;      // [hv]
    float* conv_state;       // [kc−1, C]
    float* mixed;            // scratch [n, C]
    // Kernel inputs: scratch [n, ·] or, for a replay, the journal.
    float* kq;
    float* kk;
    float* kv;
    float* kg;
    float* kb;
    // The journal (null: none) written by the forward kernels.
    float* jpre;
    float* jk;
    float* jv;
    float* jg;
    float* jb;
    const StepInfo* step;
    float* out;  // [·, hv·dv], rows row0 .. (null: replay)
    float* S;    // [hv, dk, dv]
    // `delta_step` with the gated output norm (null gz: none): gout = gated_norm(out, gz, gw).
    const float* gz;
    const float* gw;
    float* gout;
    i32 row0, n, hk, hv, dk, dv, kc, gc, gate, rb, cap;
    // Replay: kernel inputs at journal slot (src_pos + t) mod cap; forward: src_cap 0.
    i32 src_cap, src_pos;
    float lb;
    float geps;
    i32 gsilu;
    i32 early;  // `delta_step`: load the state before the wait for the previous kernel
    // `delta_step`: the products whose rows are g0 (a head's gc rows) and gz (its dv rows),
    // formed by each block for its head first (null w: given).
    FloatSeg g0_prod, gz_prod;
};

__device__ __forceinline__ int qk_len(const DeltaParams& P) { return P.hk * P.dk; }
__device__ __forceinline__ int v_len(const DeltaParams& P) { return P.hv * P.dv; }

// Pre-conv value of channel c for input row r (relative to the call).
__device__ __forceinline__ float pre_val(const DeltaParams& P, int r, int c) {
    const int qk = qk_len(P), vl = v_len(P);
    const i64 row = P.row0 + r;
    if (c < qk) return P.q[row * qk + c];
    if (c < 2 * qk) return P.k[row * qk + c - qk];
    return P.v[row * vl + c - 2 * qk];
}

__device__ __forceinline__ float conv_w(const DeltaParams& P, int c, int s) {
    const int qk = qk_len(P);
    if (c < qk) return P.conv_w[0][c * P.kc + s];
    if (c < 2 * qk) return P.conv_w[1][(c - qk) * P.kc + s];
    return P.conv_w[2][(c - 2 * qk) * P.kc + s];
}

// The log decay of gate channel ch (value head h) from the gate projection's value x0.
__device__ __forceinline__ float delta_gate(const DeltaParams& P, float x0, int ch, int h) {
    const float a = P.decay[h];
    const float x = __fadd_rn(x0, P.dt_bias[ch]);
    return P.gate == GATE_LOWER_BOUND ? __fmul_rn(P.lb, sigmoidf_ref(__fmul_rn(a, x))) : __fmul_rn(-a, softplusf_ref(x));
}

// grid (n, ceil(C/256)): mixed[t, c] = round(silu(Σ_s w[c, s]·full[t + s, c])) where full
// is the conv state's kc−1 rows followed by the call's rows.
extern "C" __global__ void delta_conv(const DeltaParams P) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const int C = 2 * qk_len(P) + v_len(P);
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int hist = P.kc - 1;
    float acc = 0.f;
    for (int s = 0; s < P.kc; ++s) {
        const int fr = t + s;  // row of `full`
        const float x = fr < hist ? P.conv_state[(i64)fr * C + c] : pre_val(P, fr - hist, c);
        acc = __fadd_rn(acc, __fmul_rn(conv_w(P, c, s), x));
    }
    P.mixed[(i64)t * C + c] = rnd(siluf_ref(acc), P.rb);
    if (P.jpre) {
        const int slot = (P.step->pos0 + P.row0 + t) % P.cap;
        P.jpre[(i64)slot * C + c] = pre_val(P, t, c);
    }
}

// grid (n, hv), blockDim ≥ max(dk, dv), a multiple of 32: the kernel inputs of token t
// and value head h.
extern "C" __global__ void delta_inputs(const DeltaParams P) {
    __shared__ double red[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
    const int qk = qk_len(P), vl = v_len(P), C = 2 * qk + vl;
    const int group = P.hv / P.hk, kh = h / group;
    const float* mx = P.mixed + (i64)t * C;
    const int slot = P.jk ? (P.step->pos0 + P.row0 + t) % P.cap : 0;
    // q, k of the key head (written once, by its first value head).
    const float qv = j < P.dk ? mx[kh * P.dk + j] : 0.f;
    const float kv = j < P.dk ? mx[qk + kh * P.dk + j] : 0.f;
    const double qn = block_sum_d((double)__fmul_rn(qv, qv), red);
    const double kn = block_sum_d((double)__fmul_rn(kv, kv), red);
    if (h % group == 0 && j < P.dk) {
        const float qs = __fdiv_rn(qv, sqrtf(__fadd_rn((float)qn, 1e-6f)));
        const float ks = __fdiv_rn(kv, sqrtf(__fadd_rn((float)kn, 1e-6f)));
        P.kq[(i64)t * qk + kh * P.dk + j] = __fmul_rn(qs, __fdiv_rn(1.0f, sqrtf((float)P.dk)));
        P.kk[(i64)t * qk + kh * P.dk + j] = ks;
        if (P.jk) P.jk[(i64)slot * qk + kh * P.dk + j] = ks;
    }
    if (j < P.dv) {
        const float vv = mx[2 * qk + h * P.dv + j];
        P.kv[(i64)t * vl + h * P.dv + j] = vv;
        if (P.jv) P.jv[(i64)slot * vl + h * P.dv + j] = vv;
    }
    const int gl = P.hv * P.gc;
    if (j < P.gc) {
        const int ch = h * P.gc + j;
        const float g = delta_gate(P, P.g0[(i64)(P.row0 + t) * gl + ch], ch, h);
        P.kg[(i64)t * gl + ch] = g;
        if (P.jg) P.jg[(i64)slot * gl + ch] = g;
    }
    if (j == 0) {
        const float be = rnd(sigmoidf_ref(P.b[(i64)(P.row0 + t) * P.hv + h]), P.rb);
        P.kb[(i64)t * P.hv + h] = be;
        if (P.jb) P.jb[(i64)slot * P.hv + h] = be;
    }
}

// One thread per channel: the conv state becomes the last kc−1 rows of (state, rows of
// the call); with `src_cap` (a replay) the rows are journal slots (src_pos + t) mod cap.
__device__ __forceinline__ void conv_state_body(const DeltaParams& P) {
    pdl_wait();
    pdl_trigger();
    const int C = 2 * qk_len(P) + v_len(P);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int hist = P.kc - 1;
    float old[DELTA_KC - 1];
    for (int r = 0; r < hist; ++r) old[r] = P.conv_state[(i64)r * C + c];
    for (int r = 0; r < hist; ++r) {
        const int fr = P.n + r;  // row of full = (state, call rows)
        float x;
        if (fr < hist) x = old[fr];
        else if (P.src_cap) x = P.jpre[(i64)((P.src_pos + fr - hist) % P.src_cap) * C + c];
        else x = pre_val(P, fr - hist, c);
        P.conv_state[(i64)r * C + c] = x;
    }
}

extern "C" __global__ void delta_conv_state(const DeltaParams P) { conv_state_body(P); }

// Tokens whose kernel inputs `recurrent_body` stages in shared memory at once, and the
// largest number of state columns per block (two threads each).
#define REC_TC 8
#define REC_COLS 64

// Rows of a head's state are summed in two halves, [0, DK/2) and [DK/2, DK) of the
// compiled size DK (the smallest of 16, 32, 64, 128 that holds dk): a chain per half,
// then the two added. `recurrent_body` gives each half to its own thread; `delta_step`
// runs the same chains one after the other.
__device__ __forceinline__ int rec_half(int dk) { return dk <= 16 ? 8 : dk <= 32 ? 16 : dk <= 64 ? 32 : 64; }

// a·b + c in the chains and the state update: one rounding (a fused multiply-add) under
// the f32 policy; under bf16 the product rounded first, the CPU backend's arithmetic (with
// fused multiply-adds the bf16 golden master `real_layout_bf16` moved from 1.11 to 1.80,
// over the bound of its reference's own token-by-token spread, 1.1; docs/parity.md).
template <bool FMA>
__device__ __forceinline__ float rec_madd(float a, float b, float c) {
    return FMA ? __fmaf_rn(a, b, c) : __fadd_rn(c, __fmul_rn(a, b));
}

// Where row r of a staged k, q or decay vector lives: the second half 4 floats further,
// so that the two halves' broadcast loads hit different banks.
template <int DK>
__device__ __forceinline__ int rec_at(int r) { return r + (r >= DK / 2 ? 4 : 0); }

// One staged chunk of tokens: k, q and the decays (copied as log decays, then replaced
// by their exp) of the head's key head, v of the block's columns, beta.
template <int DK>
struct RecChunk {
    float k[REC_TC][DK + 4], q[REC_TC][DK + 4], e[REC_TC][DK + 4];
    float v[REC_TC][REC_COLS];
    float beta[REC_TC];
};

// grid (hv, ⌈dv / cols⌉), 2·cols threads (cols ≤ REC_COLS columns per block): thread
// pair (2c, 2c + 1) holds column blockIdx.y·cols + c of the head's state `[dk, dv]`, one
// half of its rows each in registers. DK is the compiled size, P.dk ≤ DK the model's:
// rows i ≥ dk are padding with k = q = 0 and decay 1 (so they never reach u or o) and
// are never stored.
//
// The kernel inputs arrive REC_TC tokens at a time by asynchronous copies into one of two
// chunk buffers while the block computes the other, so a token waits on no global load
// and on no barrier (one barrier per chunk). The chains' products and the state update
// are `rec_madd`s (fused multiply-adds unless the policy is bf16). The order of
// operations per column is `delta_step`'s: the same values bit for bit.
template <int DK, bool FMA>
__device__ __forceinline__ void recurrent_body(const DeltaParams& P, RecChunk<DK> (&buf)[2]) {
    constexpr int DH = DK / 2;
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.x, tid = threadIdx.x, dk = P.dk;
    const int qk = qk_len(P), vl = v_len(P), gl = P.hv * P.gc;
    const int kh = h / (P.hv / P.hk);
    const int jl = tid >> 1, i0 = (tid & 1) * DH, j = blockIdx.y * (blockDim.x >> 1) + jl;
    const bool col = j < P.dv;
    float* Sh = P.S + (i64)h * dk * P.dv;
    // What no copy writes: the padding rows and, in a replay, the queries.
    for (int x = tid; x < REC_TC * DK; x += blockDim.x) {
        const int t = x / DK, i = x % DK, a = rec_at<DK>(i);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            if (i >= dk) {
                buf[b].k[t][a] = 0.f;
                buf[b].e[t][a] = 1.f;
            }
            if (i >= dk || !P.out) buf[b].q[t][a] = 0.f;
        }
    }
    float s[DH];
#pragma unroll
    for (int i = 0; i < DH; ++i) s[i] = col && i0 + i < dk ? Sh[(i64)(i0 + i) * P.dv + j] : 0.f;
    auto row = [&](int t) -> i64 { return P.src_cap ? (P.src_pos + t) % P.src_cap : t; };
    // Issues the copies of tokens t0 .. t0 + nt − 1 into B.
    auto stage = [&](RecChunk<DK>& B, int t0, int nt) {
        for (int x = tid; x < nt * DK; x += blockDim.x) {
            const int t = x / DK, i = x % DK, a = rec_at<DK>(i);
            if (i >= dk) continue;
            const i64 r = row(t0 + t);
            cp_async4(&B.k[t][a], P.kk + r * qk + kh * dk + i);
            if (P.out) cp_async4(&B.q[t][a], P.kq + r * qk + kh * dk + i);
            cp_async4(&B.e[t][a], P.kg + r * gl + h * P.gc + (P.gc == dk ? i : 0));
        }
        if (col && i0 == 0)
            for (int t = 0; t < nt; ++t) cp_async4(&B.v[t][jl], P.kv + row(t0 + t) * vl + h * P.dv + j);
        if (tid < nt) cp_async4(&B.beta[tid], P.kb + row(t0 + tid) * P.hv + h);
    };
    if (P.n > 0) stage(buf[0], 0, min(REC_TC, P.n));
    const int ia = rec_at<DK>(i0);  // this thread's rows in a staged vector
    for (int c0 = 0, c = 0; c0 < P.n; c0 += REC_TC, ++c) {
        RecChunk<DK>& B = buf[c & 1];
        const int nt = min(REC_TC, P.n - c0);
        // This thread's copies have landed; it turns the decays it copied into exp.
        cp_async_wait_all();
        for (int x = tid; x < nt * DK; x += blockDim.x)
            if (x % DK < dk) {
                float& e = B.e[x / DK][rec_at<DK>(x % DK)];
                e = expf(e);
            }
        // Every copy of this chunk is visible, and every thread is done with the other
        // buffer (the chunk before), which now receives the next chunk.
        __syncthreads();
        if (c0 + REC_TC < P.n) stage(buf[(c + 1) & 1], c0 + REC_TC, min(REC_TC, P.n - c0 - REC_TC));
        // Every thread of a pair runs (the pair's sums meet by shuffle); a pair past dv
        // computes on zeros and stores nothing.
        for (int t = 0; t < nt; ++t) {
            const float *k = B.k[t] + ia, *e = B.e[t] + ia, *q = B.q[t] + ia;
            float u = 0.f;
#pragma unroll
            for (int i = 0; i < DH; ++i) {
                s[i] = __fmul_rn(s[i], e[i]);
                u = rec_madd<FMA>(k[i], s[i], u);
            }
            u = __fadd_rn(u, __shfl_xor_sync(0xFFFFFFFFu, u, 1));
            const float d = __fmul_rn(__fsub_rn(B.v[t][jl], u), B.beta[t]);
            float o = 0.f;
#pragma unroll
            for (int i = 0; i < DH; ++i) {
                s[i] = rec_madd<FMA>(k[i], d, s[i]);
                o = rec_madd<FMA>(q[i], s[i], o);
            }
            o = __fadd_rn(o, __shfl_xor_sync(0xFFFFFFFFu, o, 1));
            if (P.out && col && i0 == 0) P.out[(i64)(P.row0 + c0 + t) * vl + h * P.dv + j] = rnd(o, P.rb);
        }
    }
    if (col)
#pragma unroll
        for (int i = 0; i < DH; ++i)
            if (i0 + i < dk) Sh[(i64)(i0 + i) * P.dv + j] = s[i];
}

template <int DK>
__device__ __forceinline__ void recurrent(const DeltaParams& P) {
    __shared__ RecChunk<DK> buf[2];
    if (P.rb)
        recurrent_body<DK, false>(P, buf);
    else
        recurrent_body<DK, true>(P, buf);
}

extern "C" __global__ void delta_recurrent_16(const DeltaParams P) { recurrent<16>(P); }
extern "C" __global__ void delta_recurrent_32(const DeltaParams P) { recurrent<32>(P); }
extern "C" __global__ void delta_recurrent_64(const DeltaParams P) { recurrent<64>(P); }
extern "C" __global__ void delta_recurrent_128(const DeltaParams P) { recurrent<128>(P); }

// ---- journal replays of several layers in one launch

// The layers of a replay launch: as many as the launch's parameters hold (the host's
// KArgs; moe_ops.rs `REPLAY_LAYERS` is the same). blockIdx.y (the conv state) or
// blockIdx.z (the recurrence) picks one.
#define REPLAY_LAYERS 9
struct ReplayLayer {
    float* conv_state;  // [kc−1, C]
    const float* pre;   // the journal: pre-conv rows, k, v, log decays, betas
    const float* k;
    const float* v;
    const float* g;
    const float* beta;
    float* s;           // [hv, dk, dv]
};
struct ReplayParams {
    ReplayLayer layer[REPLAY_LAYERS];
    i32 n, hk, hv, dk, dv, kc, gc;
    i32 cap, pos;  // the journal's slots; its token t is at slot (pos + t) mod cap
};

// Layer z of a replay as the forward kernels' parameters: kernel inputs from the
// journal, no queries or outputs, the f32 policy's fused multiply-adds.
__device__ __forceinline__ DeltaParams replay_params(const ReplayParams& R, int z) {
    const ReplayLayer& L = R.layer[z];
    DeltaParams P = {};
    P.conv_state = L.conv_state;
    P.jpre = (float*)L.pre;
    P.kk = (float*)L.k;
    P.kv = (float*)L.v;
    P.kg = (float*)L.g;
    P.kb = (float*)L.beta;
    P.S = L.s;
    P.n = R.n;
    P.hk = R.hk;
    P.hv = R.hv;
    P.dk = R.dk;
    P.dv = R.dv;
    P.kc = R.kc;
    P.gc = R.gc;
    P.src_cap = R.cap;
    P.src_pos = R.pos;
    return P;
}

// grid (⌈C/256⌉, layers), 256 threads.
extern "C" __global__ void delta_replay_conv(const ReplayParams R) { conv_state_body(replay_params(R, blockIdx.y)); }

// grid (hv, ⌈dv / cols⌉, layers), as `delta_recurrent_<dk>`.
extern "C" __global__ void delta_replay_16(const ReplayParams R) { recurrent<16>(replay_params(R, blockIdx.z)); }
extern "C" __global__ void delta_replay_32(const ReplayParams R) { recurrent<32>(replay_params(R, blockIdx.z)); }
extern "C" __global__ void delta_replay_64(const ReplayParams R) { recurrent<64>(replay_params(R, blockIdx.z)); }
extern "C" __global__ void delta_replay_128(const ReplayParams R) { recurrent<128>(replay_params(R, blockIdx.z)); }

// One channel's conv inputs that `delta_step` may load before its wait (see there): its
// kc−1 state rows and its kc weights.
struct ConvIn {
    float old[STEP_KC - 1];
    float w[STEP_KC];
};

__device__ __forceinline__ void conv_load(const DeltaParams& P, int c, int C, ConvIn& in) {
#pragma unroll
    for (int r = 0; r < STEP_KC - 1; ++r) in.old[r] = r < P.kc - 1 ? P.conv_state[(i64)r * C + c] : 0.f;
#pragma unroll
    for (int s = 0; s < STEP_KC; ++s) in.w[s] = s < P.kc ? conv_w(P, c, s) : 0.f;
}

// The conv of channel c for the call's one token: the kc−1 state rows then the pre-conv
// value; the state shifts by one row and the pre-conv value goes to the journal.
__device__ __forceinline__ float conv_one(const DeltaParams& P, const ConvIn& in, int c, int C, int slot) {
    const int hist = P.kc - 1;
    const float cur = pre_val(P, 0, c);
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < STEP_KC; ++s)
        if (s < P.kc) acc = __fadd_rn(acc, __fmul_rn(in.w[s], s < hist ? in.old[s] : cur));
#pragma unroll
    for (int r = 0; r < STEP_KC - 1; ++r)
        if (r < hist) P.conv_state[(i64)r * C + c] = r + 1 < hist ? in.old[r + 1] : cur;
    if (P.jpre) P.jpre[(i64)slot * C + c] = cur;
    return rnd(siluf_ref(acc), P.rb);
}

// Column j of a head's state `st` ([dk, dv], shared memory) through one token, rows in
// `recurrent_body`'s two halves (a chain each, then their sum): the decay and u = kᵀS,
// then with d = (v − u)·β the update (written to `Sh` too) and o = qᵀS, returned before
// rounding; products and sums by `rec_madd<FMA>`.
template <bool FMA>
__device__ __forceinline__ float step_column(float* st, float* Sh, const float* ks, const float* qs, const float* es,
                                             int dk, int dv, int j, float v, float beta) {
    const int dh = min(rec_half(dk), dk);
    auto decay = [&](int a, int b) {
        float u = 0.f;
#pragma unroll 8
        for (int i = a; i < b; ++i) {
            const float s = __fmul_rn(st[i * dv + j], es[i]);
            st[i * dv + j] = s;
            u = rec_madd<FMA>(ks[i], s, u);
        }
        return u;
    };
    const float u = __fadd_rn(decay(0, dh), decay(dh, dk));
    const float d = __fmul_rn(__fsub_rn(v, u), beta);
    auto update = [&](int a, int b) {
        float oh = 0.f;
#pragma unroll 8
        for (int i = a; i < b; ++i) {
            const float s = rec_madd<FMA>(ks[i], d, st[i * dv + j]);
            Sh[(i64)i * dv + j] = s;
            oh = rec_madd<FMA>(qs[i], s, oh);
        }
        return oh;
    };
    return __fadd_rn(update(0, dh), update(dh, dk));
}

// grid hv (= hk), blockDim ≥ max(dk, dv, gc) and each product's rows times its lanes
// (≤ 32), a multiple of 32, conv kernel ≤ STEP_KC, dynamic shared memory dk·dv floats:
// one token with as many key as value heads (KDA's decode step) in one launch — the conv
// of the head's q, k and v channels (this block owns them, so it may shift their state),
// the kernel inputs, the recurrence, the journal, and with `P.gz` the gated output norm
// (`gated_norm`'s arithmetic, into `P.gout`). With `P.g0_prod.w` (`P.gz_prod.w`) the
// block first forms its head's rows of g0 (gz) as `gemv_float_multi` does (`float_row`,
// `lanes` threads per row: the same values), their weights loaded before the wait.
//
// With `P.early` (set by the host when the launch before this one cannot write the
// delta-rule state: in a model's step that is a projection) it starts copying the head's
// state into shared memory and loads the conv state and weights before waiting for the
// previous kernel; otherwise (another step of the same state right before, or a kernel
// the host cannot see into) after the wait. Thread j < dv then runs column j's
// recurrence from shared memory in `recurrent_body`'s order of operations: the same
// values bit for bit.
extern "C" __global__ void __launch_bounds__(DELTA_STEP_THREADS) delta_step(const DeltaParams P) {
    extern __shared__ float st[];  // [dk, dv]
    __shared__ float ks[DELTA_D], qs[DELTA_D], es[DELTA_D], gs[DELTA_D], os[DELTA_D];
    __shared__ double red[32];
    __shared__ float beta_sh, r_sh;
    const int h = blockIdx.x, j = threadIdx.x, dk = P.dk, dv = P.dv;
    const int qk = qk_len(P), vl = v_len(P), C = 2 * qk + vl, gl = P.hv * P.gc;
    float* Sh = P.S + (i64)h * dk * dv;
    ConvIn cq, ck, cv;
    auto load_state = [&] {
        const int ns = dk * dv;
        if ((ns & 3) == 0)
            for (int e = 4 * j; e < ns; e += 4 * blockDim.x) cp_async16(st + e, Sh + e);
        else
            for (int e = j; e < ns; e += blockDim.x) cp_async4(st + e, Sh + e);
        if (j < dk) {
            conv_load(P, h * dk + j, C, cq);
            conv_load(P, qk + h * dk + j, C, ck);
        }
        if (j < dv) conv_load(P, 2 * qk + h * dv + j, C, cv);
    };
    if (P.early) load_state();
    const FloatSeg &G = P.g0_prod, &Z = P.gz_prod;
    const int gr = h * P.gc + j / max(G.lanes, 1), zr = h * dv + j / max(Z.lanes, 1);
    const bool gv = G.w && j < P.gc * G.lanes, zv = Z.w && j < dv * Z.lanes;
    FloatRowIn gin, zin;
    if (G.w) float_row_loads(float_seg_row(G, gr), G.ty, G.x, G.n_in, G.n_in, G.lanes, gv, gin);
    if (Z.w) float_row_loads(float_seg_row(Z, zr), Z.ty, Z.x, Z.n_in, Z.n_in, Z.lanes, zv, zin);
    pdl_wait();
    pdl_trigger();
    if (!P.early) load_state();
    if (G.w)
        float_row_sums(gin, float_seg_row(G, gr), G.ty, G.x, G.n_in, G.n_in, 1, G.out, G.n_out, G.bias, gr, G.rb,
                       G.lanes, gv);
    if (Z.w)
        float_row_sums(zin, float_seg_row(Z, zr), Z.ty, Z.x, Z.n_in, Z.n_in, 1, Z.out, Z.n_out, Z.bias, zr, Z.rb,
                       Z.lanes, zv);
    if (G.w || Z.w) __syncthreads();
    const int slot = P.cap ? (P.step->pos0 + P.row0) % P.cap : 0;
    float mq = 0.f, mk = 0.f, mv = 0.f;
    if (j < dk) {
        mq = conv_one(P, cq, h * dk + j, C, slot);
        mk = conv_one(P, ck, qk + h * dk + j, C, slot);
    }
    if (j < dv) mv = conv_one(P, cv, 2 * qk + h * dv + j, C, slot);
    const double qn = block_sum_d((double)__fmul_rn(mq, mq), red);
    const double kn = block_sum_d((double)__fmul_rn(mk, mk), red);
    if (j < dk) {
        const float q = __fdiv_rn(mq, sqrtf(__fadd_rn((float)qn, 1e-6f)));
        const float k = __fdiv_rn(mk, sqrtf(__fadd_rn((float)kn, 1e-6f)));
        qs[j] = __fmul_rn(q, __fdiv_rn(1.0f, sqrtf((float)dk)));
        ks[j] = k;
        if (P.jk) P.jk[(i64)slot * qk + h * dk + j] = k;
    }
    if (j < dv && P.jv) P.jv[(i64)slot * vl + h * dv + j] = mv;
    if (j < P.gc) {
        const int ch = h * P.gc + j;
        gs[j] = delta_gate(P, P.g0[(i64)P.row0 * gl + ch], ch, h);
        if (P.jg) P.jg[(i64)slot * gl + ch] = gs[j];
    }
    if (j == 0) {
        const float be = rnd(sigmoidf_ref(P.b[(i64)P.row0 * P.hv + h]), P.rb);
        beta_sh = be;
        if (P.jb) P.jb[(i64)slot * P.hv + h] = be;
    }
    __syncthreads();
    if (j < dk) es[j] = expf(gs[P.gc == dk ? j : 0]);
    cp_async_wait_all();
    __syncthreads();
    float o = 0.f;
    if (j < dv) {
        // The arithmetic chosen once per thread, outside the chains.
        o = P.rb ? step_column<false>(st, Sh, ks, qs, es, dk, dv, j, mv, beta_sh)
                 : step_column<true>(st, Sh, ks, qs, es, dk, dv, j, mv, beta_sh);
        o = rnd(o, P.rb);
        P.out[(i64)P.row0 * vl + h * dv + j] = o;
        os[j] = o;
    }
    if (!P.gz) return;
    __syncthreads();
    if (j < 32) {
        const float r = gated_inv_rms(os, dv, P.geps);
        if (j == 0) r_sh = r;
    }
    __syncthreads();
    if (j < dv) {
        const i64 e = (i64)P.row0 * vl + h * dv + j;
        P.gout[e] = gated_value(o, r_sh, P.gw[j], P.gz[e], P.gsilu, P.rb);
    }
}
