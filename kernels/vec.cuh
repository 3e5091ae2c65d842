// Vector loads of weights and activations, and dot products built on them, for the kernels that
// stream a weight matrix once per step (linear.cu, layout.cu). Included after common.cuh.
#pragma once
#include "common.cuh"

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// Weight loads: N consecutive weights as f32, chunk i (weights i*N .. i*N+N-1), one 16-byte load
// through the read-only path (weights never change during a step). `load` keeps the chunk packed
// (4 registers whatever the type, so that many loads can be in flight) and `unpack` converts it;
// `chunk` is both.
template <typename W>
struct WeightVec;

__device__ __forceinline__ uint4 load_weight_chunk(const void* w, long i) {
    return __ldg(reinterpret_cast<const uint4*>(w) + i);
}

template <>
struct WeightVec<float> {
    static constexpr int N = 4;
    static __device__ __forceinline__ float one(const float* w, long i) { return w[i]; }
    static __device__ __forceinline__ uint4 load(const float* w, long i) { return load_weight_chunk(w, i); }
    static __device__ __forceinline__ void unpack(const uint4 p, float* out) {
        out[0] = __uint_as_float(p.x);
        out[1] = __uint_as_float(p.y);
        out[2] = __uint_as_float(p.z);
        out[3] = __uint_as_float(p.w);
    }
    static __device__ __forceinline__ void chunk(const float* w, long i, float* out) { unpack(load(w, i), out); }
};

