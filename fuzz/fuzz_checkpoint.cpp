// llm.c's model file: its header is read and bounded, its size checked
// against the header, and then, where both hold, the weights are loaded into
// a model of that shape and checked finite.
#include "common/errors.h"
#include "fuzz/fuzz_support.h"
#include "model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tpsp::fuzz::write_input("model.bin", tpsp::fuzz::as_text(data, size));
    try {
        tpsp::GPTConfig config = tpsp::read_checkpoint_config(path);
        tpsp::GPT model(config, tpsp::RunShape{1, 1, 0.0f});
        tpsp::load_checkpoint(model, path);
    } catch (const tpsp::FileError&) {
    } catch (const std::invalid_argument&) {  // a shape the model refuses
    }
    return 0;
}
