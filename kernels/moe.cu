// Mixture of experts and PLE n-gram ids (src/ops/moe.rs and src/ops/ple.rs are the reference).
//
// - `moe_router_reference_f32`: softmax over each row of router logits, then the top k in
//   selection order, renormalised when asked; one block per row, ids and weights stay on the
//   device, equal bit for bit to the reference's (given the same exps: the reference fixes its
//   sum's order to one a warp forms quickly).
// - `moe_experts_gate_up_*` / `moe_experts_down_*`: the token-major routed SwiGLU experts in two
//   launches. The first writes act[t, j, :] = silu(G) * U for every slot (t, j); the second sums
//   the k down-projections of each token in slot order. Expert ids are read on the device.
// - `moe_experts_expert_major_*`: the same for many tokens, the slots grouped by expert on the
//   device so that each expert's weights are read once per tile of 64 of its slots; in SIMT
//   tiles, or on the tensor cores (`..._mma_bf16`, through mma.cuh) for bf16 weights.
// - `ple_ngram_ids_reference_i64`: hashed n-gram ids with the history carried in a device buffer.
#include "common.cuh"
#include "vec.cuh"
#include "mma.cuh"
#include "moe_tiles.cuh"
#include "ngram.cuh"

// The largest top k the router keeps per row (checked on the host).
#define ROUTER_MAX_TOPK 64
// -inf and a quiet NaN (NVRTC has no math.h constants).
#define MOE_NEG_INF __int_as_float(0xff800000)
#define MOE_NAN __int_as_float(0x7fc00000)
#define MOE_FULL_MASK 0xffffffffu

// ---------------------------------------------------------------------------------------------
// Router.
//
// One block per row, a thread per expert (past the block's 1024 threads experts wrap around, at
// most ROUTER_PER_LANE a thread), each step on values in registers, five barriers in all:
// - the max (order keys, NaN ignored as f32::max does): a warp reduction, then one across the
//   warps' maxima in shared memory;
// - the exps, in double rounded once to f32 (as close to the CPU's expf as a device gets), and
//   each chunk of 32's sum by butterfly shuffles (lane i adds lane i ^ 16, then ^ 8, ...: the
//   reference's halving, `ops::moe::softmax_sum`; every lane ends with the same bits);
// - the chunk sums halved the same way, in every warp at once;
// - the candidates for the top k: a bound below the k-th largest probability, known without
//   sorting: with at least k warps, the least of the warps' max logits (k warps hold a logit at
//   least that large, and the probability never decreases with the logit, so the k largest
//   probabilities are at least the bound's). The experts at or above it (a few dozen of 512 in
//   practice), as 64-bit ranks in the reference's order, are compacted into shared memory.
//   Fewer warps than k: every expert is a candidate;
// - a candidate's place among the k best: how many candidates rank above it;
// - the chosen k's sum (one add at a time, in order, as the reference) and the weights.
// The selection compares the probabilities themselves, so exact ties (equal p from different
// logits, zero probabilities, NaN rows) order as the reference orders them.
// Few dependent steps, as the router's time is its chain of them
// (docs/decisions/0012-router-bound-from-warp-maxima.md).

// Threads at most and experts a thread holds at most (1024 x 4 experts).
#define ROUTER_THREADS 1024
#define ROUTER_PER_LANE 4
#define ROUTER_WARPS (ROUTER_THREADS / 32)

// A 64-bit rank whose unsigned order is the reference's selection order: the value by
// f32::total_cmp (larger first), then the expert id (lower first). 0 is never a real rank.
__device__ __forceinline__ unsigned long long router_rank(float p, int id) {
    int bits = __float_as_int(p);
    bits ^= (int)(((unsigned int)(bits >> 31)) >> 1);  // total_cmp's key, ordered as a signed int
    const unsigned int ord = ((unsigned int)bits) ^ 0x80000000u;  // ... and as an unsigned int
    return (((unsigned long long)ord) << 32) | (unsigned long long)(~(unsigned int)id);
}

__device__ __forceinline__ int router_rank_id(unsigned long long rank) {
    return (int)(~(unsigned int)(rank & 0xffffffffull));
}

// The value a rank was made from (the key's map flips the low 31 bits of a negative value and
// keeps the sign, so the same map undoes it).
__device__ __forceinline__ float router_rank_value(unsigned long long rank) {
    int bits = (int)((unsigned int)(rank >> 32) ^ 0x80000000u);
    bits ^= (int)(((unsigned int)(bits >> 31)) >> 1);
    return __int_as_float(bits);
}

// The halving sum of the warp's 32 values (`ops::moe::softmax_sum`'s halving_sum): lane i adds
// lane i ^ off for off = 16, 8, 4, 2, 1. For i < off that is v[i] + v[i + off], the reference's
// step; the other lanes add the same two values the other way round, which rounds alike, so
// every lane ends with the same bits.
__device__ __forceinline__ float router_warp_halving_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(MOE_FULL_MASK, v, off));
    return v;
}

