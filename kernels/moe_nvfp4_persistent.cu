// Routed experts with NVFP4 weights over the union of a step's experts, by a grid sized to the
// GPU: every warp takes a run of the union's tiles and streams their codes, the next batch of
// chunks in flight while the tensor cores take the current one. For steps of a few tokens (a
// verify step, a small batch), where moe_nvfp4_union.cu's grid of a block per tile and slot runs
// in waves whose blocks each wait for their first loads. src/ops/moe.rs and src/quant/nvfp4.rs
// are the reference; the widening and the exact products are moe_nvfp4_union.cu's.
//
// Four launches (src/exec/cuda/launch/moe_nvfp4_persistent.rs):
// 1. `moe_experts_union_split_rows`: x split into bf16 hi and lo in the tensor cores' order
//    ([rows, 2, hidden / 8] words of 8 values: pairs (v[i], v[i + 4])), once for all tiles;
// 2. `moe_experts_persistent_gate_up_nvfp4`: act = silu(x·gᵀ·Gg) * (x·uᵀ·Gu), written split as
//    (1) ([slots, 2, inter / 8] words);
// 3. `moe_experts_persistent_down_nvfp4`: out [slots, hidden] = act · downᵀ · G;
// 4. moe.cu's slot-order combine.
//
// The union (every block of (2) and (3) builds it in shared memory, `pu_union`): the experts the
// valid slots chose, in the order of their first slots ("leaders"), each with its slots in
// passes of four (an mma's 8 columns are four slots' hi and lo parts). A unit is one pass over
// one tile of 16 weight rows (gate/up: 8 channels' gate then up rows; down: 16 output rows);
// units run leader by leader, pass by pass, tile by tile, and warp w of the grid takes units
// [w·n, (w + 1)·n), n = ceil(units / warps), so that a warp's units share their pass (its
// activation rows stay in L1). A warp takes a unit's whole k in batches of 5 chunks of 128
// columns; each thread's B parts come from the split rows in global memory (no staging, no
// barrier after the union is built). A slot whose id is outside [0, experts) is in no pass; the
// combine makes its token's row NaN without reading its out row.
#include "common.cuh"
#include "mma.cuh"
#include "nvfp4.cuh"
#include "moe_union.cuh"

// Warps a block, slots a pass, columns a chunk, chunks a warp loads at once.
#define PU_WARPS 4
#define PU_SLOTS 4
#define PU_CHUNK 128
#define PU_BATCH 5

// The union's sizes (shared memory; its lists are the dynamic shared memory, `pu_union`).
struct PuUnion {
    int leaders;  // distinct valid experts
    int units;    // passes times tiles, over all leaders
};

// The lists in dynamic shared memory (ints): head [experts] (an expert's first slot), count
// [experts] (its slots), sid [slots] (a slot's expert, -1 for an invalid id), leader [slots]
// (leader i's first slot), unit_end [slots] (units up to and including leader i's).
struct PuLists {
    int* head;
    int* count;
    int* sid;
    int* leader;
    int* unit_end;
    __device__ PuLists(int* smem, long slots, long experts)
        : head(smem),
          count(smem + experts),
          sid(smem + 2 * experts),
          leader(smem + 2 * experts + slots),
          unit_end(smem + 2 * experts + 2 * slots) {}
};

