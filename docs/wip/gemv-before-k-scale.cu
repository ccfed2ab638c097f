// Products of 1..8 float32 rows with a GGUF-quantized weight, read straight from its blocks:
// y[r, n] = sum_k x[r, k] * W[n, k]. Decode and speculative verify; memory-bound.
//
// A CTA computes a tile of GEMV_TILE columns (32 at the default 512 threads; any count of threads gives the
// same bits). A row of W is cut into units (a
// fixed slice of a block, Unit::UNIT values), and one of two layouts, fixed per module, assigns them:
// - columns (GEMV_COLUMNS=1): 16 threads a column; thread t owns column t % GEMV_TILE and K slice
//   s = t / GEMV_TILE, the units [s per, (s + 1) per), per = ceil(units / 16), in order; the 16 slices'
//   sums are then added in slice order. Each thread reads its own row, 16 bytes at a time.
// - units (GEMV_COLUMNS=0): warp s owns columns 2s and 2s + 1; lane l takes units l, l + 32, ... in
//   order and a fixed xor-shuffle tree adds the 32 lanes. Lanes read neighbouring bytes of a row.
// Batch invariance: each of the R rows has its own accumulator, fed the same float32 operations in
// the same order whatever R, the other rows, the other columns or pairs of the launch, so a column's
// result depends only on (qtype, K, layout, its x row, its bytes); gemv, expert_gemv and
// expert_gate_up share tile_dot, so all three agree bit for bit. All float math is __f*_rn /
// __fmaf_rn, which the compiler neither fuses nor reorders.
//
// A Unit: UNIT values per unit in GROUPS groups of GW (8, or 1 for float rows with K % 8 != 0).
// load() fetches a unit's bytes with 16-byte loads (load_span for blocks that are not 16-byte
// aligned); decode(j) writes group j's weights to v; FACTORED units write integer codes and the
// scale that multiplies the group's partial dot instead (one multiply per group, not per value).
// x_index(u, j) is the column of x where group j's GW contiguous values start.
#include "blocks.cuh"
#include "pdl.cuh"
#include "rms_norm.cuh"
#include "route.cuh"

#ifndef GEMV_THREADS  // 512; a module whose matrices all take the units layout may pass fewer (gemv.py UNITS_WARPS)
#define GEMV_THREADS 512
#endif
#define GEMV_WARPS (GEMV_THREADS / 32)
#ifndef GEMV_WARP_COLUMNS  // columns a warp owns (the same bits at any count): units layout 2 or 1 (gemv.py
                           // UNITS_WARP_COLUMNS), columns layout 2 or 4, 1 or 2 a thread (COLUMNS_PER_THREAD)
#define GEMV_WARP_COLUMNS 2
#endif
#ifndef GEMV_TILE_WARPS  // warps that compute the tile's columns in the units layout: all, but the router's launch
                         // (gemv.py ROUTE_TILE_WARPS) keeps a thread an expert for its ranking and may tile fewer
#define GEMV_TILE_WARPS GEMV_WARPS
#endif
#define GEMV_TILE (GEMV_WARP_COLUMNS * GEMV_TILE_WARPS)  // columns per CTA: 32 at 512 threads, the columns layout's lanes
#define GEMV_MAX_ROWS 8

#define MAGIC 8388608.0f  // 2^23: the float with bits 0x4B000000

__device__ __forceinline__ unsigned ld16(const u8* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
__device__ __forceinline__ unsigned ld32(const u8* p) { return __ldg(reinterpret_cast<const unsigned*>(p)); }
__device__ __forceinline__ uint4 ld128(const u8* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// NW little-endian words of the bytes p .. p + 4 NW - 1 (any alignment; only the first LIMIT bytes are
// needed) with 16-byte loads: the aligned chunks holding those bytes, then the words picked out by
// selects and funnel shifts. In the columns layout each lane reads its own row, so 16 bytes per load
// instruction matter more than the few extra ALU operations.
template <int NW, int LIMIT = 4 * NW>
__device__ __forceinline__ void load_span(const u8* p, unsigned* w) {
    constexpr int NC = (4 * NW + 15) / 16 + 1;  // chunks a span can touch
    const unsigned long long addr = reinterpret_cast<unsigned long long>(p), base = addr & ~15ull;
    const unsigned off = (unsigned)(addr & 15), q = off >> 2, shift = (off & 3) * 8;
    unsigned a[4 * NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (c == 0 || base + 16 * c < addr + LIMIT) v = ld128(reinterpret_cast<const u8*>(base + 16 * c));
        a[4 * c] = v.x, a[4 * c + 1] = v.y, a[4 * c + 2] = v.z, a[4 * c + 3] = v.w;
    }
    unsigned lo = q == 0 ? a[0] : q == 1 ? a[1] : q == 2 ? a[2] : a[3];
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        const unsigned hi = q == 0 ? a[i + 1] : q == 1 ? a[i + 2] : q == 2 ? a[i + 3] : a[i + 4];
        w[i] = __funnelshift_r(lo, hi, shift);
        lo = hi;
    }
}

// Byte k of w minus (bias - 2^23), exactly: the bits 0x4B0000bb are the float 2^23 + bb.
__device__ __forceinline__ float byte_value(unsigned w, int k, float bias) {
    return __fsub_rn(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u | (unsigned)k)), bias);
}

// Four 4-bit fields (one per byte of w, bits 0..3) to bits 4 of the bytes: bit n -> byte n.
__device__ __forceinline__ unsigned spread4(unsigned bits) { return ((bits * 0x00204081u) & 0x01010101u) << 4; }

// Each byte of q (an index 0..15) replaced by entry q of a 16-entry int8 table held in t0..t3.
__device__ __forceinline__ unsigned lookup16(unsigned q, unsigned t0, unsigned t1, unsigned t2, unsigned t3) {
    const unsigned q7 = q & 0x07070707u;
    const unsigned pairs = q7 | (q7 >> 4);                    // bytes 0 and 2: two 3-bit indices each
    const unsigned sel = __byte_perm(pairs, 0u, 0x0020u);     // four selector nibbles, bit 3 clear
    const unsigned lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const unsigned high = ((q >> 3) & 0x01010101u) * 0xFFu;   // 0xFF where the index is >= 8
    return (hi & high) | (lo & ~high);
}

__device__ __forceinline__ unsigned word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ unsigned byte_of(const uint4& v, int i) { return (word_of(v, i >> 2) >> (8 * (i & 3))) & 0xFF; }
__device__ __forceinline__ float f16_low(unsigned w) { return f16_value((unsigned short)(w & 0xFFFF)); }
__device__ __forceinline__ float f16_high(unsigned w) { return f16_value((unsigned short)(w >> 16)); }

// ---- float rows ------------------------------------------------------------------------------

struct UnitF32 {  // 8 values, two 16-byte loads
    static constexpr int UNIT = 8, GROUPS = 1, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { uint4 a, b; };
    __device__ static void load(const u8* row, int u, Raw& r) { r.a = ld128(row + 32 * u); r.b = ld128(row + 32 * u + 16); }
    __device__ static int x_index(int u, int) { return 8 * u; }
    __device__ static void decode(const Raw& r, int, int, float* v, float&) {
        const unsigned w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __uint_as_float(w[k]);
    }
};

