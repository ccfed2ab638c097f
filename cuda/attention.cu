// Causal GQA attention over a preallocated KV cache [n_ctx, Hkv, D] (float32 or float16) of which
// the first n_kv rows are valid; q [T, H, D] float32 at absolute positions pos [T]; out [T, H*D].
// Key j is visible to row t iff j <= pos[t]. Twin: NumpyOps.attention.
//
// Decode (T <= 8): split-KV. attn_decode_keys_* (the default: each warp its own tiles of a chunk) or
// attn_decode_split_* (a block's warps walk a chunk's tiles together) reduces each (row, head, chunk of KV_CHUNK
// keys) with an online softmax; attn_decode_combine merges a row's chunks in a fixed order. (Merging in the keys
// split's last blocks instead, a launch fewer, measured 0.49 ms a token slower on seed48: one block serialized
// what the merge launch spreads: docs/perf/2026-12-07e-seed48-fused-greedy-h100.md.)
// Batch invariance: every (row, head) pair runs the same instruction sequence on the same data
// whatever the other rows are, because (a) chunks and tiles are fixed key ranges from key 0, never
// sized from T, n_kv or the GPU, (b) a pair's loop bounds depend only on its own position, and
// (c) every rounding step is an explicit __f*_rn / __fmaf_rn (nothing left for the compiler to
// contract differently per instantiation), with butterfly warp reductions that give every lane
// the same bits. So row t alone, in a verify batch of 8, or against a longer n_kv (the graph
// replays pass the whole buffer) gives identical output bits. For the same reasons a pair's bits
// do not depend on which warp or slot serves it, so DEC_SLOTS (pairs per warp) is a speed choice
// only: with 4 query heads per KV head and one row, 4 slots per warp left three of a block's four
// warps idle while the fourth walked the chunk alone.
//
// Prefill (T > 8): flash-attention style. A block owns PF_BQ query rows of one head, walks key
// tiles of PF_BK up to its last visible key (causal tiles skipped), keeps a running max and sum
// per row, and never forms the T x S score matrix. Float32 CUDA-core math.
#include <cuda_fp16.h>
#include "pdl.cuh"

#ifndef KV_CHUNK        // backends/cuda/attention.py passes its KV_CHUNK (scripts/bench/bench_attention_cuda.py --kv-chunks sweeps it)
#define KV_CHUNK 128    // keys per split of the decode kernel: fixed, so row results are batch-invariant
#endif
#define DEC_TILE 32     // keys per shared-memory tile (one key per lane)
#define DEC_WARPS 4
#ifndef DEC_SLOTS       // backends/cuda/attention.py passes its DEC_SLOTS (bench_attention_cuda.py --dec-slots sweeps it)
#define DEC_SLOTS 4     // (row, head) pairs per warp; they share every K/V shared-memory read
#endif
#ifndef DEC_K_AHEAD     // the keys split's loads in flight a lane: a key row's 4-value loads (attention.py DEC_K_AHEAD)
#define DEC_K_AHEAD 16
#endif
#ifndef DEC_V_AHEAD     // and V's keys, each NI loads (attention.py DEC_V_AHEAD); neither changes a bit
#define DEC_V_AHEAD 8
#endif
#define DEC_PAIRS (DEC_WARPS * DEC_SLOTS)
#define DEC_THREADS (DEC_WARPS * 32)
#define PF_BQ 64        // query rows per prefill block
#define PF_BK 64        // keys per prefill tile
#define PF_THREADS 256  // 16 x 16: thread (ty, tx) owns rows 4ty..4ty+3

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // -inf; NVRTC has no math.h INFINITY

extern __shared__ float4 attn_smem[];

// q, K and V are read-only while a kernel runs: __ldg says so where PDL_ENTRY's memory clobber (pdl.cuh) keeps the
// compiler from proving it (the loads it took through the read-only path on its own before).
__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

