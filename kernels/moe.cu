// Mixture of experts and PLE n-gram ids (src/ops/moe.rs and src/ops/ple.rs are the reference).
//
// - `moe_router_reference_f32`: softmax over each row of router logits, then the top k in
//   selection order, renormalised when asked; one block per row, ids and weights stay on the device.
// - `moe_experts_gate_up_*` / `moe_experts_down_*`: the token-major routed SwiGLU experts in two
//   launches. The first writes act[t, j, :] = silu(G) * U for every slot (t, j); the second sums
//   the k down-projections of each token in slot order. Expert ids are read on the device.
// - `ple_ngram_ids_reference_i64`: hashed n-gram ids with the history carried in a device buffer.
#include "common.cuh"

// The largest top k the router keeps per row (checked on the host).
#define ROUTER_MAX_TOPK 64
// -inf and a quiet NaN (NVRTC has no math.h constants).
#define MOE_NEG_INF __int_as_float(0xff800000)
#define MOE_NAN __int_as_float(0x7fc00000)

// Max over a block whose size is a multiple of 32 (at most 1024); every thread gets the result.
// fmaxf ignores NaN as f32::max does, and max is exact in any order.
__device__ __forceinline__ float moe_block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float m = lane < warps ? partial[lane] : MOE_NEG_INF;
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    return m;
}

// Unsigned max over a block (size a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ unsigned long long moe_block_max_u64(unsigned long long v) {
    __shared__ unsigned long long partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, offset);
        v = o > v ? o : v;
    }
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    unsigned long long m = lane < warps ? partial[lane] : 0ull;
    for (int offset = 16; offset > 0; offset >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, m, offset);
        m = o > m ? o : m;
    }
    return m;
}

// A 64-bit rank whose unsigned order is the reference's selection order: the probability by
// f32::total_cmp (larger first), then the expert id (lower first). 0 is never a real rank.
__device__ __forceinline__ unsigned long long router_rank(float p, int id) {
    int bits = __float_as_int(p);
    bits ^= (int)(((unsigned int)(bits >> 31)) >> 1);  // total_cmp's key, ordered as a signed int
    const unsigned int ord = ((unsigned int)bits) ^ 0x80000000u;  // ... and as an unsigned int
    return (((unsigned long long)ord) << 32) | (unsigned long long)(~(unsigned int)id);
}

// ids, weights [rows, top_k]; logits [rows, experts]. Dynamic shared memory: experts floats
// (the probabilities) then experts bytes (taken flags).
extern "C" __global__ void moe_router_reference_f32(long long* ids, float* weights, const float* logits, long rows,
                                                    int experts, int top_k, int normalize) {
    extern __shared__ float probs[];
    unsigned char* taken = reinterpret_cast<unsigned char*>(probs + experts);
    __shared__ float total;
    __shared__ int sel_id[ROUTER_MAX_TOPK];
    __shared__ float sel_p[ROUTER_MAX_TOPK];
    for (long row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* l = logits + row * experts;
        float mx = MOE_NEG_INF;
        for (int e = threadIdx.x; e < experts; e += blockDim.x) mx = fmaxf(mx, l[e]);
        mx = moe_block_max(mx);
        // exp in double rounded once to f32: as close to the CPU's expf as a device gets.
        for (int e = threadIdx.x; e < experts; e += blockDim.x) {
            probs[e] = (float)exp((double)__fsub_rn(l[e], mx));
            taken[e] = 0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The reference's sum: sequential, in expert order.
            float s = 0.0f;
#pragma unroll 8
            for (int e = 0; e < experts; e++) s = __fadd_rn(s, probs[e]);
            total = s;
        }
        __syncthreads();
        const float sum = total;
        for (int e = threadIdx.x; e < experts; e += blockDim.x) probs[e] = __fdiv_rn(probs[e], sum);
        __syncthreads();
        for (int j = 0; j < top_k; j++) {
            unsigned long long best = 0ull;
            for (int e = threadIdx.x; e < experts; e += blockDim.x) {
                if (!taken[e]) {
                    const unsigned long long r = router_rank(probs[e], e);
                    best = r > best ? r : best;
                }
            }
            best = moe_block_max_u64(best);
            if (threadIdx.x == 0) {
                const int id = (int)(~(unsigned int)(best & 0xffffffffull));
                taken[id] = 1;
                sel_id[j] = id;
                sel_p[j] = probs[id];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            float chosen = 0.0f;
            for (int j = 0; j < top_k; j++) chosen = __fadd_rn(chosen, sel_p[j]);
            for (int j = 0; j < top_k; j++) {
                ids[row * top_k + j] = sel_id[j];
                weights[row * top_k + j] = normalize ? __fdiv_rn(sel_p[j], chosen) : sel_p[j];
            }
        }
        __syncthreads();  // shared state is reused by the next row
    }
}

// bf16 pairs in a 32-bit word: the low half is the earlier element.
__device__ __forceinline__ void bf16x8_to_f32(const uint4 packed, float* w) {
    const unsigned int words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w[2 * j] = __uint_as_float(words[j] << 16);
        w[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
}

// act [slots, inter], slot s = t * top_k + j; x [tokens, hidden]; ids [slots];
// gate_up [experts, 2 * inter, hidden] (inter gate rows, then inter up rows).
// One warp per (slot, r): the gate row r and the up row r of the slot's expert, read together.
// An id outside [0, experts) yields NaN rather than a read out of bounds.
extern "C" __global__ void moe_experts_gate_up_f32(float* act, const float* x, const long long* ids,
                                                   const float* gate_up, long slots, int top_k, long hidden,
                                                   long inter, long experts) {
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long s = blockIdx.y; s < slots; s += gridDim.y) {
        const long long e = ids[s];
        const float* xr = x + (s / top_k) * hidden;
        for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < inter; r += gridDim.x * warps_per_block) {
            if (e < 0 || e >= experts) {
                if (lane == 0) act[s * inter + r] = MOE_NAN;
                continue;
            }
            const float* gw = gate_up + (e * 2 * inter + r) * hidden;
            const float* uw = gw + inter * hidden;
            float g = 0.0f, u = 0.0f;
            if ((hidden & 3) == 0) {
                const float4* g4 = reinterpret_cast<const float4*>(gw);
                const float4* u4 = reinterpret_cast<const float4*>(uw);
                const float4* x4 = reinterpret_cast<const float4*>(xr);
#pragma unroll 4
                for (long i = lane; i < hidden / 4; i += 32) {
                    const float4 gv = g4[i], uv = u4[i], xv = x4[i];
                    g += gv.x * xv.x + gv.y * xv.y + gv.z * xv.z + gv.w * xv.w;
                    u += uv.x * xv.x + uv.y * xv.y + uv.z * xv.z + uv.w * xv.w;
                }
            } else {
                for (long i = lane; i < hidden; i += 32) {
                    g += gw[i] * xr[i];
                    u += uw[i] * xr[i];
                }
            }
            g = warp_sum(g);
            u = warp_sum(u);
            if (lane == 0) act[s * inter + r] = silu_f32(g) * u;
        }
    }
}