template <bool BF16>
struct UnitHalf {  // F16 / BF16: 8 values, one 16-byte load
    static constexpr int UNIT = 8, GROUPS = 1, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { uint4 a; };
    __device__ static void load(const u8* row, int u, Raw& r) { r.a = ld128(row + 16 * u); }
    __device__ static int x_index(int u, int) { return 8 * u; }
    __device__ static void decode(const Raw& r, int, int, float* v, float&) {
        const unsigned w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = BF16 ? __uint_as_float(w[k] << 16) : f16_low(w[k]);
            v[2 * k + 1] = BF16 ? __uint_as_float(w[k] & 0xFFFF0000u) : f16_high(w[k]);
        }
    }
};

template <int BYTES, bool BF16>
struct UnitScalar {  // float rows whose length is not a multiple of 8: one value per unit
    static constexpr int UNIT = 1, GROUPS = 1, GW = 1;
    static constexpr bool FACTORED = false;
    struct Raw { unsigned a; };
    __device__ static void load(const u8* row, int u, Raw& r) { r.a = BYTES == 4 ? ld32(row + 4 * u) : ld16(row + 2 * u); }
    __device__ static int x_index(int u, int) { return u; }
    __device__ static void decode(const Raw& r, int, int, float* v, float&) {
        v[0] = BYTES == 4 ? __uint_as_float(r.a) : BF16 ? __uint_as_float(r.a << 16) : f16_low(r.a);
    }
};

// ---- 32-value blocks: a unit is one block ----------------------------------------------------

struct UnitQ8_0 {  // d, qs[32] int8; 34-byte blocks are 2-byte aligned
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = true;
    struct Raw { unsigned d, q[8]; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        unsigned w[9];
        load_span<9, 34>(row + 34 * u, w);
        r.d = w[0] & 0xFFFF;
#pragma unroll
        for (int i = 0; i < 8; ++i) r.q[i] = __funnelshift_r(w[i], w[i + 1], 16);
    }
    __device__ static int x_index(int u, int j) { return 32 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float& s) {
        s = f16_low(r.d);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = byte_value(r.q[2 * j + (k >> 2)] ^ 0x80808080u, k & 3, MAGIC + 128.0f);
    }
};

// Q4_0, IQ4_NL and MXFP4 share a layout: a scale, then qs[16] whose low nibbles are values 0..15
// and high nibbles 16..31. Group j: bytes 8 (j & 1) .., nibble j >> 1.
template <int SCALE_BYTES>
__device__ __forceinline__ void load_nibble_block(const u8* b, unsigned& d, unsigned* q) {
    unsigned w[5];
    load_span<5, SCALE_BYTES + 16>(b, w);
    d = w[0] & (SCALE_BYTES == 2 ? 0xFFFFu : 0xFFu);
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = __funnelshift_r(w[i], w[i + 1], 8 * SCALE_BYTES);
}
__device__ __forceinline__ unsigned nibbles(const unsigned* q, int j, int k) {
    return (q[2 * (j & 1) + (k >> 2)] >> (4 * (j >> 1))) & 0x0F0F0F0Fu;
}

struct UnitQ4_0 {
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = true;
    struct Raw { unsigned d, q[4]; };
    __device__ static void load(const u8* row, int u, Raw& r) { load_nibble_block<2>(row + 18 * u, r.d, r.q); }
    __device__ static int x_index(int u, int j) { return 32 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float& s) {
        s = f16_low(r.d);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = byte_value(nibbles(r.q, j, k), k & 3, MAGIC + 8.0f);
    }
};

template <bool MX>  // IQ4_NL (fp16 d, kvalues_iq4nl) or MXFP4 (E8M0 e, kvalues_mxfp4)
struct UnitTable4 {
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = true;
    static constexpr int TYPE_SIZE = MX ? 17 : 18;
    struct Raw { unsigned d, q[4]; };
    __device__ static void load(const u8* row, int u, Raw& r) { load_nibble_block<MX ? 1 : 2>(row + TYPE_SIZE * u, r.d, r.q); }
    __device__ static int x_index(int u, int j) { return 32 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float& s) {
        s = MX ? e8m0_to_fp32_half(r.d) : f16_low(r.d);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned t = MX ? lookup16(nibbles(r.q, j, k), 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu)
                                  : lookup16(nibbles(r.q, j, k), 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
            v[k] = byte_value(t ^ 0x80808080u, k & 3, MAGIC + 128.0f);
        }
    }
};

struct UnitQ4_1 {  // d, m, qs[16]; 20-byte blocks are 4-byte aligned. value = d q + m
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { unsigned dm, q[4]; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        unsigned w[5];
        load_span<5>(row + 20 * u, w);
        r.dm = w[0];
#pragma unroll
        for (int i = 0; i < 4; ++i) r.q[i] = w[1 + i];
    }
    __device__ static int x_index(int u, int j) { return 32 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float&) {
        const float d = f16_low(r.dm), m = f16_high(r.dm);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmaf_rn(d, byte_value(nibbles(r.q, j, k), k & 3, MAGIC), m);
    }
};

// Q5_0 / Q5_1: bit i of qh is value i's fifth bit.
__device__ __forceinline__ unsigned five_bits(const unsigned* q, unsigned qh, int j, int k) {
    return nibbles(q, j, k) | spread4((qh >> (8 * j + 4 * (k >> 2))) & 0xF);
}

struct UnitQ5_0 {  // d, qh[4], qs[16]; 22-byte blocks are 2-byte aligned. value = d (q - 16)
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = true;
    struct Raw { unsigned dh[2], q[4]; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        unsigned w[6];
        load_span<6, 22>(row + 22 * u, w);
        r.dh[0] = w[0], r.dh[1] = w[1];
#pragma unroll
        for (int i = 0; i < 4; ++i) r.q[i] = __funnelshift_r(w[1 + i], w[2 + i], 16);
    }
    __device__ static int x_index(int u, int j) { return 32 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float& s) {
        s = f16_low(r.dh[0]);
        const unsigned qh = __funnelshift_r(r.dh[0], r.dh[1], 16);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = byte_value(five_bits(r.q, qh, j, k), k & 3, MAGIC + 16.0f);
    }
};

struct UnitQ5_1 {  // d, m, qh[4], qs[16]; 24-byte blocks are 8-byte aligned. value = d q + m
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { uint2 head; unsigned q[4]; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        unsigned w[6];
        load_span<6>(row + 24 * u, w);
        r.head = make_uint2(w[0], w[1]);
        r.q[0] = w[2], r.q[1] = w[3], r.q[2] = w[4], r.q[3] = w[5];
    }
    __device__ static int x_index(int u, int j) { return 32 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float&) {
        const float d = f16_low(r.head.x), m = f16_high(r.head.x);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmaf_rn(d, byte_value(five_bits(r.q, r.head.y, j, k), k & 3, MAGIC), m);
    }
};

// ---- 256-value super-blocks --------------------------------------------------------------------

struct UnitQ2_K {  // scales[16], qs[64], d, dmin; 84-byte blocks are 4-byte aligned. Unit: half h (128 values)
    static constexpr int UNIT = 128, GROUPS = 16, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { unsigned sc[2], q[8], dd; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        const u8* b = row + 84 * (u >> 1);
        const int h = u & 1;
        load_span<2>(b + 8 * h, r.sc);
        load_span<8>(b + 16 + 32 * h, r.q);
        r.dd = ld32(b + 80);
    }
    // group j: shift s = j / 4 (values 32 s .. of the half), bytes 8 (j % 4) ..
    __device__ static int x_index(int u, int j) { return 128 * u + 32 * (j >> 2) + 8 * (j & 3); }
    __device__ static void decode(const Raw& r, int, int j, float* v, float&) {
        const int s = j >> 2, sci = 2 * s + ((j & 3) >> 1);
        const unsigned sc = (r.sc[sci >> 2] >> (8 * (sci & 3))) & 0xFF;
        const float dl = __fmul_rn(f16_low(r.dd), (float)(sc & 0xF)), ml = __fmul_rn(f16_high(r.dd), (float)(sc >> 4));
#pragma unroll
        for (int k = 0; k < 8; ++k)
            v[k] = __fmaf_rn(dl, byte_value((r.q[2 * (j & 3) + (k >> 2)] >> (2 * s)) & 0x03030303u, k & 3, MAGIC), -ml);
    }
};

