// Layout and small fused ops around the trunk (the references: src/ops/elementwise.rs,
// src/ops/hyper.rs, src/ops/linear.rs `swiglu`, src/ops/norm.rs `gated_rms_norm`, src/ops/ple.rs
// `gate`, src/ops/attention.rs `split_q_gate`). Activations are row-major f32 [rows, width];
// weights f32 or bf16 bits. Every index is a `long`; every kernel strides over its grid.
#include "common.cuh"
#include "vec.cuh"

// ---------------------------------------------------------------------------------------------
// Pure layout.

// [rows, h] -> [rows, streams*h]: every stream a copy of the row.
extern "C" __global__ void repeat_streams_reference_f32(float* y, const float* x, long h, long streams, long n) {
    wait_for_producers();
    const long width = h * streams;
    GRID_STRIDE(i, n) {
        const long t = i / width, c = (i % width) % h;
        y[i] = x[t * h + c];
    }
}

// Columns [start, start+len) of x [rows, width]; n = rows*len.
extern "C" __global__ void slice_reference_f32(float* y, const float* x, long width, long start, long len, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) {
        const long t = i / len, c = i % len;
        y[i] = x[t * width + start + c];
    }
}

// gated_stream_mean (`Op::GatedStreamMean`): y[t, c] = Σ_s sigmoid(up[t, s·h + c]) · hn[t, s·h + c]
// in stream order, divided by the stream count: sigmoid_reference_f32, mul_reference_f32 and
// stream_mean_reference_f32's expressions in one pass (the gates are never stored).
extern "C" __global__ void gated_stream_mean_f32(float* y, const float* up, const float* hn, long h, long streams,
                                                  long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) {
        const long t = i / h, c = i % h;
        const long base = t * h * streams + c;
        float sum = 0.0f;
        for (long s = 0; s < streams; s++) sum += sigmoid_f32(up[base + s * h]) * hn[base + s * h];
        y[i] = sum / (float)streams;
    }
}

// [rows, streams*h] -> [rows, h]: the sum over streams (in stream order) divided by their count.
extern "C" __global__ void stream_mean_reference_f32(float* y, const float* x, long h, long streams, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) {
        const long t = i / h, c = i % h;
        const float* row = x + t * h * streams;
        float sum = 0.0f;
        for (long s = 0; s < streams; s++) sum += row[s * h + c];
        y[i] = sum / (float)streams;
    }
}

// out = h, with stream s of each row gaining inj[row, s] * y[row]: rows along the grid's y (a
// row's width streams*hid < 2^31, checked by the launcher, so no 64-bit division an element),
// 4 channels a thread with 16-byte loads where hid % 4 == 0 and the buffers allow. The product
// is rounded before the add (no FMA), as the reference.
extern "C" __global__ void hc_write_reference_f32(float* out, const float* h, const float* inj, const float* y, long hid,
                                                  long streams, long rows) {
    wait_for_producers();
    const int hid32 = (int)hid, width = (int)(hid * streams);
    const bool vec = (hid32 & 3) == 0 && aligned16(out) && aligned16(h) && aligned16(y);
    const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    for (long t = blockIdx.y; t < rows; t += gridDim.y) {
        const float* ht = h + t * width;
        const float* yt = y + t * hid;
        const float* gt = inj + t * streams;
        float* ot = out + t * width;
        if (vec) {
            for (int q = first; q < width / 4; q += stride) {
                const int ch = 4 * q, s = ch / hid32, c = ch - s * hid32;  // 4 channels of stream s
                const float g = gt[s];
                const float4 hv = reinterpret_cast<const float4*>(ht)[q];
                const float4 yv = *reinterpret_cast<const float4*>(yt + c);
                float4 o;
                o.x = hv.x + __fmul_rn(g, yv.x);
                o.y = hv.y + __fmul_rn(g, yv.y);
                o.z = hv.z + __fmul_rn(g, yv.z);
                o.w = hv.w + __fmul_rn(g, yv.w);
                reinterpret_cast<float4*>(ot)[q] = o;
            }
        } else {
            for (int ch = first; ch < width; ch += stride) {
                const int s = ch / hid32, c = ch - s * hid32;
                ot[ch] = ht[ch] + __fmul_rn(gt[s], yt[c]);
            }
        }
    }
}

// qg [rows, heads * 2 * hd] (per head: hd query channels, then hd gate channels) ->
// q, gate [rows, heads * hd]; n = rows*heads*hd.
extern "C" __global__ void split_q_gate_reference_f32(float* q, float* gate, const float* qg, long hd, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) {
        const long head = i / hd, c = i % hd;
        const float* src = qg + head * 2 * hd;
        q[i] = src[c];
        gate[i] = src[hd + c];
    }
}

// ---------------------------------------------------------------------------------------------
// Hyper-connections (src/ops/hyper.rs).

// hc_mix: for each row of hn [rows, streams*hid], with down [rank, streams*hid] and
// up [streams*hid, rank], in two grid-wide kernels so that a single token (decode) still spreads
// the ~13 MB of bf16 weights over every multiprocessor:
//   hc_mix_act:  act[t, r] = silu(hn[t]·down[r] / streams)
//                (`_warp`: a warp per (t, r), for many rows; `_block`: a block per (t, r), for a few
//                rows, so that the rank x width matrix has enough loads in flight)
//   hc_mix_gate: y[t, c] = sum_s sigmoid(act[t]·up[s*hid + c]) * hn[t, s*hid + c] / streams
//                (a warp per (t, c); its lanes split over the streams when 32 % streams == 0)
template <typename W>
__device__ __forceinline__ void hc_mix_act_warp(float* act, const float* hn, const W* down, long rows, long streams,
                                                long width, long rank) {
    const int lane = threadIdx.x & 31;
    const long warps = blockDim.x >> 5;
    for (long o = blockIdx.x * warps + (threadIdx.x >> 5); o < rows * rank; o += (long)gridDim.x * warps) {
        const long t = o / rank, r = o % rank;
        const float d = warp_sum(lane_dot(hn + t * width, down + r * width, width, lane));
        if (lane == 0) act[o] = silu_f32(d / (float)streams);
    }
}

