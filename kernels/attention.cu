// RoPE, the QSA indexer's block selection and attention over the KV cache (src/ops/rope.rs,
// src/ops/indexer.rs, src/ops/attention.rs are the reference).
//
// Rotations happen at a row's position plus `rope_offset` (the program's `Consts::rope_offset`:
// the MTP draft's rows are rotated one past their cache rows); cache rows are not shifted.
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
                                              int head_dim, int rot, double theta, long long rope_offset) {
    wait_for_producers();
    const long long start = step[0];
    const int half = rot >> 1;
    GRID_STRIDE(e, rows * width) {
        const long t = e / width;
        const int j = (int)((e % width) % head_dim);
        if (j >= rot) {
            y[e] = x[e];
        } else {
            float c, s;
            rope_angle(start + t + rope_offset, j < half ? j : j - half, rot, theta, &c, &s);
            y[e] = rope_channel(x + (e - j), j, rot, c, s);
        }
    }
}

// One head of NormRope, by a whole thread block: xs [head_dim] RMS-normalised with (1 + w[c])
// (w: this head's weights), as rms_norm_reference_f32 computes it, staged in hn [head_dim]
// (shared memory), then rope_reference_f32's rotation of its first `rot` channels at `position`
// into ys. blockDim.x a multiple of 32 (block_sum); the sum of squares is reduced in an order
// that depends on blockDim.x, so kernels that must agree bit for bit (norm_rope_f32 and
// gated_attention_prepare_f32) launch it with the same block size. block_sum's barriers also
// order this head's writes of hn after the block's reads of it for the previous head.
//
// A thread's first NORM_ROPE_HELD channels (all of them at norm_rope_threads' block size up to
// head_dim 512) are loaded once, with their weights, before the sum: one round trip to memory
// where the weights' load after block_sum's barriers was a second one.
#define NORM_ROPE_HELD 2

// The values and weights of channels threadIdx.x + i * blockDim.x, i < NORM_ROPE_HELD (0 past
// head_dim), for norm_rope_head_held. Loaded by the caller, so that it can issue them early.
struct NormRopeHeld {
    float x[NORM_ROPE_HELD], w[NORM_ROPE_HELD];
};

__device__ __forceinline__ NormRopeHeld norm_rope_load(const float* xs, const float* w, int head_dim) {
    NormRopeHeld r;
#pragma unroll
    for (int i = 0; i < NORM_ROPE_HELD; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        r.x[i] = c < head_dim ? xs[c] : 0.0f;
        r.w[i] = c < head_dim ? w[c] : 0.0f;
    }
    return r;
}

// norm_rope_head with the thread's first channels already loaded (the same sums in the same
// order: the held channels first, then the rest, ascending).
__device__ __forceinline__ void norm_rope_head_held(const NormRopeHeld& held, float* ys, const float* xs,
                                                    const float* w, float* hn, int head_dim, int rot,
                                                    long long position, float eps, double theta) {
    const int half = rot >> 1;
    const int rest = threadIdx.x + NORM_ROPE_HELD * blockDim.x;  // the first channel not held
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NORM_ROPE_HELD; i++) {
        if (threadIdx.x + i * blockDim.x < head_dim) ss += held.x[i] * held.x[i];
    }
    for (int c = rest; c < head_dim; c += blockDim.x) ss += xs[c] * xs[c];
    const float inv = rsqrtf(block_sum(ss) / head_dim + eps);
#pragma unroll
    for (int i = 0; i < NORM_ROPE_HELD; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < head_dim) hn[c] = held.x[i] * inv * (1.0f + held.w[i]);
    }
    for (int c = rest; c < head_dim; c += blockDim.x) hn[c] = xs[c] * inv * (1.0f + w[c]);
    __syncthreads();
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        if (c >= rot) {
            ys[c] = hn[c];
        } else {
            float cs, sn;
            rope_angle(position, c < half ? c : c - half, rot, theta, &cs, &sn);
            ys[c] = rope_channel(hn, c, rot, cs, sn);
        }
    }
}

// The head as described above: its held channels loaded first, together.
__device__ __forceinline__ void norm_rope_head(float* ys, const float* xs, const float* w, float* hn, int head_dim,
                                               int rot, long long position, float eps, double theta) {
    const NormRopeHeld held = norm_rope_load(xs, w, head_dim);
    norm_rope_head_held(held, ys, xs, w, hn, head_dim, rot, position, eps, theta);
}

// NormRope (`Op::NormRope`): a block per (row t, head h) of x [rows, width]: norm_rope_head with
// w [head_dim], or [width] indexed by the channel of the row, at position step[0] + t. One
// launch instead of two, and the normalised head is never stored.
#define NORM_ROPE_MAX_DIM 1024

extern "C" __global__ void norm_rope_f32(float* y, const float* x, const float* w, const long long* step, long rows,
                                         long width, int head_dim, int rot, long w_len, float eps, double theta, long long rope_offset) {
    wait_for_producers();
    __shared__ float hn[NORM_ROPE_MAX_DIM];
    const long long start = step[0];
    const long heads = width / head_dim;
    for (long b = blockIdx.x; b < rows * heads; b += gridDim.x) {
        const long t = b / heads, h = b - t * heads;
        const long at = t * width + h * head_dim;
        norm_rope_head(y + at, x + at, w_len == head_dim ? w : w + h * head_dim, hn, head_dim, rot,
                       start + t + rope_offset, eps,
                       theta);
    }
}

