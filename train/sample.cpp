#include "train/sample.h"

#include <cstdio>
#include <memory>

#include "data/gpt2_tokenizer.h"
#include "model/checkpoint.h"
#include "train/config.h"

namespace tpsp {

int sample_command(const std::string& checkpoint, const SampleOptions& options) {
    GPTConfig config = read_checkpoint_config(checkpoint);
    GPT model(config, {1, 1, 0.0f});  // holds the parameters; its activations are one token's
    load_checkpoint(model, checkpoint);

    // byte models (vocabulary 256) read and write bytes; others GPT-2's BPE
    std::unique_ptr<GPT2Tokenizer> gpt2;
    std::vector<int> prompt;
    if (config.vocab_size == 256) {
        for (unsigned char c : options.prompt.empty() ? std::string("\n") : options.prompt) prompt.push_back(c);
    } else {
        gpt2 = std::make_unique<GPT2Tokenizer>(options.tokenizer_dir);
        if (gpt2->vocab_size() != config.vocab_size)
            throw FileError(checkpoint + ": vocabulary of " + std::to_string(config.vocab_size) +
                            " tokens, but the tokenizer in " + options.tokenizer_dir + " has " +
                            std::to_string(gpt2->vocab_size()));
        prompt = options.prompt.empty() ? std::vector<int>{gpt2_end_of_text} : gpt2->encode(options.prompt);
    }
    if (int(prompt.size()) >= config.max_seq_len)
        throw ConfigError("--prompt: " + std::to_string(prompt.size()) + " tokens, the model's context is " +
                          std::to_string(config.max_seq_len));
    auto bytes_of = [&](int token) { return gpt2 ? gpt2->token_bytes(token) : std::string(1, char(token)); };
    std::fputs(options.prompt.c_str(), stdout);
    Generator generator(config, model.params.wte);
    const int made = generate(generator, config, prompt, options.tokens, options.temperature, options.top_k,
                              options.seed, [&](int t) {
                                  std::fputs(bytes_of(t).c_str(), stdout);
                                  std::fflush(stdout);
                              });
    std::fputs("\n", stdout);
    if (made < options.tokens)
        std::fprintf(stderr, "tpsp: note: stopped after %d tokens, at the model's context of %d positions\n", made,
                     config.max_seq_len);
    return 0;
}

}  // namespace tpsp