template <typename W>
__device__ __forceinline__ void hc_mix_act_block(float* act, const float* hn, const W* down, long rows, long streams,
                                                 long width, long rank) {
    for (long o = blockIdx.x; o < rows * rank; o += gridDim.x) {
        const long t = o / rank, r = o % rank;
        const float d = block_dot(hn + t * width, down + r * width, width);
        if (threadIdx.x == 0) act[o] = silu_f32(d / (float)streams);
    }
}

// Chunks of an `up` row a lane loads at once in hc_mix_gate's split path (rank 320 in bf16 takes
// 5 a lane: all of them in one round trip).
#define HC_GATE_CHUNKS 6
// The gate kernels' blocks (launch::warp_grid: 8 warps) and how many of them a multiprocessor
// should hold at once: 3 x 8 x 132 warps cover decode's 2560 channels in one wave.
#define HC_GATE_BOUNDS __launch_bounds__(256, 3)

// `hn_at(t, ch)`: the normalised value of channel ch (stream-major) of row t.
template <typename W, typename Hn>
__device__ __forceinline__ void hc_mix_gate_with(float* y, Hn hn_at, const float* act, const W* up, long rows,
                                                 long streams, long hid, long rank) {
    const int lane = threadIdx.x & 31;
    const long warps = blockDim.x >> 5;
    const bool split = streams <= 32 && 32 % streams == 0;
    for (long o = blockIdx.x * warps + (threadIdx.x >> 5); o < rows * hid; o += (long)gridDim.x * warps) {
        const long t = o / hid, c = o % hid;
        float sum = 0.0f;
        if (split) {
            // 32 / streams lanes per stream (a power of two): reduce within each lane group, then
            // add the groups' terms.
            const int per = 32 / (int)streams;
            const long s = lane / per, ch = s * hid + c;
            float d = strided_dot_short<W, HC_GATE_CHUNKS>(act + t * rank, up + ch * rank, rank, lane % per, per);
            for (int off = per / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
            float term = sigmoid_f32(d) * hn_at(t, ch);
            for (int off = per; off < 32; off <<= 1) term += __shfl_xor_sync(0xffffffffu, term, off);
            sum = term;
        } else {
            for (long s = 0; s < streams; s++) {
                const long ch = s * hid + c;
                const float gate = sigmoid_f32(warp_sum(lane_dot(act + t * rank, up + ch * rank, rank, lane)));
                sum += gate * hn_at(t, ch);
            }
        }
        if (lane == 0) y[o] = sum / (float)streams;
    }
}

template <typename W>
__device__ __forceinline__ void hc_mix_gate(float* y, const float* hn, const float* act, const W* up, long rows,
                                            long streams, long hid, long rank) {
    const long width = streams * hid;
    hc_mix_gate_with<W>(y, [&](long t, long ch) { return hn[t * width + ch]; }, act, up, rows, streams, hid, rank);
}

// hc_read (`ops::hyper::hc_read`): the hyper-connection read with its RMS norm folded in, in two
// kernels instead of four (norm, mix's two, inject). hn = h * inv_s * (1 + w) is never stored:
//   hc_read_act_r{R}: block (b, t) takes R of the R + C outputs o = b·R .. b·R + R - 1 of row t:
//                 o < R: act[t, o] = silu(hn·down[o] / C); o ≥ R: inj[t, o - R] = 2 sigmoid(hn·inject[o - R] / C);
//                 every block takes the C inverse RMS of row t on the way, block (0, t) stores them
//                 for the gate kernel;
//   hc_read_gate: as hc_mix_gate, forming hn from h, the stored inverse RMS and w.
// R (1, 2 or 4) trades blocks for loads in flight per thread and for the row of h read once
// per R outputs; `launch::layout::HcReadAct` picks it. `gains` is C, or 0 for a read without
// the injection (the exit's mixer, `Op::HcRead { inject: false }`): the outputs are then the R
// activations alone, and `inject` and `inj` are never touched (the launcher passes null).
#define HC_MAX_STREAMS 32
// Chunks of the row each thread of the fixed path holds: the block has chunks / this threads.
#define HC_ACT_CHUNKS 4
#define HC_ACT_MAX_THREADS 512

__device__ __forceinline__ float hc_norm_weight(const float* w, long ch, long hid, long w_len) {
    return 1.0f + (w_len == hid ? w[ch % hid] : w[ch % w_len]);
}

// A gate kernel's first step, before its wait: the up rows of the block's channels (its warps'
// channels, in each stream) into L2, a thread a stream.
template <typename W>
__device__ __forceinline__ void hc_read_gate_prefetch_rows(const W* up, long streams, long hid, long rank) {
    const long c0 = (long)blockIdx.x * (blockDim.x >> 5);
    if (threadIdx.x < streams && c0 < hid)
        prefetch_weights(up + (threadIdx.x * hid + c0) * rank,
                         min((long)(blockDim.x >> 5), hid - c0) * rank * (long)sizeof(W));
}

// Writes act[t, o] (o < R) or inj[t, o - R] from the dot product d over the normalised row.
__device__ __forceinline__ void hc_read_store(float* act, float* inj, long t, long o, long rank, long streams,
                                              float d) {
    if (o < rank)
        act[t * rank + o] = silu_f32(d / (float)streams);
    else
        inj[t * streams + (o - rank)] = 2.0f * sigmoid_f32(d / (float)streams);
}

__device__ __forceinline__ const void* hc_read_row(const void* down, const void* inject, long o, long rank,
                                                   long width, long elem) {
    return o < rank ? (const char*)down + o * width * elem : (const char*)inject + (o - rank) * width * elem;
}

// Whether the fixed path serves: C = 4 streams, 16-byte loads, every chunk of the row held by the
// block's threads (HC_ACT_CHUNKS each, the launcher's block size).
template <typename W>
__device__ __forceinline__ bool hc_read_act_fixed_fits(const float* ht, const float* w, const W* down,
                                                       const W* inject, long streams, long width, long w_len) {
    constexpr int N = WeightVec<W>::N;
    return streams == 4 && (width / 4) % N == 0 && (w_len == width || w_len == width / 4) &&
           width / N <= (long)blockDim.x * HC_ACT_CHUNKS && aligned16(ht) && aligned16(w) && aligned16(down) &&
           aligned16(inject);
}

// C streams known at compile time (the real model's 4), 16-byte loads. Thread x holds chunks
// x + k·blockDim.x (k < HC_ACT_CHUNKS) of the row: it loads the R weight rows' chunks first, all
// in flight at once, then forms h·(1 + w) and per stream s the sum of squares of h and the
// partials Σ h·(1 + w)·row; the block reduces once for all R rows, and d = Σ_s inv_s · partial_s
// (the reference rounds hn = h·inv·(1 + w) first: the same value up to rounding).
template <typename W, int C, int R>
__device__ __forceinline__ void hc_read_act_fixed(float* act, float* inj, float* inv_out, const float* ht,
                                                  const float* w, const W* down, const W* inject, long width,
                                                  long rank, long gains, long w_len, float eps) {
    constexpr int N = WeightVec<W>::N, K = HC_ACT_CHUNKS;
    __shared__ float part[R + 1][C][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const long t = blockIdx.y, o0 = (long)blockIdx.x * R, outs = rank + gains;
    const long hid = width / C, chunks = width / N, per = hid / N;
    uint4 raw[R][K];
#pragma unroll
    for (int r = 0; r < R; r++) {
        // A block past the last output re-reads the last row (it stores nothing).
        const W* row = (const W*)hc_read_row(down, inject, min(o0 + r, outs - 1), rank, width, sizeof(W));
#pragma unroll
        for (int k = 0; k < K; k++) {
            const long i = threadIdx.x + (long)k * blockDim.x;
            if (i < chunks) raw[r][k] = WeightVec<W>::load(row, i);
        }
    }
    float p[R][C], ss[C];
#pragma unroll
    for (int q = 0; q < C; q++) {
        ss[q] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) p[r][q] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        const long i = threadIdx.x + (long)k * blockDim.x;
        if (i < chunks) {
            float hv[N], nv[N], hw[N];
            act_chunk<N>(ht, i, hv);
            act_chunk<N>(w, w_len == width ? i : i % per, nv);
            float dss = 0.0f;
#pragma unroll
            for (int j = 0; j < N; j++) {
                hw[j] = hv[j] * (1.0f + nv[j]);
                dss += hv[j] * hv[j];
            }
            const int s = (int)(i / per);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wv[N], dp = 0.0f;
                WeightVec<W>::unpack(raw[r][k], wv);
#pragma unroll
                for (int j = 0; j < N; j++) dp += hw[j] * wv[j];
#pragma unroll
                for (int q = 0; q < C; q++)
                    if (q == s) p[r][q] += dp;
            }
#pragma unroll
            for (int q = 0; q < C; q++)
                if (q == s) ss[q] += dss;
        }
    }
#pragma unroll
    for (int q = 0; q < C; q++) {
        const float b = warp_sum(ss[q]);
        if (lane == 0) part[R][q][warp] = b;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float a = warp_sum(p[r][q]);
            if (lane == 0) part[r][q][warp] = a;
        }
    }
    __syncthreads();
    // Warp r finishes output o0 + r (the block has at least R warps).
    if (warp < R && o0 + warp < outs) {
        float d = 0.0f;
#pragma unroll
        for (int q = 0; q < C; q++) {
            const float sq = warp_sum(lane < warps ? part[R][q][lane] : 0.0f);
            float pq = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r == warp) pq = warp_sum(lane < warps ? part[r][q][lane] : 0.0f);
            const float inv = rsqrtf(sq / (float)hid + eps);
            d += inv * pq;
            if (o0 == 0 && warp == 0 && lane == 0) inv_out[t * C + q] = inv;
        }
        if (lane == 0) hc_read_store(act, inj, t, o0 + warp, rank, C, d);
    }
}