template <>
struct WeightVec<bf16_t> {
    static constexpr int N = 8;
    static __device__ __forceinline__ float one(const bf16_t* w, long i) { return bf16_to_f32(w[i]); }
    static __device__ __forceinline__ uint4 load(const bf16_t* w, long i) { return load_weight_chunk(w, i); }
    static __device__ __forceinline__ void unpack(const uint4 p, float* out) {
        const unsigned int words[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            out[2 * j] = __uint_as_float(words[j] << 16);
            out[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ void chunk(const bf16_t* w, long i, float* out) { unpack(load(w, i), out); }
};

// N consecutive f32 activations, chunk i, as N/4 16-byte loads.
template <int N>
__device__ __forceinline__ void act_chunk(const float* a, long i, float* out) {
    const float4* a4 = reinterpret_cast<const float4*>(a + i * N);
#pragma unroll
    for (int j = 0; j < N / 4; j++) {
        const float4 v = a4[j];
        out[4 * j] = v.x;
        out[4 * j + 1] = v.y;
        out[4 * j + 2] = v.z;
        out[4 * j + 3] = v.w;
    }
}

// Weight chunks a thread has in flight at once: a matrix-vector product is bound by how many
// bytes are in flight, and one load per loop iteration leaves most of the bandwidth idle.
#define LOADS_IN_FLIGHT 4

// This thread's share of a·w over n values: chunks first, first + stride, ... (to be reduced
// over the `stride` threads that share the dot product).
template <typename W>
__device__ __forceinline__ float strided_dot(const float* a, const W* w, long n, long first, long stride) {
    constexpr int N = WeightVec<W>::N;
    float acc = 0.0f;
    if (n % N == 0 && aligned16(a) && aligned16(w)) {
        const long chunks = n / N;
        long i = first;
        for (; i + (LOADS_IN_FLIGHT - 1) * stride < chunks; i += LOADS_IN_FLIGHT * stride) {
            float wv[LOADS_IN_FLIGHT][N];
#pragma unroll
            for (int u = 0; u < LOADS_IN_FLIGHT; u++) WeightVec<W>::chunk(w, i + u * stride, wv[u]);
#pragma unroll
            for (int u = 0; u < LOADS_IN_FLIGHT; u++) {
                float av[N];
                act_chunk<N>(a, i + u * stride, av);
#pragma unroll
                for (int j = 0; j < N; j++) acc += av[j] * wv[u][j];
            }
        }
        for (; i < chunks; i += stride) {
            float wv[N], av[N];
            WeightVec<W>::chunk(w, i, wv);
            act_chunk<N>(a, i, av);
#pragma unroll
            for (int j = 0; j < N; j++) acc += av[j] * wv[j];
        }
    } else {
        for (long i = first; i < n; i += stride) acc += a[i] * WeightVec<W>::one(w, i);
    }
    return acc;
}

// strided_dot_short's two halves, for a caller that issues the loads early: the chunks first,
// first + stride, ... (< chunks, at most MAX) of w into raw, then their products with a's chunks
// summed in chunk order.
template <typename W, int MAX>
__device__ __forceinline__ void short_chunks_load(const W* w, long chunks, long first, long stride, uint4* raw) {
#pragma unroll
    for (int u = 0; u < MAX; u++)
        if (first + u * stride < chunks) raw[u] = WeightVec<W>::load(w, first + u * stride);
}

template <typename W, int MAX>
__device__ __forceinline__ float short_chunks_dot(const float* a, const uint4* raw, long chunks, long first,
                                                  long stride) {
    constexpr int N = WeightVec<W>::N;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < MAX; u++) {
        if (first + u * stride < chunks) {
            float wv[N], av[N];
            WeightVec<W>::unpack(raw[u], wv);
            act_chunk<N>(a, first + u * stride, av);
#pragma unroll
            for (int j = 0; j < N; j++) acc += av[j] * wv[j];
        }
    }
    return acc;
}

// As strided_dot, for a short dot product (at most MAX chunks a thread): every chunk is loaded
// before any is used, one round trip to memory where strided_dot takes one per LOADS_IN_FLIGHT
// chunks. The same sums in the same order.
template <typename W, int MAX>
__device__ __forceinline__ float strided_dot_short(const float* a, const W* w, long n, long first, long stride) {
    constexpr int N = WeightVec<W>::N;
    const long chunks = n / N;
    if (n % N != 0 || !aligned16(a) || !aligned16(w) || chunks > MAX * stride)
        return strided_dot(a, w, n, first, stride);
    uint4 raw[MAX];
    short_chunks_load<W, MAX>(w, chunks, first, stride, raw);
    return short_chunks_dot<W, MAX>(a, raw, chunks, first, stride);
}

// This thread's shares of a·w0 and a·w1 over n values (chunks first, first + stride, ...): the
// chunks of both rows and of a loaded together, two of each row in flight, so that two dot
// products over one vector take one round of loads instead of two.
template <typename W>
__device__ __forceinline__ void strided_dot2(const float* a, const W* w0, const W* w1, long n, long first, long stride,
                                             float& d0, float& d1) {
    constexpr int N = WeightVec<W>::N;
    d0 = 0.0f;
    d1 = 0.0f;
    if (n % N == 0 && aligned16(a) && aligned16(w0) && aligned16(w1)) {
        const long chunks = n / N;
        long i = first;
        for (; i + stride < chunks; i += 2 * stride) {
            float u[2][N], v[2][N];
#pragma unroll
            for (int q = 0; q < 2; q++) {
                WeightVec<W>::chunk(w0, i + q * stride, u[q]);
                WeightVec<W>::chunk(w1, i + q * stride, v[q]);
            }
#pragma unroll
            for (int q = 0; q < 2; q++) {
                float x[N];
                act_chunk<N>(a, i + q * stride, x);
#pragma unroll
                for (int j = 0; j < N; j++) {
                    d0 += x[j] * u[q][j];
                    d1 += x[j] * v[q][j];
                }
            }
        }
        for (; i < chunks; i += stride) {
            float u[N], v[N], x[N];
            WeightVec<W>::chunk(w0, i, u);
            WeightVec<W>::chunk(w1, i, v);
            act_chunk<N>(a, i, x);
#pragma unroll
            for (int j = 0; j < N; j++) {
                d0 += x[j] * u[j];
                d1 += x[j] * v[j];
            }
        }
    } else {
        for (long i = first; i < n; i += stride) {
            d0 += a[i] * WeightVec<W>::one(w0, i);
            d1 += a[i] * WeightVec<W>::one(w1, i);
        }
    }
}

// One lane's share of a·w (to be reduced with warp_sum).
template <typename W>
__device__ __forceinline__ float lane_dot(const float* a, const W* w, long n, int lane) {
    return strided_dot(a, w, n, lane, 32);
}

// a·w over the whole block (a multiple of 32 threads); every thread gets the sum.
template <typename W>
__device__ __forceinline__ float block_dot(const float* a, const W* w, long n) {
    return block_sum(strided_dot(a, w, n, threadIdx.x, blockDim.x));
}

// Before wait_for_producers(): the weight rows a block reads in its first pass, rows
// blockIdx.x * per_block .. + per_block of W [n, k], brought into L2 by one thread.
template <typename W>
__device__ __forceinline__ void prefetch_first_rows(const W* w, long k, long n, long per_block) {
    const long r0 = (long)blockIdx.x * per_block;
    if (threadIdx.x != 0 || r0 >= n) return;
    prefetch_weights(w + r0 * k, min(per_block, n - r0) * k * (long)sizeof(W));
}

// The dot products of x [k] with `here` (≤ G) weight rows row(0) .. row(here - 1), every thread
// of the block along k: thread t takes chunks t, t + blockDim, ... of the rows (each activation
// chunk loaded once for all G), U chunks of each row in flight, kept packed (4 registers each)
// until their products (fewer registers, more blocks a multiprocessor), and the G sums reduced
// over the block. Every lane of warp 0 gets sums[g] for g < here. Every thread of the block
// calls it (it synchronises the block, before it returns too, so it can be called again).
// `before_sums()` runs once the products are formed, before their reduction: loads the caller
// issues there are in flight during the reduction, and take no registers in the loop.
template <typename W, int G, int U, typename Row, typename BeforeSums>
__device__ __forceinline__ void block_dots(const float* x, Row row, long k, int here, float* sums,
                                           BeforeSums before_sums) {
    constexpr int N = WeightVec<W>::N;
    __shared__ float partial[G][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const long stride = blockDim.x;
    bool vec = k % N == 0 && aligned16(x);
#pragma unroll
    for (int g = 0; g < G; g++)
        if (g < here) vec = vec && aligned16(row(g));
    float acc[G];
#pragma unroll
    for (int g = 0; g < G; g++) acc[g] = 0.0f;
    if (vec) {
        const long chunks = k / N;
        for (long i = threadIdx.x; i < chunks; i += U * stride) {
            uint4 raw[U][G];
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int g = 0; g < G; g++)
                    if (g < here && i + u * stride < chunks) raw[u][g] = WeightVec<W>::load(row(g), i + u * stride);
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (i + u * stride >= chunks) break;
                float xv[N];
                act_chunk<N>(x, i + u * stride, xv);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    if (g < here) {
                        float wv[N];
                        WeightVec<W>::unpack(raw[u][g], wv);
#pragma unroll
                        for (int j = 0; j < N; j++) acc[g] += wv[j] * xv[j];
                    }
                }
            }
        }
    } else {
        for (long i = threadIdx.x; i < k; i += stride) {
#pragma unroll
            for (int g = 0; g < G; g++)
                if (g < here) acc[g] += x[i] * WeightVec<W>::one(row(g), i);
        }
    }
    before_sums();
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float v = warp_sum(acc[g]);
        if (lane == 0) partial[g][warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) sums[g] = warp_sum(lane < warps ? partial[g][lane] : 0.0f);
    }
    __syncthreads();  // `partial` is rewritten by the next call
}

template <typename W, int G, int U, typename Row>
__device__ __forceinline__ void block_dots(const float* x, Row row, long k, int here, float* sums) {
    block_dots<W, G, U>(x, row, k, here, sums, [] {});
}