// GatedAttention's first kernel (`Op::GatedAttention`; src/exec/cuda/launch/attention.rs
// `gated_attention`): the step's q and k heads normalised and rotated, k and v appended to the
// caches, in one launch. A block per (row t, head), the row's `heads` q heads then its
// `kv_heads` k heads, each by norm_rope_head at position step[0] + t as norm_rope_f32 does it
// (the launcher gives both kernels the same block size: the same bits):
//   q head h: the q half of the head's (q, gate) pair in qg [rows, heads*2*head_dim] (as
//             split_q_gate_reference_f32 reads it) → q [rows, heads*head_dim], row t, head h;
//   k head g: k_raw [rows, kv_heads*head_dim] row t, head g → row step[0] + t of k_cache, and the
//             same head of v's row t copied to that row of v_cache (append_rows2_f32's appends;
//             rows at or past `capacity` are neither computed nor written).
// q_w_len, k_w_len: head_dim (one weight shared by the heads) or the width of q, k (a weight
// per channel of the row), as norm_rope_f32's w_len.
extern "C" __global__ void gated_attention_prepare_f32(float* q, float* k_cache, float* v_cache, const float* qg,
                                                       const float* k_raw, const float* v, const float* q_w,
                                                       const float* k_w, const long long* step, long rows, int heads,
                                                       int kv_heads, int head_dim, int rot, long q_w_len,
                                                       long k_w_len, float eps, double theta, long capacity, long long rope_offset) {
    wait_for_producers();
    __shared__ float hn[NORM_ROPE_MAX_DIM];
    const long long start = step[0];
    const long per_row = heads + kv_heads;
    const long kw = (long)kv_heads * head_dim;
    for (long b = blockIdx.x; b < rows * per_row; b += gridDim.x) {
        const long t = b / per_row, h = b - t * per_row;
        if (h < heads) {
            const float* w = q_w_len == head_dim ? q_w : q_w + h * head_dim;
            norm_rope_head(q + (t * heads + h) * head_dim, qg + (t * heads + h) * 2 * head_dim, w, hn, head_dim, rot,
                           start + t + rope_offset, eps, theta);
        } else {
            const long g = h - heads;
            const long src = t * kw + g * head_dim;
            const float* w = k_w_len == head_dim ? k_w : k_w + g * head_dim;
            // The head's k, weights and v, loaded before the row's check (which waits for step[0]):
            // one round trip with the step instead of two after it.
            const NormRopeHeld held = norm_rope_load(k_raw + src, w, head_dim);
            float vh[NORM_ROPE_HELD];
#pragma unroll
            for (int i = 0; i < NORM_ROPE_HELD; i++) {
                const int c = threadIdx.x + i * blockDim.x;
                vh[i] = c < head_dim ? v[src + c] : 0.0f;
            }
            const long long r = start + t;
            if (r < 0 || r >= capacity) continue;  // uniform over the block
            const long dst = r * kw + g * head_dim;
#pragma unroll
            for (int i = 0; i < NORM_ROPE_HELD; i++) {
                const int c = threadIdx.x + i * blockDim.x;
                if (c < head_dim) v_cache[dst + c] = vh[i];
            }
            for (int c = threadIdx.x + NORM_ROPE_HELD * blockDim.x; c < head_dim; c += blockDim.x) {
                v_cache[dst + c] = v[src + c];
            }
            norm_rope_head_held(held, k_cache + dst, k_raw + src, w, hn, head_dim, rot, r + rope_offset, eps, theta);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Appending rows to a preallocated state `[capacity, width]`: row t of src goes to row start+t.

// Two states of the same shape at once (an attention step's K and V rows): one launch, so one
// kernel boundary, instead of two.
extern "C" __global__ void append_rows2_f32(float* dst0, const float* src0, float* dst1, const float* src1,
                                            const long long* step, long rows, long width, long capacity) {
    wait_for_producers();
    const long long start = step[0];
    GRID_STRIDE(e, 2 * rows * width) {
        const bool second = e >= rows * width;
        const long i = second ? e - rows * width : e;
        const long long r = start + i / width;
        if (r >= 0 && r < capacity) (second ? dst1 : dst0)[r * width + i % width] = (second ? src1 : src0)[i];
    }
}

// ---------------------------------------------------------------------------------------------
// Indexer (`ops::indexer`): three launches per step, each spread over the GPU even at one row.
//
//  1. indexer_select_prep_f32: appends the step's raw keys, pools the blocks the step completes
//     (one thread block each) and zeroes the per-row counters of launches 2 and 3.
//  2. indexer_select_score_f32: the score of every complete block for every sparse row, stored
//     as its order key (below), and a per-row histogram of the keys' top IDX_HBITS bits.
//  3. indexer_select_topk_f32: one thread block per (chunk of IDX_CHUNK scores, row). Each finds
//     from the histogram the bin d1 of the keep-th largest key, marks its chunk's keys above d1
//     in a bitmap and gathers the keys in d1 (the candidates); the row's last chunk to finish
//     settles the candidates (two 10-bit radix passes) and compacts the bitmap, ascending, into
//     the selection.
//
// The order: the reference sorts by score descending (IEEE total order) then block ascending.
// A score's order key is its total-order bits mapped to an unsigned int that grows with the
// score (idx_ord), so the kept blocks are those whose key exceeds the keep-th largest key T,
// then among the blocks whose key is T the lowest ones, as many as are still wanted.
//
// Work buffer: one u32 scratch per launch of `indexer_select` (src/exec/cuda/launch/attention.rs
// `indexer_work_len` allocates it), nb = capacity/block blocks, nw = ceil(nb/32) words:
//   zero  [rows, IDX_ZSTRIDE]  per row IDX_HBINS histogram counts, the candidate count, the count
//                              of finished chunks (zeroed by launch 1)
//   ords  [rows, nb]           the order keys of the scores
//   list  [rows, IDX_LIST]     uint2 {key, block}: the candidates, when at most IDX_LIST
//   above [rows, nw]           bitmap: kept for sure (written whole by launch 3)
//   ties  [rows, nw]           bitmap: key == T (zero, then set by the row's last chunk)

#define IDX_HBITS 12
#define IDX_HBINS 4096
#define IDX_ZSTRIDE (IDX_HBINS + 4)
#define IDX_LIST 4096
#define IDX_FBINS 1024
#define IDX_TILE 32
#define IDX_CHAIN 4
#define IDX_THREADS 256
// Scores a top-k thread block takes: a row of up to this many blocks (16k tokens at block 4) is
// one chunk, settled in shared memory without the cross-chunk atomics, fences and list reload
// (docs/decisions/0022-qsa-indexer-chunks-and-staged-queries.md).
#define IDX_CHUNK 4096
#define IDX_RUN 8
// Launches of at most this many rows (decode) have each row's first top-k chunk load its keys
// and histogram before the row's sizes are known (indexer_select_topk_f32).
#define IDX_EARLY_ROWS 16

struct IdxWork {
    unsigned int* zero;
    unsigned int* ords;
    uint2* list;
    unsigned int* above;
    unsigned int* ties;
};

__device__ __forceinline__ IdxWork idx_work(unsigned int* base, long rows, long nb) {
    const long nw = (nb + 31) / 32;
    IdxWork w;
    w.zero = base;
    base += rows * IDX_ZSTRIDE;
    w.ords = base;
    base += rows * nb + ((rows * nb) & 1);  // the list is 8-byte aligned
    w.list = (uint2*)base;
    base += rows * IDX_LIST * 2;
    w.above = base;
    base += rows * nw;
    w.ties = base;
    return w;
}

__device__ __forceinline__ unsigned int idx_ord(float score) {
    const unsigned int bits = __float_as_uint(score);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Indexer 1: raw keys, pooled block keys (`ops::indexer::pool_blocks`), zeroed counters.
//
// Thread blocks [0, slots): the blocks completed by this step are start/block ..
// (start+rows)/block, at most slots = ceil(rows/block) of them: slot j → block start/block + j.
// key = rope(rms_norm(mean of the block's raw keys; 1 + w, eps); position block*blocksize); the
// block's raw rows of this step are read from k_raw (they are appended by the same launch).
// Thread blocks from `slots` on: append k_raw to rows [start, start+rows) of raw_keys and zero
// the `zero` region of the work buffer. Row t of k_raw starts at t * k_stride (head_dim; more
// when the keys are read from the indexer's projection, `IndexerSelectQk`). Dynamic shared
// memory: 3 * head_dim floats (the key, the cos and sin of each channel's angle).
//
// With `q_out` (IndexerSelectQk), the last rows * q_heads thread blocks also form the queries as
// norm_rope_f32 does (the same sums): head h of row t, read at q_in + t * q_stride + h * head_dim
// (the projection's query heads), normalised with (1 + q_w), rotated, into q_out [rows,
// q_heads * head_dim] for launch 2. Those blocks stage the head in the dynamic shared memory.
extern "C" __global__ void indexer_select_prep_f32(float* raw_keys, float* pooled, unsigned int* work,
                                                   const float* k_raw, const float* w, const long long* step, long rows,
                                                   int head_dim, int rot, int block, float eps, double theta, long nb,
                                                   long capacity, long slots, long k_stride, float* q_out,
                                                   const float* q_in, const float* q_w, long q_stride, int q_heads, long long rope_offset) {
    wait_for_producers();
    extern __shared__ float key[];
    __shared__ float inv_shared;
    const long long start = step[0];
    const long q_blocks = q_out != nullptr ? rows * q_heads : 0;
    if (blockIdx.x >= gridDim.x - q_blocks) {
        const long b = blockIdx.x - (gridDim.x - q_blocks), t = b / q_heads, h = b - t * q_heads;
        norm_rope_head(q_out + (t * q_heads + h) * head_dim, q_in + t * q_stride + h * head_dim, q_w, key, head_dim,
                       rot, start + t + rope_offset, eps, theta);
        return;
    }
    if (blockIdx.x >= slots) {
        const long zero_n = rows * IDX_ZSTRIDE, n = zero_n + rows * head_dim;
        const long stride = (long)(gridDim.x - q_blocks - slots) * blockDim.x;
        for (long i = (long)(blockIdx.x - slots) * blockDim.x + threadIdx.x; i < n; i += stride) {
            if (i < zero_n) {
                work[i] = 0u;
            } else {
                // Loaded before the row's check, which waits for step[0]: one round trip with it.
                const long e = i - zero_n;
                const float x = k_raw[(e / head_dim) * k_stride + e % head_dim];
                const long long r = start + e / head_dim;
                if (r >= 0 && r < capacity) raw_keys[r * head_dim + e % head_dim] = x;
            }
        }
        return;
    }
    const long long b = start / block + blockIdx.x;
    if (b >= (start + rows) / block || b >= nb) return;  // uniform over the thread block
    // The weights of the thread's first channels, loaded with the raw keys below: loaded after
    // the sum of squares' barriers, they took a round trip of their own.
    float wh[NORM_ROPE_HELD];
#pragma unroll
    for (int i = 0; i < NORM_ROPE_HELD; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        wh[i] = c < head_dim ? w[c] : 0.0f;
    }
    float* angle_c = key + head_dim;
    float* angle_s = angle_c + head_dim;
    const int half = rot >> 1;
    // Mean: `m += v` over the block's rows in order, then `m /= block`. The first 8 rows' values
    // are loaded before the channel's RoPE angle is computed, so the loads and the angle overlap.
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        float v[8];
#pragma unroll
        for (int o = 0; o < 8; o++) {
            const long long r = b * block + o;
            v[o] = o >= block ? 0.0f : r >= start ? k_raw[(r - start) * k_stride + c] : raw_keys[r * head_dim + c];
        }
        float cs = 1.0f, sn = 0.0f;
        if (c < rot) rope_angle(b * block + rope_offset, c < half ? c : c - half, rot, theta, &cs, &sn);
        angle_c[c] = cs;
        angle_s[c] = sn;
        float m = 0.0f;
#pragma unroll
        for (int o = 0; o < 8; o++) {
            if (o < block) m = __fadd_rn(m, v[o]);
        }
        for (int o = 8; o < block; o++) {
            const long long r = b * block + o;
            m = __fadd_rn(m, r >= start ? k_raw[(r - start) * k_stride + c] : raw_keys[r * head_dim + c]);
        }
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
#pragma unroll
    for (int i = 0; i < NORM_ROPE_HELD; i++) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < head_dim) key[c] = __fmul_rn(__fmul_rn(key[c], inv), __fadd_rn(1.0f, wh[i]));
    }
    for (int c = threadIdx.x + NORM_ROPE_HELD * blockDim.x; c < head_dim; c += blockDim.x) {
        key[c] = __fmul_rn(__fmul_rn(key[c], inv), __fadd_rn(1.0f, w[c]));
    }
    __syncthreads();
    float* out = pooled + b * head_dim;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        out[c] = c >= rot ? key[c] : rope_channel(key, c, rot, angle_c[c], angle_s[c]);
    }
}

// Lane `lane` of a score thread block: the dot products of pooled key `kb` (a tile row) with head
// h of the chain's R rows of q, staged in shared memory as qs [R, heads, head_dim] (R chains of
// head_dim adds, interleaved; every lane reads the same q value: a broadcast), max(·, 0) into
// part[(r * heads + h) * IDX_TILE + lane] (0 for a lane past the tile's n keys).
template <int R>
__device__ __forceinline__ void idx_dots(float* part, const float* kb, const float* qs, int heads, int h,
                                         int head_dim, int lane, int n) {
    float dot[R];
#pragma unroll
    for (int r = 0; r < R; r++) dot[r] = 0.0f;
    if (lane < n) {
        const float* qh[R];
#pragma unroll
        for (int r = 0; r < R; r++) qh[r] = qs + (r * heads + h) * head_dim;
#pragma unroll 8
        for (int d = 0; d < head_dim; d++) {
            const float k = kb[d];
#pragma unroll
            for (int r = 0; r < R; r++) dot[r] = __fadd_rn(dot[r], __fmul_rn(qh[r][d], k));
        }
    }
    // f32::max(dot, 0.0): NaN counts as 0.
#pragma unroll
    for (int r = 0; r < R; r++) part[(r * heads + h) * IDX_TILE + lane] = dot[r] > 0.0f ? dot[r] : 0.0f;
}

// Indexer 2: block scores of the sparse rows (`ops::indexer::select`).
//
// score[t, b] = (Σ_h max(Σ_d q[t,h,d]·kb[d], 0)) / sqrt(head_dim), d ascending then h ascending,
// products and sums rounded separately: bit for bit the reference. Stored as idx_ord(score) for
// b < complete(t) of every sparse row t (complete(t) = (start+t+1)/block > keep), and counted in
// the row's histogram of key >> (32 - IDX_HBITS); nothing else is written.
//
// grid (x: tiles of IDX_TILE pooled keys, strided; y: groups of rows_per_block rows, strided),
// blockDim.x = 32 * warps. A thread block holds a tile in shared memory (row pitch head_dim+1:
// lane = key, conflict-free) and scores it against its rows IDX_CHAIN at a time (2 or 1 for the
// last rows): warp w takes heads w, w + warps, ...; lane k the dot products of key k with those
// rows at once (idx_dots: one chain of head_dim adds per row, interleaved); then a thread per
// (row, key) adds the heads in order. The tile is loaded once for all the group's rows.
// The queries of the rows a chain scores are staged in shared memory with the tile (the first
// chain's) or after the previous chain's sums: read from global memory in the dot products'
// loop, each step of the chain waited on L2.
// Dynamic shared memory: (IDX_TILE * (head_dim+1) + IDX_CHAIN * heads * (IDX_TILE + head_dim))
// floats.
extern "C" __global__ void indexer_select_score_f32(unsigned int* work, const float* q, const float* pooled,
                                                    const long long* step, long rows, int heads, int head_dim,
                                                    int block, int keep, long nb, int rows_per_block) {
    wait_for_producers();
    extern __shared__ float smem[];
    const int pitch = head_dim + 1;
    float* tile = smem;
    float* part = smem + IDX_TILE * pitch;       // [IDX_CHAIN][heads][IDX_TILE]
    float* qs = part + IDX_CHAIN * heads * IDX_TILE;  // [IDX_CHAIN][heads][head_dim]
    if (keep <= 0) return;                       // sparse rows keep no block: nothing to score
    const IdxWork wk = idx_work(work, rows, nb);
    const long long start = step[0];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float sqrt_d = __fsqrt_rn((float)head_dim);
    // The first sparse row: (start+t+1)/block > keep.
    const long long first_sparse = (long long)(keep + 1) * block - 1 - start;
    for (long t_lo = (long)blockIdx.y * rows_per_block; t_lo < rows; t_lo += (long)gridDim.y * rows_per_block) {
        const long t_hi = min(rows, t_lo + (long)rows_per_block);
        const long t0 = (long)max((long long)t_lo, first_sparse);
        if (t0 >= t_hi) continue;  // uniform over the thread block
        // The complete blocks of the group's last row, below the capacity.
        const long long filled = min((start + t_hi) / block, (long long)nb);
        if ((long long)blockIdx.x * IDX_TILE >= filled) continue;  // uniform over the thread block
        // Rows [tg, tg + chain) of q into qs (the caller's barrier publishes them).
        const long row_q = heads * (long)head_dim;
        auto stage_q = [&](long tg, int chain) {
            const float* src = q + tg * row_q;
            for (long e = threadIdx.x; e < chain * row_q; e += blockDim.x) qs[e] = src[e];
        };
        auto chain_at = [&](long tg) {
            const long left = t_hi - tg;
            return left >= IDX_CHAIN ? IDX_CHAIN : (left >= 2 ? 2 : 1);
        };
        for (long long b0 = (long long)blockIdx.x * IDX_TILE; b0 < filled; b0 += (long long)gridDim.x * IDX_TILE) {
            const int n = (int)min((long long)IDX_TILE, filled - b0);
            __syncthreads();  // the previous tile and partial sums may still be read
            const float* src = pooled + b0 * head_dim;
            if ((head_dim & 3) == 0) {
                const int n4 = n * head_dim / 4, hd4 = head_dim / 4;
                const float4* src4 = (const float4*)src;
                for (int base = threadIdx.x; base < n4; base += blockDim.x * 8) {
                    float4 v[8];
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        const int e = base + u * blockDim.x;
                        v[u] = e < n4 ? __ldg(src4 + e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    }
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        const int e = base + u * blockDim.x;
                        if (e < n4) {
                            const int k = e / hd4;
                            float* dst = tile + k * pitch + (e - k * hd4) * 4;
                            dst[0] = v[u].x;
                            dst[1] = v[u].y;
                            dst[2] = v[u].z;
                            dst[3] = v[u].w;
                        }
                    }
                }
            } else {
                for (int e = threadIdx.x; e < n * head_dim; e += blockDim.x) {
                    tile[(e / head_dim) * pitch + e % head_dim] = __ldg(src + e);
                }
            }
            stage_q(t0, chain_at(t0));  // with the tile: one round trip for both
            __syncthreads();
            for (long tg = t0; tg < t_hi;) {
                const int chain = chain_at(tg);
                if (tg != t0) {  // the previous chain's last barrier: qs is free
                    stage_q(tg, chain);
                    __syncthreads();
                }
                for (int h = warp; h < heads; h += warps) {
                    if (chain == IDX_CHAIN) {
                        idx_dots<IDX_CHAIN>(part, tile + lane * pitch, qs, heads, h, head_dim, lane, n);
                    } else if (chain == 2) {
                        idx_dots<2>(part, tile + lane * pitch, qs, heads, h, head_dim, lane, n);
                    } else {
                        idx_dots<1>(part, tile + lane * pitch, qs, heads, h, head_dim, lane, n);
                    }
                }
                __syncthreads();
                // A warp takes one row (IDX_TILE == 32) and every warp the same number of turns.
                for (int i = threadIdx.x; i < chain * IDX_TILE; i += blockDim.x) {
                    const int r = i / IDX_TILE, k = i % IDX_TILE;
                    const long t = tg + r;
                    const long long b = b0 + k;
                    unsigned int bin = IDX_HBINS;  // none
                    if (k < n && b < (start + t + 1) / block) {
                        float sum = 0.0f;
                        for (int h = 0; h < heads; h++) sum = __fadd_rn(sum, part[(r * heads + h) * IDX_TILE + k]);
                        const unsigned int o = idx_ord(__fdiv_rn(sum, sqrt_d));
                        wk.ords[t * nb + b] = o;
                        bin = o >> (32 - IDX_HBITS);
                    }
                    // One global atomic per distinct bin of the warp (scores crowd into few bins).
                    const unsigned int same = __match_any_sync(0xffffffffu, bin);
                    if (bin < IDX_HBINS && lane == __ffs(same) - 1) {
                        atomicAdd(&wk.zero[t * IDX_ZSTRIDE + bin], (unsigned int)__popc(same));
                    }
                }
                __syncthreads();  // the partial sums are rewritten by the next rows
                tg += chain;
            }
        }
    }
}

// Block-wide (blockDim.x == IDX_THREADS): thread i holds the counts c[0..PER) of bins
// [i*PER, (i+1)*PER). Finds the bin holding the want-th largest item (bins counted from the top;
// the items must number at least want) and writes {bin, items in higher bins, items in the bin}
// to res for every thread.
template <int PER>
__device__ __forceinline__ void idx_find_bin(const unsigned int (&c)[PER], unsigned int want, unsigned int* res,
                                             unsigned int* warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned int s = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) s += c[j];
    unsigned int x = s;  // the sum over this lane and the lanes above it
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const unsigned int y = __shfl_down_sync(0xffffffffu, x, off);
        if (lane + off < 32) x += y;
    }
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    unsigned int above = x - s;
    for (int w2 = warp + 1; w2 < IDX_THREADS / 32; w2++) above += warp_sums[w2];
    if (above < want && above + s >= want) {
#pragma unroll
        for (int j = PER - 1; j >= 0; j--) {
            if (above + c[j] >= want) {
                res[0] = threadIdx.x * PER + j;
                res[1] = above;
                res[2] = c[j];
                break;
            }
            above += c[j];
        }
    }
    __syncthreads();
}

// Block-wide (blockDim.x == IDX_THREADS) exclusive prefix sums of two counts, in thread order.
__device__ __forceinline__ void idx_prefix2(unsigned int a, unsigned int b, unsigned int* pa, unsigned int* pb,
                                            unsigned int* warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned int x = a, y = b;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const unsigned int xa = __shfl_up_sync(0xffffffffu, x, off), ya = __shfl_up_sync(0xffffffffu, y, off);
        if (lane >= off) {
            x += xa;
            y += ya;
        }
    }
    if (lane == 31) {
        warp_sums[2 * warp] = x;
        warp_sums[2 * warp + 1] = y;
    }
    __syncthreads();
    x -= a;
    y -= b;
    for (int w2 = 0; w2 < warp; w2++) {
        x += warp_sums[2 * w2];
        y += warp_sums[2 * w2 + 1];
    }
    *pa = x;
    *pb = y;
    __syncthreads();
}

