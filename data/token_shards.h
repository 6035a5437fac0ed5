// llm.c's token shards: a header of 256 int32 (magic 20240520, version 1,
// number of tokens), then the tokens as uint16. tpsp's shards also record
// their CRC-32C in header[254..255], which llm.c never reads
// (common/checksum.h); a shard without it (llm.c's) is read unverified.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tpsp {

constexpr int shard_magic = 20240520;
constexpr int shard_version = 1;

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);
// The shards that a glob names, sorted; none is an error naming the glob, and
// so is a match that is not a regular file (a FIFO would block the reader).
std::vector<std::string> expand_shard_glob(const std::string& pattern);
// What a shard holds, in one line, for ranks to compare: its token count and
// the CRC-32C its header records, or, for llm.c's shards that record none,
// the CRC-32C of the whole file (common/checksum.h: llmc_file_identity).
std::string shard_identity(const std::string& path);
// Training must not see the validation shards: an error naming the first
// shard that both globs match.
void check_train_and_val_apart(const std::string& train_pattern, const std::string& val_pattern);

// Reads batches in order, as llm.c's loader does: in each shard, batch k of
// data-parallel rank r holds the B·T+1 tokens from (k·dp + r)·B·T on; a shard
// gives floor((tokens − 1) / (dp·B·T)) batches, then the next shard starts;
// after the last shard the loader starts again at the first. A token id at
// or above vocab_size, found when its shard is loaded, is an error naming
// the shard and the token's offset; so is a shard whose CRC-32C differs from
// the one its header records (checked as the shard is loaded, not at start).
class TokenLoader {
public:
    TokenLoader(const std::string& pattern, int B, int T, int dp_rank, int dp_size, int vocab_size);
    // inputs, targets [B, T]
    void next_batch(int* inputs, int* targets);
    void reset();
    // Where the next batch comes from, for checkpoints.
    int64_t position() const { return batches_read_; }
    void seek(int64_t batches_read);  // a position below 0 (a damaged file) is an error
    size_t num_shards() const { return shards_.size(); }
    const std::vector<std::string>& shard_paths() const { return paths_; }  // the glob's matches, sorted
    // Loads and checks every shard now (its CRC, every token below the
    // vocabulary) rather than when a batch first needs it: for the
    // validation set, which is small, so that a bad shard is found before
    // step 1 and not at the first validation.
    void check_every_shard();
    int64_t batches_per_epoch() const;

private:
    void load_shard(size_t index);
    std::vector<std::string> paths_;
    std::vector<int64_t> shards_;  // batches in each shard
    int B_, T_, dp_rank_, dp_size_, vocab_size_;
    size_t current_shard_ = size_t(-1);
    std::vector<uint16_t> tokens_;  // the current shard
    int64_t batches_read_ = 0;      // since the start of the run
};

}  // namespace tpsp
