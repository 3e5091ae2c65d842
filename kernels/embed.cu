// Row gathers (src/ops/embed.rs is the reference): for each of `count` ids, `d` table columns.
// Ids were range-checked on the host (tokens) or are in range by construction (n-gram ids).
#include "common.cuh"
#include "ngram.cuh"

// A thread per gathered value (grid-strided), so that one token's row is read by many blocks
// at once, not by one block whose every load waits on the table's memory (never in L2: the
// table is 1.3 GB).

extern "C" __global__ void embed_reference_f32(float* y, const long long* ids, const float* table, long count, long d) {
    wait_for_producers();
    GRID_STRIDE(i, count * d) {
        const long r = i / d;
        y[i] = table[ids[r] * d + (i - r * d)];
    }
}

extern "C" __global__ void embed_reference_bf16(float* y, const long long* ids, const bf16_t* table, long count, long d) {
    wait_for_producers();
    GRID_STRIDE(i, count * d) {
        const long r = i / d;
        y[i] = bf16_to_f32(table[ids[r] * d + (i - r * d)]);
    }
}

// A table value as f32 (bf16 bits widen exactly).
__device__ __forceinline__ float embed_value(const float* table, long i) { return table[i]; }
__device__ __forceinline__ float embed_value(const bf16_t* table, long i) { return bf16_to_f32(table[i]); }

// embed_streams (`Op::EmbedStreams`, fusion `embed_streams`): embed then repeat_streams in one
// launch. ids [rows, n_ids]; y [rows, streams · n_ids·d], each stream of row t a copy of its n_ids
// table rows. A thread per gathered value, as embed, storing it into each stream: the row is read
// once and the [rows, n_ids·d] embedding is never stored (the unfused pair: two dependent
// launches a step).
template <typename W>
__device__ __forceinline__ void embed_streams(float* y, const long long* ids, const W* table, long rows, long n_ids,
                                              long d, long streams) {
    const long width = n_ids * d;  // one stream of a row
    GRID_STRIDE(i, rows * width) {
        const long r = i / d, t = i / width;
        const float v = embed_value(table, ids[r] * d + (i - r * d));
        float* yt = y + t * streams * width + (i - t * width);
        for (long s = 0; s < streams; s++) yt[s * width] = v;
    }
}

extern "C" __global__ void embed_streams_reference_f32(float* y, const long long* ids, const float* table, long rows,
                                                       long n_ids, long d, long streams) {
    wait_for_producers();
    embed_streams<float>(y, ids, table, rows, n_ids, d, streams);
}

extern "C" __global__ void embed_streams_reference_bf16(float* y, const long long* ids, const bf16_t* table,
                                                        long rows, long n_ids, long d, long streams) {
    wait_for_producers();
    embed_streams<bf16_t>(y, ids, table, rows, n_ids, d, streams);
}

// ple_embed (`Op::PleEmbed`, fusion `ple_embed`): the PLE n-gram ids (ngram.cuh, as
// ple_ngram_ids_reference_i64) and their table rows in one launch, the ids never stored (the
// unfused pair: two dependent launches a step, the ids' in a single block). y [rows, heads·d],
// heads = (ngram-1)·hpn: value i is column i - r·d of table row id(r), r = i / d the (row, head)
// item. A thread per value, as embed; each block first hashes the ids of its values (at most
// blockDim + 1 of them, a thread each) into shared memory.
//
// The history (the node's state: ctx = ngram - 1 tokens) is read by every block and replaced by
// one, and a grid's blocks run in no set order (some perhaps only after others have finished):
// so each block copies it into shared memory before anything else (ngram_load_own_state) and
// hashes only from that copy, then arrives at an arrival counter (fenced); the block that
// arrives last, when every block has its copy, writes the next history and sets the counter
// back to 0 for the next launch. No block reads the history in memory after arriving, so the
// one write comes after every read. The counter is used only after the kernel's wait, when the
// kernels before it (which may use the same word) have finished.
//
// With inputs_ready (the tokens are not the output of the node just ahead) and a thread for
// every value, a block hashes and gathers before its wait (the history is its own state, the
// table a weight), then waits, arrives and stores.
#define PLE_EMBED_THREADS 256