extern "C" __global__ void moe_experts_gate_up_bf16(float* act, const float* x, const long long* ids,
                                                    const bf16_t* gate_up, long slots, int top_k, long hidden,
                                                    long inter, long experts) {
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long s = blockIdx.y; s < slots; s += gridDim.y) {
        const long long e = ids[s];
        const float* xr = x + (s / top_k) * hidden;
        for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < inter; r += gridDim.x * warps_per_block) {
            if (e < 0 || e >= experts) {
                if (lane == 0) act[s * inter + r] = MOE_NAN;
                continue;
            }
            const bf16_t* gw = gate_up + (e * 2 * inter + r) * hidden;
            const bf16_t* uw = gw + inter * hidden;
            float g = 0.0f, u = 0.0f;
            if ((hidden & 7) == 0) {
                // 8 bf16 weights per 16-byte load, from both rows.
                const uint4* g8 = reinterpret_cast<const uint4*>(gw);
                const uint4* u8 = reinterpret_cast<const uint4*>(uw);
#pragma unroll 2
                for (long i = lane; i < hidden / 8; i += 32) {
                    const uint4 gp = g8[i], up = u8[i];
                    const float4* x4 = reinterpret_cast<const float4*>(xr + i * 8);
                    const float4 a = x4[0], b = x4[1];
                    float gv[8], uv[8];
                    bf16x8_to_f32(gp, gv);
                    bf16x8_to_f32(up, uv);
                    g += gv[0] * a.x + gv[1] * a.y + gv[2] * a.z + gv[3] * a.w + gv[4] * b.x + gv[5] * b.y +
                         gv[6] * b.z + gv[7] * b.w;
                    u += uv[0] * a.x + uv[1] * a.y + uv[2] * a.z + uv[3] * a.w + uv[4] * b.x + uv[5] * b.y +
                         uv[6] * b.z + uv[7] * b.w;
                }
            } else {
                for (long i = lane; i < hidden; i += 32) {
                    g += bf16_to_f32(gw[i]) * xr[i];
                    u += bf16_to_f32(uw[i]) * xr[i];
                }
            }
            g = warp_sum(g);
            u = warp_sum(u);
            if (lane == 0) act[s * inter + r] = silu_f32(g) * u;
        }
    }
}

