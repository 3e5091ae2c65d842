// Gated DeltaNet: the causal depthwise convolution with its window state (src/ops/conv.rs is the
// reference), the gates and the delta-rule recurrence (src/ops/gdn.rs is the reference).
#include "common.cuh"
#include "vec.cuh"

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

// The same sums for many rows (prefill), without a division an element: a thread per channel
// (consecutive threads, consecutive channels) over a run of CONV_ROWS rows (blockIdx.y), its
// kernel <= CONV_MAX_TAPS weights in registers (4 blocks of 256 a multiprocessor: the bounds keep
// ptxas from unrolling the taps into 92 registers). The window is only read, as above.
#define CONV_MAX_TAPS 8
#define CONV_ROWS 16
extern "C" __global__ void __launch_bounds__(256, 4)
    causal_conv_rows_f32(float* y, const float* x, const float* window, const float* w, long rows, long width,
                         int kernel, int dilation, int silu) {
    wait_for_producers();
    const long past = (long)(kernel - 1) * dilation;
    for (long c = blockIdx.x * (long)blockDim.x + threadIdx.x; c < width; c += (long)gridDim.x * blockDim.x) {
        float wc[CONV_MAX_TAPS];
#pragma unroll
        for (int j = 0; j < CONV_MAX_TAPS; j++) wc[j] = j < kernel ? w[c * kernel + j] : 0.0f;
        for (long t0 = (long)blockIdx.y * CONV_ROWS; t0 < rows; t0 += (long)gridDim.y * CONV_ROWS) {
            const long t_end = min(rows, t0 + CONV_ROWS);
            for (long t = t0; t < t_end; t++) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < CONV_MAX_TAPS; j++) {
                    if (j < kernel) {
                        const long r = past + t - (long)(kernel - 1 - j) * dilation;  // row of ext, >= 0
                        const float v = r < past ? window[r * width + c] : x[(r - past) * width + c];
                        acc += wc[j] * v;
                    }
                }
                y[t * width + c] = silu ? silu_f32(acc) : acc;
            }
        }
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

// Before the wait (decode: one row, dilation 1): channel c's window rows and taps into
// registers. Only this node writes the window, in earlier steps (kernels/common.cuh); read
// through L2 only (__ldcg), so that no line an earlier kernel left in L1 is read.
__device__ __forceinline__ void conv_load_own_state(float* win, float* wc, const float* window, const float* w,
                                                    long c, long width, int kernel, bool early) {
#pragma unroll
    for (int j = 0; j < CONV_MAX_TAPS; j++) {
        win[j] = early && j < kernel - 1 ? __ldcg(window + j * width + c) : 0.0f;
        wc[j] = early && j < kernel ? w[c * kernel + j] : 0.0f;
    }
}

// One row of one channel, dilation 1: Σ_j wc[j] · ext[j] over the kernel's taps in order, ext = the
// channel's kernel - 1 window rows (oldest first), then the row's input xc (the sums of
// causal_conv_reference_f32, in the same order). The fused recurrence (gdn_conv_normed_recurrence_f32)
// takes the same, so that it gives causal_conv_step_f32's bits.
__device__ __forceinline__ float conv_row_sum(const float* win, const float* wc, float xc, int kernel) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < CONV_MAX_TAPS; j++)
        if (j < kernel) acc += wc[j] * (j < kernel - 1 ? win[j] : xc);
    return acc;
}

// The channel's window past a row of input xc: each row moves up one, xc comes in last (ascending
// p: win[p + 1] is read before it is overwritten; the indices are constants once unrolled).
__device__ __forceinline__ void conv_shift(float* win, float xc, int kernel) {
#pragma unroll
    for (int p = 0; p < CONV_MAX_TAPS - 1; p++)
        if (p < kernel - 1) win[p] = p + 1 < kernel - 1 ? win[p + 1] : xc;
}