struct UnitQ3_K {  // hmask[32], qs[64], scales[12], d; 110-byte blocks are 2-byte aligned. Unit: half h
    static constexpr int UNIT = 128, GROUPS = 16, GW = 8;
    static constexpr bool FACTORED = true;
    struct Raw { unsigned hm[8], q[8], sc[3], d; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        const u8* b = row + 110 * (u >> 1);
        load_span<8>(b, r.hm);
        load_span<8>(b + 32 + 32 * (u & 1), r.q);
        load_span<3>(b + 96, r.sc);
        r.d = ld16(b + 108);
    }
    __device__ static int x_index(int u, int j) { return 128 * u + 32 * (j >> 2) + 8 * (j & 3); }
    __device__ static void decode(const Raw& r, int u, int j, float* v, float& s_out) {
        const int h = u & 1, s = j >> 2, c = 2 * s + ((j & 3) >> 1);  // scale index 8 h + c
        const unsigned low = ((r.sc[c >> 2] >> (8 * (c & 3))) >> (4 * h)) & 0xF;
        const unsigned high = (r.sc[2] >> (8 * (c & 3) + 4 * h + 2 * (c >> 2))) & 3;
        s_out = __fmul_rn(f16_low(r.d), (float)((int)(low | (high << 4)) - 32));
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int w = 2 * (j & 3) + (k >> 2);
            const unsigned code = ((r.q[w] >> (2 * s)) & 0x03030303u) | (((r.hm[w] >> (4 * h + s)) & 0x01010101u) << 2);
            v[k] = byte_value(code, k & 3, MAGIC + 4.0f);  // hmask bit clear: q - 4
        }
    }
};

// Q4_K / Q5_K: unit m (0..3) is sub-blocks 2m and 2m+1, values 64 m .. 64 m + 63 of the block, whose
// low and high nibbles share the 32 qs bytes 32 m ..; group j is sub-block 2m + j / 4.
__device__ __forceinline__ void k_scale_min_of(const uint4& head, int sub, float& dl, float& ml) {
    int scale, min;
    if (sub < 4) {
        scale = byte_of(head, 4 + sub) & 63;
        min = byte_of(head, 8 + sub) & 63;
    } else {
        scale = (byte_of(head, 8 + sub) & 0xF) | ((byte_of(head, sub) >> 6) << 4);
        min = (byte_of(head, 8 + sub) >> 4) | ((byte_of(head, 4 + sub) >> 6) << 4);
    }
    dl = __fmul_rn(f16_low(head.x), (float)scale);
    ml = __fmul_rn(f16_high(head.x), (float)min);
}
__device__ __forceinline__ unsigned word8(const uint4& a, const uint4& b, int i) { return i < 4 ? word_of(a, i) : word_of(b, i - 4); }

struct UnitQ4_K {  // d, dmin, scales[12], qs[128]; 144-byte blocks are 16-byte aligned
    static constexpr int UNIT = 64, GROUPS = 8, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { uint4 head, q0, q1; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        const u8* b = row + 144 * (u >> 2);
        r.head = ld128(b);
        r.q0 = ld128(b + 16 + 32 * (u & 3));
        r.q1 = ld128(b + 32 + 32 * (u & 3));
    }
    __device__ static int x_index(int u, int j) { return 64 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int u, int j, float* v, float&) {
        float dl, ml;
        k_scale_min_of(r.head, 2 * (u & 3) + (j >> 2), dl, ml);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned q = (word8(r.q0, r.q1, 2 * (j & 3) + (k >> 2)) >> (4 * (j >> 2))) & 0x0F0F0F0Fu;
            v[k] = __fmaf_rn(dl, byte_value(q, k & 3, MAGIC), -ml);
        }
    }
};

struct UnitQ5_K {  // d, dmin, scales[12], qh[32], qs[128]; 176-byte blocks are 16-byte aligned
    static constexpr int UNIT = 64, GROUPS = 8, GW = 8;
    static constexpr bool FACTORED = false;
    struct Raw { uint4 head, h0, h1, q0, q1; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        const u8* b = row + 176 * (u >> 2);
        r.head = ld128(b);
        r.h0 = ld128(b + 16), r.h1 = ld128(b + 32);
        r.q0 = ld128(b + 48 + 32 * (u & 3));
        r.q1 = ld128(b + 64 + 32 * (u & 3));
    }
    __device__ static int x_index(int u, int j) { return 64 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int u, int j, float* v, float&) {
        const int sub = 2 * (u & 3) + (j >> 2);  // also the bit of qh[i % 32] holding value i's fifth bit
        float dl, ml;
        k_scale_min_of(r.head, sub, dl, ml);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int w = 2 * (j & 3) + (k >> 2);
            const unsigned q = ((word8(r.q0, r.q1, w) >> (4 * (j >> 2))) & 0x0F0F0F0Fu) |
                               (((word8(r.h0, r.h1, w) >> sub) & 0x01010101u) << 4);
            v[k] = __fmaf_rn(dl, byte_value(q, k & 3, MAGIC), -ml);
        }
    }
};

// Q6_K: ql[128], qh[64], scales[16] int8, d; 210-byte blocks are 2-byte aligned. Unit a (0..3):
// the 32 ql bytes 32 a .., half h = a / 2, lo = a % 2; their low nibbles are values
// 128 h + 32 lo + t, high nibbles 128 h + 64 + 32 lo + t (t < 32), each with 2 bits of qh[32 h + t].
struct UnitQ6_K {
    static constexpr int UNIT = 64, GROUPS = 8, GW = 8;
    static constexpr bool FACTORED = true;
    struct Raw { unsigned ql[8], qh[8], sc, d; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        const u8* b = row + 210 * (u >> 2);
        const int a = u & 3, h = a >> 1, lo = a & 1;
        load_span<8>(b + 32 * a, r.ql);
        load_span<8>(b + 128 + 32 * h, r.qh);
        unsigned sc[2];  // bytes 0, 1: scales of values t < 16 and t >= 16 of the low nibbles; 4, 5: high
        load_span<2, 6>(b + 192 + 8 * h + 2 * lo, sc);
        r.sc = (sc[0] & 0xFFFF) | (sc[1] << 16);
        r.d = ld16(b + 208);
    }
    __device__ static int x_index(int u, int j) {
        const int a = u & 3;
        return 256 * (u >> 2) + 128 * (a >> 1) + 64 * (j >> 2) + 32 * (a & 1) + 8 * (j & 3);
    }
    __device__ static void decode(const Raw& r, int u, int j, float* v, float& s) {
        const int nib = j >> 2, lo = u & 1;
        s = __fmul_rn(f16_low(r.d), (float)(signed char)((r.sc >> (8 * (2 * nib + ((j & 3) >> 1)))) & 0xFF));
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int w = 2 * (j & 3) + (k >> 2);
            const unsigned q = ((r.ql[w] >> (4 * nib)) & 0x0F0F0F0Fu) | (((r.qh[w] >> (4 * nib + 2 * lo)) & 0x03030303u) << 4);
            v[k] = byte_value(q, k & 3, MAGIC + 32.0f);
        }
    }
};

