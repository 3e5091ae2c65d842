// Kernels for measuring, not computing.
#include "common.cuh"

// Spins one thread for `ns` nanoseconds of the GPU's global timer. A profiled step launches this
// first, so the host has queued the whole step before the GPU starts it: the events recorded
// between nodes then time the kernels back to back, not the host's launch rate.
extern "C" __global__ void hold_gpu(long long ns) {
    wait_for_producers();
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while ((long long)(now - start) < ns);
}

// Does nothing after its wait: with the step timeline on (`graphrun bench --trace`), launched
// after a segment's last node, its recorded release is that node's end.
extern "C" __global__ void trace_end() { wait_for_producers(); }

// Reads `chunks` 16-byte words of `p` and nothing else (`graphrun bench --sweep-linear`'s read
// ceiling: what a kernel that only streams memory takes, the limit a matrix-vector product can
// approach): a grid-stride loop with READ_IN_FLIGHT loads a thread in flight. The words are
// folded together and stored only on a value no test data makes, so that the loads stay.
#define READ_IN_FLIGHT 8
extern "C" __global__ void __launch_bounds__(256) read_bytes(unsigned int* out, const uint4* p, long chunks) {
    wait_for_producers();
    const long stride = (long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (READ_IN_FLIGHT - 1) * stride < chunks; i += READ_IN_FLIGHT * stride) {
        uint4 v[READ_IN_FLIGHT];
#pragma unroll
        for (int u = 0; u < READ_IN_FLIGHT; u++) v[u] = __ldg(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < READ_IN_FLIGHT; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < chunks; i += stride) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
