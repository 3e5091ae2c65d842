// y = x · Wᵀ, W [n, k] row-major (src/ops/linear.rs is the reference).
// `linear_rows_*`: one warp per output row, every token of the step in the same warp, so each
// weight row is read from memory once per step. 16-byte weight loads when k allows, with
// LOADS_IN_FLIGHT of them issued before their products (a matrix-vector product is bound by the
// bytes in flight).
#include "common.cuh"
#include "vec.cuh"
#include "mma.cuh"

#define MAX_TOKENS 8

// One lane's share of the dot products of weight row `wr` with `nt` (≤ NT) token rows of
// `xt [*, k]`: acc[t] for t < nt (to be reduced over the warp). 16-byte weight loads when `vec`,
// LOADS_IN_FLIGHT of them issued before their products.
template <typename W, int NT>
__device__ __forceinline__ void row_dots(float* acc, const float* xt, const W* wr, long k, int nt, int lane, bool vec) {
    constexpr int N = WeightVec<W>::N;
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if (vec) {
        const long chunks = k / N;
        long i = lane;
        for (; i + 32 * (LOADS_IN_FLIGHT - 1) < chunks; i += 32 * LOADS_IN_FLIGHT) {
            float wv[LOADS_IN_FLIGHT][N];
#pragma unroll
            for (int u = 0; u < LOADS_IN_FLIGHT; u++) WeightVec<W>::chunk(wr, i + 32 * u, wv[u]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
#pragma unroll
                    for (int u = 0; u < LOADS_IN_FLIGHT; u++) {
                        float xv[N];
                        act_chunk<N>(xt + t * k, i + 32 * u, xv);
#pragma unroll
                        for (int j = 0; j < N; j++) acc[t] += wv[u][j] * xv[j];
                    }
                }
            }
        }
        for (; i < chunks; i += 32) {
            float wv[N];
            WeightVec<W>::chunk(wr, i, wv);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    float xv[N];
                    act_chunk<N>(xt + t * k, i, xv);
#pragma unroll
                    for (int j = 0; j < N; j++) acc[t] += wv[j] * xv[j];
                }
            }
        }
    } else {
        for (long i = lane; i < k; i += 32) {
            const float wi = WeightVec<W>::one(wr, i);
#pragma unroll
            for (int t = 0; t < NT; t++)
                if (t < nt) acc[t] += wi * xt[t * k + i];
        }
    }
}

// NT: the tokens a pass takes (accumulators per lane). Decode (one token) has its own NT = 1
// instantiation: 8 accumulators and their predicates cost registers, and registers bound the
// warps per multiprocessor, i.e. the loads in flight.
template <typename W, int NT>
__device__ __forceinline__ void linear_rows(float* y, const float* x, const W* w, int tokens, long k, long n) {
    constexpr int N = WeightVec<W>::N;
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    const bool vec = k % N == 0 && aligned16(x) && aligned16(w);
    for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < n; r += gridDim.x * warps_per_block) {
        for (int t0 = 0; t0 < tokens; t0 += NT) {
            const int nt = min(NT, tokens - t0);
            float acc[NT];
            row_dots<W, NT>(acc, x + t0 * k, w + r * k, k, nt, lane, vec);
            // Reduce only the tokens this pass has (nt is the same in the whole warp).
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float s = warp_sum(acc[t]);
                    if (lane == 0) y[(t0 + t) * n + r] = s;
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) linear_rows_f32(float* y, const float* x, const float* w, int tokens,
                                                                   long k, long n) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_rows<float, MAX_TOKENS>(y, x, w, tokens, k, n);
}

// bf16 weights (the trunk on the GPU), f32 activations and accumulation.
extern "C" __global__ void __launch_bounds__(256) linear_rows_bf16(float* y, const float* x, const bf16_t* w,
                                                                    int tokens, long k, long n) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_rows<bf16_t, MAX_TOKENS>(y, x, w, tokens, k, n);
}

// One token (decode).
extern "C" __global__ void __launch_bounds__(256) linear_rows1_f32(float* y, const float* x, const float* w, int tokens,
                                                                    long k, long n) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_rows<float, 1>(y, x, w, tokens, k, n);
}

extern "C" __global__ void __launch_bounds__(256) linear_rows1_bf16(float* y, const float* x, const bf16_t* w,
                                                                     int tokens, long k, long n) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_rows<bf16_t, 1>(y, x, w, tokens, k, n);
}

// The most 16-byte chunks of a row a lane holds in the streamed kernels
// (launch::linear::WHOLE_ROW_CHUNKS).
#define WHOLE_ROW_CHUNKS 10

