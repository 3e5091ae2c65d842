// Routed experts with NVFP4 weights over the union of a step's experts, on the tensor cores:
// each selected expert's packed rows are read once for all the slots that chose it (a decode
// step's ten, a verify or batched step's few per expert), however few tokens the step has.
// src/ops/moe.rs and src/quant/nvfp4.rs are the reference; the layout is moe_nvfp4.cu's.
//
// Three launches (src/exec/cuda/launch/moe_nvfp4_union.rs):
// 1. `moe_experts_union_gate_up_nvfp4`: act = silu(x·gᵀ·Gg) * (x·uᵀ·Gu) for every slot, written
//    split: two bf16 parts, hi = bf16(act) and lo = bf16(act - hi), in the order the tensor
//    cores take them (below);
// 2. `moe_experts_union_down_nvfp4`: out [slots, hidden] = act · downᵀ · G;
// 3. moe.cu's slot-order combine.
//
// A block of (1) and (2) takes a tile of 16 weight rows of the expert of one slot, its
// "leader": the block of a slot whose expert an earlier slot also chose returns at once, and the
// leader's block takes every slot of that expert, four at a time (an mma's 8 columns are four
// slots' hi and lo parts), their inputs staged split in shared memory (x split as it is staged).
// A slot whose id is outside [0, experts) leads nothing; the combine makes its token's row NaN
// without reading its out row.
//
// The products are exact: a code's E2M1 value times its E4M3 scale has at most 6 significant bits
// (exact in bf16), the split parts are bf16, and the tensor cores sum exact products in f32; x is
// hi + lo to 2^-17 of itself. A code becomes bf16 bits by shifts alone: sign to bit 15, its
// exponent and mantissa (3 bits) to bits 6-8, which reads as 2^-126 times its value (code 1, 0.5,
// as a subnormal). The scale table holds each scale byte times 2^119 (largest 448 · 2^119 <
// 2^128), so the bf16 product (exact, normal) is value · scale · 2^-7; the sum is scaled back by
// 2^7 with the global.
//
// Tile of 16 rows x 128 columns (a "chunk"): thread (g = lane / 4, t = lane % 4) loads 16 bytes
// (32 codes, two scale groups) of rows g and g + 8 at columns 32t .. 32t + 31. The mma's k order
// is free as long as both operands follow it: of each 8-code word of a thread, codes (i, i + 4)
// form the bf16 pair i (both nibbles then sit 16 bits apart, so one shift places both). The split
// rows are stored in that order: per 8 values, the four pairs (v[i], v[i + 4]), i = 0..3, so that
// one 16-byte load gives a thread the B registers of a word.
//
// Staged rows in shared memory are free of bank conflicts: a thread reads words 4t .. 4t + 3 of a
// chunk in turn, so each group of four words is stored rotated by its t (`union_swizzle`), and a
// staged row takes `union_stride(k)` words, 4 more than a multiple of 8: the 8 threads of a
// quarter warp (two rows, four t) then read 8 distinct 16-byte bank groups.
#include "common.cuh"
#include "mma.cuh"
#include "nvfp4.cuh"
#include "moe_union.cuh"

// Weight rows of a tile, columns of a chunk, slots of a pass, chunks a warp loads at once.
#define UN_ROWS 16
#define UN_CHUNK 128
#define UN_SLOTS 4
#define UN_BATCH 5
#define UN_MAX_WARPS 4
// Windows of 32 ids a pass's scan loads at once.
#define UN_SCAN 8
// Units (8 values) of a staged row a thread loads at once.
#define UN_STAGE 4