// ids, weights [rows, top_k]; logits [rows, experts]. Block: min(experts rounded up to 32, 1024)
// threads, experts <= PER x the block, top_k <= ROUTER_MAX_TOPK (checked on the host). PER (the
// experts a thread may hold) is a template argument: the narrow kernel (PER 1: up to 1024
// experts, the real model's 512) is a quarter of the wide one's code, which a kernel run once a
// layer fetches from L2 as it runs (docs/decisions/0011-code-size-in-once-a-layer-kernels.md).
// The launcher (`launch::moe::RouterKernel`) picks.
template <int PER>
__device__ __forceinline__ void router_rows(long long* ids, float* weights, const float* logits, long rows,
                                            int experts, int top_k, int normalize) {
    __shared__ int warp_key[ROUTER_WARPS];
    __shared__ float chunk_sum[ROUTER_WARPS * PER];
    __shared__ int candidates;
    __shared__ unsigned long long cand[ROUTER_THREADS * PER];
    __shared__ unsigned long long chosen[ROUTER_MAX_TOPK];

    const int threads = (int)blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warps = threads >> 5;
    const int per = PER == 1 ? 1 : (experts + threads - 1) / threads;  // experts a thread holds (<= PER)
    const int chunks = (experts + 31) >> 5;
    const bool bounded = warps >= top_k;

    for (long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* l = logits + row * experts;
        // Thread tid holds experts tid + q * threads: warp w's lanes hold chunk w + q * warps.
        float v[PER];
        int key = float_order_key(MOE_NEG_INF);
#pragma unroll
        for (int q = 0; q < PER; q++) {
            const int e = tid + q * threads;
            v[q] = (q < per && e < experts) ? __ldg(l + e) : MOE_NEG_INF;
            if (!isnan(v[q])) key = max(key, float_order_key(v[q]));
        }
        key = __reduce_max_sync(MOE_FULL_MASK, key);
        if (lane == 0) warp_key[warp] = key;
        if (tid == 0) candidates = 0;
        __syncthreads();
        const int wk = lane < warps ? warp_key[lane] : float_order_key(MOE_NEG_INF);
        const float mx = float_from_order_key(__reduce_max_sync(MOE_FULL_MASK, wk));
        // The bound: the least of the warps' max logits (-inf unbounded; an all-NaN warp's max
        // key is -inf's, which bounds nothing either).
        const float bound_logit =
            bounded ? float_from_order_key(__reduce_min_sync(MOE_FULL_MASK, lane < warps ? wk : 0x7fffffff))
                    : MOE_NEG_INF;

        // The exps (0 past the last expert: the reference's zero padding) and the chunk sums.
#pragma unroll
        for (int q = 0; q < PER; q++) {
            const int e = tid + q * threads;
            v[q] = (q < per && e < experts) ? (float)exp((double)__fsub_rn(v[q], mx)) : 0.0f;
            if (q < per) {
                const float s = router_warp_halving_sum(v[q]);
                if (lane == 0) chunk_sum[warp + q * warps] = s;
            }
        }
        const float bound_exp = (float)exp((double)__fsub_rn(bound_logit, mx));
        __syncthreads();
        // The chunk sums by halving, in every warp (no barrier after): lane i holds chunks i,
        // i + 32, i + 64, i + 96 (0 past the last); halving 128 then 64 of them is c0 += c2,
        // c1 += c3, then c0 += c1 (adding zeros changes nothing when there are fewer), then a
        // butterfly.
        float c[4];
#pragma unroll
        for (int m = 0; m < 4; m++)
            c[m] = (m < PER && lane + 32 * m < chunks) ? chunk_sum[lane + 32 * m] : 0.0f;
        if (PER > 1) {
            c[0] = __fadd_rn(c[0], c[2]);
            c[1] = __fadd_rn(c[1], c[3]);
            c[0] = __fadd_rn(c[0], c[1]);
        }
        const float sum = router_warp_halving_sum(c[0]);

        // The candidates: probabilities at least the bound's (NaN ones too: total_cmp puts a
        // positive NaN first), as ranks in shared memory, a warp's at once.
        const float bound_p = __fdiv_rn(bound_exp, sum);
#pragma unroll
        for (int q = 0; q < PER; q++) {
            const int e = tid + q * threads;
            if (q < per) {
                const float pr = __fdiv_rn(v[q], sum);
                const bool take = e < experts && (!bounded || pr >= bound_p || isnan(pr));
                const unsigned int ballot = __ballot_sync(MOE_FULL_MASK, take);
                if (ballot) {
                    int base = 0;
                    if (lane == 0) base = atomicAdd(&candidates, __popc(ballot));
                    base = __shfl_sync(MOE_FULL_MASK, base, 0);
                    if (take) cand[base + __popc(ballot & ((1u << lane) - 1u))] = router_rank(pr, e);
                }
            }
        }
        __syncthreads();
        // A candidate's place among the k best is how many candidates rank above it (ranks are
        // distinct: each carries its id), whatever order they were listed in. Warp 0 alone when
        // they are few, else the whole block.
        const int n = candidates;
        const int placers = n <= 32 ? 32 : threads;
        for (int i = tid; i < n && tid < placers; i += placers) {
            const unsigned long long x = cand[i];
            int place = 0;
#pragma unroll 8
            for (int o = 0; o < n; o++) place += cand[o] > x ? 1 : 0;
            if (place < top_k) chosen[place] = x;
        }
        if (n <= 32)
            __syncwarp();
        else
            __syncthreads();
        if (warp == 0) {
            // The weights: the chosen probabilities' sum one add at a time in order, as the
            // reference adds them.
            float total = 0.0f;
#pragma unroll 8
            for (int j = 0; j < top_k; j++) total = __fadd_rn(total, router_rank_value(chosen[j]));
            for (int j = lane; j < top_k; j += 32) {
                const float pr = router_rank_value(chosen[j]);
                ids[row * top_k + j] = router_rank_id(chosen[j]);
                weights[row * top_k + j] = normalize ? __fdiv_rn(pr, total) : pr;
            }
        }
        if (row + gridDim.x < rows) __syncthreads();  // shared memory is reused by the next row
    }
}

