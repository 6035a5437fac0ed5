#include "model/backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/cpu_blas.h"
#include "model/kernels/attention_scratch.h"

namespace tpsp {

Dim cuda_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
    const char* symbol = t > 1 ? "7·b·s·h/t+b·a/t·s²" : "7·b·s·h+b·a·s²";
    return {cuda_attention_scratch_elements(b, s, h / t, a / t), symbol};
}

Dim cuda_ring_attention_scratch(int64_t b, int64_t s, int64_t h, int64_t a, int64_t t) {
    const char* symbol = t > 1 ? "2·b·s/cp·h/t+8·s/cp·h/t+a/t·(s/cp)²+128" : "2·b·s/cp·h+8·s/cp·h+a·(s/cp)²+128";
    return {cuda_ring_attention_scratch_elements(b, s, h / t, a / t), symbol};
}

void CpuBackend::add(float* acc, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void CpuBackend::zero(void* data, size_t bytes) {
    constexpr size_t piece = size_t(1) << 20;
    char* bytes_at = static_cast<char*>(data);
#pragma omp parallel for schedule(static)
    for (size_t at = 0; at < bytes; at += piece) std::memset(bytes_at + at, 0, std::min(piece, bytes - at));
}

void CpuBackend::square_sums(const float* x, const std::vector<SquareSumRange>& ranges, double sums[2]) {
    sums[0] = sums[1] = 0.0;
    for (const SquareSumRange& r : ranges) {
        double sum = 0.0;
#pragma omp parallel for reduction(+ : sum)
        for (int64_t i = r.begin; i < r.begin + r.count; i++) sum += double(x[i]) * x[i];
        sums[r.sum] += sum;
    }
}

Dim CpuBackend::attention_scratch(int64_t, int64_t s, int64_t, int64_t, int64_t) {
    return {omp_get_max_threads() * s * s, "threads·s·s"};
}

void CpuBackend::finish_losses(float* losses, float* lse, const float* maxes, const float* stats, int N) {
    for (int n = 0; n < N; n++) {
        lse[n] = maxes[n] + std::log(stats[n]);
        losses[n] = lse[n] - stats[N + n];
    }
}

void CpuBackend::adamw_update(float* params, const float* grads, float* m, float* v, int64_t n, float weight_decay,
                              const AdamWStep& s) {
#pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) {
        float g = grads[i] * s.grad_scale;
        m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
        float m_hat = m[i] / s.correction1, v_hat = v[i] / s.correction2;
        params[i] -= s.lr * (m_hat / (std::sqrt(v_hat) + s.eps) + weight_decay * params[i]);
    }
}

double CpuBackend::peak_flops() {
    return held_sgemm_peak(measure_sgemm_flops(GemmLibrary::linears), omp_get_max_threads());
}

std::string CpuBackend::kernels() { return blas_kernels_description(); }

float CpuBackend::mean_loss(const float* losses, int N) {
    double sum = 0.0;
    for (int i = 0; i < N; i++) sum += losses[i];
    return float(sum / N);
}

}  // namespace tpsp