// Indexer 3: the selection of each row (`ops::indexer::select`).
//
// Dense row (complete <= keep): [visible, -1, -1...]. Sparse row: the top `keep` blocks in the
// reference's order, ascending: [visible, keep, b0 < b1 < ...].
//
// grid (x: chunks of IDX_CHUNK blocks, y: rows, strided), blockDim.x == IDX_THREADS. Every chunk
// of a sparse row: d1 = the histogram bin of the keep-th largest key, `want` = keep minus the
// keys in higher bins; the chunk's words of the `above` bitmap are written whole (keys in higher
// bins; with the keys of d1 when d1 holds exactly `want`), its `ties` words zeroed and its keys
// in d1 appended to the row's candidate list (unless they are more than IDX_LIST: the last
// chunk then reads them from `ords`). The row's last chunk to finish (a counter, after a
// fence; a row's only chunk keeps its candidates and words in shared memory and goes on at
// once) finds T, the want-th largest candidate key, with two radix passes over its low 20 bits
// (1024 bins each; it stops after the first when the bin found is taken whole), sets the
// candidates above T in `above` and those equal to T in `ties`, and writes the ids of `above`
// and of the first (want - candidates above T) of `ties`, ascending (a block prefix sum over
// the row's words).
extern "C" __global__ void __launch_bounds__(IDX_THREADS)
    indexer_select_topk_f32(int* sel, unsigned int* work, const long long* step, long rows, int block, int keep,
                            long nb) {
    wait_for_producers();
    __shared__ unsigned int s_ord[IDX_LIST], s_id[IDX_LIST];
    __shared__ unsigned int s_hist[IDX_FBINS];
    __shared__ unsigned int s_res[4];
    __shared__ unsigned int s_warps[2 * IDX_THREADS / 32];
    __shared__ int s_last;
    // A row's only chunk (below): its candidate count and its words of `above` and `ties`.
    __shared__ unsigned int s_count;
    __shared__ unsigned int s_above[IDX_CHUNK / 32], s_ties[IDX_CHUNK / 32];
    const IdxWork wk = idx_work(work, rows, nb);
    const long long start = step[0];
    const long nw = (nb + 31) / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned int full = 0xffffffffu;
    constexpr int WARPS = IDX_THREADS / 32, PER_WARP = IDX_CHUNK / IDX_THREADS, HPER = IDX_HBINS / IDX_THREADS;
    for (long t = blockIdx.y; t < rows; t += gridDim.y) {
        const long long lo = (long long)blockIdx.x * IDX_CHUNK;
        const unsigned int* ords = wk.ords + t * nb;
        unsigned int* zero = wk.zero + t * IDX_ZSTRIDE;
        // This chunk's keys below `end` (a warp takes words warp, warp + 8, ...) and this
        // thread's bins of the row's histogram [threadIdx.x * HPER, +HPER), loaded before the
        // search below so that the two overlap.
        unsigned int keys[PER_WARP], c[HPER];
        auto load_chunk = [&](long long end) {
#pragma unroll
            for (int j = 0; j < PER_WARP; j++) {
                const long long b = lo + (long long)(warp + j * WARPS) * 32 + lane;
                keys[j] = b < end ? ords[b] : 0u;
            }
            const uint4* h4 = (const uint4*)zero + threadIdx.x * (HPER / 4);
#pragma unroll
            for (int j = 0; j < HPER / 4; j++) {
                const uint4 v = h4[j];
                c[4 * j] = v.x;
                c[4 * j + 1] = v.y;
                c[4 * j + 2] = v.z;
                c[4 * j + 3] = v.w;
            }
        };
        // A decode row's first chunk (taken by every sparse row) loads them before the row's
        // sizes, which wait for step[0], are known: one round trip with the step instead of one
        // after it. Its keys up to the capacity: those past the row's complete blocks are never
        // used. (Not for many rows: the loads of their dense rows would be wasted.)
        const bool early = blockIdx.x == 0 && rows <= IDX_EARLY_ROWS;
        if (early) load_chunk(min(lo + IDX_CHUNK, (long long)nb));
        const long long visible = start + t + 1;
        // Clamped only for a cache that overflowed (the host checks), so nothing is read past it.
        const long long complete = min(visible / block, (long long)nb);
        int* out = sel + t * (2 + (long)keep);
        if (complete <= keep || keep == 0) {
            if (blockIdx.x == 0) {
                const int count = complete <= keep ? -1 : 0;
                for (int i = threadIdx.x; i < 2 + keep; i += blockDim.x) out[i] = i == 0 ? (int)visible : count;
            }
            continue;  // uniform over the thread block
        }
        if (lo >= complete) continue;
        const long long hi = min(lo + IDX_CHUNK, complete);
        unsigned int* above_w = wk.above + t * nw;
        unsigned int* ties_w = wk.ties + t * nw;
        uint2* list = wk.list + t * IDX_LIST;
        if (!early) load_chunk(hi);

        // The bin of the keep-th largest key.
        if (threadIdx.x == 0) s_count = 0u;  // published by idx_find_bin's barriers
        idx_find_bin<HPER>(c, (unsigned int)keep, s_res, s_warps);
        const unsigned int d1 = s_res[0], want = (unsigned int)keep - s_res[1], in_d1 = s_res[2];
        const bool whole = in_d1 == want;  // every key of d1 is kept
        const bool listed = !whole && in_d1 <= IDX_LIST;

        // Keys above d1 (and d1 when whole) → `above`; keys in d1 → the candidates. A warp takes
        // the places of all its words' candidates with one atomicAdd (one round trip, where one
        // per word with candidates made up to PER_WARP in a row): the list's order changes, not
        // its keys, and nothing below depends on the order (histograms, bits set by atomicOr).
        // When the chunk is the row's only one (complete <= IDX_CHUNK: up to 16k tokens at block
        // 4), no other chunk is waited for and the candidates and the row's words stay in shared
        // memory (s_ord, s_id, s_above, s_ties): no global atomic, fence or reload on the way,
        // four or five round trips fewer.
        static_assert(IDX_CHUNK <= IDX_LIST, "a row's only chunk lists all its candidates");
        const bool single = complete <= IDX_CHUNK;
        unsigned int cand[PER_WARP];
        unsigned int n_cand = 0;
#pragma unroll
        for (int j = 0; j < PER_WARP; j++) {
            const long long wd = lo / 32 + warp + j * WARPS;
            const long long b = wd * 32 + lane;
            const bool in = b < hi;  // none of a word past the chunk's end
            const unsigned int o = keys[j];
            const unsigned int dg = o >> (32 - IDX_HBITS);
            const unsigned int up = __ballot_sync(full, in && (dg > d1 || (whole && dg == d1)));
            cand[j] = __ballot_sync(full, in && !whole && dg == d1);
            n_cand += __popc(cand[j]);
            if (lane == 0 && wd * 32 < hi) {
                if (single) {
                    s_above[wd] = up;
                    s_ties[wd] = 0u;
                } else {
                    above_w[wd] = up;
                    ties_w[wd] = 0u;
                }
            }
        }
        if (listed && n_cand != 0u) {  // uniform over the warp
            unsigned int base = 0;
            if (lane == 0) base = single ? atomicAdd(&s_count, n_cand) : atomicAdd(&zero[IDX_HBINS], n_cand);
            base = __shfl_sync(full, base, 0);
#pragma unroll
            for (int j = 0; j < PER_WARP; j++) {
                if ((cand[j] >> lane) & 1u) {
                    const unsigned int i = base + __popc(cand[j] & ((1u << lane) - 1u));
                    const unsigned int b = (unsigned int)((lo / 32 + warp + j * WARPS) * 32 + lane);
                    if (single) {
                        s_ord[i] = keys[j];
                        s_id[i] = b;
                    } else {
                        list[i] = make_uint2(keys[j], b);
                    }
                }
                base += __popc(cand[j]);
            }
        }
        if (single) {
            __syncthreads();  // the chunk's words and candidates are written
        } else {
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) {
                const unsigned int chunks = (unsigned int)((complete + IDX_CHUNK - 1) / IDX_CHUNK);
                s_last = atomicAdd(&zero[IDX_HBINS + 1], 1u) == chunks - 1;
            }
            __syncthreads();
            if (!s_last) continue;  // uniform over the thread block
            __threadfence();
        }

        // The row's last chunk: T among the candidates, unless d1 is kept whole.
        unsigned int T = 0, ties_kept = 0;
        bool inclusive = true;  // keys == T are all kept
        if (!whole) {
            const unsigned int n = listed ? in_d1 : (unsigned int)complete;
            if (listed && !single) {
                for (unsigned int i = threadIdx.x; i < n; i += IDX_THREADS) {
                    const uint2 e = __ldcg(&list[i]);
                    s_ord[i] = e.x;
                    s_id[i] = e.y;
                }
            }
            // Two passes over the candidates (from `ords`: the keys of bin d1): a histogram of
            // 10 more bits of the keys that share the bits found so far, then its bin of the
            // w-th largest.
            const unsigned int n_round = (n + 31) & ~31u;
            unsigned int prefix = d1, w = want;  // the key bits found so far, the keys still wanted
            for (int shift = 10; shift >= 0; shift -= 10) {
                for (int i = threadIdx.x; i < IDX_FBINS; i += IDX_THREADS) s_hist[i] = 0u;
                __syncthreads();  // also: the candidates are in shared memory
                for (unsigned int i = threadIdx.x; i < n_round; i += IDX_THREADS) {
                    unsigned int bin = IDX_FBINS;  // none
                    if (i < n) {
                        const unsigned int o = listed ? s_ord[i] : ords[i];
                        if ((o >> (shift + 10)) == prefix) bin = (o >> shift) & (IDX_FBINS - 1);
                    }
                    const unsigned int same = __match_any_sync(full, bin);
                    if (bin < IDX_FBINS && lane == __ffs(same) - 1) atomicAdd(&s_hist[bin], (unsigned int)__popc(same));
                }
                __syncthreads();
                unsigned int c[IDX_FBINS / IDX_THREADS];
#pragma unroll
                for (int j = 0; j < IDX_FBINS / IDX_THREADS; j++) c[j] = s_hist[threadIdx.x * (IDX_FBINS / IDX_THREADS) + j];
                idx_find_bin<IDX_FBINS / IDX_THREADS>(c, w, s_res, s_warps);
                const unsigned int bin = s_res[0], in_bin = s_res[2];
                w -= s_res[1];
                prefix = (prefix << 10) | bin;
                if (in_bin == w) {  // the bin is kept whole: every key from prefix << shift up
                    T = prefix << shift;
                    break;
                }
                if (shift == 0) {  // keys == T: the first w of them (ascending blocks)
                    T = prefix;
                    ties_kept = w;
                    inclusive = false;
                }
            }
            // Mark the candidates: above T (or == T when inclusive) → `above`, == T → `ties`.
            if (listed) {
                for (unsigned int i = threadIdx.x; i < n; i += IDX_THREADS) {
                    const unsigned int o = s_ord[i], b = s_id[i];
                    const bool up = o > T || (inclusive && o == T);
                    const unsigned int bit = 1u << (b & 31);
                    if (up || o == T) {
                        if (single) {
                            atomicOr((up ? s_above : s_ties) + (b >> 5), bit);
                        } else {
                            atomicOr((up ? above_w : ties_w) + (b >> 5), bit);
                        }
                    }
                }
            } else {
                for (unsigned int i = threadIdx.x; i < n_round; i += IDX_THREADS) {
                    const unsigned int o = i < n ? ords[i] : 0u;
                    const bool cand = i < n && (o >> (32 - IDX_HBITS)) == d1;
                    const unsigned int up = __ballot_sync(full, cand && (o > T || (inclusive && o == T)));
                    const unsigned int eq = __ballot_sync(full, cand && !inclusive && o == T);
                    if (lane == 0 && up != 0u) atomicOr(&above_w[i >> 5], up);
                    if (lane == 0 && eq != 0u) atomicOr(&ties_w[i >> 5], eq);
                }
            }
            __syncthreads();
        }

        // Compaction: every thread takes a run of the row's words, in order (the first
        // IDX_RUN of them kept in registers: all of them up to 256k tokens at block 4).
        const long words = (complete + 31) / 32;
        const long per = (words + IDX_THREADS - 1) / IDX_THREADS;
        const long w0 = min(words, threadIdx.x * per), w1 = min(words, w0 + per);
        // Word wd of `above`, `ties`: a row's only chunk keeps them in shared memory; else from
        // L2 (the other chunks' atomics set bits there).
        auto up_word = [&](long wd) { return single ? s_above[wd] : __ldcg(&above_w[wd]); };
        auto eq_word = [&](long wd) { return single ? s_ties[wd] : __ldcg(&ties_w[wd]); };
        unsigned int up_run[IDX_RUN], eq_run[IDX_RUN];
        unsigned int n_above = 0, n_ties = 0;
#pragma unroll
        for (int j = 0; j < IDX_RUN; j++) {
            up_run[j] = w0 + j < w1 ? up_word(w0 + j) : 0u;
            eq_run[j] = w0 + j < w1 ? eq_word(w0 + j) : 0u;
            n_above += __popc(up_run[j]);
            n_ties += __popc(eq_run[j]);
        }
        for (long wd = w0 + IDX_RUN; wd < w1; wd++) {
            n_above += __popc(up_word(wd));
            n_ties += __popc(eq_word(wd));
        }
        unsigned int pos, rank;
        idx_prefix2(n_above, n_ties, &pos, &rank, s_warps);
        pos += min(rank, ties_kept);
        // The ids of the kept blocks in the word, ascending: all of `up`, the ties below ties_kept.
        auto emit = [&](long wd, unsigned int up, unsigned int eq) {
            unsigned int bits = up | eq;
            while (bits != 0u) {
                const int j = __ffs(bits) - 1;
                bits &= bits - 1u;
                if ((up >> j) & 1u) {
                    out[2 + pos++] = (int)(wd * 32 + j);
                } else {
                    if (rank < ties_kept) out[2 + pos++] = (int)(wd * 32 + j);
                    rank++;
                }
            }
        };
#pragma unroll
        for (int j = 0; j < IDX_RUN; j++) emit(w0 + j, up_run[j], eq_run[j]);
        for (long wd = w0 + IDX_RUN; wd < w1; wd++) emit(wd, up_word(wd), eq_word(wd));
        if (threadIdx.x == 0) {
            out[0] = (int)visible;
            out[1] = keep;
        }
        __syncthreads();  // the shared state is reused by the next row
    }
}