__device__ __forceinline__ float4 load4(const __half* p) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Butterfly: lane i adds (a + b), lane i^o adds (b + a); float addition commutes, so all lanes agree.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Keys tile..tile+DEC_TILE-1 of kv head g as float4s into registers, zeros past n_kv; element
// idx = tid + u * DEC_THREADS of the tile is (key idx / D4, dims 4 (idx % D4) ..).
template <typename KV, int FETCH>
__device__ __forceinline__ void fetch_tile(const KV* __restrict__ kc, const KV* __restrict__ vc, int tile,
                                           int n_kv, int Hkv, int g, int D4, int tid, float4 (&kr)[FETCH],
                                           float4 (&vr)[FETCH]) {
#pragma unroll
    for (int u = 0; u < FETCH; ++u) {
        const int idx = tid + u * DEC_THREADS, j = idx / D4, d4 = idx - j * D4, key = tile + j;
        kr[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        vr[u] = kr[u];
        if (idx < DEC_TILE * D4 && key < n_kv) {
            const size_t off = ((size_t)key * Hkv + g) * (4 * D4) + 4 * d4;
            kr[u] = load4(kc + off);
            vr[u] = load4(vc + off);
        }
    }
}

// The split kernels' shared steps for a warp's DEC_SLOTS pairs over one tile of DEC_TILE keys from `tile` (lane =
// key): the online softmax update of (m, l, o) from the scores s (p[r]: this lane's key's weight for slot r,
// n_valid[r]: the tile's keys slot r sees), then o += p V over those keys in key order, V's value of key j at
// this lane's dimension lane + 32 i read through v_at(j, i). Both kernels run these same operations in this
// order, which is what keeps each kernel's bits independent of the batch.
template <int NI>
__device__ __forceinline__ void softmax_tile(const float (&s)[DEC_SLOTS], const int (&my_pos)[DEC_SLOTS], int tile,
                                             float scale, int lane, float (&m)[DEC_SLOTS], float (&l)[DEC_SLOTS],
                                             float (&o)[DEC_SLOTS][NI], float (&p)[DEC_SLOTS],
                                             int (&n_valid)[DEC_SLOTS], int& n_valid_max) {
    n_valid_max = 0;
#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) {
        n_valid[r] = min(DEC_TILE, my_pos[r] - tile + 1);  // keys of this tile visible to slot r
        p[r] = 0.f;
        if (n_valid[r] <= 0) continue;  // warp-uniform
        n_valid_max = max(n_valid_max, n_valid[r]);
        const float sc = lane < n_valid[r] ? __fmul_rn(s[r], scale) : NEG_INF;
        const float m_new = fmaxf(m[r], warp_max(sc));  // finite: key `tile` is visible
        const float alpha = expf(__fsub_rn(m[r], m_new));  // 0 on the first tile (m = -inf)
        p[r] = expf(__fsub_rn(sc, m_new));
        l[r] = __fadd_rn(__fmul_rn(l[r], alpha), warp_sum(p[r]));
#pragma unroll
        for (int i = 0; i < NI; ++i) o[r][i] = __fmul_rn(o[r][i], alpha);
        m[r] = m_new;
    }
}

// AHEAD > 1: the keys split's global-memory V reads, the values of AHEAD keys loaded before the first of them is
// accumulated, so their loads are in flight together (one key's loads at a time waited out an L2 round trip a key,
// 32 a tile). AHEAD 1: the tiles split, which reads shared memory. Either way key j's products are added in key
// order, slot by slot, as before: the loads move, never the arithmetic.
template <int NI, int AHEAD, class VAt>
__device__ __forceinline__ void accumulate_pv(VAt v_at, int D, const float (&p)[DEC_SLOTS],
                                              const int (&n_valid)[DEC_SLOTS], int n_valid_max,
                                              float (&o)[DEC_SLOTS][NI]) {
    for (int j0 = 0; j0 < n_valid_max; j0 += AHEAD) {
        float vj[AHEAD][NI];
#pragma unroll
        for (int a = 0; a < AHEAD; ++a)
#pragma unroll
            for (int i = 0; i < NI; ++i) vj[a][i] = j0 + a < n_valid_max && 32 * i < D ? v_at(j0 + a, i) : 0.f;
#pragma unroll
        for (int a = 0; a < AHEAD; ++a) {
            const int j = j0 + a;
            if (AHEAD > 1 && j >= n_valid_max) break;  // warp-uniform
#pragma unroll
            for (int r = 0; r < DEC_SLOTS; ++r) {
                const float pj = __shfl_sync(FULL_MASK, p[r], j);
                if (j < n_valid[r]) {
#pragma unroll
                    for (int i = 0; i < NI; ++i) o[r][i] = __fmaf_rn(pj, vj[a][i], o[r][i]);
                }
            }
        }
    }
}

