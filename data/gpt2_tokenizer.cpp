#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/gpt2_tokenizer.h"

#include <pcre2.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/checksum.h"
#include "common/files.h"

namespace tpsp {

namespace {

// GPT-2's pre-tokenizer, as the reference encoder writes it in JavaScript:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with JavaScript's \s spelled out, since PCRE2's differs from it in two
// characters (U+0085, U+FEFF).
const char* const js_space =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

std::string gpt2_pattern() {
    std::string s = std::string("[") + js_space + "]", not_s = std::string("[^") + js_space + "]";
    return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + std::string(js_space) + "\\p{L}\\p{N}]+|" + s + "+(?!" +
           not_s + ")|" + s + "+";
}

// GPT-2's reversible map from bytes to printable characters (the vocabulary
// files spell tokens with it): printable Latin-1 stays, the rest shifts to 256+.
std::vector<std::string> byte_to_unicode() {
    std::vector<int> code(256, -1);
    for (int b = '!'; b <= '~'; b++) code[b] = b;
    for (int b = 0xA1; b <= 0xAC; b++) code[b] = b;
    for (int b = 0xAE; b <= 0xFF; b++) code[b] = b;
    int next = 256;
    for (int b = 0; b < 256; b++)
        if (code[b] < 0) code[b] = next++;
    std::vector<std::string> utf8(256);
    for (int b = 0; b < 256; b++) {
        int c = code[b];
        if (c < 0x80) utf8[b] = std::string(1, char(c));
        else utf8[b] = {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};  // < 0x800 always
    }
    return utf8;
}

std::string read_text(const std::string& path) {
    return read_whole_file(path, "tokenizer file (run scripts/fetch_gpt2_tokenizer.sh)");
}

uint64_t pair_key(int left, int right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

}  // namespace

struct GPT2Tokenizer::Regex {
    pcre2_code* code = nullptr;
    ~Regex() { pcre2_code_free(code); }
};

GPT2Tokenizer::GPT2Tokenizer(const std::string& dir) : regex_(std::make_unique<Regex>()) {
    // the vocabulary, from GPT-2's printable spelling back to raw bytes
    std::vector<std::string> to_unicode = byte_to_unicode();
    std::unordered_map<std::string, int> from_unicode;
    for (int b = 0; b < 256; b++) from_unicode[to_unicode[b]] = b;
    auto to_bytes = [&](const std::string& spelled, const std::string& where) {
        std::string raw;
        for (size_t i = 0; i < spelled.size();) {
            size_t len = (uint8_t(spelled[i]) < 0x80) ? 1 : 2;
            auto it = from_unicode.find(spelled.substr(i, len));
            if (it == from_unicode.end()) throw FileError(where + ": a token outside GPT-2's byte alphabet");
            raw += char(it->second);
            i += len;
        }
        return raw;
    };
    const std::string encoder_path = dir + "/encoder.json", merges_path = dir + "/vocab.bpe";
    nlohmann::json encoder;
    try {
        encoder = nlohmann::json::parse(read_text(encoder_path));
    } catch (const nlohmann::json::exception& e) {
        throw FileError(encoder_path + ": not valid JSON (" + e.what() + ")");
    }
    if (!encoder.is_object()) throw FileError(encoder_path + ": not a JSON object of token ids");
    token_bytes_.resize(encoder.size());
    for (auto it = encoder.begin(); it != encoder.end(); ++it) {
        if (!it.value().is_number_integer()) throw FileError(encoder_path + ": token " + it.key() + ": not an id");
        const int64_t id = it.value().get<int64_t>();
        if (id < 0 || uint64_t(id) >= token_bytes_.size()) throw FileError(encoder_path + ": token id out of range");
        token_bytes_[size_t(id)] = to_bytes(it.key(), encoder_path);  // <|endoftext|> is printable ASCII too
        byte_token_[token_bytes_[size_t(id)]] = int(id);
    }
    for (int b = 0; b < 256; b++) {
        auto single = byte_token_.find(std::string(1, char(b)));
        if (single == byte_token_.end()) throw FileError(encoder_path + ": no token for byte " + std::to_string(b));
        single_byte_[b] = single->second;
    }

    // the merges, in rank order: "left right" per line after a version line
    std::istringstream merges(read_text(merges_path));
    std::string line;
    std::getline(merges, line);
    for (int rank = 0; std::getline(merges, line);) {
        size_t space = line.find(' ');
        if (line.empty()) continue;
        if (space == std::string::npos) throw FileError(merges_path + ": a merge line without two parts");
        std::string left = to_bytes(line.substr(0, space), merges_path);
        std::string right = to_bytes(line.substr(space + 1), merges_path);
        auto l = byte_token_.find(left), r = byte_token_.find(right), m = byte_token_.find(left + right);
        if (l == byte_token_.end() || r == byte_token_.end() || m == byte_token_.end())
            throw FileError(merges_path + ": merge '" + line + "' is not in the vocabulary");
        merges_.emplace(pair_key(l->second, r->second), Merge{rank++, m->second});
    }

    std::string pattern = gpt2_pattern();
    int error;
    PCRE2_SIZE error_at;
    regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                 &error, &error_at, nullptr);
    if (!regex_->code) throw std::logic_error("GPT-2 pattern does not compile");
    pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);  // where JIT is available; plain matching otherwise
}