extern "C" __global__ void __launch_bounds__(ROUTER_THREADS)
    moe_router_reference_f32(long long* ids, float* weights, const float* logits, long rows, int experts,
                             int top_k, int normalize) {
    wait_for_producers();
    router_rows<ROUTER_PER_LANE>(ids, weights, logits, rows, experts, top_k, normalize);
}

extern "C" __global__ void __launch_bounds__(ROUTER_THREADS)
    moe_router_narrow_f32(long long* ids, float* weights, const float* logits, long rows, int experts, int top_k,
                          int normalize) {
    wait_for_producers();
    router_rows<1>(ids, weights, logits, rows, experts, top_k, normalize);
}

// ---------------------------------------------------------------------------------------------
// Routed experts, token-major.

// 16-byte chunks per row a lane has in flight at once in the gate/up kernel (from each of the two
// rows: twice this many loads).
#define GATE_UP_BATCH 5
// Chunks per slot a lane has in flight in the down kernel, for each of DOWN_PASSES slots at once.
// 10 at the real 640-wide rows: 8 lanes a (row, slot) product, so that moe_experts_down_rows'
// 80 products a block take 3 rounds of loads instead of 5.
#define DOWN_BATCH 10
#define DOWN_PASSES 2

// act [slots, inter], slot s = t * top_k + j; x [tokens, hidden]; ids [slots];
// gate_up [experts, 2 * inter, hidden] (inter gate rows, then inter up rows).
// One warp per (slot, r): the gate row r and the up row r of the slot's expert, read together,
// 2 * GATE_UP_BATCH 16-byte loads in flight per lane. Units s * inter + r are spread over the
// warps of the grid (consecutive warps: consecutive rows of one expert).
// An id outside [0, experts) yields NaN rather than a read out of bounds.
// Unit u's act value (every lane of the warp gets it).
template <typename W>
__device__ __forceinline__ float experts_gate_up_unit(const float* x, const long long* ids, const W* gate_up, long u,
                                                      int top_k, long hidden, long inter, long experts) {
    constexpr int N = WeightVec<W>::N;
    const int lane = threadIdx.x & 31;
    const long s = u / inter, r = u - s * inter;
    const long long e = ids[s];
    if (e < 0 || e >= experts) return MOE_NAN;
    const W* gw = gate_up + (e * 2 * inter + r) * hidden;
    const W* uw = gw + inter * hidden;
    const float* xr = x + (s / top_k) * hidden;
    float g = 0.0f, v = 0.0f;
    if (hidden % N == 0 && aligned16(gw) && aligned16(uw) && aligned16(xr)) {
        const long n = hidden / N;
        for (long i0 = lane; i0 < n; i0 += 32 * GATE_UP_BATCH) {
            uint4 gp[GATE_UP_BATCH], up[GATE_UP_BATCH];
#pragma unroll
            for (int b = 0; b < GATE_UP_BATCH; b++) {
                if (i0 + 32 * b < n) {
                    gp[b] = WeightVec<W>::load(gw, i0 + 32 * b);
                    up[b] = WeightVec<W>::load(uw, i0 + 32 * b);
                }
            }
#pragma unroll
            for (int b = 0; b < GATE_UP_BATCH; b++) {
                if (i0 + 32 * b < n) {
                    float xv[N], gv[N], uv[N];
                    act_chunk<N>(xr, i0 + 32 * b, xv);
                    WeightVec<W>::unpack(gp[b], gv);
                    WeightVec<W>::unpack(up[b], uv);
#pragma unroll
                    for (int q = 0; q < N; q++) {
                        g += gv[q] * xv[q];
                        v += uv[q] * xv[q];
                    }
                }
            }
        }
    } else {
        for (long i = lane; i < hidden; i += 32) {
            g += WeightVec<W>::one(gw, i) * xr[i];
            v += WeightVec<W>::one(uw, i) * xr[i];
        }
    }
    g = warp_sum(g);
    v = warp_sum(v);
    return silu_f32(g) * v;
}

// With inputs_ready and a warp for every unit (the launcher's full grid; not `one_wave`), the
// kernel runs ahead (kernels/common.cuh): each warp's unit is computed before the wait, stored
// after it.
#define EXPERTS_GATE_UP_KERNEL(W, SUFFIX)                                                                       \
    extern "C" __global__ void moe_experts_gate_up_##SUFFIX(float* act, const float* x, const long long* ids,    \
                                                            const W* gate_up, long slots, int top_k, long hidden, \
                                                            long inter, long experts, int inputs_ready) {         \
        const long units = slots * inter, warps = blockDim.x >> 5;                                               \
        const long first = blockIdx.x * warps + (threadIdx.x >> 5);                                              \
        const bool ahead = inputs_ready && units <= (long)gridDim.x * warps;                                     \
        wait_for_producers_unless(ahead);                                                                        \
        if (ahead) {                                                                                             \
            const float v =                                                                                      \
                first < units ? experts_gate_up_unit<W>(x, ids, gate_up, first, top_k, hidden, inter, experts)   \
                              : 0.0f;                                                                            \
            wait_for_producers();                                                                                \
            if ((threadIdx.x & 31) == 0 && first < units) act[first] = v;                                        \
        } else {                                                                                                 \
            for (long u = first; u < units; u += gridDim.x * warps) {                                            \
                const float v = experts_gate_up_unit<W>(x, ids, gate_up, u, top_k, hidden, inter, experts);      \
                if ((threadIdx.x & 31) == 0) act[u] = v;                                                         \
            }                                                                                                    \
        }                                                                                                        \
    }