// A row of a streamed matrix.
template <typename W>
struct StreamRow {
    const W* w;  // the row's first weight
    float* y;    // its output
};

// A lane's chunks of a row (short_chunks_load's chunks), loaded past L1
// (ld.global.nc.L1::no_allocate): ~160 KB of weights in flight an SM would otherwise evict x,
// which every row reads (docs/decisions/0007-streamed-loads-past-l1.md).
template <typename W>
__device__ __forceinline__ void stream_row_load(const W* row, long chunks, int lane, uint4* raw) {
    const uint4* p = reinterpret_cast<const uint4*>(row);
#pragma unroll
    for (int u = 0; u < WHOLE_ROW_CHUNKS; u++)
        if (lane + 32 * u < chunks)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(raw[u].x), "=r"(raw[u].y), "=r"(raw[u].z), "=r"(raw[u].w)
                         : "l"(p + lane + 32 * u));
}

// One token, a warp per row, the rows streamed by a persistent grid (`OneToken::Streamed`: two
// blocks a multiprocessor, every warp resident for the whole launch): a warp issues its next row's loads
// before the products of the row it holds, so that its bytes in flight never drain between
// rows, and no block is scheduled after the first. Rows v = first, first + stride, ... of
// `total`; row_of(v) gives row v's weights and output (one matrix here, a group's parts laid end
// to end in linear_parts1_stream). The sums are linear_rows1's, chunk by chunk in the same
// order: the same bits (docs/decisions/0006-streamed-lm-head.md).
template <typename W, typename RowOf>
__device__ __forceinline__ void stream_rows(const float* x, long k, long total, long first, RowOf row_of) {
    const long stride = gridDim.x * (long)(blockDim.x >> 5), chunks = k / WeightVec<W>::N;
    const int lane = threadIdx.x & 31;
    uint4 cur[WHOLE_ROW_CHUNKS], next[WHOLE_ROW_CHUNKS];
    StreamRow<W> row = row_of(first);
    if (first < total) stream_row_load<W>(row.w, chunks, lane, cur);
    for (long v = first; v < total; v += stride) {
        const StreamRow<W> after = row_of(v + stride);
        if (v + stride < total) stream_row_load<W>(after.w, chunks, lane, next);
        const float s = warp_sum(short_chunks_dot<W, WHOLE_ROW_CHUNKS>(x, cur, chunks, lane, 32));
        if (lane == 0) *row.y = s;
#pragma unroll
        for (int u = 0; u < WHOLE_ROW_CHUNKS; u++) cur[u] = next[u];
        row = after;
    }
}

#define ROWS1_STREAM_KERNEL(W, SUFFIX)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 2) linear_rows1_stream_##SUFFIX(float* y, const float* x, \
                                                                                      const W* w, long k, long n) { \
        prefetch_first_rows(w, k, n, blockDim.x >> 5);                                                        \
        wait_for_producers();                                                                                 \
        const long first = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);                         \
        stream_rows<W>(x, k, n, first, [&](long r) { return StreamRow<W>{w + r * k, y + r}; });              \
    }

ROWS1_STREAM_KERNEL(float, f32)
ROWS1_STREAM_KERNEL(bf16_t, bf16)

// linear_hc_write: out [T, C*n] = h + inj ⊗ (x·Wᵀ), the residual write of a block fused into its
// output projection (`ops::linear::linear_hc_write`): a warp per output row r as `linear_rows`,
// whose epilogue writes h[t, s, r] + inj[t, s] * y[t, r] for the C streams (product rounded
// before the add, as `hc_write`). MAX_TOKENS tokens a pass; one token takes the NT = 1 path
// (see linear_rows).
template <typename W, int NT>
__device__ __forceinline__ void linear_hc_write(float* out, const float* h, const float* inj, const float* x,
                                                const W* w, int tokens, long k, long n, int streams) {
    constexpr int N = WeightVec<W>::N;
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    const bool vec = k % N == 0 && aligned16(x) && aligned16(w);
    const long width = (long)streams * n;
    for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < n; r += gridDim.x * warps_per_block) {
        for (int t0 = 0; t0 < tokens; t0 += NT) {
            const int nt = min(NT, tokens - t0);
            float acc[NT];
            row_dots<W, NT>(acc, x + t0 * k, w + r * k, k, nt, lane, vec);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < nt) {
                    const float y = warp_sum(acc[t]);
                    const long tt = t0 + t;
                    for (int s = lane; s < streams; s += 32) {
                        const long o = tt * width + (long)s * n + r;
                        out[o] = h[o] + __fmul_rn(inj[tt * streams + s], y);
                    }
                }
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    linear_hc_write_reference_f32(float* out, const float* h, const float* inj, const float* x, const float* w,
                                  int tokens, long k, long n, int streams) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_hc_write<float, MAX_TOKENS>(out, h, inj, x, w, tokens, k, n, streams);
}

