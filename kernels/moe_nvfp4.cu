// Routed experts with NVFP4 weights (ModelOpt's layout; src/quant/nvfp4.rs and
// src/ops/moe.rs are the reference), read packed: no widened copy exists.
//
// A bank [experts, out, in] is its rows one after another: `in/2` code bytes (E2M1, element 2i in
// the low nibble, bit 3 the sign), `in/16` E4M3 scale bytes (bias 7; 0x7F and 0xFF, E4M3's NaN,
// read as +0 as ModelOpt writes them), and one f32 global per `rows_per_global` rows (one per
// checkpoint tensor: a gate/up bank has an expert's gate global, then its up global).
//
// The weight is (e2m1 · e4m3) · global. e2m1 · e4m3 is exact in f32 and in bf16 (at most 6
// significant bits), so the products differ from the reference's only in association: per word
// of 8 codes (half a scale group), Σ e2m1·x, times the group's scale, summed over the row, times
// the global after the whole sum.
//
// - `moe_experts_gate_up_nvfp4` / `moe_experts_down_nvfp4`: token-major, for a few tokens. A warp
//   per (slot, channel) forms act = silu(g)·u from the gate and up rows; a warp per output row
//   of a token sums its slots' down products in slot order as the reference does.
// - `moe_experts_expert_major_{gate_up,down}_mma_nvfp4`: the expert-major tiles (moe.cu's grouping
//   and combine around them) on the tensor cores, the codes widened to bf16 as they are staged.
#include "common.cuh"
#include "mma.cuh"
#include "moe_tiles.cuh"
#include "nvfp4.cuh"

// An E2M1 code's value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code 8 is -0).
__device__ __forceinline__ float nvfp4_e2m1(unsigned c) {
    const unsigned mag = c & 7u;
    const unsigned bits = mag < 2u ? (mag != 0u ? 0x3F000000u : 0u) : ((((mag >> 1) + 126u) << 23) | ((mag & 1u) << 22));
    return __uint_as_float(bits | ((c & 8u) << 28));
}

// Codes i and i + 4 of a word (nibbles at bits 0-3 and 16-19 of `c`) as two floats. The E2M1
// values are exact in f16 with a zero low byte (0x00, 0x38, 0x3C, 0x3E, 0x40, 0x42, 0x44, 0x46
// for 0 .. 6), so one byte permute looks up both high bytes (the table's byte 0 is zero, so
// selector 0 gives the zero low bytes), the sign bits shift into place together, and the
// conversion to f32 is exact: a fraction of the bit operations of decoding each code alone.
__device__ __forceinline__ float2 nvfp4_e2m1_pair(unsigned c) {
    const unsigned sel = ((c << 4) & 0x70u) | ((c >> 4) & 0x7000u);
    const unsigned h = __byte_perm(0x3E3C3800u, 0x46444240u, sel) | ((c << 12) & 0x80008000u);
    float2 f;
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;\n}"
        : "=f"(f.x), "=f"(f.y)
        : "r"(h));
    return f;
}

// Σ_i e2m1(code i) · x[i] over one word of codes (8 values, element i in nibble i; x 16-byte
// aligned), in element order.
__device__ __forceinline__ float nvfp4_word_dot(unsigned c, const float* x) {
    const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
    const float2 p0 = nvfp4_e2m1_pair(c), p1 = nvfp4_e2m1_pair(c >> 4), p2 = nvfp4_e2m1_pair(c >> 8),
                 p3 = nvfp4_e2m1_pair(c >> 12);
    float d = p0.x * a.x;
    d = fmaf(p1.x, a.y, d);
    d = fmaf(p2.x, a.z, d);
    d = fmaf(p3.x, a.w, d);
    d = fmaf(p0.y, b.x, d);
    d = fmaf(p1.y, b.y, d);
    d = fmaf(p2.y, b.z, d);
    return fmaf(p3.y, b.w, d);
}