EXPERTS_GATE_UP_KERNEL(float, f32)
EXPERTS_GATE_UP_KERNEL(bf16_t, bf16)

// A batch of down_share: the weight chunks i0, i0 + lanes, ... (< n, at most DOWN_BATCH) of row
// dr, then their products with the act row's chunks added to d in chunk order.
template <typename W>
__device__ __forceinline__ void down_batch_load(const W* dr, long n, long i0, int lanes, uint4 (&wp)[DOWN_BATCH]) {
#pragma unroll
    for (int b = 0; b < DOWN_BATCH; b++)
        if (i0 + (long)lanes * b < n) wp[b] = WeightVec<W>::load(dr, i0 + (long)lanes * b);
}

template <typename W>
__device__ __forceinline__ float down_batch_dot(float d, const float* ar, long n, long i0, int lanes,
                                                const uint4 (&wp)[DOWN_BATCH]) {
    constexpr int N = WeightVec<W>::N;
#pragma unroll
    for (int b = 0; b < DOWN_BATCH; b++) {
        if (i0 + (long)lanes * b < n) {
            float av[N], wv[N];
            act_chunk<N>(ar, i0 + (long)lanes * b, av);
            WeightVec<W>::unpack(wp[b], wv);
#pragma unroll
            for (int q = 0; q < N; q++) d += wv[q] * av[q];
        }
    }
    return d;
}

// One slot's down-projection row for a group of `lanes` lanes (sl: this lane's place in it):
// this lane's share of dot(down row, act row), chunks sl, sl + lanes, ... in batches of
// DOWN_BATCH loads. Reduced over the group by the caller.
template <typename W>
__device__ __forceinline__ float down_share(const W* dr, const float* ar, long inter, int sl, int lanes) {
    constexpr int N = WeightVec<W>::N;
    float d = 0.0f;
    if (inter % N == 0 && aligned16(dr) && aligned16(ar)) {
        const long n = inter / N;
        for (long i0 = sl; i0 < n; i0 += (long)lanes * DOWN_BATCH) {
            uint4 wp[DOWN_BATCH];
            down_batch_load<W>(dr, n, i0, lanes, wp);
            d = down_batch_dot<W>(d, ar, n, i0, lanes, wp);
        }
    } else {
        for (long i = sl; i < inter; i += lanes) d += WeightVec<W>::one(dr, i) * ar[i];
    }
    return d;
}

// A row's sum of its slots' down products as the reference forms it: ((0 + w0*d0) + w1*d1) + ...
// in slot order, no fused multiply-add.
__device__ __forceinline__ float slot_sum(const float* wt, const float* dots, int top_k) {
    float acc = 0.0f;
    for (int j = 0; j < top_k; j++) acc = __fadd_rn(acc, __fmul_rn(wt[j], dots[j]));
    return acc;
}

