// RMS norms (src/ops/norm.rs is the reference). One block per group of channels.
#include "common.cuh"

// Grouped RMS norm over `groups` groups of `group` channels; weight has `w_len` entries, either
// one per channel of a row or one per group channel (shared by the groups).
extern "C" __global__ void rms_norm_reference_f32(float* y, const float* x, const float* w, long groups, int group,
                                                  int w_len, int unit_offset, float eps) {
    for (long g = blockIdx.x; g < groups; g += gridDim.x) {
        const float* xs = x + g * group;
        float ss = 0.0f;
        for (int c = threadIdx.x; c < group; c += blockDim.x) ss += xs[c] * xs[c];
        const float inv = rsqrtf(block_sum(ss) / group + eps);
        for (int c = threadIdx.x; c < group; c += blockDim.x) {
            const float wi = w_len == group ? w[c] : w[(g * group + c) % w_len];
            y[g * group + c] = xs[c] * inv * (unit_offset ? 1.0f + wi : wi);
        }
    }
}
