// RoPE, the QSA indexer's block selection and attention over the KV cache (src/ops/rope.rs,
// src/ops/indexer.rs, src/ops/attention.rs are the reference).
//
// Conventions (docs/cuda-plan.md): the step's start position is read from `step[0]` on the
// device; the launch geometry depends only on the step's row count and fixed capacities. Cache
// rows at or past `capacity` are never written or read (the caller checks `start + rows <=
// capacity` on the host, where it knows the position).
//
// Where the reference's rounding decides a discrete result (the indexer's pooled keys and block
// scores, whose ties and order pick the blocks), the arithmetic is spelled out with `__fmul_rn`,
// `__fadd_rn`, `__fdiv_rn`, `__fsqrt_rn` in the reference's order, so no FMA contraction changes
// a bit. The RoPE angles are computed in double and rounded to f32: that is the correctly
// rounded value of the reference's f32 `powf`, `cos` and `sin` (glibc is correctly rounded
// almost always; CUDA's f32 `powf`/`cosf`/`sinf` are off by up to 2 ulp).
#include "common.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------------
// RoPE

// cos and sin of pair `i` at `position`, as `ops::rope::angles`:
// inv_freq = 1 / (theta as f32)^((2i) as f32 / rot as f32); angle = position as f32 * inv_freq.
__device__ __forceinline__ void rope_angle(long long position, int i, int rot, double theta, float* c, float* s) {
    const float exponent = __fdiv_rn((float)(2 * i), (float)rot);
    const float base = __double2float_rn(theta);
    const float p = __double2float_rn(pow((double)base, (double)exponent));
    const float inv_freq = __fdiv_rn(1.0f, p);
    const float angle = __fmul_rn(__ll2float_rn(position), inv_freq);
    *c = __double2float_rn(cos((double)angle));
    *s = __double2float_rn(sin((double)angle));
}

// Channel `j` (< rot) of a rotated head `h` (pairs (i, i + rot/2)), as `ops::rope::rotate_head`.
__device__ __forceinline__ float rope_channel(const float* h, int j, int rot, float c, float s) {
    const int half = rot >> 1;
    if (j < half) {
        return __fsub_rn(__fmul_rn(h[j], c), __fmul_rn(h[j + half], s));
    }
    return __fadd_rn(__fmul_rn(h[j], c), __fmul_rn(h[j - half], s));
}

