// Tensor-core tiles for the many-token products (linear.cu's linear_mma, moe.cu's expert-major
// experts): one BM x BN tile of x · Wᵀ, f32 x, bf16 W [n, k], f32 results, with
// `mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32`. Included after common.cuh.
//
// Precision: W is exact in bf16; x is split while it is staged into shared memory into
// hi = bf16(x) and lo = bf16(x − hi) (x − hi is exact in f32), and every tile adds hi·W and then
// lo·W into the same f32 accumulators. The only error beyond f32 summation is lo's rounding:
// |x − hi − lo| ≤ 2^-9 |x − hi| ≤ 2^-18 |x| per product (round to nearest both times).
// (An infinite x gives NaN: hi − x is inf − inf.)
//
// 32 of k per stage, two shared-memory stages: while the warps multiply stage s, the weights of
// the next 32 k go to stage s^1 by cp.async (16 bytes, zero-filled past n and k) and the next x
// values are in registers, split and stored into s^1 after the products; one barrier per stage.
// Warps are WARPS_M x WARPS_N; a warp owns MT m16 tiles x NT n8 tiles (MT*16 rows x NT*8
// outputs), its fragments read with ldmatrix. Warp row m takes the 16-row blocks m, m + WARPS_M,
// ... (interleaved, so that a part-full tile's live rows spread over the warp rows). Shared rows
// are 32 bf16 = four 16-byte chunks, XOR-swizzled by bits 1-2 of the row, so the 8 row addresses
// of each ldmatrix phase hit 8 different bank groups. Needs k % 8 == 0 and 16-byte aligned rows
// of x and W.
//
// Weights stored otherwise than as bf16 rows (NVFP4: moe_nvfp4.cu) are register-staged, as x is:
// a weight-rows type with REGISTER_STAGED loads each 8-value chunk (`load(r, kk)`, a uint2 of
// raw bits) before the products and widens it to 8 bf16 (`widen(raw)`, exact values) into the
// next stage after them.
#pragma once
#include "common.cuh"

#define MMA_BK 32

// Element offset of (row r, 16-byte chunk c) in a [rows][MMA_BK] bf16 tile.
__device__ __forceinline__ int mma_swizzle(int r, int c) { return r * MMA_BK + ((c ^ ((r >> 1) & 3)) << 3); }

// Two f32 as bf16x2, rounded to nearest even: `first` in the low half (the lower address).
__device__ __forceinline__ unsigned pack_bf16x2(float first, float second) {
    unsigned d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(second), "f"(first));
    return d;
}

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

// Eight consecutive f32 at p (16-byte aligned), through the read-only path.
__device__ __forceinline__ void mma_load8(const float* p, float* v) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

template <int MT, int NT>
__device__ __forceinline__ void mma_zero(float (&a)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) a[i][j][c] = 0.0f;
}