extern "C" __global__ void __launch_bounds__(256)
    linear_hc_write_reference_bf16(float* out, const float* h, const float* inj, const float* x, const bf16_t* w,
                                   int tokens, long k, long n, int streams) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_hc_write<bf16_t, MAX_TOKENS>(out, h, inj, x, w, tokens, k, n, streams);
}

// One token (decode): the single-accumulator instantiation, as linear_rows1.
extern "C" __global__ void __launch_bounds__(256)
    linear_hc_write1_f32(float* out, const float* h, const float* inj, const float* x, const float* w, int tokens,
                         long k, long n, int streams) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_hc_write<float, 1>(out, h, inj, x, w, tokens, k, n, streams);
}

extern "C" __global__ void __launch_bounds__(256)
    linear_hc_write1_bf16(float* out, const float* h, const float* inj, const float* x, const bf16_t* w, int tokens,
                          long k, long n, int streams) {
    prefetch_first_rows(w, k, n, blockDim.x >> 5);
    wait_for_producers();
    linear_hc_write<bf16_t, 1>(out, h, inj, x, w, tokens, k, n, streams);
}

// moe_shared_write: out [T, C*H] = h + inj ⊗ (a + sigmoid(x·wg) * (s·Wdᵀ)) — the MoE block's
// end (`ops::linear::moe_shared_write`): the shared expert's down projection Wd [H, I] (a warp
// per output row r, as linear_rows1: I is short), its gate (x [T, H]·wg [H], one per token, taken
// by each block) and the sum with the routed output a [T, H], written to the C streams as
// hc_write (the product rounded before the add). Token t is blockIdx.y.
// The shared expert's down projection of row r for token t (every lane of the warp gets it).
template <typename W>
__device__ __forceinline__ float moe_shared_row(const float* st, const W* wd, long r, long inter) {
    constexpr int N = WeightVec<W>::N;
    const bool vec = inter % N == 0 && aligned16(st) && aligned16(wd);
    float acc[1];
    row_dots<W, 1>(acc, st, wd + r * inter, inter, 1, threadIdx.x & 31, vec);
    return warp_sum(acc[0]);
}

// Chunks a thread takes of the gate's dot product (over the block) and a lane of a down row's
// (over the warp) on moe_shared_gate_row's short path: 2560 and 640 wide at the real shape.
#define MOE_SHARED_CHUNKS 3

// A thread's activation chunks first, first + stride, ... (< chunks, at most MAX) of a, loaded
// together, then their products with the weight chunks `raw` (short_chunks_load's) summed in
// chunk order: short_chunks_dot's sums, every activation load issued before the first product
// (short_chunks_dot's, between the products, were waited for one after another).
template <int N, int MAX>
__device__ __forceinline__ void short_acts_load(const float* a, long chunks, long first, long stride,
                                                float (&av)[MAX][N]) {
#pragma unroll
    for (int u = 0; u < MAX; u++)
        if (first + u * stride < chunks) act_chunk<N>(a, first + u * stride, av[u]);
}

template <typename W, int MAX>
__device__ __forceinline__ float short_held_dot(const float (&av)[MAX][WeightVec<W>::N], const uint4* raw,
                                                long chunks, long first, long stride) {
    constexpr int N = WeightVec<W>::N;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < MAX; u++) {
        if (first + u * stride < chunks) {
            float wv[N];
            WeightVec<W>::unpack(raw[u], wv);
#pragma unroll
            for (int j = 0; j < N; j++) acc += av[u][j] * wv[j];
        }
    }
    return acc;
}

// Whether moe_shared_gate_row takes the gate and a down row: both short (at most
// MOE_SHARED_CHUNKS chunks a thread of each) and in 16-byte chunks.
template <typename W>
__device__ __forceinline__ bool moe_shared_short(const float* xt, const float* wg, const float* st, const W* wd,
                                                 long hid, long inter) {
    constexpr int N = WeightVec<W>::N;
    return hid % 4 == 0 && aligned16(xt) && aligned16(wg) && hid / 4 <= MOE_SHARED_CHUNKS * (long)blockDim.x &&
           inter % N == 0 && aligned16(st) && aligned16(wd) && inter / N <= MOE_SHARED_CHUNKS * 32;
}

