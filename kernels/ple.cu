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
#define PLE_MIX_SLOTS 10

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

// Channel c's term of <key, query>: each normed value formed as the reference's norm forms it
// (scales 1 + wk, 1 + wq: the channel's norm weights).
__device__ __forceinline__ float ple_key_query_w(float xk, float xh, float inv_k, float inv_q, float wk, float wq) {
    const float k = xk * inv_k * (1.0f + wk);
    const float q = xh * inv_q * (1.0f + wq);
    return k * q;
}

__device__ __forceinline__ float ple_key_query(float xk, float xh, float inv_k, float inv_q, const float* norm_key,
                                               long nk_len, const float* norm_query, long nq_len, long s, long c,
                                               long hid) {
    return ple_key_query_w(xk, xh, inv_k, inv_q, norm_key[ple_norm_start(nk_len, s, hid) + c],
                           norm_query[ple_norm_start(nq_len, s, hid) + c]);
}

// Threads a block has at most (the launch bounds; launch::ple's MAX_THREADS), and the channels
// of a stream a block keeps in shared memory: those a thread holds in registers.
#define PLE_MIX_THREADS 256
#define PLE_MIX_HELD (PLE_MIX_SLOTS * PLE_MIX_THREADS)

// This thread's channels c = threadIdx.x + i*blockDim (< hid, i < PLE_MIX_SLOTS) of stream s's
// key and query norm weights into shared memory, nk[c] and nq[c] (cp.async: issued, not waited
// for; weights only, so the first stream's before the wait). Each thread reads back only its own.
__device__ __forceinline__ void ple_prefetch_norms(float* nk, float* nq, const float* norm_key, long nk_len,
                                                   const float* norm_query, long nq_len, long s, long hid) {
    const float* wk = norm_key + ple_norm_start(nk_len, s, hid);
    const float* wq = norm_query + ple_norm_start(nq_len, s, hid);
#pragma unroll
    for (int i = 0; i < PLE_MIX_SLOTS; i++) {
        const long c = threadIdx.x + (long)i * blockDim.x;
        if (c < hid) {
            cp_async4(nk + c, wk + c);
            cp_async4(nq + c, wq + c);
        }
    }
    cp_async_commit();
}

// The longest window (past rows) kept in registers (PleConvIn); a longer one is read and shifted
// in memory one row at a time (ple_conv_in_memory).
#define PLE_MAX_PAST 12

// Channel ch's conv input xn (the normed gv) through its taps, then its window past this row;
// returns silu of the sum. Σ_j w[j] · ext[past + t - (kernel-1-j)·dilation] in tap order (as
// causal_conv_reference_f32): the window holds ext rows [t, t + past), so tap j < kernel - 1 is
// window row past - (kernel-1-j)·dilation, the last one xn. The window is then shifted up one
// row, xn in last. The column is loaded whole before any use (one wait for memory, not one a
// row), and each row is visited in ascending order, which is the taps' order.
__device__ __forceinline__ float ple_conv_in_memory(float* window, const float* conv_w, float xn, long ch, long width,
                                                   long past, int kernel, int dilation) {
    float acc = 0.0f;
    for (int j = 0; j < kernel; j++) {
        const float v = j < kernel - 1 ? window[(past - (long)(kernel - 1 - j) * dilation) * width + ch] : xn;
        acc += conv_w[ch * kernel + j] * v;
    }
    for (long p = 0; p < past; p++) window[p * width + ch] = p + 1 < past ? window[(p + 1) * width + ch] : xn;
    return silu_f32(acc);
}

// A window of at most PLE_MAX_PAST rows: channel ch's column and the taps of its rows and of xn,
// loaded into registers ahead of xn (ple_conv_load, when `load`), then the sums (ple_conv_held).
struct PleConvIn {
    float col[PLE_MAX_PAST], tap[PLE_MAX_PAST], last;
};

// Row p's tap, j = kernel - 1 - (past - p) / dilation where (past - p) is a multiple of the
// dilation and j >= 0, else -1. The quotient of two small ints (past <= PLE_MAX_PAST here) taken
// through a float reciprocal (rd = 1 / dilation) and checked back exactly: a division, 64-bit
// as it was, is a call of some hundred instructions, and the column's loads were issued one
// division apart.
__device__ __forceinline__ int ple_tap_of(int p, long past, int kernel, int dilation, float rd) {
    const int back = (int)past - p;
    const int q = __float2int_rn((float)back * rd);
    return p < past && q * dilation == back && q <= kernel - 1 ? kernel - 1 - q : -1;
}