// ---------------------------------------------------------------------------------------------
// Attention (`ops::attention::attend`): one thread block per (row, head); softmax(q·K/sqrt(hd))·V
// over the row's selected positions in ascending order, GQA head h → kv head h / (heads/kv_heads).
// Online softmax over chunks of ATTN_CHUNK positions (running max and sum, the accumulator
// rescaled), so any number of positions works. In a chunk each warp scores positions (lanes over
// the channels), then each thread accumulates channels over the chunk's positions.
// blockDim.x == ATTN_CHUNK. Dynamic shared memory: 2 * head_dim floats (q, accumulator).
//
// attention_reference_gated_f32 (GatedAttention's attention where the split kernels do not take
// the shape): the same, each output times sigmoid(gate), the gate read from the fused q
// projection qg [rows, heads*2*head_dim] (head h of row t: its second head_dim values), with
// sigmoid_mul_reference_f32's expression: the bits of attention_reference_f32 then sigmoid_mul.

#define ATTN_CHUNK 256

// Output channel d of (row, head) `task` from the attention's accumulator and sum, and with
// GATED times sigmoid of its gate in qg (`task * 2 * head_dim + head_dim + d`), as
// sigmoid_mul_reference_f32 computes x * sigmoid(g) of the stored attention output.
template <bool GATED>
__device__ __forceinline__ float attention_out(float acc, float l, const float* qg, long task, int head_dim, int d) {
    const float y = l > 0.0f ? acc / l : 0.0f;
    if (!GATED) return y;
    return y * sigmoid_f32(qg[(2 * task + 1) * head_dim + d]);
}

