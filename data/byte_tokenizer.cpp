#include "data/byte_tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "data/token_shards.h"
#include "model/checkpoint.h"

namespace tpsp {

static void progress_bar(const char* what, int64_t done, int64_t total, double seconds) {
    int width = 40, filled = total ? int(width * done / total) : width;
    double mb = done / 1e6;
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%  %.1f MB  %.1f MB/s", what, filled,
                 "########################################", width - filled, "",
                 total ? int(100 * done / total) : 100, mb, seconds > 0 ? mb / seconds : 0.0);
    std::fflush(stderr);
}

void prepare_byte_shards(const std::string& input, const std::string& out_dir, const PrepareOptions& options) {
    FILE* f = std::fopen(input.c_str(), "rb");
    if (!f) throw FileError(input + ": cannot open input text");
    std::error_code ec;
    int64_t size = int64_t(std::filesystem::file_size(input, ec));
    if (ec || size < 2) {
        std::fclose(f);
        throw FileError(input + ": input text is empty");
    }
    std::filesystem::create_directories(out_dir, ec);
    if (ec) throw FileError(out_dir + ": cannot create output directory (" + ec.message() + ")");

    std::vector<uint16_t> tokens;
    tokens.reserve(size_t(size));
    std::vector<unsigned char> chunk(1 << 20);
    auto start = std::chrono::steady_clock::now();
    for (size_t got; (got = std::fread(chunk.data(), 1, chunk.size(), f)) > 0;) {
        for (size_t i = 0; i < got; i++) tokens.push_back(chunk[i]);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        progress_bar("tokenizing", int64_t(tokens.size()), size, seconds);
    }
    std::fclose(f);
    std::fprintf(stderr, "\n");

    const int64_t period = std::max<int64_t>(2, std::llround(1.0 / options.val_fraction));
    std::vector<uint16_t> train, val;
    for (int64_t at = 0, chunk = 0; at < int64_t(tokens.size()); at += options.chunk_tokens, chunk++) {
        int64_t end = std::min<int64_t>(int64_t(tokens.size()), at + options.chunk_tokens);
        std::vector<uint16_t>& to = chunk % period == period - 1 ? val : train;
        to.insert(to.end(), tokens.begin() + at, tokens.begin() + end);
    }
    if (val.empty()) throw FileError(input + ": text too short for a validation split");
    write_token_shard(out_dir + "/val_000000.bin", val);
    int shard = 0;
    for (int64_t at = 0; at < int64_t(train.size()); at += options.shard_tokens, shard++) {
        int64_t end = std::min(int64_t(train.size()), at + options.shard_tokens);
        char name[64];
        std::snprintf(name, sizeof name, "/train_%06d.bin", shard);
        write_token_shard(out_dir + name, std::vector<uint16_t>(train.begin() + at, train.begin() + end));
    }
    const int64_t n_train = int64_t(train.size()), n_val = int64_t(val.size());
    std::printf("wrote %lld train tokens in %d shard(s) and %lld validation tokens to %s (vocabulary 256)\n",
                (long long)n_train, shard, (long long)n_val, out_dir.c_str());
}

}  // namespace tpsp
