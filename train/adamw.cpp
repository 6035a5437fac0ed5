#include "train/adamw.h"

#include <algorithm>
#include <cmath>

namespace tpsp {

AdamW::AdamW(const GPT& model, const AdamWSettings& settings)
    : m(size_t(model.num_parameters), 0.0f), v(size_t(model.num_parameters), 0.0f), settings_(settings) {
    int64_t at = 0;
    for (const TensorSpec& t : model.parameter_specs) {
        ranges_.push_back({at, at + t.elements(), settings.decay_all || parameter_is_matrix(t.name)});
        at += t.elements();
    }
}

void AdamW::update(GPT& model, float lr, float grad_scale, int64_t step) {
    float* params = model.params.wte;
    const float* grads = model.grads.wte;
    const float b1 = settings_.beta1, b2 = settings_.beta2, eps = settings_.eps;
    const float correction1 = 1.0f - std::pow(b1, float(step));
    const float correction2 = 1.0f - std::pow(b2, float(step));
    for (const Range& r : ranges_) {
        const float decay = r.decay ? settings_.weight_decay : 0.0f;
#pragma omp parallel for simd
        for (int64_t i = r.begin; i < r.end; i++) {
            float g = grads[i] * grad_scale;
            m[i] = b1 * m[i] + (1.0f - b1) * g;
            v[i] = b2 * v[i] + (1.0f - b2) * g * g;
            float m_hat = m[i] / correction1, v_hat = v[i] / correction2;
            params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + decay * params[i]);
        }
    }
}

float LrSchedule::at(int step) const {
    if (step < warmup_steps) return lr * float(step + 1) / float(warmup_steps);
    if (!cosine) return lr;
    float min_lr = lr * min_lr_ratio;
    int span = std::max(1, total_steps - warmup_steps);
    float progress = std::min(1.0f, float(step - warmup_steps) / float(span));
    return min_lr + 0.5f * (1.0f + std::cos(float(M_PI) * progress)) * (lr - min_lr);
}

}  // namespace tpsp