// The gate sigmoid(x·wg) (every thread) and row r's down projection (every lane of the warp),
// where moe_shared_short: everything loaded at once, the gate's weight and activation chunks and
// the row's weight chunks into registers, the token's s row into shared memory (cp.async, shared
// by the block's warps; no registers held; issued last, as the compiler puts its wait early).
// One round trip to memory, where the gate's loop (a chunk a round after the first), its block
// sum, then the row's loop took up to six. The same products in the same order as block_dot and
// moe_shared_row (strided_dot's and row_dots' chunk order; a product's factors commute exactly).
template <typename W>
__device__ __forceinline__ void moe_shared_gate_row(float& gate, float& shared, const float* xt, const float* wg,
                                                    const float* st, const W* wd, long r, long hid, long inter) {
    constexpr int N = WeightVec<W>::N, C = MOE_SHARED_CHUNKS;
    __shared__ __align__(16) float s_row[C * 32 * N];
    const long gate_chunks = hid / 4, row_chunks = inter / N, stride = blockDim.x;
    const int lane = threadIdx.x & 31;
    uint4 gate_raw[C], row_raw[C];
    float xv[C][4];
    short_chunks_load<W, C>(wd + r * inter, row_chunks, lane, 32, row_raw);
    short_chunks_load<float, C>(wg, gate_chunks, threadIdx.x, stride, gate_raw);
    short_acts_load<4, C>(xt, gate_chunks, threadIdx.x, stride, xv);
    for (long i = threadIdx.x; i < inter / 4; i += stride) cp_async16(shared_addr(s_row + 4 * i), st + 4 * i, true);
    cp_async_commit();
    const float g = short_held_dot<float, C>(xv, gate_raw, gate_chunks, threadIdx.x, stride);
    cp_async_wait_all();
    gate = sigmoid_f32(block_sum(g));  // its barrier makes every thread's copies of s visible
    shared = warp_sum(short_chunks_dot<W, C>(s_row, row_raw, row_chunks, lane, 32));
}

// Row r of token t's store inputs for this lane: a[t, r], and for lane c < C stream c's h and inj.
struct MoeSharedIn {
    float a, h, inj;
};

__device__ __forceinline__ MoeSharedIn moe_shared_in(const float* h, const float* inj, const float* a, long t, long r,
                                                     long hid, int streams) {
    const int c = threadIdx.x & 31;
    MoeSharedIn in{a[t * hid + r], 0.0f, 0.0f};
    if (c < streams) {
        in.h = h[t * streams * hid + (long)c * hid + r];
        in.inj = inj[t * streams + c];
    }
    return in;
}

// Row r of token t into the C streams: h + inj ⊗ (a + shared · gate), from `in` (loaded by
// moe_shared_in: a, h and inj at once, where the store's loop read h and inj only once the sum
// with a was formed, a round trip later); streams past 32 read here.
__device__ __forceinline__ void moe_shared_store(float* out, const float* h, const float* inj, const MoeSharedIn& in,
                                                 long t, long r, float gate, float shared, long hid, int streams) {
    const float y = in.a + shared * gate;
    const long width = (long)streams * hid;
    const int lane = threadIdx.x & 31;
    if (lane < streams) out[t * width + (long)lane * hid + r] = in.h + __fmul_rn(in.inj, y);
#pragma unroll 1
    for (int c = lane + 32; c < streams; c += 32) {
        const long o = t * width + (long)c * hid + r;
        out[o] = h[o] + __fmul_rn(inj[t * streams + c], y);
    }
}

// With inputs_ready (x and s are ready: the routed output a is the node ahead's) and a warp for
// every row, a block runs ahead (kernels/common.cuh): the gate and its warps' rows of the down
// projection before the wait, the sums and stores after it. Otherwise the first row's store
// inputs are loaded with the gate's and the row's chunks: one round trip to memory for all.
#define MOE_SHARED_WRITE_KERNEL(W, SUFFIX)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) moe_shared_write_reference_##SUFFIX(                    \
        float* out, const float* h, const float* inj, const float* x, const float* s, const float* a,         \
        const W* wd, const float* wg, long hid, long inter, int streams, int inputs_ready) {                  \
        prefetch_first_rows(wd, inter, hid, blockDim.x >> 5);                                                \
        const long t = blockIdx.y, warps = blockDim.x >> 5;                                                   \
        const long first = blockIdx.x * warps + (threadIdx.x >> 5), row = min(first, hid - 1);               \
        const bool ahead = inputs_ready && hid <= (long)gridDim.x * warps;                                    \
        wait_for_producers_unless(ahead);                                                                     \
        MoeSharedIn in{0.0f, 0.0f, 0.0f};                                                                     \
        float gate, shared;                                                                                   \
        if (moe_shared_short<W>(x + t * hid, wg, s + t * inter, wd, hid, inter)) {                           \
            if (!ahead) in = moe_shared_in(h, inj, a, t, row, hid, streams);                                 \
            moe_shared_gate_row<W>(gate, shared, x + t * hid, wg, s + t * inter, wd, row, hid, inter);       \
        } else {                                                                                              \
            gate = sigmoid_f32(block_dot(x + t * hid, wg, hid));                                              \
            shared = moe_shared_row<W>(s + t * inter, wd, row, inter);                                        \
            if (!ahead) in = moe_shared_in(h, inj, a, t, row, hid, streams);                                 \
        }                                                                                                     \
        if (ahead) {                                                                                          \
            wait_for_producers();                                                                             \
            in = moe_shared_in(h, inj, a, t, row, hid, streams);                                             \
        }                                                                                                     \
        if (first < hid) moe_shared_store(out, h, inj, in, t, first, gate, shared, hid, streams);            \
        for (long r = first + gridDim.x * warps; r < hid; r += gridDim.x * warps) {                          \
            const float shared_r = moe_shared_row<W>(s + t * inter, wd, r, inter);                            \
            moe_shared_store(out, h, inj, moe_shared_in(h, inj, a, t, r, hid, streams), t, r, gate, shared_r, \
                             hid, streams);                                                                   \
        }                                                                                                     \
    }

