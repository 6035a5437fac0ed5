// The byte tokenizer: token = byte value, vocabulary 256. Enough for a real
// corpus with no vocabulary file; the GPT-2 BPE comes in its own issue.
#pragma once
#include <cstdint>
#include <string>

namespace tpsp {

struct PrepareOptions {
    double val_fraction = 0.05;        // the last part of the text
    int64_t shard_tokens = 100000000;  // tokens per shard at most
};

// Writes OUT_DIR/val_000000.bin and OUT_DIR/train_NNNNNN.bin; prints a
// progress bar on stderr and a summary on stdout.
void prepare_byte_shards(const std::string& input, const std::string& out_dir, const PrepareOptions& options);

}  // namespace tpsp
