// AdamW (Loshchilov & Hutter) with decoupled weight decay, global gradient
// norm clipping, and the learning-rate schedule.
#pragma once
#include <cstdint>
#include <vector>

#include "model/gpt.h"
#include "model/tensor_table.h"

namespace tpsp {

struct AdamWSettings {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    bool decay_all = false;
};

class AdamW {
public:
    AdamW(const GPT& model, const AdamWSettings& settings);
    // One update of every parameter; step counts from 1.
    void update(GPT& model, float lr, float grad_scale, int64_t step);
    std::vector<float> m, v;  // first and second moments, in parameter order

private:
    struct Range {
        int64_t begin, end;
        bool decay;
    };
    std::vector<Range> ranges_;
    AdamWSettings settings_;
};

struct LrSchedule {
    float lr, min_lr_ratio;
    int warmup_steps, total_steps;
    bool cosine;
    // step counts from 0
    float at(int step) const;
};

}  // namespace tpsp
