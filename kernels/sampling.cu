// Choosing the next token on the device (src/runtime/sampling.rs is the reference), so that a
// greedy step downloads one id instead of its row of logits (~1 MB at the real vocabulary).
#include "common.cuh"

// argmax_row_f32: *best = the key of the first index of the largest value of x [n], as
// sampling::argmax chooses it: NaN never wins, except at index 0, which nothing then beats (the
// reference compares v > x[best]); -0 ties with +0. key = order(value) << 32 | (0xffffffff -
// index), so that the unsigned max is the larger value, then the lower index; a NaN at index 0
// takes the largest key (all bits set: index 0). *best must be 0 before the launch (the launcher
// zeroes it on the stream); every warp adds its max by atomicMax, whose result does not depend on
// the order.
extern "C" __global__ void argmax_row_f32(unsigned long long* best, const float* x, long n) {
    wait_for_producers();
    unsigned long long key = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float v = x[i];
        if (isnan(v)) {
            if (i == 0) key = ~0ull;
        } else {
            // -0 and +0 are equal to the reference's `>`: one key for both.
            const unsigned int ord = ((unsigned int)float_order_key(v == 0.0f ? 0.0f : v)) ^ 0x80000000u;
            const unsigned long long k = ((unsigned long long)ord << 32) | (0xffffffffu - (unsigned int)i);
            key = k > key ? k : key;
        }
    }
    key = warp_max_u64(key);
    if ((threadIdx.x & 31) == 0 && key != 0) atomicMax(best, key);
}
