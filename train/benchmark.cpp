#include "train/benchmark.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace tpsp {

static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double measure_sgemm_flops() {
    const int n = 1024;
    std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
    double best = 1e30;
    for (int rep = 0; rep < 11; rep++) {  // the first is warmup
        auto start = std::chrono::steady_clock::now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                    c.data(), n);
        if (rep > 0) best = std::min(best, seconds_since(start));
    }
    return 2.0 * n * n * n / best;
}

void run_benchmark(const GPTConfig& config, const RunShape& shape, const BenchOptions& options, const char* label) {
    GPT model(config, shape);
    model.init_random(1);
    const int N = shape.batch * shape.seq_len;
    std::vector<int> inputs(size_t(N) + 1);
    uint32_t state = 12345;
    for (int& t : inputs) {
        state = state * 1664525u + 1013904223u;
        t = int(state >> 8) % config.vocab_size;
    }
    const int* targets = inputs.data() + 1;

    double peak = measure_sgemm_flops();
    std::vector<double> times;
    for (int i = 0; i < options.warmup + options.steps; i++) {
        auto start = std::chrono::steady_clock::now();
        model.zero_grad();
        model.forward(inputs.data(), targets, {1, uint32_t(i), 0});
        model.backward(1.0f / N);
        if (i >= options.warmup) times.push_back(seconds_since(start));
    }
    // the machine is shared: take the best sgemm rate seen before and after
    peak = std::max(peak, measure_sgemm_flops());
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    double flops = model_flops_per_token(config, shape.seq_len) * N;
    std::printf("%-10s L=%d h=%d a=%d V=%d b=%d s=%d dropout=%g threads=%d | params %.1fM | sgemm peak %.1f GFLOP/s"
                " | fwd+bwd %.1f ms (median of %d, best %.1f) | %.0f tok/s | %.1f GFLOP/s | MFU %.1f%%\n",
                label, config.num_layers, config.channels, config.num_heads, config.vocab_size, shape.batch,
                shape.seq_len, shape.dropout, omp_get_max_threads(), model.num_parameters / 1e6, peak / 1e9,
                median * 1e3, options.steps, times.front() * 1e3, N / median, flops / median / 1e9, 100.0 * flops / median / peak);
}

}  // namespace tpsp