// y [tokens, hidden]; act [tokens * top_k, inter]; ids, w [tokens, top_k]; down [experts, hidden, inter].
// One block per (token t, output row r). A warp splits into 32/lanes groups of `lanes` lanes (a
// power of 2), one slot each, DOWN_PASSES such passes at once (up to DOWN_PASSES * DOWN_BATCH
// loads in flight per lane): a round of 32/lanes * DOWN_PASSES slots. The block's warps take the
// rounds (warp w: rounds w, w + warps, ...; the launcher gives one round a warp), so all of a
// row's slots are read at once; each slot's dot product lands in shared memory, and then, as the
// reference, y = ((0 + w0*d0) + w1*d1) + ... in slot order with no fused multiply-add. An id
// outside [0, experts) makes the row NaN. Dynamic shared memory: top_k floats.
template <typename W>
__device__ __forceinline__ void experts_down(float* y, const float* act, const long long* ids, const float* w,
                                             const W* down, long tokens, int top_k, long hidden, long inter,
                                             long experts, int lanes) {
    extern __shared__ float slot_dot[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int group = lane / lanes, sl = lane % lanes, per_pass = 32 / lanes;
    const int per_round = per_pass * DOWN_PASSES;
    const long units = tokens * hidden;
    for (long u = blockIdx.x; u < units; u += gridDim.x) {
        const long t = u / hidden, r = u - t * hidden;
        for (int j0 = warp * per_round; j0 < top_k; j0 += warps * per_round) {
            float d[DOWN_PASSES];
#pragma unroll
            for (int p = 0; p < DOWN_PASSES; p++) {
                const int j = j0 + p * per_pass + group;
                d[p] = 0.0f;
                if (j < top_k) {
                    const long s = t * top_k + j;
                    const long long e = ids[s];
                    if (e < 0 || e >= experts)
                        d[p] = MOE_NAN;
                    else
                        d[p] = down_share<W>(down + (e * hidden + r) * inter, act + s * inter, inter, sl, lanes);
                }
            }
#pragma unroll
            for (int p = 0; p < DOWN_PASSES; p++) {
                for (int off = lanes >> 1; off > 0; off >>= 1) d[p] += __shfl_xor_sync(MOE_FULL_MASK, d[p], off);
                const int j = j0 + p * per_pass + group;
                if (sl == 0 && j < top_k) slot_dot[j] = d[p];
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) y[u] = slot_sum(w + t * top_k, slot_dot, top_k);
        __syncthreads();  // slot_dot is rewritten for the next row
    }
}

extern "C" __global__ void moe_experts_down_f32(float* y, const float* act, const long long* ids, const float* w,
                                                const float* down, long tokens, int top_k, long hidden, long inter,
                                                long experts, int lanes) {
    wait_for_producers();
    experts_down<float>(y, act, ids, w, down, tokens, top_k, hidden, inter, experts, lanes);
}

extern "C" __global__ void moe_experts_down_bf16(float* y, const float* act, const long long* ids, const float* w,
                                                 const bf16_t* down, long tokens, int top_k, long hidden, long inter,
                                                 long experts, int lanes) {
    wait_for_producers();
    experts_down<bf16_t>(y, act, ids, w, down, tokens, top_k, hidden, inter, experts, lanes);
}

// The same sums, DOWN_ROWS output rows of one token a block (decode; the launcher's choice when
// the shapes allow): the token's top_k act rows are staged in shared memory once a block, where
// a block per row read them from L2 for every row (2560 blocks x 25.6 KB at the real geometry:
// twice the bytes of the weights). A group of `lanes` lanes takes one (row, slot)
// product at a time with down_share's chunks and order, and the row's sum is experts_down's:
// the same bits (the forms measured slower: docs/decisions/0013-moe-down-by-rows.md).
// Round trips to memory before the first product: the staging is cp.async (a load and a store a
// thread per 16 bytes, one after another, took 7 round trips for the 1600 16-byte units), the
// token's ids and router weights are staged with it (each round read its id from memory after
// the barrier, and the final sums the weights), and each group's first product, whose expert it
// reads from memory itself, has its weight chunks loaded before the staging is waited for (when
// a lane's chunks of a row are one batch, as at the real shape). The same products and sums.
// Dynamic shared memory: top_k * inter floats, top_k i64, (DOWN_ROWS + 1) * top_k floats.
#define DOWN_ROWS 8
#define DOWN_ROWS_THREADS 256

template <typename W>
__device__ __forceinline__ void experts_down_rows(float* y, const float* act, const long long* ids, const float* w,
                                                  const W* down, int top_k, long hidden, long inter, long experts,
                                                  int lanes) {
    constexpr int N = WeightVec<W>::N;
    extern __shared__ __align__(16) float down_smem[];
    float* acts = down_smem;  // [top_k, inter]
    long long* slot_e = reinterpret_cast<long long*>(down_smem + (long)top_k * inter);  // [top_k]
    float* dots = reinterpret_cast<float*>(slot_e + top_k);                          // [DOWN_ROWS, top_k]
    float* slot_w = dots + DOWN_ROWS * top_k;                                        // [top_k]
    const long t = blockIdx.x / (hidden / DOWN_ROWS), r0 = (blockIdx.x - t * (hidden / DOWN_ROWS)) * DOWN_ROWS;
    const int sl = (threadIdx.x & 31) % lanes, group = threadIdx.x / lanes, groups = blockDim.x / lanes;
    const int products = DOWN_ROWS * top_k;
    // This group's first product (d = group): its expert, read here, and its weight chunks.
    const int rr0 = group / top_k, j0 = group - rr0 * top_k;
    const long long e0 = group < products ? ids[t * top_k + j0] : -1;
    const long n = inter / N;
    const bool one_batch = inter % N == 0 && aligned16(down) && n <= (long)lanes * DOWN_BATCH;
    const long n4 = (long)top_k * inter / 4;
    const float4* src = reinterpret_cast<const float4*>(act + t * top_k * inter);
    float4* dst = reinterpret_cast<float4*>(acts);
    for (long i = threadIdx.x; i < n4; i += blockDim.x) cp_async16(shared_addr(dst + i), src + i, true);
    cp_async_commit();
    for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
        slot_e[j] = ids[t * top_k + j];
        slot_w[j] = w[t * top_k + j];
    }
    uint4 wp[DOWN_BATCH];
    const bool first_early = one_batch && e0 >= 0 && e0 < experts;
    if (first_early) down_batch_load<W>(down + (e0 * hidden + r0 + rr0) * inter, n, sl, lanes, wp);
    cp_async_wait_all();
    __syncthreads();
    // Every lane of a warp runs the same rounds (the shuffles take the whole warp).
    auto finish = [&](int d, float v) {
        for (int off = lanes >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(MOE_FULL_MASK, v, off);
        if (sl == 0 && d < products) dots[d] = v;
    };
    if (products > 0) {  // the first round: its weights are in flight
        float v = 0.0f;
        if (group < products)
            v = (e0 < 0 || e0 >= experts) ? MOE_NAN
                : first_early ? down_batch_dot<W>(0.0f, acts + (long)j0 * inter, n, sl, lanes, wp)
                              : down_share<W>(down + (e0 * hidden + r0 + rr0) * inter, acts + (long)j0 * inter, inter,
                                              sl, lanes);
        finish(group, v);
    }
    for (int d0 = groups; d0 < products; d0 += groups) {
        const int d = d0 + group;
        float v = 0.0f;
        if (d < products) {
            const int rr = d / top_k, j = d - rr * top_k;
            const long long e = slot_e[j];
            v = (e < 0 || e >= experts) ? MOE_NAN
                                        : down_share<W>(down + (e * hidden + r0 + rr) * inter, acts + (long)j * inter,
                                                        inter, sl, lanes);
        }
        finish(d, v);
    }
    __syncthreads();
    if (threadIdx.x < DOWN_ROWS)
        y[t * hidden + r0 + threadIdx.x] = slot_sum(slot_w, dots + threadIdx.x * top_k, top_k);
}

#define EXPERTS_DOWN_ROWS_KERNEL(W, SUFFIX)                                                                        \
    extern "C" __global__ void __launch_bounds__(DOWN_ROWS_THREADS)                                               \
        moe_experts_down_rows_##SUFFIX(float* y, const float* act, const long long* ids, const float* w,            \
                                       const W* down, int top_k, long hidden, long inter, long experts, int lanes) { \
        wait_for_producers();                                                                                       \
        experts_down_rows<W>(y, act, ids, w, down, top_k, hidden, inter, experts, lanes);                          \
    }
EXPERTS_DOWN_ROWS_KERNEL(float, f32)
EXPERTS_DOWN_ROWS_KERNEL(bf16_t, bf16)

// ---------------------------------------------------------------------------------------------
// Routed experts, expert-major (many tokens, `ops::moe::expert_major`): the slots are grouped by
// expert on the device, then each expert's weights are read once per tile of EM_TILE of its
// slots (instead of once per slot), in shared-memory tiles of EM_TILE slots x EM_TILE outputs
// (EM_TILE_K of the inner dimension at a time; 256 threads, thread (ty, tx) owns slots ty*4..+4
// and outputs tx*4..+4). Each slot's result is computed the same way wherever its row lands in
// a tile, so the grouping's order (atomics) changes no bit. Four launches:
// 1. `..._group`: `order` (slot indices by expert) and the tile table;
// 2. `..._gate_up_*`: act[s, :] = silu(G) * U for the slots of each tile;
// 3. `..._down_*`: out[s, :] = down_e · act[s, :] (one row per slot);
// 4. `..._combine_f32`: y[t] = ((0 + w0*out0) + w1*out1) + ... in slot order, as the reference.
// A slot with an id outside [0, experts) is in no group; its token's row is NaN.
// order [slots]: the valid slots, grouped by expert (ascending), any order within an expert;
// tiles [3 * max_tiles]: per tile (expert, first index in order, slots in it <= EM_TILE), and
// expert -1 past the last tile. max_tiles >= ceil(slots / EM_TILE) + experts. One block;
// dynamic shared memory: 3 * experts ints.
extern "C" __global__ void moe_experts_expert_major_group(int* order, int* tiles, const long long* ids, long slots,
                                                          int experts, long max_tiles) {
    wait_for_producers();
    extern __shared__ int em_shared[];
    int* count = em_shared;
    int* start = em_shared + experts;
    int* first_tile = em_shared + 2 * experts;
    __shared__ int total_tiles;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (long s = threadIdx.x; s < slots; s += blockDim.x) {
        const long long e = ids[s];
        if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int at = 0, tile = 0;
        for (int e = 0; e < experts; e++) {
            start[e] = at;
            first_tile[e] = tile;
            at += count[e];
            tile += (count[e] + EM_TILE - 1) / EM_TILE;
        }
        total_tiles = tile;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
        const int n = count[e];
        for (int j = 0; j * EM_TILE < n; j++) {
            const long b = first_tile[e] + j;
            tiles[3 * b] = e;
            tiles[3 * b + 1] = start[e] + j * EM_TILE;
            tiles[3 * b + 2] = min(EM_TILE, n - j * EM_TILE);
        }
    }
    for (long b = total_tiles + threadIdx.x; b < max_tiles; b += blockDim.x) {
        tiles[3 * b] = -1;
        tiles[3 * b + 1] = 0;
        tiles[3 * b + 2] = 0;
    }
    __syncthreads();  // `start` becomes each expert's cursor
    for (long s = threadIdx.x; s < slots; s += blockDim.x) {
        const long long e = ids[s];
        if (e >= 0 && e < experts) order[atomicAdd(&start[e], 1)] = (int)s;
    }
}

// out[slot, n] = f(a[a_row, :] · W1[n, :], a[a_row, :] · W2[n, :]) for the tile's rows and outputs
// n0..n0+EM_TILE-1 (W1, W2 [n, k]; TWO: both, else only W1 and f is the identity).
template <typename W, bool TWO>
__device__ __forceinline__ void em_tile_products(float (&acc1)[4][4], float (&acc2)[4][4], const float* a,
                                                 const int* a_row, const W* w1, const W* w2, long k, long n,
                                                 long n0) {
    __shared__ float as[EM_TILE][EM_TILE_K + 1];
    __shared__ float ws1[EM_TILE][EM_TILE_K + 1];
    __shared__ float ws2[TWO ? EM_TILE : 1][EM_TILE_K + 1];
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc1[i][j] = acc2[i][j] = 0.0f;
    for (long k0 = 0; k0 < k; k0 += EM_TILE_K) {
        for (int q = tid; q < EM_TILE * EM_TILE_K; q += 256) {
            const int row = q / EM_TILE_K, col = q % EM_TILE_K;
            const long kk = k0 + col;
            const int ar = a_row[row];
            as[row][col] = (ar >= 0 && kk < k) ? a[(long)ar * k + kk] : 0.0f;
            const long r = n0 + row;
            const bool in = r < n && kk < k;
            ws1[row][col] = in ? WeightVec<W>::one(w1, r * k + kk) : 0.0f;
            if (TWO) ws2[row][col] = in ? WeightVec<W>::one(w2, r * k + kk) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < EM_TILE_K; kk++) {
            float av[4], b1[4], b2[4];
#pragma unroll
            for (int i = 0; i < 4; i++) av[i] = as[ty * 4 + i][kk];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                b1[j] = ws1[tx * 4 + j][kk];
                b2[j] = TWO ? ws2[tx * 4 + j][kk] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc1[i][j] += av[i] * b1[j];
                    if (TWO) acc2[i][j] += av[i] * b2[j];
                }
        }
        __syncthreads();  // the tiles are rewritten next
    }
}

