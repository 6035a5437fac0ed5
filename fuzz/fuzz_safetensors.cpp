// `tpsp import`'s reader: the bytes as model.safetensors beside a fixed
// config.json of a GPT-2 of 1 layer, 4 channels, 1 head, 4 positions and 8
// tokens (the seed corpus holds its export); every header is parsed and
// checked, and where it holds, the tensors are converted and written as a
// checkpoint.
#include "common/errors.h"
#include "fuzz/fuzz_support.h"
#include "model/hf_gpt2.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const std::string config = tpsp::fuzz::write_input(
        "config.json",
        "{\"model_type\": \"gpt2\", \"n_embd\": 4, \"n_head\": 1, \"n_layer\": 1, \"n_positions\": 4, "
        "\"vocab_size\": 8}");
    tpsp::fuzz::write_input("model.safetensors", tpsp::fuzz::as_text(data, size));
    size_t data_start = 0;
    try {
        tpsp::parse_safetensors("model.safetensors", tpsp::fuzz::as_text(data, size), data_start);
    } catch (const tpsp::FileError&) {
    }
    tpsp::ImportOptions options;
    options.replace = true;
    try {
        tpsp::import_hugging_face(tpsp::fuzz::scratch().string(), (tpsp::fuzz::scratch() / "imported.bin").string(),
                                  options);
    } catch (const tpsp::FileError&) {
    }
    return 0;
}