// Any stream count, any alignment: the inverse RMS first (a block sum per stream), then the dot
// for each of the block's R outputs.
template <typename W, int R>
__device__ __forceinline__ void hc_read_act_general(float* act, float* inj, float* inv_out, const float* ht,
                                                    const float* w, const W* down, const W* inject, long streams,
                                                    long width, long rank, long gains, long w_len, float eps) {
    __shared__ float inv_s[HC_MAX_STREAMS];
    const long t = blockIdx.y, o0 = (long)blockIdx.x * R, hid = width / streams;
    for (long s = 0; s < streams; s++) {
        float ss = 0.0f;
        for (long c = threadIdx.x; c < hid; c += blockDim.x) ss += ht[s * hid + c] * ht[s * hid + c];
        ss = block_sum(ss);
        if (threadIdx.x == 0) inv_s[s] = rsqrtf(ss / (float)hid + eps);
    }
    __syncthreads();
    if (o0 == 0 && threadIdx.x < streams) inv_out[t * streams + threadIdx.x] = inv_s[threadIdx.x];
    for (long o = o0; o < o0 + R && o < rank + gains; o++) {
        const W* row = (const W*)hc_read_row(down, inject, o, rank, width, sizeof(W));
        float acc = 0.0f;
        for (long ch = threadIdx.x; ch < width; ch += blockDim.x)
            acc += ht[ch] * inv_s[ch / hid] * hc_norm_weight(w, ch, hid, w_len) * WeightVec<W>::one(row, ch);
        const float d = block_sum(acc);
        if (threadIdx.x == 0) hc_read_store(act, inj, t, o, rank, streams, d);
    }
}

template <typename W, int R>
__device__ __forceinline__ void hc_read_act(float* act, float* inj, float* inv_out, const float* h, const float* w,
                                            const W* down, const W* inject, long streams, long width, long rank,
                                            long gains, long w_len, float eps) {
    const float* ht = h + (long)blockIdx.y * width;
    if (hc_read_act_fixed_fits<W>(ht, w, down, inject, streams, width, w_len))
        hc_read_act_fixed<W, 4, R>(act, inj, inv_out, ht, w, down, inject, width, rank, gains, w_len, eps);
    else
        hc_read_act_general<W, R>(act, inj, inv_out, ht, w, down, inject, streams, width, rank, gains, w_len, eps);
}

