// Gated DeltaNet: the causal depthwise convolution with its window state (src/ops/conv.rs is the
// reference), the gates and the delta-rule recurrence (src/ops/gdn.rs is the reference).
#include "common.cuh"

#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// y[t, c] = Σ_j w[c, j] · ext[past + t - (K-1-j)·dilation, c], ext = the window's `past` rows (oldest
// first) followed by the `rows` rows of x; past = (K-1)·dilation. One thread per output value. The
// window is only read here: `causal_conv_window_f32`, launched after this kernel on the same stream,
// shifts it.
extern "C" __global__ void causal_conv_reference_f32(float* y, const float* x, const float* window, const float* w,
                                                     long rows, long width, int kernel, int dilation, int silu) {
    wait_for_producers();
    const long past = (long)(kernel - 1) * dilation;
    GRID_STRIDE(i, rows * width) {
        const long t = i / width, c = i - t * width;
        float acc = 0.0f;
        for (int j = 0; j < kernel; j++) {
            const long r = past + t - (long)(kernel - 1 - j) * dilation;  // row of ext, >= 0
            const float v = r < past ? window[r * width + c] : x[(r - past) * width + c];
            acc += w[c * kernel + j] * v;
        }
        y[i] = silu ? silu_f32(acc) : acc;
    }
}

// After the step the window holds the last `past` rows of ext: row p becomes ext row rows + p. One
// thread per channel, rows in ascending order, so a window row still to be read (rows + p > p) has
// not been overwritten yet, and no other thread touches this channel.
extern "C" __global__ void causal_conv_window_f32(float* window, const float* x, long rows, long width, long past) {
    wait_for_producers();
    GRID_STRIDE(c, width) {
        for (long p = 0; p < past; p++) {
            const long r = rows + p;
            window[p * width + c] = r < past ? window[r * width + c] : x[(r - past) * width + c];
        }
    }
}

// A few rows (decode): the convolution and the window's shift in one kernel, a thread per channel
// over the rows in order (the same sums as causal_conv_reference_f32); the thread reads its
// channel's old window rows before it overwrites them, and no other thread touches the channel.
extern "C" __global__ void causal_conv_step_f32(float* y, float* window, const float* x, const float* w, long rows,
                                                long width, int kernel, int dilation, int silu) {
    wait_for_producers();
    const long past = (long)(kernel - 1) * dilation;
    GRID_STRIDE(c, width) {
        for (long t = 0; t < rows; t++) {
            float acc = 0.0f;
            for (int j = 0; j < kernel; j++) {
                const long r = past + t - (long)(kernel - 1 - j) * dilation;
                const float v = r < past ? window[r * width + c] : x[(r - past) * width + c];
                acc += w[c * kernel + j] * v;
            }
            y[t * width + c] = silu ? silu_f32(acc) : acc;
        }
        for (long p = 0; p < past; p++) {
            const long r = rows + p;
            window[p * width + c] = r < past ? window[r * width + c] : x[(r - past) * width + c];
        }
    }
}

// torch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplus_f32(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// beta = sigmoid(b), g = -exp(A_log) · softplus(a + dt_bias), over n = rows · heads values.
extern "C" __global__ void gdn_gates_reference_f32(float* beta, float* g, const float* b, const float* a,
                                                   const float* a_log, const float* dt_bias, long n, int heads) {
    wait_for_producers();
    GRID_STRIDE(i, n) {
        const long h = i % heads;
        beta[i] = sigmoid_f32(b[i]);
        g[i] = -expf(a_log[h]) * softplus_f32(a[i] + dt_bias[h]);
    }
}

// The delta-rule recurrence. One block per (value head, group of GDN_COLS state columns); warp w
// holds rows [GDN_ROWS·w, GDN_ROWS·(w+1)) of the head's dk x dv state for its columns in registers
// (lane = column; the row loops are unrolled, so the register array is only indexed by constants).
// blockDim.x = 32 · ceil(dk / 32) ≤ GDN_MAX_THREADS. Per token:
//   q, k of the key head l2-normalised into shared memory (q also scaled by 1/sqrt(dk));
//   S *= exp(g); u = (v - Sᵀk) · beta; S += k ⊗ u; o = Sᵀq,
// the column sums over the rows reduced across warps through shared memory.
#define GDN_COLS 32
#define GDN_ROWS 32
#define GDN_MAX_THREADS 512
#define GDN_MAX_WARPS (GDN_MAX_THREADS / 32)

