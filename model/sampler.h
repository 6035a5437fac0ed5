// Text generation from a whole (unsharded) model with a KV cache: the keys
// and values of every position are kept, so each new token costs one
// position's forward pass instead of the whole prefix's.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/gpt.h"

namespace tpsp {

class Generator {
public:
    // params: the whole model in llm.c's order (as a checkpoint holds it); not copied.
    Generator(const GPTConfig& config, const float* params);
    // Feeds `token` at the next position; returns the logits [V] of the token after it.
    const float* step(int token);
    void reset() { position_ = 0; }
    int position() const { return position_; }

private:
    GPTConfig c_;
    ParameterTensors p_{};
    std::vector<BlockParameters> blocks_;                         // each block's slice of p_
    std::vector<float> keys_, values_;                            // [L, maxT, C]
    std::vector<float> x_, ln_, qkv_, att_, branch_, fc_, gelu_;  // one position's activations
    std::vector<float> scores_, logits_;
    int position_ = 0;
};

// The next token from logits [V]: temperature 0 takes the most likely, else
// softmax(logits / temperature) restricted to the top_k (0: all), drawn with
// the uniform `coin` in [0, 1).
int sample_token(const float* logits, int V, float temperature, int top_k, float coin);

// Feeds the prompt, then generates up to `count` tokens (fewer at the end of
// the model's context), handing each to `emit` as it comes. Returns how many.
int generate(Generator& generator, const GPTConfig& config, const std::vector<int>& prompt, int count,
             float temperature, int top_k, uint64_t seed, const std::function<void(int)>& emit);

}  // namespace tpsp
