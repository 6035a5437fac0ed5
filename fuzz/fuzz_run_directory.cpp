// A run directory as resume reads it: `latest` (the input up to its first
// newline, that newline included) and the optimizer state of step 1 (the rest),
// beside a good model file of a small model. A rest of exactly 64 + 8n bytes
// (a state without its last 4) is given its CRC-32C here, so that what
// resume checks after the checksum is fuzzed too.
#include <string>
#include <vector>

#include "common/checksum.h"
#include "fuzz/fuzz_support.h"
#include "model/checkpoint.h"
#include "train/adamw.h"
#include "train/run_checkpoint.h"

namespace {

tpsp::GPTConfig small_model() {
    tpsp::GPTConfig c;
    c.max_seq_len = 4, c.vocab_size = 8, c.padded_vocab_size = 8, c.num_layers = 1, c.num_heads = 1, c.channels = 4;
    return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const tpsp::GPTConfig config = small_model();
    static const bool model_written = [] {  // a good model file for step 1, once
        tpsp::GPT model(config, tpsp::RunShape{1, 1, 0.0f});
        model.init_random(1);
        tpsp::save_checkpoint(config, model.params.wte, (tpsp::fuzz::scratch() / "model_00000001.bin").string());
        return true;
    }();
    (void)model_written;
    const std::string_view text = tpsp::fuzz::as_text(data, size);
    const size_t newline = text.find('\n');
    const size_t split = newline == std::string_view::npos ? text.size() : newline + 1;
    tpsp::fuzz::write_input("latest", text.substr(0, split));
    std::string state(text.substr(split));
    if (state.size() + 4 == tpsp::state_file_bytes(tpsp::full_parameter_count(config))) {
        const uint32_t crc = tpsp::crc32c(state.data(), state.size());
        state.append(reinterpret_cast<const char*>(&crc), 4);
    }
    tpsp::fuzz::write_input("state_00000001.bin", state);
    try {
        tpsp::GPT model(config, tpsp::RunShape{1, 1, 0.0f});
        tpsp::AdamWOptimizer<tpsp::CpuBackend> optimizer(model, {});
        tpsp::load_run(tpsp::fuzz::scratch().string(), model, optimizer);
    } catch (const tpsp::FileError&) {
    }
    return 0;
}
