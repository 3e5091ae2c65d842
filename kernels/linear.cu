// y = x · Wᵀ, W [n, k] row-major (src/ops/linear.rs is the reference).
// `linear_rows_*`: one warp per output row, every token of the step in the same warp, so each
// weight row is read from memory once per step. 16-byte weight loads when k allows, with
// LOADS_IN_FLIGHT of them issued before their products (a matrix-vector product is bound by the
// bytes in flight).
#include "common.cuh"
#include "vec.cuh"

#define MAX_TOKENS 8

template <typename W>
__device__ __forceinline__ void linear_rows(float* y, const float* x, const W* w, int tokens, long k, long n) {
    constexpr int N = WeightVec<W>::N;
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    const bool vec = k % N == 0 && aligned16(x) && aligned16(w);
    for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < n; r += gridDim.x * warps_per_block) {
        const W* wr = w + r * k;
        for (int t0 = 0; t0 < tokens; t0 += MAX_TOKENS) {
            const int nt = min(MAX_TOKENS, tokens - t0);
            const float* xt = x + t0 * k;
            float acc[MAX_TOKENS];
#pragma unroll
            for (int t = 0; t < MAX_TOKENS; t++) acc[t] = 0.0f;
            if (vec) {
                const long chunks = k / N;
                long i = lane;
                for (; i + 32 * (LOADS_IN_FLIGHT - 1) < chunks; i += 32 * LOADS_IN_FLIGHT) {
                    float wv[LOADS_IN_FLIGHT][N];
#pragma unroll
                    for (int u = 0; u < LOADS_IN_FLIGHT; u++) WeightVec<W>::chunk(wr, i + 32 * u, wv[u]);
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++) {
                        if (t < nt) {
#pragma unroll
                            for (int u = 0; u < LOADS_IN_FLIGHT; u++) {
                                float xv[N];
                                act_chunk<N>(xt + t * k, i + 32 * u, xv);
#pragma unroll
                                for (int j = 0; j < N; j++) acc[t] += wv[u][j] * xv[j];
                            }
                        }
                    }
                }
                for (; i < chunks; i += 32) {
                    float wv[N];
                    WeightVec<W>::chunk(wr, i, wv);
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++) {
                        if (t < nt) {
                            float xv[N];
                            act_chunk<N>(xt + t * k, i, xv);
#pragma unroll
                            for (int j = 0; j < N; j++) acc[t] += wv[j] * xv[j];
                        }
                    }
                }
            } else {
                for (long i = lane; i < k; i += 32) {
                    const float wi = WeightVec<W>::one(wr, i);
#pragma unroll
                    for (int t = 0; t < MAX_TOKENS; t++)
                        if (t < nt) acc[t] += wi * xt[t * k + i];
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

extern "C" __global__ void linear_rows_f32(float* y, const float* x, const float* w, int tokens, long k, long n) {
    linear_rows<float>(y, x, w, tokens, k, n);
}

// bf16 weights (the trunk on the GPU), f32 activations and accumulation.
extern "C" __global__ void linear_rows_bf16(float* y, const float* x, const bf16_t* w, int tokens, long k, long n) {
    linear_rows<bf16_t>(y, x, w, tokens, k, n);
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
