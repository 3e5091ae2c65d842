// y = x · Wᵀ, W [n, k] row-major (src/ops/linear.rs is the reference).
// `linear_rows_*`: one warp per output row, every token of the step in the same warp, so each
// weight row is read from memory once per step. 16-byte weight loads when k allows, with
// LOADS_IN_FLIGHT of them issued before their products (a matrix-vector product is bound by the
// bytes in flight).
#include "common.cuh"
#include "vec.cuh"

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
template <typename W>
__device__ __forceinline__ void moe_shared_write(float* out, const float* h, const float* inj, const float* x,
                                                 const float* s, const float* a, const W* wd, const float* wg,
                                                 long hid, long inter, int streams) {
    constexpr int N = WeightVec<W>::N;
    const long t = blockIdx.y;
    const float gate = sigmoid_f32(block_dot(x + t * hid, wg, hid));
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* st = s + t * inter;
    const bool vec = inter % N == 0 && aligned16(st) && aligned16(wd);
    const long width = (long)streams * hid;
    for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < hid; r += gridDim.x * warps_per_block) {
        float acc[1];
        row_dots<W, 1>(acc, st, wd + r * inter, inter, 1, lane, vec);
        const float shared = warp_sum(acc[0]);
        const float y = a[t * hid + r] + shared * gate;
        for (int c = lane; c < streams; c += 32) {
            const long o = t * width + (long)c * hid + r;
            out[o] = h[o] + __fmul_rn(inj[t * streams + c], y);
        }
    }
}

#define MOE_SHARED_WRITE_KERNEL(W, SUFFIX)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) moe_shared_write_reference_##SUFFIX(                    \
        float* out, const float* h, const float* inj, const float* x, const float* s, const float* a,         \
        const W* wd, const float* wg, long hid, long inter, int streams) {                                    \
        prefetch_first_rows(wd, inter, hid, blockDim.x >> 5);                                                \
        wait_for_producers();                                                                                 \
        moe_shared_write<W>(out, h, inj, x, s, a, wd, wg, hid, inter, streams);                               \
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
    constexpr int N = WeightVec<W>::N;
    __shared__ float partial[G][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const long stride = blockDim.x;
    const bool vec = k % N == 0 && aligned16(x) && aligned16(w);
    for (long r0 = block * G; r0 < n; r0 += blocks * G) {
        const int here = (int)min((long)G, n - r0);
        float acc[G];
#pragma unroll
        for (int g = 0; g < G; g++) acc[g] = 0.0f;
        if (vec) {
            // U chunks of each of the G rows in flight, kept packed (4 registers each) until
            // their products: fewer registers, more blocks a multiprocessor.
            const long chunks = k / N;
            for (long i = threadIdx.x; i < chunks; i += U * stride) {
                uint4 raw[U][G];
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int g = 0; g < G; g++)
                        if (g < here && i + u * stride < chunks)
                            raw[u][g] = WeightVec<W>::load(w + (r0 + g) * k, i + u * stride);
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (i + u * stride >= chunks) break;
                    float xv[N];
                    act_chunk<N>(x, i + u * stride, xv);
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        if (g < here) {
                            float wv[N];
                            WeightVec<W>::unpack(raw[u][g], wv);
#pragma unroll
                            for (int j = 0; j < N; j++) acc[g] += wv[j] * xv[j];
                        }
                    }
                }
            }
        } else {
            for (long i = threadIdx.x; i < k; i += stride) {
#pragma unroll
                for (int g = 0; g < G; g++)
                    if (g < here) acc[g] += x[i] * WeightVec<W>::one(w + (r0 + g) * k, i);
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float v = warp_sum(acc[g]);
            if (lane == 0) partial[g][warp] = v;
        }
        __syncthreads();
        if (warp == 0) {
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (g < here) epilogue(r0 + g, warp_sum(lane < warps ? partial[g][lane] : 0.0f));
            }
        }
        __syncthreads();  // `partial` is rewritten by the next rows
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
        linear_group1<W, G, U>(x, w, k, n, blockIdx.x, gridDim.x, [&](long r, float s) {                                             \
            for (int c = threadIdx.x & 31; c < streams; c += 32)                                              \
                out[(long)c * n + r] = h[(long)c * n + r] + __fmul_rn(inj[c], s);                             \
        });                                                                                                   \
    }

