// Token selection on the GPU: argmax (np.argmax: lowest index on ties, the first NaN wins) and the
// k largest logits sorted descending, ties to the lower id (np.argsort(-x, kind="stable")[:k]).
//
// Both order (value, index) through one 64-bit key, value's order-preserving bits above the
// complement of the index, so "larger key" is "ranks first" and a max or a sort needs no tie rule.

#define ARGMAX_THREADS 256
#define TOPK_THREADS 1024
#define TOPK_SEGMENT 4096  // keys per block and round: 32 KB of shared memory

typedef unsigned long long u64;

// nan_high: NaN above +inf (argmax) or below -inf (sorting -x puts NaN last). -0 == +0.
__device__ __forceinline__ u64 value_key(float x, unsigned index, bool nan_high) {
    unsigned k;
    if (x != x) {
        k = nan_high ? 0xFFFFFFFFu : 0u;
    } else {
        const unsigned u = __float_as_uint(x == 0.0f ? 0.0f : x);
        k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((u64)k << 32) | (u64)(0xFFFFFFFFu - index);
}

__device__ __forceinline__ unsigned key_index(u64 key) { return 0xFFFFFFFFu - (unsigned)key; }

// best[0] = max key over logits[0..n); best must start at 0 (one memset). Max is order-free,
// so the atomics cannot change the result.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_f32(const float* __restrict__ logits, int n, u64* __restrict__ best) {
    __shared__ u64 warp_best[ARGMAX_THREADS / 32];
    u64 m = 0;
    for (int i = blockIdx.x * ARGMAX_THREADS + threadIdx.x; i < n; i += gridDim.x * ARGMAX_THREADS) {
        const u64 key = value_key(logits[i], (unsigned)i, true);
        m = key > m ? key : m;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const u64 other = __shfl_xor_sync(0xffffffffu, m, o);
        m = other > m ? other : m;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_best[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; w++) m = warp_best[w] > m ? warp_best[w] : m;
        atomicMax(best, m);
    }
}

// One round of a block-wise top-k: block b sorts keys [b * seg, (b + 1) * seg) of its input
// (the logits themselves when keys_in is null) descending and keeps the first k. A round with one
// block writes the answer instead: out_ids[i] and out_values[i] = logits[out_ids[i]].
// seg is a power of two <= TOPK_SEGMENT, k <= seg / 2 when there is more than one block.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
topk_round(const float* __restrict__ logits, const u64* __restrict__ keys_in, int n, int seg, int k,
           u64* __restrict__ keys_out, int* __restrict__ out_ids, float* __restrict__ out_values) {
    __shared__ u64 s[TOPK_SEGMENT];
    const long long base = (long long)blockIdx.x * seg;
    for (int i = threadIdx.x; i < seg; i += TOPK_THREADS) {
        const long long g = base + i;
        u64 key = 0;  // padding ranks after every real key (a real key's low half is never 0)
        if (g < n) key = keys_in ? keys_in[g] : value_key(logits[g], (unsigned)g, false);
        s[i] = key;
    }
    __syncthreads();
    for (int size = 2; size <= seg; size <<= 1) {  // bitonic sort, descending
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < seg / 2; i += TOPK_THREADS) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool descending = (lo & size) == 0;
                const u64 a = s[lo], b = s[hi];
                if ((a < b) == descending) {
                    s[lo] = b;
                    s[hi] = a;
                }
            }
            __syncthreads();
        }
    }
    if (gridDim.x == 1) {
        for (int i = threadIdx.x; i < k; i += TOPK_THREADS) {
            const unsigned id = key_index(s[i]);
            out_ids[i] = (int)id;
            out_values[i] = logits[id];
        }
    } else {
        for (int i = threadIdx.x; i < k; i += TOPK_THREADS) keys_out[(long long)blockIdx.x * k + i] = s[i];
    }
}