// This warp's share of the tile's products: d[0], d[1] = row g's sums with the hi and lo parts of
// slot column t, d[2], d[3] the same for row g + 8 (the mma's accumulator layout, columns 2t and
// 2t + 1). row_a, row_b: this thread's rows g and g + 8 of the bank (-1: none); b: this thread's
// split row in shared memory (column g: slot g / 2's part g % 2), nullptr for a zero column. The warp takes chunks
// warp, warp + warps, ..., UN_BATCH of them loaded at once.
__device__ __forceinline__ void union_products(float (&d)[4], const unsigned char* codes, const unsigned char* scales,
                                               long k, long row_a, long row_b, const uint4* b, const unsigned* stab,
                                               int warp, int warps) {
    const int t = (threadIdx.x & 31) & 3;
    const long chunks = (k + UN_CHUNK - 1) / UN_CHUNK;
    const bool wide = k % 32 == 0;
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    for (long c0 = warp; c0 < chunks; c0 += (long)warps * UN_BATCH) {
        uint4 ca[UN_BATCH], cb[UN_BATCH];
        unsigned sa[UN_BATCH], sb[UN_BATCH];
#pragma unroll
        for (int u = 0; u < UN_BATCH; u++) {
            const long col = (c0 + (long)u * warps) * UN_CHUNK + 32 * t;
            ca[u] = union_codes(codes, row_a, k, col, wide);
            cb[u] = union_codes(codes, row_b, k, col, wide);
            sa[u] = union_scale_bytes(scales, row_a, k, col, wide);
            sb[u] = union_scale_bytes(scales, row_b, k, col, wide);
        }
#pragma unroll
        for (int u = 0; u < UN_BATCH; u++) {
            const long c = c0 + (long)u * warps;
            if (c >= chunks) break;  // warp-uniform
            const long word = (c * UN_CHUNK + 32 * t) / 8;
            uint4 bq[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const bool in = b != nullptr && (word + q) * 8 < k;
                bq[q] = in ? b[union_swizzle(word + q)] : make_uint4(0u, 0u, 0u, 0u);
            }
            const unsigned sa0 = stab[sa[u] & 0xFF], sa1 = stab[sa[u] >> 8];
            const unsigned sb0 = stab[sb[u] & 0xFF], sb1 = stab[sb[u] >> 8];
            union_word(d, ca[u].x, cb[u].x, sa0, sb0, bq[0]);
            union_word(d, ca[u].y, cb[u].y, sa0, sb0, bq[1]);
            union_word(d, ca[u].z, cb[u].z, sa1, sb1, bq[2]);
            union_word(d, ca[u].w, cb[u].w, sa1, sb1, bq[3]);
        }
    }
}

// A pass: up to UN_SLOTS slots of the block's expert, in slot order, and for each the row of
// the staged inputs its column reads.
struct UnionPass {
    long long e;
    long next;  // where the next pass's scan starts (slots: no more)
    int lead;   // whether the block's slot leads its expert (valid, no earlier slot chose it)
    int count;
    int list[UN_SLOTS];
    int staged[UN_SLOTS];
    int row_of[UN_SLOTS];  // staged row r's source row (its slot / per_row)
};

// Warp 0: the next pass of the block's expert from p.next (the first pass, `first`, also tests
// whether slot s leads: it scans from 0, and an earlier slot with the same id ends the block).
// `per_row`: slots per staged row (top_k when the rows are tokens, 1 when they are slots).
__device__ __forceinline__ void union_pass(UnionPass& p, const long long* ids, long slots, long s, bool first,
                                           long experts, int per_row) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    long long e;
    long from;
    if (first) {
        e = ids[s];  // issued with the first window's loads below
        from = 0;
    } else {
        e = p.e;
        from = p.next;
    }
    bool lead = e >= 0 && e < experts;
    int n = 0;
    long next = slots;
    bool done = !lead;
    // UN_SCAN windows of 32 ids a round, their loads issued together.
    for (long base = from; !done && base < slots; base += 32 * UN_SCAN) {
        long long v[UN_SCAN];
#pragma unroll
        for (int j = 0; j < UN_SCAN; j++) {
            const long i = base + 32 * j + lane;
            v[j] = i < slots ? ids[i] : -1;
        }
#pragma unroll
        for (int j = 0; j < UN_SCAN; j++) {
            const long wbase = base + 32 * j;
            if (done || wbase >= slots) break;  // warp-uniform
            unsigned m = __ballot_sync(0xffffffffu, wbase + lane < slots && v[j] == e);
            if (first && wbase < s) {
                const unsigned before = s - wbase >= 32 ? 0xffffffffu : (1u << (s - wbase)) - 1u;
                if (m & before) {
                    lead = false;
                    done = true;
                    break;
                }
                m &= ~before;
            }
            while (m != 0u && n < UN_SLOTS) {
                if (lane == 0) p.list[n] = (int)(wbase + __ffs(m) - 1);
                n++;
                m &= m - 1u;
            }
            if (m != 0u) {
                next = wbase + __ffs(m) - 1;
                done = true;
            }
        }
    }
    __syncwarp();
    if (lane == 0) {
        p.e = e;
        p.lead = lead;
        p.count = lead ? n : 0;
        p.next = next;
        int rows = 0;
        for (int j = 0; j < n; j++) {
            if (j == 0 || p.list[j] / per_row != p.list[j - 1] / per_row) p.row_of[rows++] = p.list[j] / per_row;
            p.staged[j] = rows - 1;
        }
    }
}

// The block's first pass (all threads call it): whether its slot leads.
__device__ __forceinline__ bool union_first_pass(UnionPass& p, const long long* ids, long slots, long experts,
                                                 int per_row) {
    union_pass(p, ids, slots, blockIdx.y, true, experts, per_row);
    __syncthreads();
    return p.lead;
}

// After a pass (all threads call it): the next one, false when the block's expert has no more
// slots. The pass and the staged rows are rewritten.
__device__ __forceinline__ bool union_next_pass(UnionPass& p, const long long* ids, long slots, long experts,
                                                int per_row) {
    __syncthreads();
    if (p.next >= slots) return false;
    union_pass(p, ids, slots, blockIdx.y, false, experts, per_row);
    __syncthreads();
    return p.count > 0;
}

// Sums the warps' products in warp order into warp 0's d (all threads of the block call it).
__device__ __forceinline__ void union_reduce(float (&d)[4], int warp, int warps) {
    __shared__ float part[UN_MAX_WARPS][32][4];
    if (warps == 1) return;
    const int lane = threadIdx.x & 31;
    if (warp > 0)
        for (int j = 0; j < 4; j++) part[warp][lane][j] = d[j];
    __syncthreads();
    if (warp == 0)
        for (int w = 1; w < warps; w++)
            for (int j = 0; j < 4; j++) d[j] += part[w][lane][j];
}

// This thread's B column in the staged rows ([rows][2][union_stride(k)] uint4): slot g / 2's
// part g % 2, nullptr past the pass's slots.
__device__ __forceinline__ const uint4* union_column(const UnionPass& p, const uint4* staged, long k, int g) {
    return g / 2 < p.count ? staged + ((long)p.staged[g / 2] * 2 + (g & 1)) * union_stride(k) : nullptr;
}

// --- Gate/up -------------------------------------------------------------------------------------

