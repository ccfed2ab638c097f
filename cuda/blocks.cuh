// GGUF block decoders shared by the CUDA kernels (dequant.cu, gemv.cu): raw little-endian bytes of
// one block in, float32 values out. Products and sums use mul_rn/add_rn/sub_rn (__f*_rn on the device)
// so the compiler cannot fuse them into FMAs: each value is the same float32 operations, in the same
// order, as gguf.quants.dequantize.
// Everything here also compiles as host C++ (g++, or nvcc's host pass; build with -ffp-contract=off),
// so tests/test_quant_blocks_host.py checks the decoders bit for bit on a machine without a GPU.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)  // nvcc, NVRTC (CuPy)
#include <cuda_fp16.h>
#define BLOCKS_HD __host__ __device__ __forceinline__
#else
#define BLOCKS_HD inline
#endif

typedef unsigned char u8;

BLOCKS_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
BLOCKS_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
BLOCKS_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

BLOCKS_HD float bits_to_float(unsigned bits) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(bits);
#else
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
#endif
}

BLOCKS_HD int parity7(unsigned bits) {  // parity of bits 0..6
#if defined(__CUDA_ARCH__)
    return __popc(bits & 0x7F) & 1;
#else
    return __builtin_popcount(bits & 0x7F) & 1;
#endif
}

// F16 / BF16 values from their raw bits (exact: every fp16 is a float32).
BLOCKS_HD float f16_value(unsigned short bits) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(bits));
#else
    const unsigned sign = (unsigned)(bits >> 15) << 31, exponent = (bits >> 10) & 31, mantissa = bits & 0x3FF;
    if (exponent == 31) return bits_to_float(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
        const float magnitude = (float)mantissa * 5.9604644775390625e-08f;
        return sign ? -magnitude : magnitude;
    }
    return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
#endif
}
BLOCKS_HD float bf16_value(unsigned short bits) { return bits_to_float((unsigned)bits << 16); }

BLOCKS_HD float fp16_at(const u8* p) { return f16_value((unsigned short)(p[0] | (p[1] << 8))); }

BLOCKS_HD unsigned u16_at(const u8* p) { return (unsigned)p[0] | ((unsigned)p[1] << 8); }

BLOCKS_HD unsigned u32_at(const u8* p) {
    return (unsigned)p[0] | ((unsigned)p[1] << 8) | ((unsigned)p[2] << 16) | ((unsigned)p[3] << 24);
}

// 16-entry int8 tables packed little-endian into two words: ALU only, no divergent memory lookups.
BLOCKS_HD int iq4nl_value(int index) {  // kvalues_iq4nl
    const unsigned long long half = index < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
    return (signed char)((half >> (8 * (index & 7))) & 0xFF);
}

BLOCKS_HD int mxfp4_value(int index) {  // kvalues_mxfp4: e2m1 doubled, bit 3 the sign
    const int magnitude = (int)((0x0C08060403020100ull >> (8 * (index & 7))) & 0xFF);
    return index & 8 ? -magnitude : magnitude;  // integer negation keeps index 8 at +0
}

BLOCKS_HD float e8m0_to_fp32_half(unsigned e) {  // ggml_e8m0_to_fp32_half
    return bits_to_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
BLOCKS_HD void k_scale_min(const u8* s, int j, int& scale, int& min) {
    if (j < 4) {
        scale = s[j] & 63;
        min = s[j + 4] & 63;
    } else {
        scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Each Block* holds one format: BLOCK outputs in TYPE_SIZE bytes (ggml-common.h), and group(b, g, v)
// writes outputs 8g..8g+7 of the block at b to v.

struct BlockQ4_0 {  // d, qs[16]: low nibbles are outputs 0..15, high nibbles 16..31
    static constexpr int BLOCK = 32, TYPE_SIZE = 18;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const u8* qs = b + 2 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_rn(d, (float)(((qs[k] >> shift) & 0xF) - 8));
    }
};

struct BlockQ4_1 {  // d, m, qs[16]
    static constexpr int BLOCK = 32, TYPE_SIZE = 20;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
        const u8* qs = b + 4 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = add_rn(mul_rn(d, (float)((qs[k] >> shift) & 0xF)), m);
    }
};

struct BlockQ5_0 {  // d, qh (bit i is output i's fifth bit), qs[16]
    static constexpr int BLOCK = 32, TYPE_SIZE = 22;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const unsigned qh = u32_at(b + 2) >> (8 * g);
        const u8* qs = b + 6 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 0xF) | (((qh >> k) & 1) << 4);
            v[k] = mul_rn(d, (float)(q - 16));
        }
    }
};

