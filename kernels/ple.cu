// The PLE block's tail (`ops::ple::mix`, Op::PleMix, fusion `ple_mix`) in one kernel:
//   key = rms_norm(key_proj), query = rms_norm(h)            groups of hid channels, scale 1 + w
//   gv  = sigmoid(ssqrt(<key_s, query_s> / sqrt(hid))) * value                    per stream s
//   out = h + (gv + silu(causal_conv(rms_norm(gv))))      kernel taps dilation apart, its window
// key_proj, h, out [rows, streams*hid]; value [rows, hid]; each norm weight [streams*hid] or
// [hid] (its length: nk_len, nq_len, nc_len); conv_w [streams*hid, kernel]; window [(kernel-1)*dilation, streams*hid], the
// conv's inputs of earlier rows, oldest first (the unfused causal_conv's layout).
#include "common.cuh"

// Channels a thread holds in registers: its c = threadIdx.x + i*blockDim.x for i < PLE_MIX_SLOTS
// (the loops over i are unrolled, so the arrays are indexed by constants only). A wider stream's
// further channels are read again from memory in each pass (the `tail` loops).
#define PLE_MIX_SLOTS 8

// The scale of norm weight w for channel c of stream s: 1 + w, w per channel of every stream
// (w_len = streams*hid) or shared by the streams (w_len = hid), as rms_norm_reference_f32.
__device__ __forceinline__ float ple_scale(const float* w, long w_len, long s, long c, long hid) {
    return 1.0f + w[w_len == hid ? c : s * hid + c];
}

// Where stream s's entries of a norm weight of w_len values start.
__device__ __forceinline__ long ple_norm_start(long w_len, long s, long hid) { return w_len == hid ? 0 : s * hid; }

// As the reference: 1 / sqrt(mean(x²) + eps), the mean of the block's sum of squares.
__device__ __forceinline__ float ple_inv_rms(float sum_sq, long hid, float eps) {
    return 1.0f / sqrtf(block_sum(sum_sq) / (float)hid + eps);
}

// Channel c's term of <key, query>: each normed value formed as the reference's norm forms it.
__device__ __forceinline__ float ple_key_query(float xk, float xh, float inv_k, float inv_q, const float* norm_key,
                                               long nk_len, const float* norm_query, long nq_len, long s, long c,
                                               long hid) {
    const float k = xk * inv_k * ple_scale(norm_key, nk_len, s, c, hid);
    const float q = xh * inv_q * ple_scale(norm_query, nq_len, s, c, hid);
    return k * q;
}

// Channel ch's conv input xn (the normed gv) through its taps, then its window past this row;
// returns silu of the sum. Σ_j w[j] · ext[past + t - (kernel-1-j)·dilation] in tap order (as
// causal_conv_reference_f32): the window holds ext rows [t, t + past), so tap j < kernel - 1 is
// window row past - (kernel-1-j)·dilation, the last one xn. The shift moves each row up one
// (ascending, so row p + 1 is read before it is overwritten), xn in last.
__device__ __forceinline__ float ple_conv(float* window, const float* conv_w, float xn, long ch, long width, long past,
                                          int kernel, int dilation) {
    float acc = 0.0f;
    for (int j = 0; j < kernel; j++) {
        const float v = j < kernel - 1 ? window[(past - (long)(kernel - 1 - j) * dilation) * width + ch] : xn;
        acc += conv_w[ch * kernel + j] * v;
    }
    for (long p = 0; p < past; p++) window[p * width + ch] = p + 1 < past ? window[(p + 1) * width + ch] : xn;
    return silu_f32(acc);
}

// One block per stream, over the step's rows in order: the conv of row t reads the normed gv of
// rows before it, which a thread finds in its own channels' window columns (shifted one row
// after each row). Four block sums a row: the two norms, the dot, gv's norm. A thread reads and
// rewrites only its own channels' window columns, so the window needs no barrier.
extern "C" __global__ void __launch_bounds__(1024)
    ple_mix_f32(float* out, float* window, const float* key_proj, const float* h, const float* value,
                const float* norm_key, const float* norm_query, const float* norm_conv, const float* conv_w,
                long rows, long streams, long hid, long nk_len, long nq_len, long nc_len, int kernel, int dilation,
                float eps) {
    const long width = streams * hid;
    const long past = (long)(kernel - 1) * dilation;
    const long s0 = blockIdx.x;
    // This block's first stream's weights (the norm weights it reads, its conv taps) into L2.
    prefetch_weights(norm_key + ple_norm_start(nk_len, s0, hid), hid * sizeof(float));
    prefetch_weights(norm_query + ple_norm_start(nq_len, s0, hid), hid * sizeof(float));
    prefetch_weights(norm_conv + ple_norm_start(nc_len, s0, hid), hid * sizeof(float));
    prefetch_weights(conv_w + s0 * hid * kernel, hid * kernel * sizeof(float));
    wait_for_producers();
    const long held = (long)PLE_MIX_SLOTS * blockDim.x;  // channels below this are in registers
    for (long s = s0; s < streams; s += gridDim.x) {
        for (long t = 0; t < rows; t++) {
            const long base = t * width + s * hid;
            const float* vt = value + t * hid;
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
            for (long c = held + threadIdx.x; c < hid; c += blockDim.x) {  // tail
                ssk += key_proj[base + c] * key_proj[base + c];
                ssh += h[base + c] * h[base + c];
            }
            const float inv_k = ple_inv_rms(ssk, hid, eps);
            const float inv_q = ple_inv_rms(ssh, hid, eps);
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                if (c < hid) dot += ple_key_query(xk[i], xh[i], inv_k, inv_q, norm_key, nk_len, norm_query, nq_len, s, c, hid);
            }
            for (long c = held + threadIdx.x; c < hid; c += blockDim.x)  // tail
                dot += ple_key_query(key_proj[base + c], h[base + c], inv_k, inv_q, norm_key, nk_len, norm_query, nq_len,
                                     s, c, hid);
            // As ple_gate_reference_f32 (the reference divides by sqrt(hid)).
            const float g = block_sum(dot) / sqrtf((float)hid);
            // g itself when it is zero (sign(0) = 0) or NaN (as the reference's signum).
            const float root = sqrtf(fmaxf(fabsf(g), 1e-6f));
            const float gain = sigmoid_f32(g > 0.0f ? root : (g < 0.0f ? -root : g));
            float ssg = 0.0f;
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                gv[i] = c < hid ? gain * vt[c] : 0.0f;
                ssg += gv[i] * gv[i];
            }
            for (long c = held + threadIdx.x; c < hid; c += blockDim.x) ssg += (gain * vt[c]) * (gain * vt[c]);  // tail
            const float inv_g = ple_inv_rms(ssg, hid, eps);
            // h + (gv + conv), the conv over gv's norm (the window's column: the channel s*hid + c).
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                if (c < hid) {
                    const float xn = gv[i] * inv_g * ple_scale(norm_conv, nc_len, s, c, hid);
                    const float y = ple_conv(window, conv_w, xn, s * hid + c, width, past, kernel, dilation);
                    out[base + c] = xh[i] + (gv[i] + y);
                }
            }
            for (long c = held + threadIdx.x; c < hid; c += blockDim.x) {  // tail
                const float gvc = gain * vt[c];
                const float xn = gvc * inv_g * ple_scale(norm_conv, nc_len, s, c, hid);
                const float y = ple_conv(window, conv_w, xn, s * hid + c, width, past, kernel, dilation);
                out[base + c] = h[base + c] + (gvc + y);
            }
        }
    }
}