#define HC_READ_ACT_KERNEL(W, SUFFIX, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(HC_ACT_MAX_THREADS)                                          \
        hc_read_act_r##R##_##SUFFIX(float* act, float* inj, float* inv_out, const float* h, const float* w,   \
                                    const W* down, const W* inject, long streams, long width, long rank,      \
                                    long gains, long w_len, float eps) {                                      \
        const long o0 = (long)blockIdx.x * R;                                                                 \
        const long n = min((long)R, rank + gains - o0);                                                       \
        if (threadIdx.x < n)                                                                                  \
            prefetch_weights(hc_read_row(down, inject, o0 + threadIdx.x, rank, width, sizeof(W)),             \
                             width * (long)sizeof(W));                                                        \
        wait_for_producers();                                                                                 \
        hc_read_act<W, R>(act, inj, inv_out, h, w, down, inject, streams, width, rank, gains, w_len, eps);    \
    }

#define HC_READ_KERNELS(W, SUFFIX)                                                                            \
    HC_READ_ACT_KERNEL(W, SUFFIX, 1)                                                                          \
    HC_READ_ACT_KERNEL(W, SUFFIX, 2)                                                                          \
    HC_READ_ACT_KERNEL(W, SUFFIX, 4)                                                                          \
    extern "C" __global__ void HC_GATE_BOUNDS hc_read_gate_##SUFFIX(                                           \
        float* y, const float* h, const float* inv, const float* w, const float* act, const W* up, long rows,  \
        long streams, long hid, long rank, long w_len) {                                                      \
        hc_read_gate_prefetch_rows<W>(up, streams, hid, rank);                                               \
        wait_for_producers();                                                                                 \
        const long width = streams * hid;                                                                     \
        hc_mix_gate_with<W>(                                                                                  \
            y,                                                                                                \
            [&](long t, long ch) {                                                                            \
                return h[t * width + ch] * inv[t * streams + ch / hid] * hc_norm_weight(w, ch, hid, w_len);   \
            },                                                                                                \
            act, up, rows, streams, hid, rank);                                                               \
    }

HC_READ_KERNELS(float, f32)
HC_READ_KERNELS(bf16_t, bf16)

// hc_read by stream (`launch::layout::HcReadAct { by_stream: true, .. }`): the first kernel's
// blocks take R outputs over one stream's slice of the row instead of the whole row, so that a
// block reads hid values of h and of the norm weight (10 KB each at the real H 2560) instead of
// C·hid, and the activation traffic from L2 shrinks R·C-fold against the one-output kernel
// (which reads ~80 KB of activations and norm weight for each 20 KB weight row).
//   hc_read_act_s{R}: block (b, s, t) writes part[(t·(R_all + G) + o)·C + s] = Σ_c h·(1 + w)·row_o
//                     over stream s's channels for its outputs o = b·R .. (R_all = the rank,
//                     G = gains: C, or 0 without the injection);
//                     block (0, s, t) also ssq[t·C + s] = Σ_c h² over them;
//   hc_read_gate_s:   block (b, t) first forms the C inverse RMS and every output of row t,
//                     d = Σ_s inv_s · part_s in stream order as hc_read_act_fixed does
//                     (act = silu(d / C) into shared memory; block (0, t) stores inj = 2σ(d / C)),
//                     then hc_mix_gate's warps for its channels with act from shared memory.
#define HC_GATE_MAX_RANK 1024

// Rows t0 .. t0 + nt - 1 (nt ≤ NT) of h in one block: the block's weight chunks are loaded once
// for all of them. Each row's sums are those of a one-row block (the same chunks a thread, in
// the same order, reduced the same way): the same bits whatever NT.
template <typename W, int R, int NT>
__device__ __forceinline__ void hc_read_act_stream(float* part, float* ssq, const float* h, const float* w,
                                                   const W* down, const W* inject, long streams, long width,
                                                   long rank, long gains, long w_len, long t0, int nt) {
    constexpr int N = WeightVec<W>::N;
    __shared__ float red[R + 1][NT][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const long s = blockIdx.y, o0 = (long)blockIdx.x * R, outs = rank + gains;
    const long hid = width / streams;
    const float* hs = h + t0 * width + s * hid;  // row t0 + t at hs + t * width
    const float* ws = w + (w_len == width ? s * hid : 0);
    const W* rows[R];
    bool vec = hid % N == 0 && width % 4 == 0 && aligned16(hs) && aligned16(ws);
#pragma unroll
    for (int r = 0; r < R; r++) {
        // A block past the last output re-reads the last row (it stores nothing).
        rows[r] = (const W*)hc_read_row(down, inject, min(o0 + r, outs - 1), rank, width, sizeof(W)) + s * hid;
        vec = vec && aligned16(rows[r]);
    }
    float acc[R][NT], ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][t] = 0.0f;
    }
    if (vec) {
        for (long i = threadIdx.x; i < hid / N; i += blockDim.x) {
            uint4 raw[R];
#pragma unroll
            for (int r = 0; r < R; r++) raw[r] = WeightVec<W>::load(rows[r], i);
            float nv[N];
            act_chunk<N>(ws, i, nv);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    float hv[N];
                    act_chunk<N>(hs + t * width, i, hv);
#pragma unroll
                    for (int j = 0; j < N; j++) {
                        ss[t] += hv[j] * hv[j];
                        hv[j] *= 1.0f + nv[j];
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float wv[N];
                        WeightVec<W>::unpack(raw[r], wv);
#pragma unroll
                        for (int j = 0; j < N; j++) acc[r][t] += hv[j] * wv[j];
                    }
                }
            }
        }
    } else {
        for (long c = threadIdx.x; c < hid; c += blockDim.x) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float hv = hs[t * width + c];
                    ss[t] += hv * hv;
                    const float hw = hv * (1.0f + ws[c]);
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r][t] += hw * WeightVec<W>::one(rows[r], c);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < nt) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float v = warp_sum(acc[r][t]);
                if (lane == 0) red[r][t][warp] = v;
            }
            const float v = warp_sum(ss[t]);
            if (lane == 0) red[R][t][warp] = v;
        }
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < nt) {
                const long row = t0 + t;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float p = warp_sum(lane < warps ? red[r][t][lane] : 0.0f);
                    if (lane == 0 && o0 + r < outs) part[(row * outs + o0 + r) * streams + s] = p;
                }
                const float q = warp_sum(lane < warps ? red[R][t][lane] : 0.0f);
                if (lane == 0 && blockIdx.x == 0) ssq[row * streams + s] = q;
            }
        }
    }
}

// Partial sums a gate thread loads before the inverse RMS: outputs a thread (R + C over the
// block's threads: 324 over 256 at the real geometry) and streams at most.
#define HC_PRE_OUTS 2
#define HC_PRE_STREAMS 4

