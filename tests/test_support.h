// What the tests share: random inputs, finite differences, relative errors.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace tpsp::testing {

inline std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
}

// Σ out[i] · weights[i] in double: the scalar whose gradient wrt out is `weights`.
inline double weighted_sum(const float* out, const std::vector<float>& weights) {
    double sum = 0.0;
    for (size_t i = 0; i < weights.size(); i++) sum += double(out[i]) * weights[i];
    return sum;
}

// Relative error ||analytic − numeric|| / ||numeric|| over (up to max_checks
// evenly spaced) elements of x, where numeric is the central difference of
// loss() with step h.
inline double gradient_error(const std::function<double()>& loss, float* x, const float* analytic, int64_t n,
                             float h = 1e-2f, int64_t max_checks = 400) {
    int64_t stride = std::max<int64_t>(1, n / max_checks);
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; i += stride) {
        float original = x[i];
        x[i] = original + h;
        double plus = loss();
        x[i] = original - h;
        double minus = loss();
        x[i] = original;
        double numeric = (plus - minus) / (2.0 * h);
        diff += (analytic[i] - numeric) * (analytic[i] - numeric);
        norm += numeric * numeric;
    }
    return std::sqrt(diff / std::max(norm, 1e-30));
}

// n + 1 token ids below vocab_size (inputs are the first n, targets the last n).
inline std::vector<int> random_tokens(int n, int vocab_size, uint32_t seed) {
    std::vector<int> t(size_t(n) + 1);
    for (int& x : t) {
        seed = seed * 1664525u + 1013904223u;
        x = int(seed >> 8) % vocab_size;
    }
    return t;
}

// ||a − ref|| / ||ref||, accumulated in double.
inline double relative_error(const float* a, const float* ref, int64_t n) {
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < n; i++) {
        diff += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
        norm += double(ref[i]) * ref[i];
    }
    return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace tpsp::testing