// x, y [rows, width], width a multiple of head_dim; row t at position step[0] + t.
extern "C" __global__ void rope_reference_f32(float* y, const float* x, const long long* step, long rows, long width,
                                              int head_dim, int rot, double theta) {
    const long long start = step[0];
    const int half = rot >> 1;
    GRID_STRIDE(e, rows * width) {
        const long t = e / width;
        const int j = (int)((e % width) % head_dim);
        if (j >= rot) {
            y[e] = x[e];
        } else {
            float c, s;
            rope_angle(start + t, j < half ? j : j - half, rot, theta, &c, &s);
            y[e] = rope_channel(x + (e - j), j, rot, c, s);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Appending rows to a preallocated state `[capacity, width]`: row t of src goes to row start+t.

extern "C" __global__ void append_rows_f32(float* dst, const float* src, const long long* step, long rows, long width,
                                           long capacity) {
    const long long start = step[0];
    GRID_STRIDE(e, rows * width) {
        const long long r = start + e / width;
        if (r >= 0 && r < capacity) dst[r * width + e % width] = src[e];
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer: pooled block keys (`ops::indexer::pool_blocks`).
//
// The blocks completed by this step are start/block .. (start+rows)/block, at most
// ceil(rows/block) of them: one thread block per slot, slot j → block start/block + j.
// key = rope(rms_norm(mean of the block's raw keys; 1 + w, eps); position block*blocksize).
// Dynamic shared memory: head_dim floats.
extern "C" __global__ void indexer_select_pool_f32(float* pooled, const float* raw, const float* w,
                                                   const long long* step, long rows, int head_dim, int rot, int block,
                                                   float eps, double theta, long pooled_capacity) {
    extern __shared__ float key[];
    __shared__ float inv_shared;
    const long long start = step[0];
    const long long first = start / block, end = (start + rows) / block;
    const long slots = (rows + block - 1) / block;
    for (long slot = blockIdx.x; slot < slots; slot += gridDim.x) {
        const long long b = first + slot;
        if (b >= end || b >= pooled_capacity) return;  // uniform over the thread block
        // Mean: `m += v` over the block's rows in order, then `m /= block`.
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            float m = 0.0f;
            for (int o = 0; o < block; o++) m = __fadd_rn(m, raw[(b * block + o) * head_dim + c]);
            key[c] = __fdiv_rn(m, (float)block);
        }
        __syncthreads();
        // RMS norm: the sum of squares in channel order, as the reference's iterator sum.
        if (threadIdx.x == 0) {
            float ss = 0.0f;
            for (int c = 0; c < head_dim; c++) ss = __fadd_rn(ss, __fmul_rn(key[c], key[c]));
            const float ms = __fdiv_rn(ss, (float)head_dim);
            inv_shared = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
        }
        __syncthreads();
        const float inv = inv_shared;
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            key[c] = __fmul_rn(__fmul_rn(key[c], inv), __fadd_rn(1.0f, w[c]));
        }
        __syncthreads();
        const int half = rot >> 1;
        float* out = pooled + b * head_dim;
        for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
            if (c >= rot) {
                out[c] = key[c];
            } else {
                float cs, sn;
                rope_angle(b * block, c < half ? c : c - half, rot, theta, &cs, &sn);
                out[c] = rope_channel(key, c, rot, cs, sn);
            }
        }
        __syncthreads();  // `key` is reused by the next slot
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer: block scores of the sparse rows (`ops::indexer::select`).
//
// score[t, b] = (Σ_h max(Σ_d q[t,h,d]·kb[d], 0)) / sqrt(head_dim), d ascending then h ascending,
// products and sums rounded separately: bit for bit the reference. Written for b < complete(t)
// of every sparse row t (complete(t) = (start+t+1)/block > keep); nothing else is written.
//
// Each thread block holds a tile of `tile` pooled keys in shared memory (row pitch head_dim+1
// against bank conflicts) and scores it against every row: the pooled keys are read once per
// step. blockDim.x is a multiple of `tile`; thread i scores block i % tile for rows
// i / tile, i / tile + blockDim.x / tile, ... Dynamic shared memory: tile * (head_dim + 1) floats.
extern "C" __global__ void indexer_select_score_f32(float* scores, const float* q, const float* pooled,
                                                    const long long* step, long rows, int heads, int head_dim,
                                                    int block, int keep, long pooled_capacity, int tile) {
    extern __shared__ float tile_keys[];
    const long long start = step[0];
    const long long max_complete = (start + rows) / block;  // the last row's complete blocks
    const int pitch = head_dim + 1;
    const int lane_block = threadIdx.x % tile, row_group = threadIdx.x / tile, row_groups = blockDim.x / tile;
    const float sqrt_d = __fsqrt_rn((float)head_dim);
    for (long b0 = (long)blockIdx.x * tile; b0 < pooled_capacity; b0 += (long)gridDim.x * tile) {
        const long long filled = min(max_complete, (long long)pooled_capacity);
        if (b0 >= filled) return;  // uniform over the thread block
        const int n = (int)min((long long)tile, filled - b0);
        __syncthreads();  // the previous tile may still be read
        for (int e = threadIdx.x; e < n * head_dim; e += blockDim.x) {
            tile_keys[(e / head_dim) * pitch + e % head_dim] = pooled[b0 * head_dim + e];
        }
        __syncthreads();
        if (lane_block >= n) continue;  // no barrier until the next tile
        const long b = b0 + lane_block;
        const float* kb = tile_keys + lane_block * pitch;
        for (long t = row_group; t < rows; t += row_groups) {
            const long long complete = (start + t + 1) / block;
            if (complete <= keep || b >= complete) continue;
            const float* qt = q + t * heads * head_dim;
            float sum = 0.0f;
            for (int h = 0; h < heads; h++) {
                const float* qh = qt + h * head_dim;
                float dot = 0.0f;
                for (int d = 0; d < head_dim; d++) dot = __fadd_rn(dot, __fmul_rn(qh[d], kb[d]));
                // f32::max(dot, 0.0): NaN counts as 0.
                sum = __fadd_rn(sum, dot > 0.0f ? dot : 0.0f);
            }
            scores[t * pooled_capacity + b] = __fdiv_rn(sum, sqrt_d);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer: the selection of each row (`ops::indexer::select`), one thread block per row.
//
// Dense row (complete <= keep): [visible, -1, -1...]. Sparse row: the top `keep` blocks under the
// reference's order (score descending by IEEE total order, then lower block first), ascending:
// [visible, keep, b0 < b1 < ...].
//
// Top-k without holding the candidates: every block gets a unique 64-bit key
//   (total-order bits of its score) << 32 | (0xFFFFFFFF - block)
// so that the reference's order is exactly descending key order. A most-significant-byte-first
// radix select (at most 8 passes over the row's scores, each a 256-bin histogram of the keys that
// share the bytes found so far) finds the keep-th largest key T; it stops early as soon as the
// chosen bin holds exactly the number still wanted. Then one ordered pass emits the blocks with
// key >= T in ascending order (a ballot prefix sum per chunk). Exactly `keep` blocks qualify.

#define TOPK_THREADS 1024

__device__ __forceinline__ unsigned long long select_key(float score, long b) {
    const unsigned int bits = __float_as_uint(score);
    const unsigned int ord = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((unsigned long long)ord << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned int)b);
}

extern "C" __global__ void indexer_select_topk_f32(int* sel, const float* scores, const long long* step, long rows,
                                                   int block, int keep, long pooled_capacity) {
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long prefix_shared;
    __shared__ unsigned int want_shared;
    __shared__ int done_shared;
    __shared__ unsigned int warp_counts[TOPK_THREADS / 32];
    const long long start = step[0];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (long t = blockIdx.x; t < rows; t += gridDim.x) {
        const long long visible = start + t + 1;
        // Clamped only for a cache that overflowed (the host checks), so nothing is read past it.
        const long long complete = min(visible / block, (long long)pooled_capacity);
        int* out = sel + t * (2 + (long)keep);
        if (complete <= keep) {
            for (int i = threadIdx.x; i < 2 + keep; i += blockDim.x) out[i] = i == 0 ? (int)visible : -1;
            continue;  // uniform over the thread block
        }
        if (threadIdx.x == 0) {
            out[0] = (int)visible;
            out[1] = keep;
        }
        if (keep == 0) continue;
        const float* s = scores + t * pooled_capacity;
        // Radix select of the keep-th largest key.
        if (threadIdx.x == 0) {
            prefix_shared = 0ull;
            want_shared = (unsigned int)keep;
            done_shared = 0;
        }
        for (int pass = 0; pass < 8; pass++) {
            const int shift = 56 - 8 * pass;
            for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
            __syncthreads();
            const unsigned long long prefix = prefix_shared;
            const unsigned long long mask = pass == 0 ? 0ull : ~0ull << (shift + 8);
            for (long base = 0; base < complete; base += blockDim.x) {
                const long b = base + threadIdx.x;
                unsigned int bin = 256;  // no bin
                if (b < complete) {
                    const unsigned long long k = select_key(s[b], b);
                    if ((k & mask) == prefix) bin = (unsigned int)(k >> shift) & 255u;
                }
                // One shared atomic per distinct bin of the warp (scores crowd into few bins).
                const unsigned int same = __match_any_sync(0xffffffffu, bin);
                if (bin < 256 && lane == __ffs(same) - 1) atomicAdd(&hist[bin], (unsigned int)__popc(same));
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                unsigned int want = want_shared, above = 0;
                int bin = 255;
                for (; bin > 0; bin--) {
                    if (above + hist[bin] >= want) break;
                    above += hist[bin];
                }
                want -= above;
                prefix_shared = prefix | ((unsigned long long)bin << shift);
                want_shared = want;
                done_shared = hist[bin] == want;
            }
            __syncthreads();
            if (done_shared) break;
        }
        // Every key >= threshold is kept: the bins above and all of the last chosen bin.
        const unsigned long long threshold = prefix_shared;
        int written = 0;
        for (long base = 0; base < complete; base += blockDim.x) {
            const long b = base + threadIdx.x;
            const bool kept = b < complete && select_key(s[b], b) >= threshold;
            const unsigned int ballot = __ballot_sync(0xffffffffu, kept);
            if (lane == 0) warp_counts[warp] = __popc(ballot);
            __syncthreads();
            int before = written;
            for (int w2 = 0; w2 < warp; w2++) before += warp_counts[w2];
            before += __popc(ballot & ((1u << lane) - 1u));
            if (kept && before < keep) out[2 + before] = (int)b;
            for (int w2 = 0; w2 < warps; w2++) written += warp_counts[w2];
            __syncthreads();  // warp_counts is rewritten by the next chunk
        }
        __syncthreads();  // the shared select state is reset by the next row
    }
}

// ---------------------------------------------------------------------------------------------
// Attention (`ops::attention::attend`): one thread block per (row, head); softmax(q·K/sqrt(hd))·V
// over the row's selected positions in ascending order, GQA head h → kv head h / (heads/kv_heads).
// Online softmax over chunks of ATTN_CHUNK positions (running max and sum, the accumulator
// rescaled), so any number of positions works. In a chunk each warp scores positions (lanes over
// the channels), then each thread accumulates channels over the chunk's positions.
// blockDim.x == ATTN_CHUNK. Dynamic shared memory: 2 * head_dim floats (q, accumulator).

#define ATTN_CHUNK 256

__device__ __forceinline__ float block_max_f32(float v) {
    __shared__ float partial_max[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    __syncthreads();
    if (lane == 0) partial_max[warp] = v;
    __syncthreads();
    float m = lane < warps ? partial_max[lane] : NEG_INF;
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    return m;
}

extern "C" __global__ void attention_reference_f32(float* out, const float* q, const float* k_cache,
                                                   const float* v_cache, const int* sel, long rows, int heads,
                                                   int kv_heads, int head_dim, int block, int keep, long capacity) {
    extern __shared__ float smem[];
    float* qs = smem;              // [head_dim]
    float* acc = smem + head_dim;  // [head_dim]
    __shared__ float weight[ATTN_CHUNK];
    __shared__ long long position[ATTN_CHUNK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const long kw = (long)kv_heads * head_dim;
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)head_dim));
    for (long task = blockIdx.x; task < rows * heads; task += gridDim.x) {
        const long t = task / heads;
        const int h = (int)(task % heads);
        const int kvh = h / (heads / kv_heads);
        const float* kbase = k_cache + (long)kvh * head_dim;
        const float* vbase = v_cache + (long)kvh * head_dim;
        const int* srow = sel + t * (2 + (long)keep);
        const long long visible = srow[0];
        const int count = srow[1];
        const long long complete = visible / block;
        const long long in_blocks = count < 0 ? 0 : (long long)count * block;
        const long long n = count < 0 ? visible : in_blocks + (visible - complete * block);
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            qs[d] = q[task * head_dim + d];
            acc[d] = 0.0f;
        }
        float m = NEG_INF, l = 0.0f;
        for (long long c0 = 0; c0 < n; c0 += ATTN_CHUNK) {
            const int len = (int)min((long long)ATTN_CHUNK, n - c0);
            __syncthreads();  // qs is written; the previous chunk's weights are consumed
            if (threadIdx.x < ATTN_CHUNK) {
                const long long j = c0 + threadIdx.x;
                long long p = -1;
                if (j < n) {
                    if (count < 0) {
                        p = j;
                    } else if (j < in_blocks) {
                        p = (long long)srow[2 + j / block] * block + j % block;
                    } else {
                        p = complete * block + (j - in_blocks);
                    }
                    if (p < 0 || p >= capacity) p = -1;
                }
                position[threadIdx.x] = p;
            }
            __syncthreads();
            for (int jj = warp; jj < len; jj += warps) {
                const long long p = position[jj];
                float dot = 0.0f;
                if (p >= 0) {
                    const float* kr = kbase + p * kw;
                    for (int d = lane; d < head_dim; d += 32) dot += qs[d] * kr[d];
                }
                dot = warp_sum(dot);
                if (lane == 0) weight[jj] = p >= 0 ? dot * scale : NEG_INF;
            }
            __syncthreads();
            const float s = threadIdx.x < len ? weight[threadIdx.x] : NEG_INF;
            const float m_new = fmaxf(m, block_max_f32(s));
            // Every chunk holds a valid position unless the cache is too short; then nothing moves.
            const float alpha = m_new == NEG_INF ? 1.0f : expf(m - m_new);
            const float e = s == NEG_INF ? 0.0f : expf(s - m_new);
            const float chunk_sum = block_sum(e);  // starts with a barrier: all weights were read
            if (threadIdx.x < len) weight[threadIdx.x] = e;
            __syncthreads();
            l = l * alpha + chunk_sum;
            m = m_new;
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
                float a = acc[d] * alpha;
                for (int jj = 0; jj < len; jj++) {
                    const long long p = position[jj];
                    if (p >= 0) a += weight[jj] * vbase[p * kw + d];
                }
                acc[d] = a;
            }
        }
        __syncthreads();
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            out[task * head_dim + d] = l > 0.0f ? acc[d] / l : 0.0f;
        }
        __syncthreads();  // qs and acc are rewritten by the next task
    }
}

// ---------------------------------------------------------------------------------------------
// Attention split over positions (flash-decoding), for a few rows (decode): the same function as
// `attention_reference_f32`, computed in two kernels.
//
// 1. `attention_split_g<G>_f32` (exactly G heads per kv head, G = 4, 8, 12, 16; the real model
//    has 12) and `attention_split_upto<G>_f32` (up to G): the group's accumulators are
//    registers. One task per (row t, kv head g, split s). A task attends ALL query heads of kv
//    head g (the GQA group, heads/kv_heads) over split s of the row's selected positions, so
//    each K/V row is read from memory once per step, not once per query head. The row's n
//    positions (counted from the device selection) are cut into `splits` contiguous ranges of
//    ceil(n/splits); `splits` is fixed by the launch (rows, capacity, keep), never by the
//    position, and a split whose range is empty still writes its (m = -inf, l = 0, acc = 0).
//    Per head it writes the split's running max m, sum l = Σ exp(score - m) and the
//    unnormalised accumulator Σ exp(score - m)·v to the scratch:
//      part_acc [rows, heads, splits, head_dim], part_ml [rows, heads, splits] of (m, l).
//    A split loops over chunks of SPLIT_CHUNK positions with an online softmax (any n works):
//    - the positions of the chunk go to shared memory (and their V rows are prefetched to L2);
//    - scores: warp w takes positions 4w..4w+3, 8 lanes per position, lane l8 holding the
//      16-byte quads l8, l8+8, ... of the K row (each 8-lane group reads 128 contiguous bytes);
//      each lane dots them with every head's q (shared memory, row pitch SPLIT_MAX_QUADS quads),
//      and a butterfly over the 8 lanes sums 8 heads in 7 shuffles, one head per lane;
//    - softmax: warp w updates heads w and w+8 (lane = position of the chunk);
//    - values: thread (pg = tid/64, c4 = tid%64) accumulates quad c4 of the V rows of positions
//      pg, pg+4, ... for every head of the group (16-byte loads, 512 contiguous bytes per warp);
//      the four position groups are summed in shared memory at the end of the split.
//    blockDim.x == SPLIT_THREADS; head_dim a multiple of 4, at most 4*SPLIT_MAX_QUADS; capacity
//    at most i32::MAX. Dynamic shared memory: group*SPLIT_MAX_QUADS float4 (the group's q, then
//    the end-of-split reduction).
// 2. `attention_split_combine_f32`: one thread block per (row, head): M = max m_s,
//    out = Σ_s exp(m_s - M)·acc_s / Σ_s exp(m_s - M)·l_s (0 where no position was attended).
//    blockDim.x == SPLIT_THREADS. Dynamic shared memory: splits floats.

#define SPLIT_THREADS 256
#define SPLIT_CHUNK 32
#define SPLIT_MAX_GROUP 16
#define SPLIT_MAX_QUADS 64
#define SPLIT_QPL (SPLIT_MAX_QUADS / 8)
#define SPLIT_PITCH (SPLIT_MAX_GROUP + 4)
static_assert(SPLIT_CHUNK == 32 && SPLIT_THREADS == 256, "8 warps x 4 positions make a chunk");

__device__ __forceinline__ float4 ldg_f4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

__device__ __forceinline__ void fma4(float4& a, float w, const float4& v) {
    a.x += w * v.x;
    a.y += w * v.y;
    a.z += w * v.z;
    a.w += w * v.w;
}

__device__ __forceinline__ void scale4(float4& a, float w) {
    a.x *= w;
    a.y *= w;
    a.z *= w;
    a.w *= w;
}

// One butterfly step over lanes `lane ^ offset` on 2*half values: the lane with `offset` set keeps
// (and receives the partner's part of) the upper half, the other the lower half.
template <int HALF>
__device__ __forceinline__ void split_reduce_step(float* v, int lane, int offset) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const float keep_v = upper ? v[i + HALF] : v[i];
        const float send_v = upper ? v[i] : v[i + HALF];
        v[i] = keep_v + __shfl_xor_sync(0xffffffffu, send_v, offset);
    }
}

