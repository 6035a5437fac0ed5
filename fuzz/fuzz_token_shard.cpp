// An llm.c token shard: the loader opens it, reads batches across its end
// (wrapping to the start), and checks every token against the vocabulary.
#include "common/errors.h"
#include "data/token_shards.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tpsp::fuzz::write_input("train_000000.bin", tpsp::fuzz::as_text(data, size));
    try {
        tpsp::TokenLoader loader(path, 2, 8, 0, 1, 256);
        int inputs[16], targets[16];
        for (int batch = 0; batch < 3; batch++) loader.next_batch(inputs, targets);
        loader.seek(int64_t(size));
        loader.next_batch(inputs, targets);
    } catch (const tpsp::FileError&) {
    }
    return 0;
}
