#include "train/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/gpt_model.h"

namespace tpsp {

float LrSchedule::at(int step) const {
    if (step < warmup_steps) return lr * float(step + 1) / float(warmup_steps);
    if (!cosine) return lr;
    float min_lr = lr * min_lr_ratio;
    int span = std::max(1, total_steps - warmup_steps);
    float progress = std::min(1.0f, float(step - warmup_steps) / float(span));
    return min_lr + 0.5f * (1.0f + std::cos(float(M_PI) * progress)) * (lr - min_lr);
}

ModelStateBytes model_state_bytes(const GPTConfig& config, int tp, int64_t bucket_size, int dp, bool distributed,
                                  bool gemm_copies) {
    ParameterTensors unused;
    const std::vector<BucketUnit> units = bucket_units(parameter_table(config, tp, &unused));
    int64_t n = 0;
    for (const BucketUnit& u : units) n += u.elements;
    const BucketLayout layout(units, bucket_size, dp);
    ModelStateBytes bytes;
    bytes.parameters = bytes.gradients = 4 * n;
    if (gemm_copies) {
        GemmWeights<float> unused_copies;  // the table's shapes; each copied element is a bf16, 2 bytes
        for (const TensorSpec& w : gemm_weight_table(config, tp, &unused_copies)) bytes.gemm_copies += 2 * w.elements();
    }
    bytes.optimizer = 8 * (distributed ? layout.shard_elements() : n);
    bytes.buckets = int64_t(layout.buckets().size());
    bytes.padding = layout.padding();
    return bytes;
}

std::string model_state_table(const GPTConfig& config, int tp, int64_t bucket_size, bool on_gpu) {
    std::string text;
    char line[320];
    const ModelStateBytes one = model_state_bytes(config, tp, bucket_size, 1, false, on_gpu);
    const int64_t n = one.parameters / 4;
    const double copies = double(one.gemm_copies) / double(n);  // 2G/N bytes per parameter
    std::snprintf(line, sizeof line,
                  "\nmodel state per rank: N = %lld parameters (this rank's TP shard, t = %d), %s, "
                  "parallel.bucket_size %lld\n",
                  (long long)n, tp,
                  on_gpu ? "fp32 masters, gradients and moments, bf16 copies of the G GEMM weights" : "fp32 (e = 4)",
                  (long long)bucket_size);
    text += line;
    if (on_gpu) {
        std::snprintf(line, sizeof line, "  (G = %lld: 2G/N = %.3f bytes per parameter)\n",
                      (long long)(one.gemm_copies / 2), copies);
        text += line;
    }
    std::snprintf(line, sizeof line, "  %-12s %3s %8s %9s %14s %14s %14s %14s %14s %9s  %s\n", "optimizer", "d",
                  "buckets", "padding", "parameters", "bf16 copies", "gradients", "AdamW m, v", "total", "B/param",
                  "formula");
    text += line;
    const double fixed = 8.0 + copies;  // the parameters, their copies and the gradients, whole on every rank
    for (const bool distributed : {false, true})
        for (const int dp : {1, 2, 4, 8}) {
            const ModelStateBytes b = model_state_bytes(config, tp, bucket_size, dp, distributed, on_gpu);
            const double formula = distributed ? fixed + 8.0 * double(n + b.padding) / (double(dp) * n) : fixed + 8.0;
            const char* words = on_gpu ? (distributed ? "8 + 2G/N + 8(N + padding)/(dN)" : "16 + 2G/N")
                                       : (distributed ? "8 + 8(N + padding)/(dN)" : "16");
            std::snprintf(line, sizeof line,
                          "  %-12s %3d %8lld %9lld %14lld %14lld %14lld %14lld %14lld %9.3f  %s = %.3f\n",
                          distributed ? "distributed" : "plain", dp, (long long)b.buckets, (long long)b.padding,
                          (long long)b.parameters, (long long)b.gemm_copies, (long long)b.gradients,
                          (long long)b.optimizer, (long long)b.total(), double(b.total()) / double(n), words, formula);
            text += line;
        }
    return text;
}

}  // namespace tpsp
