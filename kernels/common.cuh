// Shared helpers for every kernel file. Included by `#include "common.cuh"`; graphrun expands
// the include itself before handing the source to NVRTC (no include paths needed).
#pragma once

typedef unsigned short bf16_t;

// bf16 → f32 is exact: the bf16 bits are the high half of the f32.
__device__ __forceinline__ float bf16_to_f32(bf16_t v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over a block whose size is a multiple of 32 (at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float total = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(total);
}

// As torch: silu(x) = x * sigmoid(x).
__device__ __forceinline__ float silu_f32(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }
