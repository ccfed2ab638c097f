// Programmatic dependent launch (sm_90+; runner/backends/cuda/launch.py). A kernel launched with the
// programmatic-serialization attribute may start while the kernel before it on its stream still runs; it must
// then wait for that kernel's end before it reads or writes anything the kernels before it touch.
//
// PDL_ENTRY(), the first statement of every kernel of a module in launch.PDL_MODULES (tests/test_pdl_launch.py
// checks the sources): wait for the kernel before (its end and its memory), then let the kernel after launch.
// Waiting first keeps the overlap one kernel deep, so a chain of launches never fills the SMs with blocks that
// only wait, and every kernel's end still implies the end of all before it. Launched without the attribute, or
// on an older GPU, both are no-ops: the kernel runs as it always did, with the same bits.
//
// Prefetches before PDL_ENTRY() (PDL_PREFETCH_L2, pdl_prefetch_line, a kernel's prefetch_* helpers): ask L2 for
// bytes the kernel will read (a product's weights, attention's K and V rows) while the kernel before still runs.
// A hint only: L2 is where writes land, so a prefetch cannot make a later load stale; what steers one may be read
// early only if no kernel writes it (weights, the positions the host uploads).
//
// Reads before PDL_ENTRY() (early_* helpers, slot_directory.cu's early_directory): when a kernel starts, every kernel
// before the one right ahead of it on its stream has ended (that one waited for them), and a join from another
// stream is a full edge. So a kernel may read early what only those write, never the kernel right ahead of it
// (directory_serve's layer directory: written by that layer's earlier serves, read after its router). Each such
// helper says which kernel it relies on not writing.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT() ((void)0)
#define PDL_TRIGGER() ((void)0)
#endif
#define PDL_ENTRY()    \
    do {               \
        PDL_WAIT();    \
        PDL_TRIGGER(); \
    } while (0)

// The 128-byte line holding p into L2 (this thread alone).
__device__ __forceinline__ void pdl_prefetch_line(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// bytes from p, one prefetch a 128-byte line, the block's threads taking lines in turn (a product's tile rows are
// contiguous).
__device__ __forceinline__ void pdl_prefetch_l2(const void* p, long long bytes) {
    const char* base = static_cast<const char*>(p);
    for (long long at = (long long)threadIdx.x * 128; at < bytes; at += (long long)blockDim.x * 128)
        pdl_prefetch_line(base + at);
}
#define PDL_PREFETCH_L2(p, bytes) pdl_prefetch_l2((p), (bytes))