// act_split [slots, 2, inter / 8, 4] u32; x [rows, hidden] (slot s of row s / top_k); ids
// [slots]; gate_up codes [experts, 2 * inter, hidden / 2], scales [experts, 2 * inter, hidden /
// 16], globals one per rows_per_global rows. Grid (ceil(inter / (8 * tiles)), slots), blockDim.x
// = 32 * warps (warps <= UN_MAX_WARPS); dynamic shared memory: min(UN_SLOTS, rows) rows of x
// split (2 * union_stride(hidden) uint4 each). A block takes `tiles` tiles one after another, all of them
// prefetched into L2 at its start (so that a grid that fits the GPU at once has every byte it
// reads in flight from the start, without the registers that would hold them). A tile: gate
// rows of 8 channels (tile rows 0-7), then their up rows (8-15), so that thread (g, t) ends with
// channel g's gate and up sums for slot column t.
// Three blocks an SM: four (128 registers) spill the batch of loaded chunks to local memory.
extern "C" __global__ void __launch_bounds__(UN_MAX_WARPS * 32, 3)
    moe_experts_union_gate_up_nvfp4(unsigned* act_split, const float* x, const long long* ids,
                                    const unsigned char* codes, const unsigned char* scales, const float* globals,
                                    long rows_per_global, int top_k, long slots, long hidden, long inter,
                                    long experts, int tiles) {
    __shared__ unsigned stab[256];
    __shared__ UnionPass pass;
    extern __shared__ __align__(16) unsigned union_x[];
    fill_shared_scale_table(stab);
    wait_for_producers();
    if (!union_first_pass(pass, ids, slots, experts, top_k)) return;
    const long long e = pass.e;
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x & 31;
    const int g = lane / 4, t = lane % 4;
    const long first_ch = (long)blockIdx.x * tiles * 8;
    if (threadIdx.x == 0 && first_ch < inter) {
        const long n = min((long)tiles * 8, inter - first_ch), row = e * 2 * inter + first_ch;
        prefetch_weights(codes + row * (hidden / 2), n * (hidden / 2));
        prefetch_weights(codes + (row + inter) * (hidden / 2), n * (hidden / 2));
        prefetch_weights(scales + row * (hidden / NVFP4_GROUP), n * (hidden / NVFP4_GROUP));
        prefetch_weights(scales + (row + inter) * (hidden / NVFP4_GROUP), n * (hidden / NVFP4_GROUP));
    }
    do {
        // Stage x's rows for the pass, split: unit u (8 values of a row) becomes pairs (v[i],
        // v[i + 4]), hi then lo, UN_STAGE units a thread loaded at once.
        const int rows = pass.count == 0 ? 0 : pass.staged[pass.count - 1] + 1;
        const long words = hidden / 8, units = rows * words, stride = union_stride(hidden);
        for (long u0 = threadIdx.x; u0 < units; u0 += (long)UN_STAGE * blockDim.x) {
            float4 va[UN_STAGE], vb[UN_STAGE];
#pragma unroll
            for (int j = 0; j < UN_STAGE; j++) {
                const long u = u0 + (long)j * blockDim.x;
                if (u < units) {
                    const int r = (int)(u / words);
                    const float4* v =
                        reinterpret_cast<const float4*>(x + (long)pass.row_of[r] * hidden + (u - r * words) * 8);
                    va[j] = v[0];
                    vb[j] = v[1];
                }
            }
#pragma unroll
            for (int j = 0; j < UN_STAGE; j++) {
                const long u = u0 + (long)j * blockDim.x;
                if (u >= units) break;
                const int r = (int)(u / words);
                const long w = u - r * words;
                uint4 hi, lo;
                union_split(va[j].x, vb[j].x, hi.x, lo.x);
                union_split(va[j].y, vb[j].y, hi.y, lo.y);
                union_split(va[j].z, vb[j].z, hi.z, lo.z);
                union_split(va[j].w, vb[j].w, hi.w, lo.w);
                reinterpret_cast<uint4*>(union_x)[(long)r * 2 * stride + union_swizzle(w)] = hi;
                reinterpret_cast<uint4*>(union_x)[((long)r * 2 + 1) * stride + union_swizzle(w)] = lo;
            }
        }
        __syncthreads();
        const uint4* column = union_column(pass, reinterpret_cast<const uint4*>(union_x), hidden, g);
        for (int tile = 0; tile < tiles; tile++) {
            const long ch = first_ch + tile * 8 + g;
            if (first_ch + tile * 8 >= inter) break;  // block-uniform
            const long gate_row = ch < inter ? e * 2 * inter + ch : -1;
            const long up_row = ch < inter ? gate_row + inter : -1;
            const float gate_global = ch < inter ? globals[gate_row / rows_per_global] : 0.0f;
            const float up_global = ch < inter ? globals[up_row / rows_per_global] : 0.0f;
            float d[4];
            union_products(d, codes, scales, hidden, gate_row, up_row, column, stab, warp, warps);
            union_reduce(d, warp, warps);
            if (warp == 0 && t < pass.count && ch < inter) {
                const long slot = pass.list[t];
                const float gs = (d[0] + d[1]) * 128.0f * gate_global;
                const float us = (d[2] + d[3]) * 128.0f * up_global;
                const float a = silu_f32(gs) * us;
                // Split as staged: value ch is half (ch % 8) / 4 of pair ch % 4 of word ch / 8.
                bf16_t* row = reinterpret_cast<bf16_t*>(act_split) + slot * 2 * inter;
                const long at = (ch / 8) * 8 + (ch % 4) * 2 + (ch % 8) / 4;
                const unsigned hi = pack_bf16x2(a, 0.0f) & 0xFFFFu;
                row[at] = (bf16_t)hi;
                row[inter + at] = (bf16_t)(pack_bf16x2(a - __uint_as_float(hi << 16), 0.0f) & 0xFFFFu);
            }
            if (warps > 1) __syncthreads();  // warp 0 has read the other warps' products
        }
    } while (union_next_pass(pass, ids, slots, experts, top_k));
}