// Merge the block's warps' partials (m, l) in wml [DEC_WARPS][DEC_SLOTS] and o in ws [DEC_WARPS][DEC_SLOTS][D]
// for slot r, in warp order against their max, skipping warps that saw no key of it: (mx, den) and num[i] at
// this lane's dimensions lane + 32 i.
template <int NI>
__device__ __forceinline__ void merge_warps(const float* ws, const float2* wml, int r, int D, int lane, float& mx,
                                            float& den, float (&num)[NI]) {
    mx = NEG_INF;
    for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, wml[w * DEC_SLOTS + r].x);
    den = 0.f;
#pragma unroll
    for (int i = 0; i < NI; ++i) num[i] = 0.f;
    for (int w = 0; w < DEC_WARPS; ++w) {
        const float2 ml = wml[w * DEC_SLOTS + r];
        if (ml.x == NEG_INF) continue;  // a warp with no key (or chunk) of this pair
        const float sc = expf(__fsub_rn(ml.x, mx));
        den = __fmaf_rn(ml.y, sc, den);
#pragma unroll
        for (int i = 0; i < NI; ++i)
            if (32 * i < D) num[i] = __fmaf_rn(ws[(w * DEC_SLOTS + r) * D + lane + 32 * i], sc, num[i]);
    }
}

// ---------------------------------------------------------------------------------------------
// Decode split. grid (pair blocks, chunks, Hkv), DEC_WARPS*32 threads. Pair p of kv head g is
// (row p / G, head g*G + p % G); block x owns pairs [x*DEC_PAIRS, (x+1)*DEC_PAIRS), warp w slots
// w*DEC_SLOTS + r. Writes part_o [T, H, n_chunks, D] (unnormalised) and part_ml [T, H, n_chunks]
// (running max, sum) for every chunk that holds a key visible to the pair.
template <typename KV, int DCAP>
__device__ __forceinline__ void decode_split(const float* __restrict__ q, const KV* __restrict__ kc,
                                             const KV* __restrict__ vc, const int* __restrict__ pos,
                                             float* __restrict__ part_o, float2* __restrict__ part_ml,
                                             int T, int H, int Hkv, int D, int n_kv, int n_chunks,
                                             float scale) {
    constexpr int NI = DCAP / 32;  // output dims per lane: lane + 32 i
    constexpr int FETCH = DEC_TILE * DCAP / 4 / DEC_THREADS;  // float4s of K (and of V) per thread per tile
    __shared__ int s_pos[DEC_PAIRS];
    const int kstride = D + 4;  // keeps lane j's float4 reads of row j conflict-free
    float* ks = reinterpret_cast<float*>(attn_smem);  // [DEC_TILE][D + 4]
    float* vs = ks + DEC_TILE * kstride;               // [DEC_TILE][D]
    float* qs = vs + DEC_TILE * D;                     // [DEC_PAIRS][D]

    const int G = H / Hkv, n_pairs = T * G;
    const int pb = blockIdx.x, chunk = blockIdx.y, g = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk_start = chunk * KV_CHUNK;
    const int D4 = D / 4;

    if (tid < DEC_PAIRS) {
        const int p = pb * DEC_PAIRS + tid;
        s_pos[tid] = p < n_pairs ? pos[p / G] : -1;
    }
    __syncthreads();
    int max_pos = -1;
    for (int i = 0; i < DEC_PAIRS; ++i) max_pos = max(max_pos, s_pos[i]);
    if (max_pos < chunk_start) return;  // no pair of this block sees this chunk (block-uniform)
    const int chunk_end = min(min(chunk_start + KV_CHUNK, n_kv), max_pos + 1);

    for (int idx = tid; idx < DEC_PAIRS * D4; idx += DEC_THREADS) {
        const int slot = idx / D4, d4 = idx - slot * D4, p = pb * DEC_PAIRS + slot;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (p < n_pairs) v = load4(q + ((size_t)(p / G) * H + g * G + p % G) * D + 4 * d4);
        *reinterpret_cast<float4*>(qs + slot * D + 4 * d4) = v;
    }

    int my_pos[DEC_SLOTS];
    float m[DEC_SLOTS], l[DEC_SLOTS], o[DEC_SLOTS][NI];
#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) {
        my_pos[r] = min(s_pos[warp * DEC_SLOTS + r], n_kv - 1);
        m[r] = NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < NI; ++i) o[r][i] = 0.f;
    }
    int warp_last = -1;