MOE_SHARED_WRITE_KERNEL(float, f32)
MOE_SHARED_WRITE_KERNEL(bf16_t, bf16)

// One token, G consecutive output rows per block, every thread of the block along k: thread t
// takes chunks t, t + blockDim, ... of the G rows (each activation chunk loaded once for all G),
// U chunks of each row in flight, and the G sums are reduced over the block. A warp per row
// (linear_rows1) runs few, long warps: 2560 rows fill a third of an H200, 10240 rows leave a
// partial second wave. Here the blocks are many and short, so the scheduler keeps every
// multiprocessor's loads in flight to the end. `epilogue(r, sum)` stores row r (lanes of warp 0
// call it together, each with the whole sum).
template <typename W, int G, int U, typename Epilogue>
__device__ __forceinline__ void linear_group1(const float* x, const W* w, long k, long n, long block, long blocks,
                                              Epilogue epilogue) {
    const int warp = threadIdx.x >> 5;
    for (long r0 = block * G; r0 < n; r0 += blocks * G) {
        const int here = (int)min((long)G, n - r0);
        float sums[G];
        block_dots<W, G, U>(x, [&](int g) { return w + (r0 + g) * k; }, k, here, sums);
        if (warp == 0) {
#pragma unroll
            for (int g = 0; g < G; g++)
                if (g < here) epilogue(r0 + g, sums[g]);
        }
    }
}

// linear_hc_write's one-token form on linear_group1's blocks: out[c, r] = h[c, r] + inj[c] * y[r]
// for the G rows of a block. Lane c of warp 0 loads its stream's h values of the G rows and
// inj[c] once the products are formed (block_dots' before_sums), all at once and in flight
// during the block's reduction. Loaded in the stores' loop, each row's loads waited behind the
// previous row's stores (out may be h, for all the compiler knows): G round trips to memory
// after the last weights (4 of the 7 of the 6144 -> 2560 projection). (Loaded before the
// products, they spilled registers at the 48 the bound allows.) Streams past 32 are read after
// the sums, as before. The same sums and products.
template <typename W, int G, int U>
__device__ __forceinline__ void linear_hc_write_group1(float* out, const float* h, const float* inj, const float* x,
                                                       const W* w, long k, long n, int streams) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool held = warp == 0 && lane < streams;  // this lane's stream c = lane, loaded ahead
    for (long r0 = blockIdx.x * (long)G; r0 < n; r0 += gridDim.x * (long)G) {
        const int here = (int)min((long)G, n - r0);
        float sums[G], hv[G], iv = 0.0f;
        block_dots<W, G, U>(x, [&](int g) { return w + (r0 + g) * k; }, k, here, sums, [&] {
#pragma unroll
            for (int g = 0; g < G; g++) hv[g] = held && g < here ? h[(long)lane * n + r0 + g] : 0.0f;
            if (held) iv = inj[lane];
        });
        if (warp == 0) {
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g < here) {
                    const long r = r0 + g;
                    if (held) out[(long)lane * n + r] = hv[g] + __fmul_rn(iv, sums[g]);
#pragma unroll 1
                    for (int c = lane + 32; c < streams; c += 32)
                        out[(long)c * n + r] = h[(long)c * n + r] + __fmul_rn(inj[c], sums[g]);
                }
            }
        }
    }
}