// (G, U): G rows a block, U chunks of each row in flight per thread. (U = 3, which takes a row of
// k = 6144 in one round, measured no faster than these: results/2026-11-30-bench-sweep-group-loads.log.)
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
// Many tokens on the tensor cores: y [T, n] = x [T, k] · W [n, k]ᵀ, f32 x, bf16 W, f32 y, with
// `mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32`.
//
// Precision: W is exact in bf16; x is split while it is staged into shared memory into
// hi = bf16(x) and lo = bf16(x − hi) (x − hi is exact in f32), and every tile adds hi·W and then
// lo·W into the same f32 accumulators. The only error beyond f32 summation is lo's rounding:
// |x − hi − lo| ≤ 2^-9 |x − hi| ≤ 2^-18 |x| per product (round to nearest both times).
// (An infinite x gives NaN: hi − x is inf − inf.)
//
// Block tile BM tokens x BN outputs, 32 of k per stage, two shared-memory stages: while the
// warps multiply stage s, the weights of the next 32 k go to stage s^1 by cp.async (16 bytes,
// zero-filled past n and k) and the next x values are in registers, split and stored into s^1
// after the products; one barrier per stage. Warps are WARPS_M x WARPS_N; a warp owns
// MT m16 tiles x NT n8 tiles (MT*16 tokens x NT*8 outputs), its fragments read with ldmatrix.
// Shared rows are 32 bf16 = four 16-byte chunks, XOR-swizzled by bits 1-2 of the row, so the 8
// row addresses of each ldmatrix phase hit 8 different bank groups. Needs k % 8 == 0 and 16-byte
// aligned x and W (the launcher falls back to linear_tiled otherwise).
#define MMA_BK 32

__device__ __forceinline__ unsigned shared_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Element offset of (row r, 16-byte chunk c) in a [rows][MMA_BK] bf16 tile.
__device__ __forceinline__ int mma_swizzle(int r, int c) { return r * MMA_BK + ((c ^ ((r >> 1) & 3)) << 3); }