// IQ4_XS: d, scales_h, scales_l[4], qs[128]; 136-byte blocks are 8-byte aligned. Unit m: sub-blocks
// 2m, 2m+1 (qs bytes 32 m ..); in a sub-block, bytes 0..15 hold values 0..15 (low) and 16..31 (high).
struct UnitIQ4_XS {
    static constexpr int UNIT = 64, GROUPS = 8, GW = 8;
    static constexpr bool FACTORED = true;
    struct Raw { uint2 head, q[4]; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        const u8* b = row + 136 * (u >> 2);
        unsigned head[2], q[8];
        load_span<2>(b, head);
        load_span<8>(b + 8 + 32 * (u & 3), q);
        r.head = make_uint2(head[0], head[1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) r.q[i] = make_uint2(q[2 * i], q[2 * i + 1]);
    }
    __device__ static int x_index(int u, int j) { return 64 * u + 8 * j; }
    __device__ static void decode(const Raw& r, int u, int j, float* v, float& s) {
        const int m = u & 3, sub = 2 * m + (j >> 2);
        const unsigned low = (r.head.y >> (8 * m + 4 * (j >> 2))) & 0xF, high = (r.head.x >> (16 + 2 * sub)) & 3;
        s = __fmul_rn(f16_low(r.head.x), (float)((int)(low | (high << 4)) - 32));
        const uint2 q = r.q[2 * (j >> 2) + (j & 1)];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const unsigned idx = ((k < 4 ? q.x : q.y) >> (4 * ((j >> 1) & 1))) & 0x0F0F0F0Fu;
            const unsigned t = lookup16(idx, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
            v[k] = byte_value(t ^ 0x80808080u, k & 3, MAGIC + 128.0f);
        }
    }
};

// ---- types decoded by blocks.cuh's group(): the IQ1/IQ2/IQ3 grid types, TQ1_0 and TQ2_0 -----------

// A unit is one 32-value sub-block, decoded by the format's own Block::group straight from memory: the
// few bytes a group needs are scattered over the block and its grid rows are picked by the data, so
// there is no contiguous span to prefetch into registers; the bytes and grid rows come through L1.
// Values are exactly gguf.quants.dequantize's (not FACTORED), as dequant.cu writes them.
template <class Block>
struct UnitBlock {
    static constexpr int UNIT = 32, GROUPS = 4, GW = 8;
    static constexpr bool FACTORED = false;
    static constexpr int PER_BLOCK = Block::BLOCK / UNIT;
    struct Raw { const u8* b; int g0; };
    __device__ static void load(const u8* row, int u, Raw& r) {
        r.b = row + (long long)(u / PER_BLOCK) * Block::TYPE_SIZE;
        r.g0 = (u % PER_BLOCK) * GROUPS;
    }
    __device__ static int x_index(int u, int j) { return UNIT * u + 8 * j; }
    __device__ static void decode(const Raw& r, int, int j, float* v, float&) { Block::group(r.b, r.g0 + j, v); }
};

// ---- the shared dot product ---------------------------------------------------------------------

// x's values through the read-only cache, or (XS: x in shared memory, a normed product's) plain loads.
template <bool XS>
__device__ __forceinline__ float4 load_x4(const float* p) {
    if constexpr (XS) return *reinterpret_cast<const float4*>(p);
    else return __ldg(reinterpret_cast<const float4*>(p));
}
template <bool XS>
__device__ __forceinline__ float load_x(const float* p) {
    if constexpr (XS) return *p;
    else return __ldg(p);
}

// acc[c][r] += unit u's part of row r of x times column c, its bytes in raw[c].
template <class U, int R, int C, bool XS>
__device__ __forceinline__ void unit_dot(const typename U::Raw (&raw)[C], int u, const float* __restrict__ x,
                                         long long x_stride, float (&acc)[C][R]) {
#pragma unroll
    for (int j = 0; j < U::GROUPS; ++j) {
        float v[C][U::GW], s[C];
#pragma unroll
        for (int c = 0; c < C; ++c) U::decode(raw[c], u, j, v[c], s[c]);
        const float* xj = x + U::x_index(u, j);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float xv[U::GW];
            if constexpr (U::GW == 8) {
                const float* xr = xj + r * x_stride;
                const float4 a = load_x4<XS>(xr), b = load_x4<XS>(xr + 4);
                xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
            } else {
                xv[0] = load_x<XS>(xj + r * x_stride);
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                if constexpr (U::FACTORED) {
                    float t = __fmul_rn(v[c][0], xv[0]);
#pragma unroll
                    for (int k = 1; k < U::GW; ++k) t = __fmaf_rn(v[c][k], xv[k], t);
                    acc[c][r] = __fmaf_rn(s[c], t, acc[c][r]);
                } else {
#pragma unroll
                    for (int k = 0; k < U::GW; ++k) acc[c][r] = __fmaf_rn(v[c][k], xv[k], acc[c][r]);
                }
            }
        }
    }
}

// Units a lane has in flight while it multiplies one (gemv.py ROUTE_LOAD_AHEAD for the router's module): 1 keeps
// the next unit's bytes in flight; AHEAD > 1 keeps a ring of the next AHEAD, so a units-layout lane with 8 units
// a row (a float32 router of 2048) waits for memory once instead of 8 times in turn. The same sums in the same
// order at any count: the same bits.
#ifndef GEMV_LOAD_AHEAD
#define GEMV_LOAD_AHEAD 1
#endif

// acc[c][r] = this lane's part of row r of x times column c (rows[c] its bytes): units first, first + step, ...
template <class U, int R, int C, bool XS, int AHEAD = GEMV_LOAD_AHEAD>
__device__ __forceinline__ void lane_dot(const u8* const* rows, int n_units, int first, int step,
                                         const float* __restrict__ x, long long x_stride, float (&acc)[C][R]) {
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[c][r] = 0.0f;
    int u = first;
    if (u >= n_units) return;
    if constexpr (AHEAD > 1) {
        typename U::Raw ring[AHEAD][C];  // slot i holds unit u + i step of the round at u
#pragma unroll
        for (int i = 0; i < AHEAD; ++i)
            if (u + i * step < n_units)
#pragma unroll
                for (int c = 0; c < C; ++c) U::load(rows[c], u + i * step, ring[i][c]);
        for (; u < n_units; u += AHEAD * step) {
#pragma unroll
            for (int i = 0; i < AHEAD; ++i) {
                const int ui = u + i * step, refill = ui + AHEAD * step;
                if (ui < n_units) {
                    unit_dot<U, R, C, XS>(ring[i], ui, x, x_stride, acc);
                    if (refill < n_units)  // the slot takes the unit AHEAD on, in flight from now
#pragma unroll
                        for (int c = 0; c < C; ++c) U::load(rows[c], refill, ring[i][c]);
                }
            }
        }
    } else {
        typename U::Raw cur[C];
#pragma unroll
        for (int c = 0; c < C; ++c) U::load(rows[c], u, cur[c]);
        for (;;) {
            const bool more = u + step < n_units;
            typename U::Raw next[C];
            if (more) {  // the next unit's bytes are in flight while this one is multiplied
#pragma unroll
                for (int c = 0; c < C; ++c) U::load(rows[c], u + step, next[c]);
            }
            unit_dot<U, R, C, XS>(cur, u, x, x_stride, acc);
            if (!more) break;
            u += step;
#pragma unroll
            for (int c = 0; c < C; ++c) cur[c] = next[c];
        }
    }
}