// The gate kernels' body, in two forms, each its own kernel. The early form (hc_read_gate_se),
// where each warp has one channel and its lanes split over the streams with every chunk of an
// `up` row in one round (decode at the real geometry): a lane loads its `up` chunks into
// registers before the kernel's wait (hc_read_gate_prefetch_up) and its stream's h and norm
// weight before the partial sums, so that the kernel waits on one round of loads instead of
// three; the sums are hc_mix_gate_with's, in the same order: the same bits. The general form
// (hc_read_gate_s): hc_mix_gate_with, any shape. Apart because a kernel's code is fetched from
// L2 as it runs, and this one runs once a layer between kernels streaming weights: the early
// form alone is half the code of both in one kernel
// (docs/decisions/0011-code-size-in-once-a-layer-kernels.md).
//
// A gate lane's place: its warp's channel c, its stream s (32 / C lanes a stream), the up row ch,
// and whether the block takes the early path (uniform over the block). Index math only.
struct HcGateLane {
    bool early, live;
    int per;
    long c, s, ch, chunks, first;
};

template <typename W>
__device__ __forceinline__ HcGateLane hc_gate_lane(const W* up, long streams, long hid, long rank) {
    constexpr int N = WeightVec<W>::N;
    HcGateLane g;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const bool split = streams <= 32 && 32 % streams == 0;
    g.per = split ? 32 / (int)streams : 32;
    g.c = (long)blockIdx.x * warps + (threadIdx.x >> 5);
    g.s = lane / g.per;
    g.ch = g.s * hid + g.c;
    g.chunks = rank / N;
    g.first = lane % g.per;
    g.early = split && (long)gridDim.x * warps >= hid && rank % N == 0 && aligned16(up) &&
              g.chunks <= HC_GATE_CHUNKS * g.per;
    g.live = g.c < hid;
    return g;
}

// Before the wait: the lane's chunks of its up row into registers on the early path (weights
// only), so that after the wait the kernel waits on L2 for the partial sums and h alone.
template <typename W>
__device__ __forceinline__ void hc_read_gate_prefetch_up(uint4* raw, const W* up, long streams, long hid,
                                                         long rank) {
    const HcGateLane g = hc_gate_lane<W>(up, streams, hid, rank);
    if (g.early && g.live) short_chunks_load<W, HC_GATE_CHUNKS>(up + g.ch * rank, g.chunks, g.first, g.per, raw);
}

// EARLY: the early form (the launcher takes it only where hc_gate_lane's `early` holds; `raw`:
// the lane's up chunks, loaded by hc_read_gate_prefetch_up), else the general one (raw unused).
// Rows t0 .. t0 + nt - 1, one after another with the lane's up chunks held: each row's sums are
// a one-row block's.
template <typename W, bool EARLY>
__device__ __forceinline__ void hc_read_gate_stream(float* y, float* inj, const float* h, const float* part,
                                                    const float* ssq, const float* w, const W* up, long streams,
                                                    long hid, long rank, long gains, long w_len, float eps,
                                                    const uint4* raw, long t0, int nt) {
    __shared__ __align__(16) float act_s[HC_GATE_MAX_RANK];
    __shared__ float inv_s[HC_MAX_STREAMS];
    const long width = streams * hid, outs = rank + gains;
    const int lane = threadIdx.x & 31;
    const HcGateLane g = hc_gate_lane<W>(up, streams, hid, rank);
    // The launcher checks the early form's conditions as hc_gate_lane does: a mismatch is a bug,
    // stopped here rather than leaving y unwritten.
    if (EARLY && !g.early) __trap();
    const bool early = EARLY, live = g.live;
    const int per = g.per;
    const long c = g.c, s = g.s, ch = g.ch, chunks = g.chunks, first = g.first;
    const float nw = early && live ? hc_norm_weight(w, ch, hid, w_len) : 0.0f;
    const bool pre_fits = streams <= HC_PRE_STREAMS && outs <= HC_PRE_OUTS * (long)blockDim.x;
    for (long t = t0; t < t0 + nt; t++) {
        const float* ht = h + t * width;
        const float hv = early && live ? ht[ch] : 0.0f;
        // The thread's partial sums are loaded with the sums of squares, in one round trip to L2
        // rather than one after the other (where each output's C partial sums and a thread's
        // outputs fit in `pre`): the inverse RMS is needed only to combine them.
        float pre[HC_PRE_OUTS][HC_PRE_STREAMS];
        if (pre_fits) {
#pragma unroll
            for (int u = 0; u < HC_PRE_OUTS; u++) {
                const long o = threadIdx.x + u * (long)blockDim.x;
#pragma unroll
                for (int q = 0; q < HC_PRE_STREAMS; q++)
                    pre[u][q] = o < outs && q < streams ? part[(t * outs + o) * streams + q] : 0.0f;
            }
        }
        if (threadIdx.x < streams) inv_s[threadIdx.x] = rsqrtf(ssq[t * streams + threadIdx.x] / hid + eps);
        __syncthreads();
        for (long o = threadIdx.x, u = 0; o < outs; o += blockDim.x, u++) {
            float d = 0.0f;
            if (pre_fits) {
#pragma unroll
                for (int v = 0; v < HC_PRE_OUTS; v++)
                    if (v == u)
#pragma unroll
                        for (int q = 0; q < HC_PRE_STREAMS; q++)
                            if (q < streams) d += inv_s[q] * pre[v][q];
            } else {
                for (long q = 0; q < streams; q++) d += inv_s[q] * part[(t * outs + o) * streams + q];
            }
            if (o < rank)
                act_s[o] = silu_f32(d / (float)streams);
            else if (blockIdx.x == 0)
                inj[t * streams + (o - rank)] = 2.0f * sigmoid_f32(d / (float)streams);
        }
        __syncthreads();
        if (!early) {
            hc_mix_gate_with<W>(
                y + t * hid,
                [&](long, long ch) { return ht[ch] * inv_s[ch / hid] * hc_norm_weight(w, ch, hid, w_len); }, act_s,
                up, 1, streams, hid, rank);
        } else {
            // strided_dot_short's sums over the chunks loaded above.
            float d = 0.0f;
            if (live) d = short_chunks_dot<W, HC_GATE_CHUNKS>(act_s, raw, chunks, first, per);
            for (int off = per / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
            float term = sigmoid_f32(d) * (hv * inv_s[s] * nw);
            for (int off = per; off < 32; off <<= 1) term += __shfl_xor_sync(0xffffffffu, term, off);
            if (lane == 0 && live) y[t * hid + c] = term / (float)streams;
        }
        // act_s and inv_s are rewritten by the next row.
        if (t + 1 < t0 + nt) __syncthreads();
    }
}

// Most rows the few-row by-stream kernels (`hc_read_act_s2_few`, `hc_read_gate_se_few`) take in
// one block (launch::layout::HC_FEW_ROWS).
#define HC_FEW_ROWS 16

// Before the act kernels' wait: the slices of the block's weight rows (its stream's) into L2.
template <typename W, int R>
__device__ __forceinline__ void hc_read_stream_prefetch(const W* down, const W* inject, long streams, long width,
                                                        long rank, long gains) {
    const long o0 = (long)blockIdx.x * R, hid = width / streams;
    const long n = min((long)R, rank + gains - o0);
    if (threadIdx.x < n)
        prefetch_weights((const char*)hc_read_row(down, inject, o0 + threadIdx.x, rank, width, sizeof(W)) +
                             blockIdx.y * hid * (long)sizeof(W),
                         hid * (long)sizeof(W));
}

#define HC_READ_STREAM_ACT_KERNEL(W, SUFFIX, R)                                                              \
    extern "C" __global__ void __launch_bounds__(HC_ACT_MAX_THREADS)                                          \
        hc_read_act_s##R##_##SUFFIX(float* part, float* ssq, const float* h, const float* w, const W* down,   \
                                    const W* inject, long streams, long width, long rank, long gains,         \
                                    long w_len) {                                                             \
        hc_read_stream_prefetch<W, R>(down, inject, streams, width, rank, gains);                            \
        wait_for_producers();                                                                                 \
        hc_read_act_stream<W, R, 1>(part, ssq, h, w, down, inject, streams, width, rank, gains, w_len,       \
                                    blockIdx.z, 1);                                                           \
    }

