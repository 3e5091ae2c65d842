// The NVFP4 union kernels' shared pieces (moe_nvfp4_union.cu: a block per tile of a leading
// slot's expert; moe_nvfp4_persistent.cu: a grid sized to the GPU walking the union's tiles):
// codes widened by shifts to bf16 pairs, the scale table, the split of activations into bf16 hi
// and lo, and one word's two tensor-core steps. The layouts and why the products are exact are
// described at the top of moe_nvfp4_union.cu. Included after common.cuh, mma.cuh and nvfp4.cuh.
#pragma once

// Where word w (8 values) of a staged row is stored: rotated within its group of four.
__device__ __forceinline__ long union_swizzle(long w) { return (w & ~3l) | ((w + (w >> 2)) & 3l); }

// Words (uint4) a staged row of k values takes: k / 8 raised to 4 more than a multiple of 8
// (registry::cuda::moe::union_stride).
__device__ __forceinline__ long union_stride(long k) { return k / 8 + (12 - (k / 8) % 8) % 8; }

// Scale byte b times 2^119 in bf16, in both halves (E4M3's NaN codes as +0).
__device__ __forceinline__ unsigned union_scale_pair(unsigned b) {
    const unsigned h = __float_as_uint(nvfp4_e4m3(b) * 0x1p119f) >> 16;
    return h | (h << 16);
}

// Pair i (0..3) of an 8-code word: codes i and i + 4 as bf16 bits of 2^-126 times their values.
template <int I>
__device__ __forceinline__ unsigned union_pair(unsigned w) {
    constexpr int EEM = 6 - 4 * I, SIGN = 12 - 4 * I;
    const unsigned eem = EEM >= 0 ? (w << EEM) : (w >> -EEM);
    const unsigned sign = SIGN > 0 ? (w << SIGN) : w;
    return (eem & 0x01C001C0u) | (sign & 0x80008000u);
}

// Values a, b as a pair of bf16 (a in the low half), hi = bf16(v), and the pair of what remains.
__device__ __forceinline__ void union_split(float a, float b, unsigned& hi, unsigned& lo) {
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xFFFF0000u));
}

// a * b + (-0) in bf16x2: exact here (the products fit bf16), subnormal inputs included.
__device__ __forceinline__ unsigned union_scaled(unsigned pair, unsigned scale) {
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(pair), "r"(scale), "r"(0x80008000u));
    return d;
}

// The 16 code bytes of `row` at `col` (columns col .. col + 31, col a multiple of 32; those at or
// past k, a multiple of 16, read as zero). `wide`: rows 16-byte aligned (k % 32 == 0).
__device__ __forceinline__ uint4 union_codes(const unsigned char* codes, long row, long k, long col, bool wide) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row < 0 || col >= k) return v;
    const unsigned char* p = codes + row * (k / 2) + col / 2;
    if (wide) return __ldg(reinterpret_cast<const uint4*>(p));
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    v.x = a.x, v.y = a.y;
    if (col + 32 <= k) {
        const uint2 b = __ldg(reinterpret_cast<const uint2*>(p + 8));
        v.z = b.x, v.w = b.y;
    }
    return v;
}

// The two scale bytes of those columns (byte 0 the first group's).
// `wide` (k % 32 == 0): both bytes at an even offset, read as one u16.
__device__ __forceinline__ unsigned union_scale_bytes(const unsigned char* scales, long row, long k, long col,
                                                      bool wide) {
    if (row < 0 || col >= k) return 0u;
    const unsigned char* p = scales + row * (k / NVFP4_GROUP) + col / NVFP4_GROUP;
    if (wide) return __ldg(reinterpret_cast<const unsigned short*>(p));
    const unsigned first = __ldg(p);
    return col + 32 <= k ? first | ((unsigned)__ldg(p + 1) << 8) : first;
}

// One word q of a chunk: two k-steps of 16 (pairs 0, 1 then 2, 3) for rows g (ca) and g + 8 (cb).
__device__ __forceinline__ void union_word(float (&d)[4], unsigned ca, unsigned cb, unsigned sa, unsigned sb,
                                           uint4 bq) {
    unsigned a[4];
    a[0] = union_scaled(union_pair<0>(ca), sa);
    a[1] = union_scaled(union_pair<0>(cb), sb);
    a[2] = union_scaled(union_pair<1>(ca), sa);
    a[3] = union_scaled(union_pair<1>(cb), sb);
    mma_bf16_16816(d, a, bq.x, bq.y);
    a[0] = union_scaled(union_pair<2>(ca), sa);
    a[1] = union_scaled(union_pair<2>(cb), sb);
    a[2] = union_scaled(union_pair<3>(ca), sa);
    a[3] = union_scaled(union_pair<3>(cb), sb);
    mma_bf16_16816(d, a, bq.z, bq.w);
}

// Fills the block's scale table (before the wait: it reads nothing a producer writes).
__device__ __forceinline__ void fill_shared_scale_table(unsigned* stab) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) stab[i] = union_scale_pair(i);
}