// A few rows (decode): the convolution and the window's shift in one kernel, a thread per channel
// over the rows in order (the same sums as causal_conv_reference_f32); the thread reads its
// channel's old window rows before it overwrites them, and no other thread touches the channel.
// One row of dilation 1 (decode) takes each thread's first channel from registers filled before
// the wait (the same sums in the same order); other channels and shapes read memory after it.
extern "C" __global__ void causal_conv_step_f32(float* y, float* window, const float* x, const float* w, long rows,
                                                long width, int kernel, int dilation, int silu) {
    // A decode step's GDN recurrence follows: its blocks load their 64 KB of state before their
    // wait, which only begins once they are resident. Released early, they start on the SMs
    // the input projection frees during its last wave (common.cuh).
    release_dependents_early();
    const long past = (long)(kernel - 1) * dilation;
    const long c0 = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    const bool early = rows == 1 && dilation == 1 && kernel <= CONV_MAX_TAPS && c0 < width;
    float win[CONV_MAX_TAPS], wc[CONV_MAX_TAPS];
    conv_load_own_state(win, wc, window, w, c0, width, kernel, early);
    wait_for_producers();
    if (early) {
        const float xc = x[c0];
        const float acc = conv_row_sum(win, wc, xc, kernel);
        y[c0] = silu ? silu_f32(acc) : acc;
#pragma unroll
        for (int p = 0; p < CONV_MAX_TAPS; p++)
            if (p < kernel - 1) window[p * width + c0] = p + 1 < kernel - 1 ? win[p + 1] : xc;
    }
    for (long c = early ? c0 + stride : c0; c < width; c += stride) {
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
// differently: tests/gpu_gdn.rs holds both to the CPU reference). Each reads two values a
// (token, head), `first` and `second` ([rows, Vh]), and `form`s the gates from them.
struct GdnGivenGates {
    const float *first, *second;  // beta, g
    int value_heads;
    __device__ __forceinline__ void form(int h, float x0, float x1, float& b, float& gt) const {
        b = x0;
        gt = x1;
    }
    __device__ __forceinline__ void operator()(int t, int h, float& b, float& gt) const {
        const long i = (long)t * value_heads + h;
        form(h, first[i], second[i], b, gt);
    }
};

struct GdnRawGates {
    const float *first, *second;  // b, a
    const float *a_log, *dt_bias;
    int value_heads;
    __device__ __forceinline__ void form(int h, float x0, float x1, float& b, float& gt) const {
        b = sigmoid_f32(x0);
        gt = -expf(a_log[h]) * softplus_f32(x1 + dt_bias[h]);
    }
    __device__ __forceinline__ void operator()(int t, int h, float& b, float& gt) const {
        const long i = (long)t * value_heads + h;
        form(h, first[i], second[i], b, gt);
    }
};

// ---------------------------------------------------------------------------------------------
// The warp layouts (dk ≤ GDNW_MAX_DK). A lane holds 2 columns x ROWS contiguous rows of a head's
// state: its row group is lane % GROUPS (GROUPS = GDNW_MAX_DK / ROWS), its column pair lane /
// GROUPS, so a warp holds 2 · 32 / GROUPS columns. A token costs a lane ROWS / 4 float4 reads of
// k and of q from rows staged with 4 floats of padding after each group (a quarter warp's 8 row
// groups land in different banks); (Sᵀk)_j and (Sᵀq)_j are summed over the lane's rows in two
// partial sums a column, then over the GROUPS lanes of the column pair by a reduce-scatter (the
// lane bit GROUPS / 2 keeps one column of the pair: one shuffle, then log2(GROUPS) - 1), and one
// more shuffle shares u within the pair. Rows ≥ dk hold zeros in the state and in the staged q
// and k, so they add nothing; columns ≥ dv get u = 0 and are never stored.
#define GDNW_MAX_DK 128

template <int GROUPS>
struct GdnLanes {
    static constexpr int ROWS = GDNW_MAX_DK / GROUPS;
    static constexpr int COLS = 2 * (32 / GROUPS);           // a warp's columns
    static constexpr int STRIDE = GDNW_MAX_DK + 4 * GROUPS;  // a staged q or k row
    __device__ static int pad(int r) { return r + (r / ROWS) * 4; }

    // The sum over the row groups of column a (lanes with bit GROUPS / 2 clear) or b (set).
    __device__ static float reduce_pair(float a, float b, bool high) {
        float keep = high ? b : a;
        keep += __shfl_xor_sync(0xffffffffu, high ? a : b, GROUPS / 2);
#pragma unroll
        for (int off = GROUPS / 4; off > 0; off >>= 1) keep += __shfl_xor_sync(0xffffffffu, keep, off);
        return keep;
    }

    // The lane's ROWS rows from r0 of a staged q or k row, as float4s (vec.cuh's act_chunk).
    __device__ static void read_rows(float* dst, const float* staged, int r0) { act_chunk<ROWS>(staged + pad(r0), 0, dst); }

    // One token of the delta rule on the lane's columns s0, s1 (its rows from r0): decay, u from
    // (Sᵀk) (`v_mine`: v of the column this lane reduces; `mine`: that column is < dv), the
    // rank-1 update; returns (Sᵀq) of that column (the same in the GROUPS / 2 lanes that share
    // it). kn, qn: the token's staged k and q rows.
    __device__ static float step(float* s0, float* s1, const float* kn, const float* qn, int r0, float decay,
                                 float beta, float v_mine, bool mine, bool high) {
        float k[ROWS];
        read_rows(k, kn, r0);
        float pa[2] = {0.0f, 0.0f}, pb[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            s0[i] *= decay;
            s1[i] *= decay;
            pa[i & 1] += s0[i] * k[i];
            pb[i & 1] += s1[i] * k[i];
        }
        const float sk = reduce_pair(pa[0] + pa[1], pb[0] + pb[1], high);
        const float u_mine = mine ? (v_mine - sk) * beta : 0.0f;
        const float u_other = __shfl_xor_sync(0xffffffffu, u_mine, GROUPS / 2);
        const float u0 = high ? u_other : u_mine, u1 = high ? u_mine : u_other;
        float q[ROWS];
        read_rows(q, qn, r0);
        float oa[2] = {0.0f, 0.0f}, ob[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            s0[i] += k[i] * u0;
            s1[i] += k[i] * u1;
            oa[i & 1] += s0[i] * q[i];
            ob[i & 1] += s1[i] * q[i];
        }
        return reduce_pair(oa[0] + oa[1], ob[0] + ob[1], high);
    }

    // A token's q (or k) of one key head, l2-normalised by the warp (times `scale`) into a staged
    // row; channels ≥ dk are zero.
    __device__ static void stage_normalised(float* dst, const float* src, int dk, float scale, int lane) {
        float x[GDNW_MAX_DK / 32], ss = 0.0f;
#pragma unroll
        for (int m = 0; m < GDNW_MAX_DK / 32; m++) {
            const int c = lane + 32 * m;
            x[m] = c < dk ? src[c] : 0.0f;
            ss += x[m] * x[m];
        }
        const float inv = 1.0f / sqrtf(warp_sum(ss) + 1e-6f);
#pragma unroll
        for (int m = 0; m < GDNW_MAX_DK / 32; m++) dst[pad(lane + 32 * m)] = x[m] * inv * scale;
    }

    // Whether the lane's column pair is read and written as one float2 (8-byte aligned: both
    // columns live, j even, rows of even length): half the load and store instructions, and a
    // warp's access to a row's sector is one request instead of two.
    __device__ static bool paired(const float* S, int j, int dv) {
        return j + 1 < dv && (dv & 1) == 0 && (j & 1) == 0 && (reinterpret_cast<unsigned long long>(S) & 7) == 0;
    }

    // The lane's ROWS rows of its column pair (zeros past dk and dv); THROUGH_L2: with __ldcg.
    template <bool THROUGH_L2>
    __device__ static void load_rows(float* s0, float* s1, const float* S, int r0, int j, int dk, int dv) {
        const bool pair = paired(S, j, dv);
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            const bool row = r0 + i < dk;
            const float* p = S + (long)(r0 + i) * dv + j;
            if (pair) {
                const float2* p2 = reinterpret_cast<const float2*>(p);
                const float2 v = row ? (THROUGH_L2 ? __ldcg(p2) : *p2) : make_float2(0.0f, 0.0f);
                s0[i] = v.x;
                s1[i] = v.y;
            } else {
                s0[i] = (row && j < dv) ? (THROUGH_L2 ? __ldcg(p) : *p) : 0.0f;
                s1[i] = (row && j + 1 < dv) ? (THROUGH_L2 ? __ldcg(p + 1) : p[1]) : 0.0f;
            }
        }
    }

    __device__ static void load_state(float* s0, float* s1, const float* S, int r0, int j, int dk, int dv) {
        load_rows<false>(s0, s1, S, r0, j, dk, dv);
    }

    // As load_state, for a kernel that reads its state before its wait: through L2 only
    // (__ldcg), so that no line an earlier kernel left in this multiprocessor's L1 is read.
    __device__ static void load_own_state(float* s0, float* s1, const float* S, int r0, int j, int dk, int dv) {
        load_rows<true>(s0, s1, S, r0, j, dk, dv);
    }

    __device__ static void store_state(const float* s0, const float* s1, float* S, int r0, int j, int dk, int dv) {
        const bool pair = paired(S, j, dv);
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
            if (r0 + i < dk) {
                if (pair) {
                    *reinterpret_cast<float2*>(S + (long)(r0 + i) * dv + j) = make_float2(s0[i], s1[i]);
                } else {
                    if (j < dv) S[(long)(r0 + i) * dv + j] = s0[i];
                    if (j + 1 < dv) S[(long)(r0 + i) * dv + j + 1] = s1[i];
                }
            }
        }
    }
};