// Two f32 as bf16x2, rounded to nearest even: `first` in the low half (the lower address).
__device__ __forceinline__ unsigned pack_bf16x2(float first, float second) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(second), "f"(first));
    return d;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// d += a · b for one m16n8k16 tile (a: 16x16 row-major, b: 16x8 column-major, d: 16x8 f32).
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int WARPS_M, int WARPS_N, int MT, int NT>
__device__ __forceinline__ void linear_mma(float* y, const float* x, const bf16_t* w, long tokens, long k, long n) {
    constexpr int BM = WARPS_M * MT * 16, BN = WARPS_N * NT * 8;
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int CHUNKS = MMA_BK / 8;            // 16-byte chunks per shared row
    constexpr int XCH = BM * CHUNKS / THREADS;    // x chunks (8 values) each thread stages
    constexpr int WCH = BN * CHUNKS / THREADS;    // weight chunks each thread stages
    constexpr int STAGE = (2 * BM + BN) * MMA_BK; // bf16 per stage: x hi, x lo, W
    static_assert(XCH * THREADS == BM * CHUNKS && WCH * THREADS == BN * CHUNKS, "tile / thread mismatch");
    static_assert(NT % 2 == 0, "B fragments are loaded two n8 tiles at a time");
    __shared__ __align__(128) bf16_t smem[2 * STAGE];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
    const long t0 = (long)blockIdx.x * BM, n0 = (long)blockIdx.y * BN;

    // This thread's staging chunks: tile row e / CHUNKS, chunk e % CHUNKS (4 threads per row:
    // one 128-byte x row segment and one 64-byte W row segment per 4 threads).
    const float* xrow[XCH];
    const bf16_t* wrow[WCH];
#pragma unroll
    for (int i = 0; i < XCH; i++) {
        const int e = tid + i * THREADS;
        const long t = t0 + e / CHUNKS;
        xrow[i] = t < tokens ? x + t * k + (e % CHUNKS) * 8 : nullptr;
    }
#pragma unroll
    for (int i = 0; i < WCH; i++) {
        const int e = tid + i * THREADS;
        const long r = n0 + e / CHUNKS;
        wrow[i] = r < n ? w + r * k + (e % CHUNKS) * 8 : nullptr;
    }

    const unsigned smem0 = shared_addr(smem);
    auto stage_w = [&](int s, long k0) {
#pragma unroll
        for (int i = 0; i < WCH; i++) {
            const int e = tid + i * THREADS;
            const bool ok = wrow[i] != nullptr && k0 + (e % CHUNKS) * 8 < k;
            const unsigned dst = smem0 + 2u * (s * STAGE + 2 * BM * MMA_BK + mma_swizzle(e / CHUNKS, e % CHUNKS));
            cp_async16(dst, ok ? (const void*)(wrow[i] + k0) : (const void*)w, ok);
        }
        cp_async_commit();
    };
    float xv[XCH][8];
    auto load_x = [&](long k0) {
#pragma unroll
        for (int i = 0; i < XCH; i++) {
            const int e = tid + i * THREADS;
            if (xrow[i] != nullptr && k0 + (e % CHUNKS) * 8 < k) {
                const float4 a = __ldg(reinterpret_cast<const float4*>(xrow[i] + k0));
                const float4 b = __ldg(reinterpret_cast<const float4*>(xrow[i] + k0) + 1);
                xv[i][0] = a.x, xv[i][1] = a.y, xv[i][2] = a.z, xv[i][3] = a.w;
                xv[i][4] = b.x, xv[i][5] = b.y, xv[i][6] = b.z, xv[i][7] = b.w;
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) xv[i][j] = 0.0f;
            }
        }
    };
    auto store_x = [&](int s) {
#pragma unroll
        for (int i = 0; i < XCH; i++) {
            const int e = tid + i * THREADS;
            unsigned hi[4], lo[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                hi[j] = pack_bf16x2(xv[i][2 * j], xv[i][2 * j + 1]);
                lo[j] = pack_bf16x2(xv[i][2 * j] - __uint_as_float(hi[j] << 16),
                                    xv[i][2 * j + 1] - __uint_as_float(hi[j] & 0xffff0000u));
            }
            const int off = s * STAGE + mma_swizzle(e / CHUNKS, e % CHUNKS);
            uint4 h, l;
            h.x = hi[0], h.y = hi[1], h.z = hi[2], h.w = hi[3];
            l.x = lo[0], l.y = lo[1], l.z = lo[2], l.w = lo[3];
            *reinterpret_cast<uint4*>(smem + off) = h;
            *reinterpret_cast<uint4*>(smem + off + BM * MMA_BK) = l;
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;

    stage_w(0, 0);
    load_x(0);
    store_x(0);
    cp_async_wait_all();
    __syncthreads();

    const long ktiles = (k + MMA_BK - 1) / MMA_BK;
    for (long kt = 0; kt < ktiles; kt++) {
        const int s = (int)(kt & 1);
        const bool more = kt + 1 < ktiles;
        if (more) {
            stage_w(s ^ 1, (kt + 1) * MMA_BK);
            load_x((kt + 1) * MMA_BK);
        }
        const unsigned hi_base = smem0 + 2u * (s * STAGE);
        const unsigned lo_base = hi_base + 2u * (BM * MMA_BK);
        const unsigned w_base = hi_base + 2u * (2 * BM * MMA_BK);
        // The tensor cores add into their accumulator with truncation: over k = 6144 (768
        // MMAs) the bias reached 1.4e-5 relative. So each stage's products start from zero and
        // are added to `acc` with round-to-nearest f32 adds.
        float part[MT][NT][4];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) part[i][j][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < MMA_BK; kk += 16) {
            const int c0 = kk / 8;
            // B: matrices (rows n, chunk c0), (n, c0+1), (n+8, c0), (n+8, c0+1) = b0, b1 of two n8 tiles.
            unsigned b[NT][2];
#pragma unroll
            for (int p = 0; p < NT / 2; p++) {
                const int row = warp_n * NT * 8 + p * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int chunk = c0 + ((lane >> 3) & 1);
                ldmatrix_x4(w_base + 2u * mma_swizzle(row, chunk), b[2 * p][0], b[2 * p][1], b[2 * p + 1][0],
                            b[2 * p + 1][1]);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                // A: matrices (rows 0-7, c0), (8-15, c0), (0-7, c0+1), (8-15, c0+1) = a0..a3.
                const int row = warp_m * MT * 16 + mt * 16 + (lane & 15);
                const int off = 2 * mma_swizzle(row, c0 + (lane >> 4));
                unsigned ah[4], al[4];
                ldmatrix_x4(hi_base + off, ah[0], ah[1], ah[2], ah[3]);
                ldmatrix_x4(lo_base + off, al[0], al[1], al[2], al[3]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16_16816(part[mt][nt], ah, b[nt][0], b[nt][1]);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16_16816(part[mt][nt], al, b[nt][0], b[nt][1]);
            }
        }
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[i][j][c] = __fadd_rn(acc[i][j][c], part[i][j][c]);
        if (more) store_x(s ^ 1);
        cp_async_wait_all();
        __syncthreads();  // stage s^1 is complete, and every warp is done reading stage s
    }

    // C fragment: (row lane/4, cols 2*(lane%4), +1) and the same 8 rows below.
    const int g = lane >> 2, q = lane & 3;
    const bool pairs = (n & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const long t = t0 + warp_m * MT * 16 + mt * 16 + g + half * 8;
            if (t >= tokens) continue;
            float* yt = y + t * n;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const long c = n0 + warp_n * NT * 8 + nt * 8 + 2 * q;
                const float v0 = acc[mt][nt][2 * half], v1 = acc[mt][nt][2 * half + 1];
                if (pairs && c + 1 < n) {
                    float2 v;
                    v.x = v0, v.y = v1;
                    *reinterpret_cast<float2*>(yt + c) = v;
                } else {
                    if (c < n) yt[c] = v0;
                    if (c + 1 < n) yt[c + 1] = v1;
                }
            }
        }
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