// `gates(t, h, beta, g)`: token t's gates of value head h (given, or formed from b and a).
template <typename Gates>
__device__ __forceinline__ void gdn_recurrence(float* out, float* state, const float* qkv, Gates gates, int rows,
                                               int key_heads, int value_heads, int dk, int dv) {
    __shared__ float qs[GDN_MAX_THREADS], ks[GDN_MAX_THREADS];
    __shared__ float sum_q[GDN_MAX_WARPS], sum_k[GDN_MAX_WARPS];
    __shared__ float part_kv[GDN_MAX_WARPS][GDN_COLS], part_o[GDN_MAX_WARPS][GDN_COLS];

    const int h = blockIdx.x;
    const int kh = h / (value_heads / key_heads);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int j = blockIdx.y * GDN_COLS + lane;
    const bool col = j < dv;
    const int row0 = warp * GDN_ROWS;
    const long key_dim = (long)key_heads * dk;
    const long width = 2 * key_dim + (long)value_heads * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    float* S = state + (long)h * dk * dv;

    float s[GDN_ROWS];
#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++) s[r] = (col && row0 + r < dk) ? S[(long)(row0 + r) * dv + j] : 0.0f;

    // Token t's inputs: thread tid's q and k channel, its column's v, the head's gates. Loaded a
    // token ahead (the next token's loads are in flight while this one is reduced and applied:
    // a many-token scan is a chain of tokens, and the loads were a third of each link).
    const auto load = [&](int t, float& qv, float& kv, float& vv, float& b, float& gt) {
        const float* row = qkv + (long)t * width;
        qv = tid < dk ? row[kh * dk + tid] : 0.0f;
        kv = tid < dk ? row[key_dim + kh * dk + tid] : 0.0f;
        vv = col ? row[2 * key_dim + (long)h * dv + j] : 0.0f;
        gates(t, h, b, gt);
    };
    float qv_next, kv_next, vv_next, b_next, gt_next;
    if (rows > 0) load(0, qv_next, kv_next, vv_next, b_next, gt_next);
    for (int t = 0; t < rows; t++) {
        const float qv = qv_next, kv = kv_next, vv = vv_next, b = b_next, gt = gt_next;
        if (t + 1 < rows) load(t + 1, qv_next, kv_next, vv_next, b_next, gt_next);
        // 1. Sums of squares of q and k: thread tid holds channel tid of each.
        const float wq = warp_sum(qv * qv), wk = warp_sum(kv * kv);
        if (lane == 0) {
            sum_q[warp] = wq;
            sum_k[warp] = wk;
        }
        __syncthreads();
        float tq = 0.0f, tk = 0.0f;
        for (int w = 0; w < warps; w++) {
            tq += sum_q[w];
            tk += sum_k[w];
        }
        const float inv_q = 1.0f / sqrtf(tq + 1e-6f), inv_k = 1.0f / sqrtf(tk + 1e-6f);
        if (tid < dk) {
            qs[tid] = qv * inv_q * scale;
            ks[tid] = kv * inv_k;
        }
        __syncthreads();
        // 2. Decay, and this warp's share of (Sᵀk)_j.
        const float decay = expf(gt);
        float p = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) {
            if (row0 + r < dk) {
                s[r] *= decay;
                p += s[r] * ks[row0 + r];
            }
        }
        part_kv[warp][lane] = p;
        __syncthreads();
        // 3. u_j, the rank-1 update, and this warp's share of o_j = (Sᵀq)_j.
        float sk = 0.0f;
        for (int w = 0; w < warps; w++) sk += part_kv[w][lane];
        const float u = col ? (vv - sk) * b : 0.0f;
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_ROWS; r++) {
            if (row0 + r < dk) {
                s[r] += ks[row0 + r] * u;
                o += s[r] * qs[row0 + r];
            }
        }
        part_o[warp][lane] = o;
        __syncthreads();
        // 4. Warp 0 writes o. Every shared buffer is written again only past a barrier that follows
        // all reads of it: sum_* (read before barrier 2) next before barrier 1 of the next token,
        // qs/ks (read before barrier 4) and part_kv (before 4) after the next barrier 1, part_o
        // (read here) after the next barrier 3.
        if (warp == 0 && col) {
            float acc = 0.0f;
            for (int w = 0; w < warps; w++) acc += part_o[w][lane];
            out[(long)t * value_heads * dv + (long)h * dv + j] = acc;
        }
    }