#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) warp_last = max(warp_last, my_pos[r]);

    // The next tile's K/V are loaded into registers while this one is computed: a plain
    // load-then-store loop waits out one memory latency per step and measured ~7 us per tile.
    float4 kr[FETCH], vr[FETCH];
    fetch_tile<KV, FETCH>(kc, vc, chunk_start, n_kv, Hkv, g, D4, tid, kr, vr);
    for (int tile = chunk_start; tile < chunk_end; tile += DEC_TILE) {
        __syncthreads();  // the previous tile's reads are done
#pragma unroll
        for (int u = 0; u < FETCH; ++u) {
            const int idx = tid + u * DEC_THREADS, j = idx / D4, d4 = idx - j * D4;
            if (idx < DEC_TILE * D4) {
                *reinterpret_cast<float4*>(ks + j * kstride + 4 * d4) = kr[u];
                *reinterpret_cast<float4*>(vs + j * D + 4 * d4) = vr[u];
            }
        }
        __syncthreads();
        if (tile + DEC_TILE < chunk_end) fetch_tile<KV, FETCH>(kc, vc, tile + DEC_TILE, n_kv, Hkv, g, D4, tid, kr, vr);
        if (warp_last < tile) continue;  // warp-uniform; the next iteration's barrier is still reached

        // Scores: lane = key, each slot's dot product in order d = 0, 1, ..., D-1.
        float s[DEC_SLOTS];
#pragma unroll
        for (int r = 0; r < DEC_SLOTS; ++r) s[r] = 0.f;
        const float* krow = ks + lane * kstride;
        for (int d = 0; d < D; d += 4) {
            const float4 kk = *reinterpret_cast<const float4*>(krow + d);
#pragma unroll
            for (int r = 0; r < DEC_SLOTS; ++r) {
                const float4 qq = *reinterpret_cast<const float4*>(qs + (warp * DEC_SLOTS + r) * D + d);
                s[r] = __fmaf_rn(qq.x, kk.x, s[r]);
                s[r] = __fmaf_rn(qq.y, kk.y, s[r]);
                s[r] = __fmaf_rn(qq.z, kk.z, s[r]);
                s[r] = __fmaf_rn(qq.w, kk.w, s[r]);
            }
        }

        float p[DEC_SLOTS];
        int n_valid[DEC_SLOTS], n_valid_max;
        softmax_tile<NI>(s, my_pos, tile, scale, lane, m, l, o, p, n_valid, n_valid_max);
        // each V read (from the shared tile) serves all slots
        accumulate_pv<NI, 1>([&](int j, int i) { return vs[j * D + lane + 32 * i]; }, D, p, n_valid, n_valid_max, o);
    }

#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) {
        const int pr = pb * DEC_PAIRS + warp * DEC_SLOTS + r;
        if (pr >= n_pairs || my_pos[r] < chunk_start) continue;
        const size_t base = ((size_t)(pr / G) * H + g * G + pr % G) * n_chunks + chunk;
#pragma unroll
        for (int i = 0; i < NI; ++i)
            if (32 * i < D) part_o[base * D + lane + 32 * i] = o[r][i];
        if (lane == 0) part_ml[base] = make_float2(m[r], l[r]);
    }
}

// A value of a V row as float (one lane's dimension: the warp's reads of a row are coalesced).
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const __half* p) { return __half2float(*p); }

// Before PDL_ENTRY in the keys split (pdl.cuh): this block's K and V rows of its chunk and kv head into L2 while the
// kernel before still runs, up to the block's last visible key as decode_split_keys bounds it. pos comes from the
// host (the graph's position buffer), never from a kernel of the token; read early, it only steers a hint.
template <typename KV>
__device__ __forceinline__ void prefetch_chunk(const KV* kc, const KV* vc, const int* pos, int T, int H, int Hkv, int D,
                                               int n_kv) {
    const int G = H / Hkv, n_pairs = T * G, first = blockIdx.x * DEC_SLOTS, start = blockIdx.y * KV_CHUNK;
    int last = -1;
    for (int p = first; p < min(first + DEC_SLOTS, n_pairs); ++p) last = max(last, min(pos[p / G], n_kv - 1));
    const int keys = min(start + KV_CHUNK, last + 1) - start;
    const int lines = (D * (int)sizeof(KV) + 127) / 128;  // a row's 128-byte lines
    for (int i = threadIdx.x; i < 2 * keys * lines; i += blockDim.x) {
        const int key = start + (i >> 1) / lines, line = (i >> 1) % lines;
        const KV* row = ((i & 1) ? vc : kc) + ((size_t)key * Hkv + blockIdx.z) * D;
        pdl_prefetch_line(reinterpret_cast<const char*>(row) + 128 * line);
    }
}