__device__ __forceinline__ void ple_conv_load(PleConvIn& in, const float* window, const float* conv_w, long ch,
                                              long width, long past, int kernel, int dilation, bool load) {
    const float rd = 1.0f / (float)dilation;
#pragma unroll
    for (int p = 0; p < PLE_MAX_PAST; p++) {
        const int j = ple_tap_of(p, past, kernel, dilation, rd);
        in.col[p] = load && p < past ? window[p * width + ch] : 0.0f;
        in.tap[p] = load && j >= 0 ? conv_w[ch * kernel + j] : 0.0f;
    }
    in.last = load ? conv_w[ch * kernel + kernel - 1] : 0.0f;
}

__device__ __forceinline__ float ple_conv_held(float* window, const PleConvIn& in, float xn, long ch, long width,
                                               long past, int kernel, int dilation) {
    const float rd = 1.0f / (float)dilation;
    float acc = 0.0f;
#pragma unroll
    for (int p = 0; p < PLE_MAX_PAST; p++)
        if (ple_tap_of(p, past, kernel, dilation, rd) >= 0) acc += in.tap[p] * in.col[p];
    acc += in.last * xn;
#pragma unroll
    for (int p = 0; p < PLE_MAX_PAST; p++)
        if (p < past) window[p * width + ch] = p + 1 < past ? in.col[p + 1 < PLE_MAX_PAST ? p + 1 : p] : xn;
    return silu_f32(acc);
}

// A stream's rows need its whole width for their four block sums (the two norms, the dot, gv's
// norm), while the conv and the output are per channel: so each stream has `chunks` blocks,
// each forming the sums over the whole stream (the values are in L2) and then convolving and
// writing only its own blockDim channels, one a thread. The conv of row t reads the normed gv
// of rows before it, which the thread finds in its channel's window column (shifted one row after
// each row): a thread reads and rewrites only its own channel's column, so the window needs no
// barrier. (One block per stream, each thread convolving ten channels, needs ~250 registers a
// thread, so it starts only once the kernel ahead has drained.) At most 128 registers a thread
// (two blocks a multiprocessor), so that a block finds room sooner.
// Round trips to memory after the wait: the dot product's norm weights are copied into shared
// memory before it (its loop, a branch a channel, waited for each channel's two weights in
// turn: up to ten round trips), and the own channel's h is read with the conv's inputs (read
// after the window's stores, it waited for them: one more). The same arithmetic in the same
// order.
extern "C" __global__ void __launch_bounds__(PLE_MIX_THREADS, 2)
    ple_mix_f32(float* out, float* window, const float* key_proj, const float* h, const float* value,
                const float* norm_key, const float* norm_query, const float* norm_conv, const float* conv_w,
                long rows, long streams, long hid, long nk_len, long nq_len, long nc_len, int kernel, int dilation,
                float eps) {
    __shared__ float nk_s[PLE_MIX_HELD], nq_s[PLE_MIX_HELD];
    const long width = streams * hid;
    const long past = (long)(kernel - 1) * dilation;
    const long chunks = (hid + blockDim.x - 1) / blockDim.x;
    const long s0 = blockIdx.x / chunks, c0 = (blockIdx.x % chunks) * blockDim.x;
    const long span = min((long)blockDim.x, hid - c0);
    ple_prefetch_norms(nk_s, nq_s, norm_key, nk_len, norm_query, nq_len, s0, hid);
    prefetch_weights(norm_conv + ple_norm_start(nc_len, s0, hid) + c0, span * sizeof(float));
    prefetch_weights(conv_w + (s0 * hid + c0) * kernel, span * kernel * sizeof(float));
    wait_for_producers();
    const long held = (long)PLE_MIX_SLOTS * blockDim.x;  // channels below this are in registers
    for (long b = blockIdx.x; b < streams * chunks; b += gridDim.x) {
        const long s = b / chunks, own = (b % chunks) * blockDim.x + threadIdx.x;  // this thread's channel
        if (b != blockIdx.x) ple_prefetch_norms(nk_s, nq_s, norm_key, nk_len, norm_query, nq_len, s, hid);
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
            cp_async_wait_all();
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < PLE_MIX_SLOTS; i++) {
                const long c = threadIdx.x + (long)i * blockDim.x;
                if (c < hid) dot += ple_key_query_w(xk[i], xh[i], inv_k, inv_q, nk_s[c], nq_s[c]);
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
            if (own < hid) {
                const float hv = h[base + own];  // read before the window's stores, with the conv's inputs
                const float gvc = gain * vt[own];
                const float xn = gvc * inv_g * ple_scale(norm_conv, nc_len, s, own, hid);
                PleConvIn conv;
                ple_conv_load(conv, window, conv_w, s * hid + own, width, past, kernel, dilation, past <= PLE_MAX_PAST);
                const float y = past <= PLE_MAX_PAST
                                    ? ple_conv_held(window, conv, xn, s * hid + own, width, past, kernel, dilation)
                                    : ple_conv_in_memory(window, conv_w, xn, s * hid + own, width, past, kernel,
                                                         dilation);
                out[base + own] = hv + (gvc + y);
            }
        }
    }
}