struct BlockQ5_1 {  // d, m, qh, qs[16]
    static constexpr int BLOCK = 32, TYPE_SIZE = 24;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b), m = fp16_at(b + 2);
        const unsigned qh = u32_at(b + 4) >> (8 * g);
        const u8* qs = b + 8 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 0xF) | (((qh >> k) & 1) << 4);
            v[k] = add_rn(mul_rn(d, (float)q), m);
        }
    }
};

struct BlockQ8_0 {  // d, qs[32] int8
    static constexpr int BLOCK = 32, TYPE_SIZE = 34;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const u8* qs = b + 2 + g * 8;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_rn((float)(signed char)qs[k], d);
    }
};

struct BlockQ2_K {  // scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    static constexpr int BLOCK = 256, TYPE_SIZE = 84;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8;  // output i: byte qs[32 * (i / 128) + i % 32], bits 2 * ((i / 32) % 4)
        const int sc = b[i0 >> 4];
        const float dl = mul_rn(fp16_at(b + 80), (float)(sc & 0xF));
        const float ml = mul_rn(fp16_at(b + 82), (float)(sc >> 4));
        const u8* qs = b + 16 + (i0 >> 7) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 3) * 2;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = sub_rn(mul_rn(dl, (float)((qs[k] >> shift) & 3)), ml);
    }
};

struct BlockQ3_K {  // hmask[32], qs[64], scales[12] (16 6-bit scales), d
    static constexpr int BLOCK = 256, TYPE_SIZE = 110;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8, j = i0 >> 4;
        const u8* sc = b + 96;
        const int low = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
        const int high = (sc[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        const float dl = mul_rn(fp16_at(b + 108), (float)((low | (high << 4)) - 32));
        const u8* hmask = b + (i0 & 31);  // output i: bit i / 32 of hmask[i % 32]
        const u8* qs = b + 32 + (i0 >> 7) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 3) * 2, hbit = i0 >> 5;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 3) - ((hmask[k] >> hbit) & 1 ? 0 : 4);
            v[k] = mul_rn(dl, (float)q);
        }
    }
};

struct BlockQ4_K {  // d, dmin, scales[12] (8 6-bit scale/min pairs), qs[128]
    static constexpr int BLOCK = 256, TYPE_SIZE = 144;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8;  // output i: qs[32 * (i / 64) + i % 32], nibble (i / 32) % 2
        int scale, min;
        k_scale_min(b + 4, i0 >> 5, scale, min);
        const float dl = mul_rn(fp16_at(b), (float)scale);
        const float ml = mul_rn(fp16_at(b + 2), (float)min);
        const u8* qs = b + 16 + (i0 >> 6) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = sub_rn(mul_rn(dl, (float)((qs[k] >> shift) & 0xF)), ml);
    }
};

struct BlockQ5_K {  // d, dmin, scales[12], qh[32] (bit i / 32 of qh[i % 32]), qs[128]
    static constexpr int BLOCK = 256, TYPE_SIZE = 176;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8;
        int scale, min;
        k_scale_min(b + 4, i0 >> 5, scale, min);
        const float dl = mul_rn(fp16_at(b), (float)scale);
        const float ml = mul_rn(fp16_at(b + 2), (float)min);
        const u8* qh = b + 16 + (i0 & 31);
        const u8* qs = b + 48 + (i0 >> 6) * 32 + (i0 & 31);
        const int shift = ((i0 >> 5) & 1) * 4, hbit = i0 >> 5;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = ((qs[k] >> shift) & 0xF) | (((qh[k] >> hbit) & 1) << 4);
            v[k] = sub_rn(mul_rn(dl, (float)q), ml);
        }
    }
};

