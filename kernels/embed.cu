// Row gathers (src/ops/embed.rs is the reference): for each of `count` ids, `d` table columns.
// Ids were range-checked on the host (tokens) or are in range by construction (n-gram ids).
#include "common.cuh"

extern "C" __global__ void embed_reference_f32(float* y, const long long* ids, const float* table, long count, long d) {
    wait_for_producers();
    for (long i = blockIdx.x; i < count; i += gridDim.x) {
        const float* row = table + ids[i] * d;
        for (long c = threadIdx.x; c < d; c += blockDim.x) y[i * d + c] = row[c];
    }
}

extern "C" __global__ void embed_reference_bf16(float* y, const long long* ids, const bf16_t* table, long count, long d) {
    wait_for_producers();
    for (long i = blockIdx.x; i < count; i += gridDim.x) {
        const bf16_t* row = table + ids[i] * d;
        for (long c = threadIdx.x; c < d; c += blockDim.x) y[i * d + c] = bf16_to_f32(row[c]);
    }
}
