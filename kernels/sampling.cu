// Choosing the next token on the device (src/runtime/sampling.rs is the reference), so that a
// greedy step downloads one id instead of its row of logits (~1 MB at the real vocabulary).
#include "common.cuh"

// argmax_row_f32: *best = the key of the first index of the largest value of x [n], as
// sampling::argmax chooses it; -0 ties with +0. key = order(value) << 32 | (0xffffffff - index),
// so that the unsigned max is the larger value, then the lower index. A NaN makes the row one no
// token can be chosen from (runtime::sampling::check_logits): its key is 0xffffffff << 32 |
// (0xffffffff - index), above every value's (no order key of a number reaches 0xffffffff), so
// the first NaN's key wins and the host reports it. *best must be 0 before the launch (the
// launcher zeroes it on the stream); every warp adds its max by atomicMax, whose result does not
// depend on the order.
extern "C" __global__ void argmax_row_f32(unsigned long long* best, const float* x, long n) {
    wait_for_producers();
    unsigned long long key = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float v = x[i];
        if (isnan(v)) {
            const unsigned long long k = (0xffffffffull << 32) | (0xffffffffu - (unsigned int)i);
            key = k > key ? k : key;
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