// Sum over the warp's lanes, the same tree for every value; every lane ends with the total.
template <int R, int C>
__device__ __forceinline__ void warp_sum(float (&acc)[C][R]) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[c][r] = __fadd_rn(acc[c][r], __shfl_xor_sync(0xFFFFFFFFu, acc[c][r], offset));
}

// The CTA's tile: columns col0 .. col0 + GEMV_TILE - 1 of M matrices of the same unit and row length at w[0..M)
// (past the end: the last column again, computed and not stored) times R rows of x; sm.res[m R + r][c]
// afterwards (M R <= GEMV_MAX_ROWS). M = 2 is expert_gate_up's gate and up: both matrices' bytes are in flight
// together, and each column's sum is the one M = 1 gives (lane_dot keeps every accumulator apart).
// COLUMNS: thread t owns column t % GEMV_TILE of K slice t / GEMV_TILE, which takes the units [s per, (s + 1)
// per), per = ceil(units / GEMV_SEGMENTS); the GEMV_SEGMENTS partial sums are then added in slice order. The
// slices, not the threads, fix the bits: a CTA of 16 GEMV_TILE threads (512 at 32 columns, 128 at 8) computes
// its columns as any other does. Otherwise warp s owns columns 2s, 2s + 1 and lanes take units lane + 32 i.
#define GEMV_SEGMENTS 16
struct TileSmem {
    float part[GEMV_SEGMENTS][GEMV_MAX_ROWS][GEMV_TILE];
    float res[GEMV_MAX_ROWS][GEMV_TILE];
};

template <class U, int R, bool COLUMNS, bool XS = false, int M = 1>
__device__ __forceinline__ void tile_dot(const u8* const (&w)[M], long long row_bytes, int n, int col0, int k,
                                         const float* x, long long x_stride, TileSmem& sm) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_units = k / U::UNIT;
    static_assert(M * R <= GEMV_MAX_ROWS, "a tile holds GEMV_MAX_ROWS sums a column");
    if constexpr (COLUMNS) {
        // CPT columns a thread (GEMV_WARP_COLUMNS / 2: 1, or 2 with twice the bytes of a thread in flight),
        // column col + c LANES for c < CPT, each with its own accumulators: the same bits at either count.
        constexpr int LANES = GEMV_THREADS / GEMV_SEGMENTS, CPT = GEMV_TILE / LANES;
        // dependent on COLUMNS, so a units-layout module of another tile (UNITS_WARP_COLUMNS 1) does not trip it
        static_assert(!COLUMNS || (LANES * GEMV_SEGMENTS == GEMV_THREADS && (CPT == 1 || CPT == 2) &&
                                   CPT * LANES == GEMV_TILE),
                      "the columns layout takes 16 threads a column, 1 or 2 columns a thread: 2 or 4 a warp");
        const int col = threadIdx.x % LANES, seg = threadIdx.x / LANES;
        const u8* row[M * CPT];
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int c = 0; c < CPT; ++c) row[m * CPT + c] = w[m] + (long long)min(col0 + col + c * LANES, n - 1) * row_bytes;
        const int per = (n_units + GEMV_SEGMENTS - 1) / GEMV_SEGMENTS, u0 = seg * per, u1 = min(n_units, u0 + per);
        float acc[M * CPT][R];
        lane_dot<U, R, M * CPT, XS>(row, u1, u0, 1, x, x_stride, acc);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int c = 0; c < CPT; ++c)
#pragma unroll
                for (int r = 0; r < R; ++r) sm.part[seg][m * R + r][col + c * LANES] = acc[m * CPT + c][r];
        __syncthreads();
        static_assert(M * R * GEMV_TILE <= GEMV_THREADS, "a thread a sum");
        if (threadIdx.x < M * R * GEMV_TILE) {
            const int r = threadIdx.x / GEMV_TILE, c = threadIdx.x % GEMV_TILE;
            float sum = sm.part[0][r][c];
#pragma unroll
            for (int s = 1; s < GEMV_SEGMENTS; ++s) sum = __fadd_rn(sum, sm.part[s][r][c]);
            sm.res[r][c] = sum;
        }
    } else {
        constexpr int C = GEMV_WARP_COLUMNS;
        static_assert(M * C * R <= 32, "a lane writes each of a warp's sums");
        static_assert(GEMV_TILE_WARPS <= GEMV_WARPS, "a tile's warps are the CTA's");
        if (GEMV_TILE_WARPS == GEMV_WARPS || warp < GEMV_TILE_WARPS) {  // warp-uniform: the others own no column
            const u8* rows[M * C];
#pragma unroll
            for (int m = 0; m < M; ++m)
#pragma unroll
                for (int c = 0; c < C; ++c)
                    rows[m * C + c] = w[m] + (long long)min(col0 + C * warp + c, n - 1) * row_bytes;
            float acc[M * C][R];
            lane_dot<U, R, M * C, XS>(rows, n_units, lane, 32, x, x_stride, acc);
            warp_sum<R, M * C>(acc);
#pragma unroll
            for (int m = 0; m < M; ++m)
#pragma unroll
                for (int c = 0; c < C; ++c)
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        if (lane == (m * C + c) * R + r) sm.res[m * R + r][C * warp + c] = acc[m * C + c][r];
        }
    }
    __syncthreads();
}

// y [R, n] = x [R, k] times w [n, row_bytes] transposed, plus bias [n] when it is not null, then plus residual
// [R, n] when it is not null (a layer's skip connection): one rounded add each after the sum, in that order, the
// bits of adding them afterwards, a launch fewer each.
// `tile`: which GEMV_TILE columns (the block index of a gemv launch; gemv_multi's blocks are several matrices' tiles).
template <class U, int R, bool COLUMNS, bool XS = false>
__device__ __forceinline__ void gemv_body(const u8* __restrict__ w, long long row_bytes, int n, int k,
                                          const float* __restrict__ x, float* __restrict__ y,
                                          const float* __restrict__ bias, const float* __restrict__ residual,
                                          int tile, TileSmem& sm) {
    const int col0 = tile * GEMV_TILE, t = threadIdx.x, col = col0 + t % GEMV_TILE;
    const u8* const ws[1] = {w};
    tile_dot<U, R, COLUMNS, XS>(ws, row_bytes, n, col0, k, x, k, sm);
    if (t < R * GEMV_TILE && col < n) {
        const long long at = (long long)(t / GEMV_TILE) * n + col;
        float v = sm.res[t / GEMV_TILE][t % GEMV_TILE];
        if (bias != nullptr) v = __fadd_rn(v, bias[col]);
        if (residual != nullptr) v = __fadd_rn(residual[at], v);
        y[at] = v;
    }
}

// A normed product's x: the R rows of x [R, k] normed as norm_rope.cu's rms_norm_f32 norms them (rms_norm.cuh's
// scale, then x * scale * w rounded twice), into the block's dynamic shared memory [R, k]. Ends with a barrier.
extern __shared__ __align__(16) float normed_x[];

template <int R>
__device__ __forceinline__ void norm_rows(const float* __restrict__ x, const float* __restrict__ w, int k, double eps,
                                          double* warp_sums, float* scale) {
    for (int r = 0; r < R; ++r) {
        const float* xr = x + (long long)r * k;
        const float s = rms_scale(xr, k, eps, warp_sums, scale);
        for (int i = threadIdx.x; i < k; i += blockDim.x) normed_x[r * k + i] = __fmul_rn(__fmul_rn(xr[i], s), w[i]);
    }
    __syncthreads();
}