// G: the most heads of a group this instantiation takes (the accumulators are registers); EXACT:
// the group is exactly G (every head check folds away at compile time).
template <int G, bool EXACT>
__device__ __forceinline__ void attention_split(float* part_acc, float* part_ml, const float* q,
                                                const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                                                const int* sel, long rows, int heads, int kv_heads, int head_dim,
                                                int block, int keep, long capacity, int splits) {
    static_assert(G % 4 == 0 && G <= SPLIT_MAX_GROUP, "heads are weighed four at a time, two per warp");
    extern __shared__ float4 split_smem[];  // [group][SPLIT_MAX_QUADS]
    __shared__ int position[SPLIT_CHUNK];
    __shared__ __align__(16) float weight[SPLIT_CHUNK * SPLIT_PITCH];  // [position][head]
    __shared__ float alpha_shared[SPLIT_MAX_GROUP];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int group = EXACT ? G : heads / kv_heads;
    const int hd4 = head_dim >> 2;
    const long kw = (long)kv_heads * head_dim;
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)head_dim));
    const int sub = lane >> 3, l8 = lane & 7;  // scores: position 4*warp + sub, lane l8 of 8
    const int pg = tid >> 6, c4 = tid & 63;    // values: position group, quad of channels
    const long tasks = rows * kv_heads * (long)splits;
    for (long task = blockIdx.x; task < tasks; task += gridDim.x) {
        const int s = (int)(task % splits);
        const long tg = task / splits;
        const int kvh = (int)(tg % kv_heads);
        const long t = tg / kv_heads;
        const int* srow = sel + t * (2 + (long)keep);
        // Positions are ints (the host checks capacity <= i32::MAX), which keeps registers free.
        const int visible = srow[0];
        const int count = min(srow[1], keep);
        const int complete = visible / block;
        const int in_blocks = count < 0 ? 0 : count * block;
        const int n = max(0, count < 0 ? visible : in_blocks + (visible - complete * block));
        const int per = n / splits + (n % splits != 0);
        const int j0 = (int)min((long long)n, (long long)s * per), j1 = min(n, j0 + per);
        const float* kbase = k_cache + (long)kvh * head_dim;
        const float* vbase = v_cache + (long)kvh * head_dim;
        const long head0 = t * heads + (long)kvh * group;  // the group's first query head

        const float4* qg = reinterpret_cast<const float4*>(q + head0 * head_dim);
#pragma unroll 4
        for (int e = tid; e < group * hd4; e += blockDim.x) split_smem[(e / hd4) * SPLIT_MAX_QUADS + e % hd4] = qg[e];
        float4 acc[G];
#pragma unroll
        for (int h = 0; h < G; h++) acc[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.0f, 0.0f};  // heads warp, warp + 8

        for (int c0 = j0; c0 < j1; c0 += SPLIT_CHUNK) {
            const int len = min(SPLIT_CHUNK, j1 - c0);
            __syncthreads();  // q is written; the previous chunk's positions and weights are consumed
            if (tid < SPLIT_CHUNK) {
                long long p = -1;
                if (tid < len) {
                    const int j = c0 + tid;
                    if (count < 0) {
                        p = j;
                    } else if (j < in_blocks) {
                        p = (long long)srow[2 + j / block] * block + j % block;
                    } else {
                        p = complete * block + (j - in_blocks);
                    }
                    if (p < 0 || p >= capacity) p = -1;
                }
                position[tid] = (int)p;
            }
            __syncthreads();
            {
                // The chunk's V rows, one 128-byte line per thread, on their way to L2 while the
                // scores are computed.
                const int jj = tid >> 3, line = tid & 7;
                const int p = position[jj];
                if (p >= 0 && line * 32 < head_dim) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(vbase + p * kw + line * 32));
                }
            }

            // Scores of positions 4*warp + sub for every head of the group.
            {
                const int jj = warp * 4 + sub;
                const int p = position[jj];
                float4 kr[SPLIT_QPL];
#pragma unroll
                for (int i = 0; i < SPLIT_QPL; i++) {
                    const int c = i * 8 + l8;
                    kr[i] = (p >= 0 && c < hd4) ? ldg_f4(kbase + p * kw + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
                // Eight heads at a time: each lane's partial dots, then a butterfly over the 8
                // lanes of the position that halves the heads at each step (offset 4: heads 4..7
                // go to the lanes with bit 2 set; 2: the upper 2 of those to bit 1; 1: the upper
                // one to bit 0), 7 shuffles for 8 sums: lane l8 ends with head 8*pass + l8.
#pragma unroll
                for (int pass = 0; pass < (G + 7) / 8; pass++) {
                    if (8 * pass < group) {  // uniform over the block
                        float dots[8];
#pragma unroll
                        for (int hh = 0; hh < 8; hh++) {
                            const int h = 8 * pass + hh;
                            float d = 0.0f;
                            if (h < group) {
#pragma unroll
                                for (int i = 0; i < SPLIT_QPL; i++) {
                                    const int c = i * 8 + l8;
                                    if (c < hd4) {
                                        const float4 qv = split_smem[h * SPLIT_MAX_QUADS + c];
                                        d += qv.x * kr[i].x;
                                        d += qv.y * kr[i].y;
                                        d += qv.z * kr[i].z;
                                        d += qv.w * kr[i].w;
                                    }
                                }
                            }
                            dots[hh] = d;
                        }
                        split_reduce_step<4>(dots, lane, 4);
                        split_reduce_step<2>(dots, lane, 2);
                        split_reduce_step<1>(dots, lane, 1);
                        const int h = 8 * pass + l8;
                        if (h < group) weight[jj * SPLIT_PITCH + h] = p >= 0 ? dots[0] * scale : NEG_INF;
                    }
                }
            }
            __syncthreads();

            // Online softmax of heads warp and warp + 8 over the chunk (lane = position).
#pragma unroll
            for (int k2 = 0; k2 < 2; k2++) {
                const int h = warp + 8 * k2;
                if (h < group) {  // uniform over the warp
                    const float sc = lane < len ? weight[lane * SPLIT_PITCH + h] : NEG_INF;
                    float cm = sc;
                    for (int offset = 16; offset > 0; offset >>= 1) {
                        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, offset));
                    }
                    const float m_new = fmaxf(m_run[k2], cm);
                    // Every chunk holds a valid position unless the cache is too short; then nothing moves.
                    const float alpha = m_new == NEG_INF ? 1.0f : expf(m_run[k2] - m_new);
                    const float e = sc == NEG_INF ? 0.0f : expf(sc - m_new);
                    weight[lane * SPLIT_PITCH + h] = e;
                    l_run[k2] = l_run[k2] * alpha + warp_sum(e);
                    m_run[k2] = m_new;
                    if (lane == 0) alpha_shared[h] = alpha;
                }
            }
            __syncthreads();

            // Values: quad c4 of positions pg, pg + 4, ... for every head.
            if (c4 < hd4) {
#pragma unroll
                for (int h = 0; h < G; h++) {
                    if (h < group) scale4(acc[h], alpha_shared[h]);
                }
                float4 vr[SPLIT_CHUNK / 4];
#pragma unroll
                for (int i = 0; i < SPLIT_CHUNK / 4; i++) {
                    const int p = position[pg + 4 * i];  // -1 past the chunk's end
                    vr[i] = p >= 0 ? ldg_f4(vbase + p * kw + 4 * c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int i = 0; i < SPLIT_CHUNK / 4; i++) {
                    const int jj = pg + 4 * i;
                    if (jj < len) {
                        const float4* wr = reinterpret_cast<const float4*>(weight + jj * SPLIT_PITCH);
#pragma unroll
                        for (int h4 = 0; h4 < G / 4; h4++) {
                            if (4 * h4 < group) {
                                const float4 w = wr[h4];
                                fma4(acc[4 * h4 + 0], w.x, vr[i]);
                                fma4(acc[4 * h4 + 1], w.y, vr[i]);
                                fma4(acc[4 * h4 + 2], w.z, vr[i]);
                                fma4(acc[4 * h4 + 3], w.w, vr[i]);
                            }
                        }
                    }
                }
            }
        }

        // The four position groups' accumulators, summed through shared memory (q is done).
        float4* red = split_smem;  // [group][hd4]
        for (int r = 1; r < 4; r++) {
            __syncthreads();
            if (pg == r && c4 < hd4) {
#pragma unroll
                for (int h = 0; h < G; h++) {
                    if (h < group) {
                        float4 a = acc[h];
                        if (r > 1) {
                            const float4 b = red[h * SPLIT_MAX_QUADS + c4];
                            a.x += b.x;
                            a.y += b.y;
                            a.z += b.z;
                            a.w += b.w;
                        }
                        red[h * SPLIT_MAX_QUADS + c4] = a;
                    }
                }
            }
        }
        __syncthreads();
        if (pg == 0 && c4 < hd4) {
#pragma unroll
            for (int h = 0; h < G; h++) {
                if (h < group) {
                    const float4 b = red[h * SPLIT_MAX_QUADS + c4];
                    float4 a = acc[h];
                    a.x += b.x;
                    a.y += b.y;
                    a.z += b.z;
                    a.w += b.w;
                    reinterpret_cast<float4*>(part_acc + ((head0 + h) * splits + s) * head_dim)[c4] = a;
                }
            }
        }