// Decode split over keys. grid (pair blocks, chunks, Hkv), DEC_WARPS*32 threads. Every warp holds all
// DEC_SLOTS pairs of the block (pair p of kv head g as in decode_split, block x owning pairs
// [x*DEC_SLOTS, (x+1)*DEC_SLOTS)) and walks its own tiles of the chunk, tile w, w + DEC_WARPS, ..., reading
// K (lane = key) and V (lane = dimension) straight from global memory; the warps' partial (m, l, o) then
// merge in warp order. At one row the tiled split walked a chunk's 4 tiles one after another in one block:
// 8 chunks x 4 kv heads is 32 blocks at 1k keys, each a chain of 4 tile latencies. The tiles are fixed
// key ranges and the merge order is fixed, so a pair's bits still depend only on its own position.
template <typename KV, int DCAP>
__device__ __forceinline__ void decode_split_keys(const float* __restrict__ q, const KV* __restrict__ kc,
                                                  const KV* __restrict__ vc, const int* __restrict__ pos,
                                                  float* __restrict__ part_o, float2* __restrict__ part_ml,
                                                  int T, int H, int Hkv, int D, int n_kv, int n_chunks,
                                                  float scale) {
    constexpr int NI = DCAP / 32;
    __shared__ int s_pos[DEC_SLOTS];
    float* qs = reinterpret_cast<float*>(attn_smem);  // [DEC_SLOTS][D]
    float* ws = qs + DEC_SLOTS * D;                    // [DEC_WARPS][DEC_SLOTS][D]: the warps' o
    float2* wml = reinterpret_cast<float2*>(ws + DEC_WARPS * DEC_SLOTS * D);  // [DEC_WARPS][DEC_SLOTS]

    const int G = H / Hkv, n_pairs = T * G;
    const int pb = blockIdx.x, chunk = blockIdx.y, g = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk_start = chunk * KV_CHUNK;
    const int D4 = D / 4;

    if (tid < DEC_SLOTS) {
        const int p = pb * DEC_SLOTS + tid;
        s_pos[tid] = p < n_pairs ? min(pos[p / G], n_kv - 1) : -1;
    }
    __syncthreads();
    int my_pos[DEC_SLOTS], block_last = -1;
#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) block_last = max(block_last, my_pos[r] = s_pos[r]);
    // No pair of this block sees this chunk (block-uniform): most blocks of a graph replay, whose grid spans
    // the whole cache buffer, leave here.
    if (block_last < chunk_start) return;
    const int chunk_end = min(chunk_start + KV_CHUNK, block_last + 1);
    for (int idx = tid; idx < DEC_SLOTS * D4; idx += DEC_THREADS) {
        const int slot = idx / D4, d4 = idx - slot * D4, p = pb * DEC_SLOTS + slot;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (p < n_pairs) v = load4(q + ((size_t)(p / G) * H + g * G + p % G) * D + 4 * d4);
        *reinterpret_cast<float4*>(qs + slot * D + 4 * d4) = v;
    }
    __syncthreads();

    float m[DEC_SLOTS], l[DEC_SLOTS], o[DEC_SLOTS][NI];
#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < NI; ++i) o[r][i] = 0.f;
    }
    for (int tile = chunk_start + warp * DEC_TILE; tile < chunk_end; tile += DEC_WARPS * DEC_TILE) {
        // Scores: lane = key, each slot's dot product in order d = 0, 1, ..., D-1 (as decode_split).
        const int key = min(tile + lane, block_last);  // a clamped lane's score is masked below
        const KV* krow = kc + ((size_t)key * Hkv + g) * D;
        float s[DEC_SLOTS];
#pragma unroll
        for (int r = 0; r < DEC_SLOTS; ++r) s[r] = 0.f;
        for (int d0 = 0; d0 < D; d0 += 4 * DEC_K_AHEAD) {  // DEC_K_AHEAD loads of the key's row in flight at once
            float4 kk[DEC_K_AHEAD];
#pragma unroll
            for (int a = 0; a < DEC_K_AHEAD; ++a)
                if (d0 + 4 * a < D) kk[a] = load4(krow + d0 + 4 * a);
#pragma unroll
            for (int a = 0; a < DEC_K_AHEAD; ++a) {
                const int d = d0 + 4 * a;
                if (d >= D) break;
#pragma unroll
                for (int r = 0; r < DEC_SLOTS; ++r) {
                    const float4 qq = *reinterpret_cast<const float4*>(qs + r * D + d);
                    s[r] = __fmaf_rn(qq.x, kk[a].x, s[r]);
                    s[r] = __fmaf_rn(qq.y, kk[a].y, s[r]);
                    s[r] = __fmaf_rn(qq.z, kk[a].z, s[r]);
                    s[r] = __fmaf_rn(qq.w, kk[a].w, s[r]);
                }
            }
        }
        float p[DEC_SLOTS];
        int n_valid[DEC_SLOTS], n_valid_max;
        softmax_tile<NI>(s, my_pos, tile, scale, lane, m, l, o, p, n_valid, n_valid_max);
        const KV* vtile = vc + ((size_t)tile * Hkv + g) * D + lane;  // V straight from global memory
        accumulate_pv<NI, DEC_V_AHEAD>([&](int j, int i) { return load1(vtile + (size_t)j * Hkv * D + 32 * i); }, D, p, n_valid,
                          n_valid_max, o);
    }