// Loads in flight per thread: U chunks of each of the G rows (about four in all).
// Blocks of 256 threads (launch::linear); enough of them resident a multiprocessor that its
// loads in flight cover the memory latency (the compiler keeps registers within the bound).
#define GROUP_BOUNDS __launch_bounds__(256, 5)
#define PARTS_BOUNDS __launch_bounds__(256, 6)

#define GROUP_KERNELS(G, U, W, SUFFIX)                                                                       \
    extern "C" __global__ void GROUP_BOUNDS linear_group1_g##G##u##U##_##SUFFIX(float* y, const float* x, const W* w, long k,     \
                                                              long n) {                                       \
        prefetch_first_rows(w, k, n, G);                                                                      \
        wait_for_producers();                                                                                 \
        linear_group1<W, G, U>(x, w, k, n, blockIdx.x, gridDim.x, [&](long r, float s) {                                             \
            if ((threadIdx.x & 31) == 0) y[r] = s;                                                            \
        });                                                                                                   \
    }                                                                                                         \
    extern "C" __global__ void GROUP_BOUNDS linear_hc_write_group1_g##G##u##U##_##SUFFIX(                                        \
        float* out, const float* h, const float* inj, const float* x, const W* w, long k, long n, int streams) { \
        prefetch_first_rows(w, k, n, G);                                                                      \
        wait_for_producers();                                                                                 \
        linear_hc_write_group1<W, G, U>(out, h, inj, x, w, k, n, streams);                                    \
    }

// (G, U): G rows a block, U chunks of each row in flight per thread (launch::linear's GROUPS,
// chosen per shape by OneToken::for_shape: docs/decisions/0005-one-token-linear-by-shape.md).
GROUP_KERNELS(1, 4, float, f32)
GROUP_KERNELS(2, 2, float, f32)
GROUP_KERNELS(4, 1, float, f32)
GROUP_KERNELS(1, 4, bf16_t, bf16)
GROUP_KERNELS(2, 2, bf16_t, bf16)
GROUP_KERNELS(4, 1, bf16_t, bf16)

// linear_group (one token): up to four matrices W_p [n_p, k] over the same x, in one launch (a
// horizontal fusion: GDN's four input projections, for one): part p gets ceil(n_p / 2) blocks
// of 2 rows each, in part order, and runs linear_group1 on them. The part is picked with
// selects, not an array indexed at run time (which would live in local memory).
#define GROUP_PART_ROWS 2

template <typename W>
struct Part {
    const W* w;
    float* y;
    long n;
    long block;   // this block's index within the part
    long blocks;  // the part's blocks
};

template <typename W>
__device__ __forceinline__ Part<W> part_of(const W* w0, const W* w1, const W* w2, const W* w3, float* y0,
                                           float* y1, float* y2, float* y3, long n0, long n1, long n2, long n3,
                                           int parts) {
    Part<W> p{w0, y0, n0, (long)blockIdx.x, (n0 + GROUP_PART_ROWS - 1) / GROUP_PART_ROWS};
    const W* ws[3] = {w1, w2, w3};
    float* ys[3] = {y1, y2, y3};
    const long ns[3] = {n1, n2, n3};
#pragma unroll
    for (int q = 0; q < 3; q++) {
        if (q + 1 < parts && p.block >= p.blocks) {
            p.block -= p.blocks;
            p.w = ws[q];
            p.y = ys[q];
            p.n = ns[q];
            p.blocks = (ns[q] + GROUP_PART_ROWS - 1) / GROUP_PART_ROWS;
        }
    }
    return p;
}

// The rows block b reads first, into L2 before the wait.
template <typename W>
__device__ __forceinline__ void prefetch_part_rows(const Part<W>& p, long k) {
    const long r0 = p.block * GROUP_PART_ROWS;
    if (threadIdx.x == 0 && r0 < p.n)
        prefetch_weights(p.w + r0 * k, min((long)GROUP_PART_ROWS, p.n - r0) * k * (long)sizeof(W));
}

#define PARTS_KERNEL(W, SUFFIX)                                                                               \
    extern "C" __global__ void PARTS_BOUNDS linear_parts1_##SUFFIX(float* y0, float* y1, float* y2, float* y3, const float* x, \
                                                      const W* w0, const W* w1, const W* w2, const W* w3,       \
                                                      long n0, long n1, long n2, long n3, int parts, long k) {  \
        const Part<W> p = part_of<W>(w0, w1, w2, w3, y0, y1, y2, y3, n0, n1, n2, n3, parts);                  \
        prefetch_part_rows<W>(p, k);                                                                          \
        wait_for_producers();                                                                                 \
        float* y = p.y;                                                                                       \
        linear_group1<W, GROUP_PART_ROWS, 2>(x, p.w, k, p.n, p.block, p.blocks, [&](long r, float s) {        \
            if ((threadIdx.x & 31) == 0) y[r] = s;                                                            \
        });                                                                                                   \
    }

