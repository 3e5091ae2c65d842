// y = x · Wᵀ, W [n, k] row-major (src/ops/linear.rs is the reference).
// `linear_rows_*`: one warp per output row, every token of the step in the same warp, so each
// weight row is read from memory once per step. 16-byte weight loads when k allows.
#include "common.cuh"

#define MAX_TOKENS 8

extern "C" __global__ void linear_rows_f32(float* y, const float* x, const float* w, int tokens, long k, long n) {
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < n; r += gridDim.x * warps_per_block) {
        for (int t0 = 0; t0 < tokens; t0 += MAX_TOKENS) {
            const int nt = min(MAX_TOKENS, tokens - t0);
            float acc[MAX_TOKENS];
#pragma unroll
            for (int t = 0; t < MAX_TOKENS; t++) acc[t] = 0.0f;
            const float* wr = w + r * k;
            if ((k & 3) == 0) {
                const float4* w4 = reinterpret_cast<const float4*>(wr);
                for (long i = lane; i < k / 4; i += 32) {
                    const float4 wv = w4[i];
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++) {
                        if (t < nt) {
                            const float4 xv = reinterpret_cast<const float4*>(x + (t0 + t) * k)[i];
                            acc[t] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
                        }
                    }
                }
            } else {
                for (long i = lane; i < k; i += 32) {
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++)
                        if (t < nt) acc[t] += wr[i] * x[(t0 + t) * k + i];
                }
            }
#pragma unroll
            for (int t = 0; t < MAX_TOKENS; t++) {
                const float s = warp_sum(acc[t]);
                if (lane == 0 && t < nt) y[(t0 + t) * n + r] = s;
            }
        }
    }
}

// bf16 weights (the trunk on the GPU), f32 activations and accumulation.
extern "C" __global__ void linear_rows_bf16(float* y, const float* x, const bf16_t* w, int tokens, long k, long n) {
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < n; r += gridDim.x * warps_per_block) {
        for (int t0 = 0; t0 < tokens; t0 += MAX_TOKENS) {
            const int nt = min(MAX_TOKENS, tokens - t0);
            float acc[MAX_TOKENS];
#pragma unroll
            for (int t = 0; t < MAX_TOKENS; t++) acc[t] = 0.0f;
            const bf16_t* wr = w + r * k;
            if ((k & 7) == 0) {
                // 8 bf16 weights per 16-byte load.
                const uint4* w8 = reinterpret_cast<const uint4*>(wr);
                for (long i = lane; i < k / 8; i += 32) {
                    const uint4 packed = w8[i];
                    const unsigned int words[4] = {packed.x, packed.y, packed.z, packed.w};
                    float wv[8];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        wv[2 * j] = __uint_as_float(words[j] << 16);
                        wv[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
                    }
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++) {
                        if (t < nt) {
                            const float4* x4 = reinterpret_cast<const float4*>(x + (t0 + t) * k + i * 8);
                            const float4 a = x4[0], b = x4[1];
                            acc[t] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w +
                                      wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
                        }
                    }
                }
            } else {
                for (long i = lane; i < k; i += 32) {
                    const float wi = bf16_to_f32(wr[i]);
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++)
                        if (t < nt) acc[t] += wi * x[(t0 + t) * k + i];
                }
            }
#pragma unroll
            for (int t = 0; t < MAX_TOKENS; t++) {
                const float s = warp_sum(acc[t]);
                if (lane == 0 && t < nt) y[(t0 + t) * n + r] = s;
            }
        }
    }
}

// Many tokens: y [T, n] = x [T, k] · W [n, k]ᵀ in shared-memory tiles of 64 tokens x 64 outputs
// (32 of k at a time), so each weight tile is read once per 64 tokens instead of once per 8.
// 256 threads; thread (ty, tx) = (tid / 16, tid % 16) owns tokens ty*4..+4 and outputs tx*4..+4.
#define TILE_T 64
#define TILE_N 64
#define TILE_K 32

template <typename W>
__device__ __forceinline__ float weight_at(const W* w, long i);
template <>
__device__ __forceinline__ float weight_at<float>(const float* w, long i) { return w[i]; }
template <>
__device__ __forceinline__ float weight_at<bf16_t>(const bf16_t* w, long i) { return bf16_to_f32(w[i]); }

template <typename W>
__device__ __forceinline__ void linear_tiled(float* y, const float* x, const W* w, long tokens, long k, long n) {
    __shared__ float xs[TILE_T][TILE_K + 1];
    __shared__ float ws[TILE_N][TILE_K + 1];
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const long t0 = (long)blockIdx.y * TILE_T, n0 = (long)blockIdx.x * TILE_N;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (long k0 = 0; k0 < k; k0 += TILE_K) {
#pragma unroll
        for (int e = tid; e < TILE_T * TILE_K; e += 256) {
            const int row = e / TILE_K, col = e % TILE_K;
            const long t = t0 + row, kk = k0 + col;
            xs[row][col] = (t < tokens && kk < k) ? x[t * k + kk] : 0.0f;
            const long r = n0 + row;
            ws[row][col] = (r < n && kk < k) ? weight_at<W>(w, r * k + kk) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TILE_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[ty * 4 + i][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = ws[tx * 4 + j][kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();  // the tiles are rewritten next
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const long t = t0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long r = n0 + tx * 4 + j;
            if (t < tokens && r < n) y[t * n + r] = acc[i][j];
        }
    }
}

extern "C" __global__ void linear_tiled_f32(float* y, const float* x, const float* w, long tokens, long k, long n) {
    linear_tiled<float>(y, x, w, tokens, k, n);
}

extern "C" __global__ void linear_tiled_bf16(float* y, const float* x, const bf16_t* w, long tokens, long k, long n) {
    linear_tiled<bf16_t>(y, x, w, tokens, k, n);
}
