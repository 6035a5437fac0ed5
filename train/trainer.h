// The step loop of `tpsp train` (trainer_impl.h), and `tpsp eval`.
#pragma once
#include "train/config.h"

namespace tpsp {

// Trains as the config says on one backend (CpuBackend, or CudaBackend in a
// CUDA build); returns the process exit code. train.device picks (main.cpp).
template <class Backend>
int train_on(const Config& config);

// Loads checkpoint.init and prints the validation loss over
// train.val_batches batches, the same measurement train makes (CPU).
int evaluate(const Config& config);

}  // namespace tpsp