// act [slots, inter]; x [tokens, hidden]; gate_up [experts, 2 * inter, hidden]. Grid: (max_tiles,
// ceil(inter / EM_TILE)), 256 threads.
template <typename W>
__device__ __forceinline__ void em_gate_up(float* act, const float* x, const int* order, const int* tiles,
                                           const W* gate_up, int top_k, long hidden, long inter) {
    __shared__ int slot[EM_TILE], a_row[EM_TILE];
    const int e = em_tile_rows(order, tiles, top_k, slot, a_row);
    if (e < 0) return;
    const long n0 = (long)blockIdx.y * EM_TILE;
    const W* g = gate_up + (long)e * 2 * inter * hidden;
    float ga[4][4], ua[4][4];
    em_tile_products<W, true>(ga, ua, x, a_row, g, g + inter * hidden, hidden, inter, n0);
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int s = slot[ty * 4 + i];
        if (s < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long r = n0 + tx * 4 + j;
            if (r < inter) act[(long)s * inter + r] = silu_f32(ga[i][j]) * ua[i][j];
        }
    }
}

// out [slots, hidden]; act [slots, inter]; down [experts, hidden, inter]. Grid: (max_tiles,
// ceil(hidden / EM_TILE)), 256 threads.
template <typename W>
__device__ __forceinline__ void em_down(float* out, const float* act, const int* order, const int* tiles,
                                        const W* down, long hidden, long inter) {
    __shared__ int slot[EM_TILE], a_row[EM_TILE];
    const int e = em_tile_rows(order, tiles, 1, slot, a_row);
    if (e < 0) return;
    const long n0 = (long)blockIdx.y * EM_TILE;
    float da[4][4], unused[4][4];
    em_tile_products<W, false>(da, unused, act, a_row, down + (long)e * hidden * inter, down, inter, hidden, n0);
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int s = slot[ty * 4 + i];
        if (s < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const long r = n0 + tx * 4 + j;
            if (r < hidden) out[(long)s * hidden + r] = da[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    moe_experts_expert_major_gate_up_f32(float* act, const float* x, const int* order, const int* tiles,
                                         const float* gate_up, int top_k, long hidden, long inter) {
    wait_for_producers();
    em_gate_up<float>(act, x, order, tiles, gate_up, top_k, hidden, inter);
}

extern "C" __global__ void __launch_bounds__(256)
    moe_experts_expert_major_gate_up_bf16(float* act, const float* x, const int* order, const int* tiles,
                                          const bf16_t* gate_up, int top_k, long hidden, long inter) {
    wait_for_producers();
    em_gate_up<bf16_t>(act, x, order, tiles, gate_up, top_k, hidden, inter);
}

extern "C" __global__ void __launch_bounds__(256)
    moe_experts_expert_major_down_f32(float* out, const float* act, const int* order, const int* tiles,
                                      const float* down, long hidden, long inter) {
    wait_for_producers();
    em_down<float>(out, act, order, tiles, down, hidden, inter);
}

extern "C" __global__ void __launch_bounds__(256)
    moe_experts_expert_major_down_bf16(float* out, const float* act, const int* order, const int* tiles,
                                       const bf16_t* down, long hidden, long inter) {
    wait_for_producers();
    em_down<bf16_t>(out, act, order, tiles, down, hidden, inter);
}

// The expert-major products on the tensor cores (bf16 weights, hidden and inter multiples of 8:
// `mma_tile` in mma.cuh, its precision argument there): a tile of EM_TILE slots x 128 outputs a
// block of 8 warps, the tile table and `order` as above.
//   ..._gate_up_mma_bf16: act [slots, inter] = silu(x[slot / top_k] · gᵀ) * (x[slot / top_k] · uᵀ)
//                         (g, u: the expert's gate rows, then its up rows). The tile's weight
//                         rows alternate gate j, up j (EmGateUpRows), so each thread's pair of
//                         results is one channel's gate and up value, and it forms the channel's
//                         activation itself, as the reference (silu(g) * u, in f32);
//   ..._down_mma_bf16:    out [slots, hidden] = act · down_eᵀ.
// Row r of the interleaved gate/up matrix: gate row r / 2 for even r, up row r / 2 for odd r, of
// gate_up [2 * inter, hidden] (gate rows, then up rows).
struct EmGateUpRows {
    static constexpr bool REGISTER_STAGED = false;
    const bf16_t* w;
    long hidden, inter;
    __device__ __forceinline__ const bf16_t* row(long r) const {
        return w + ((r & 1) * inter + (r >> 1)) * hidden;
    }
};

// 64 slots x 128 outputs a block (8 warps of 32 x 32): each block stages its tile's activation
// rows (f32, split into bf16 hi and lo) once per 128 outputs, half as often as 64-wide blocks:
// the activation traffic, not the weights, bounds these kernels
// (docs/decisions/0014-expert-major-moe.md).
extern "C" __global__ void __launch_bounds__(EM_MMA_WARPS_M * EM_MMA_WARPS_N * 32)
    moe_experts_expert_major_gate_up_mma_bf16(float* act, const float* x, const int* order, const int* tiles,
                                              const bf16_t* gate_up, int top_k, long hidden, long inter) {
    wait_for_producers();
    __shared__ int slot[EM_TILE], a_row[EM_TILE];
    int live = 0;
    const int e = em_tile_rows(order, tiles, top_k, slot, a_row, &live);
    if (e < 0) return;
    mma_tile<EM_MMA_WARPS_M, EM_MMA_WARPS_N, EM_MMA_MT, EM_MMA_NT>(
        EmGatherRows{x, a_row, hidden}, EmGateUpRows{gate_up + (long)e * 2 * inter * hidden, hidden, inter},
        2 * inter, (long)blockIdx.y * EM_MMA_BN, hidden, live, [&](int i, long c, float g, float u) {
            // c is even: (c, c + 1) are the gate and up rows of channel c / 2.
            const int s = slot[i];
            if (s >= 0 && c + 1 < 2 * inter) act[(long)s * inter + c / 2] = silu_f32(g) * u;
        });
}

extern "C" __global__ void __launch_bounds__(EM_MMA_WARPS_M * EM_MMA_WARPS_N * 32)
    moe_experts_expert_major_down_mma_bf16(float* out, const float* act, const int* order, const int* tiles,
                                           const bf16_t* down, long hidden, long inter) {
    wait_for_producers();
    __shared__ int slot[EM_TILE], a_row[EM_TILE];
    int live = 0;
    const int e = em_tile_rows(order, tiles, 1, slot, a_row, &live);
    if (e < 0) return;
    mma_tile<EM_MMA_WARPS_M, EM_MMA_WARPS_N, EM_MMA_MT, EM_MMA_NT>(
        EmGatherRows{act, a_row, inter}, MmaWeightRows{down + (long)e * hidden * inter, inter}, hidden,
        (long)blockIdx.y * EM_MMA_BN, inter, live,
        [&](int i, long c, float v0, float v1) { em_store_pair(out, slot[i], hidden, c, v0, v1); });
}

#define COMBINE_BATCH 10

// y [tokens, hidden] = Σ_j w[t, j] * out[t * top_k + j, :], in slot order with no fused
// multiply-add (the reference's sum); NaN where a slot's id is outside [0, experts) (its `out`
// row was never written and is not read).
extern "C" __global__ void moe_experts_expert_major_combine_f32(float* y, const float* out, const long long* ids,
                                                                const float* w, long tokens, int top_k, long hidden,
                                                                long experts) {
    wait_for_producers();
    const long n = tokens * hidden;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long t = i / hidden, r = i - t * hidden;
        float acc = 0.0f;
        bool bad = false;
        // COMBINE_BATCH slots' loads issued together: the ids and weights, then the out rows of
        // the valid slots (an invalid slot's row was never written).
        for (int j0 = 0; j0 < top_k; j0 += COMBINE_BATCH) {
            long long e[COMBINE_BATCH];
            float ws[COMBINE_BATCH], o[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                const long s = t * top_k + j0 + u;
                e[u] = j0 + u < top_k ? ids[s] : 0;
                ws[u] = j0 + u < top_k ? w[s] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                const long s = t * top_k + j0 + u;
                o[u] = j0 + u < top_k && e[u] >= 0 && e[u] < experts ? out[s * hidden + r] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                if (j0 + u >= top_k) break;
                bad |= e[u] < 0 || e[u] >= experts;
                acc = __fadd_rn(acc, __fmul_rn(ws[u], o[u]));
            }
        }
        y[i] = bad ? MOE_NAN : acc;
    }
}

// ids [rows, (ngram-1) * hpn]; history [ngram-1] (read, then replaced by the last ngram-1 ids of
// history ++ tokens); tokens [rows]; multipliers [ngram]; sizes, offsets [(ngram-1) * hpn].
// One block: the old history is copied into shared memory before anyone writes it. A thread per
// (row, head), so that a decode step's 16 heads (each a 64-bit remainder after dependent loads)
// run at once rather than one after another in one thread; each forms its n-gram's mix from the
// row's history.
// The hashing is ngram.cuh's, shared with the fused ids + gather (embed.cu's ple_embed).
extern "C" __global__ void ple_ngram_ids_reference_i64(long long* ids, long long* history, const long long* tokens,
                                                       long rows, long long eos, int ngram, int hpn,
                                                       const long long* multipliers, const long long* sizes,
                                                       const long long* offsets) {
    wait_for_producers();
    __shared__ long long old_history[NGRAM_MAX_CTX];
    const int ctx = ngram - 1;
    ngram_load_own_state(old_history, history, ctx);
    const NgramArgs g{old_history, tokens, ctx, hpn, eos, multipliers, sizes, offsets};
    for (long item = threadIdx.x; item < rows * ctx * hpn; item += blockDim.x) ids[item] = ngram_id(g, item);
    __syncthreads();
    ngram_store_history(history, g, rows);
}
