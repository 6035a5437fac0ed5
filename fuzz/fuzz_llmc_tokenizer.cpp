// llm.c's decoding file gpt2_tokenizer.bin, as `tpsp sample` and the
// trainer's samples read it.
#include "common/errors.h"
#include "data/gpt2_tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tpsp::fuzz::write_input("gpt2_tokenizer.bin", tpsp::fuzz::as_text(data, size));
    try {
        tpsp::read_llmc_tokenizer(path);
    } catch (const tpsp::FileError&) {
    }
    return 0;
}
