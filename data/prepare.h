// `tpsp prepare`: text files to llm.c token shards, with a validation split.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tpsp {

struct PrepareOptions {
    std::string tokenizer = "byte";    // byte (vocabulary 256) | gpt2
    std::string tokenizer_dir;         // gpt2: the directory with encoder.json and vocab.bpe
    double val_fraction = 0.05;        // about this share of the tokens goes to validation
    int64_t chunk_tokens = 8192;       // the unit of the split
    int64_t shard_tokens = 100000000;  // tokens per shard at most
    bool replace = false;              // remove the shards an earlier prepare left in OUT_DIR
};

// Tokenizes every input (gpt2: each file a document, preceded by
// <|endoftext|>), cuts the tokens into chunks of chunk_tokens and sends every
// round(1/val_fraction)-th chunk to validation, so validation samples the
// whole corpus, not its end. Writes OUT_DIR/val_000000.bin and
// OUT_DIR/train_NNNNNN.bin (and, for gpt2, llm.c's gpt2_tokenizer.bin);
// prints a progress bar with MB/s on stderr and a summary on stdout.
// OUT_DIR holding shards already (whose higher numbers a smaller corpus
// would leave behind, for a glob to mix in) is an error unless
// options.replace, which removes them first.
void prepare_shards(const std::vector<std::string>& inputs, const std::string& out_dir, const PrepareOptions& options);

}  // namespace tpsp
