// y = x · Wᵀ for a few tokens (2 to 16: MTP's verify rows, a small batch) on the tensor cores,
// bf16 W [n, k] row-major, f32 x [tokens, k] (src/ops/linear.rs is the reference).
//
// The weights are the M side of `mma.m16n8k16` and the tokens the N side (8 a tile, NT tiles), so
// a warp's 16 rows x 32 k of weights meet every token in four products, where the SIMT `rows`
// kernel loads each activation chunk once a token per weight chunk (6 tokens: 12x the weight
// bytes through L1). x is split into bf16 hi + lo as mma.cuh splits it (|x − hi − lo| ≤ 2^-18
// |x|); W is exact in bf16; each 32-k chunk's products start from zero and are added to the
// f32 accumulators with round-to-nearest adds (the tensor cores truncate as they accumulate).
//
// The fragments are loaded straight from global memory in 16-byte pieces: within a 32-k chunk,
// lane (g = lane / 4, t = lane % 4) loads the 8 weights 8t .. 8t + 7 of rows g and g + 8 and the
// 8 activations 8t .. 8t + 7 of token g. A dot product's terms may be taken in any order, so
// the first product of the chunk takes weights 8t .. 8t + 3 as the fragment's k 2t, 2t + 1,
// 2t + 8, 2t + 9 and the second 8t + 4 .. 8t + 7: W and x agree on which k each register holds.
//
// A block is S warps over the same MT * 16 rows, warp w taking the chunks w, w + S, ...; their
// sums meet in shared memory and are added in warp order, so the result does not depend on the
// schedule. Needs k % 32 == 0 and 16-byte aligned rows (checked by the launcher).
#include "common.cuh"
#include "vec.cuh"
#include "mma.cuh"

// 32-k chunks a warp loads before their products.
#define FEW_CHUNKS_IN_FLIGHT 4

// A 16-byte weight load that does not allocate in L1: x, which every warp reads, stays there.
__device__ __forceinline__ uint4 few_load_weights(const bf16_t* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// This warp's sums of rows row0 + 16 m + {g, g + 8} (m < MT) for tokens 8 j + {2t, 2t + 1}
// (j < NT), in mma's accumulator order: acc[m][j] = {(g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)}.
template <int MT, int NT, int S>
__device__ __forceinline__ void few_products(float (&acc)[MT][NT][4], const float* x, const bf16_t* w, int tokens,
                                             long k, long n, long row0, int warp, int lane) {
    constexpr int U = FEW_CHUNKS_IN_FLIGHT;
    const int g = lane >> 2, t = lane & 3;
    const long chunks = k / 32;
    const bf16_t* wrow[MT][2];
    bool wlive[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long r = row0 + 16 * m + 8 * h + g;
            wlive[m][h] = r < n;
            wrow[m][h] = w + (wlive[m][h] ? r : 0) * k + 8 * t;
        }
    const float* xrow[NT];
    bool xlive[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int tok = 8 * j + g;
        xlive[j] = tok < tokens;
        xrow[j] = x + (xlive[j] ? tok : 0) * k + 8 * t;
    }
    mma_zero(acc);
    for (long c0 = warp; c0 < chunks; c0 += (long)S * U) {
        uint4 wv[U][MT][2];
        float xv[U][NT][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const long c = c0 + (long)u * S;
            if (c < chunks) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        wv[u][m][h] = wlive[m][h] ? few_load_weights(wrow[m][h] + c * 32) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    if (xlive[j]) {
                        mma_load8(xrow[j] + c * 32, xv[u][j]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; e++) xv[u][j][e] = 0.0f;
                    }
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + (long)u * S >= chunks) break;
            float part[MT][NT][4];
            mma_zero(part);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                unsigned hi[4], lo[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    hi[q] = pack_bf16x2(xv[u][j][2 * q], xv[u][j][2 * q + 1]);
                    lo[q] = pack_bf16x2(xv[u][j][2 * q] - __uint_as_float(hi[q] << 16),
                                        xv[u][j][2 * q + 1] - __uint_as_float(hi[q] & 0xffff0000u));
                }
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    // Weights 8t .. 8t + 3 (words x, y), then 8t + 4 .. 8t + 7 (words z, w).
                    const unsigned a0[4] = {wv[u][m][0].x, wv[u][m][1].x, wv[u][m][0].y, wv[u][m][1].y};
                    const unsigned a1[4] = {wv[u][m][0].z, wv[u][m][1].z, wv[u][m][0].w, wv[u][m][1].w};
                    mma_bf16_16816(part[m][j], a0, hi[0], hi[1]);
                    mma_bf16_16816(part[m][j], a1, hi[2], hi[3]);
                    mma_bf16_16816(part[m][j], a0, lo[0], lo[1]);
                    mma_bf16_16816(part[m][j], a1, lo[2], lo[3]);
                }
            }
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[m][j][e] = __fadd_rn(acc[m][j][e], part[m][j][e]);
        }
    }
}