// Every row of a few (`rows` ≤ HC_FEW_ROWS) in each block: grid (outputs / R, streams) for the
// act kernel, (channels / 8) for the gate; each weight chunk loaded once a step, not once a row.
#define HC_READ_FEW_ACT_KERNEL(W, SUFFIX, R)                                                                  \
    extern "C" __global__ void __launch_bounds__(HC_ACT_MAX_THREADS)                                          \
        hc_read_act_s##R##_few_##SUFFIX(float* part, float* ssq, const float* h, const float* w,              \
                                        const W* down, const W* inject, long streams, long width, long rank,  \
                                        long gains, long w_len, int rows) {                                   \
        hc_read_stream_prefetch<W, R>(down, inject, streams, width, rank, gains);                            \
        wait_for_producers();                                                                                 \
        hc_read_act_stream<W, R, HC_FEW_ROWS>(part, ssq, h, w, down, inject, streams, width, rank, gains,    \
                                              w_len, 0, rows);                                                \
    }

#define HC_READ_FEW_KERNELS(W, SUFFIX)                                                                        \
    HC_READ_FEW_ACT_KERNEL(W, SUFFIX, 2)                                                                      \
    extern "C" __global__ void HC_GATE_BOUNDS hc_read_gate_se_few_##SUFFIX(                                    \
        float* y, float* inj, const float* h, const float* part, const float* ssq, const float* w,            \
        const W* up, long streams, long hid, long rank, long gains, long w_len, float eps, int rows) {        \
        hc_read_gate_prefetch_rows<W>(up, streams, hid, rank);                                               \
        uint4 raw[HC_GATE_CHUNKS];                                                                            \
        hc_read_gate_prefetch_up<W>(raw, up, streams, hid, rank);                                             \
        wait_for_producers();                                                                                 \
        hc_read_gate_stream<W, true>(y, inj, h, part, ssq, w, up, streams, hid, rank, gains, w_len, eps, raw, \
                                     0, rows);                                                                \
    }

#define HC_READ_STREAM_KERNELS(W, SUFFIX)                                                                      \
    HC_READ_STREAM_ACT_KERNEL(W, SUFFIX, 2)                                                                   \
    HC_READ_STREAM_ACT_KERNEL(W, SUFFIX, 4)                                                                   \
    HC_READ_STREAM_ACT_KERNEL(W, SUFFIX, 8)                                                                   \
    HC_READ_STREAM_ACT_KERNEL(W, SUFFIX, 16)                                                                  \
    HC_READ_FEW_KERNELS(W, SUFFIX)                                                                            \
    extern "C" __global__ void HC_GATE_BOUNDS hc_read_gate_s_##SUFFIX(                                         \
        float* y, float* inj, const float* h, const float* part, const float* ssq, const float* w,            \
        const W* up, long streams, long hid, long rank, long gains, long w_len, float eps) {                  \
        hc_read_gate_prefetch_rows<W>(up, streams, hid, rank);                                               \
        wait_for_producers();                                                                                 \
        hc_read_gate_stream<W, false>(y, inj, h, part, ssq, w, up, streams, hid, rank, gains, w_len, eps,    \
                                      nullptr, blockIdx.y, 1);                                                \
    }                                                                                                         \
    extern "C" __global__ void HC_GATE_BOUNDS hc_read_gate_se_##SUFFIX(                                        \
        float* y, float* inj, const float* h, const float* part, const float* ssq, const float* w,            \
        const W* up, long streams, long hid, long rank, long gains, long w_len, float eps) {                  \
        hc_read_gate_prefetch_rows<W>(up, streams, hid, rank);                                               \
        uint4 raw[HC_GATE_CHUNKS];                                                                            \
        hc_read_gate_prefetch_up<W>(raw, up, streams, hid, rank);                                             \
        wait_for_producers();                                                                                 \
        hc_read_gate_stream<W, true>(y, inj, h, part, ssq, w, up, streams, hid, rank, gains, w_len, eps, raw, \
                                     blockIdx.y, 1);                                                          \
    }

HC_READ_STREAM_KERNELS(float, f32)
HC_READ_STREAM_KERNELS(bf16_t, bf16)