#pragma unroll
    for (int r = 0; r < DEC_SLOTS; ++r) {
#pragma unroll
        for (int i = 0; i < NI; ++i)
            if (32 * i < D) ws[(warp * DEC_SLOTS + r) * D + lane + 32 * i] = o[r][i];
        if (lane == 0) wml[warp * DEC_SLOTS + r] = make_float2(m[r], l[r]);
    }
    __syncthreads();
    // Warp w merges slots w, w + DEC_WARPS, ...: the warps' partials in warp order, against their max.
    for (int r = warp; r < DEC_SLOTS; r += DEC_WARPS) {
        const int pr = pb * DEC_SLOTS + r;
        if (pr >= n_pairs || s_pos[r] < chunk_start) continue;
        float mx, den, num[NI];
        merge_warps<NI>(ws, wml, r, D, lane, mx, den, num);
        const size_t base = ((size_t)(pr / G) * H + g * G + pr % G) * n_chunks + chunk;
#pragma unroll
        for (int i = 0; i < NI; ++i)
            if (32 * i < D) part_o[base * D + lane + 32 * i] = num[i];
        if (lane == 0) part_ml[base] = make_float2(mx, den);
    }
}

// grid (H, T, D / 32), COMBINE_WARPS * 32 threads: out[t, h*D + d] = sum_c w_c o_c[d] / sum_c w_c l_c
// over the row's chunks 0..min(pos, n_kv-1)/KV_CHUNK, w_c = exp(m_c - max m). Warp i merges the
// chunks c = i mod COMBINE_WARPS against its own max, then warp 0 rescales and adds the warps' sums
// in warp order: the chunks' loads overlap across warps (one thread walking every chunk waited out a
// load per chunk: 55 us at 32k keys), and the order depends only on the row's own position, so rows
// stay batch-invariant.
#define COMBINE_WARPS 8
extern "C" __global__ void __launch_bounds__(COMBINE_WARPS * 32)
attn_decode_combine(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                    const int* __restrict__ pos, float* __restrict__ out, int H, int D, int n_kv,
                    int n_chunks) {
    PDL_ENTRY();
    __shared__ float s_m[COMBINE_WARPS], s_den[COMBINE_WARPS], s_num[COMBINE_WARPS][32];
    const int h = blockIdx.x, t = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int d = blockIdx.z * 32 + lane;
    const int last = min(pos[t], n_kv - 1);
    const int nc = last >= 0 ? last / KV_CHUNK + 1 : 0;
    const size_t base = ((size_t)t * H + h) * n_chunks;
    float m = NEG_INF;
    for (int c = w; c < nc; c += COMBINE_WARPS) m = fmaxf(m, part_ml[base + c].x);
    float num = 0.f, den = 0.f;
    for (int c = w; c < nc; c += COMBINE_WARPS) {
        const float2 ml = part_ml[base + c];
        const float wt = expf(__fsub_rn(ml.x, m));
        den = __fmaf_rn(ml.y, wt, den);
        num = __fmaf_rn(part_o[(base + c) * D + d], wt, num);
    }
    if (lane == 0) {
        s_m[w] = m;
        s_den[w] = den;
    }
    s_num[w][lane] = num;
    __syncthreads();
    if (w != 0) return;
    float mx = s_m[0];
    for (int i = 1; i < COMBINE_WARPS; ++i) mx = fmaxf(mx, s_m[i]);
    float total = 0.f, norm = 0.f;
    for (int i = 0; i < COMBINE_WARPS; ++i) {
        if (s_m[i] == NEG_INF) continue;  // a warp with no chunk (the row has fewer than COMBINE_WARPS)
        const float sc = expf(__fsub_rn(s_m[i], mx));
        total = __fmaf_rn(s_num[i][lane], sc, total);
        norm = __fmaf_rn(s_den[i], sc, norm);
    }
    out[((size_t)t * H + h) * D + d] = __fdiv_rn(total, norm);
}

