// The YAML experiment config: sections model, data, train, parallel,
// checkpoint, logging. Every key is declared once below with its type and
// default; the file and the command-line overrides (section.key=value) are
// checked against that list before anything is allocated.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/gpt.h"

namespace tpsp {

// A problem with the config, worded for one line: "FILE:LINE: key: what is wrong".
struct ConfigError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Config {
    struct Model {
        int layers = 4, heads = 4, channels = 128;
        int vocab_size = 256;
        int padded_vocab_size = 0;  // 0: round vocab_size up to a multiple of 128
        int max_seq_len = 0;        // 0: train.seq_len
        float dropout = 0.0f;
    } model;
    struct Data {
        std::string train = "data/kjv/train_*.bin";
        std::string val = "data/kjv/val_*.bin";
    } data;
    struct Train {
        int batch_size = 16, seq_len = 128, grad_accum = 1;
        int steps = 1000, warmup_steps = 0;
        float lr = 1e-3f, min_lr_ratio = 0.1f;
        std::string lr_schedule = "cosine";  // cosine | constant
        float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
        float weight_decay = 0.1f;
        bool decay_all = false;  // decay every tensor, not only the matrices
        float grad_clip = 1.0f;  // 0: off
        int val_every = 100, val_batches = 20;
        uint64_t seed = 1337;
        int threads = 0;  // 0: OpenMP's default
    } train;
    struct Parallel {
        int tp = 1;
        bool sequence_parallel = true;
    } parallel;
    struct Checkpoint {
        std::string dir;  // "" = no checkpoints
        int every = 0;    // 0: only at the end
        std::string init, resume;
    } checkpoint;
    struct Logging {
        int every = 1;
        std::string metrics;
    } logging;

    GPTConfig gpt() const;
    RunShape run_shape() const;
};

// Reads PATH (may be empty for defaults only) and applies the overrides.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);

// The key reference, as the README prints it.
std::string config_reference();

}  // namespace tpsp
