// The PLE block's tail (`ops::ple::mix`, Op::PleMix, fusion `ple_mix`) in one kernel:
//   key = rms_norm(key_proj), query = rms_norm(h)            groups of hid channels, scale 1 + w
//   gv  = sigmoid(ssqrt(<key_s, query_s> / sqrt(hid))) * value                    per stream s
//   out = h + (gv + silu(causal_conv(rms_norm(gv))))      kernel taps dilation apart, its window
// key_proj, h, out [rows, streams*hid]; value [rows, hid]; the norm weights [streams*hid] or
// [hid] (norm_len); conv_w [streams*hid, kernel]; window [(kernel-1)*dilation, streams*hid], the
// conv's inputs of earlier rows, oldest first (the unfused causal_conv's layout).
#include "common.cuh"

// Channels a thread holds in registers (its c = threadIdx.x + i*blockDim.x, i < PLE_MIX_SLOTS;
// the loops over i are unrolled, so the arrays are indexed by constants only): a stream of up to
// PLE_MIX_SLOTS * blockDim.x channels (src/exec/cuda/launch/ple.rs checks).
#define PLE_MIX_SLOTS 8

// The scale of norm weight w for channel c of stream s: 1 + w, w per channel of every stream
// (norm_len = streams*hid) or shared by the streams (norm_len = hid), as rms_norm_reference_f32.
__device__ __forceinline__ float ple_scale(const float* w, long s, long c, long hid, long norm_len) {
    return 1.0f + w[norm_len == hid ? c : s * hid + c];
}

// As the reference: x * (1 / sqrt(mean(x²) + eps)), the mean of the block's sum of squares.
__device__ __forceinline__ float ple_inv_rms(float sum_sq, long hid, float eps) {
    return 1.0f / sqrtf(block_sum(sum_sq) / (float)hid + eps);
}

// One block per stream, over the step's rows in order: the conv of row t reads the normed gv of
// rows before it, which a thread finds in its own channels' window (shifted one row after each
// row). Each thread holds its channels' key_proj, h and gv for the row; four block sums a row
// (the two norms, the dot, gv's norm). A thread reads and rewrites only its own channels' window
// columns, so the window needs no barrier.
extern "C" __global__ void __launch_bounds__(1024)
    ple_mix_f32(float* out, float* window, const float* key_proj, const float* h, const float* value,
                const float* norm_key, const float* norm_query, const float* norm_conv, const float* conv_w,
                long rows, long streams, long hid, long norm_len, int kernel, int dilation, float eps) {
    const long width = streams * hid;
    const long past = (long)(kernel - 1) * dilation;
    const long s0 = blockIdx.x;
    const long w0 = norm_len == hid ? 0 : s0 * hid;
    // This block's first stream's weights (the norm weights it reads, its conv taps) into L2.
    prefetch_weights(norm_key + w0, hid * sizeof(float));
    prefetch_weights(norm_query + w0, hid * sizeof(float));
    prefetch_weights(norm_conv + w0, hid * sizeof(float));
    prefetch_weights(conv_w + s0 * hid * kernel, hid * kernel * sizeof(float));
    wait_for_producers();
    for (long s = s0; s < streams; s += gridDim.x) {
        for (long t = 0; t < rows; t++) {
            const long base = t * width + s * hid;
            float xk[PLE_MIX_SLOTS], xh[PLE_MIX_SLOTS], gv[PLE_MIX_SLOTS];
            float ssk = 0.0f, ssh = 0.0f;
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                xk[i] = c < hid ? key_proj[base + c] : 0.0f;
                xh[i] = c < hid ? h[base + c] : 0.0f;
                ssk += xk[i] * xk[i];
                ssh += xh[i] * xh[i];
            }
            const float inv_k = ple_inv_rms(ssk, hid, eps);
            const float inv_q = ple_inv_rms(ssh, hid, eps);
            // <key, query> over the normed values, each formed as the reference's norm forms it.
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                if (c < hid) {
                    const float k = xk[i] * inv_k * ple_scale(norm_key, s, c, hid, norm_len);
                    const float q = xh[i] * inv_q * ple_scale(norm_query, s, c, hid, norm_len);
                    dot += k * q;
                }
            }
            // As ple_gate_reference_f32: g / sqrt(hid) in the reference is a division.
            const float g = block_sum(dot) / sqrtf((float)hid);
            // g itself when it is zero (sign(0) = 0) or NaN (as the reference's signum).
            const float root = sqrtf(fmaxf(fabsf(g), 1e-6f));
            const float gain = sigmoid_f32(g > 0.0f ? root : (g < 0.0f ? -root : g));
            float ssg = 0.0f;
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                gv[i] = c < hid ? gain * value[t * hid + c] : 0.0f;
                ssg += gv[i] * gv[i];
            }
            const float inv_g = ple_inv_rms(ssg, hid, eps);
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                if (c < hid) {
                    const long ch = s * hid + c;  // the channel of the row, the window's column
                    const float xn = gv[i] * inv_g * ple_scale(norm_conv, s, c, hid, norm_len);
                    // Σ_j w[j] · ext[past + t - (kernel-1-j)·dilation] in tap order (as
                    // causal_conv_reference_f32): the window holds ext rows [t, t + past), so
                    // tap j < kernel - 1 is window row past - (kernel-1-j)·dilation, the last xn.
                    float acc = 0.0f;
                    for (int j = 0; j < kernel; j++) {
                        const float v = j < kernel - 1 ? window[(past - (long)(kernel - 1 - j) * dilation) * width + ch] : xn;
                        acc += conv_w[ch * kernel + j] * v;
                    }
                    // The window past this row: each row moves up one (ascending, so row p + 1
                    // is read before it is overwritten), xn comes in last.
                    for (long p = 0; p < past; p++) window[p * width + ch] = p + 1 < past ? window[(p + 1) * width + ch] : xn;
                    out[base + c] = xh[i] + (gv[i] + silu_f32(acc));
                }
            }
        }
    }
}
