// Shared helpers for every kernel file. Included by `#include "common.cuh"`; graphrun expands
// the include itself before handing the source to NVRTC (no include paths needed).
#pragma once

typedef unsigned short bf16_t;

// bf16 → f32 is exact: the bf16 bits are the high half of the f32.
__device__ __forceinline__ float bf16_to_f32(bf16_t v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over a block whose size is a multiple of 32 (at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float total = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(total);
}

// `for` over the indices [0, n) a thread takes in a grid-strided loop (a thread per index where
// the grid covers n).
#define GRID_STRIDE(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); i += (long)gridDim.x * blockDim.x)

// As torch: silu(x) = x * sigmoid(x).
__device__ __forceinline__ float silu_f32(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

// Programmatic dependent launch (sm_90 and later; src/exec/cuda/launcher.rs). graphrun lets a
// kernel start while the kernel before it in the stream still runs, so that it can begin reading
// its weights. Every kernel calls wait_for_producers() before it touches anything but weights
// (activations, state, its outputs, scratch): it returns once the kernels before it have finished
// and their writes are visible. It then lets the next kernel be scheduled, which starts that
// kernel's weight reads during this one's tail. Without the launch attribute both are no-ops.
#ifdef GRAPHRUN_TRACE
// The step timeline (`graphrun bench --trace`, src/exec/cuda/trace.rs): kernels compiled with
// GRAPHRUN_TRACE have block (0,0,0) record, once per launch, the launch's grid id, when it
// reached its wait and when the wait returned (%globaltimer, ns). The host points this at the
// trace buffer after loading the module: [0] counts records, record i is the four words at
// 8 + 4i. Only one block records, so that the atomic does not delay the kernels it measures.
extern "C" {
__device__ unsigned long long* graphrun_trace;
}
__device__ __forceinline__ unsigned long long trace_clock() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ bool trace_recorder() {
    return graphrun_trace != nullptr && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 &&
           blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
}
__device__ __forceinline__ void trace_record(unsigned long long arrived) {
    const unsigned long long released = trace_clock();
    unsigned long long grid;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long i = atomicAdd(graphrun_trace, 1ull);
    const unsigned long long capacity = graphrun_trace[1];
    if (i < capacity) {
        unsigned long long* r = graphrun_trace + 8 + 4 * i;
        r[0] = grid;
        r[1] = arrived;
        r[2] = released;
        r[3] = ((unsigned long long)sm << 32) | (gridDim.x * gridDim.y * gridDim.z);
    }
}
#endif

// Lets the kernel after this one launch now, before this kernel has waited (wait_for_producers
// triggers it only after the wait, so that by the time a kernel starts every kernel before the
// one ahead of it has finished: what running ahead relies on). For a kernel whose successor
// touches nothing but weights and its own state before its wait: the executor gives the node
// after such a node no ready inputs (`releases_early` in src/exec/cuda/executor.rs). Its use: the
// successor's blocks take SMs as the kernel two back drains and load their state meanwhile.
__device__ __forceinline__ void release_dependents_early() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef GRAPHRUN_TRACE
    const bool recorder = trace_recorder();
    const unsigned long long arrived = recorder ? trace_clock() : 0ull;
#endif
    asm volatile("griddepcontrol.wait;" ::: "memory");
#ifdef GRAPHRUN_TRACE
    if (recorder) trace_record(arrived);
#endif
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Running ahead (`Launch::take_ready_inputs`, src/exec/cuda/context.rs): the executor tells a node's
// launcher which of its inputs are not outputs of the node launched just before it; when those a
// kernel reads first are among them, the launcher passes inputs_ready = 1 to the node's first
// kernel. Such a kernel may read those inputs and compute before it waits: by
// the time it runs at all, every kernel before the one ahead of it has finished (that one's
// blocks let it start only once past their own waits), so those inputs are complete and visible.
// It must still write nothing (outputs, scratch) before wait_for_producers(): the kernel ahead
// may still be reading slots that this one's outputs reuse. The pattern:
//     wait_for_producers_unless(ahead);  // the first wait: skipped when running ahead
//     ... reads and arithmetic into registers or shared memory ...
//     if (ahead) wait_for_producers();
//     ... writes ...
__device__ __forceinline__ void wait_for_producers_unless(bool ahead) {
    if (!ahead) wait_for_producers();
}

// Asks the memory system to bring `bytes` of weights at `p` into L2 (sm_90 and later: one
// bulk-copy prefetch; a hint that changes no result). Called before wait_for_producers(), with
// the weights this block reads first, so that they stream in while the kernel before finishes.
__device__ __forceinline__ void prefetch_weights(const void* p, long bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    const unsigned long long start = (a + 15ull) & ~15ull;  // the instruction wants 16-byte units
    const long long n = ((long long)bytes - (long long)(start - a)) & ~15ll;
    if (n <= 0) return;
    unsigned long long g;
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(start));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(g), "r"((unsigned int)min(n, 1ll << 30)) : "memory");
#endif
}

// A shared-memory pointer as the 32-bit shared address PTX takes. The intrinsic rather than
// inline PTX, so that the compiler folds the conversion for a __shared__ array's address (the
// PTX block cost tens of instructions a copy in ple_mix's per-channel copies).
__device__ __forceinline__ unsigned shared_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// Asynchronous copies global → shared (sm_80+): issued, committed as a group, waited for.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
// One float (any 4-byte-aligned address).
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// A signed int whose order is the float order (for non-NaN values) and back.
__device__ __forceinline__ int float_order_key(float f) {
    const int b = __float_as_int(f);
    return b ^ ((b >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float float_from_order_key(int k) { return __int_as_float(k ^ ((k >> 31) & 0x7fffffff)); }

// Max of a 64-bit value over the warp (every lane calls it; every lane gets the result).
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
    const unsigned int hi = __reduce_max_sync(0xffffffffu, (unsigned int)(v >> 32));
    const unsigned int lo = __reduce_max_sync(0xffffffffu, (unsigned int)(v >> 32) == hi ? (unsigned int)v : 0u);
    return (((unsigned long long)hi) << 32) | (unsigned long long)lo;
}
