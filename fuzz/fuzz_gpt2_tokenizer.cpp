// GPT-2's encoder.json and vocab.bpe, and text to encode with them: the input
// is split at its first two NUL bytes into encoder.json, vocab.bpe and a
// prompt, which is encoded and decoded again.
#include <string>

#include "common/errors.h"
#include "data/gpt2_tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text = tpsp::fuzz::as_text(data, size);
    const size_t first = text.find('\0');
    if (first == std::string_view::npos) return 0;
    const size_t second = text.find('\0', first + 1);
    if (second == std::string_view::npos) return 0;
    tpsp::fuzz::write_input("encoder.json", text.substr(0, first));
    tpsp::fuzz::write_input("vocab.bpe", text.substr(first + 1, second - first - 1));
    try {
        tpsp::GPT2Tokenizer tokenizer(tpsp::fuzz::scratch().string());
        const std::vector<int> tokens = tokenizer.encode(text.substr(second + 1));
        tokenizer.decode(tokens);
    } catch (const tpsp::FileError&) {
    } catch (const tpsp::TokenizerError&) {
    }
    return 0;
}
