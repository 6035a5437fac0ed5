// The YAML config and its command-line overrides: the first line of the input
// up to a line "---overrides---" is the file, each line after it an override.
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(tpsp::fuzz::as_text(data, size));
    const std::string marker = "\n---overrides---\n";
    const size_t split = text.find(marker);
    std::vector<std::string> overrides;
    if (split != std::string::npos) {
        size_t at = split + marker.size();
        while (at <= text.size()) {
            const size_t end = std::min(text.find('\n', at), text.size());
            overrides.push_back(text.substr(at, end - at));
            at = end + 1;
        }
    }
    const std::string path = tpsp::fuzz::write_input("config.yaml", text.substr(0, split));
    try {
        tpsp::load_config(path, overrides);
    } catch (const tpsp::ConfigError&) {  // the one line a user sees
    }
    return 0;
}
