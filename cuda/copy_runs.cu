// Device-to-device copies of equal-sized runs by an offset table, on the SMs of the stream that launches
// them (the warm fill from staging: a layer's warm experts into its cache slots, ~150 runs of ~2 MB).
// One launch instead of one copy-engine call per run, and off the copy stream, whose next upload it
// would otherwise delay. Offsets and the run length are in words of the kernel's width.


template <typename Word>
__device__ __forceinline__ void copy_run(const Word* __restrict__ src, Word* __restrict__ dst,
                                         const long long* __restrict__ src_off, const long long* __restrict__ dst_off,
                                         long long words) {
    const Word* s = src + src_off[blockIdx.y];
    Word* d = dst + dst_off[blockIdx.y];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (long long)gridDim.x * blockDim.x)
        d[i] = s[i];
}

extern "C" __global__ void copy_runs_16(const uint4* src, uint4* dst, const long long* src_off,
                                        const long long* dst_off, long long words) {
    copy_run(src, dst, src_off, dst_off, words);
}

extern "C" __global__ void copy_runs_4(const unsigned int* src, unsigned int* dst, const long long* src_off,
                                       const long long* dst_off, long long words) {
    copy_run(src, dst, src_off, dst_off, words);
}

extern "C" __global__ void copy_runs_1(const unsigned char* src, unsigned char* dst, const long long* src_off,
                                       const long long* dst_off, long long words) {
    copy_run(src, dst, src_off, dst_off, words);
}
