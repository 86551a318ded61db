// The greedy choice of a step on the device (the engine's `Backend::pick`: pipelined
// greedy decoding, where the next step is queued before the host has read this one's
// token). The argmax of one logits row — the lowest index whose value is strictly
// greatest and above -1e30, 0 when none, as the host's `sampler::argmax` — becomes the
// token of the next step: the step's inputs are rewritten for a one-token step at
// position pos0 + n_tok (what `step_picked` hands over without a copy), and the token is
// stored for the host in its ring of choices (page-locked memory mapped into the device)
// at that position modulo the ring's length.

#include "common.cuh"

#define PICK_THREADS 256

struct PickParams {
    const float* logits;
    StepInfo* step;
    u32* ring;      // host-mapped, ring_len slots
    u64* partials;  // one key per block
    u32* counter;   // zero between launches
    i32 n, ring_len;
};

// A value's key: its order in the high 32 bits (larger values higher, -0 as +0; NaN and
// values at or below -1e30 key 0, never chosen), the complement of its index in the low
// 32 bits (of equal values the lower index keys higher). The largest key is the choice.
__device__ __forceinline__ u64 pick_key(float v, int i) {
    if (!(v > -1e30f)) return 0;
    const u32 b = v == 0.f ? 0u : __float_as_uint(v);
    const u32 order = b & 0x80000000u ? ~b : b | 0x80000000u;
    return ((u64)order << 32) | (u32)~(u32)i;
}

__device__ __forceinline__ u64 kmax(u64 a, u64 b) { return a > b ? a : b; }

__device__ __forceinline__ u64 block_max_key(u64 k, u64* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) k = kmax(k, __shfl_xor_sync(0xffffffffu, k, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = k;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < PICK_THREADS / 32; ++w) k = kmax(k, red[w]);
    return k;  // thread 0's is the block's
}

// Each block keys a contiguous share of the row (four values a load); the last block to
// finish takes the largest of the blocks' keys and writes the choice.
extern "C" __global__ void __launch_bounds__(PICK_THREADS) greedy_pick(const PickParams P) {
    __shared__ u64 red[PICK_THREADS / 32];
    __shared__ bool last;
    pdl_wait();
    pdl_trigger();
    const int n4 = P.n / 4;
    const int per = (n4 + gridDim.x - 1) / gridDim.x;
    const int lo = blockIdx.x * per, hi = min(n4, lo + per);
    u64 k = 0;
    for (int q = lo + threadIdx.x; q < hi; q += PICK_THREADS) {
        const float4 v = __ldcg((const float4*)P.logits + q);
        const u64 a = kmax(pick_key(v.x, 4 * q), pick_key(v.y, 4 * q + 1));
        const u64 b = kmax(pick_key(v.z, 4 * q + 2), pick_key(v.w, 4 * q + 3));
        k = kmax(k, kmax(a, b));
    }
    if (blockIdx.x == gridDim.x - 1)
        for (int i = 4 * n4 + threadIdx.x; i < P.n; i += PICK_THREADS) k = kmax(k, pick_key(__ldcg(P.logits + i), i));
    k = block_max_key(k, red);
    if (threadIdx.x == 0) {
        P.partials[blockIdx.x] = k;
        __threadfence();
        last = atomicAdd(P.counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    k = 0;
    for (int b = threadIdx.x; b < gridDim.x; b += PICK_THREADS) k = kmax(k, __ldcg(P.partials + b));
    __syncthreads();
    k = block_max_key(k, red);
    if (threadIdx.x == 0) {
        *P.counter = 0u;
        const u32 token = k ? ~(u32)k : 0u;
        const int pos = P.step->pos0 + P.step->n_tok;
        P.step->pos0 = pos;
        P.step->n_tok = 1;
        ((u32*)(P.step + 1))[0] = token;
        ((volatile u32*)P.ring)[pos % P.ring_len] = token;
        __threadfence_system();
    }
}
