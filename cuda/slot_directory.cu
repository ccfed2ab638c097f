// One MoE layer's expert -> slot directory served on the device by one warp (issue 20): the numpy twin
// is runner/offload/slot_directory.py, whose choices are ExpertSlotCache's. The warp copies the layer's
// directory into shared memory (every load at once; in a decode graph before the PDL wait), lane 0 walks the
// batch's distinct experts oldest first and writes the copy, the victim search and the aging of LFU counts are
// spread over the 32 lanes, with __syncwarp between (it orders the lanes' memory accesses), and the warp writes
// the copy back. Walking the copy instead of global memory takes the walk's chain of dependent loads (a slot,
// then its expert, its recency, its count, expert after expert) from L2's latency to shared memory's.
//
// A decode graph (runner/backends/cuda/token_graph.py) runs directory_serve, then directory_fill, then the
// expert kernels, at every MoE layer with no host step: the geometry (where the slots and the layer's
// experts in pinned host memory start) is read from device memory, so a graph captured once stays valid
// when a prompt's phase transaction moves the slots.

#include "pdl.cuh"

#define DIR_MAX_EXPERTS 512
#ifndef FILL_UNROLL  // slot_directory.py's FILL_UNROLL
#define FILL_UNROLL 1
#endif
#define DIR_MAX_PAIRS 256
#define FREE_SLOT (-1)

// geometry (uint64 each): slot 0's address, expert bytes, the gate, up and down offsets in an expert, and the
// address of the layer's expert 0 in pinned host memory (mapped: with unified addressing the host pointer
// is the device's). Expert e is `expert bytes` long at host + e * bytes; slot s at slot0 + s * bytes.
#define GEO_SLOT0 0
#define GEO_EXPERT_BYTES 1
#define GEO_GATE 2
#define GEO_DOWN 4
#define GEO_HOST 5
#define GEO_COUNT 6

// scalars: clock, filled, hits, misses, evictions, prefetched (int64 each). With geometry, table [3, table_stride]
// gets each pair's gate, up and down address in its first n_pairs columns (the expert kernels' pointers; the
// columns after them, a folded shared expert's, are the caller's); without (null), only pair_slots. fresh (when
// not null) gets 1 for each pair whose expert this step fills, else 0: the expert kernels can run the other pairs
// while the fill kernel copies (token_graph.py, OVERLAP_FILLS).
// With `prefetch`, ids are guesses at a batch to come (a layer ahead: token_graph.py, PREFETCH_DEPTH): the same
// walk claims slots for the guesses not held and lists their fills, but counts them as prefetched, not as misses,
// counts no hits, and writes no pair outputs (pair_slots, table and fresh are not touched).
// `pending` (not null): such a prefetch's fills [n_pending, 2] whose bytes may still be crossing on the fill stream
// (token_graph.py waits for the prefetch's walk only): a pair whose expert is among them counts as fresh too, so
// the expert kernels run it in the pass after the fills.
struct DirSmem {
    int wanted[DIR_MAX_PAIRS], ids[DIR_MAX_PAIRS];
    unsigned char protect[DIR_MAX_EXPERTS];
    int n_wanted;
    // the layer's directory (n_slots <= n_expert <= DIR_MAX_EXPERTS), read here and written back at the end
    int slot_of[DIR_MAX_EXPERTS], expert_of[DIR_MAX_EXPERTS];
    long long last[DIR_MAX_EXPERTS];
    double count[DIR_MAX_EXPERTS];
    long long clock, filled;
    unsigned long long geometry[GEO_COUNT];
};

// The layer's directory, its clock and fill count, and the geometry into shared memory, every lane's loads at once:
// the walk's copies then come from shared memory, not a chain of L2 round trips.
__device__ __forceinline__ void load_directory(const int* slot_of, const int* expert_of, const long long* last,
                                               const double* count, const long long* scalars,
                                               const unsigned long long* geometry, int n_expert, int n_slots,
                                               int lfu, DirSmem& sm) {
    constexpr int PER_LANE = DIR_MAX_EXPERTS / 32;
    const int lane = threadIdx.x;
    int slot_v[PER_LANE], expert_v[PER_LANE];  // all loads first, then the stores: every load in flight together
    long long last_v[PER_LANE];
    double count_v[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int e = lane + 32 * i;
        slot_v[i] = e < n_expert ? slot_of[e] : 0;
        expert_v[i] = e < n_slots ? expert_of[e] : 0;
        last_v[i] = e < n_slots ? last[e] : 0;
        count_v[i] = lfu && e < n_slots ? count[e] : 0.0;
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int e = lane + 32 * i;
        if (e < n_expert) sm.protect[e] = 0, sm.slot_of[e] = slot_v[i];
        if (e < n_slots) sm.expert_of[e] = expert_v[i], sm.last[e] = last_v[i], sm.count[e] = count_v[i];
    }
    if (lane == 0) sm.clock = scalars[0], sm.filled = scalars[1];
    if (geometry != nullptr && lane < GEO_COUNT) sm.geometry[lane] = geometry[lane];
}

