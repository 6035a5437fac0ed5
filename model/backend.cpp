#include "model/backend.h"

#include <omp.h>

#include <cmath>

#include "model/kernels/attention_scratch.h"

namespace tpsp {

Dim cuda_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
    return {cuda_attention_scratch_elements(b, s, h / t, a / t), t > 1 ? "7·b·s·h/t+b·a/t·s²" : "7·b·s·h+b·a·s²"};
}

double CpuBackend::square_sum(const float* x, int64_t n) {
    double sum = 0.0;
#pragma omp parallel for reduction(+ : sum)
    for (int64_t i = 0; i < n; i++) sum += double(x[i]) * x[i];
    return sum;
}

Dim CpuBackend::attention_scratch(int64_t, int64_t s, int64_t, int64_t, int64_t) {
    return {omp_get_max_threads() * s * s, "threads·s·s"};
}

void CpuBackend::attention_forward(float* out, float* softmax_out, uint8_t* dropout_mask, float* dropout_out,
                                   const float* qkv, float*, int B, int T, int C, int NH, float p,
                                   const DropoutBox& box, const DropoutKey& key) {
    tpsp::attention_forward(out, softmax_out, dropout_mask, dropout_out, qkv, B, T, C, NH, p, box, key);
}

void CpuBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* softmax_out,
                                    const uint8_t* dropout_mask, const float* dropout_out, float* scratch, int B,
                                    int T, int C, int NH, float p) {
    tpsp::attention_backward(dqkv, dout, qkv, softmax_out, dropout_mask, dropout_out, scratch, B, T, C, NH, p);
}

void CpuBackend::finish_losses(float* losses, float* lse, const float* maxes, const float* stats, int N) {
    for (int n = 0; n < N; n++) {
        lse[n] = maxes[n] + std::log(stats[n]);
        losses[n] = lse[n] - stats[N + n];
    }
}

float CpuBackend::mean_loss(const float* losses, int N) {
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    return float(sum / N);
}

}  // namespace tpsp