// --- Down ----------------------------------------------------------------------------------------

// out [slots, hidden] (rows of slots with a valid id); act_split [slots, 2, inter / 8, 4]; down
// codes [experts, hidden, inter / 2], scales, globals. Grid (ceil(hidden / 16), slots),
// blockDim.x = 32 * warps; dynamic shared memory: UN_SLOTS act rows split (2 *
// union_stride(inter) uint4 each). The tile: output rows 16·blockIdx.x .. +15.
extern "C" __global__ void __launch_bounds__(UN_MAX_WARPS * 32)
    moe_experts_union_down_nvfp4(float* out, const unsigned* act_split, const long long* ids,
                                 const unsigned char* codes, const unsigned char* scales, const float* globals,
                                 long rows_per_global, long slots, long hidden, long inter, long experts) {
    __shared__ unsigned stab[256];
    __shared__ UnionPass pass;
    extern __shared__ __align__(16) uint4 union_act[];
    fill_shared_scale_table(stab);
    wait_for_producers();
    if (!union_first_pass(pass, ids, slots, experts, 1)) return;
    const long long e = pass.e;
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x & 31;
    const int g = lane / 4, t = lane % 4;
    const long r0 = (long)blockIdx.x * UN_ROWS + g, r1 = r0 + 8;
    const long row_a = r0 < hidden ? e * hidden + r0 : -1;
    const long row_b = r1 < hidden ? e * hidden + r1 : -1;
    if (threadIdx.x == 0) {
        const long first = e * hidden + (long)blockIdx.x * UN_ROWS;
        const long n = min((long)UN_ROWS, hidden - (long)blockIdx.x * UN_ROWS);
        prefetch_weights(codes + first * (inter / 2), n * (inter / 2));
        prefetch_weights(scales + first * (inter / NVFP4_GROUP), n * (inter / NVFP4_GROUP));
    }
    const float global_a = row_a >= 0 ? globals[row_a / rows_per_global] : 0.0f;
    const float global_b = row_b >= 0 ? globals[row_b / rows_per_global] : 0.0f;
    const long part = inter / 8, words = 2 * part, stride = union_stride(inter);  // uint4 of a split row
    do {
        for (long q = threadIdx.x; q < pass.count * words; q += blockDim.x) {
            const int j = (int)(q / words);
            const long in_row = q - j * words, half = in_row / part, w = in_row - half * part;
            cp_async16(shared_addr(union_act + ((long)j * 2 + half) * stride + union_swizzle(w)),
                       reinterpret_cast<const uint4*>(act_split) + (long)pass.list[j] * words + in_row, true);
        }
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        float d[4];
        union_products(d, codes, scales, inter, row_a, row_b, union_column(pass, union_act, inter, g), stab, warp,
                       warps);
        union_reduce(d, warp, warps);
        if (warp == 0 && t < pass.count) {
            float* y = out + (long)pass.list[t] * hidden;
            if (row_a >= 0) y[r0] = (d[0] + d[1]) * 128.0f * global_a;
            if (row_b >= 0) y[r1] = (d[2] + d[3]) * 128.0f * global_b;
        }
    } while (union_next_pass(pass, ids, slots, experts, 1));
}
