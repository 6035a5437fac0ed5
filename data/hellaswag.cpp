#include "data/hellaswag.h"

#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/files.h"
#include "common/json_depth.h"
#include "data/gpt2_tokenizer.h"

namespace tpsp {

namespace {

HellaSwagExample parse_example(const std::string& where, const std::string& line,
                               const std::function<std::vector<int>(std::string_view)>& encode) {
    if (json_nesting_depth(line) > 4) throw FileError(where + ": nests deeper than an example does");
    const nlohmann::json example = nlohmann::json::parse(line, nullptr, false);
    if (example.is_discarded() || !example.is_object()) throw FileError(where + ": not a JSON object");
    if (!example.contains("ctx") || !example["ctx"].is_string())
        throw FileError(where + ": no \"ctx\" (the context, a string)");
    if (!example.contains("endings") || !example["endings"].is_array() ||
        example["endings"].size() != size_t(hellaswag_endings))
        throw FileError(where + ": no \"endings\" (an array of 4 strings)");
    if (!example.contains("label") || !example["label"].is_number_integer())
        throw FileError(where + ": no \"label\" (the right ending's index, 0 to 3)");
    const int64_t label = example["label"].get<int64_t>();
    if (label < 0 || label >= hellaswag_endings)
        throw FileError(where + ": label " + std::to_string(label) + " is not an ending's index (0 to 3)");
    HellaSwagExample e;
    e.label = int(label);
    if (example["ctx"].get<std::string>().empty()) throw FileError(where + ": \"ctx\" is empty");
    try {
        e.context = encode(example["ctx"].get<std::string>());
        for (int i = 0; i < hellaswag_endings; i++) {
            const nlohmann::json& ending = example["endings"][size_t(i)];
            if (!ending.is_string()) throw FileError(where + ": ending " + std::to_string(i) + " is not a string");
            if (ending.get<std::string>().empty())
                throw FileError(where + ": ending " + std::to_string(i) + " is empty");
            std::string spaced(1, ' ');  // (" " + text trips GCC 12's -Wrestrict)
            spaced += ending.get<std::string>();
            e.endings[size_t(i)] = encode(spaced);
        }
    } catch (const TokenizerError& error) {
        throw FileError(where + ": " + error.what());
    }
    return e;
}

}  // namespace

std::vector<HellaSwagExample> read_hellaswag(const std::string& path,
                                             const std::function<std::vector<int>(std::string_view)>& encode) {
    const std::string text = read_whole_file(path, "HellaSwag file");
    std::vector<HellaSwagExample> examples;
    size_t at = 0;
    for (int number = 1; at < text.size(); number++) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(at, end - at);
        at = end + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        examples.push_back(parse_example(path + ":" + std::to_string(number), line, encode));
        examples.back().line = number;
    }
    if (examples.empty()) throw FileError(path + ":1: no examples (one JSON object a line)");
    return examples;
}

HellaSwagChoice choose_ending(const std::array<double, hellaswag_endings>& loss_sums,
                              const std::array<int, hellaswag_endings>& token_counts) {
    HellaSwagChoice choice;
    for (int i = 1; i < hellaswag_endings; i++) {
        if (loss_sums[size_t(i)] < loss_sums[size_t(choice.by_sum)]) choice.by_sum = i;
        const double mean = loss_sums[size_t(i)] / token_counts[size_t(i)];
        if (mean < loss_sums[size_t(choice.by_mean)] / token_counts[size_t(choice.by_mean)]) choice.by_mean = i;
    }
    return choice;
}

}  // namespace tpsp