// y [P, n] with y[p] = x[pair_rows[p]] times the matrix at w_ptrs[p] ([n, row_bytes]) transposed. With pass_of
// (not null), only the pairs p with pass_of[p] == pass (a launch per pass: the other pairs' rows are untouched).
template <class U, bool COLUMNS>
__device__ __forceinline__ void expert_body(const unsigned long long* __restrict__ w_ptrs, const int* __restrict__ pair_rows,
                                            long long row_bytes, int n, int k, const float* __restrict__ x,
                                            float* __restrict__ y, const int* __restrict__ pass_of, int pass) {
    __shared__ TileSmem sm;
    const int col0 = blockIdx.x * GEMV_TILE, t = threadIdx.x, p = blockIdx.y;
    if (pass_of != nullptr && pass_of[p] != pass) return;  // block-uniform, before any barrier
    const u8* const w[1] = {reinterpret_cast<const u8*>(w_ptrs[p])};
    tile_dot<U, 1, COLUMNS>(w, row_bytes, n, col0, k, x + (long long)pair_rows[p] * k, k, sm);
    if (t < GEMV_TILE && col0 + t < n) y[(long long)p * n + col0 + t] = sm.res[0][t];
}

// expert_body for rows of at most 8 units in the columns layout (K 512 of the 64-value units: seed-like expert down
// products), where tile_dot's K slices 8 to 15 hold no unit and half its threads idle: 8 threads a column, so a CTA
// computes GEMV_THREADS / 8 columns (twice a tile) with every thread on a unit. The same bits as expert_body: slice
// s takes unit s in both (per = 1); the idle slices' sums are +0.0 (an accumulator that starts at +0.0 never becomes
// -0.0 under round to nearest, nor does a sum of such), and adding +0.0 to a sum that is not -0.0 is exact.
#define HALF_SLICES 8
#define HALF_TILE (GEMV_THREADS / HALF_SLICES)
template <class U>
__device__ __forceinline__ void half_expert_body(const unsigned long long* __restrict__ w_ptrs,
                                                 const int* __restrict__ pair_rows, long long row_bytes, int n, int k,
                                                 const float* __restrict__ x, float* __restrict__ y,
                                                 const int* __restrict__ pass_of, int pass) {
    __shared__ float part[HALF_SLICES][HALF_TILE];
    const int col0 = blockIdx.x * HALF_TILE, p = blockIdx.y;
    if (pass_of != nullptr && pass_of[p] != pass) return;  // block-uniform, before the barrier
    const int col = threadIdx.x % HALF_TILE, seg = threadIdx.x / HALF_TILE, n_units = k / U::UNIT;
    const u8* const row[1] = {reinterpret_cast<const u8*>(w_ptrs[p]) + (long long)min(col0 + col, n - 1) * row_bytes};
    float acc[1][1];
    lane_dot<U, 1, 1, false>(row, min(n_units, seg + 1), seg, 1, x + (long long)pair_rows[p] * k, k, acc);
    part[seg][col] = acc[0][0];
    __syncthreads();
    if (threadIdx.x < HALF_TILE && col0 + threadIdx.x < n) {
        float sum = part[0][threadIdx.x];
#pragma unroll
        for (int s = 1; s < HALF_SLICES; ++s) sum = __fadd_rn(sum, part[s][threadIdx.x]);
        y[(long long)p * n + col0 + threadIdx.x] = sum;
    }
}

template <class A, class B> constexpr bool same_unit = false;  // std::is_same_v without <type_traits> (NVRTC)
template <class A> constexpr bool same_unit<A, A> = true;

// The gate and up tiles, then h = silu(g) * u with silu(g) = g / (1 + exp(-g)) rounded as in
// norm_rope.cu's swiglu_f32: h [P, n], h[p] from x[pair_rows[p]] and the matrices at gate_ptrs[p], up_ptrs[p].
template <class G, bool G_COLUMNS, class U, bool U_COLUMNS>
__device__ __forceinline__ void gate_up_body(const unsigned long long* __restrict__ gate_ptrs,
                                             const unsigned long long* __restrict__ up_ptrs,
                                             const int* __restrict__ pair_rows, long long gate_row_bytes,
                                             long long up_row_bytes, int n, int k, const float* __restrict__ x,
                                             float* __restrict__ h, const int* __restrict__ pass_of, int pass) {
    __shared__ TileSmem sm;
    const int col0 = blockIdx.x * GEMV_TILE, t = threadIdx.x, p = blockIdx.y;
    if (pass_of != nullptr && pass_of[p] != pass) return;  // as expert_body
    const float* xp = x + (long long)pair_rows[p] * k;
    const u8* const gate[1] = {reinterpret_cast<const u8*>(gate_ptrs[p])};
    const u8* const up[1] = {reinterpret_cast<const u8*>(up_ptrs[p])};
    float g = 0.0f, u = 0.0f;
#ifdef GATE_UP_TWO_PASSES  // gemv.py GATE_UP_ONE_PASS off: the gate's tile, then the up's (the same bits)
    constexpr bool one_pass = false;
#else
    constexpr bool one_pass = same_unit<G, U> && G_COLUMNS && U_COLUMNS;
#endif
    if constexpr (one_pass) {  // one pass over both, their bytes in flight at once (the units layout's
        // warps already hold two rows: four would spill at 512 threads)
        const u8* const both[2] = {gate[0], up[0]};
        tile_dot<G, 1, G_COLUMNS, false, 2>(both, gate_row_bytes, n, col0, k, xp, k, sm);
        if (t < GEMV_TILE) g = sm.res[0][t], u = sm.res[1][t];
    } else {
        tile_dot<G, 1, G_COLUMNS>(gate, gate_row_bytes, n, col0, k, xp, k, sm);
        if (t < GEMV_TILE) g = sm.res[0][t];
        __syncthreads();  // sm is reused by the up tile
        tile_dot<U, 1, U_COLUMNS>(up, up_row_bytes, n, col0, k, xp, k, sm);
        if (t < GEMV_TILE) u = sm.res[0][t];
    }
    if (t < GEMV_TILE && col0 + t < n) h[(long long)p * n + col0 + t] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

typedef UnitHalf<false> UnitF16;
typedef UnitHalf<true> UnitBF16;
typedef UnitScalar<4, false> UnitF32S;  // the S units: float rows whose length is not a multiple of 8
typedef UnitScalar<2, false> UnitF16S;
typedef UnitScalar<2, true> UnitBF16S;
typedef UnitTable4<false> UnitIQ4_NL;
typedef UnitTable4<true> UnitMXFP4;
typedef UnitBlock<BlockIQ1_S> UnitIQ1_S;
typedef UnitBlock<BlockIQ1_M> UnitIQ1_M;
typedef UnitBlock<BlockIQ2_XXS> UnitIQ2_XXS;
typedef UnitBlock<BlockIQ2_XS> UnitIQ2_XS;
typedef UnitBlock<BlockIQ2_S> UnitIQ2_S;
typedef UnitBlock<BlockIQ3_XXS> UnitIQ3_XXS;
typedef UnitBlock<BlockIQ3_S> UnitIQ3_S;
typedef UnitBlock<BlockTQ1_0> UnitTQ1_0;
typedef UnitBlock<BlockTQ2_0> UnitTQ2_0;

// A dense product's tile rows (w [n, row_bytes], rows tile * GEMV_TILE on) into L2 before PDL_ENTRY: weights, which
// no kernel of the token writes, fetched while the kernel before still runs (pdl.cuh).
__device__ __forceinline__ void prefetch_tile(const u8* w, long long row_bytes, int n, int tile) {
    const int col0 = tile * GEMV_TILE;
    if (col0 < n) PDL_PREFETCH_L2(w + (long long)col0 * row_bytes, (long long)(min(n, col0 + GEMV_TILE) - col0) * row_bytes);
}

// One module per unit and layout: all units in one file take about a minute to compile, and a model
// uses a few. The loader compiles this file with -DGEMV_UNIT=Unit... -DGEMV_COLUMNS=0|1 (gemv_r1..8,
// expert_gemv, and expert_gate_up with both matrices of that unit), or with -DGATE_UNIT=...
// -DGATE_COLUMNS=... -DUP_UNIT=... -DUP_COLUMNS=... (only expert_gate_up, for a gate and an up that
// differ in type or layout), or -DMULTI_UNIT0..2=... -DMULTI_COLUMNS0..2=... (gemv_multi_r1..8). With
// -DGEMV_ROUTE or -DMULTI_NORM beside them, the module holds only the normed entries (gemv_norm_route_r1..4,
// gemv_multi_norm_r1..4): the router's ranking doubles a module's compile time, and most launches never need it.
#define GEMV_ENTRY(U, COLUMNS, R)                                                                       \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                          \
    gemv_r##R(const u8* __restrict__ w, long long row_bytes, int n, int k, const float* __restrict__ x,  \
              float* __restrict__ y, const float* __restrict__ bias, const float* __restrict__ residual) { \
        prefetch_tile(w, row_bytes, n, blockIdx.x);                                                     \
        PDL_ENTRY();                                                                                    \
        __shared__ TileSmem sm;                                                                         \
        gemv_body<U, R, COLUMNS>(w, row_bytes, n, k, x, y, bias, residual, blockIdx.x, sm);             \
    }