#pragma unroll
        for (int k2 = 0; k2 < 2; k2++) {
            const int h = warp + 8 * k2;
            if (h < group && lane == 0) {
                reinterpret_cast<float2*>(part_ml)[(head0 + h) * splits + s] = make_float2(m_run[k2], l_run[k2]);
            }
        }
        __syncthreads();  // red is read; the next task rewrites q there
    }
}

#define ATTENTION_SPLIT_KERNEL(NAME, G, EXACT)                                                                  \
    extern "C" __global__ void __launch_bounds__(SPLIT_THREADS, 2)                                              \
        NAME(float* part_acc, float* part_ml, const float* q, const float* __restrict__ k_cache,                \
             const float* __restrict__ v_cache, const int* sel, long rows, int heads, int kv_heads, int head_dim, \
             int block, int keep, long capacity, int splits) {                                                  \
        attention_split<G, EXACT>(part_acc, part_ml, q, k_cache, v_cache, sel, rows, heads, kv_heads, head_dim, \
                                  block, keep, capacity, splits);                                               \
    }

// Exactly G heads per kv head (the real model: 12), and up to G.
ATTENTION_SPLIT_KERNEL(attention_split_g4_f32, 4, true)
ATTENTION_SPLIT_KERNEL(attention_split_g8_f32, 8, true)
ATTENTION_SPLIT_KERNEL(attention_split_g12_f32, 12, true)
ATTENTION_SPLIT_KERNEL(attention_split_g16_f32, 16, true)
ATTENTION_SPLIT_KERNEL(attention_split_upto4_f32, 4, false)
ATTENTION_SPLIT_KERNEL(attention_split_upto8_f32, 8, false)
ATTENTION_SPLIT_KERNEL(attention_split_upto12_f32, 12, false)
ATTENTION_SPLIT_KERNEL(attention_split_upto16_f32, 16, false)

