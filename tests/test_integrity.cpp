// Integrity of the files tpsp writes (common/checksum.h): CRC-32C against
// the standard's vectors, and for each of llm.c's three formats (model,
// token shard, tokenizer) that a byte changed anywhere is refused with one
// line, that a file without the checksum (llm.c's own) still reads, and that
// llm.c still reads tpsp's file: every byte but header[254..255] is the
// layout llm.c writes, spelled out here. (The state file's cases run the
// trainer: tests/test_faults.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/errors.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_shards.h"
#include "model/checkpoint.h"
#include "tests/scratch_dir.h"

namespace fs = std::filesystem;

using tpsp::testing::scratch_dir;

namespace {

std::string read_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// A copy of `file` with bit 0 of byte `offset` flipped.
fs::path flipped(const fs::path& file, size_t offset) {
    std::string bytes = read_bytes(file);
    bytes.at(offset) = char(bytes[offset] ^ 1);
    const fs::path copy = file.parent_path() / ("flipped_" + std::to_string(offset) + "_" + file.filename().string());
    write_bytes(copy, bytes);
    return copy;
}

// A copy of `file` with header[254..255] zero: the file as llm.c writes it.
fs::path untagged(const fs::path& file) {
    std::string bytes = read_bytes(file);
    std::memset(bytes.data() + 4 * tpsp::llmc_tag_slot, 0, 8);
    const fs::path copy = file.parent_path() / ("untagged_" + file.filename().string());
    write_bytes(copy, bytes);
    return copy;
}

const std::string crc_differs = "its CRC-32C is [0-9a-f]{8}, the header records [0-9a-f]{8}";
const std::string tag_damaged =
    "header\\[254\\.\\.255\\] hold [0-9a-f]{8} [0-9a-f]{8}, neither the CRC-32C tag 43323343 and a CRC nor "
    "llm.c's zeros";

// The one line a damaged file is refused with: "PATH: damaged: SAYS".
template <class Read>
void expect_damaged(const fs::path& file, Read read, const std::string& says = crc_differs) {
    try {
        read(file.string());
        ADD_FAILURE() << file << " was read";
    } catch (const tpsp::FileError& e) {
        EXPECT_TRUE(std::regex_match(std::string(e.what()),
                                     std::regex(".*/" + file.filename().string() + ": damaged: " + says)))
            << e.what();
    }
}

// llm.c's file as llm.c writes it: the header's first words, zeros to 1024
// bytes, the payload; and what tpsp must write instead: the same with
// header[254] = "C32C" and header[255] = the CRC-32C of the file read with
// header[255] as 0.
std::string llmc_layout(const std::vector<uint32_t>& first_words, const std::string& payload) {
    std::string file(1024, '\0');
    std::memcpy(file.data(), first_words.data(), first_words.size() * 4);
    return file + payload;
}

void expect_llmc_layout_with_checksum(const fs::path& written, const std::string& llmc) {
    const std::string bytes = read_bytes(written);
    ASSERT_EQ(bytes.size(), llmc.size()) << "size = 1024 + payload";
    EXPECT_EQ(bytes.substr(0, 1016), llmc.substr(0, 1016)) << "header[0..253]";
    EXPECT_EQ(bytes.substr(1024), llmc.substr(1024)) << "the payload";
    EXPECT_EQ(bytes.substr(1016, 4), "C32C") << "header[254], the tag";
    std::string with_tag = llmc;
    std::memcpy(with_tag.data() + 1016, "C32C", 4);  // header[255] stays 0
    const uint32_t crc = tpsp::crc32c(with_tag.data(), with_tag.size());
    uint32_t recorded;
    std::memcpy(&recorded, bytes.data() + 1020, 4);
    EXPECT_EQ(recorded, crc) << "header[255], the CRC-32C";
}

}  // namespace

