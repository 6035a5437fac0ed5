// AdamW (Loshchilov & Hutter) with decoupled weight decay, global gradient
// norm clipping, and the learning-rate schedule.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/gpt.h"
#include "model/tensor_table.h"

namespace tpsp {

struct AdamWSettings {
    float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    bool decay_all = false;
};

// The moments live where the parameters do (the backend's memory), fp32.
template <class Backend>
class AdamWOptimizer {
public:
    AdamWOptimizer(const GPTModel<Backend>& model, const AdamWSettings& settings) : settings_(settings) {
        moment_specs_ = {tensor("m", {{model.num_parameters, "N"}}, &m),
                         tensor("v", {{model.num_parameters, "N"}}, &v)};
        arena_ = Arena(moment_specs_, Backend::memory());
        int64_t at = 0;
        for (const TensorSpec& t : model.parameter_specs) {
            ranges_.push_back({at, at + t.elements(), settings.decay_all || parameter_is_matrix(t.name)});
            at += t.elements();
        }
    }
    // One update of every parameter; step counts from 1.
    void update(GPTModel<Backend>& model, float lr, float grad_scale, int64_t step) {
        const float b1 = settings_.beta1, b2 = settings_.beta2;
        const AdamWStep s{
            lr, b1, b2, settings_.eps, grad_scale, 1.0f - std::pow(b1, float(step)), 1.0f - std::pow(b2, float(step))};
        for (const Range& r : ranges_)
            Backend::adamw_update(model.params.wte + r.begin, model.grads.wte + r.begin, m + r.begin, v + r.begin,
                                  r.end - r.begin, r.decay ? settings_.weight_decay : 0.0f, s);
    }
    float* m = nullptr;  // first and second moments, in parameter order
    float* v = nullptr;

private:
    struct Range {
        int64_t begin, end;
        bool decay;
    };
    std::vector<TensorSpec> moment_specs_;
    Arena arena_;
    std::vector<Range> ranges_;
    AdamWSettings settings_;
};

using AdamW = AdamWOptimizer<CpuBackend>;

struct LrSchedule {
    float lr, min_lr_ratio;
    int warmup_steps, total_steps;
    bool cosine;
    // step counts from 0
    float at(int step) const;
};

}  // namespace tpsp
