// Deterministic pseudo-random fills for benchmark weights generated on the device (no files).
// Value i depends only on (seed, i): a splitmix64 hash mapped to [lo, hi).
#include "common.cuh"

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform01(unsigned long long seed, long i) {
    return (float)(splitmix64(seed ^ (unsigned long long)i * 0xD1B54A32D192ED03ull) >> 40) * (1.0f / 16777216.0f);
}

extern "C" __global__ void fill_uniform_f32(float* out, long n, unsigned long long seed, float lo, float hi) {
    wait_for_producers();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = lo + (hi - lo) * uniform01(seed, i);
}

// bf16 by truncation of the f32 value (benchmark data: rounding does not matter).
extern "C" __global__ void fill_uniform_bf16(bf16_t* out, long n, unsigned long long seed, float lo, float hi) {
    wait_for_producers();
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = (bf16_t)(__float_as_uint(lo + (hi - lo) * uniform01(seed, i)) >> 16);
}

// Bytes uniform in [lo, hi] (random NVFP4 codes and scales).
extern "C" __global__ void fill_bytes_u8(unsigned char* out, long n, unsigned long long seed, unsigned lo, unsigned hi) {
    wait_for_producers();
    const unsigned span = hi - lo + 1;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = (unsigned char)(lo + (unsigned)((splitmix64(seed ^ (unsigned long long)i * 0xD1B54A32D192ED03ull) >> 32) % span));
}