// load_directory before the PDL wait, when the launcher says so (`early`): the directory is state that only this
// layer's earlier serves write (and the host, between graph launches), so a programmatic launch may read it while
// the kernel right ahead still runs if that kernel is not one of them (pdl.cuh). In a decode graph it is the
// layer's router (a prefetch's walk joins by a full edge); a serve right behind a serve of its layer is not early.
__device__ __forceinline__ void early_directory(int early, const int* slot_of, const int* expert_of,
                                                const long long* last, const double* count, const long long* scalars,
                                                const unsigned long long* geometry, int n_expert, int n_slots, int lfu,
                                                DirSmem& sm) {
    if (early) load_directory(slot_of, expert_of, last, count, scalars, geometry, n_expert, n_slots, lfu, sm);
}

extern "C" __global__ void __launch_bounds__(32)
directory_serve(const int* __restrict__ ids, int n_pairs, int k, int* slot_of, int* expert_of, long long* last,
                double* count, long long* scalars, int n_expert, int n_slots, int lfu, long long period,
                int* __restrict__ pair_slots, int* __restrict__ fills, int* __restrict__ n_fills,
                const unsigned long long* __restrict__ geometry, unsigned long long* __restrict__ table,
                int table_stride, int* __restrict__ fresh, int prefetch, const int* __restrict__ pending,
                const int* __restrict__ n_pending, int early) {
    __shared__ DirSmem sm;
    early_directory(early, slot_of, expert_of, last, count, scalars, geometry, n_expert, n_slots, lfu, sm);
    PDL_ENTRY();
    if (!early) load_directory(slot_of, expert_of, last, count, scalars, geometry, n_expert, n_slots, lfu, sm);
    const int lane = threadIdx.x;
#pragma unroll
    for (int i = 0; i < DIR_MAX_PAIRS / 32; ++i) {  // the router's ids, every lane's at once
        const int p = lane + 32 * i;
        if (p < n_pairs) sm.ids[p] = ids[p];
    }
    __syncwarp();
    if (lane == 0) {  // experts_by_recency: the last token's first (by rank), then earlier tokens', each once
        int n = 0;
        for (int t = n_pairs / k - 1; t >= 0; --t)
            for (int j = 0; j < k; ++j) {
                const int e = sm.ids[t * k + j];
                if (!sm.protect[e]) { sm.protect[e] = 1; sm.wanted[n++] = e; }
            }
        sm.n_wanted = n;
    }
    __syncwarp();
    long long clock = sm.clock, filled = sm.filled, hits = 0, misses = 0, evictions = 0;  // lane 0's counts
    long long prefetched = 0;
    int n_fill = 0;
    for (int w = sm.n_wanted - 1; w >= 0; --w) {  // oldest first
        const int e = sm.wanted[w];
        // Lane 0 reads the slot and the shuffle hands it to every lane. Each lane reading sm.slot_of[e] itself
        // races lane 0's write of it below (no __syncwarp between): a lane that ran behind would see the new
        // slot, take it for a hit, and its filled and n_fill would part from lane 0's (divergent shuffles).
        int slot = FREE_SLOT;
        if (lane == 0) slot = sm.slot_of[e];
        slot = __shfl_sync(0xffffffffu, slot, 0);
        if (slot != FREE_SLOT) {
            if (lane == 0 && !prefetch) ++hits;
        } else {
            if (filled < n_slots) {
                slot = (int)filled++;
            } else {  // least recent (lru) or least (count, last) (lfu) slot whose expert the batch does not use
                double best_count = 1e300;
                long long best_last = 0x7fffffffffffffffLL;
                int best = n_slots;
                for (int s = lane; s < n_slots; s += 32) {
                    if (sm.protect[sm.expert_of[s]]) continue;
                    const double c = lfu ? sm.count[s] : 0.0;
                    if (c < best_count || (c == best_count && sm.last[s] < best_last)) {
                        best_count = c; best_last = sm.last[s]; best = s;
                    }
                }
                for (int off = 16; off > 0; off >>= 1) {
                    const double oc = __shfl_down_sync(0xffffffffu, best_count, off);
                    const long long ol = __shfl_down_sync(0xffffffffu, best_last, off);
                    const int os = __shfl_down_sync(0xffffffffu, best, off);
                    if (oc < best_count || (oc == best_count && (ol < best_last || (ol == best_last && os < best)))) {
                        best_count = oc; best_last = ol; best = os;
                    }
                }
                slot = __shfl_sync(0xffffffffu, best, 0);
                if (lane == 0) { sm.slot_of[sm.expert_of[slot]] = FREE_SLOT; ++evictions; }
            }
            if (lane == 0) {
                sm.slot_of[e] = slot; sm.expert_of[slot] = e; sm.count[slot] = 0.0;
                if (prefetch) ++prefetched; else ++misses;
                fills[2 * n_fill] = e; fills[2 * n_fill + 1] = slot;
                sm.protect[e] = 2;  // filled this step (still nonzero: the batch uses it)
            }
            ++n_fill;
        }
        ++clock;  // the touch
        if (lane == 0) { sm.last[slot] = clock; if (lfu) sm.count[slot] += 1.0; }
        __syncwarp();
        if (lfu && clock % period == 0)
            for (int s = lane; s < filled; s += 32) sm.count[s] *= 0.5;
        __syncwarp();
    }
    for (int p = lane; p < (prefetch ? 0 : n_pairs); p += 32) {
        const int e = sm.ids[p], slot = sm.slot_of[e];
        pair_slots[p] = slot;
        if (fresh != nullptr) {
            int f = sm.protect[e] == 2;
            if (pending != nullptr)
                for (int i = 0; i < *n_pending; ++i) f |= pending[2 * i] == e;
            fresh[p] = f;
        }
        if (geometry != nullptr) {
            const unsigned long long at =
                sm.geometry[GEO_SLOT0] + (unsigned long long)slot * sm.geometry[GEO_EXPERT_BYTES];
            for (int m = 0; m < 3; ++m) table[(long long)m * table_stride + p] = at + sm.geometry[GEO_GATE + m];
        }
    }
    for (int e = lane; e < n_expert; e += 32) slot_of[e] = sm.slot_of[e];
    for (int s = lane; s < n_slots; s += 32) {
        expert_of[s] = sm.expert_of[s];
        last[s] = sm.last[s];
        if (lfu) count[s] = sm.count[s];
    }
    if (lane == 0) {
        scalars[0] = clock; scalars[1] = filled; scalars[2] += hits; scalars[3] += misses; scalars[4] += evictions;
        scalars[5] += prefetched;
        *n_fills = n_fill;
    }
}