// Thread (sg = tid/64, c4 = tid%64) sums quad c4 over the splits sg, sg + 4, ... (independent
// loads, several in flight); the four split groups are then summed in shared memory.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
    attention_split_combine_f32(float* out, const float* part_acc, const float* part_ml, long rows, int heads,
                                int head_dim, int splits) {
    extern __shared__ float split_weight[];  // [splits]
    __shared__ float4 partial[3][SPLIT_MAX_QUADS];
    const float2* ml_all = reinterpret_cast<const float2*>(part_ml);
    const int hd4 = head_dim >> 2;
    const int sg = threadIdx.x >> 6, c4 = threadIdx.x & 63;
    for (long task = blockIdx.x; task < rows * heads; task += gridDim.x) {
        const float2* ml = ml_all + task * splits;
        float mx = NEG_INF;
        for (int s = threadIdx.x; s < splits; s += blockDim.x) mx = fmaxf(mx, ml[s].x);
        const float m = block_max_f32(mx);
        float lsum = 0.0f;
        for (int s = threadIdx.x; s < splits; s += blockDim.x) {
            const float2 v = ml[s];
            const float w = v.x == NEG_INF ? 0.0f : expf(v.x - m);
            split_weight[s] = w;
            lsum += v.y * w;
        }
        const float l = block_sum(lsum);  // its barriers publish split_weight
        const float4* a = reinterpret_cast<const float4*>(part_acc + task * splits * (long)head_dim);
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c4 < hd4) {
#pragma unroll 8
            for (int s = sg; s < splits; s += 4) fma4(o, split_weight[s], a[(long)s * hd4 + c4]);
            if (sg > 0) partial[sg - 1][c4] = o;
        }
        __syncthreads();
        if (sg == 0 && c4 < hd4) {
#pragma unroll
            for (int g = 0; g < 3; g++) {
                const float4 b = partial[g][c4];
                o.x += b.x;
                o.y += b.y;
                o.z += b.z;
                o.w += b.w;
            }
            float4 r;
            r.x = l > 0.0f ? o.x / l : 0.0f;
            r.y = l > 0.0f ? o.y / l : 0.0f;
            r.z = l > 0.0f ? o.z / l : 0.0f;
            r.w = l > 0.0f ? o.w / l : 0.0f;
            reinterpret_cast<float4*>(out + task * head_dim)[c4] = r;
        }
        __syncthreads();  // split_weight and partial are rewritten by the next task
    }
}