#pragma unroll
    for (int r = 0; r < GDN_ROWS; r++)
        if (col && row0 + r < dk) S[(long)(row0 + r) * dv + j] = s[r];
}

// Where a token's gates come from: given (gdn_gates_reference_f32's beta and g), or formed from
// b and a (`Op::GdnGatedRecurrence`: the gate kernel's launch is gone) with
// gdn_gates_reference_f32's expressions (compiled into another kernel they may round
// differently: tests/gpu_gdn.rs holds both to the CPU reference).
struct GdnGivenGates {
    const float *beta, *g;
    int value_heads;
    __device__ __forceinline__ void operator()(int t, int h, float& b, float& gt) const {
        b = beta[(long)t * value_heads + h];
        gt = g[(long)t * value_heads + h];
    }
};

struct GdnRawGates {
    const float *b_in, *a_in, *a_log, *dt_bias;
    int value_heads;
    __device__ __forceinline__ void operator()(int t, int h, float& b, float& gt) const {
        const long i = (long)t * value_heads + h;
        b = sigmoid_f32(b_in[i]);
        gt = -expf(a_log[h]) * softplus_f32(a_in[i] + dt_bias[h]);
    }
};

// ---------------------------------------------------------------------------------------------
// The same recurrence with a warp per 8 columns of a head's state (`_warp`, dk ≤ GDNW_MAX_DK):
// no block barrier a token. Lane l holds column j0 + l % 8 of rows l / 8 + 4i (i < dk / 4), so
// a warp's state loads read 32 contiguous bytes of 4 rows at a time; q and k of the token are
// normalised by the whole warp and staged in the warp's shared slice, (Sᵀk)_j and (Sᵀq)_j are a
// lane's sum over its rows and then over the 4 lanes of its column (two shuffles).
#define GDNW_COLS 8
#define GDNW_ROWS 32
#define GDNW_MAX_DK (4 * GDNW_ROWS)
#define GDNW_WARPS 4
// Chunks of q and k a lane normalises: channels lane + 32m.
#define GDNW_QK (GDNW_MAX_DK / 32)