// Up to three products of the same rows of x in one launch (attention's q, k and v): blocks [0, t0) are matrix
// 0's tiles, [t0, t0 + t1) matrix 1's, the rest matrix 2's, each computed as gemv_body computes it, so every
// column has the bits of its own gemv launch; one launch instead of three, their tiles on the SMs at once.
// MULTI_UNIT0..2 and MULTI_COLUMNS0..2 give each matrix's unit and layout (two matrices: the third repeats the
// second's and has no blocks). A null bias pointer: no bias.
#define MULTI_PARAMS                                                                                    \
    int t0, int t1, const u8* __restrict__ w0, long long rb0, int n0, float* __restrict__ y0,          \
        const float* __restrict__ b0, const u8* __restrict__ w1, long long rb1, int n1,                 \
        float* __restrict__ y1, const float* __restrict__ b1, const u8* __restrict__ w2, long long rb2, \
        int n2, float* __restrict__ y2, const float* __restrict__ b2
template <int R, bool XS>
__device__ __forceinline__ void multi_body(int k, const float* __restrict__ x, MULTI_PARAMS, TileSmem& sm) {
    const int b = blockIdx.x;
    if (b < t0)
        gemv_body<MULTI_UNIT0, R, MULTI_COLUMNS0, XS>(w0, rb0, n0, k, x, y0, b0, nullptr, b, sm);
    else if (b < t0 + t1)
        gemv_body<MULTI_UNIT1, R, MULTI_COLUMNS1, XS>(w1, rb1, n1, k, x, y1, b1, nullptr, b - t0, sm);
    else
        gemv_body<MULTI_UNIT2, R, MULTI_COLUMNS2, XS>(w2, rb2, n2, k, x, y2, b2, nullptr, b - t0 - t1, sm);
}
#define MULTI_ARGS t0, t1, w0, rb0, n0, y0, b0, w1, rb1, n1, y1, b1, w2, rb2, n2, y2, b2
__device__ __forceinline__ void prefetch_multi(MULTI_PARAMS) {  // this block's tile of its matrix, as multi_body
    const int b = blockIdx.x;
    if (b < t0)
        prefetch_tile(w0, rb0, n0, b);
    else if (b < t0 + t1)
        prefetch_tile(w1, rb1, n1, b - t0);
    else
        prefetch_tile(w2, rb2, n2, b - t0 - t1);
}
#define MULTI_ENTRY(R)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                          \
    gemv_multi_r##R(int k, const float* __restrict__ x, MULTI_PARAMS) {                                 \
        prefetch_multi(MULTI_ARGS);                                                                     \
        PDL_ENTRY();                                                                                    \
        __shared__ TileSmem sm;                                                                         \
        multi_body<R, false>(k, x, MULTI_ARGS, sm);                                                     \
    }
// gemv_multi of rms_norm(x [R, k]) by the norm's weight norm_w [k], normed in each CTA (norm_rows; the dynamic
// shared memory holds R k floats): the bits of rms_norm_f32 then gemv_multi, one launch instead of two.
#define MULTI_NORM_ENTRY(R)                                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                          \
    gemv_multi_norm_r##R(int k, const float* __restrict__ x, const float* __restrict__ norm_w,          \
                         double eps, MULTI_PARAMS) {                                                    \
        prefetch_multi(MULTI_ARGS);                                                                     \
        PDL_ENTRY();                                                                                    \
        __shared__ TileSmem sm;                                                                         \
        __shared__ double warp_sums[RMS_NORM_THREADS / 32];                                             \
        __shared__ float scale;                                                                         \
        norm_rows<R>(x, norm_w, k, eps, warp_sums, &scale);                                             \
        multi_body<R, true>(k, normed_x, MULTI_ARGS, sm);                                               \
    }

// A MoE layer's router in one launch: h [R, k] = rms_norm(x [R, k]) by norm_w [k] (normed in each CTA as
// norm_rows does, written out for the experts), logits [R, n] = h times the router w [n, row_bytes] transposed
// (gemv_r's bits), then the last CTA to finish ranks each row with route.cuh's route_token into ids, weights
// [R, n_used]: rms_norm_f32, gemv_r and route_f32, with their bits, one launch instead of three. counter: a
// zeroed uint that the last CTA resets, so two of these launches must not run at once. blockDim must be at
// least 64 and n (one thread per expert in the ranking), n at most ROUTE_MAX_EXPERTS.
#define ROUTE_ENTRY(R)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                          \
    gemv_norm_route_r##R(const u8* __restrict__ w, long long row_bytes, int n, int k,                   \
                         const float* __restrict__ x, const float* __restrict__ norm_w, double eps,     \
                         float* __restrict__ h, float* __restrict__ logits, unsigned* __restrict__ counter, \
                         const float* __restrict__ bias, int n_used, int sigmoid, int n_groups,         \
                         int n_group_used, int norm, int use_scale, float scale,                        \
                         int* __restrict__ ids, float* __restrict__ weights) {                          \
        prefetch_tile(w, row_bytes, n, blockIdx.x);                                                     \
        PDL_ENTRY();                                                                                    \
        norm_route_body<R>(w, row_bytes, n, k, x, norm_w, eps, h, logits, counter, bias, n_used, sigmoid, \
                           n_groups, n_group_used, norm, use_scale, scale, ids, weights);               \
    }

