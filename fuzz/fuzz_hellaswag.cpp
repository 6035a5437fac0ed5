// HellaSwag's JSON lines (data/hellaswag.h), encoded as bytes: every line
// parsed and checked, a mistake a FileError naming its line.
#include "common/errors.h"
#include "data/hellaswag.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tpsp::fuzz::write_input("hellaswag.jsonl", tpsp::fuzz::as_text(data, size));
    try {
        tpsp::read_hellaswag(path, [](std::string_view text) { return std::vector<int>(text.begin(), text.end()); });
    } catch (const tpsp::FileError&) {
    }
    return 0;
}