// As attention_out, the gate already loaded (g = qg's gate value of the output).
template <bool GATED>
__device__ __forceinline__ float attention_out_gate(float acc, float l, float g) {
    const float y = l > 0.0f ? acc / l : 0.0f;
    return GATED ? y * sigmoid_f32(g) : y;
}

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

template <bool GATED>
__device__ __forceinline__ void attention_reference(float* out, const float* q, const float* k_cache,
                                                    const float* v_cache, const int* sel, const float* qg, long rows,
                                                    int heads, int kv_heads, int head_dim, int block, int keep,
                                                    long capacity) {
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
            out[task * head_dim + d] = attention_out<GATED>(acc[d], l, qg, task, head_dim, d);
        }
        __syncthreads();  // qs and acc are rewritten by the next task
    }
}

extern "C" __global__ void attention_reference_f32(float* out, const float* q, const float* k_cache,
                                                   const float* v_cache, const int* sel, long rows, int heads,
                                                   int kv_heads, int head_dim, int block, int keep, long capacity) {
    wait_for_producers();
    attention_reference<false>(out, q, k_cache, v_cache, sel, nullptr, rows, heads, kv_heads, head_dim, block, keep,
                               capacity);
}

extern "C" __global__ void attention_reference_gated_f32(float* out, const float* q, const float* k_cache,
                                                         const float* v_cache, const int* sel, const float* qg,
                                                         long rows, int heads, int kv_heads, int head_dim, int block,
                                                         int keep, long capacity) {
    wait_for_producers();
    attention_reference<true>(out, q, k_cache, v_cache, sel, qg, rows, heads, kv_heads, head_dim, block, keep,
                              capacity);
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
//    `attention_split_combine_gated_f32` (GatedAttention): the same, times sigmoid(gate) as
//    attention_reference_gated_f32 (the gate in qg; sigmoid_mul_reference_f32's bits).

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
    __shared__ int2 guess[SPLIT_CHUNK];  // a guess at the first chunk's selected blocks (below)
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

        // The selected block of this thread's first position, guessed before the row's header
        // is back (a sparse row: n = keep*block plus a partial block, whose few positions rarely
        // change `per`) and loaded with it: the first chunk's positions then take no round trip
        // of their own where the guess holds (checked: else the block is read again). Kept in
        // shared memory, not registers, through the chunks.
        int2 g = make_int2(-1, 0);  // {block index, its selected block}
        if (tid < SPLIT_CHUNK && keep > 0 && (long long)keep * block <= (1 << 30)) {  // int arithmetic, as n's
            const int n_g = keep * block;
            const int per_g = n_g / splits + (n_g % splits != 0);
            const int j_g = s * per_g + tid;
            if (j_g < n_g) {
                g.x = j_g / block;
                g.y = srow[2 + g.x];
            }
        }

        const float4* qg = reinterpret_cast<const float4*>(q + head0 * head_dim);
#pragma unroll 4
        for (int e = tid; e < group * hd4; e += blockDim.x) split_smem[(e / hd4) * SPLIT_MAX_QUADS + e % hd4] = qg[e];
        if (tid < SPLIT_CHUNK) guess[tid] = g;  // after q's loads: it waits for the guess's
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
                        const int jb = j / block;
                        const int2 g = guess[tid];
                        p = (long long)(jb == g.x ? g.y : srow[2 + jb]) * block + j % block;
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
            // The V quads this thread accumulates below, loaded before the softmax and its two
            // barriers, under which their latency hides (loaded after them, they took a round
            // trip to L2 of their own).
            float4 vr[SPLIT_CHUNK / 4];
#pragma unroll
            for (int i = 0; i < SPLIT_CHUNK / 4; i++) {
                const int p = position[pg + 4 * i];  // -1 past the chunk's end
                vr[i] = c4 < hd4 && p >= 0 ? ldg_f4(vbase + p * kw + 4 * c4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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
        wait_for_producers();                                                                                   \
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
//
// Every load a task needs is issued at its start, in one round trip: the gate quad, the splits'
// (m, l) (SPLIT_ML_HELD a thread: all of them, the launcher's SPLIT_MAX_SPLITS at most over the
// SPLIT_THREADS threads) and the thread's first SPLIT_ACC_HELD
// accumulator quads (17: all of them at the real decode's 65 splits), held in registers through
// the max and the sums. Loaded after the sums, eight at a time, the quads took three round trips
// there (and (m, l) a reload after the max); the arithmetic and its order are unchanged.
#define SPLIT_ML_HELD 4
#define SPLIT_ACC_HELD 17
// The most splits a (row, head) has (launch::attention's SPLIT_MAX).
#define SPLIT_MAX_SPLITS 1024
static_assert(SPLIT_ML_HELD * SPLIT_THREADS >= SPLIT_MAX_SPLITS, "every split's (m, l) is held");
template <bool GATED>
__device__ __forceinline__ void attention_split_combine(float* out, const float* part_acc, const float* part_ml,
                                                        const float* qg, long rows, int heads, int head_dim,
                                                        int splits) {
    extern __shared__ float split_weight[];  // [splits]
    __shared__ float4 partial[3][SPLIT_MAX_QUADS];
    const float2* ml_all = reinterpret_cast<const float2*>(part_ml);
    const int hd4 = head_dim >> 2;
    const int sg = threadIdx.x >> 6, c4 = threadIdx.x & 63;
    for (long task = blockIdx.x; task < rows * heads; task += gridDim.x) {
        // The gate quad this thread's output takes, loaded first so that its latency hides
        // under the splits' weights (it would otherwise add a round trip after the sums).
        float4 g4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (GATED && sg == 0 && c4 < hd4) {
            const float* g = qg + (2 * task + 1) * head_dim + 4 * c4;
            const bool quad = (reinterpret_cast<unsigned long long>(g) & 15ull) == 0;
            g4 = quad ? *reinterpret_cast<const float4*>(g) : make_float4(g[0], g[1], g[2], g[3]);
        }
        const float2* ml = ml_all + task * splits;
        const float4* a = reinterpret_cast<const float4*>(part_acc + task * splits * (long)head_dim);
        float2 mlh[SPLIT_ML_HELD];
#pragma unroll
        for (int i = 0; i < SPLIT_ML_HELD; i++) {
            const int s = threadIdx.x + i * blockDim.x;
            mlh[i] = s < splits ? ml[s] : make_float2(NEG_INF, 0.0f);
        }
        float4 ah[SPLIT_ACC_HELD];
#pragma unroll
        for (int i = 0; i < SPLIT_ACC_HELD; i++) {
            const int s = sg + 4 * i;
            ah[i] = c4 < hd4 && s < splits ? a[(long)s * hd4 + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float mx = NEG_INF;
#pragma unroll
        for (int i = 0; i < SPLIT_ML_HELD; i++) {
            if (threadIdx.x + i * blockDim.x < splits) mx = fmaxf(mx, mlh[i].x);
        }
        const float m = block_max_f32(mx);
        float lsum = 0.0f;
        auto weigh = [&](int s, float2 v) {
            const float w = v.x == NEG_INF ? 0.0f : expf(v.x - m);
            split_weight[s] = w;
            lsum += v.y * w;
        };
#pragma unroll
        for (int i = 0; i < SPLIT_ML_HELD; i++) {
            const int s = threadIdx.x + i * blockDim.x;
            if (s < splits) weigh(s, mlh[i]);
        }
        const float l = block_sum(lsum);  // its barriers publish split_weight
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c4 < hd4) {
#pragma unroll
            for (int i = 0; i < SPLIT_ACC_HELD; i++) {
                const int s = sg + 4 * i;
                if (s < splits) fma4(o, split_weight[s], ah[i]);
            }
#pragma unroll 8
            for (int s = sg + 4 * SPLIT_ACC_HELD; s < splits; s += 4) fma4(o, split_weight[s], a[(long)s * hd4 + c4]);
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
            r.x = attention_out_gate<GATED>(o.x, l, g4.x);
            r.y = attention_out_gate<GATED>(o.y, l, g4.y);
            r.z = attention_out_gate<GATED>(o.z, l, g4.z);
            r.w = attention_out_gate<GATED>(o.w, l, g4.w);
            reinterpret_cast<float4*>(out + task * head_dim)[c4] = r;
        }
        __syncthreads();  // split_weight and partial are rewritten by the next task
    }
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
    attention_split_combine_f32(float* out, const float* part_acc, const float* part_ml, long rows, int heads,
                                int head_dim, int splits) {
    wait_for_producers();
    attention_split_combine<false>(out, part_acc, part_ml, nullptr, rows, heads, head_dim, splits);
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
    attention_split_combine_gated_f32(float* out, const float* part_acc, const float* part_ml, const float* qg,
                                      long rows, int heads, int head_dim, int splits) {
    wait_for_producers();
    attention_split_combine<true>(out, part_acc, part_ml, qg, rows, heads, head_dim, splits);
}
