// The step loop of `tpsp train`.
#pragma once
#include "train/config.h"

namespace tpsp {

// Trains as the config says; returns the process exit code.
int train(const Config& config);

// Loads checkpoint.init and prints the validation loss over
// train.val_batches batches, the same measurement train makes.
int evaluate(const Config& config);

}  // namespace tpsp