struct BlockQ6_K {  // ql[128], qh[64], scales[16] int8, d
    static constexpr int BLOCK = 256, TYPE_SIZE = 210;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8, half = i0 >> 7;
        const float dl = mul_rn(fp16_at(b + 208), (float)(signed char)b[192 + (i0 >> 4)]);
        const u8* ql = b + half * 64 + (i0 & 63);         // nibble (i % 128) / 64
        const u8* qh = b + 128 + half * 32 + (i0 & 31);   // bits 2 * ((i / 32) % 4)
        const int lshift = ((i0 >> 6) & 1) * 4, hshift = ((i0 >> 5) & 3) * 2;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int q = (((ql[k] >> lshift) & 0xF) | (((qh[k] >> hshift) & 3) << 4)) - 32;
            v[k] = mul_rn(dl, (float)q);
        }
    }
};

struct BlockIQ4_NL {  // d, qs[16] indices into kvalues_iq4nl
    static constexpr int BLOCK = 32, TYPE_SIZE = 18;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b);
        const u8* qs = b + 2 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_rn(d, (float)iq4nl_value((qs[k] >> shift) & 0xF));
    }
};

struct BlockIQ4_XS {  // d, scales_h (2 bits each), scales_l[4] (nibbles), qs[128]: 8 sub-blocks of 32
    static constexpr int BLOCK = 256, TYPE_SIZE = 136;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = g * 8, j = i0 >> 5;
        const unsigned scales_h = b[2] | (b[3] << 8);
        const int low = (b[4 + (j >> 1)] >> (4 * (j & 1))) & 0xF;
        const int high = (scales_h >> (2 * j)) & 3;
        const float dl = mul_rn(fp16_at(b), (float)((low | (high << 4)) - 32));
        const u8* qs = b + 8 + j * 16 + (i0 & 15);  // output i: nibble (i / 16) % 2
        const int shift = ((i0 >> 4) & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_rn(dl, (float)iq4nl_value((qs[k] >> shift) & 0xF));
    }
};

struct BlockMXFP4 {  // e (E8M0 exponent), qs[16] indices into kvalues_mxfp4
    static constexpr int BLOCK = 32, TYPE_SIZE = 17;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = e8m0_to_fp32_half(b[0]);
        const u8* qs = b + 1 + (g & 1) * 8;
        const int shift = (g >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_rn(d, (float)mxfp4_value((qs[k] >> shift) & 0xF));
    }
};


// ---- the IQ1 / IQ2 / IQ3 grids and the ternary types ---------------------------------------------

// The grids (quant_tables.cuh, generated from gguf.quants) sit in device global memory for the kernels
// (read through L1: lanes index them divergently, which __constant__ memory would serialize) and in a
// host array for host builds; GRID(name) is the one the current compilation pass reads.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define QUANT_TABLE_DEVICE(T, name, ...) [[maybe_unused]] static __device__ const T name##_device[] = {__VA_ARGS__};
#else
#define QUANT_TABLE_DEVICE(T, name, ...)
#endif
#if !defined(__CUDA_ARCH__)
#define QUANT_TABLE_HOST(T, name, ...) [[maybe_unused]] static const T name##_host[] = {__VA_ARGS__};
#else
#define QUANT_TABLE_HOST(T, name, ...)
#endif
#define QUANT_TABLE(T, name, ...) QUANT_TABLE_DEVICE(T, name, __VA_ARGS__) QUANT_TABLE_HOST(T, name, __VA_ARGS__)
#include "quant_tables.cuh"
#if defined(__CUDA_ARCH__)
#define GRID(name) name##_device
#else
#define GRID(name) name##_host
#endif

// ksigns[i] of the IQ2/IQ3 types: 7 sign bits and an eighth that makes the count of minus signs even.
BLOCKS_HD unsigned ksigns(unsigned index) { return index | ((unsigned)parity7(index) << 7); }

// (db * grid value) * (-1 where bit k of signs is set, else 1), the order gguf.quants multiplies in.
BLOCKS_HD float signed_grid_value(float db, unsigned value, unsigned signs, int k) {
    return mul_rn(mul_rn(db, (float)value), (signs >> k) & 1 ? -1.0f : 1.0f);
}

// db = d (0.5 + scale) times 1/4 (IQ2_*) or 1/2 (IQ3_XXS), for a 4-bit scale.
BLOCKS_HD float iq_half_scale(float d, unsigned scale, float factor) {
    return mul_rn(mul_rn(d, add_rn(0.5f, (float)scale)), factor);
}