// y [tokens, hidden]; act [tokens * top_k, inter]; ids, w [tokens, top_k]; down [experts, hidden, inter].
// One warp per (token, output row r): the k dots of the slots, then, as the reference,
// y = ((0 + w0*d0) + w1*d1) + ... in slot order with no fused multiply-add.
extern "C" __global__ void moe_experts_down_f32(float* y, const float* act, const long long* ids, const float* w,
                                                const float* down, long tokens, int top_k, long hidden, long inter,
                                                long experts) {
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long t = blockIdx.y; t < tokens; t += gridDim.y) {
        for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < hidden; r += gridDim.x * warps_per_block) {
            float acc = 0.0f;
            for (int j = 0; j < top_k; j++) {
                const long s = t * top_k + j;
                const long long e = ids[s];
                if (e < 0 || e >= experts) {
                    acc = MOE_NAN;
                    continue;
                }
                const float* dr = down + (e * hidden + r) * inter;
                const float* ar = act + s * inter;
                float d = 0.0f;
                if ((inter & 3) == 0) {
                    const float4* d4 = reinterpret_cast<const float4*>(dr);
                    const float4* a4 = reinterpret_cast<const float4*>(ar);
#pragma unroll 4
                    for (long i = lane; i < inter / 4; i += 32) {
                        const float4 dv = d4[i], av = a4[i];
                        d += dv.x * av.x + dv.y * av.y + dv.z * av.z + dv.w * av.w;
                    }
                } else {
                    for (long i = lane; i < inter; i += 32) d += dr[i] * ar[i];
                }
                d = warp_sum(d);
                acc = __fadd_rn(acc, __fmul_rn(w[s], d));
            }
            if (lane == 0) y[t * hidden + r] = acc;
        }
    }
}

extern "C" __global__ void moe_experts_down_bf16(float* y, const float* act, const long long* ids, const float* w,
                                                 const bf16_t* down, long tokens, int top_k, long hidden, long inter,
                                                 long experts) {
    const long warps_per_block = blockDim.x >> 5;
    const int lane = threadIdx.x & 31;
    for (long t = blockIdx.y; t < tokens; t += gridDim.y) {
        for (long r = blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < hidden; r += gridDim.x * warps_per_block) {
            float acc = 0.0f;
            for (int j = 0; j < top_k; j++) {
                const long s = t * top_k + j;
                const long long e = ids[s];
                if (e < 0 || e >= experts) {
                    acc = MOE_NAN;
                    continue;
                }
                const bf16_t* dr = down + (e * hidden + r) * inter;
                const float* ar = act + s * inter;
                float d = 0.0f;
                if ((inter & 7) == 0) {
                    const uint4* d8 = reinterpret_cast<const uint4*>(dr);
#pragma unroll 2
                    for (long i = lane; i < inter / 8; i += 32) {
                        float dv[8];
                        bf16x8_to_f32(d8[i], dv);
                        const float4* a4 = reinterpret_cast<const float4*>(ar + i * 8);
                        const float4 a = a4[0], b = a4[1];
                        d += dv[0] * a.x + dv[1] * a.y + dv[2] * a.z + dv[3] * a.w + dv[4] * b.x + dv[5] * b.y +
                             dv[6] * b.z + dv[7] * b.w;
                    }
                } else {
                    for (long i = lane; i < inter; i += 32) d += bf16_to_f32(dr[i]) * ar[i];
                }
                d = warp_sum(d);
                acc = __fadd_rn(acc, __fmul_rn(w[s], d));
            }
            if (lane == 0) y[t * hidden + r] = acc;
        }
    }
}

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

// ids [rows, (ngram-1) * hpn]; history [ngram-1] (read, then replaced by the last ngram-1 ids of
// history ++ tokens); tokens [rows]; multipliers [ngram]; sizes, offsets [(ngram-1) * hpn].
// One block: the old history is copied into shared memory before anyone writes it.
extern "C" __global__ void ple_ngram_ids_reference_i64(long long* ids, long long* history, const long long* tokens,
                                                       long rows, long long eos, int ngram, int hpn,
                                                       const long long* multipliers, const long long* sizes,
                                                       const long long* offsets) {
    extern __shared__ long long old_history[];
    const int ctx = ngram - 1;
    const int heads = ctx * hpn;
    for (int i = threadIdx.x; i < ctx; i += blockDim.x) old_history[i] = history[i];
    __syncthreads();
    // hist(q): position q of history ++ tokens.
#define HIST(q) ((q) < ctx ? old_history[(q)] : tokens[(q) - ctx])
    const long len = ctx + rows;
    for (long p = ctx + threadIdx.x; p < len; p += blockDim.x) {
        long long* out = ids + (p - ctx) * heads;
        long long mix = wrapping_mul_i64(HIST(p), multipliers[0]);
        bool cut = false;  // an eos strictly between p - k and p
        for (int k = 1; k < ngram; k++) {
            long long shifted;
            if (k > p) {
                shifted = eos;
            } else {
                if (k >= 2 && HIST(p - k + 1) == eos) cut = true;
                shifted = cut ? eos : HIST(p - k);
            }
            mix ^= wrapping_mul_i64(shifted, multipliers[k]);
            for (int hh = 0; hh < hpn; hh++) {
                const int h = (k - 1) * hpn + hh;
                out[h] = rem_euclid_i64(mix, sizes[h]) + offsets[h];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ctx; i += blockDim.x) history[i] = HIST(len - ctx + i);
#undef HIST
}
