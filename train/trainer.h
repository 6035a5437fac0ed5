// The step loop of `tpsp train`.
#pragma once
#include "train/config.h"

namespace tpsp {

// Trains as the config says; returns the process exit code.
int train(const Config& config);

}  // namespace tpsp