// This lane's share of row `row`'s product with x (`in` values in shared memory, 16-byte
// aligned): the words w = first, first + step, ... of the row (8 values each, half a scale
// group), each Σ e2m1·x times its group's scale. Consecutive lanes take consecutive words: the
// code loads coalesce, and x's 32-byte pieces spread over the shared-memory banks (groups of 16
// values a lane put every lane of a warp on two banks).
__device__ __forceinline__ float nvfp4_row_share(const unsigned char* codes, const unsigned char* scales, long row,
                                                 long in, const float* x, int first, int step) {
    const long words = in / 8;
    const unsigned* c = reinterpret_cast<const unsigned*>(codes + row * (in / 2));
    const unsigned char* s = scales + row * (in / NVFP4_GROUP);
    float acc = 0.0f;
#pragma unroll 4
    for (long w = first; w < words; w += step)
        acc = fmaf(nvfp4_e4m3(__ldg(s + w / 2)), nvfp4_word_dot(__ldg(c + w), x + w * 8), acc);
    return acc;
}

// The sum over the `width` lanes of a group of lanes (a power of 2, aligned), in every lane.
__device__ __forceinline__ float nvfp4_lanes_sum(float v, int width) {
    for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// ---------------------------------------------------------------------------------------------
// Token-major.

#define NVFP4_WARPS 8

// act [slots, inter], slot s = t * top_k + j; x [tokens, hidden]; ids [slots]; gate_up: codes
// [experts, 2 * inter, hidden / 2], scales [experts, 2 * inter, hidden / 16], globals one per
// rows_per_global rows (gate rows of an expert, then its up rows). Grid (ceil(inter / 8), slots):
// a block per 8 channels of one slot, its token's x row staged in shared memory (hidden floats,
// dynamic); a warp per channel reads the gate and up rows. An id outside [0, experts): NaN.
extern "C" __global__ void __launch_bounds__(NVFP4_WARPS * 32)
    moe_experts_gate_up_nvfp4(float* act, const float* x, const long long* ids, const unsigned char* codes,
                              const unsigned char* scales, const float* globals, long rows_per_global, int top_k,
                              long hidden, long inter, long experts) {
    wait_for_producers();
    extern __shared__ __align__(16) float nvfp4_x[];
    const long s = blockIdx.y, t = s / top_k;
    const float4* xr = reinterpret_cast<const float4*>(x + t * hidden);
    for (long i = threadIdx.x; i < hidden / 4; i += blockDim.x) reinterpret_cast<float4*>(nvfp4_x)[i] = xr[i];
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long r = (long)blockIdx.x * NVFP4_WARPS + warp;
    if (r >= inter) return;
    const long long e = ids[s];
    if (e < 0 || e >= experts) {
        if (lane == 0) act[s * inter + r] = NVFP4_NAN;
        return;
    }
    const long gate_row = e * 2 * inter + r, up_row = gate_row + inter;
    // The gate and up rows word by word together (as nvfp4_row_share, both rows' loads in
    // flight at once, x read once for both).
    const long words = hidden / 8, groups = hidden / NVFP4_GROUP;
    const unsigned* gc = reinterpret_cast<const unsigned*>(codes + gate_row * (hidden / 2));
    const unsigned* uc = reinterpret_cast<const unsigned*>(codes + up_row * (hidden / 2));
    const unsigned char* gs = scales + gate_row * groups;
    const unsigned char* us = scales + up_row * groups;
    float ga = 0.0f, ua = 0.0f;
#pragma unroll 4
    for (long w = lane; w < words; w += 32) {
        const unsigned cg = __ldg(gc + w), cu = __ldg(uc + w);
        const float sg = nvfp4_e4m3(__ldg(gs + w / 2)), su = nvfp4_e4m3(__ldg(us + w / 2));
        ga = fmaf(sg, nvfp4_word_dot(cg, nvfp4_x + w * 8), ga);
        ua = fmaf(su, nvfp4_word_dot(cu, nvfp4_x + w * 8), ua);
    }
    const float g = nvfp4_lanes_sum(ga, 32) * globals[gate_row / rows_per_global];
    const float u = nvfp4_lanes_sum(ua, 32) * globals[up_row / rows_per_global];
    if (lane == 0) act[s * inter + r] = silu_f32(g) * u;
}

// Output rows of a token a block of the down kernel takes: one a warp, so that a decode step's
// 2560 rows are 2560 warps (two a warp left the multiprocessors at 15% occupancy, each warp
// waiting on twice the chain of loads).
#define NVFP4_DOWN_ROWS 8

// y [tokens, hidden]; act [tokens * top_k, inter]; ids, w [tokens, top_k]; down: codes [experts,
// hidden, inter / 2], scales [experts, hidden, inter / 16], globals. Grid (ceil(hidden / 8),
// tokens): the token's act rows, ids and router weights staged in shared memory (dynamic:
// top_k * inter floats, then top_k i64 and top_k floats); a warp per output row at a time. The
// warp splits into groups of `lanes` lanes (a power of 2), a slot each, 32 / lanes slots a pass;
// each slot's product is summed over its group and scaled by its global, and then, as the
// reference, y = ((0 + w0·d0) + w1·d1) + ... in slot order with no fused multiply-add (every
// lane forms the same sum from the groups' values). An id outside [0, experts): the row is NaN.
extern "C" __global__ void __launch_bounds__(NVFP4_WARPS * 32)
    moe_experts_down_nvfp4(float* y, const float* act, const long long* ids, const float* w,
                           const unsigned char* codes, const unsigned char* scales, const float* globals,
                           long rows_per_global, int top_k, long hidden, long inter, long experts, int lanes) {
    wait_for_producers();
    extern __shared__ __align__(16) float nvfp4_down_shared[];
    float* a = nvfp4_down_shared;
    long long* sid = reinterpret_cast<long long*>(a + (long)top_k * inter);
    float* sw = reinterpret_cast<float*>(sid + top_k);
    const long t = blockIdx.y;
    const float4* ar = reinterpret_cast<const float4*>(act + t * top_k * inter);
#pragma unroll 4
    for (long i = threadIdx.x; i < (long)top_k * inter / 4; i += blockDim.x) reinterpret_cast<float4*>(a)[i] = ar[i];
    for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
        sid[j] = ids[t * top_k + j];
        sw[j] = w[t * top_k + j];
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int per_pass = 32 / lanes, member = lane % lanes, group = lane / lanes;
    for (int q = 0; q < NVFP4_DOWN_ROWS / NVFP4_WARPS; q++) {
        const long r = (long)blockIdx.x * NVFP4_DOWN_ROWS + q * NVFP4_WARPS + warp;
        if (r >= hidden) return;
        float acc = 0.0f;
        for (int j0 = 0; j0 < top_k; j0 += per_pass) {
            const int j = j0 + group;
            float d = 0.0f;
            if (j < top_k) {
                const long long e = sid[j];
                if (e >= 0 && e < experts) {
                    const long row = e * hidden + r;
                    d = nvfp4_row_share(codes, scales, row, inter, a + (long)j * inter, member, lanes);
                }
            }
            d = nvfp4_lanes_sum(d, lanes);
            for (int p = 0; p < per_pass && j0 + p < top_k; p++) {
                const float dp = __shfl_sync(0xffffffffu, d, p * lanes);
                const long long e = sid[j0 + p];
                if (e < 0 || e >= experts) {
                    acc = NVFP4_NAN;
                    continue;
                }
                const float scaled = dp * globals[(e * hidden + r) / rows_per_global];
                acc = __fadd_rn(acc, __fmul_rn(sw[j0 + p], scaled));
            }
        }
        if (lane == 0) y[t * hidden + r] = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// Expert-major, on the tensor cores (moe.cu's expert-major kernels and mma.cuh's tile; the
// grouping and the combine are moe.cu's). The products are of e2m1 · e4m3 (exact in bf16) with
// x's hi and lo halves; each output is scaled by its row's global after the tile's sum.

// The weight rows of an expert's NVFP4 matrix [rows, k] (codes and scales from the expert's
// first row), register-staged for mma_tile: with `inter` > 0 the gate/up rows interleaved (tile
// row r: gate row r / 2 for even r, up row r / 2 for odd r, as moe.cu's EmGateUpRows).
struct Nvfp4Rows {
    static constexpr bool REGISTER_STAGED = true;
    const unsigned char* codes;
    const unsigned char* scales;
    long k, inter;
    __device__ __forceinline__ long stored(long r) const { return inter > 0 ? (r & 1) * inter + (r >> 1) : r; }
    // The codes of values kk .. kk + 7 of row r (kk a multiple of 8) and their group's scale.
    __device__ __forceinline__ uint2 load(long r, long kk) const {
        const long sr = stored(r);
        uint2 v;
        v.x = __ldg(reinterpret_cast<const unsigned*>(codes + sr * (k / 2) + kk / 2));
        v.y = __ldg(scales + sr * (k / NVFP4_GROUP) + kk / NVFP4_GROUP);
        return v;
    }
    __device__ __forceinline__ uint4 widen(uint2 raw) const {
        const float s = nvfp4_e4m3(raw.y);
        unsigned p[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            p[i] = pack_bf16x2(nvfp4_e2m1((raw.x >> (8 * i)) & 15u) * s, nvfp4_e2m1((raw.x >> (8 * i + 4)) & 15u) * s);
        return make_uint4(p[0], p[1], p[2], p[3]);
    }
};

// act [slots, inter] = silu(x[slot / top_k] · gᵀ · Gg) * (x[slot / top_k] · uᵀ · Gu); gate_up as
// for the token-major kernel. Grid (max_tiles, ceil(2 * inter / EM_MMA_BN)).
extern "C" __global__ void __launch_bounds__(EM_MMA_WARPS_M * EM_MMA_WARPS_N * 32)
    moe_experts_expert_major_gate_up_mma_nvfp4(float* act, const float* x, const int* order, const int* tiles,
                                               const unsigned char* codes, const unsigned char* scales,
                                               const float* globals, long rows_per_global, int top_k, long hidden,
                                               long inter) {
    wait_for_producers();
    __shared__ int slot[EM_TILE], a_row[EM_TILE];
    int live = 0;
    const int e = em_tile_rows(order, tiles, top_k, slot, a_row, &live);
    if (e < 0) return;
    const long first = (long)e * 2 * inter;
    mma_tile<EM_MMA_WARPS_M, EM_MMA_WARPS_N, EM_MMA_MT, EM_MMA_NT>(
        EmGatherRows{x, a_row, hidden},
        Nvfp4Rows{codes + first * (hidden / 2), scales + first * (hidden / NVFP4_GROUP), hidden, inter}, 2 * inter,
        (long)blockIdx.y * EM_MMA_BN, hidden, live, [&](int i, long c, float g, float u) {
            // c is even: (c, c + 1) are the gate and up rows of channel c / 2.
            const int s = slot[i];
            if (s < 0 || c + 1 >= 2 * inter) return;
            const long ch = c / 2;
            const float gs = g * globals[(first + ch) / rows_per_global];
            const float us = u * globals[(first + inter + ch) / rows_per_global];
            act[(long)s * inter + ch] = silu_f32(gs) * us;
        });
}

// out [slots, hidden] = act · down_eᵀ · G; act [slots, inter]. Grid (max_tiles, ceil(hidden /
// EM_MMA_BN)).
extern "C" __global__ void __launch_bounds__(EM_MMA_WARPS_M * EM_MMA_WARPS_N * 32)
    moe_experts_expert_major_down_mma_nvfp4(float* out, const float* act, const int* order, const int* tiles,
                                            const unsigned char* codes, const unsigned char* scales,
                                            const float* globals, long rows_per_global, long hidden, long inter) {
    wait_for_producers();
    __shared__ int slot[EM_TILE], a_row[EM_TILE];
    int live = 0;
    const int e = em_tile_rows(order, tiles, 1, slot, a_row, &live);
    if (e < 0) return;
    const long first = (long)e * hidden;
    mma_tile<EM_MMA_WARPS_M, EM_MMA_WARPS_N, EM_MMA_MT, EM_MMA_NT>(
        EmGatherRows{act, a_row, inter},
        Nvfp4Rows{codes + first * (inter / 2), scales + first * (inter / NVFP4_GROUP), inter, 0}, hidden,
        (long)blockIdx.y * EM_MMA_BN, inter, live, [&](int i, long c, float v0, float v1) {
            const float g0 = c < hidden ? globals[(first + c) / rows_per_global] : 0.0f;
            const float g1 = c + 1 < hidden ? globals[(first + c + 1) / rows_per_global] : 0.0f;
            em_store_pair(out, slot[i], hidden, c, v0 * g0, v1 * g1);
        });
}
