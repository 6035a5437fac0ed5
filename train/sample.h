// `tpsp sample` and the trainer's periodic samples: text from a model.
#pragma once
#include <cstdint>
#include <string>

#include "model/sampler.h"

namespace tpsp {

struct SampleOptions {
    std::string prompt;
    int tokens = 256;
    float temperature = 1.0f;
    int top_k = 0;  // 0: the whole vocabulary
    uint64_t seed = 1337;
    std::string tokenizer_dir = "data/gpt2_tokenizer";  // for models with GPT-2's vocabulary
};

// tpsp sample CHECKPOINT ...: prints the prompt and the text as it comes.
int sample_command(const std::string& checkpoint, const SampleOptions& options);

}  // namespace tpsp
