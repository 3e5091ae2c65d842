// Elementwise ops over n f32 values (src/ops/elementwise.rs is the reference).
#include "common.cuh"

extern "C" __global__ void silu_reference_f32(float* y, const float* x, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = silu_f32(x[i]);
}

extern "C" __global__ void sigmoid_reference_f32(float* y, const float* x, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = sigmoid_f32(x[i]);
}

extern "C" __global__ void div_by_reference_f32(float* y, const float* x, float by, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = x[i] / by;
}

extern "C" __global__ void mul_by_reference_f32(float* y, const float* x, float by, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = x[i] * by;
}

extern "C" __global__ void add_reference_f32(float* y, const float* a, const float* b, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

// b has `b_width` columns per row of `width`: equal widths, or one column broadcast over the row.
extern "C" __global__ void mul_reference_f32(float* y, const float* a, const float* b, long width, long b_width, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = a[i] * (b_width == width ? b[i] : b[i / width]);
}

// x * sigmoid(gate) (`Op::SigmoidMul`), gate shaped as mul_reference_f32's b, with the same
// expression as mul_reference_f32 over sigmoid_reference_f32's output.
extern "C" __global__ void sigmoid_mul_reference_f32(float* y, const float* x, const float* gate, long width,
                                                     long g_width, long n) {
    wait_for_producers();
    GRID_STRIDE(i, n) y[i] = x[i] * sigmoid_f32(g_width == width ? gate[i] : gate[i / width]);
}
