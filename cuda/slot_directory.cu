// One MoE layer's expert -> slot directory served on the device by one warp (issue 20): the numpy twin
// is runner/offload/slot_directory.py, whose choices are ExpertSlotCache's. Lane 0 walks the batch's
// distinct experts oldest first and writes the directory; the victim search and the aging of LFU
// counts are spread over the 32 lanes, with __syncwarp between (it orders the lanes' memory accesses).

#define DIR_MAX_EXPERTS 512
#define DIR_MAX_PAIRS 256
#define FREE_SLOT (-1)

// scalars: clock, filled, hits, misses, evictions (int64 each)
extern "C" __global__ void __launch_bounds__(32)
directory_serve(const int* __restrict__ ids, int n_pairs, int k, int* slot_of, int* expert_of, long long* last,
                double* count, long long* scalars, int n_expert, int n_slots, int lfu, long long period,
                int* __restrict__ pair_slots, int* __restrict__ fills, int* __restrict__ n_fills) {
    __shared__ int wanted[DIR_MAX_PAIRS];
    __shared__ unsigned char protect[DIR_MAX_EXPERTS];
    __shared__ int n_wanted;
    const int lane = threadIdx.x;
    for (int e = lane; e < n_expert; e += 32) protect[e] = 0;
    __syncwarp();
    if (lane == 0) {  // experts_by_recency: the last token's first (by rank), then earlier tokens', each once
        int n = 0;
        for (int t = n_pairs / k - 1; t >= 0; --t)
            for (int j = 0; j < k; ++j) {
                const int e = ids[t * k + j];
                if (!protect[e]) { protect[e] = 1; wanted[n++] = e; }
            }
        n_wanted = n;
    }
    __syncwarp();
    long long clock = scalars[0], filled = scalars[1];
    int n_fill = 0;
    for (int w = n_wanted - 1; w >= 0; --w) {  // oldest first
        const int e = wanted[w];
        int slot = slot_of[e];
        if (slot != FREE_SLOT) {
            if (lane == 0) scalars[2] += 1;
        } else {
            if (filled < n_slots) {
                slot = (int)filled++;
            } else {  // least recent (lru) or least (count, last) (lfu) slot whose expert the batch does not use
                double best_count = 1e300;
                long long best_last = 0x7fffffffffffffffLL;
                int best = n_slots;
                for (int s = lane; s < n_slots; s += 32) {
                    if (protect[expert_of[s]]) continue;
                    const double c = lfu ? count[s] : 0.0;
                    if (c < best_count || (c == best_count && last[s] < best_last)) {
                        best_count = c; best_last = last[s]; best = s;
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
                if (lane == 0) { slot_of[expert_of[slot]] = FREE_SLOT; scalars[4] += 1; }
            }
            if (lane == 0) {
                slot_of[e] = slot; expert_of[slot] = e; count[slot] = 0.0; scalars[3] += 1;
                fills[2 * n_fill] = e; fills[2 * n_fill + 1] = slot;
            }
            ++n_fill;
        }
        ++clock;  // the touch
        if (lane == 0) { last[slot] = clock; if (lfu) count[slot] += 1.0; }
        __syncwarp();
        if (lfu && clock % period == 0)
            for (int s = lane; s < filled; s += 32) count[s] *= 0.5;
        __syncwarp();
    }
    for (int p = lane; p < n_pairs; p += 32) pair_slots[p] = slot_of[ids[p]];
    if (lane == 0) { scalars[0] = clock; scalars[1] = filled; *n_fills = n_fill; }
}
