// The expert-major experts' tiles, shared by moe.cu (f32 and bf16 weights) and moe_nvfp4.cu
// (NVFP4): slots grouped by expert into tiles of EM_TILE (moe.cu's `..._group` writes the tile
// table), the tile's rows, and the tensor-core tile shape. Included after mma.cuh.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define EM_TILE 64
#define EM_TILE_K 32

// The rows of tile blockIdx.x: slot (or -1) and its row of `a` (or -1), in shared memory, and
// (`count`, when asked) how many of them are slots: the first `count`. Returns the tile's
// expert, -1 for no tile (the whole block returns).
__device__ __forceinline__ int em_tile_rows(const int* order, const int* tiles, int per_row_div, int* slot,
                                            int* a_row, int* count_out = nullptr) {
    const long b = blockIdx.x;
    const int e = tiles[3 * b];
    if (e < 0) return -1;
    const int first = tiles[3 * b + 1], count = tiles[3 * b + 2];
    if (count_out != nullptr) *count_out = count;
    if (threadIdx.x < EM_TILE) {
        const int s = (int)threadIdx.x < count ? order[first + threadIdx.x] : -1;
        slot[threadIdx.x] = s;
        a_row[threadIdx.x] = s < 0 ? -1 : s / per_row_div;
    }
    __syncthreads();
    return e;
}

// The tile's activation rows for mma_tile: row i is a[a_row[i]] (a zero row for -1).
struct EmGatherRows {
    const float* x;
    const int* a_row;
    long k;
    __device__ __forceinline__ const float* row(int i) const { return a_row[i] < 0 ? nullptr : x + a_row[i] * k; }
    __device__ __forceinline__ void load8(const float* r, long kk, float* v) const { mma_load8(r + kk, v); }
};

// Stores outputs c, c + 1 (< n) of slot s's row of y [slots, n].
__device__ __forceinline__ void em_store_pair(float* y, int s, long n, long c, float v0, float v1) {
    if (s < 0) return;
    float* row = y + (long)s * n;
    if ((n & 1) == 0 && c + 1 < n) {
        float2 v;
        v.x = v0, v.y = v1;
        *reinterpret_cast<float2*>(row + c) = v;
    } else {
        if (c < n) row[c] = v0;
        if (c + 1 < n) row[c + 1] = v1;
    }
}

// The tensor-core tile: 64 slots x 128 outputs a block of 8 warps of 32 x 32 (see moe.cu).
#define EM_MMA_WARPS_M 2
#define EM_MMA_WARPS_N 4
#define EM_MMA_MT 2
#define EM_MMA_NT 4
#define EM_MMA_BN (EM_MMA_WARPS_N * EM_MMA_NT * 8)
static_assert(EM_MMA_WARPS_M * EM_MMA_MT * 16 == EM_TILE, "a tensor-core tile holds one tile of slots");