// The block's sums, every warp's added in warp order; then `store(row, token, value)` for each
// live (row, token), by warp 0.
template <int MT, int NT, int S, typename Store>
__device__ __forceinline__ void few_linear(const float* x, const bf16_t* w, int tokens, long k, long n, Store store) {
    constexpr int V = MT * NT * 4;
    __shared__ float sums[S > 1 ? S - 1 : 1][V][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long row0 = (long)blockIdx.x * 16 * MT;
    float acc[MT][NT][4];
    few_products<MT, NT, S>(acc, x, w, tokens, k, n, row0, warp, lane);
    if (warp > 0) {
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) sums[warp - 1][(m * NT + j) * 4 + e][lane] = acc[m][j][e];
    }
    if (S > 1) __syncthreads();
    if (warp != 0) return;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float s = acc[m][j][e];
#pragma unroll
                for (int v = 0; v < S - 1; v++) s = __fadd_rn(s, sums[v][(m * NT + j) * 4 + e][lane]);
                const long row = row0 + 16 * m + g + 8 * (e >> 1);
                const int tok = 8 * j + 2 * t + (e & 1);
                if (row < n && tok < tokens) store(row, tok, s);
            }
}

// linear_few_r{16 MT}_s{S}_t{8 NT}_bf16: a block of S warps per 16 MT output rows, up to 8 NT
// tokens (src/registry/cuda/linear.rs names them from the node's shape).
#define FEW_LINEAR_KERNEL(MT, S, NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * S) linear_few_r##MT##_s##S##_t##NT##_bf16(                  \
        float* y, const float* x, const bf16_t* w, int tokens, long k, long n) {                                  \
        prefetch_first_rows(w, k, n, 16 * (MT / 16));                                                             \
        wait_for_producers();                                                                                     \
        few_linear<MT / 16, NT / 8, S>(x, w, tokens, k, n, [&](long r, int tok, float s) { y[tok * n + r] = s; }); \
    }

// linear_hc_write_few_*: out [T, C*n] = h + inj ⊗ (x·Wᵀ), the residual write of linear_hc_write
// (linear.cu) as these kernels' epilogue (the product rounded before the add).
#define FEW_HC_WRITE_KERNEL(MT, S, NT)                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * S) linear_hc_write_few_r##MT##_s##S##_t##NT##_bf16(            \
        float* out, const float* h, const float* inj, const float* x, const bf16_t* w, int tokens, long k, long n, \
        int streams) {                                                                                               \
        prefetch_first_rows(w, k, n, 16 * (MT / 16));                                                                \
        wait_for_producers();                                                                                        \
        const long width = (long)streams * n;                                                                        \
        few_linear<MT / 16, NT / 8, S>(x, w, tokens, k, n, [&](long r, int tok, float s) {                          \
            for (int c = 0; c < streams; c++) {                                                                      \
                const long o = tok * width + (long)c * n + r;                                                        \
                out[o] = h[o] + __fmul_rn(inj[(long)tok * streams + c], s);                                          \
            }                                                                                                        \
        });                                                                                                          \
    }

#define FEW_KERNELS(MT, S)        \
    FEW_LINEAR_KERNEL(MT, S, 8)   \
    FEW_LINEAR_KERNEL(MT, S, 16)  \
    FEW_HC_WRITE_KERNEL(MT, S, 8) \
    FEW_HC_WRITE_KERNEL(MT, S, 16)

// The (rows, warps) of a block the registry offers (launch::linear::FEW_SHAPES).
FEW_KERNELS(16, 4)
FEW_KERNELS(16, 8)
FEW_KERNELS(32, 4)
