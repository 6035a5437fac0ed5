#include "data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/checksum.h"
#include "common/files.h"

namespace tpsp {

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
    uint32_t header[256] = {shard_magic, shard_version, uint32_t(tokens.size())};
    seal_llmc_header(header, tokens.data(), tokens.size() * 2);
    write_file_atomically(path, {{header, sizeof header}, {tokens.data(), tokens.size() * 2}});
}

std::vector<std::string> expand_shard_glob(const std::string& pattern) {
    glob_t found;
    std::vector<std::string> paths;
    if (glob(pattern.c_str(), 0, nullptr, &found) == 0) {
        for (size_t i = 0; i < found.gl_pathc; i++) paths.push_back(found.gl_pathv[i]);
    }
    globfree(&found);
    if (paths.empty()) throw FileError(pattern + ": no token shard matches");
    for (const std::string& path : paths) check_regular_input(path, "token shard");
    return paths;  // glob sorts
}

void check_train_and_val_apart(const std::string& train_pattern, const std::string& val_pattern) {
    const std::vector<std::string> train = expand_shard_glob(train_pattern), val = expand_shard_glob(val_pattern);
    for (const std::string& v : val)
        for (const std::string& t : train)
            if (std::filesystem::equivalent(v, t))
                throw FileError(v + ": this validation shard is also a training shard (data.train: " + train_pattern +
                                ", data.val: " + val_pattern + ")");
}

// Returns the number of tokens that the header announces, after checking it.
static int64_t read_shard_header(const std::string& path) {
    FILE* f = open_input_file(path, "token shard");
    int header[256];
    size_t got = std::fread(header, sizeof(int), 256, f);
    std::fclose(f);
    if (got != 256) throw FileError(path + ": truncated token shard header");
    if (header[0] != shard_magic)
        throw FileError(path + ": not an llm.c token shard (magic " + std::to_string(header[0]) + ", expected " +
                        std::to_string(shard_magic) + ")");
    if (header[1] != shard_version)
        throw FileError(path + ": token shard version " + std::to_string(header[1]) + " is not supported (need " +
                        std::to_string(shard_version) + ")");
    int64_t count = header[2];
    uintmax_t expected = 1024 + uintmax_t(count) * 2;
    std::error_code ec;
    uintmax_t actual = std::filesystem::file_size(path, ec);
    if (count < 0 || ec || actual != expected)
        throw FileError(path + ": token shard is " + std::to_string(actual) + " bytes, its header says " +
                        std::to_string(expected));
    return count;
}

std::string shard_identity(const std::string& path) {
    return std::to_string(read_shard_header(path)) + " tokens, " + llmc_file_identity(path);
}

TokenLoader::TokenLoader(const std::string& pattern, int B, int T, int dp_rank, int dp_size, int vocab_size)
    : paths_(expand_shard_glob(pattern)), B_(B), T_(T), dp_rank_(dp_rank), dp_size_(dp_size), vocab_size_(vocab_size) {
    int64_t tokens_per_batch = int64_t(dp_size) * B * T;
    for (const std::string& path : paths_) {
        int64_t count = read_shard_header(path);
        int64_t batches = (count - 1) / tokens_per_batch;
        if (count < 1 || batches < 1)
            throw FileError(path + ": token shard has " + std::to_string(count) + " tokens, too few for one batch of " +
                            std::to_string(tokens_per_batch) + "+1 (data-parallel ranks × batch_size × seq_len)");
        shards_.push_back(batches);
    }
}

int64_t TokenLoader::batches_per_epoch() const {
    int64_t total = 0;
    for (int64_t n : shards_) total += n;
    return total;
}

void TokenLoader::load_shard(size_t index) {
    if (index == current_shard_) return;
    const std::string& path = paths_[index];
    tokens_.resize(size_t(read_shard_header(path)));
    uint32_t header[256];
    FILE* f = open_input_file(path, "token shard");
    const bool whole = std::fread(header, 4, 256, f) == 256 &&
                       std::fread(tokens_.data(), 2, tokens_.size(), f) == tokens_.size();
    std::fclose(f);
    if (!whole) throw FileError(path + ": token shard is truncated");
    verify_llmc_file(path, header, tokens_.data(), tokens_.size() * 2);
    for (size_t i = 0; i < tokens_.size(); i++)
        if (tokens_[i] >= vocab_size_)
            throw FileError(path + ": token " + std::to_string(tokens_[i]) + " at offset " + std::to_string(i) +
                            " is not below model.vocab_size = " + std::to_string(vocab_size_));
    current_shard_ = index;
}

void TokenLoader::check_every_shard() {
    for (size_t i = 0; i < paths_.size(); i++) load_shard(i);
}

void TokenLoader::reset() { batches_read_ = 0; }
void TokenLoader::seek(int64_t batches_read) {
    if (batches_read < 0)
        throw FileError("the data loader's saved position " + std::to_string(batches_read) + " is below 0");
    batches_read_ = batches_read;
}

void TokenLoader::next_batch(int* inputs, int* targets) {
    int64_t k = batches_read_ % batches_per_epoch();
    size_t shard = 0;
    while (k >= shards_[shard]) k -= shards_[shard++];
    load_shard(shard);
    int64_t start = (k * dp_size_ + dp_rank_) * int64_t(B_) * T_;
    for (int64_t i = 0; i < int64_t(B_) * T_; i++) {
        inputs[i] = tokens_[size_t(start + i)];
        targets[i] = tokens_[size_t(start + i + 1)];
    }
    batches_read_++;
}

}  // namespace tpsp