PARTS_KERNEL(float, f32)
PARTS_KERNEL(bf16_t, bf16)

// linear_parts1 by a persistent grid (`launch::linear::GroupKernel::Streamed`): the parts' rows
// laid end to end and streamed as linear_rows1_stream streams one matrix's (stream_rows; rows of
// at most WHOLE_ROW_CHUNKS chunks a lane). Row v's weights and output by selects.
template <typename W>
__device__ __forceinline__ StreamRow<W> part_row(long v, const W* w0, const W* w1, const W* w2, const W* w3,
                                                 float* y0, float* y1, float* y2, float* y3, long n0, long n1,
                                                 long n2, int parts, long k) {
    const W* w = w0;
    float* y = y0;
    long r = v;
    if (parts > 1 && r >= n0) {
        w = w1, y = y1, r -= n0;
        if (parts > 2 && r >= n1) {
            w = w2, y = y2, r -= n1;
            if (parts > 3 && r >= n2) w = w3, y = y3, r -= n2;
        }
    }
    return StreamRow<W>{w + r * k, y + r};
}

#define PARTS_STREAM_KERNEL(W, SUFFIX)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 2) linear_parts1_stream_##SUFFIX(                       \
        float* y0, float* y1, float* y2, float* y3, const float* x, const W* w0, const W* w1, const W* w2,   \
        const W* w3, long n0, long n1, long n2, long n3, int parts, long k) {                                 \
        const long total = n0 + (parts > 1 ? n1 : 0) + (parts > 2 ? n2 : 0) + (parts > 3 ? n3 : 0);          \
        const long first = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);                         \
        const StreamRow<W> row0 = part_row<W>(first, w0, w1, w2, w3, y0, y1, y2, y3, n0, n1, n2, parts, k);  \
        if ((threadIdx.x & 31) == 0 && first < total) prefetch_weights(row0.w, k * (long)sizeof(W));         \
        wait_for_producers();                                                                                 \
        stream_rows<W>(x, k, total, first, [&](long v) {                                                      \
            return part_row<W>(v, w0, w1, w2, w3, y0, y1, y2, y3, n0, n1, n2, parts, k);                      \
        });                                                                                                   \
    }

PARTS_STREAM_KERNEL(float, f32)
PARTS_STREAM_KERNEL(bf16_t, bf16)

// Many tokens: y [T, n] = x [T, k] · W [n, k]ᵀ in shared-memory tiles of 64 tokens x 64 outputs
// (32 of k at a time), so each weight tile is read once per 64 tokens instead of once per 8.
// 256 threads; thread (ty, tx) = (tid / 16, tid % 16) owns tokens ty*4..+4 and outputs tx*4..+4.
#define TILE_T 64
#define TILE_N 64
#define TILE_K 32

template <typename W>
__device__ __forceinline__ float weight_at(const W* w, long i);
template <>
__device__ __forceinline__ float weight_at<float>(const float* w, long i) { return w[i]; }
template <>
__device__ __forceinline__ float weight_at<bf16_t>(const bf16_t* w, long i) { return bf16_to_f32(w[i]); }