GPT2Tokenizer::~GPT2Tokenizer() = default;

// Byte-pair encoding of one pre-tokenized piece: start from its bytes, then
// merge the adjacent pair of lowest rank — every occurrence, left to right —
// until no pair merges.
void GPT2Tokenizer::bpe(std::string_view piece, std::vector<int>& out) const {
    auto cached = cache_.find(std::string(piece));
    if (cached != cache_.end()) {
        out.insert(out.end(), cached->second.begin(), cached->second.end());
        return;
    }
    std::vector<int> word;
    for (unsigned char c : piece) word.push_back(single_byte_[c]);
    while (word.size() > 1) {
        int best_rank = INT_MAX, left = -1, right = -1, merged = -1;
        for (size_t i = 0; i + 1 < word.size(); i++) {
            auto m = merges_.find(pair_key(word[i], word[i + 1]));
            if (m != merges_.end() && m->second.rank < best_rank) {
                best_rank = m->second.rank;
                left = word[i], right = word[i + 1], merged = m->second.merged;
            }
        }
        if (merged < 0) break;
        std::vector<int> next;
        for (size_t i = 0; i < word.size(); i++) {
            if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
                next.push_back(merged);
                i++;
            } else {
                next.push_back(word[i]);
            }
        }
        word.swap(next);
    }
    out.insert(out.end(), word.begin(), word.end());
    cache_.emplace(std::string(piece), std::move(word));
}

void GPT2Tokenizer::encode(std::string_view text, std::vector<int>& out, size_t base_offset) const {
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0;
    while (at < text.size()) {
        int rc = pcre2_match(regex_->code, subject, text.size(), at, at == 0 ? 0 : PCRE2_NO_UTF_CHECK, match, nullptr);
        PCRE2_SIZE* span = pcre2_get_ovector_pointer(match);
        if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
            size_t bad = pcre2_get_startchar(match);  // where the invalid character starts
            pcre2_match_data_free(match);
            throw TokenizerError("invalid UTF-8 at byte offset " + std::to_string(base_offset + bad));
        }
        if (rc < 0) break;  // no more matches (the pattern matches every character, so only at the end)
        bpe(text.substr(span[0], span[1] - span[0]), out);
        at = span[1];
    }
    pcre2_match_data_free(match);
}

std::vector<int> GPT2Tokenizer::encode(std::string_view text) const {
    std::vector<int> out;
    encode(text, out);
    return out;
}

std::string GPT2Tokenizer::decode(const std::vector<int>& tokens) const {
    std::string text;
    for (int t : tokens) text += token_bytes(t);
    return text;
}

// ----------------------------------------------------------------------------
// llm.c's gpt2_tokenizer.bin

void write_llmc_tokenizer(const std::string& path, const std::vector<std::string>& token_bytes, int end_of_text) {
    std::string bytes(1024, '\0');
    uint32_t* header = reinterpret_cast<uint32_t*>(bytes.data());
    header[0] = 20240328;
    header[1] = 2;
    header[2] = uint32_t(token_bytes.size());
    header[3] = uint32_t(end_of_text);
    for (const std::string& t : token_bytes) {
        if (t.empty() || t.size() > 255) throw FileError(path + ": a token of " + std::to_string(t.size()) + " bytes");
        bytes += char(uint8_t(t.size()));
        bytes += t;
    }
    // (the appends may have moved the header)
    seal_llmc_header(reinterpret_cast<uint32_t*>(bytes.data()), bytes.data() + 1024, bytes.size() - 1024);
    write_file_atomically(path, {{bytes.data(), bytes.size()}});
}

LlmcTokenizer read_llmc_tokenizer(const std::string& path) {
    std::string data = read_text(path);
    if (data.size() < 1024) throw FileError(path + ": truncated tokenizer header");
    const uint32_t* header = reinterpret_cast<const uint32_t*>(data.data());
    if (header[0] != 20240328)
        throw FileError(path + ": not an llm.c tokenizer (magic " + std::to_string(header[0]) + ", expected 20240328)");
    if (header[1] != 1 && header[1] != 2)
        throw FileError(path + ": tokenizer version " + std::to_string(header[1]) + " is not supported (1 or 2)");
    verify_llmc_file(path, header, data.data() + 1024, data.size() - 1024);
    LlmcTokenizer t;
    t.end_of_text = header[1] == 2 ? int(header[3]) : -1;
    size_t at = 1024;
    for (uint32_t i = 0; i < header[2]; i++) {
        if (at >= data.size()) throw FileError(path + ": truncated at token " + std::to_string(i));
        size_t length = uint8_t(data[at++]);
        if (length == 0 || at + length > data.size())
            throw FileError(path + ": truncated at token " + std::to_string(i));
        t.token_bytes.push_back(data.substr(at, length));
        at += length;
    }
    return t;
}

}  // namespace tpsp
