// The byte tokenizer: token = byte value, vocabulary 256. Enough for a real
// corpus with no vocabulary file; the GPT-2 BPE comes in its own issue.
#pragma once
#include <cstdint>
#include <string>

namespace tpsp {

struct PrepareOptions {
    double val_fraction = 0.05;        // about this share of the text goes to validation
    int64_t chunk_tokens = 8192;       // the unit of the split
    int64_t shard_tokens = 100000000;  // tokens per shard at most
};

// Writes OUT_DIR/val_000000.bin and OUT_DIR/train_NNNNNN.bin; prints a
// progress bar on stderr and a summary on stdout. The text is cut into
// chunks of chunk_tokens and every round(1/val_fraction)-th chunk is
// validation, so that validation samples the whole corpus, not its end.
void prepare_byte_shards(const std::string& input, const std::string& out_dir, const PrepareOptions& options);

}  // namespace tpsp