template <typename Gates>
__device__ __forceinline__ void gdn_recurrence_warp(float* out, float* state, const float* qkv, Gates gates, int rows,
                                                    int key_heads, int value_heads, int dk, int dv) {
    __shared__ float qk[GDNW_WARPS][2][GDNW_MAX_DK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x;
    const int kh = h / (value_heads / key_heads);
    const int j0 = (blockIdx.y * GDNW_WARPS + warp) * GDNW_COLS;
    if (j0 >= dv) return;  // the whole warp: nothing below synchronises more than a warp
    const int j = j0 + (lane & (GDNW_COLS - 1)), r0 = lane / GDNW_COLS;
    const bool col = j < dv;
    const long key_dim = (long)key_heads * dk;
    const long width = 2 * key_dim + (long)value_heads * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    float* S = state + (long)h * dk * dv;
    float* qs = qk[warp][0];
    float* ks = qk[warp][1];

    float s[GDNW_ROWS];
#pragma unroll
    for (int i = 0; i < GDNW_ROWS; i++) {
        const int r = r0 + 4 * i;
        s[i] = (col && r < dk) ? S[(long)r * dv + j] : 0.0f;
    }

    // Token t's inputs, loaded a token ahead (as gdn_recurrence).
    const auto load = [&](int t, float* qv, float* kv, float& vv, float& b, float& gt) {
        const float* row = qkv + (long)t * width;
#pragma unroll
        for (int m = 0; m < GDNW_QK; m++) {
            const int c = lane + 32 * m;
            qv[m] = c < dk ? row[kh * dk + c] : 0.0f;
            kv[m] = c < dk ? row[key_dim + kh * dk + c] : 0.0f;
        }
        vv = col ? row[2 * key_dim + (long)h * dv + j] : 0.0f;
        gates(t, h, b, gt);
    };
    float qv_next[GDNW_QK], kv_next[GDNW_QK], vv_next = 0.0f, b_next = 0.0f, gt_next = 0.0f;
    if (rows > 0) load(0, qv_next, kv_next, vv_next, b_next, gt_next);
    for (int t = 0; t < rows; t++) {
        float qv[GDNW_QK], kv[GDNW_QK];
#pragma unroll
        for (int m = 0; m < GDNW_QK; m++) {
            qv[m] = qv_next[m];
            kv[m] = kv_next[m];
        }
        const float vv = vv_next, b = b_next, gt = gt_next;
        if (t + 1 < rows) load(t + 1, qv_next, kv_next, vv_next, b_next, gt_next);
        // 1. q and k normalised (sums of squares over the warp), staged for the lanes' rows.
        float sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int m = 0; m < GDNW_QK; m++) {
            sq += qv[m] * qv[m];
            sk += kv[m] * kv[m];
        }
        const float inv_q = 1.0f / sqrtf(warp_sum(sq) + 1e-6f), inv_k = 1.0f / sqrtf(warp_sum(sk) + 1e-6f);
        __syncwarp();  // the previous token's reads of qs and ks are done
#pragma unroll
        for (int m = 0; m < GDNW_QK; m++) {
            const int c = lane + 32 * m;
            if (c < dk) {
                qs[c] = qv[m] * inv_q * scale;
                ks[c] = kv[m] * inv_k;
            }
        }
        __syncwarp();
        // 2. Decay and (Sᵀk)_j.
        const float decay = expf(gt);
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < GDNW_ROWS; i++) {
            const int r = r0 + 4 * i;
            if (r < dk) {
                s[i] *= decay;
                p += s[i] * ks[r];
            }
        }
        p += __shfl_xor_sync(0xffffffffu, p, 8);
        p += __shfl_xor_sync(0xffffffffu, p, 16);
        // 3. u_j, the rank-1 update and o_j = (Sᵀq)_j.
        const float u = col ? (vv - p) * b : 0.0f;
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < GDNW_ROWS; i++) {
            const int r = r0 + 4 * i;
            if (r < dk) {
                s[i] += ks[r] * u;
                o += s[i] * qs[r];
            }
        }
        o += __shfl_xor_sync(0xffffffffu, o, 8);
        o += __shfl_xor_sync(0xffffffffu, o, 16);
        if (r0 == 0 && col) out[(long)t * value_heads * dv + (long)h * dv + j] = o;
    }

#pragma unroll
    for (int i = 0; i < GDNW_ROWS; i++) {
        const int r = r0 + 4 * i;
        if (col && r < dk) S[(long)r * dv + j] = s[i];
    }
}

extern "C" __global__ void __launch_bounds__(GDN_MAX_THREADS)
    gdn_recurrence_reference_f32(float* out, float* state, const float* qkv, const float* beta, const float* g,
                                 int rows, int key_heads, int value_heads, int dk, int dv) {
    wait_for_producers();
    gdn_recurrence(out, state, qkv, GdnGivenGates{beta, g, value_heads}, rows, key_heads, value_heads, dk, dv);
}

extern "C" __global__ void __launch_bounds__(GDN_MAX_THREADS)
    gdn_gated_recurrence_f32(float* out, float* state, const float* qkv, const float* b_in, const float* a_in,
                             const float* a_log, const float* dt_bias, int rows, int key_heads, int value_heads,
                             int dk, int dv) {
    wait_for_producers();
    gdn_recurrence(out, state, qkv, GdnRawGates{b_in, a_in, a_log, dt_bias, value_heads}, rows, key_heads,
                   value_heads, dk, dv);
}

extern "C" __global__ void __launch_bounds__(GDNW_WARPS * 32)
    gdn_recurrence_warp_f32(float* out, float* state, const float* qkv, const float* beta, const float* g, int rows,
                            int key_heads, int value_heads, int dk, int dv) {
    wait_for_producers();
    gdn_recurrence_warp(out, state, qkv, GdnGivenGates{beta, g, value_heads}, rows, key_heads, value_heads, dk, dv);
}

extern "C" __global__ void __launch_bounds__(GDNW_WARPS * 32)
    gdn_gated_recurrence_warp_f32(float* out, float* state, const float* qkv, const float* b_in, const float* a_in,
                                  const float* a_log, const float* dt_bias, int rows, int key_heads, int value_heads,
                                  int dk, int dv) {
    wait_for_producers();
    gdn_recurrence_warp(out, state, qkv, GdnRawGates{b_in, a_in, a_log, dt_bias, value_heads}, rows, key_heads,
                        value_heads, dk, dv);
}