TEST(Crc32c, TheStandardsVectors) {
    EXPECT_EQ(tpsp::crc32c("123456789", 9), 0xE3069283u);
    std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xFF), ascending(32);
    for (int i = 0; i < 32; i++) ascending[size_t(i)] = (unsigned char)i;
    EXPECT_EQ(tpsp::crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
    EXPECT_EQ(tpsp::crc32c(ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(tpsp::crc32c(ascending.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(tpsp::crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, StreamingInPiecesEqualsOneCall) {
    std::vector<unsigned char> bytes(1000);
    uint32_t x = 12345;
    for (unsigned char& b : bytes) b = (unsigned char)((x = x * 1664525u + 1013904223u) >> 24);
    const uint32_t whole = tpsp::crc32c(bytes.data(), bytes.size());
    for (size_t piece = 1; piece <= 20; piece++) {  // every alignment of the 8-byte steps
        tpsp::Crc32c crc;
        for (size_t at = 0; at < bytes.size(); at += piece) {
            EXPECT_EQ(crc.value(), tpsp::crc32c(bytes.data(), at)) << "the CRC so far, piece " << piece;
            crc.update(bytes.data() + at, std::min(piece, bytes.size() - at));
        }
        EXPECT_EQ(crc.value(), whole) << "piece " << piece;
    }
}

namespace {

// V < Vp, so that a flipped bit of V still describes a model tpsp would load.
tpsp::GPTConfig micro_model() {
    tpsp::GPTConfig c;
    c.max_seq_len = 4, c.vocab_size = 7, c.padded_vocab_size = 8, c.num_layers = 1, c.num_heads = 1, c.channels = 4;
    return c;
}

std::vector<float> some_weights(const tpsp::GPTConfig& c) {
    std::vector<float> w(size_t(tpsp::full_parameter_count(c)));
    for (size_t i = 0; i < w.size(); i++) w[i] = 0.01f * float(i % 97) - 0.4f;
    return w;
}

std::string bytes_of(const void* data, size_t bytes) { return {static_cast<const char*>(data), bytes}; }

}  // namespace

TEST(Integrity, TheModelFileIsLlmcsLayoutWithItsChecksumInHeaderSlots254And255) {
    const fs::path file = scratch_dir() / "model.bin";
    const tpsp::GPTConfig c = micro_model();
    const std::vector<float> w = some_weights(c);
    tpsp::save_checkpoint(c, w.data(), file.string());
    // llm.c's gpt2_build_from_checkpoint: magic, version 3, maxT, V, L, NH, C, Vp
    expect_llmc_layout_with_checksum(file,
                                     llmc_layout({20240326, 3, 4, 7, 1, 1, 4, 8}, bytes_of(w.data(), w.size() * 4)));
}

TEST(Integrity, AFlippedBitOfAModelFileIsRefusedAndAFileWithoutTheChecksumReads) {
    const fs::path file = scratch_dir() / "model.bin";
    const tpsp::GPTConfig c = micro_model();
    const std::vector<float> w = some_weights(c);
    tpsp::save_checkpoint(c, w.data(), file.string());
    std::vector<float> read_back(w.size());
    auto read = [&](const std::string& path) { tpsp::read_checkpoint_shard(c, 1, 0, path, read_back.data()); };
    read(file.string());
    EXPECT_EQ(read_back, w);
    const size_t weight = 1024 + 4 * (w.size() / 2);
    expect_damaged(flipped(file, weight), read);                         // a weight, finite still
    expect_damaged(flipped(file, 4 * 3), [&](const std::string& path) {  // V: 7 -> 6, a model sample would build
        EXPECT_EQ(tpsp::read_checkpoint_config(path).vocab_size, 6);
        read(path);
    });
    expect_damaged(flipped(file, 4 * 100), read);  // a word of the header no reader looks at
    expect_damaged(flipped(file, 4 * 255), read);  // the checksum itself
    expect_damaged(flipped(file, 4 * 254), read, tag_damaged);
    expect_damaged(flipped(untagged(file), 4 * 255), read, tag_damaged);  // a word llm.c writes as 0
    // llm.c's own file (header[254..255] zero) is read unverified, as before
    read(untagged(file).string());
    EXPECT_EQ(read_back, w);
    read(untagged(flipped(file, weight)).string());
}

TEST(Integrity, TheTokenShardIsLlmcsLayoutWithItsChecksumInHeaderSlots254And255) {
    const fs::path file = scratch_dir() / "train_000000.bin";
    std::vector<uint16_t> tokens(100);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = uint16_t(i * 7 % 256);
    tpsp::write_token_shard(file.string(), tokens);
    // llm.c's dataloader: magic, version 1, number of tokens
    expect_llmc_layout_with_checksum(file, llmc_layout({20240520, 1, 100}, bytes_of(tokens.data(), 200)));
}

TEST(Integrity, AFlippedBitOfATokenShardIsRefusedAndAShardWithoutTheChecksumReads) {
    const fs::path file = scratch_dir() / "train_000000.bin";
    std::vector<uint16_t> tokens(100);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = uint16_t(i * 7 % 256);
    tpsp::write_token_shard(file.string(), tokens);
    std::vector<int> inputs(8), targets(8);
    auto read = [&](const std::string& path) {  // the loader reads the whole shard for its first batch
        tpsp::TokenLoader loader(path, 1, 8, 0, 1, 256);
        loader.next_batch(inputs.data(), targets.data());
    };
    read(file.string());
    EXPECT_EQ(inputs[1], 7);
    expect_damaged(flipped(file, 1024 + 2 * 50), read);  // a token, still below the vocabulary
    expect_damaged(flipped(file, 4 * 100), read);        // a word of the header no reader looks at
    expect_damaged(flipped(file, 4 * 254), read, tag_damaged);
    read(untagged(file).string());
    read(untagged(flipped(file, 1024 + 2 * 50)).string());
}

TEST(Integrity, TheTokenizerFileIsLlmcsLayoutWithItsChecksumInHeaderSlots254And255) {
    const fs::path file = scratch_dir() / "gpt2_tokenizer.bin";
    tpsp::write_llmc_tokenizer(file.string(), {"a", "bc", "def"}, 1);
    // llm.c's tokenizer_init: magic, version 2, vocabulary size, end-of-text token
    expect_llmc_layout_with_checksum(file, llmc_layout({20240328, 2, 3, 1},
                                                       "\x01"
                                                       "a"
                                                       "\x02"
                                                       "bc"
                                                       "\x03"
                                                       "def"));
}

TEST(Integrity, AFlippedBitOfATokenizerFileIsRefusedAndAFileWithoutTheChecksumReads) {
    const fs::path file = scratch_dir() / "gpt2_tokenizer.bin";
    tpsp::write_llmc_tokenizer(file.string(), {"a", "bc", "def"}, 1);
    auto read = [](const std::string& path) { return tpsp::read_llmc_tokenizer(path); };
    EXPECT_EQ(read(file.string()).token_bytes, (std::vector<std::string>{"a", "bc", "def"}));
    expect_damaged(flipped(file, 1024 + 4), read);  // a byte of "bc"
    expect_damaged(flipped(file, 4 * 3), read);     // the end-of-text token, which nothing else checks
    expect_damaged(flipped(file, 4 * 254), read, tag_damaged);
    EXPECT_EQ(read(untagged(file).string()).end_of_text, 1);
    EXPECT_EQ(read(untagged(flipped(file, 4 * 3)).string()).end_of_text, 0);
}
