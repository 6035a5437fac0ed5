#include "train/adamw.h"

#include <algorithm>
#include <cmath>

namespace tpsp {

float LrSchedule::at(int step) const {
    if (step < warmup_steps) return lr * float(step + 1) / float(warmup_steps);
    if (!cosine) return lr;
    float min_lr = lr * min_lr_ratio;
    int span = std::max(1, total_steps - warmup_steps);
    float progress = std::min(1.0f, float(step - warmup_steps) / float(span));
    return min_lr + 0.5f * (1.0f + std::cos(float(M_PI) * progress)) * (lr - min_lr);
}

}  // namespace tpsp
