// `tpsp bench`: forward+backward timed on random tokens, for either backend.
#pragma once
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "model/gpt.h"

namespace tpsp {

struct BenchOptions {
    int steps = 5;
    int warmup = 2;
};

// Times forward+backward of the model on random tokens and prints ms,
// tokens/s, MFU against the backend's peak (measured in the same run on the
// CPU, the card's bf16 peak on a GPU) and the activation bytes.
// benchmark.cpp instantiates it on the CPU, cuda_commands.cpp on CUDA.
template <class Backend>
void run_benchmark(const GPTConfig& config, const RunShape& shape, const BenchOptions& options, const char* label) {
    auto seconds_since = [](std::chrono::steady_clock::time_point start) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    typename Backend::Runtime runtime(0);
    GPTModel<Backend> model(config, shape);
    model.init_random(1);
    const int N = shape.batch * shape.seq_len;
    std::vector<int> inputs(size_t(N) + 1);
    uint32_t state = 12345;
    for (int& t : inputs) {
        state = state * 1664525u + 1013904223u;
        t = int(state >> 8) % config.vocab_size;
    }
    const int* targets = inputs.data() + 1;

    double peak = Backend::peak_flops();
    std::vector<double> times;
    for (int i = 0; i < options.warmup + options.steps; i++) {
        auto start = std::chrono::steady_clock::now();
        model.zero_grad();
        model.forward(inputs.data(), targets, {1, uint32_t(i), 0});
        model.backward(1.0f / N);
        Backend::synchronize();
        if (i >= options.warmup) times.push_back(seconds_since(start));
    }
    // the CPU is shared: take the best sgemm rate seen before and after
    peak = std::max(peak, Backend::peak_flops());
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double flops = model_flops_per_token(config, shape.seq_len) * N;
    const char* attention = config.attention == AttentionKernel::cudnn_fused ? "cudnn" : "explicit";
    std::printf("%-10s %s L=%d h=%d a=%d V=%d b=%d s=%d dropout=%g attention=%s threads=%d | params %.1fM | %s %.1f GFLOP/s"
                " | fwd+bwd %.1f ms (median of %d, best %.1f) | %.0f tok/s | %.1f GFLOP/s | MFU %.1f%%"
                " | activations %.1f MiB\n",
                label, Backend::name, config.num_layers, config.channels, config.num_heads, config.vocab_size,
                shape.batch, shape.seq_len, shape.dropout, attention, omp_get_max_threads(), model.num_parameters / 1e6,
                Backend::peak_flops_name(), peak / 1e9, median * 1e3, options.steps, times.front() * 1e3, N / median,
                flops / median / 1e9, 100.0 * flops / median / peak, model.activation_arena.bytes() / 1048576.0);
}

}  // namespace tpsp