// The fills directory_serve chose: expert fills[2f] copied from pinned host memory into slot fills[2f + 1],
// read over PCIe by this kernel (zero-copy; no copy engine, no host step). Grid (blocks per expert, most
// fills); a block whose fill index is past n_fills returns at once. 16-byte words when the addresses and
// the size allow (GGUF expert matrices are whole quant blocks, usually 16-byte multiples), else 4, else 1.
// `part`: 0 the whole expert, 1 its gate and up (the bytes before the down offset), 2 its down (from there on):
// the gate-up launch of the filled pairs can start while the down bytes still cross (token_graph.py, SPLIT_FILLS).
extern "C" __global__ void __launch_bounds__(256)
directory_fill(const int* __restrict__ fills, const int* __restrict__ n_fills,
               const unsigned long long* __restrict__ geometry, int part) {
    PDL_ENTRY();
    const int f = blockIdx.y;
    if (f >= *n_fills) return;
    const unsigned long long size = geometry[GEO_EXPERT_BYTES], split = geometry[GEO_DOWN];
    const unsigned long long lo = part == 2 ? split : 0ull, bytes = (part == 1 ? split : size) - lo;
    const unsigned long long src = geometry[GEO_HOST] + (unsigned long long)fills[2 * f] * size + lo;
    const unsigned long long dst = geometry[GEO_SLOT0] + (unsigned long long)fills[2 * f + 1] * size + lo;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    if (((src | dst | bytes) & 15) == 0) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        const unsigned long long n = bytes / 16;
        unsigned long long i = first;
        // FILL_UNROLL words a thread in flight over PCIe before their stores (the compiler cannot hoist a load past
        // a store that may alias it): the same words, each copied once.
        for (; i + (FILL_UNROLL - 1) * stride < n; i += FILL_UNROLL * stride) {
            uint4 v[FILL_UNROLL];
#pragma unroll
            for (int j = 0; j < FILL_UNROLL; ++j) v[j] = s[i + j * stride];
#pragma unroll
            for (int j = 0; j < FILL_UNROLL; ++j) d[i + j * stride] = v[j];
        }
        for (; i < n; i += stride) d[i] = s[i];
    } else if (((src | dst | bytes) & 3) == 0) {
        const unsigned int* s = (const unsigned int*)src;
        unsigned int* d = (unsigned int*)dst;
        for (unsigned long long i = first; i < bytes / 4; i += stride) d[i] = s[i];
    } else {
        const unsigned char* s = (const unsigned char*)src;
        unsigned char* d = (unsigned char*)dst;
        for (unsigned long long i = first; i < bytes; i += stride) d[i] = s[i];
    }
}
