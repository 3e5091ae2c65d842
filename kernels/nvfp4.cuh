// NVFP4's scale bytes and constants, shared by moe_nvfp4.cu (token-major, expert-major) and
// moe_nvfp4_union.cu (the union of a step's experts). src/quant/nvfp4.rs is the reference.
#pragma once

#define NVFP4_NAN __int_as_float(0x7fc00000)
// Values of a scale group.
#define NVFP4_GROUP 16

// An E4M3 scale byte's value, NaN codes as +0.
__device__ __forceinline__ float nvfp4_e4m3(unsigned b) {
    if ((b & 0x7Fu) == 0x7Fu) return 0.0f;
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    const float v = e == 0 ? (float)m * (1.0f / 512.0f) : __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}
