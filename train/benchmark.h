// `tpsp bench`: forward+backward timed on random tokens, for either backend.
#pragma once
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt.h"
#include "parallel/trace.h"

namespace tpsp {

struct BenchOptions {
    int steps = 5;
    int warmup = 2;
    bool breakdown = false;  // --breakdown: one more step, timed span by span
};

// One forward+backward's time per span name (layernorm, each linear,
// attention, ...), from a step whose every span waits for the device at
// both ends (Tracer::fence); the last row is the part no span covers, so the
// rows add up to that step. Printed by `tpsp bench --breakdown`.
inline void print_breakdown(const Tracer& tracer, double step_seconds) {
    const std::vector<std::pair<std::string, double>> spans = tracer.compute_seconds_by_name();
    double covered = 0.0;
    for (const auto& [name, seconds] : spans) covered += seconds;
    std::printf("breakdown of one forward+backward, %.3f ms with a wait at every span's ends:\n", step_seconds * 1e3);
    auto row = [&](const std::string& name, double seconds) {
        std::printf("  %-28s %9.3f ms %6.1f%%\n", name.c_str(), seconds * 1e3, 100.0 * seconds / step_seconds);
    };
    for (const auto& [name, seconds] : spans) row(name, seconds);
    row("(outside every span)", step_seconds - covered);
}

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
    typename Backend::Comm group;  // a group of one, which carries the breakdown's tracer
    GPTModel<Backend> model(config, shape, {}, &group);
    model.init_random(1);
    const int N = shape.batch * shape.seq_len;
    std::vector<int> inputs(size_t(N) + 1);
    uint32_t state = 12345;
    for (int& t : inputs) {
        state = state * 1664525u + 1013904223u;
        t = int(state >> 8) % config.vocab_size;
    }
    const int* targets = inputs.data() + 1;

    auto step = [&](int i) {
        auto start = std::chrono::steady_clock::now();
        model.zero_grad();
        model.forward(inputs.data(), targets, {1, uint32_t(i), 0});
        model.backward(1.0f / N);
        model.finish_grads();
        Backend::synchronize();
        return seconds_since(start);
    };
    double peak = Backend::peak_flops();
    std::vector<double> times;
    for (int i = 0; i < options.warmup + options.steps; i++) {
        const double seconds = step(i);
        if (i >= options.warmup) times.push_back(seconds);
    }
    // the CPU is shared: take the best sgemm rate seen before and after
    peak = std::max(peak, Backend::peak_flops());
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double flops = model_flops_per_token(config, shape.seq_len) * N;
    const char* attention = config.attention == AttentionKernel::cudnn_fused ? "cudnn" : "explicit";
    std::printf(
        "%-10s %s L=%d h=%d a=%d V=%d b=%d s=%d dropout=%g attention=%s recompute=%s threads=%d | params %.1fM"
        " | %s %.1f GFLOP/s | fwd+bwd %.1f ms (median of %d, best %.1f) | %.0f tok/s | %.1f GFLOP/s | MFU %.1f%%"
        " | activations %.1f MiB, workspace %.1f MiB\n",
        label, Backend::name, config.num_layers, config.channels, config.num_heads, config.vocab_size, shape.batch,
        shape.seq_len, shape.dropout, attention, recompute_description(shape).c_str(), omp_get_max_threads(),
        model.num_parameters / 1e6, Backend::peak_flops_name(), peak / 1e9, median * 1e3, options.steps,
        times.front() * 1e3, N / median, flops / median / 1e9, 100.0 * flops / median / peak,
        model.activation_arena.bytes() / 1048576.0, model.workspace_arena.bytes() / 1048576.0);
    std::printf("%-10s kernels: %s\n", "", Backend::kernels().c_str());
    if (!options.breakdown) return;
    Tracer tracer;
    tracer.enable(size_t(100000));
    tracer.fence = Backend::synchronize;
    group.tracer = &tracer;
    const double seconds = step(options.warmup + options.steps);
    group.tracer = nullptr;
    print_breakdown(tracer, seconds);
}

}  // namespace tpsp