// The many-token scan (`_warp`): a block per (value head, GDNW_WARPS · COLS columns), the tokens'
// inputs staged in shared memory a chunk of GDNW_T tokens at a time. A many-token scan is a chain
// of tokens; what lies on the chain is only the state's own arithmetic: the block copies chunk
// c + 1's q, k, its v columns and gate inputs into `raw` (cp.async, 16 bytes where the rows
// allow) while its warps run chunk c, then normalises q and k (a warp a token), forms the gates
// and copies v into the chunk buffers: two block barriers a chunk, none a token. Lanes of 8 rows
// (16 row groups, 4 columns a warp): twice the warps of 16-row lanes, each with half the chain a
// token, as the scan is latency-bound (docs/decisions/0017-gdn-layouts.md).
#define GDNW_GROUPS 16
#define GDNW_WARPS 4
#define GDNW_T 16

template <typename Gates>
__device__ __forceinline__ void gdn_recurrence_warp(float* out, float* state, const float* qkv, Gates gates, int rows,
                                                    int key_heads, int value_heads, int dk, int dv) {
    using L = GdnLanes<GDNW_GROUPS>;
    constexpr int BCOLS = GDNW_WARPS * L::COLS;
    // Chunk c + 1 as it arrives.
    __shared__ __align__(16) float raw_qk[GDNW_T][2 * GDNW_MAX_DK];
    __shared__ __align__(16) float raw_v[GDNW_T][BCOLS];
    __shared__ float raw_g[GDNW_T][2];
    // Chunk c as the warps read it.
    __shared__ __align__(16) float qn[GDNW_T][L::STRIDE];
    __shared__ __align__(16) float kn[GDNW_T][L::STRIDE];
    __shared__ float vs[GDNW_T][BCOLS];
    __shared__ float beta_s[GDNW_T], decay_s[GDNW_T];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x;
    const int kh = h / (value_heads / key_heads);
    const int jb = blockIdx.y * BCOLS;  // the block's first column
    const int r0 = (lane % GDNW_GROUPS) * L::ROWS;
    const bool high = (lane & (GDNW_GROUPS / 2)) != 0;  // which column of the pair this lane reduces and stores
    const int jl = warp * L::COLS + (lane / GDNW_GROUPS) * 2;  // the pair's first column in the block
    const int j = jb + jl;
    const bool mine = j + (high ? 1 : 0) < dv;
    const int bcols = min(BCOLS, dv - jb);
    const long key_dim = (long)key_heads * dk;
    const long width = 2 * key_dim + (long)value_heads * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    float* S = state + (long)h * dk * dv;
    // 16-byte copies where every row and offset is whole float4s.
    const bool quads = dk % 4 == 0 && dv % 4 == 0 && width % 4 == 0 && bcols % 4 == 0 &&
                       (reinterpret_cast<unsigned long long>(qkv) & 15) == 0;

    float s0[L::ROWS], s1[L::ROWS];
    L::load_state(s0, s1, S, r0, j, dk, dv);

    // Chunk [t0, t0 + n) into raw_*: q and k of key head kh, the block's v columns, the gate
    // inputs of head h.
    const auto fetch = [&](int t0, int n) {
        if (quads) {
            const int qk4 = dk / 2, v4 = bcols / 4;  // float4s a token: q and k, v
            for (int e = tid; e < n * qk4; e += blockDim.x) {
                const int tok = e / qk4, c = 4 * (e - tok * qk4);
                const float* row = qkv + (long)(t0 + tok) * width;
                cp_async16(shared_addr(&raw_qk[tok][c]), row + (c < dk ? kh * dk + c : key_dim + kh * dk + (c - dk)),
                           true);
            }
            for (int e = tid; e < n * v4; e += blockDim.x) {
                const int tok = e / v4, c = 4 * (e - tok * v4);
                cp_async16(shared_addr(&raw_v[tok][c]),
                           qkv + (long)(t0 + tok) * width + 2 * key_dim + (long)h * dv + jb + c, true);
            }
        } else {
            for (int e = tid; e < n * 2 * dk; e += blockDim.x) {
                const int tok = e / (2 * dk), c = e - tok * 2 * dk;
                const float* row = qkv + (long)(t0 + tok) * width;
                cp_async4(&raw_qk[tok][c], row + (c < dk ? kh * dk + c : key_dim + kh * dk + (c - dk)));
            }
            for (int e = tid; e < n * bcols; e += blockDim.x) {
                const int tok = e / bcols, c = e - tok * bcols;
                cp_async4(&raw_v[tok][c], qkv + (long)(t0 + tok) * width + 2 * key_dim + (long)h * dv + jb + c);
            }
        }
        for (int e = tid; e < 2 * n; e += blockDim.x) {
            const long i = (long)(t0 + e / 2) * value_heads + h;
            cp_async4(&raw_g[e / 2][e & 1], (e & 1) ? gates.second + i : gates.first + i);
        }
        cp_async_commit();
    };

    if (rows > 0) fetch(0, min(GDNW_T, rows));
    for (int t0 = 0; t0 < rows; t0 += GDNW_T) {
        const int n = min(GDNW_T, rows - t0);
        // Chunk c has landed, and every warp is past chunk c - 1 (its reads of qn, kn, vs, gates).
        cp_async_wait_all();
        __syncthreads();
        for (int tok = warp; tok < n; tok += GDNW_WARPS) {
            L::stage_normalised(qn[tok], raw_qk[tok], dk, scale, lane);
            L::stage_normalised(kn[tok], raw_qk[tok] + dk, dk, 1.0f, lane);
        }
        for (int e = tid; e < n * BCOLS; e += blockDim.x) {
            const int tok = e / BCOLS, c = e - tok * BCOLS;
            vs[tok][c] = c < bcols ? raw_v[tok][c] : 0.0f;
        }
        if (tid < n) {
            float b, gt;
            gates.form(h, raw_g[tid][0], raw_g[tid][1], b, gt);
            beta_s[tid] = b;
            decay_s[tid] = expf(gt);
        }
        __syncthreads();
        // raw_* are free: the next chunk's copies run under this chunk's tokens.
        if (t0 + GDNW_T < rows) fetch(t0 + GDNW_T, min(GDNW_T, rows - t0 - GDNW_T));
        if (jb + warp * L::COLS < dv) {
            for (int tok = 0; tok < n; tok++) {
                const float o = L::step(s0, s1, kn[tok], qn[tok], r0, decay_s[tok], beta_s[tok],
                                        vs[tok][jl + (high ? 1 : 0)], mine, high);
                if ((lane & (GDNW_GROUPS / 2 - 1)) == 0 && mine)
                    out[(long)(t0 + tok) * value_heads * dv + (long)h * dv + j + (high ? 1 : 0)] = o;
            }
        }
    }
    L::store_state(s0, s1, S, r0, j, dk, dv);
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

// ---------------------------------------------------------------------------------------------
// The gated recurrence with the output norm as its epilogue (`Op::GdnNormedRecurrence`, decode-
// sized steps): one block per value head, a warp per 8 columns of its state (GdnLanes<8>: 2
// columns x 16 rows a lane; blockDim.x = 32 · ceil(dv / 8), dv ≤ GDNN_MAX_DV, dk ≤ GDNW_MAX_DK).
// The norm needs the head's dv outputs of a token together, hence the whole head in one block.
// Tokens go GDNN_T at a time:
//   1. (barrier) the chunk's q and k normalised into shared memory (a warp a token's q or k),
//      its v columns copied, its gates formed from b, a (GdnRawGates);
//   2. (barrier) each warp runs the chunk's tokens over its columns; o goes to shared memory;
//   3. (barrier) a warp a token: o's sum of squares over the head, then
//      out = o · rsqrt(mean + eps) · w · act(z), as gated_rms_norm_reference_f32 (kernels/layout.cu).
// Every shared buffer is written only past a barrier that follows its last reads: qn, kn, vs and
// the gates (read in 2) and os (read in 3) are next written in 1 and 2 of the next chunk.
#define GDNN_GROUPS 8
#define GDNN_MAX_DV 128
#define GDNN_MAX_THREADS (GDNN_MAX_DV / (2 * 32 / GDNN_GROUPS) * 32)
#define GDNN_T 8

using GdnnLanes = GdnLanes<GDNN_GROUPS>;

// The lane's first state row and its column pair's first column.
__device__ __forceinline__ int gdnn_row0(int lane) { return (lane % GDNN_GROUPS) * GdnnLanes::ROWS; }
__device__ __forceinline__ int gdnn_col0(int lane, int warp) {
    return warp * GdnnLanes::COLS + (lane / GDNN_GROUPS) * 2;
}

// Where the normed recurrence reads a token's q and k (key head kh) and v (value head h): token
// t's row at base + t · stride, q, k and v at those offsets in it. The conv output in global
// memory (gdn_normed_recurrence_f32), or the block's own convolution in shared memory
// (gdn_conv_normed_recurrence_f32).
struct GdnHeadRows {
    const float* base;
    long stride;
    long q, k, v;
    __device__ __forceinline__ const float* row(int t) const { return base + (long)t * stride; }
};

// The normed recurrence's tokens (the steps above) over the lane's state s0, s1 (rows from
// gdnn_row0, columns from gdnn_col0), which the kernel loads before and stores after.
__device__ __forceinline__ void gdn_normed_tokens(float* s0, float* s1, float* out, const GdnHeadRows src,
                                                  const GdnRawGates gates, const float* z, const float* norm_w,
                                                  int rows, int value_heads, int dk, int dv, int use_sigmoid,
                                                  float eps) {
    using L = GdnnLanes;
    __shared__ __align__(16) float qn[GDNN_T][L::STRIDE];
    __shared__ __align__(16) float kn[GDNN_T][L::STRIDE];
    __shared__ float vs[GDNN_T][GDNN_MAX_DV];
    __shared__ float os[GDNN_T][GDNN_MAX_DV];
    __shared__ float beta_s[GDNN_T], decay_s[GDNN_T];
    // The norm's gate inputs z and weight, copied (cp.async) with step 1's loads rather than
    // loaded in step 3, after the recurrence: one round trip to memory fewer a chunk.
    __shared__ float zs[GDNN_T][GDNN_MAX_DV];
    __shared__ float norm_s[GDNN_MAX_DV];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const int h = blockIdx.x;
    const int r0 = gdnn_row0(lane);
    const bool high = (lane & (GDNN_GROUPS / 2)) != 0;  // which column of the pair this lane reduces and stores
    const int jm = gdnn_col0(lane, warp) + (high ? 1 : 0);  // the column this lane reduces
    const bool mine = jm < dv;
    const long out_width = (long)value_heads * dv;
    const float scale = 1.0f / sqrtf((float)dk);

    for (int t0 = 0; t0 < rows; t0 += GDNN_T) {
        const int n = min(GDNN_T, rows - t0);
        __syncthreads();
        // 1. q (even tasks) and k (odd) of each token, l2-normalised, q also scaled. The v
        // columns of head h, and the gates.
        for (int e = warp; e < 2 * n; e += warps) {
            const int tok = e >> 1;
            const bool is_k = (e & 1) != 0;
            const float* qk = src.row(t0 + tok) + (is_k ? src.k : src.q);
            L::stage_normalised(is_k ? kn[tok] : qn[tok], qk, dk, is_k ? 1.0f : scale, lane);
        }
        for (int e = tid; e < n * dv; e += blockDim.x) {
            const int tok = e / dv, c = e - tok * dv;
            vs[tok][c] = src.row(t0 + tok)[src.v + c];
        }
        for (int e = tid; e < n * dv; e += blockDim.x) {
            const int tok = e / dv, c = e - tok * dv;
            cp_async4(&zs[tok][c], z + (long)(t0 + tok) * out_width + (long)h * dv + c);
        }
        if (t0 == 0)
            for (int c = tid; c < dv; c += blockDim.x) cp_async4(&norm_s[c], norm_w + c);
        cp_async_commit();
        if (tid < n) {
            float b, gt;
            gates(t0 + tid, h, b, gt);
            beta_s[tid] = b;
            decay_s[tid] = expf(gt);
        }
        __syncthreads();
        // 2. The recurrence over this warp's columns; o into os.
        for (int tok = 0; tok < n; tok++) {
            const float o = L::step(s0, s1, kn[tok], qn[tok], r0, decay_s[tok], beta_s[tok], mine ? vs[tok][jm] : 0.0f,
                                    mine, high);
            if ((lane & (GDNN_GROUPS / 2 - 1)) == 0 && mine) os[tok][jm] = o;
        }
        cp_async_wait_all();  // this thread's copies of z and the norm weight; the barrier: everyone's
        __syncthreads();
        // 3. The norm of each token's dv outputs, a warp a token.
        for (int tok = warp; tok < n; tok += warps) {
            float x[GDNN_MAX_DV / 32], ss = 0.0f;
#pragma unroll
            for (int m = 0; m < GDNN_MAX_DV / 32; m++) {
                const int c = lane + 32 * m;
                x[m] = c < dv ? os[tok][c] : 0.0f;
                ss += x[m] * x[m];
            }
            const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)dv + eps);
            const long base = (long)(t0 + tok) * out_width + (long)h * dv;
#pragma unroll
            for (int m = 0; m < GDNN_MAX_DV / 32; m++) {
                const int c = lane + 32 * m;
                if (c < dv) {
                    const float g = zs[tok][c];
                    const float a = use_sigmoid ? sigmoid_f32(g) : silu_f32(g);
                    out[base + c] = x[m] * inv * norm_s[c] * a;
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(GDNN_MAX_THREADS)
    gdn_normed_recurrence_f32(float* out, float* state, const float* qkv, const float* b_in, const float* a_in,
                              const float* a_log, const float* dt_bias, const float* z, const float* norm_w, int rows,
                              int key_heads, int value_heads, int dk, int dv, int use_sigmoid, float eps) {
    using L = GdnnLanes;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x;
    const int kh = h / (value_heads / key_heads);
    const int r0 = gdnn_row0(lane), j = gdnn_col0(lane, warp);
    const long key_dim = (long)key_heads * dk;
    const long head_state = (long)h * dk * dv;

    // Before the wait, so that its loads overlap the kernel ahead: only this node writes the
    // state, in earlier steps (kernels/common.cuh, src/exec/cuda/kernels.rs's test).
    float s0[L::ROWS], s1[L::ROWS];
    L::load_own_state(s0, s1, state + head_state, r0, j, dk, dv);
    wait_for_producers();
    const GdnHeadRows src{qkv, 2 * key_dim + (long)value_heads * dv, (long)kh * dk, key_dim + (long)kh * dk,
                          2 * key_dim + (long)h * dv};
    gdn_normed_tokens(s0, s1, out, src, GdnRawGates{b_in, a_in, a_log, dt_bias, value_heads}, z, norm_w, rows,
                      value_heads, dk, dv, use_sigmoid, eps);
    L::store_state(s0, s1, state + head_state, r0, j, dk, dv);
}

// ---------------------------------------------------------------------------------------------
// GDN's causal convolution (dilation 1, SiLU: qkv_conv) folded into the normed recurrence
// (`Op::GdnConvNormedRecurrence`, steps of up to GDNN_T rows): causal_conv_step_f32's launch is
// gone. Block h (value head h of key head kh = h / G, G = Vh / Kh) convolves the channels it
// reads from the raw projection qkv: q and k of key head kh (2·dk channels, the same in the G
// blocks of kh) and its own v (dv channels); a thread per channel, over the rows in order, with
// the channel's window and taps in registers (conv_row_sum, conv_shift: causal_conv_step_f32's
// sums in its order, so its bits), the SiLU'd outputs into shared memory (cx), where
// gdn_normed_tokens reads them. The thread's first channel's window and taps are loaded before
// the wait (only this node writes the window, in earlier steps); other channels after it.
//
// Each channel's window is written once, after every read of it. A v channel's by its block
// (the only one that reads it), once convolved. Key head kh's q and k channels are read by its
// G blocks, so only one writes them, and only once all G have read them (nothing else orders one
// block's reads before another's writes: a grid's blocks run in no set order, some perhaps only
// after others have finished): each block, past its reads, adds 1 to counters[kh] (fenced), and
// the block that brings it to G writes them (every block forms the same next rows of q and k, in
// shared memory: qk_next) and sets it back to 0 for the next launch, which runs after this one.
// An arrival counter rather than a cluster barrier: a cluster of G blocks waits for G free
// multiprocessors of one GPC at once, so it starts only once the projection ahead has drained
// (docs/decisions/0018-gdn-conv-stays-its-own-kernel.md).
#define GDNC_CHANNELS (2 * GDNW_MAX_DK + GDNN_MAX_DV)

// Channel e of block h as a column of qkv: q (e < dk), then k (e < 2·dk) of key head kh, then v
// of value head h.
__device__ __forceinline__ long gdnc_column(int e, int dk, int dv, int kh, int h, long key_dim) {
    return e < dk       ? (long)kh * dk + e
           : e < 2 * dk ? key_dim + (long)kh * dk + (e - dk)
                        : 2 * key_dim + (long)h * dv + (e - 2 * dk);
}

extern "C" __global__ void __launch_bounds__(GDNN_MAX_THREADS)
    gdn_conv_normed_recurrence_f32(float* out, float* window, float* state, const float* qkv, const float* conv_w,
                                   const float* b_in, const float* a_in, const float* a_log, const float* dt_bias,
                                   const float* z, const float* norm_w, unsigned* counters, int rows, int key_heads,
                                   int value_heads, int dk, int dv, int kernel, int use_sigmoid, float eps) {
    using L = GdnnLanes;
    __shared__ float cx[GDNN_T][GDNC_CHANNELS];
    __shared__ float qk_next[CONV_MAX_TAPS - 1][2 * GDNW_MAX_DK];
    __shared__ int writes_qk_s;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int h = blockIdx.x;
    const int group = value_heads / key_heads;
    const int kh = h / group;
    const int r0 = gdnn_row0(lane), j = gdnn_col0(lane, warp);
    const long key_dim = (long)key_heads * dk;
    const long width = 2 * key_dim + (long)value_heads * dv;
    const long head_state = (long)h * dk * dv;
    const int channels = 2 * dk + dv;
    const long c0 = gdnc_column(tid, dk, dv, kh, h, key_dim);

    // Before the wait: the recurrence's state, the first channel's window and taps.
    float s0[L::ROWS], s1[L::ROWS];
    L::load_own_state(s0, s1, state + head_state, r0, j, dk, dv);
    float win[CONV_MAX_TAPS], wc[CONV_MAX_TAPS];
    conv_load_own_state(win, wc, window, conv_w, c0, width, kernel, tid < channels);
    wait_for_producers();

    for (int e = tid; e < channels; e += blockDim.x) {
        const long c = gdnc_column(e, dk, dv, kh, h, key_dim);
        if (e != tid) conv_load_own_state(win, wc, window, conv_w, c, width, kernel, true);
        for (int t = 0; t < rows; t++) {
            const float xc = qkv[(long)t * width + c];
            cx[t][e] = silu_f32(conv_row_sum(win, wc, xc, kernel));
            conv_shift(win, xc, kernel);
        }
        // win: the channel's window after the step.
#pragma unroll
        for (int p = 0; p < CONV_MAX_TAPS - 1; p++) {
            if (p < kernel - 1) {
                if (e >= 2 * dk)
                    window[p * width + c] = win[p];
                else
                    qk_next[p][e] = win[p];
            }
        }
    }
    // Every thread of the block has read all it reads of the window: the block arrives.
    __syncthreads();
    if (tid == 0) {
        bool last = true;
        if (group > 1) {
            __threadfence();
            last = atomicAdd(counters + kh, 1u) == (unsigned)(group - 1);
            if (last) counters[kh] = 0u;
        }
        writes_qk_s = last;
    }
    __syncthreads();
    const bool writes_qk = writes_qk_s != 0;

    const GdnHeadRows src{&cx[0][0], GDNC_CHANNELS, 0, dk, 2 * dk};
    gdn_normed_tokens(s0, s1, out, src, GdnRawGates{b_in, a_in, a_log, dt_bias, value_heads}, z, norm_w, rows,
                      value_heads, dk, dv, use_sigmoid, eps);
    L::store_state(s0, s1, state + head_state, r0, j, dk, dv);

    // Every block of key head kh has read its q and k windows: the last to arrive writes their
    // next rows (each thread the channels it convolved, so its own writes to qk_next).
    if (writes_qk) {
        for (int e = tid; e < 2 * dk; e += blockDim.x) {
            const long c = gdnc_column(e, dk, dv, kh, h, key_dim);
            for (int p = 0; p < kernel - 1; p++) window[p * width + c] = qk_next[p][e];
        }
    }
}