// ---------------------------------------------------------------------------------------------
// Prefill. grid (ceil(T / PF_BQ), H), PF_THREADS threads. Shared: qt [D][PF_BQ] (q transposed),
// kv [D][PF_BK] (K transposed) reused as [PF_BK][D] (V), pt [PF_BK][PF_BQ] (P transposed).
template <typename KV, int DCAP>
__device__ __forceinline__ void prefill(const float* __restrict__ q, const KV* __restrict__ kc,
                                        const KV* __restrict__ vc, const int* __restrict__ pos,
                                        float* __restrict__ out, int T, int H, int Hkv, int D, int n_kv,
                                        float scale) {
    constexpr int NC = DCAP / 16;  // output columns per thread: tx + 16 c
    __shared__ int s_pos[PF_BQ];
    __shared__ int s_last;
    float* qt = reinterpret_cast<float*>(attn_smem);
    float* kv = qt + D * PF_BQ;
    float* pt = kv + D * PF_BK;

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int h = blockIdx.y, g = h / (H / Hkv), row0 = blockIdx.x * PF_BQ;
    const int D4 = D / 4;

    if (tid < PF_BQ) s_pos[tid] = row0 + tid < T ? min(pos[row0 + tid], n_kv - 1) : -1;
    for (int idx = tid; idx < PF_BQ * D4; idx += PF_THREADS) {
        const int i = idx % PF_BQ, d = 4 * (idx / PF_BQ);
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row0 + i < T) v = load4(q + ((size_t)(row0 + i) * H + h) * D + d);
        qt[(d + 0) * PF_BQ + i] = v.x;
        qt[(d + 1) * PF_BQ + i] = v.y;
        qt[(d + 2) * PF_BQ + i] = v.z;
        qt[(d + 3) * PF_BQ + i] = v.w;
    }
    __syncthreads();
    if (tid == 0) {
        int last = -1;
        for (int i = 0; i < PF_BQ; ++i) last = max(last, s_pos[i]);
        s_last = last;
    }
    __syncthreads();
    const int key_end = s_last + 1;  // keys past every row's position are never loaded

    int rp[4];
    float m[4], l[4], o[4][NC];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        rp[a] = s_pos[4 * ty + a];
        m[a] = NEG_INF;
        l[a] = 0.f;
#pragma unroll
        for (int c = 0; c < NC; ++c) o[a][c] = 0.f;
    }

    for (int k0 = 0; k0 < key_end; k0 += PF_BK) {
        __syncthreads();  // the previous tile's V and P reads are done
        for (int idx = tid; idx < PF_BK * D4; idx += PF_THREADS) {
            const int j = idx % PF_BK, d = 4 * (idx / PF_BK), key = k0 + j;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (key < n_kv) v = load4(kc + ((size_t)key * Hkv + g) * D + d);
            kv[(d + 0) * PF_BK + j] = v.x;
            kv[(d + 1) * PF_BK + j] = v.y;
            kv[(d + 2) * PF_BK + j] = v.z;
            kv[(d + 3) * PF_BK + j] = v.w;
        }
        __syncthreads();

        float s[4][4];
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int b = 0; b < 4; ++b) s[a][b] = 0.f;
        for (int d = 0; d < D; ++d) {
            const float4 qa = *reinterpret_cast<const float4*>(qt + d * PF_BQ + 4 * ty);
            const float4 kb = *reinterpret_cast<const float4*>(kv + d * PF_BK + 4 * tx);
            const float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kvv[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int b = 0; b < 4; ++b) s[a][b] = __fmaf_rn(qv[a], kvv[b], s[a][b]);
        }

        // Mask, scale and the online softmax; a row's 16 threads (same ty) are 16 lanes of one warp.
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            float mt = NEG_INF;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                s[a][b] = k0 + 4 * tx + b <= rp[a] ? __fmul_rn(s[a][b], scale) : NEG_INF;
                mt = fmaxf(mt, s[a][b]);
            }
            for (int off = 8; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(FULL_MASK, mt, off));
            const float m_new = fmaxf(m[a], mt);
            const float m_use = m_new == NEG_INF ? 0.f : m_new;  // a row that has seen no key yet
            const float alpha = expf(__fsub_rn(m[a], m_use));
            float rs = 0.f;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                s[a][b] = expf(__fsub_rn(s[a][b], m_use));
                rs = __fadd_rn(rs, s[a][b]);
            }
            for (int off = 8; off > 0; off >>= 1) rs = __fadd_rn(rs, __shfl_xor_sync(FULL_MASK, rs, off));
            l[a] = __fadd_rn(__fmul_rn(l[a], alpha), rs);
            m[a] = m_new;
