// A logits row's k largest values on the device, largest first, equal values by lower index, as
// runner/engine/sampling.py's best_first orders them, and whether every value is finite: sampling with top-k
// downloads k (id, value) pairs instead of the row (151552 floats a token at the seed shape) and draws on the host
// from exactly the candidates it would have found itself. Twin: NumpyOps.top_k.
//
// Each value becomes one 64-bit key: its float32 bits made monotonic (after + 0, so -0.0 ranks as the +0.0 it
// equals) above the complement of its index. Keys are distinct and order as (value descending, index ascending),
// so no tie needs handling: top_k_tiles sorts each tile of TOPK_TILE keys and keeps its k best (the row's k best
// are among them), and top_k_merge sorts the tiles' candidates and writes the first k.

#define TOPK_THREADS 1024
#define TOPK_TILE 2048         // keys a top_k_tiles block sorts
#define TOPK_MAX 64            // k at most (top_k.py's TOPK_MAX)
#define TOPK_CANDIDATES 8192   // keys top_k_merge sorts: tiles * k at most

__device__ __forceinline__ unsigned long long rank_key(float v, int id) {
    const unsigned bits = __float_as_uint(__fadd_rn(v, 0.0f));
    const unsigned mono = (bits >> 31) ? ~bits : (bits | 0x80000000u);  // a larger value, a larger key
    return ((unsigned long long)mono << 32) | (0xFFFFFFFFu - (unsigned)id);
}

__device__ __forceinline__ bool finite_value(float v) { return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u; }

// The N keys at s in descending order (bitonic; N a power of two); every thread of the block takes part.
template <int N>
__device__ __forceinline__ void sort_descending(unsigned long long* s) {
    for (int size = 2; size <= N; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < N / 2; i += blockDim.x) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool descending = (lo & size) == 0;
                const unsigned long long a = s[lo], b = s[hi];
                if ((a < b) == descending) {
                    s[lo] = b;
                    s[hi] = a;
                }
            }
            __syncthreads();
        }
}

// Block b: the k best keys of x[b TOPK_TILE ..] into cand[b k ..], and finite[b] = 1 if all its values are finite.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
top_k_tiles(const float* __restrict__ x, int n, int k, unsigned long long* __restrict__ cand, int* __restrict__ finite) {
    __shared__ unsigned long long s[TOPK_TILE];
    __shared__ int all_finite;
    if (threadIdx.x == 0) all_finite = 1;
    __syncthreads();
    const int base = blockIdx.x * TOPK_TILE;
    bool ok = true;
    for (int j = threadIdx.x; j < TOPK_TILE; j += TOPK_THREADS) {
        const int i = base + j;
        unsigned long long key = 0ull;  // past the row: below every value's key
        if (i < n) {
            const float v = x[i];
            ok = ok && finite_value(v);
            key = rank_key(v, i);
        }
        s[j] = key;
    }
    if (!ok) all_finite = 0;  // a benign race: every writer writes 0
    __syncthreads();
    sort_descending<TOPK_TILE>(s);
    for (int j = threadIdx.x; j < k; j += TOPK_THREADS) cand[(long long)blockIdx.x * k + j] = s[j];
    if (threadIdx.x == 0) finite[blockIdx.x] = all_finite;
}

// One block: the k best of the tiles' `tiles * k` candidates. out int32 [1 + 2k]: out[0] = 1 if every value of the
// row is finite, out[1 .. k] the ids best first, out[1 + k .. 1 + 2k] their values' float32 bits (one download).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
top_k_merge(const unsigned long long* __restrict__ cand, const int* __restrict__ finite, int tiles, int k,
            const float* __restrict__ x, int* __restrict__ out) {
    extern __shared__ unsigned long long merged[];  // TOPK_CANDIDATES keys
    __shared__ int all_finite;
    if (threadIdx.x == 0) all_finite = 1;
    __syncthreads();
    const int m = tiles * k;
    for (int j = threadIdx.x; j < TOPK_CANDIDATES; j += TOPK_THREADS) merged[j] = j < m ? cand[j] : 0ull;
    for (int b = threadIdx.x; b < tiles; b += TOPK_THREADS)
        if (!finite[b]) all_finite = 0;
    __syncthreads();
    sort_descending<TOPK_CANDIDATES>(merged);
    for (int j = threadIdx.x; j < k; j += TOPK_THREADS) {
        const int id = (int)(0xFFFFFFFFu - (unsigned)(merged[j] & 0xFFFFFFFFull));
        out[1 + j] = id;
        out[1 + k + j] = __float_as_int(x[id]);
    }
    if (threadIdx.x == 0) out[0] = all_finite;
}