// One stage's products of a warp's first L 16-row blocks (mt * WARPS_M + warp_m) into `acc`.
// The tensor cores add into their accumulator with truncation: over k = 6144 (768 MMAs) the
// bias reached 1.4e-5 relative. So each stage's products start from zero and are added to `acc`
// with round-to-nearest f32 adds.
template <int WARPS_M, int WARPS_N, int MT, int NT, int L>
__device__ __forceinline__ void mma_stage_products(float (&acc)[MT][NT][4], unsigned hi_base, unsigned lo_base,
                                                   unsigned w_base, int warp_m, int warp_n, int lane) {
    float part[L][NT][4];
    mma_zero(part);
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
        for (int mt = 0; mt < L; mt++) {
            // A: matrices (rows 0-7, c0), (8-15, c0), (0-7, c0+1), (8-15, c0+1) = a0..a3.
            const int row = (mt * WARPS_M + warp_m) * 16 + (lane & 15);
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
    for (int i = 0; i < L; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = __fadd_rn(acc[i][j][c], part[i][j][c]);
}

// The weight rows of a product: row r of W is `w + r * ld` (ld > k: a slice of k of a wider
// matrix).
struct MmaWeightRows {
    static constexpr bool REGISTER_STAGED = false;
    const bf16_t* w;
    long ld;
    __device__ __forceinline__ const bf16_t* row(long r) const { return w + r * ld; }
};

// One tile: rows i < BM of x from `rows` (`rows.row(i)`: the row's base, nullptr for a zero row;
// `rows.load8(base, kk, v)`: its 8 values from kk), outputs n0 .. n0 + BN - 1 of W (n rows of k
// values, `wrows.row(r)` the start of row r < n, as MmaWeightRows; rows past n are zero);
// `store(i, c, v0, v1)` receives tile row i's results for outputs c and c + 1 (c even relative to
// n0; either may be ≥ n). Rows from `live` on are zero rows (the caller's promise): a warp skips
// the products of its 16-row blocks past it (a part-full tile of the expert-major experts, the
// last tile of tokens), whose results (zero) the caller does not store anyway.
template <int WARPS_M, int WARPS_N, int MT, int NT, typename Rows, typename WRows, typename Store>
__device__ __forceinline__ void mma_tile(const Rows rows, const WRows wrows, long n, long n0, long k, int live,
                                         Store store) {
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

    // This thread's staging chunks: tile row e / CHUNKS, chunk e % CHUNKS (4 threads per row:
    // one 128-byte x row segment and one 64-byte W row segment per 4 threads).
    const float* xrow[XCH];
#pragma unroll
    for (int i = 0; i < XCH; i++) {
        const int e = tid + i * THREADS;
        const float* r = rows.row(e / CHUNKS);
        xrow[i] = r != nullptr ? r + (e % CHUNKS) * 8 : nullptr;
    }

    const unsigned smem0 = shared_addr(smem);
    // Weights: the chunk (tile row e / CHUNKS, chunk e % CHUNKS) of each of WCH.
    const bf16_t* wrow[WCH];  // bf16 rows: the chunk's first value (nullptr past n)
    uint2 wraw[WCH];          // register-staged: the raw chunk of the next stage
#pragma unroll
    for (int i = 0; i < WCH; i++) {
        const int e = tid + i * THREADS;
        const long r = n0 + e / CHUNKS;
        if constexpr (!WRows::REGISTER_STAGED) wrow[i] = r < n ? wrows.row(r) + (e % CHUNKS) * 8 : nullptr;
    }
    // Starts stage s's weights from k0: cp.async straight into shared memory, or loads into
    // registers (then `commit_w`).
    auto fetch_w = [&](int s, long k0) {
#pragma unroll
        for (int i = 0; i < WCH; i++) {
            const int e = tid + i * THREADS;
            if constexpr (WRows::REGISTER_STAGED) {
                const long r = n0 + e / CHUNKS, kk = k0 + (e % CHUNKS) * 8;
                wraw[i] = r < n && kk < k ? wrows.load(r, kk) : make_uint2(0u, 0u);
            } else {
                const bool ok = wrow[i] != nullptr && k0 + (e % CHUNKS) * 8 < k;
                const unsigned dst =
                    smem0 + 2u * (s * STAGE + 2 * BM * MMA_BK + mma_swizzle(e / CHUNKS, e % CHUNKS));
                cp_async16(dst, ok ? (const void*)(wrow[i] + k0) : (const void*)wrows.row(0), ok);
            }
        }
        if constexpr (!WRows::REGISTER_STAGED) cp_async_commit();
    };
    // Stores register-staged weights into stage s (a raw zero widens to zeros).
    auto commit_w = [&](int s) {
        if constexpr (WRows::REGISTER_STAGED) {
#pragma unroll
            for (int i = 0; i < WCH; i++) {
                const int e = tid + i * THREADS;
                *reinterpret_cast<uint4*>(smem + s * STAGE + 2 * BM * MMA_BK + mma_swizzle(e / CHUNKS, e % CHUNKS)) =
                    wrows.widen(wraw[i]);
            }
        }
    };
    float xv[XCH][8];
    auto load_x = [&](long k0) {
#pragma unroll
        for (int i = 0; i < XCH; i++) {
            const int e = tid + i * THREADS;
            if (xrow[i] != nullptr && k0 + (e % CHUNKS) * 8 < k) {
                rows.load8(xrow[i], k0, xv[i]);
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
    mma_zero(acc);

    fetch_w(0, 0);
    load_x(0);
    commit_w(0);
    store_x(0);
    cp_async_wait_all();
    __syncthreads();

    // This warp's live 16-row blocks (mt * WARPS_M + warp_m below live / 16): a prefix of mt.
    int live_mt = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) live_mt += (mt * WARPS_M + warp_m) * 16 < live ? 1 : 0;

    const long ktiles = (k + MMA_BK - 1) / MMA_BK;
    for (long kt = 0; kt < ktiles; kt++) {
        const int s = (int)(kt & 1);
        const bool more = kt + 1 < ktiles;
        if (more) {
            fetch_w(s ^ 1, (kt + 1) * MMA_BK);
            load_x((kt + 1) * MMA_BK);
        }
        const unsigned hi_base = smem0 + 2u * (s * STAGE);
        const unsigned lo_base = hi_base + 2u * (BM * MMA_BK);
        const unsigned w_base = hi_base + 2u * (2 * BM * MMA_BK);
        // Only this warp's live 16-row blocks (a compile-time count, so that the products stay
        // one straight run of instructions).
        if (live_mt == MT)
            mma_stage_products<WARPS_M, WARPS_N, MT, NT, MT>(acc, hi_base, lo_base, w_base, warp_m, warp_n, lane);
        else if (live_mt == 1)
            mma_stage_products<WARPS_M, WARPS_N, MT, NT, 1>(acc, hi_base, lo_base, w_base, warp_m, warp_n, lane);
        else if (live_mt > 1)  // (MT > 2 only) the dead blocks' products are zero
            mma_stage_products<WARPS_M, WARPS_N, MT, NT, MT>(acc, hi_base, lo_base, w_base, warp_m, warp_n, lane);
        if (more) {
            commit_w(s ^ 1);
            store_x(s ^ 1);
        }
        cp_async_wait_all();
        __syncthreads();  // stage s^1 is complete, and every warp is done reading stage s
    }

    // C fragment: (row lane/4, cols 2*(lane%4), +1) and the same 8 rows below.
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                store((mt * WARPS_M + warp_m) * 16 + g + half * 8, n0 + warp_n * NT * 8 + nt * 8 + 2 * q,
                      acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
}