#pragma unroll
            for (int c = 0; c < NC; ++c) o[a][c] = __fmul_rn(o[a][c], alpha);
        }
        __syncthreads();  // every thread is done with K
#pragma unroll
        for (int b = 0; b < 4; ++b)
            *reinterpret_cast<float4*>(pt + (4 * tx + b) * PF_BQ + 4 * ty) =
                make_float4(s[0][b], s[1][b], s[2][b], s[3][b]);
        for (int idx = tid; idx < PF_BK * D4; idx += PF_THREADS) {
            const int j = idx / D4, d = 4 * (idx - j * D4), key = k0 + j;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (key < n_kv) v = load4(vc + ((size_t)key * Hkv + g) * D + d);
            *reinterpret_cast<float4*>(kv + j * D + d) = v;
        }
        __syncthreads();

        const int jn = min(PF_BK, key_end - k0);
        for (int j = 0; j < jn; ++j) {
            const float4 pa = *reinterpret_cast<const float4*>(pt + j * PF_BQ + 4 * ty);
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                if (16 * c < D) {
                    const float vv = kv[j * D + tx + 16 * c];
                    o[0][c] = __fmaf_rn(pa.x, vv, o[0][c]);
                    o[1][c] = __fmaf_rn(pa.y, vv, o[1][c]);
                    o[2][c] = __fmaf_rn(pa.z, vv, o[2][c]);
                    o[3][c] = __fmaf_rn(pa.w, vv, o[3][c]);
                }
            }
        }
    }

#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int row = row0 + 4 * ty + a;
        if (row >= T) continue;
        float* orow = out + ((size_t)row * H + h) * D;
#pragma unroll
        for (int c = 0; c < NC; ++c)
            if (16 * c < D) orow[tx + 16 * c] = __fdiv_rn(o[a][c], l[a]);
    }
}

#define ATTN_KERNELS(KVT, TAG, DCAP)                                                                \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                       \
        attn_decode_split_##TAG##_d##DCAP(const float* q, const KVT* kc, const KVT* vc,             \
                                          const int* pos, float* part_o, float2* part_ml, int T,    \
                                          int H, int Hkv, int D, int n_kv, int n_chunks,            \
                                          float scale) {                                            \
        PDL_ENTRY();                                                                                \
        decode_split<KVT, DCAP>(q, kc, vc, pos, part_o, part_ml, T, H, Hkv, D, n_kv, n_chunks,      \
                                scale);                                                             \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                       \
        attn_decode_keys_##TAG##_d##DCAP(const float* q, const KVT* kc, const KVT* vc,              \
                                         const int* pos, float* part_o, float2* part_ml, int T,     \
                                         int H, int Hkv, int D, int n_kv, int n_chunks,             \
                                         float scale) {                                             \
        prefetch_chunk<KVT>(kc, vc, pos, T, H, Hkv, D, n_kv);                                       \
        PDL_ENTRY();                                                                                \
        decode_split_keys<KVT, DCAP>(q, kc, vc, pos, part_o, part_ml, T, H, Hkv, D, n_kv, n_chunks, \
                                     scale);                                                        \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(PF_THREADS)                                        \
        attn_prefill_##TAG##_d##DCAP(const float* q, const KVT* kc, const KVT* vc, const int* pos,  \
                                     float* out, int T, int H, int Hkv, int D, int n_kv,            \
                                     float scale) {                                                 \
        PDL_ENTRY();                                                                                \
        prefill<KVT, DCAP>(q, kc, vc, pos, out, T, H, Hkv, D, n_kv, scale);                         \
    }

// DCAP is the largest head dim a kernel holds in registers; D itself is a runtime multiple of 32.
ATTN_KERNELS(float, f32, 64)
ATTN_KERNELS(float, f32, 128)
ATTN_KERNELS(float, f32, 256)
ATTN_KERNELS(__half, f16, 64)
ATTN_KERNELS(__half, f16, 128)
ATTN_KERNELS(__half, f16, 256)
