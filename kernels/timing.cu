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
