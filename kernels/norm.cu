// RMS norms (src/ops/norm.rs is the reference). One block per group of channels.
#include "common.cuh"
#include "vec.cuh"

// float4s a thread keeps in registers between the two passes of the vector path.
#define NORM_VEC_MAX 4

__device__ __forceinline__ float norm_weight(const float* w, long g, int group, int c, int w_len, int unit_offset) {
    const float wi = w_len == group ? w[c] : w[(g * group + c) % w_len];
    return unit_offset ? 1.0f + wi : wi;
}

// Grouped RMS norm over `groups` groups of `group` channels; weight has `w_len` entries, either
// one per channel of a row or one per group channel (shared by the groups). When the group is
// whole float4s that fit the block's registers, x is read once with 16-byte loads and kept for
// the second pass (a decode row of the 4-stream residual is 10240 channels: one block, so its
// latency is the kernel's time).
extern "C" __global__ void __launch_bounds__(1024) rms_norm_reference_f32(float* y, const float* x, const float* w, long groups, int group,
                                                  int w_len, int unit_offset, float eps) {
    wait_for_producers();
    const bool vec = group % 4 == 0 && aligned16(x) && aligned16(y) && group / 4 <= NORM_VEC_MAX * (int)blockDim.x;
    for (long g = blockIdx.x; g < groups; g += gridDim.x) {
        const float* xs = x + g * group;
        if (vec) {
            const float4* x4 = reinterpret_cast<const float4*>(xs);
            float4* y4 = reinterpret_cast<float4*>(y + g * group);
            const int quads = group / 4;
            float4 v[NORM_VEC_MAX];
            float ss = 0.0f;
#pragma unroll
            for (int j = 0; j < NORM_VEC_MAX; j++) {
                const int i = threadIdx.x + j * blockDim.x;
                if (i < quads) {
                    v[j] = x4[i];
                    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
                }
            }
            const float inv = rsqrtf(block_sum(ss) / group + eps);
#pragma unroll
            for (int j = 0; j < NORM_VEC_MAX; j++) {
                const int i = threadIdx.x + j * blockDim.x;
                if (i < quads) {
                    const int c = 4 * i;
                    float4 o;
                    o.x = v[j].x * inv * norm_weight(w, g, group, c, w_len, unit_offset);
                    o.y = v[j].y * inv * norm_weight(w, g, group, c + 1, w_len, unit_offset);
                    o.z = v[j].z * inv * norm_weight(w, g, group, c + 2, w_len, unit_offset);
                    o.w = v[j].w * inv * norm_weight(w, g, group, c + 3, w_len, unit_offset);
                    y4[i] = o;
                }
            }
        } else {
            float ss = 0.0f;
            for (int c = threadIdx.x; c < group; c += blockDim.x) ss += xs[c] * xs[c];
            const float inv = rsqrtf(block_sum(ss) / group + eps);
            for (int c = threadIdx.x; c < group; c += blockDim.x)
                y[g * group + c] = xs[c] * inv * norm_weight(w, g, group, c, w_len, unit_offset);
        }
    }
}
