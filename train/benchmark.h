// Measurements shared by the trainer's log and `tpsp bench`.
#pragma once
#include "model/gpt.h"

namespace tpsp {

// FLOP/s of OpenBLAS sgemm on this machine now, all threads: the
// denominator of MFU on CPU (a 1024×1024×1024 product, best of several).
double measure_sgemm_flops();

struct BenchOptions {
    int steps = 5;
    int warmup = 2;
};

// Times forward+backward of the model on random tokens and prints ms,
// tokens/s and MFU against the sgemm peak measured in the same run.
void run_benchmark(const GPTConfig& config, const RunShape& shape, const BenchOptions& options, const char* label);

}  // namespace tpsp