#define HC_KERNELS(W, SUFFIX)                                                                                        \
    extern "C" __global__ void hc_mix_act_warp_##SUFFIX(float* act, const float* hn, const W* down, long rows,       \
                                                        long streams, long width, long rank) {                       \
        wait_for_producers();                                                                                        \
        hc_mix_act_warp<W>(act, hn, down, rows, streams, width, rank);                                               \
    }                                                                                                                \
    extern "C" __global__ void hc_mix_act_block_##SUFFIX(float* act, const float* hn, const W* down, long rows,      \
                                                         long streams, long width, long rank) {                      \
        prefetch_first_rows(down, width, rank, 1);                                                                   \
        wait_for_producers();                                                                                        \
        hc_mix_act_block<W>(act, hn, down, rows, streams, width, rank);                                              \
    }                                                                                                                \
    extern "C" __global__ void HC_GATE_BOUNDS hc_mix_gate_##SUFFIX(                                                  \
        float* y, const float* hn, const float* act, const W* up, long rows, long streams, long hid, long rank) {    \
        /* the rows of `up` this block reads first: a warp per channel c, one row per stream */                      \
        const long c0 = (long)blockIdx.x * (blockDim.x >> 5);                                                        \
        if (threadIdx.x < streams && c0 < hid)                                                                       \
            prefetch_weights(up + (threadIdx.x * hid + c0) * rank,                                                   \
                             min((long)(blockDim.x >> 5), hid - c0) * rank * (long)sizeof(W));                       \
        wait_for_producers();                                                                                        \
        hc_mix_gate<W>(y, hn, act, up, rows, streams, hid, rank);                                                    \
    }                                                                                                                \
    extern "C" __global__ void hc_inject_warp_##SUFFIX(float* out, const float* hn, const W* w, long rows,           \
                                                       long streams, long width) {                                   \
        wait_for_producers();                                                                                        \
        hc_inject_warp<W>(out, hn, w, rows, streams, width);                                                         \
    }                                                                                                                \
    extern "C" __global__ void hc_inject_block_##SUFFIX(float* out, const float* hn, const W* w, long rows,          \
                                                        long streams, long width) {                                  \
        prefetch_first_rows(w, width, streams, 1);                                                                   \
        wait_for_producers();                                                                                        \
        hc_inject_block<W>(out, hn, w, rows, streams, width);                                                        \
    }

// hc_inject: out [rows, streams], out[t, s] = 2 * sigmoid(hn[t]·w[s] / streams), w [streams, width].
// `_warp`: a warp per output (many rows); `_block`: a block per output (a few rows: decode has
// only `streams` outputs, each a dot product over the whole width).
template <typename W>
__device__ __forceinline__ void hc_inject_warp(float* out, const float* hn, const W* w, long rows, long streams,
                                               long width) {
    const int lane = threadIdx.x & 31;
    const long warps = blockDim.x >> 5;
    const long outputs = rows * streams;
    for (long o = blockIdx.x * warps + (threadIdx.x >> 5); o < outputs; o += (long)gridDim.x * warps) {
        const long t = o / streams, s = o % streams;
        const float d = warp_sum(lane_dot(hn + t * width, w + s * width, width, lane));
        if (lane == 0) out[o] = 2.0f * sigmoid_f32(d / (float)streams);
    }
}

template <typename W>
__device__ __forceinline__ void hc_inject_block(float* out, const float* hn, const W* w, long rows, long streams,
                                                long width) {
    for (long o = blockIdx.x; o < rows * streams; o += gridDim.x) {
        const long t = o / streams, s = o % streams;
        const float d = block_dot(hn + t * width, w + s * width, width);
        if (threadIdx.x == 0) out[o] = 2.0f * sigmoid_f32(d / (float)streams);
    }
}

HC_KERNELS(float, f32)
HC_KERNELS(bf16_t, bf16)

// ---------------------------------------------------------------------------------------------
// swiglu_linear: y [tokens, n] = silu(x·Wgᵀ) * (x·Wuᵀ), x [tokens, k], Wg, Wu [n, k].
// As linear_rows: one warp per output row r, every token in the same warp (MAX_TOKENS at a time),
// both weight rows read in the same pass.

#define SWIGLU_MAX_TOKENS 8