// Builds the union (all threads call it, after the wait): `tiles` units a pass.
__device__ __forceinline__ void pu_union(PuUnion& u, const PuLists& l, const long long* ids, long slots,
                                         long experts, int tiles) {
    for (long e = threadIdx.x; e < experts; e += blockDim.x) {
        l.head[e] = 0x7FFFFFFF;
        l.count[e] = 0;
    }
    for (long s = threadIdx.x; s < slots; s += blockDim.x) {
        const long long v = ids[s];
        l.sid[s] = v >= 0 && v < experts ? (int)v : -1;
    }
    __syncthreads();
    for (long s = threadIdx.x; s < slots; s += blockDim.x) {
        const int e = l.sid[s];
        if (e >= 0) {
            atomicMin(&l.head[e], (int)s);
            atomicAdd(&l.count[e], 1);
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int n = 0, total = 0;
        for (long base = 0; base < slots; base += 32) {
            const long s = base + lane;
            const int e = s < slots ? l.sid[s] : -1;
            const bool lead = e >= 0 && l.head[e] == (int)s;
            int inc = lead ? tiles * ((l.count[e] + PU_SLOTS - 1) / PU_SLOTS) : 0;
            for (int o = 1; o < 32; o <<= 1) {
                const int v = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += v;
            }
            const unsigned m = __ballot_sync(0xffffffffu, lead);
            if (lead) {
                const int at = n + __popc(m & ((1u << lane) - 1u));
                l.leader[at] = (int)s;
                l.unit_end[at] = total + inc;
            }
            n += __popc(m);
            total += __shfl_sync(0xffffffffu, inc, 31);
        }
        if (lane == 0) u.leaders = n, u.units = total;
    }
    __syncthreads();
}

// Pass `pass` of expert e (first slot `first`): how many slots it has (`count`, warp-uniform),
// the slot this thread's B column reads (column g: slot g / 2's part g % 2; -1 past the count),
// and the slot of its output column t (-1 past the count).
__device__ __forceinline__ void pu_pass(const PuLists& l, long slots, int first, int e, int pass, int& count,
                                        int& col_slot, int& out_slot) {
    const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    int skip = pass * PU_SLOTS, found = 0;
    col_slot = -1, out_slot = -1;
    for (long base = first; base < slots && found < PU_SLOTS; base += 32) {  // warp-uniform
        const long s = base + lane;
        unsigned m = __ballot_sync(0xffffffffu, s < slots && l.sid[s] == e);
        while (m != 0u && found < PU_SLOTS) {
            const int slot = (int)base + __ffs(m) - 1;
            m &= m - 1u;
            if (skip > 0) {
                skip--;
                continue;
            }
            if (found == g / 2) col_slot = slot;
            if (found == t) out_slot = slot;
            found++;
        }
    }
    count = found;
}

// One unit as a thread sees it: its weight rows (g and g + 8 of the tile), its B row (nullptr
// for a zero column) and its output column's slot.
struct PuUnit {
    long row_a, row_b;
    const uint4* b;
    int out_slot;
    int tile;
};

// A batch of chunks of a thread's two rows: codes and scale bytes.
struct PuBatch {
    uint4 ca[PU_BATCH], cb[PU_BATCH];
    unsigned sa[PU_BATCH], sb[PU_BATCH];
};

__device__ __forceinline__ void pu_load(PuBatch& b, const unsigned char* codes, const unsigned char* scales,
                                        const PuUnit& u, long k, int batch, bool wide) {
    const int t = (threadIdx.x & 31) & 3;
#pragma unroll
    for (int j = 0; j < PU_BATCH; j++) {
        const long col = ((long)batch * PU_BATCH + j) * PU_CHUNK + 32 * t;
        b.ca[j] = union_codes(codes, u.row_a, k, col, wide);
        b.cb[j] = union_codes(codes, u.row_b, k, col, wide);
        b.sa[j] = union_scale_bytes(scales, u.row_a, k, col, wide);
        b.sb[j] = union_scale_bytes(scales, u.row_b, k, col, wide);
    }
}

// The batch's products into d (the mma's accumulator layout: d[0], d[1] row g's sums with slot
// column t's hi and lo parts, d[2], d[3] row g + 8's).
__device__ __forceinline__ void pu_products(float (&d)[4], const PuBatch& b, const uint4* brow, long k, int batch,
                                            const unsigned* stab) {
    const int t = (threadIdx.x & 31) & 3;
#pragma unroll
    for (int j = 0; j < PU_BATCH; j++) {
        const long c = (long)batch * PU_BATCH + j;
        if (c * PU_CHUNK >= k) break;  // warp-uniform
        const long word = (c * PU_CHUNK + 32 * t) / 8;
        uint4 bq[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const bool in = brow != nullptr && (word + q) * 8 < k;
            bq[q] = in ? __ldg(brow + word + q) : make_uint4(0u, 0u, 0u, 0u);
        }
        const unsigned sa0 = stab[b.sa[j] & 0xFF], sa1 = stab[b.sa[j] >> 8];
        const unsigned sb0 = stab[b.sb[j] & 0xFF], sb1 = stab[b.sb[j] >> 8];
        union_word(d, b.ca[j].x, b.cb[j].x, sa0, sb0, bq[0]);
        union_word(d, b.ca[j].y, b.cb[j].y, sa0, sb0, bq[1]);
        union_word(d, b.ca[j].z, b.cb[j].z, sa1, sb1, bq[2]);
        union_word(d, b.ca[j].w, b.cb[j].w, sa1, sb1, bq[3]);
    }
}

// The walk of a warp's units (all threads of the block call it, after pu_union). `Tile` says a
// unit's rows and B row and writes its outputs: `rows(e, tile, unit)` fills row_a, row_b;
// `b_row(slot)` is a slot's split B row; `write(unit, d, count)`. `tiles`: units a pass; k: the
// columns of a row.
template <class Tile>
__device__ __forceinline__ void pu_walk(const PuUnion& un, const PuLists& l, long slots, const Tile& tile, int tiles,
                                        const unsigned char* codes, const unsigned char* scales, long k,
                                        const unsigned* stab) {
    const int lane = threadIdx.x & 31, g = lane / 4;
    const long warps = (long)gridDim.x * PU_WARPS, w = (long)blockIdx.x * PU_WARPS + threadIdx.x / 32;
    const long per = (un.units + warps - 1) / warps;
    const long u_first = w * per, u_end = min((long)un.units, u_first + per);
    if (u_first >= u_end) return;
    const bool wide = k % 32 == 0;
    const int batches = (int)((k + PU_CHUNK * PU_BATCH - 1) / (PU_CHUNK * PU_BATCH));
    // The pass the warp's columns were last found for, and the leader the walk is at.
    int leader = 0, pass_leader = -1, pass_at = -1, count = 0, col_slot = -1, out_slot = -1;
    // Unit `at` as this thread sees it (the pass's slots found when it changes).
    auto unit = [&](long at) {
        while (at >= l.unit_end[leader]) leader++;  // warp-uniform
        const long start = leader == 0 ? 0 : l.unit_end[leader - 1];
        const int pass = (int)((at - start) / tiles), t = (int)((at - start) % tiles);
        const int first = l.leader[leader], e = l.sid[first];
        if (leader != pass_leader || pass != pass_at) {
            pu_pass(l, slots, first, e, pass, count, col_slot, out_slot);
            pass_leader = leader, pass_at = pass;
        }
        PuUnit u;
        tile.rows(e, t, u);
        u.b = col_slot < 0 ? nullptr : tile.b_row(col_slot, g & 1);
        u.out_slot = out_slot;
        u.tile = t;
        return u;
    };
    long at = u_first;
    PuUnit cur_unit = unit(at);
    int cur_count = count;
    PuBatch cur, next;
    pu_load(cur, codes, scales, cur_unit, k, 0, wide);
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int batch = 0;
    while (true) {
        // The next batch's loads go out before this one's products.
        PuUnit next_unit = cur_unit;
        int next_batch = batch + 1, next_count = cur_count;
        bool more = true;
        if (next_batch == batches) {
            next_batch = 0;
            if (at + 1 < u_end) {
                next_unit = unit(at + 1);
                next_count = count;
            } else {
                more = false;
            }
        }
        if (more) pu_load(next, codes, scales, next_unit, k, next_batch, wide);
        pu_products(d, cur, cur_unit.b, k, batch, stab);
        if (batch + 1 == batches) {
            tile.write(cur_unit, d, cur_count);
            d[0] = d[1] = d[2] = d[3] = 0.0f;
        }
        if (!more) break;
        if (next_batch == 0) at++;
        cur_unit = next_unit, cur_count = next_count, batch = next_batch;
        cur = next;
    }
}

// --- The split rows --------------------------------------------------------------------------------

// split [rows, 2, k / 8] uint4 (hi then lo; word w: pairs (v[8w + i], v[8w + i + 4]), i = 0..3)
// of x [rows, k] (k a multiple of 8).
extern "C" __global__ void moe_experts_union_split_rows(uint4* split, const float* x, long rows, long k) {
    const long words = k / 8;
    wait_for_producers();
    GRID_STRIDE(i, rows * words) {
        const long r = i / words, w = i - r * words;
        const float4 va = reinterpret_cast<const float4*>(x + r * k)[2 * w];
        const float4 vb = reinterpret_cast<const float4*>(x + r * k)[2 * w + 1];
        uint4 hi, lo;
        union_split(va.x, vb.x, hi.x, lo.x);
        union_split(va.y, vb.y, hi.y, lo.y);
        union_split(va.z, vb.z, hi.z, lo.z);
        union_split(va.w, vb.w, hi.w, lo.w);
        split[(r * 2) * words + w] = hi;
        split[(r * 2 + 1) * words + w] = lo;
    }
}

// --- Gate/up -------------------------------------------------------------------------------------

// A gate/up unit: channels 8·tile .. + 7 of expert e, gate rows then up rows; B rows are the
// tokens' split x rows; the output is the slot's act, split as (1).
struct PuGateUp {
    unsigned* act_split;
    const uint4* x_split;
    const float* globals;
    long rows_per_global, hidden, inter;
    int top_k;
    __device__ void rows(int e, int tile, PuUnit& u) const {
        const int g = (threadIdx.x & 31) / 4;
        u.row_a = (long)e * 2 * inter + 8l * tile + g;
        u.row_b = u.row_a + inter;
    }
    __device__ const uint4* b_row(int slot, int part) const {
        return x_split + ((long)(slot / top_k) * 2 + part) * (hidden / 8);
    }
    __device__ void write(const PuUnit& u, const float (&d)[4], int count) const {
        const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
        if (t >= count) return;
        const long ch = 8l * u.tile + g;
        const float gs = (d[0] + d[1]) * 128.0f * globals[u.row_a / rows_per_global];
        const float us = (d[2] + d[3]) * 128.0f * globals[u.row_b / rows_per_global];
        const float a = silu_f32(gs) * us;
        // Value ch is half (ch % 8) / 4 of pair ch % 4 of word ch / 8.
        bf16_t* row = reinterpret_cast<bf16_t*>(act_split) + (long)u.out_slot * 2 * inter;
        const long at = (ch / 8) * 8 + (ch % 4) * 2 + (ch % 8) / 4;
        const unsigned hi = pack_bf16x2(a, 0.0f) & 0xFFFFu;
        row[at] = (bf16_t)hi;
        row[inter + at] = (bf16_t)(pack_bf16x2(a - __uint_as_float(hi << 16), 0.0f) & 0xFFFFu);
    }
};

// act_split [slots, 2, inter / 8] uint4; x_split [rows, 2, hidden / 8] uint4 (slot s of row s /
// top_k); ids [slots]; gate_up codes [experts, 2 * inter, hidden / 2], scales [experts, 2 *
// inter, hidden / 16], globals one per rows_per_global rows. Grid: any (the launcher's: the GPU's
// multiprocessors times the blocks an SM holds), PU_WARPS warps a block; dynamic shared memory:
// the union's lists (PuLists: 2 * experts + 3 * slots ints). inter a multiple of 8.
extern "C" __global__ void __launch_bounds__(PU_WARPS * 32, 3)
    moe_experts_persistent_gate_up_nvfp4(unsigned* act_split, const uint4* x_split, const long long* ids,
                                         const unsigned char* codes, const unsigned char* scales,
                                         const float* globals, long rows_per_global, int top_k, long slots,
                                         long hidden, long inter, long experts) {
    __shared__ unsigned stab[256];
    __shared__ PuUnion un;
    extern __shared__ int pu_lists[];
    fill_shared_scale_table(stab);
    wait_for_producers();
    const PuLists l(pu_lists, slots, experts);
    const int tiles = (int)(inter / 8);
    pu_union(un, l, ids, slots, experts, tiles);
    const PuGateUp tile{act_split, x_split, globals, rows_per_global, hidden, inter, top_k};
    pu_walk(un, l, slots, tile, tiles, codes, scales, hidden, stab);
}

// --- Down ----------------------------------------------------------------------------------------

// A down unit: output rows 16·tile + g and + 8 of expert e; B rows are the slots' split act rows.
struct PuDown {
    float* out;
    const uint4* act_split;
    const float* globals;
    long rows_per_global, hidden, inter;
    __device__ void rows(int e, int tile, PuUnit& u) const {
        const int g = (threadIdx.x & 31) / 4;
        u.row_a = (long)e * hidden + 16l * tile + g;
        u.row_b = u.row_a + 8;
    }
    __device__ const uint4* b_row(int slot, int part) const {
        return act_split + ((long)slot * 2 + part) * (inter / 8);
    }
    __device__ void write(const PuUnit& u, const float (&d)[4], int count) const {
        const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
        if (t >= count) return;
        float* y = out + (long)u.out_slot * hidden + 16l * u.tile + g;
        y[0] = (d[0] + d[1]) * 128.0f * globals[u.row_a / rows_per_global];
        y[8] = (d[2] + d[3]) * 128.0f * globals[u.row_b / rows_per_global];
    }
};

// out [slots, hidden] (rows of slots with a valid id); act_split [slots, 2, inter / 8] uint4;
// down codes [experts, hidden, inter / 2], scales, globals. Grid and shared memory as gate/up;
// hidden a multiple of 16.
extern "C" __global__ void __launch_bounds__(PU_WARPS * 32, 3)
    moe_experts_persistent_down_nvfp4(float* out, const uint4* act_split, const long long* ids,
                                      const unsigned char* codes, const unsigned char* scales,
                                      const float* globals, long rows_per_global, long slots, long hidden,
                                      long inter, long experts) {
    __shared__ unsigned stab[256];
    __shared__ PuUnion un;
    extern __shared__ int pu_lists[];
    fill_shared_scale_table(stab);
    wait_for_producers();
    const PuLists l(pu_lists, slots, experts);
    const int tiles = (int)(hidden / 16);
    pu_union(un, l, ids, slots, experts, tiles);
    const PuDown tile{out, act_split, globals, rows_per_global, hidden, inter};
    pu_walk(un, l, slots, tile, tiles, codes, scales, inter, stab);
}
