#include "data/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "common/files.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_shards.h"

namespace tpsp {

namespace {

void progress_bar(int64_t done, int64_t total, double seconds) {
    const int width = 40, filled = total ? int(width * done / total) : width;
    const double mb = double(done) / 1e6;
    std::fprintf(stderr, "\rtokenizing [%.*s%*s] %3d%%  %.1f MB  %.1f MB/s", filled,
                 "########################################", width - filled, "", total ? int(100 * done / total) : 100,
                 mb, seconds > 0 ? mb / seconds : 0.0);
    std::fflush(stderr);
}

// The text in pieces of about 1 MB, cut after a newline that a
// non-whitespace character follows: no GPT-2 pre-token spans such a cut, so
// the pieces tokenize as the whole would.
std::vector<std::string_view> pieces_of(const std::string& text) {
    std::vector<std::string_view> pieces;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = std::min(text.size(), start + (size_t(1) << 20));
        while (end < text.size() && !(text[end - 1] == '\n' && !std::isspace(uint8_t(text[end])))) end++;
        pieces.push_back(std::string_view(text).substr(start, end - start));
        start = end;
    }
    return pieces;
}

void write_split(const std::vector<uint16_t>& tokens, const std::string& out_dir, const PrepareOptions& options,
                 int vocab_size) {
    const int64_t period = std::max<int64_t>(2, std::llround(1.0 / options.val_fraction));
    std::vector<uint16_t> train, val;
    for (int64_t at = 0, chunk = 0; at < int64_t(tokens.size()); at += options.chunk_tokens, chunk++) {
        int64_t end = std::min<int64_t>(int64_t(tokens.size()), at + options.chunk_tokens);
        std::vector<uint16_t>& to = chunk % period == period - 1 ? val : train;
        to.insert(to.end(), tokens.begin() + at, tokens.begin() + end);
    }
    if (val.empty() || train.empty()) throw FileError(out_dir + ": the inputs are too short for a validation split");
    write_token_shard(out_dir + "/val_000000.bin", val);
    int shard = 0;
    for (int64_t at = 0; at < int64_t(train.size()); at += options.shard_tokens, shard++) {
        int64_t end = std::min(int64_t(train.size()), at + options.shard_tokens);
        char name[64];
        std::snprintf(name, sizeof name, "/train_%06d.bin", shard);
        write_token_shard(out_dir + name, std::vector<uint16_t>(train.begin() + at, train.begin() + end));
    }
    std::printf("wrote %zu train tokens in %d shard(s) and %zu validation tokens to %s (vocabulary %d)\n", train.size(),
                shard, val.size(), out_dir.c_str(), vocab_size);
}

}  // namespace

// The files an earlier prepare wrote into out_dir: its shards and llm.c's tokenizer file.
static std::vector<std::filesystem::path> earlier_shards(const std::string& out_dir) {
    static const std::regex shard_name("(train|val)_[0-9]{6}\\.bin|gpt2_tokenizer\\.bin");
    std::vector<std::filesystem::path> found;
    for (const auto& entry : std::filesystem::directory_iterator(out_dir))
        if (std::regex_match(entry.path().filename().string(), shard_name)) found.push_back(entry.path());
    std::sort(found.begin(), found.end());
    return found;
}

// An input among them is refused even with --replace: removing it would destroy what prepare reads.
static void clear_earlier_shards(const std::string& out_dir, bool replace, const std::vector<std::string>& inputs) {
    const std::vector<std::filesystem::path> found = earlier_shards(out_dir);
    if (found.empty()) return;
    for (const std::filesystem::path& path : found)
        for (const std::string& input : inputs)
            if (same_file(path.string(), input))
                throw FileError(input + ": this input is one of the shard files that prepare writes into " + out_dir +
                                " (and --replace removes): move it out of " + out_dir);
    if (!replace)
        throw FileError(out_dir + ": holds " + std::to_string(found.size()) + " shard file(s) of an earlier prepare (" +
                        found.front().filename().string() + ", ...); give --replace to remove them first");
    for (const std::filesystem::path& path : found) std::filesystem::remove(path);
}

void prepare_shards(const std::vector<std::string>& inputs, const std::string& out_dir, const PrepareOptions& options) {
    std::unique_ptr<GPT2Tokenizer> gpt2;
    if (options.tokenizer == "gpt2") gpt2 = std::make_unique<GPT2Tokenizer>(options.tokenizer_dir);
    int64_t total = 0;
    for (const std::string& input : inputs) {
        std::error_code ec;
        check_regular_input(input, "input");
        uintmax_t size = std::filesystem::file_size(input, ec);
        if (ec) throw FileError(input + ": cannot open input text");
        total += int64_t(size);
    }
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec) throw FileError(out_dir + ": cannot create output directory (" + ec.message() + ")");
    clear_earlier_shards(out_dir, options.replace, inputs);

    std::vector<uint16_t> tokens;
    std::vector<int> piece_tokens;
    int64_t done = 0;
    auto start = std::chrono::steady_clock::now();
    for (const std::string& input : inputs) {
        std::string text = read_whole_file(input, "input text");
        if (gpt2) tokens.push_back(uint16_t(gpt2_end_of_text));  // each document begins with <|endoftext|>
        size_t offset = 0;
        for (std::string_view piece : pieces_of(text)) {
            if (gpt2) {
                piece_tokens.clear();
                try {
                    gpt2->encode(piece, piece_tokens, offset);
                } catch (const TokenizerError& e) {
                    throw FileError(input + ": " + e.what());
                }
                tokens.insert(tokens.end(), piece_tokens.begin(), piece_tokens.end());
            } else {
                for (unsigned char c : piece) tokens.push_back(c);
            }
            offset += piece.size();
            done += int64_t(piece.size());
            progress_bar(done, total, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
    }
    std::fprintf(stderr, "\n");
    write_split(tokens, out_dir, options, gpt2 ? gpt2->vocab_size() : 256);
    if (gpt2) {
        std::vector<std::string> bytes;
        for (int t = 0; t < gpt2->vocab_size(); t++) bytes.push_back(gpt2->token_bytes(t));
        write_llmc_tokenizer(out_dir + "/gpt2_tokenizer.bin", bytes, gpt2_end_of_text);
    }
}

}  // namespace tpsp