template <typename W>
__device__ __forceinline__ void swiglu_linear(float* y, const float* x, const W* wg, const W* wu, long tokens, long k,
                                              long n) {
    constexpr int N = WeightVec<W>::N;
    const long warps = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    const bool vec = k % N == 0 && aligned16(x) && aligned16(wg) && aligned16(wu);
    for (long r = blockIdx.x * warps + (threadIdx.x >> 5); r < n; r += (long)gridDim.x * warps) {
        const W* gr = wg + r * k;
        const W* ur = wu + r * k;
        for (long t0 = 0; t0 < tokens; t0 += SWIGLU_MAX_TOKENS) {
            const long nt = min((long)SWIGLU_MAX_TOKENS, tokens - t0);
            float g[SWIGLU_MAX_TOKENS], u[SWIGLU_MAX_TOKENS];
#pragma unroll
            for (int t = 0; t < SWIGLU_MAX_TOKENS; t++) g[t] = u[t] = 0.0f;
            if (vec) {
                for (long i = lane; i < k / N; i += 32) {
                    float gv[N], uv[N];
                    WeightVec<W>::chunk(gr, i, gv);
                    WeightVec<W>::chunk(ur, i, uv);
#pragma unroll
                    for (int t = 0; t < SWIGLU_MAX_TOKENS; t++) {
                        if (t < nt) {
                            float xv[N];
                            act_chunk<N>(x + (t0 + t) * k, i, xv);
#pragma unroll
                            for (int j = 0; j < N; j++) {
                                g[t] += xv[j] * gv[j];
                                u[t] += xv[j] * uv[j];
                            }
                        }
                    }
                }
            } else {
                for (long i = lane; i < k; i += 32) {
                    const float gi = WeightVec<W>::one(gr, i), ui = WeightVec<W>::one(ur, i);
#pragma unroll
                    for (int t = 0; t < SWIGLU_MAX_TOKENS; t++) {
                        if (t < nt) {
                            const float xi = x[(t0 + t) * k + i];
                            g[t] += xi * gi;
                            u[t] += xi * ui;
                        }
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < SWIGLU_MAX_TOKENS; t++) {
                const float gs = warp_sum(g[t]), us = warp_sum(u[t]);
                if (lane == 0 && t < nt) y[(t0 + t) * n + r] = silu_f32(gs) * us;
            }
        }
    }
}

// One token (decode): a block per output row, so that the 640 rows of the shared expert still
// put every multiprocessor's loads in flight (a warp per row left most SMs idle); the gate and up
// rows are read in the same round. With inputs_ready and a block for every row (the launcher's
// grid), a block runs ahead (kernels/common.cuh): its row is computed before the wait, stored
// after it.
template <typename W>
__device__ __forceinline__ float swiglu_row(const float* x, const W* wg, const W* wu, long k, long r) {
    float g, u;
    strided_dot2(x, wg + r * k, wu + r * k, k, threadIdx.x, blockDim.x, g, u);
    g = block_sum(g);
    u = block_sum(u);
    return silu_f32(g) * u;
}

#define SWIGLU_BLOCK_KERNEL(W, SUFFIX)                                                                      \
    extern "C" __global__ void swiglu_linear_block_##SUFFIX(float* y, const float* x, const W* wg, const W* wu, \
                                                            long k, long n, int inputs_ready) {               \
        prefetch_first_rows(wg, k, n, 1);                                                                    \
        prefetch_first_rows(wu, k, n, 1);                                                                    \
        const bool ahead = inputs_ready && gridDim.x >= n;                                                   \
        wait_for_producers_unless(ahead);                                                                    \
        if (ahead) {                                                                                         \
            const float v = swiglu_row<W>(x, wg, wu, k, min((long)blockIdx.x, n - 1));                      \
            wait_for_producers();                                                                            \
            if (threadIdx.x == 0 && blockIdx.x < n) y[blockIdx.x] = v;                                       \
        } else {                                                                                             \
            for (long r = blockIdx.x; r < n; r += gridDim.x) {                                               \
                const float v = swiglu_row<W>(x, wg, wu, k, r);                                              \
                if (threadIdx.x == 0) y[r] = v;                                                              \
            }                                                                                                \
        }                                                                                                    \
    }
SWIGLU_BLOCK_KERNEL(float, f32)
SWIGLU_BLOCK_KERNEL(bf16_t, bf16)

extern "C" __global__ void swiglu_linear_reference_f32(float* y, const float* x, const float* wg, const float* wu,
                                                       long tokens, long k, long n) {
    wait_for_producers();
    swiglu_linear<float>(y, x, wg, wu, tokens, k, n);
}

extern "C" __global__ void swiglu_linear_reference_bf16(float* y, const float* x, const bf16_t* wg, const bf16_t* wu,
                                                        long tokens, long k, long n) {
    wait_for_producers();
    swiglu_linear<bf16_t>(y, x, wg, wu, tokens, k, n);
}

// ---------------------------------------------------------------------------------------------
// gated_rms_norm: per group (head) of `group` channels, y = x * rsqrt(mean(x²) + eps) * w * act(gate),
// plain w (not 1 + w); act = sigmoid when `use_sigmoid`, else silu. w has `w_len` entries: one per
// group channel (shared by the groups), or indexed modulo its length as the reference.
// A warp per group (grid-strided; a head is 128 channels: 4 a lane), so that a prefill chunk's
// ~100k heads are not ~100k blocks each waiting on a block-wide sum.
extern "C" __global__ void gated_rms_norm_reference_f32(float* y, const float* x, const float* gate, const float* w,
                                                        long groups, long group, long w_len, int use_sigmoid,
                                                        float eps) {
    wait_for_producers();
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (long g = (long)blockIdx.x * warps + (threadIdx.x >> 5); g < groups; g += (long)gridDim.x * warps) {
        const float* xs = x + g * group;
        float ss = 0.0f;
        for (long c = lane; c < group; c += 32) ss += xs[c] * xs[c];
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)group + eps);
        for (long c = lane; c < group; c += 32) {
            const long i = g * group + c;
            const float wi = w_len == group ? w[c] : w[i % w_len];
            const float a = use_sigmoid ? sigmoid_f32(gate[i]) : silu_f32(gate[i]);
            y[i] = xs[c] * inv * wi * a;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ple_gate: key, query [rows, streams*h], value [rows, h] -> out [rows, streams*h]:
// out[t, s, c] = sigmoid(ssqrt(<key_ts, query_ts> / sqrt(h))) * value[t, c], where
// ssqrt(g) = sign(g) * sqrt(max(|g|, 1e-6)) and sign(0) = 0. One block per (row, stream).
extern "C" __global__ void ple_gate_reference_f32(float* out, const float* key, const float* query, const float* value,
                                                  long rows, long streams, long h) {
    wait_for_producers();
    const long groups = rows * streams;
    for (long gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const long t = gi / streams;
        const long base = gi * h;  // = t*streams*h + s*h
        float p = 0.0f;
        for (long c = threadIdx.x; c < h; c += blockDim.x) p += key[base + c] * query[base + c];
        const float g = block_sum(p) / sqrtf((float)h);
        // g itself when it is zero (sign(0) = 0) or NaN (as the reference's signum).
        const float root = sqrtf(fmaxf(fabsf(g), 1e-6f));
        const float signed_root = g > 0.0f ? root : (g < 0.0f ? -root : g);
        const float gain = sigmoid_f32(signed_root);
        for (long c = threadIdx.x; c < h; c += blockDim.x) out[base + c] = gain * value[t * h + c];
    }
}

// ---------------------------------------------------------------------------------------------
// sigmoid_gated_add: y [rows, d] = a + sigmoid(x·w) * b, x [rows, h], w [h] (f32), a, b [rows, d]
// (`ops::linear::sigmoid_gated_add`: the shared expert's gate and the sum with the routed experts
// in one launch). One block per row: the gate logit is a block-wide dot product.
extern "C" __global__ void sigmoid_gated_add_reference_f32(float* y, const float* x, const float* w, const float* b,
                                                           const float* a, long rows, long h, long d) {
    wait_for_producers();
    for (long t = blockIdx.x; t < rows; t += gridDim.x) {
        const float gate = sigmoid_f32(block_dot(x + t * h, w, h));
        for (long c = threadIdx.x; c < d; c += blockDim.x) y[t * d + c] = a[t * d + c] + b[t * d + c] * gate;
    }
}