// IQ1: dl ((code - 1) + delta), the grid row's 2-bit code k (value + 1) and delta = +-1/8.
BLOCKS_HD float iq1_value(float dl, unsigned row, int k, float delta) {
    return mul_rn(dl, add_rn((float)((int)((row >> (2 * k)) & 3) - 1), delta));
}

// IQ2_XXS: d, then 8 bytes per 32-value sub-block: 4 grid indices (a row of 8 values each) and a word of
// 4 7-bit sign indices (bits 7 l ..) and the 4-bit scale (bits 28..31).
struct BlockIQ2_XXS {
    static constexpr int BLOCK = 256, TYPE_SIZE = 66;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const u8* sub = b + 2 + 8 * (g >> 2);
        const int l = g & 3;
        const unsigned aux = u32_at(sub + 4);
        const float db = iq_half_scale(fp16_at(b), aux >> 28, 0.25f);
        const unsigned long long row = GRID(iq2xxs_grid)[sub[l]];
        const unsigned signs = ksigns((aux >> (7 * l)) & 127);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = signed_grid_value(db, (unsigned)(row >> (8 * k)) & 0xFF, signs, k);
    }
};

// IQ2_XS: d, qs[32] (u16 per 8 values: a 9-bit grid index, a 7-bit sign index), scales[8] (a nibble per 16).
struct BlockIQ2_XS {
    static constexpr int BLOCK = 256, TYPE_SIZE = 74;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const unsigned q = u16_at(b + 2 + 2 * g);
        const unsigned scale = (b[66 + (g >> 2)] >> (4 * ((g >> 1) & 1))) & 0xF;
        const float db = iq_half_scale(fp16_at(b), scale, 0.25f);
        const unsigned long long row = GRID(iq2xs_grid)[q & 511];
        const unsigned signs = ksigns(q >> 9);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = signed_grid_value(db, (unsigned)(row >> (8 * k)) & 0xFF, signs, k);
    }
};

// IQ2_S: d, qs[32] (grid index low bytes), signs[32] (a bit per value), qh[8] (2 high index bits per 8
// values), scales[8] (a nibble per 16 values).
struct BlockIQ2_S {
    static constexpr int BLOCK = 256, TYPE_SIZE = 82;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const unsigned index = b[2 + g] | (((b[66 + (g >> 2)] >> (2 * (g & 3))) & 3) << 8);
        const unsigned scale = (b[74 + (g >> 2)] >> (4 * ((g >> 1) & 1))) & 0xF;
        const float db = iq_half_scale(fp16_at(b), scale, 0.25f);
        const unsigned long long row = GRID(iq2s_grid)[index];
        const unsigned signs = b[34 + g];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = signed_grid_value(db, (unsigned)(row >> (8 * k)) & 0xFF, signs, k);
    }
};

// IQ3_XXS: d, qs[64] (grid indices, a row of 4 values each), then a word per 32-value sub-block: 4 7-bit
// sign indices and the 4-bit scale (bits 28..31).
struct BlockIQ3_XXS {
    static constexpr int BLOCK = 256, TYPE_SIZE = 98;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int l = g & 3;
        const unsigned aux = u32_at(b + 66 + 4 * (g >> 2));
        const float db = iq_half_scale(fp16_at(b), aux >> 28, 0.5f);
        const u8* qs = b + 2 + 2 * g;  // = 8 (sub-block) + 2 l
        const unsigned rows[2] = {GRID(iq3xxs_grid)[qs[0]], GRID(iq3xxs_grid)[qs[1]]};
        const unsigned signs = ksigns((aux >> (7 * l)) & 127);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = signed_grid_value(db, (rows[k >> 2] >> (8 * (k & 3))) & 0xFF, signs, k);
    }
};

// IQ3_S: d, qs[64] (grid index low bytes), qh[8] (each index's bit 8), signs[32] (a bit per value),
// scales[4] (a nibble per 32-value sub-block; db = d (1 + 2 scale)).
struct BlockIQ3_S {
    static constexpr int BLOCK = 256, TYPE_SIZE = 110;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int sub = g >> 2;
        const unsigned scale = (b[106 + (sub >> 1)] >> (4 * (sub & 1))) & 0xF;
        const float db = mul_rn(fp16_at(b), (float)(1 + 2 * scale));
        unsigned rows[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int i = 2 * g + e;
            rows[e] = GRID(iq3s_grid)[b[2 + i] | (((b[66 + (i >> 3)] >> (i & 7)) & 1) << 8)];
        }
        const unsigned signs = b[74 + g];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = signed_grid_value(db, (rows[k >> 2] >> (8 * (k & 3))) & 0xFF, signs, k);
    }
};