// gemv.py GATE_UP_MIN_BLOCKS: CTAs of expert_gate_up an SM must hold at once (a register cap), so a launch whose
// CTAs just miss one wave at the compiler's own count runs in one
#ifdef GATE_UP_MIN_BLOCKS
#define GATE_UP_BOUNDS __launch_bounds__(GEMV_THREADS, GATE_UP_MIN_BLOCKS)
#else
#define GATE_UP_BOUNDS __launch_bounds__(GEMV_THREADS)
#endif
#define GATE_UP_ENTRY(G, G_COLUMNS, U, U_COLUMNS)                                                       \
    extern "C" __global__ void GATE_UP_BOUNDS                                                           \
    expert_gate_up(const unsigned long long* __restrict__ gate_ptrs,                                    \
                   const unsigned long long* __restrict__ up_ptrs, const int* __restrict__ pair_rows,   \
                   long long gate_row_bytes, long long up_row_bytes, int n, int k,                      \
                   const float* __restrict__ x, float* __restrict__ h, const int* __restrict__ pass_of, \
                   int pass) {                                                                          \
        PDL_ENTRY();                                                                                    \
        gate_up_body<G, G_COLUMNS, U, U_COLUMNS>(gate_ptrs, up_ptrs, pair_rows, gate_row_bytes,         \
                                                 up_row_bytes, n, k, x, h, pass_of, pass);              \
    }

#if defined(GEMV_UNIT) && defined(GEMV_COLUMNS) && defined(GEMV_ROUTE)  // the router's module: only its entries
template <int R>
__device__ __forceinline__ void norm_route_body(const u8* __restrict__ w, long long row_bytes, int n, int k,
                                                const float* __restrict__ x, const float* __restrict__ norm_w,
                                                double eps, float* __restrict__ h, float* __restrict__ logits,
                                                unsigned* __restrict__ counter, const float* __restrict__ bias,
                                                int n_used, int sigmoid, int n_groups, int n_group_used, int norm,
                                                int use_scale, float scale, int* __restrict__ ids,
                                                float* __restrict__ weights) {
    __shared__ union { TileSmem tile; RouteSmem route; } sm;  // the ranking starts once the tile is done
    __shared__ double warp_sums[RMS_NORM_THREADS / 32];
    __shared__ float row_scale;
    __shared__ bool last;
    norm_rows<R>(x, norm_w, k, eps, warp_sums, &row_scale);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < R * k; i += gridDim.x * blockDim.x) h[i] = normed_x[i];
    gemv_body<GEMV_UNIT, R, GEMV_COLUMNS, true>(w, row_bytes, n, k, normed_x, logits, nullptr, nullptr, blockIdx.x,
                                                sm.tile);
    __threadfence();  // this CTA's logits are visible device-wide before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;  // block-uniform
    __threadfence();
    for (int r = 0; r < R; ++r) {
        const int e = threadIdx.x;  // read past L1: the other CTAs wrote these
        const float v = e < n ? __ldcg(logits + (long long)r * n + e) : NEG_INF;
        route_token(v, bias, n, n_used, sigmoid, n_groups, n_group_used, norm, use_scale, scale,
                    ids + r * n_used, weights + r * n_used, sm.route);
    }
    if (threadIdx.x == 0) *counter = 0u;  // the next launch is ordered after this one's end
}

ROUTE_ENTRY(1) ROUTE_ENTRY(2) ROUTE_ENTRY(3) ROUTE_ENTRY(4)
#elif defined(GEMV_UNIT) && defined(GEMV_COLUMNS)
GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 1) GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 2) GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 3)
GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 4) GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 5) GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 6)
GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 7) GEMV_ENTRY(GEMV_UNIT, GEMV_COLUMNS, 8)

extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
expert_gemv(const unsigned long long* __restrict__ w_ptrs, const int* __restrict__ pair_rows, long long row_bytes,
            int n, int k, const float* __restrict__ x, float* __restrict__ y, const int* __restrict__ pass_of,
            int pass) {
    PDL_ENTRY();
    expert_body<GEMV_UNIT, GEMV_COLUMNS>(w_ptrs, pair_rows, row_bytes, n, k, x, y, pass_of, pass);
}

#if GEMV_COLUMNS && GEMV_WARP_COLUMNS == 2
// expert_gemv's bits for rows of at most 8 units (gemv.py EXPERT_HALF_SLICES): grid (n / HALF_TILE, pairs).
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
expert_gemv_half(const unsigned long long* __restrict__ w_ptrs, const int* __restrict__ pair_rows,
                 long long row_bytes, int n, int k, const float* __restrict__ x, float* __restrict__ y,
                 const int* __restrict__ pass_of, int pass) {
    PDL_ENTRY();
    half_expert_body<GEMV_UNIT>(w_ptrs, pair_rows, row_bytes, n, k, x, y, pass_of, pass);
}
#endif

// expert_gemv, then the per-token expert sum (route.cuh's combine_value: combine_f32's bits) of each column tile
// by the launch's last block for that tile: a launch fewer a MoE layer. out [n_tok, n] from y [P, n] as
// expert_gemv writes it, weights [n_tok, k_used], residual [n_tok, n] or null, `shared`: as combine_f32's.
// counters [gridDim.x]: zero, each tile's counter reset by its last block. With pass_of, each pass's launch
// counts only its own pairs, so the block that completes a tile's P pairs is in the last pass's launch.
extern "C" __global__ void __launch_bounds__(GEMV_THREADS)
expert_down_combine(const unsigned long long* __restrict__ w_ptrs, const int* __restrict__ pair_rows,
                    long long row_bytes, int n, int k, const float* __restrict__ x, float* __restrict__ y,
                    const int* __restrict__ pass_of, int pass, const float* __restrict__ weights,
                    const float* __restrict__ residual, float* __restrict__ out, int n_tok, int k_used, int shared,
                    unsigned* __restrict__ counters) {
    PDL_ENTRY();
    __shared__ bool last;
    if (pass_of != nullptr && pass_of[blockIdx.y] != pass) return;  // block-uniform; not this pass's pair
    expert_body<GEMV_UNIT, GEMV_COLUMNS>(w_ptrs, pair_rows, row_bytes, n, k, x, y, nullptr, 0);
    __threadfence();  // this block's rows of y are visible device-wide before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int col0 = blockIdx.x * GEMV_TILE;
    for (int i = threadIdx.x; i < n_tok * GEMV_TILE; i += blockDim.x) {
        const int t = i / GEMV_TILE, c = col0 + i % GEMV_TILE;
        if (c < n) out[(long long)t * n + c] = combine_value(y, weights, residual, t, c, n_tok, k_used, n, shared);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // the next launch is ordered after this one's end
}

GATE_UP_ENTRY(GEMV_UNIT, GEMV_COLUMNS, GEMV_UNIT, GEMV_COLUMNS)
#elif defined(GATE_UNIT) && defined(GATE_COLUMNS) && defined(UP_UNIT) && defined(UP_COLUMNS)
GATE_UP_ENTRY(GATE_UNIT, GATE_COLUMNS, UP_UNIT, UP_COLUMNS)
#elif defined(MULTI_UNIT0) && defined(MULTI_UNIT1) && defined(MULTI_UNIT2) && defined(MULTI_NORM)
MULTI_NORM_ENTRY(1) MULTI_NORM_ENTRY(2) MULTI_NORM_ENTRY(3) MULTI_NORM_ENTRY(4)
#elif defined(MULTI_UNIT0) && defined(MULTI_UNIT1) && defined(MULTI_UNIT2)
MULTI_ENTRY(1) MULTI_ENTRY(2) MULTI_ENTRY(3) MULTI_ENTRY(4) MULTI_ENTRY(5) MULTI_ENTRY(6) MULTI_ENTRY(7) MULTI_ENTRY(8)
#elif !defined(GEMV_NO_ENTRIES)
#error "compile with -DGEMV_UNIT=<unit> -DGEMV_COLUMNS=0|1 (and -DGEMV_ROUTE), -DGATE_UNIT, -DGATE_COLUMNS, -DUP_UNIT, -DUP_COLUMNS, or -DMULTI_UNIT0..2, -DMULTI_COLUMNS0..2 (and -DMULTI_NORM)"
#endif