// Hashes the ids of the values [base, base + blockDim) (those below n) into ids_s: item r0 + k
// at k, r0 = base / d.
__device__ __forceinline__ void ple_embed_ids(long long* ids_s, const NgramArgs& g, long base, long n, long d) {
    const long r0 = base / d, r1 = (min(n, base + (long)blockDim.x) - 1) / d;
    for (long k = threadIdx.x; k <= r1 - r0; k += blockDim.x) ids_s[k] = ngram_id(g, r0 + k);
    __syncthreads();
}

// Value i (< n) of the chunk starting at base, its id hashed by ple_embed_ids.
template <typename W>
__device__ __forceinline__ float ple_embed_value(const W* table, const long long* ids_s, long base, long i, long d) {
    const long r = i / d;
    return embed_value(table, ids_s[r - base / d] * d + (i - r * d));
}

// Once every block has copied the old history (see above): the last block to arrive writes the
// next one.
__device__ __forceinline__ void ple_embed_next_history(long long* history, unsigned* arrivals, const NgramArgs& g,
                                                       long rows) {
    __shared__ int last_s;
    if (threadIdx.x == 0) {
        __threadfence();
        const bool last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
        if (last) {
            *arrivals = 0u;
            __threadfence();
        }
        last_s = last;
    }
    __syncthreads();
    if (last_s) ngram_store_history(history, g, rows);
}

// The values a block takes (grid-strided), each chunk's ids hashed first; the kernel waited.
template <typename W>
__device__ __forceinline__ void ple_embed_rows(float* y, long long* ids_s, const W* table, const NgramArgs& g,
                                               long n, long d) {
    for (long base = (long)blockIdx.x * blockDim.x; base < n; base += (long)gridDim.x * blockDim.x) {
        ple_embed_ids(ids_s, g, base, n, d);
        const long i = base + threadIdx.x;
        if (i < n) y[i] = ple_embed_value(table, ids_s, base, i, d);
        __syncthreads();  // the next chunk rewrites ids_s
    }
}

// y [rows, (ngram-1)·hpn·d]; history [ngram-1] (replaced as ple_ngram_ids_reference_i64 does);
// arrivals: a counter word at 0; tokens [rows]; table [.., d]; multipliers [ngram], sizes and
// offsets [(ngram-1)·hpn]. Running ahead, a thread takes one value (the grid covers them all).
#define PLE_EMBED_KERNEL(W, SUFFIX)                                                                            \
    extern "C" __global__ void __launch_bounds__(PLE_EMBED_THREADS)                                             \
        ple_embed_##SUFFIX(float* y, long long* history, unsigned* arrivals, const long long* tokens,           \
                           const W* table, long rows, long d, long long eos, int ngram, int hpn,                 \
                           const long long* multipliers, const long long* sizes, const long long* offsets,       \
                           int inputs_ready) {                                                                  \
        __shared__ long long old_history[NGRAM_MAX_CTX];                                                        \
        __shared__ long long ids_s[PLE_EMBED_THREADS + 1];                                                      \
        const int ctx = ngram - 1;                                                                              \
        ngram_load_own_state(old_history, history, ctx);                                                        \
        const long n = rows * ctx * hpn * d;                                                                    \
        const bool ahead = inputs_ready && (long)gridDim.x * blockDim.x >= n;                                   \
        wait_for_producers_unless(ahead);                                                                       \
        const NgramArgs g{old_history, tokens, ctx, hpn, eos, multipliers, sizes, offsets};                     \
        if (ahead) {                                                                                            \
            const long base = (long)blockIdx.x * blockDim.x, i = base + threadIdx.x;                            \
            ple_embed_ids(ids_s, g, base, n, d);                                                                \
            const float v = i < n ? ple_embed_value(table, ids_s, base, i, d) : 0.0f;                           \
            wait_for_producers();                                                                               \
            ple_embed_next_history(history, arrivals, g, rows);                                                 \
            if (i < n) y[i] = v;                                                                                \
        } else {                                                                                                \
            ple_embed_next_history(history, arrivals, g, rows);                                                 \
            ple_embed_rows<W>(y, ids_s, table, g, n, d);                                                        \
        }                                                                                                       \
    }

PLE_EMBED_KERNEL(float, f32)
PLE_EMBED_KERNEL(bf16_t, bf16)