// IQ1_S: d, qs[32] (grid index low bytes), qh[8] (u16 per 32-value sub-block: 3 high index bits per 8
// values, the 3-bit scale in bits 12..14, delta's sign in bit 15).
struct BlockIQ1_S {
    static constexpr int BLOCK = 256, TYPE_SIZE = 50;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const unsigned qh = u16_at(b + 34 + 2 * (g >> 2));
        const unsigned row = GRID(iq1s_grid)[b[2 + g] | (((qh >> (3 * (g & 3))) & 7) << 8)];
        const float dl = mul_rn(fp16_at(b), (float)(2 * ((qh >> 12) & 7) + 1));
        const float delta = qh & 0x8000 ? -0.125f : 0.125f;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = iq1_value(dl, row, k, delta);
    }
};

// IQ1_M: qs[32] (grid index low bytes), qh[16] (a nibble per 8 values: 3 high index bits, delta's sign),
// scales[4] (u16: four 3-bit scales, one per 16 values, and a nibble of d in bits 12..15).
struct BlockIQ1_M {
    static constexpr int BLOCK = 256, TYPE_SIZE = 56;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const u8* sc = b + 48;
        const float d = f16_value((unsigned short)((u16_at(sc) >> 12) | ((u16_at(sc + 2) >> 8) & 0xF0) |
                                                   ((u16_at(sc + 4) >> 4) & 0xF00) | (u16_at(sc + 6) & 0xF000)));
        const int s = g >> 1;  // the scale of values 16 s ..
        const float dl = mul_rn(d, (float)(2 * ((u16_at(sc + 2 * (s >> 2)) >> (3 * (s & 3))) & 7) + 1));
        const unsigned nibble = (b[32 + (g >> 1)] >> (4 * (g & 1))) & 0xF;
        const unsigned row = GRID(iq1s_grid)[b[g] | ((nibble & 7) << 8)];
        const float delta = nibble & 8 ? -0.125f : 0.125f;
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = iq1_value(dl, row, k, delta);
    }
};

// TQ1_0: qs[48], qh[4], d: each byte holds 5 (qh: 4) base-3 digits as a fixed-point fraction; digit n
// is the top of 3 (byte 3^n mod 256), over 256.
struct BlockTQ1_0 {
    static constexpr int BLOCK = 256, TYPE_SIZE = 54;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const float d = fp16_at(b + 52);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int i = 8 * g + k;
            // output i: digit i / 32 of qs[i % 32] for i < 160; then j = i - 160: digit j / 16 of
            // qs[32 + j % 16] for j < 80; then j = i - 240: digit j / 4 of qh[j % 4]
            const int byte = i < 160 ? i & 31 : i < 240 ? 32 + ((i - 160) & 15) : 48 + ((i - 240) & 3);
            const int power = i < 160 ? i >> 5 : i < 240 ? (i - 160) >> 4 : (i - 240) >> 2;
            const unsigned scaled = (b[byte] * (unsigned)((0x511B090301ull >> (8 * power)) & 0xFF)) & 0xFF;
            v[k] = mul_rn(d, (float)((int)((scaled * 3) >> 8) - 1));
        }
    }
};

// TQ2_0: qs[64], d: output i is bits 2 ((i % 128) / 32) of qs[32 (i / 128) + i % 32], minus 1.
struct BlockTQ2_0 {
    static constexpr int BLOCK = 256, TYPE_SIZE = 66;
    BLOCKS_HD static void group(const u8* b, int g, float* v) {
        const int i0 = 8 * g, shift = 2 * ((i0 & 127) >> 5);
        const u8* qs = b + 32 * (i0 >> 7) + (i0 & 31);
        const float d = fp16_at(b + 64);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = mul_rn(d, (float)((int)((qs[k] >> shift) & 3) - 1));
    }
};
