// PLE n-gram ids (`ops::ple::ngram_ids` is the reference), shared by the ids kernel
// (`ple_ngram_ids_reference_i64`, moe.cu) and the fused ids + gather (`ple_embed_*`, embed.cu),
// so that both hash the same way. Positions count through history ++ tokens: the ctx = ngram - 1
// previous tokens (eos at a sequence's start), then the step's tokens.
#pragma once
#include "common.cuh"

// The most history a node keeps (ngram <= 64, checked by the launchers).
#define NGRAM_MAX_CTX 64

// Wrapping i64 multiplication (Rust's wrapping_mul): unsigned multiply, reinterpreted.
__device__ __forceinline__ long long wrapping_mul_i64(long long a, long long b) {
    return (long long)((unsigned long long)a * (unsigned long long)b);
}

// Rust's i64::rem_euclid (never negative); b == -1 gives 0 without the overflowing division.
__device__ __forceinline__ long long rem_euclid_i64(long long a, long long b) {
    if (b == -1) return 0;
    const long long r = a % b;
    return r < 0 ? (b < 0 ? r - b : r + b) : r;
}

// What hashing a step's ids reads: the old history (ctx values, in shared memory), the step's
// tokens and the node's hash table (multipliers [ngram], sizes and offsets [ctx * hpn]).
struct NgramArgs {
    const long long* old_history;
    const long long* tokens;
    int ctx, hpn;
    long long eos;
    const long long* multipliers;
    const long long* sizes;
    const long long* offsets;
};

// Position q of history ++ tokens.
__device__ __forceinline__ long long ngram_hist(const NgramArgs& g, long q) {
    return q < g.ctx ? g.old_history[q] : g.tokens[q - g.ctx];
}

// Copies the node's history (its own state: only this node writes it, in earlier steps) into
// `old_history` in shared memory, for the whole block.
__device__ __forceinline__ void ngram_load_own_state(long long* old_history, const long long* history, int ctx) {
    for (int i = threadIdx.x; i < ctx; i += blockDim.x) old_history[i] = history[i];
    __syncthreads();
}

// The id of (row, head) item r of the step: head h = r % heads hashes the (h / hpn + 2)-gram
// ending at the row's position p, each shifted token replaced by eos past the sequence's start
// or an earlier eos (an eos ends its segment).
__device__ __forceinline__ long long ngram_id(const NgramArgs& g, long r) {
    const long heads = (long)g.ctx * g.hpn;
    const long p = g.ctx + r / heads;
    const int h = (int)(r % heads), kh = h / g.hpn + 1;
    long long mix = wrapping_mul_i64(ngram_hist(g, p), g.multipliers[0]);
    bool cut = false;  // an eos strictly between p - k and p
    for (int k = 1; k <= kh; k++) {
        long long shifted;
        if (k > p) {
            shifted = g.eos;
        } else {
            if (k >= 2 && ngram_hist(g, p - k + 1) == g.eos) cut = true;
            shifted = cut ? g.eos : ngram_hist(g, p - k);
        }
        mix ^= wrapping_mul_i64(shifted, g.multipliers[k]);
    }
    return rem_euclid_i64(mix, g.sizes[h]) + g.offsets[h];
}

// The history after a step of `rows` tokens: the last ctx positions of history ++ tokens (the
// block's threads each write some).
__device__ __forceinline__ void ngram_store_history(long long* history, const NgramArgs& g, long rows) {
    for (int i = threadIdx.x; i < g.ctx; i += blockDim.x) history[i] = ngram_hist(g, rows + i);
}