template <typename W>
__device__ __forceinline__ void linear_tiled(float* y, const float* x, const W* w, long tokens, long k, long n) {
    __shared__ float xs[TILE_T][TILE_K + 1];
    __shared__ float ws[TILE_N][TILE_K + 1];
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const long t0 = (long)blockIdx.y * TILE_T, n0 = (long)blockIdx.x * TILE_N;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (long k0 = 0; k0 < k; k0 += TILE_K) {
#pragma unroll
        for (int e = tid; e < TILE_T * TILE_K; e += 256) {
            const int row = e / TILE_K, col = e % TILE_K;
            const long t = t0 + row, kk = k0 + col;
            xs[row][col] = (t < tokens && kk < k) ? x[t * k + kk] : 0.0f;
            const long r = n0 + row;
            ws[row][col] = (r < n && kk < k) ? weight_at<W>(w, r * k + kk) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < TILE_K; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[ty * 4 + i][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = ws[tx * 4 + j][kk];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();  // the tiles are rewritten next
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const long t = t0 + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long r = n0 + tx * 4 + j;
            if (t < tokens && r < n) y[t * n + r] = acc[i][j];
        }
    }
}

extern "C" __global__ void linear_tiled_f32(float* y, const float* x, const float* w, long tokens, long k, long n) {
    wait_for_producers();
    linear_tiled<float>(y, x, w, tokens, k, n);
}

extern "C" __global__ void linear_tiled_bf16(float* y, const float* x, const bf16_t* w, long tokens, long k, long n) {
    wait_for_producers();
    linear_tiled<bf16_t>(y, x, w, tokens, k, n);
}

// ---------------------------------------------------------------------------------------------
// Many tokens on the tensor cores: y [T, n] = x [T, k] · W [n, k]ᵀ, f32 x, bf16 W, f32 y, one
// BM x BN tile a block (`mma_tile` in mma.cuh: the precision argument and the pipeline are
// there). Needs k % 8 == 0 and 16-byte aligned x and W (the launcher falls back to linear_tiled
// otherwise).

// Tile rows are the tokens t0 .. t0 + BM - 1 of x, from column k0 (rows `k` apart).
struct MmaDenseRows {
    const float* x;
    long tokens, k, t0, k0;
    __device__ __forceinline__ const float* row(int i) const {
        const long t = t0 + i;
        return t < tokens ? x + t * k + k0 : nullptr;
    }
    __device__ __forceinline__ void load8(const float* r, long kk, float* v) const { mma_load8(r + kk, v); }
};

// Split k (gridDim.z > 1, where the tiles alone would leave multiprocessors idle): block z takes
// the z-th of gridDim.z equal runs of whole MMA_BK stages of k and writes its partial products to
// y + z·T·n; `linear_split_sum_f32` adds them. The launcher makes every run non-empty.
template <int WARPS_M, int WARPS_N, int MT, int NT>
__device__ __forceinline__ void linear_mma(float* y, const float* x, const bf16_t* w, long tokens, long k, long n) {
    constexpr int BM = WARPS_M * MT * 16, BN = WARPS_N * NT * 8;
    const long t0 = (long)blockIdx.x * BM, n0 = (long)blockIdx.y * BN;
    const long stages = (k + MMA_BK - 1) / MMA_BK, per_split = (stages + gridDim.z - 1) / gridDim.z;
    const long k0 = (long)blockIdx.z * per_split * MMA_BK, k_len = min(per_split * MMA_BK, k - k0);
    float* part = y + (long)blockIdx.z * tokens * n;
    const bool pairs = (n & 1) == 0;
    mma_tile<WARPS_M, WARPS_N, MT, NT>(
        MmaDenseRows{x, tokens, k, t0, k0}, MmaWeightRows{w + k0, k}, n, n0, k_len, (int)min((long)BM, tokens - t0),
        [&](int i, long c, float v0, float v1) {
            const long t = t0 + i;
            if (t >= tokens) return;
            float* yt = part + t * n;
            if (pairs && c + 1 < n) {
                float2 v;
                v.x = v0, v.y = v1;
                *reinterpret_cast<float2*>(yt + c) = v;
            } else {
                if (c < n) yt[c] = v0;
                if (c + 1 < n) yt[c + 1] = v1;
            }
        });
}

// y [count] = ((parts[0] + parts[1]) + parts[2]) + ...: the split-k partial products of
// linear_mma (splits of them, count values apart), in split order, rounded to nearest each add.
extern "C" __global__ void linear_split_sum_f32(float* y, const float* parts, long count, int splits) {
    wait_for_producers();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (long)gridDim.x * blockDim.x) {
        float acc = parts[i];
        for (int s = 1; s < splits; s++) acc = __fadd_rn(acc, parts[s * count + i]);
        y[i] = acc;
    }
}

// 64 tokens x 64 outputs, 4 warps (2 x 2), each 32 x 32; 24 KB of shared memory. (A 128 x 128
// tile of 8 warps had 64 accumulators a thread; with each stage's products summed into a second
// set, see above, it no longer fits two blocks' register budget, so it was dropped.)
extern "C" __global__ void __launch_bounds__(128) linear_mma64_bf16(float* y, const float* x, const bf16_t* w,
                                                                    long tokens, long k, long n) {
    wait_for_producers();
    linear_mma<2, 2, 2, 4>(y, x, w, tokens, k, n);
}

// 64 tokens x 128 outputs, 8 warps (2 x 4), each 32 x 32; 32 KB of shared memory: each staged
// activation tile (f32, split into hi and lo) serves twice the outputs of linear_mma64 (the
// `mma_wide` variant; docs/decisions/0015-tensor-core-tiles.md).
extern "C" __global__ void __launch_bounds__(256) linear_mma_wide_bf16(float* y, const float* x, const bf16_t* w,
                                                                       long tokens, long k, long n) {
    wait_for_producers();
    linear_mma<2, 4, 2, 4>(y, x, w, tokens, k, n);
}
